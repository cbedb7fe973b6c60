//! The memory check of `hookq doctor`: jobs held, bytes per job, the finish
//! rate, and where memory levels off once the finished jobs kept for
//! `retention.finished` stop growing; it warns before Redis reaches
//! `maxmemory` (or when there is none).
//!
//! It reads the partitions' stats hashes (`<ns>:{p}:stats`), summary indexes
//! (`<ns>:{p}:done`), the counts of [`Store::stats`], Redis's clock and
//! `INFO memory` of each server holding partitions.

use std::time::Duration;

use super::{check, info_field, info_of, Check, Status};
use crate::config::Config;
use crate::store::listing::Stats;
use crate::store::{RedisConn, Store, StoreResult};

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

/// The memory check: its figures measured, then judged.
pub(super) async fn memory_check(store: &Store, config: &Config) -> Check {
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
