//! A real Redis Cluster owned by one test: three masters, each with as many
//! replicas as asked (`start_with`), as `redis-server` processes on free
//! loopback ports, each a
//! [`RedisServer`] killed when dropped, joined with `redis-cli --cluster
//! create`.

use std::process::Command;
use std::time::{Duration, Instant};

use super::redis::RedisServer;

/// A running cluster.
pub struct RedisCluster {
    /// Every node; the first three were created as masters.
    pub nodes: Vec<RedisServer>,
}

fn cluster_state_ok(port: u16) -> bool {
    Command::new("redis-cli")
        .args(["-p", &port.to_string(), "CLUSTER", "INFO"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
        .unwrap_or(false)
}

fn replica_link_up_or_master(port: u16) -> bool {
    Command::new("redis-cli")
        .args(["-p", &port.to_string(), "INFO", "replication"])
        .output()
        .map(|o| {
            let info = String::from_utf8_lossy(&o.stdout);
            info.contains("role:master") || info.contains("master_link_status:up")
        })
        .unwrap_or(false)
}

impl RedisCluster {
    /// Starts three masters with one replica each and waits until every node
    /// reports `cluster_state:ok`.
    pub fn start() -> RedisCluster {
        RedisCluster::start_with(1)
    }

    /// Starts three masters with `replicas` replicas each and waits until
    /// every node reports `cluster_state:ok` and every replica is in sync.
    /// Each node runs with hookq's recommended `hash-max-listpack-value`
    /// ([`hookq::doctor::RECOMMENDED_LISTPACK_VALUE`], as `scripts/cluster.sh`).
    pub fn start_with(replicas: usize) -> RedisCluster {
        let listpack_value = hookq::doctor::RECOMMENDED_LISTPACK_VALUE.to_string();
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| loop {
                // The cluster bus listens on port + 10000, so the port must
                // leave room for it.
                let node = RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    "--hash-max-listpack-value",
                    &listpack_value,
                ]);
                if node.port() < 55_000 {
                    break node;
                }
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        // A replica that has not finished its first sync refuses to fail
        // over, so the cluster is ready when every replica's link is up too.
        let until = Instant::now() + Duration::from_secs(30);
        while !nodes
            .iter()
            .all(|n| cluster_state_ok(n.port()) && replica_link_up_or_master(n.port()))
        {
            assert!(Instant::now() < until, "the cluster did not become ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        RedisCluster { nodes }
    }

    /// `FLUSHALL` on every master.
    pub async fn flush(&self) -> ::redis::RedisResult<()> {
        let masters = self.master_ports();
        for node in self.nodes.iter().filter(|n| masters.contains(&n.port())) {
            node.flush().await?;
        }
        Ok(())
    }

    /// Script calls served by every node together.
    pub async fn script_calls(&self) -> ::redis::RedisResult<i64> {
        let mut total = 0;
        for node in &self.nodes {
            total += node.script_calls().await?;
        }
        Ok(total)
    }

    /// CPU seconds used by every node together.
    pub async fn cpu_seconds(&self) -> ::redis::RedisResult<f64> {
        let mut total = 0.0;
        for node in &self.nodes {
            total += node.cpu_seconds().await?;
        }
        Ok(total)
    }

    /// `redis://` URLs of every node, as `redis.cluster_nodes` seeds.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port()))
            .collect()
    }

    /// Ports of the nodes that are masters now.
    pub fn master_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| {
                Command::new("redis-cli")
                    .args(["-p", &n.port().to_string(), "ROLE"])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).starts_with("master"))
                    .unwrap_or(false)
            })
            .map(|n| n.port())
            .collect()
    }

    /// Whether a failover away from the dead master on `dead_port` is
    /// complete: three other nodes are masters, and every live node reports
    /// `cluster_state:ok`.
    pub fn failed_over_from(&self, dead_port: u16) -> bool {
        let masters = self.master_ports();
        masters.len() == 3
            && !masters.contains(&dead_port)
            && self
                .nodes
                .iter()
                .filter(|n| n.port() != dead_port)
                .all(|n| cluster_state_ok(n.port()))
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The cluster slot of `key`, as the node on `port` computes it.
pub fn keyslot(port: u16, key: &str) -> u16 {
    cli(port, &["CLUSTER", "KEYSLOT", key])
        .parse()
        .expect("CLUSTER KEYSLOT answers a number")
}

/// The port of the master that serves `slot`, as the node on `port` sees it.
pub fn slot_owner(port: u16, slot: u16) -> u16 {
    let nodes = cli(port, &["CLUSTER", "NODES"]);
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 9 || !fields[2].contains("master") {
            continue;
        }
        let serves = fields[8..].iter().any(|range| {
            let mut ends = range.splitn(2, '-');
            let start = ends.next().and_then(|s| s.parse::<u16>().ok());
            let end = ends.next().map_or(start, |s| s.parse::<u16>().ok());
            matches!((start, end), (Some(a), Some(b)) if (a..=b).contains(&slot))
        });
        if serves {
            let addr = fields[1].split('@').next().unwrap_or_default();
            return addr
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .expect("node address has a port");
        }
    }
    panic!("no master serves slot {slot}:\n{nodes}")
}

/// Starts moving `slot` from the master on `from` to the master on `to`
/// (SETSLOT IMPORTING on the target, MIGRATING on the source).
pub fn begin_migration(slot: u16, from: u16, to: u16) {
    let slot = slot.to_string();
    let from_id = cli(from, &["CLUSTER", "MYID"]);
    let to_id = cli(to, &["CLUSTER", "MYID"]);
    assert_eq!(
        cli(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]),
        "OK"
    );
    assert_eq!(
        cli(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]),
        "OK"
    );
}

