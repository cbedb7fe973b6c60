//! `hookq doctor`: checks the Redis hookq is configured for and says what to
//! fix — version, persistence, eviction policy, the partition count the
//! data was written with and every partition reachable, scripts loadable,
//! and whether memory lasts at the current finish rate.
//!
//! Everything here only reads: `INFO`, `CONFIG GET`, `TYPE` of each
//! partition's due set, the schema and partition-count keys, and for the
//! memory check the partitions' stats hashes (`<ns>:{p}:stats`), summary
//! indexes (`<ns>:{p}:done`) and the counts of [`Store::stats`]. The checks
//! of Redis's settings, partitions, scripts, schema, fleet and replicas are
//! here; the memory check is in `doctor/memory.rs`.

use std::collections::HashMap;

use serde::Serialize;

use crate::config::Config;
use crate::store::{RedisConn, Store, StoreError, StoreResult};

mod memory;

use memory::memory_check;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Ok,
    /// Works, but risks losing jobs or time; worth fixing.
    Warn,
    /// Must be fixed.
    Fail,
}

impl Status {
    /// Short label for tables.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One check.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// Outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// The exact fix, when not ok.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// All checks.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// In order.
    pub checks: Vec<Check>,
}

impl Report {
    /// No check failed (warnings allowed).
    pub(crate) fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }
}

/// `hash-max-listpack-value` hookq recommends: job records (the job's JSON
/// plus a few small fields) up to this size stay in Redis's compact listpack
/// encoding.
pub const RECOMMENDED_LISTPACK_VALUE: u64 = 1024;

fn check(name: &'static str, status: Status, detail: String, fix: Option<String>) -> Check {
    Check {
        name,
        status,
        detail,
        fix,
    }
}

/// Runs every check against the Redis of `config`.
pub async fn run(config: &Config) -> Report {
    let store = match Store::connect_unchecked(config).await {
        Ok(store) => store,
        Err(err) => {
            return Report {
                checks: vec![check(
                    "connection",
                    Status::Fail,
                    format!(
                        "cannot connect to {}: {err}",
                        crate::config::redact_url(&config.redis.url)
                    ),
                    Some(
                        "start Redis (scripts/run.sh does) or fix `redis.url` / HOOKQ_REDIS__URL"
                            .into(),
                    ),
                )],
            }
        }
    };
    let mut checks = vec![
        check(
            "connection",
            Status::Ok,
            format!(
                "connected to {}",
                crate::config::redact_url(&config.redis.url)
            ),
            None,
        ),
        version_check(&store).await,
    ];
    checks.extend(settings_checks(&store).await);
    checks.push(partitions_check(&store).await);
    checks.push(scripts_check(&store).await);
    checks.extend(libraries_check(&store).await);
    checks.push(schema_check(&store).await);
    checks.push(memory_check(&store, config).await);
    checks.push(fleet_check(&store).await);
    checks.push(replicas_check(&store, config).await);
    Report { checks }
}

/// The Redis version: 7.0 or newer.
async fn version_check(store: &Store) -> Check {
    let info = info_of(store, 0, &["server"]).await.unwrap_or_default();
    let version = info_field(&info, "redis_version")
        .unwrap_or("unknown")
        .to_string();
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major >= 7 {
        check("redis version", Status::Ok, version, None)
    } else {
        check(
            "redis version",
            Status::Fail,
            format!("{version}; hookq needs Redis 7.0 or newer"),
            Some("upgrade Redis to 7.0 or newer".into()),
        )
    }
}

/// The Redis settings hookq relies on or recommends: `maxmemory-policy`,
/// `appendonly`, `appendfsync`, `hash-max-listpack-value`.
async fn settings_checks(store: &Store) -> Vec<Check> {
    vec![
        maxmemory_policy_check(config_get(store, "maxmemory-policy").await.as_deref()),
        appendonly_check(config_get(store, "appendonly").await.as_deref()),
        appendfsync_check(config_get(store, "appendfsync").await.as_deref()),
        listpack_value_check(
            config_get(store, "hash-max-listpack-value")
                .await
                .and_then(|v| v.parse::<u64>().ok()),
        ),
    ]
}

/// The value of Redis setting `name` (`CONFIG GET`); None when Redis
/// refuses or does not answer.
async fn config_get(store: &Store, name: &'static str) -> Option<String> {
    let mut conn = store.conn();
    redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async::<HashMap<String, String>>(&mut conn)
        .await
        .ok()
        .and_then(|m| m.get(name).cloned())
}

/// `maxmemory-policy` must be `noeviction` (None: it could not be read).
fn maxmemory_policy_check(policy: Option<&str>) -> Check {
    match policy {
        Some("noeviction") => check("maxmemory-policy", Status::Ok, "noeviction".into(), None),
        Some(policy) => check(
            "maxmemory-policy",
            Status::Fail,
            format!("{policy}: Redis may evict job records silently when full"),
            Some("redis-cli CONFIG SET maxmemory-policy noeviction, and set `maxmemory-policy noeviction` in redis.conf".into()),
        ),
        None => check(
            "maxmemory-policy",
            Status::Warn,
            "cannot read (CONFIG GET refused)".into(),
            Some("make sure redis.conf has `maxmemory-policy noeviction`".into()),
        ),
    }
}

