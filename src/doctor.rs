//! `hookq doctor`: checks the Redis hookq is configured for and says what to
//! fix — version, persistence, eviction policy, every partition reachable,
//! scripts loadable, and whether memory lasts at the current finish rate.
//!
//! Everything here only reads: `INFO`, `CONFIG GET`, `TYPE` of each
//! partition's due set, the schema key, and for the memory check the
//! partitions' stats hashes (`<ns>:{p}:stats`), summary indexes
//! (`<ns>:{p}:done`) and the counts of [`Store::stats`].

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use crate::config::Config;
use crate::store::listing::Stats;
use crate::store::{RedisConn, Store, StoreResult};

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

/// Every partition's keys answer (on a cluster: every slot is served).
async fn partitions_check(store: &Store) -> Check {
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
            Some("allow SCRIPT LOAD/EVALSHA for hookq's Redis user (ACL: +@scripting)".into()),
        ),
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

// ---------------------------------------------------------------------------
// The memory check: jobs held, bytes per job, the finish rate, and where
// memory levels off once the finished jobs kept for `retention.finished`
// stop growing.

/// How long the memory check watches the finish counters for a rate (the
/// doctor's run time is about this).
const RATE_SAMPLE: Duration = Duration::from_secs(2);

/// Bytes a finished job's summary costs: SPEC §11.2's bound (the benchmark
/// `memory_100k_finished` measured 95.8 B on stock Redis).
const SUMMARY_BYTES: f64 = 100.0;

/// Bytes a whole kept record costs (`retention.keep_bodies`) when there is
/// no job to measure: what `memory_100k_finished_keep_bodies` measured,
/// with small bodies.
const KEPT_RECORD_BYTES: f64 = 634.0;

/// Fewest jobs held for a bytes-per-job figure: below it Redis's own
/// overhead (the record hashes, indexes, the fleet's keys) outweighs the
/// jobs, and two jobs read as 490 KB each.
const PER_JOB_SAMPLE: u64 = 1_000;

/// Share of `maxmemory` the projection may reach before the check warns
/// (beyond it, a burst or an AOF rewrite's buffers reach the limit, and
/// with `noeviction` the API answers 503).
const MEMORY_HEADROOM: f64 = 0.9;

/// What `INFO memory` says about one Redis (one master of a cluster).
#[derive(Debug, Clone, PartialEq)]
struct NodeMemory {
    /// `used_memory`.
    used: u64,
    /// `used_memory_startup`: what the server took before holding data.
    startup: u64,
    /// `maxmemory` (0: no limit).
    maxmemory: u64,
    /// `total_system_memory` (0: not reported).
    system: u64,
    /// The hookq partitions this server holds.
    partitions: Vec<u16>,
}

