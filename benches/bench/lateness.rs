//! The lateness scenarios: receive − due measured at the [`Sink`], with
//! jobs one at a time (idle) or due evenly at a rate, by hookq (one daemon
//! or several) or by the naive design.

use std::collections::HashMap;
use std::time::Duration;

use hookq::config::Config;
use hookq::daemon::Daemon;
use hookq::store::Store;
use serde_json::Value;

use crate::common::{config, job, loaded_store, percentile, preload};
use crate::naive::{self, Runner};
use crate::sink::Sink;
use crate::support::redis::RedisServer;
use crate::{Figures, Res};

/// Lateness (receive − due at the sink) with jobs due evenly at `rate`/s
/// for `seconds`, or one at a time (`rate` = 0: idle, `count` jobs 150 ms apart
/// with the previous one delivered first).
pub async fn lateness(
    redis: &RedisServer,
    sink: &Sink,
    rate: usize,
    seconds: usize,
    naive: bool,
) -> Res<Figures> {
    lateness_with(redis, sink, rate, seconds, naive, 1).await
}

/// [`lateness`] with `daemons` hookq daemons sharing the Redis (the fleet
/// deals the partitions out among them).
pub async fn lateness_with(
    redis: &RedisServer,
    sink: &Sink,
    rate: usize,
    seconds: usize,
    naive: bool,
    daemons: usize,
) -> Res<Figures> {
    redis.flush().await?;
    sink.reset().await?;
    let cfg = config(redis);
    let store = loaded_store(&cfg).await?;
    let url = sink.url("/late");
    let runner = Runner::start(redis, &cfg, naive, url.clone()).await?;
    let others = start_daemons(&cfg, daemons.saturating_sub(1)).await?;
    if daemons > 1 {
        // Past the fleet's first beats: every daemon sees the same deal.
        tokio::time::sleep(hookq::fleet::BEAT * 2).await;
    }
    let target = LateTarget {
        redis,
        store: &store,
        cfg: &cfg,
        naive,
        url,
    };
    if rate == 0 {
        target.one_at_a_time(sink, seconds).await?;
    } else {
        target.steady(sink, rate, seconds).await?;
    }
    let stats = sink.stats().await?;
    runner.stop().await?;
    for daemon in others {
        daemon.stop().await?;
    }
    Ok(lateness_figures(&stats))
}

/// Starts `count` hookq daemons with `cfg`, one after the other.
pub async fn start_daemons(cfg: &Config, count: usize) -> Res<Vec<Daemon>> {
    let mut daemons = Vec::with_capacity(count);
    for _ in 0..count {
        daemons.push(Daemon::start(cfg.clone()).await?);
    }
    Ok(daemons)
}

/// Where the lateness scenarios enqueue their jobs: hookq's store (jobs to
/// `url`) or, when `naive`, the naive design's keys.
struct LateTarget<'a> {
    redis: &'a RedisServer,
    store: &'a Store,
    cfg: &'a Config,
    naive: bool,
    url: String,
}

impl LateTarget<'_> {
    /// Enqueues `jobs` (id, due ms) for the naive design or for hookq.
    async fn enqueue(&self, jobs: Vec<(String, i64)>) -> Res<()> {
        if self.naive {
            naive::preload(self.redis, jobs).await
        } else {
            let jobs = jobs
                .into_iter()
                .map(|(id, due)| job(id, self.url.clone(), due))
                .collect();
            preload(self.store, self.cfg, jobs).await
        }
    }

    /// Idle: `count` jobs one at a time, each due ~150 ms after it is
    /// enqueued and enqueued once the previous one has reached `sink`.
    async fn one_at_a_time(&self, sink: &Sink, count: usize) -> Res<()> {
        for i in 0..count {
            let due = self.store.redis_time_ms().await? + 150 + (i as i64 * 7) % 50;
            self.enqueue(vec![(format!("il-{i}"), due)]).await?;
            sink.wait_for(i as u64 + 1, Duration::from_secs(10)).await?;
        }
        Ok(())
    }

    /// `rate` × `seconds` jobs due evenly at `rate`/s from 2 s on, all
    /// enqueued at once; waits until `sink` has them all.
    async fn steady(&self, sink: &Sink, rate: usize, seconds: usize) -> Res<()> {
        let n = rate * seconds;
        let start = self.store.redis_time_ms().await? + 2000;
        let step = 1000.0 / rate as f64;
        let jobs = (0..n)
            .map(|i| (format!("sl-{i}"), start + (i as f64 * step) as i64))
            .collect();
        self.enqueue(jobs).await?;
        sink.wait_for(n as u64, Duration::from_secs(seconds as u64 + 120))
            .await?;
        Ok(())
    }
}

/// The sink's lateness list (µs) as `p50_ms`, `p90_ms`, `p99_ms`, `max_ms`
/// (0.1 ms steps) and the count of `early` deliveries.
fn lateness_figures(stats: &Value) -> Figures {
    let mut late: Vec<i64> = stats["lateness"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    late.sort_unstable();
    let ms = |us: i64| (us as f64 / 100.0).round() / 10.0;
    HashMap::from([
        ("p50_ms", ms(percentile(&late, 0.50))),
        ("p90_ms", ms(percentile(&late, 0.90))),
        ("p99_ms", ms(percentile(&late, 0.99))),
        ("max_ms", ms(late.last().copied().unwrap_or(0))),
        ("early", late.iter().filter(|l| **l < 0).count() as f64),
    ])
}