/// `appendonly` should be `yes` (None: it could not be read).
fn appendonly_check(appendonly: Option<&str>) -> Check {
    match appendonly {
        Some("yes") => check("appendonly", Status::Ok, "yes".into(), None),
        Some(other) => check(
            "appendonly",
            Status::Warn,
            format!("{other}: acknowledged jobs are lost if Redis restarts"),
            Some(
                "redis-cli CONFIG SET appendonly yes, and set `appendonly yes` in redis.conf"
                    .into(),
            ),
        ),
        None => check("appendonly", Status::Warn, "cannot read".into(), None),
    }
}

/// `appendfsync` should be `always` or `everysec` (None: it could not be
/// read).
fn appendfsync_check(appendfsync: Option<&str>) -> Check {
    match appendfsync {
        Some("always") => check(
            "appendfsync",
            Status::Ok,
            "always: no acknowledged job is lost on power loss".into(),
            None,
        ),
        Some("everysec") => check(
            "appendfsync",
            Status::Ok,
            "everysec: up to ~1 s of acknowledged jobs can be lost on power loss".into(),
            None,
        ),
        Some(other) => check(
            "appendfsync",
            Status::Warn,
            format!("{other}: the OS decides when jobs reach disk"),
            Some(
                "redis-cli CONFIG SET appendfsync everysec (or always for payment callbacks)"
                    .into(),
            ),
        ),
        None => check("appendfsync", Status::Warn, "cannot read".into(), None),
    }
}

/// `hash-max-listpack-value` should be at least
/// [`RECOMMENDED_LISTPACK_VALUE`] (None: it could not be read or parsed).
/// Not a correctness matter: with Redis's default (64 bytes) every job
/// record is stored as a full hash table, about twice the memory.
fn listpack_value_check(value: Option<u64>) -> Check {
    match value {
        Some(v) if v >= RECOMMENDED_LISTPACK_VALUE => check(
            "hash-max-listpack-value",
            Status::Ok,
            v.to_string(),
            None,
        ),
        Some(v) => check(
            "hash-max-listpack-value",
            Status::Warn,
            format!("{v}: job records above {v} bytes take about twice the memory"),
            Some(format!(
                "redis-cli CONFIG SET hash-max-listpack-value {RECOMMENDED_LISTPACK_VALUE}, and set it in redis.conf"
            )),
        ),
        None => check(
            "hash-max-listpack-value",
            Status::Warn,
            "cannot read".into(),
            None,
        ),
    }
}

/// The data was written with `redis.partitions` partitions (the count the
/// first daemon recorded), and every partition's keys answer (on a
/// cluster: every slot is served).
async fn partitions_check(store: &Store) -> Check {
    match store.check_recorded_partitions().await {
        Ok(()) => {}
        Err(StoreError::Partitions {
            recorded,
            configured,
        }) => {
            let detail = format!(
                "the data is spread over {recorded} partitions; redis.partitions is \
                 {configured} (the jobs of the other partitions would never be delivered)"
            );
            let fix = format!("set `redis.partitions = {recorded}` in the config");
            return check("partitions", Status::Fail, detail, Some(fix));
        }
        Err(err) => {
            return check(
                "partitions",
                Status::Fail,
                format!("cannot read: {err}"),
                None,
            )
        }
    }
    let mut unreachable = Vec::new();
    for p in 0..store.keys().partitions() {
        let mut conn = store.conn();
        let reached: redis::RedisResult<String> = redis::cmd("TYPE")
            .arg(store.keys().due(p))
            .query_async(&mut conn)
            .await;
        if reached.is_err() {
            unreachable.push(p);
        }
    }
    if unreachable.is_empty() {
        check(
            "partitions",
            Status::Ok,
            format!("all {} reachable", store.keys().partitions()),
            None,
        )
    } else {
        check(
            "partitions",
            Status::Fail,
            format!("unreachable: {unreachable:?}"),
            Some(
                "check every cluster node is up and `redis.cluster_nodes` lists reachable seeds"
                    .into(),
            ),
        )
    }
}

/// The scripts load (the Redis user may run them).
async fn scripts_check(store: &Store) -> Check {
    match store.load_scripts().await {
        Ok(()) => check(
            "scripts",
            Status::Ok,
            format!("{} loaded", crate::store::scripts::ALL.len()),
            None,
        ),
        Err(err) => check(
            "scripts",
            Status::Fail,
            format!("cannot load: {err}"),
            Some(
                "allow FUNCTION LOAD and FCALL for hookq's Redis user (ACL: +@scripting; \
                 before Redis 7.0: SCRIPT LOAD and EVALSHA)"
                    .into(),
            ),
        ),
    }
}

