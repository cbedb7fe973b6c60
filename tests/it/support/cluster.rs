//! A real Redis Cluster owned by one test: six `redis-server` processes
//! (three masters, three replicas) on free loopback ports, each a
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

impl RedisCluster {
    /// Starts three masters with one replica each and waits until every node
    /// reports `cluster_state:ok`.
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..6)
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
                    "1024",
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
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let until = Instant::now() + Duration::from_secs(30);
        while !nodes.iter().all(|n| cluster_state_ok(n.port())) {
            assert!(Instant::now() < until, "the cluster did not become ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        RedisCluster { nodes }
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

    /// Whether every live node reports `cluster_state:ok`.
    pub fn is_ok(&self, skip_port: u16) -> bool {
        self.nodes
            .iter()
            .filter(|n| n.port() != skip_port)
            .all(|n| cluster_state_ok(n.port()))
    }
}