/// Moves `keys` from `from` to `to` with one MIGRATE. Panics if it fails
/// (BUSYKEY would mean a script created on the target a key the source
/// still held).
pub fn migrate_keys(from: u16, to: u16, keys: &[&str]) {
    let to_s = to.to_string();
    let mut args = vec!["MIGRATE", "127.0.0.1", &to_s, "", "0", "5000", "KEYS"];
    args.extend(keys.iter().copied());
    let answer = cli(from, &args);
    assert!(
        answer == "OK" || answer == "NOKEY",
        "MIGRATE {keys:?} failed: {answer}"
    );
}

/// The keys of `slot` still on the node on `port`, at most `count`.
pub fn keys_in_slot(port: u16, slot: u16, count: usize) -> Vec<String> {
    cli(
        port,
        &[
            "CLUSTER",
            "GETKEYSINSLOT",
            &slot.to_string(),
            &count.to_string(),
        ],
    )
    .lines()
    .filter(|k| !k.is_empty())
    .map(str::to_string)
    .collect()
}

/// Ends a migration: every master (`masters`) learns that `to` owns `slot`,
/// the new owner first, then the old one.
pub fn finish_migration(masters: &[u16], slot: u16, from: u16, to: u16) {
    let slot = slot.to_string();
    let to_id = cli(to, &["CLUSTER", "MYID"]);
    let mut order = vec![to, from];
    order.extend(masters.iter().copied().filter(|p| *p != to && *p != from));
    for port in order {
        let answer = cli(port, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
        assert_eq!(answer, "OK", "SETSLOT NODE on {port}");
    }
}

/// Moves `slot` from the master on `from` to the master on `to` the way
/// `redis-cli --cluster reshard` does, but `batch` keys at a time with a
/// `pause` between batches, so clients meet the slot half-moved. Returns the
/// number of keys moved.
pub fn migrate_slot(
    masters: &[u16],
    slot: u16,
    from: u16,
    to: u16,
    batch: usize,
    pause: Duration,
) -> usize {
    begin_migration(slot, from, to);
    let mut moved = 0;
    loop {
        let keys = keys_in_slot(from, slot, batch);
        if keys.is_empty() {
            break;
        }
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        migrate_keys(from, to, &keys);
        moved += keys.len();
        std::thread::sleep(pause);
    }
    finish_migration(masters, slot, from, to);
    moved
}

/// The slots of `keys` that the master on `port` serves (as it sees them),
/// in the order of `keys`.
pub fn slots_served_by(port: u16, keys: impl IntoIterator<Item = String>) -> Vec<u16> {
    keys.into_iter()
        .map(|key| keyslot(port, &key))
        .filter(|slot| slot_owner(port, *slot) == port)
        .collect()
}

/// Moves each of `slots` from the master on `from` to the master on `to` with
/// [`migrate_slot`] (`batch` keys at a time, `pause` between batches) on a
/// blocking thread, while the test goes on; the task answers the number of
/// keys moved.
pub fn migrate_slots_in_background(
    masters: Vec<u16>,
    slots: Vec<u16>,
    from: u16,
    to: u16,
    batch: usize,
    pause: Duration,
) -> tokio::task::JoinHandle<usize> {
    tokio::task::spawn_blocking(move || {
        slots
            .iter()
            .map(|slot| migrate_slot(&masters, *slot, from, to, batch, pause))
            .sum::<usize>()
    })
}

/// A move under way of slots from one master to another.
pub struct SlotMove {
    /// The port of the master the slots leave.
    pub from: u16,
    /// The port of the master they go to.
    pub to: u16,
    /// The slots moved.
    pub slots: Vec<u16>,
    /// The blocking task moving them; it answers the number of keys moved.
    pub task: tokio::task::JoinHandle<usize>,
}

/// Starts moving to the second master every slot of the first master that
/// holds the due key of one of partitions `0..partitions` (namespace
/// `hookq`), 10 keys at a time 5 ms apart, while the test goes on; panics if
/// the first master serves no such slot.
pub fn start_moving_due_partitions(cluster: &RedisCluster, partitions: u16) -> SlotMove {
    let masters = cluster.master_ports();
    let (from, to) = (masters[0], masters[1]);
    let due_keys = (0..partitions).map(|p| format!("hookq:{{{p}}}:due"));
    let slots = slots_served_by(from, due_keys);
    assert!(!slots.is_empty(), "the first master serves some partition");
    let task = migrate_slots_in_background(
        masters,
        slots.clone(),
        from,
        to,
        10,
        Duration::from_millis(5),
    );
    SlotMove {
        from,
        to,
        slots,
        task,
    }
}

/// Every key of `slot` on the nodes `ports`, with its DUMP and whether it has
/// a TTL: two snapshots are equal when nothing in the slot changed.
pub async fn slot_snapshot(
    ports: &[u16],
    slot: u16,
) -> std::collections::BTreeMap<String, (Vec<u8>, bool)> {
    let mut snapshot = std::collections::BTreeMap::new();
    for port in ports {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("node");
        for key in keys_in_slot(*port, slot, 100_000) {
            // ASKING lets the importing node answer for its half of the slot.
            let (_, dump, _, ttl): ((), Vec<u8>, (), i64) = redis::pipe()
                .cmd("ASKING")
                .cmd("DUMP")
                .arg(&key)
                .cmd("ASKING")
                .cmd("PTTL")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .expect("ASKING, DUMP, PTTL");
            snapshot.insert(key, (dump, ttl >= 0));
        }
    }
    snapshot
}