/// The hookq libraries of other versions or configs on a single Redis
/// with Functions (none checked on a cluster): those in use by a connected
/// client, and the stale ones the next daemon start deletes.
async fn libraries_check(store: &Store) -> Option<Check> {
    let others = match store.other_libraries().await {
        Ok(others) => others?,
        Err(err) => {
            return Some(check(
                "libraries",
                Status::Warn,
                format!("cannot list the Lua libraries in use: {err}"),
                Some(
                    "allow CLIENT LIST and CLIENT SETNAME for hookq's Redis user \
                     (ACL: +client|list +client|setname), or delete old hookq_* libraries \
                     by hand (FUNCTION DELETE)"
                        .into(),
                ),
            ))
        }
    };
    let detail = if others.in_use.is_empty() && others.stale.is_empty() {
        "this version's only".to_string()
    } else {
        format!(
            "this version's; in use by a connected client: {}; stale (the next daemon start \
             deletes them): {}",
            names_or_none(&others.in_use),
            names_or_none(&others.stale)
        )
    };
    Some(check("libraries", Status::Ok, detail, None))
}

/// `names` joined with ", ", or "none".
fn names_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// The data's layout version is this hookq's.
async fn schema_check(store: &Store) -> Check {
    match store.schema_version().await {
        Ok(Some(v)) if v == crate::store::schema::SCHEMA_VERSION => {
            check("schema", Status::Ok, format!("layout {v}"), None)
        }
        Ok(None) => check(
            "schema",
            Status::Ok,
            "no hookq data yet (the first daemon writes the layout version)".into(),
            None,
        ),
        Ok(Some(v)) => check(
            "schema",
            Status::Fail,
            format!(
                "layout `{v}`; this hookq reads layout {}",
                crate::store::schema::SCHEMA_VERSION
            ),
            Some("stop every hookq daemon and run `hookq migrate`".into()),
        ),
        Err(err) => check("schema", Status::Fail, format!("cannot read: {err}"), None),
    }
}

/// The daemons sharing this Redis and how the partitions are dealt among
/// them (see [`crate::fleet`]); informational.
async fn fleet_check(store: &Store) -> Check {
    let members = match store.fleet_members().await {
        Ok(members) => members,
        Err(err) => return check("fleet", Status::Fail, format!("cannot read: {err}"), None),
    };
    if members.is_empty() {
        return check("fleet", Status::Ok, "no daemon is running".into(), None);
    }
    let partitions = store.keys().partitions();
    let shares: Vec<usize> = members
        .iter()
        .map(|m| {
            crate::fleet::deal(&members, m, partitions)
                .into_iter()
                .filter(|o| *o)
                .count()
        })
        .collect();
    let standing_by = shares.iter().filter(|n| **n == 0).count();
    let mut busy: Vec<String> = shares
        .iter()
        .filter(|n| **n > 0)
        .map(usize::to_string)
        .collect();
    busy.sort_unstable_by(|a, b| b.len().cmp(&a.len()).then(b.cmp(a)));
    let mut detail = format!(
        "{} daemon(s); {partitions} partitions dealt {}",
        members.len(),
        busy.join("/")
    );
    if standing_by > 0 {
        detail.push_str(&format!(
            "; {standing_by} standing by (more daemons than partitions: raise `redis.partitions` to spread delivery)"
        ));
    }
    check("fleet", Status::Ok, detail, None)
}

/// The replicas each master holding partitions has, against
/// `redis.ack_replicas` (more asked for than a master has: every
/// acknowledged write to it answers 503 `not_replicated`).
async fn replicas_check(store: &Store, config: &Config) -> Check {
    let mut per_master: std::collections::BTreeMap<String, u32> = Default::default();
    for p in 0..store.keys().partitions() {
        let Ok(info) = info_of(store, p, &["server", "replication"]).await else {
            continue;
        };
        let master = info_field(&info, "run_id").unwrap_or("?").to_string();
        let replicas = info_field(&info, "connected_slaves")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        per_master.insert(master, replicas);
    }
    let wanted = config.redis.ack_replicas;
    let counts: Vec<String> = per_master.values().map(u32::to_string).collect();
    let detail = format!(
        "{} master(s) with {} replica(s); redis.ack_replicas = {wanted}",
        per_master.len(),
        counts.join("/")
    );
    let fewest = per_master.values().min().copied().unwrap_or(0);
    if wanted > fewest {
        check(
            "replicas",
            Status::Warn,
            format!("{detail}: writes to a master with fewer replicas answer 503 not_replicated"),
            Some("add replicas (replicaof) or lower redis.ack_replicas".into()),
        )
    } else {
        check("replicas", Status::Ok, detail, None)
    }
}

/// `INFO <sections>` of the Redis holding partition `p`: on a cluster its
/// master (a cluster connection would answer once per master).
async fn info_of(store: &Store, p: u16, sections: &[&str]) -> StoreResult<String> {
    let mut cmd = redis::cmd("INFO");
    for section in sections {
        cmd.arg(*section);
    }
    match store.conn() {
        RedisConn::Cluster(cluster) => {
            let value = cluster.on_master_of(&store.keys().due(p), &cmd).await?;
            Ok(redis::from_redis_value(&value)?)
        }
        mut conn => Ok(cmd.query_async(&mut conn).await?),
    }
}

/// The value of `name` in an `INFO` reply.
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}