/// What the memory check measured.
#[derive(Debug, Clone, PartialEq)]
struct MemoryFigures {
    /// Each server holding partitions (one unless on a cluster).
    nodes: Vec<NodeMemory>,
    /// Partitions in all.
    partitions: u16,
    /// Scheduled, ready, in flight and dead jobs.
    live_and_dead: u64,
    /// Finished-job summaries not yet expired.
    summaries: u64,
    /// Delivered plus dead-lettered jobs per second while sampled.
    finish_rate: f64,
    /// `retention.finished`.
    retention: Duration,
    /// `retention.keep_bodies`: finished jobs keep whole records, which this
    /// check does not count.
    keep_bodies: bool,
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

async fn memory_check(store: &Store, config: &Config) -> Check {
    match measure_memory(store, config).await {
        Ok(figures) => judge_memory(&figures),
        Err(err) => check("memory", Status::Fail, format!("cannot read: {err}"), None),
    }
}

/// Reads the figures of the memory check: the finish counters and Redis's
/// clock, then what is held and `INFO memory`, then the counters again
/// [`RATE_SAMPLE`] after the first reading.
async fn measure_memory(store: &Store, config: &Config) -> StoreResult<MemoryFigures> {
    let started = tokio::time::Instant::now();
    let t0 = store.redis_time_ms().await?;
    let stats = store.stats().await?;
    let summaries = retained_summaries(store, t0).await?;
    let nodes = node_memory(store).await?;
    tokio::time::sleep_until(started + RATE_SAMPLE).await;
    let t1 = store.redis_time_ms().await?;
    let later = store.stats().await?;
    let finished = |s: &Stats| s.delivered + s.dead_lettered;
    let seconds = (t1 - t0).max(1) as f64 / 1000.0;
    Ok(MemoryFigures {
        nodes,
        partitions: store.keys().partitions(),
        live_and_dead: stats.scheduled + stats.ready + stats.inflight + stats.dead,
        summaries,
        finish_rate: finished(&later).saturating_sub(finished(&stats)) as f64 / seconds,
        retention: config.retention.finished,
        keep_bodies: config.retention.keep_bodies,
    })
}

/// Summaries in buckets that have not expired at `now_ms` (Redis time).
async fn retained_summaries(store: &Store, now_ms: i64) -> StoreResult<u64> {
    let mut total = 0;
    for p in 0..store.keys().partitions() {
        total += store
            .summary_buckets(p)
            .await?
            .iter()
            .filter(|b| b.expires > now_ms)
            .map(|b| b.count)
            .sum::<u64>();
    }
    Ok(total)
}

/// `INFO memory` of the Redis, or on a cluster of each master holding a
/// partition (asked through a key of each partition, grouped by `run_id`).
async fn node_memory(store: &Store) -> StoreResult<Vec<NodeMemory>> {
    let all: Vec<u16> = (0..store.keys().partitions()).collect();
    if !matches!(store.conn(), RedisConn::Cluster(_)) {
        let info = info_of(store, 0, &["memory"]).await?;
        return Ok(vec![parse_node_memory(&info, all)]);
    }
    let mut by_run_id: Vec<(String, NodeMemory)> = Vec::new();
    for p in all {
        let info = info_of(store, p, &["server", "memory"]).await?;
        let run_id = info_field(&info, "run_id").unwrap_or_default().to_string();
        match by_run_id.iter_mut().find(|(id, _)| *id == run_id) {
            Some((_, node)) => node.partitions.push(p),
            None => by_run_id.push((run_id, parse_node_memory(&info, vec![p]))),
        }
    }
    Ok(by_run_id.into_iter().map(|(_, node)| node).collect())
}

/// `INFO <sections>` of the Redis holding partition `p`: on a cluster its
/// master (a cluster connection would answer once per master).
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

/// A server's figures from its `INFO memory` text (absent fields read 0).
fn parse_node_memory(info: &str, partitions: Vec<u16>) -> NodeMemory {
    let number = |name| {
        info_field(info, name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    NodeMemory {
        used: number("used_memory"),
        startup: number("used_memory_startup"),
        maxmemory: number("maxmemory"),
        system: number("total_system_memory"),
        partitions,
    }
}

/// Where memory levels off at the measured rate: finished jobs are kept
/// for `retention.finished`, so those retained stop growing at
/// rate × retention; the summaries held now expire and those take their
/// place.
struct Outlook {
    /// Jobs held.
    jobs: u64,
    /// (`used_memory` − `used_memory_startup`) per job held; None with fewer
    /// than [`PER_JOB_SAMPLE`] jobs.
    per_job: Option<f64>,
    /// Bytes one retained finished job costs.
    per_finished: f64,
    /// Finished jobs retained at the level-off point.
    level: f64,
    /// Bytes added (or freed, when negative) between now and then.
    growth: f64,
}

impl Outlook {
    fn of(m: &MemoryFigures) -> Outlook {
        let jobs = m.live_and_dead + m.summaries;
        let used: u64 = m.nodes.iter().map(|n| n.used).sum();
        let startup: u64 = m.nodes.iter().map(|n| n.startup).sum();
        let per_job =
            (jobs >= PER_JOB_SAMPLE).then(|| used.saturating_sub(startup) as f64 / jobs as f64);
        let per_finished = match (m.keep_bodies, per_job) {
            (false, _) => SUMMARY_BYTES,
            (true, Some(b)) => b,
            (true, None) => KEPT_RECORD_BYTES,
        };
        let level = m.finish_rate * m.retention.as_secs_f64();
        Outlook {
            jobs,
            per_job,
            per_finished,
            level,
            growth: level * per_finished - m.summaries as f64 * SUMMARY_BYTES,
        }
    }

    /// The part of the growth that lands on `node` (jobs spread evenly over
    /// the partitions).
    fn share(m: &MemoryFigures, node: &NodeMemory) -> f64 {
        node.partitions.len() as f64 / f64::from(m.partitions.max(1))
    }

    /// `node`'s memory at the level-off point.
    fn projected(&self, m: &MemoryFigures, node: &NodeMemory) -> f64 {
        (node.used as f64 + self.growth * Outlook::share(m, node)).max(0.0)
    }

    /// How full `node` gets: the larger of now and the projection over its
    /// `maxmemory` (infinite without one).
    fn fill(&self, m: &MemoryFigures, node: &NodeMemory) -> f64 {
        match node.maxmemory {
            0 => f64::INFINITY,
            max => self.projected(m, node).max(node.used as f64) / max as f64,
        }
    }
}

/// Judges measured figures: warn when the (fullest) server has no
/// `maxmemory`, or when now or at the level-off point it would use more
/// than [`MEMORY_HEADROOM`] of it; ok otherwise.
fn judge_memory(m: &MemoryFigures) -> Check {
    let outlook = Outlook::of(m);
    let Some(node) = m
        .nodes
        .iter()
        .max_by(|a, b| outlook.fill(m, a).total_cmp(&outlook.fill(m, b)))
    else {
        return check("memory", Status::Fail, "no Redis answered".into(), None);
    };
    let detail = describe_memory(m, &outlook, node);
    let peak = outlook.projected(m, node).max(node.used as f64);
    if node.maxmemory == 0 {
        // Three quarters of the machine, leaving the rest for the fork of
        // an AOF rewrite or a snapshot.
        let ram = node.system as f64 * 0.75;
        let set = if ram > 0.0 {
            format!("redis-cli CONFIG SET maxmemory {}", mb_at_least(ram))
        } else {
            "redis-cli CONFIG SET maxmemory <bytes below the machine's RAM>".to_string()
        };
        let mut fix = format!(
            "{set}, and set `maxmemory` in redis.conf (with noeviction a full Redis refuses new jobs with 503 instead of being killed)"
        );
        if ram > 0.0 && peak > MEMORY_HEADROOM * ram {
            let growth = growth_fixes(m, &outlook, node, ram);
            if !growth.is_empty() {
                fix = format!("{fix}; and, to stay under it, {}", growth.join(" or "));
            }
        }
        return check("memory", Status::Warn, detail, Some(fix));
    }
    if outlook.fill(m, node) <= MEMORY_HEADROOM {
        return check("memory", Status::Ok, detail, None);
    }
    let mut fixes = vec![format!(
        "raise maxmemory to at least {} (redis-cli CONFIG SET maxmemory {0}, and in redis.conf)",
        mb_at_least(peak / MEMORY_HEADROOM)
    )];
    fixes.extend(growth_fixes(m, &outlook, node, node.maxmemory as f64));
    check("memory", Status::Warn, detail, Some(fixes.join("; or ")))
}

/// The detail line: the server's memory and limit, jobs held, bytes per
/// job, the rate and the projection.
fn describe_memory(m: &MemoryFigures, outlook: &Outlook, node: &NodeMemory) -> String {
    let server = if m.nodes.len() > 1 {
        format!(
            "fullest of {} masters (partitions {:?}): ",
            m.nodes.len(),
            node.partitions
        )
    } else {
        String::new()
    };
    let projected = outlook.projected(m, node);
    let (limit, of_limit) = match node.maxmemory {
        0 => (
            format!(
                ", no maxmemory set: Redis grows until the machine runs out{}",
                ram(node)
                    .map(|r| format!(" ({r} of RAM)"))
                    .unwrap_or_default()
            ),
            String::new(),
        ),
        max => (
            format!(" of maxmemory {}", bytes(max as f64)),
            format!(" ({:.0}% of maxmemory)", 100.0 * projected / max as f64),
        ),
    };
    let held = match outlook.per_job {
        Some(per_job) => format!(
            "{} jobs held ({} scheduled, ready, in flight or dead, {} finished summaries), {per_job:.0} B per job",
            outlook.jobs, m.live_and_dead, m.summaries
        ),
        None if outlook.jobs == 0 => "no jobs".to_string(),
        None => format!(
            "{} jobs held, too few for a bytes-per-job figure (it needs {PER_JOB_SAMPLE})",
            outlook.jobs
        ),
    };
    let not_counted = if m.keep_bodies {
        " (finished records kept by retention.keep_bodies are not counted, so this reads high)"
    } else {
        ""
    };
    format!(
        "{server}used {}{limit}; {held}{not_counted}; finishing {:.1} jobs/s, so with retention.finished {} the finished jobs kept level off at {:.0} ({:.0} B each): projected {}{of_limit}",
        bytes(node.used as f64),
        m.finish_rate,
        humantime::format_duration(m.retention),
        outlook.level,
        outlook.per_finished,
        bytes(projected),
    )
}

/// The machine's RAM as `INFO memory` reports it, for people.
fn ram(node: &NodeMemory) -> Option<String> {
    (node.system > 0).then(|| bytes(node.system as f64))
}

/// Ways to keep `node` under [`MEMORY_HEADROOM`] of `limit` bytes other than
/// a larger limit: the retention at which it would fit (when one of at least
/// a second does), and summaries instead of kept records.
fn growth_fixes(
    m: &MemoryFigures,
    outlook: &Outlook,
    node: &NodeMemory,
    limit: f64,
) -> Vec<String> {
    let mut fixes = Vec::new();
    let room = MEMORY_HEADROOM * limit - node.used as f64;
    let fits = (room / Outlook::share(m, node) + m.summaries as f64 * SUMMARY_BYTES)
        / (m.finish_rate * outlook.per_finished);
    if fits.is_finite() && fits >= 1.0 && fits < m.retention.as_secs_f64() {
        let whole = if fits >= 60.0 {
            fits as u64 / 60 * 60
        } else {
            fits as u64
        };
        fixes.push(format!(
            "lower `retention.finished` to {} or less",
            humantime::format_duration(Duration::from_secs(whole))
        ));
    }
    if m.keep_bodies {
        fixes.push(format!(
            "turn `retention.keep_bodies` off (a summary costs about {SUMMARY_BYTES:.0} B)"
        ));
    }
    fixes
}

/// `bytes` rounded up to whole MiB, as Redis's config spells it (`mb`).
fn mb_at_least(bytes: f64) -> String {
    format!("{}mb", (bytes / 1048576.0).ceil().max(1.0) as u64)
}

/// Bytes for people: B, KiB, MiB or GiB.
fn bytes(n: f64) -> String {
    const UNITS: [&str; 3] = ["KiB", "MiB", "GiB"];
    if n < 1024.0 {
        return format!("{n:.0} B");
    }
    let mut value = n / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn node(used: u64, maxmemory: u64, partitions: std::ops::Range<u16>) -> NodeMemory {
        NodeMemory {
            used,
            startup: MIB,
            maxmemory,
            system: 16 << 30,
            partitions: partitions.collect(),
        }
    }

    fn figures(nodes: Vec<NodeMemory>, live: u64, summaries: u64, rate: f64) -> MemoryFigures {
        MemoryFigures {
            nodes,
            partitions: 16,
            live_and_dead: live,
            summaries,
            finish_rate: rate,
            retention: Duration::from_secs(24 * 3600),
            keep_bodies: false,
        }
    }

    #[test]
    fn reads_info_memory() {
        let info = "# Memory\r\nused_memory:2097152\r\nused_memory_human:2.00M\r\n\
                    used_memory_startup:862000\r\nmaxmemory:33554432\r\n\
                    maxmemory_human:32.00M\r\ntotal_system_memory:8000000000\r\n";
        assert_eq!(
            parse_node_memory(info, vec![0, 1]),
            NodeMemory {
                used: 2_097_152,
                startup: 862_000,
                maxmemory: 33_554_432,
                system: 8_000_000_000,
                partitions: vec![0, 1],
            }
        );
    }

    #[test]
    fn warns_when_the_rate_would_fill_maxmemory() {
        // 100 jobs/s for a day: 8.64M summaries, 864 MB, far past 32 MiB.
        let c = judge_memory(&figures(
            vec![node(2 * MIB, 32 * MIB, 0..16)],
            1000,
            0,
            100.0,
        ));
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(
            c.detail.contains("100.0 jobs/s") && c.detail.contains("8640000"),
            "{c:?}"
        );
        let fix = c.fix.expect("a fix");
        assert!(fix.contains("CONFIG SET maxmemory 918mb"), "{fix}");
        // (0.9 × 32 MiB − 2 MiB) / (100/s × 100 B) = 2810 s, cut to minutes.
        assert!(
            fix.contains("lower `retention.finished` to 46m or less"),
            "{fix}"
        );
        assert!(!fix.contains("keep_bodies"), "{fix}");
    }

    #[test]
    fn ok_without_a_rate_and_with_room() {
        let c = judge_memory(&figures(vec![node(3 * MIB, 1 << 30, 0..16)], 1024, 0, 0.0));
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(c.detail.contains("1024 jobs held"), "{c:?}");
        assert!(c.detail.contains("2048 B per job"), "{c:?}");
        assert!(c.fix.is_none());
    }

    #[test]
    fn summaries_held_now_expire_at_the_level_off_point() {
        // 1M summaries (~95 MiB) held, nothing finishing: the projection
        // falls, but memory already used past 90% still warns.
        let mut m = figures(vec![node(200 * MIB, 256 * MIB, 0..16)], 0, 1_000_000, 0.0);
        let c = judge_memory(&m);
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(c.detail.contains("projected 104.6 MiB"), "{c:?}");
        m.nodes[0].used = 240 * MIB;
        let c = judge_memory(&m);
        assert_eq!(c.status, Status::Warn, "{c:?}");
        let fix = c.fix.expect("a fix");
        assert!(
            fix.contains("maxmemory 267mb") && !fix.contains("retention"),
            "{fix}"
        );
    }

    #[test]
    fn two_jobs_give_no_bytes_per_job_figure() {
        // What `hookq doctor` met on the Redis scripts/run.sh starts: two
        // jobs over Redis's own ~1 MB read as 489,672 B per job.
        let c = judge_memory(&figures(
            vec![node(MIB + 979_344, 1 << 30, 0..16)],
            2,
            0,
            0.0,
        ));
        assert!(
            c.detail
                .contains("2 jobs held, too few for a bytes-per-job figure (it needs 1000)"),
            "{c:?}"
        );
        assert!(!c.detail.contains("B per job"), "{c:?}");
        let c = judge_memory(&figures(
            vec![node(MIB + 979_344, 1 << 30, 0..16)],
            999,
            0,
            0.0,
        ));
        assert!(!c.detail.contains("B per job"), "{c:?}");
    }

    #[test]
    fn no_jobs_and_no_maxmemory() {
        let c = judge_memory(&figures(vec![node(MIB, 0, 0..16)], 0, 0, 0.0));
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(c.detail.contains("no jobs"), "{c:?}");
        assert!(
            c.detail
                .contains("no maxmemory set: Redis grows until the machine runs out"),
            "{c:?}"
        );
        let fix = c.fix.expect("a fix");
        assert!(fix.contains("CONFIG SET maxmemory 12288mb"), "{fix}");
        assert!(!fix.contains("retention"), "{fix}");
    }

    #[test]
    fn kept_bodies_cost_what_a_job_costs() {
        let mut m = figures(vec![node(11 * MIB, 64 * MIB, 0..16)], 10_240, 0, 10.0);
        m.keep_bodies = true;
        let c = judge_memory(&m);
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(c.detail.contains("(1024 B each)"), "{c:?}");
        assert!(c.detail.contains("not counted"), "{c:?}");
        assert!(c.fix.expect("a fix").contains("retention.keep_bodies` off"));
    }

    #[test]
    fn on_a_cluster_the_master_with_more_partitions_fills_first() {
        // 1 job/s for a day: 8.2 MiB of summaries, 3/4 of it on the first.
        let m = figures(
            vec![
                node(2 * MIB, 16 * MIB, 0..12),
                node(2 * MIB, 16 * MIB, 12..16),
            ],
            0,
            0,
            1.0,
        );
        let c = judge_memory(&m);
        assert!(
            c.detail
                .starts_with("fullest of 2 masters (partitions [0, 1"),
            "{c:?}"
        );
        assert!(c.detail.contains("projected 8.2 MiB"), "{c:?}");
        assert_eq!(c.status, Status::Ok, "{c:?}");
    }
}
