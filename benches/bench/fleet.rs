//! The fleet scenarios (SPEC §13): several daemons on one Redis, Redis's
//! CPU while idle and, at a steady 200 jobs/s, per delivered job; the floor
//! under those figures, the CPU of one `PING` round trip at that pace; and
//! the steady scenarios (SPEC §16), the same paced run at 200 and 2,000
//! jobs/s with its lateness.

use std::collections::HashMap;
use std::time::Duration;

use hookq::config::Config;
use hookq::store::Store;

use crate::common::{default_config, job, loaded_store, own_cpu_seconds, percentile, preload};
use crate::lateness::start_daemons;
use crate::nginx::Nginx;
use crate::support::redis::{CommandStats, RedisServer};
use crate::{Figures, Res};

/// SPEC §13's fleet: `daemons` daemons with the default config on one
/// Redis (in this process, each with its own connections, as separate
/// machines would run them). First idle: Redis's CPU over `idle` with
/// nothing scheduled (`idle_redis_cpu_pct`, % of a core). Then, unless `n`
/// is 0, `n` jobs due one every 5 ms (a steady 200 jobs/s) to nginx,
/// enqueued before the first is due and measured from the first due time
/// to the last answer: per delivered job, Redis's CPU, the commands it
/// served (`INFO commandstats`, those scripts run included) and the script
/// calls, and this process's CPU (the daemons'); `last_late_ms` is the last
/// answer's lateness (and [`paced_run`]'s other figures).
pub async fn fleet(
    redis: &RedisServer,
    nginx: &Nginx,
    daemons: usize,
    n: usize,
    idle: Duration,
) -> Res<Figures> {
    let (cfg, store, fleet) = fresh_fleet(redis, nginx, daemons, None).await?;
    let idle_pct = idle_redis_cpu_pct(redis, idle).await?;
    let mut figures = HashMap::from([("idle_redis_cpu_pct", idle_pct)]);
    if n > 0 {
        figures.extend(paced_run(redis, nginx, &store, &cfg, n, 200).await?);
    }
    for daemon in fleet {
        daemon.stop().await?;
    }
    Ok(figures)
}

/// An empty Redis and nginx, and `daemons` daemons with the default config
/// on them (but `partitions` when given), past their start-up work (and the
/// fleet's first beats): the config, a store with the scripts loaded, and
/// the daemons.
async fn fresh_fleet(
    redis: &RedisServer,
    nginx: &Nginx,
    daemons: usize,
    partitions: Option<u16>,
) -> Res<(Config, Store, Vec<hookq::daemon::Daemon>)> {
    redis.flush().await?;
    nginx.reset().await?;
    let mut cfg = default_config(redis);
    if let Some(partitions) = partitions {
        cfg.redis.partitions = partitions;
    }
    let store = loaded_store(&cfg).await?;
    let fleet = start_daemons(&cfg, daemons).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok((cfg, store, fleet))
}

/// SPEC §16's steady scenarios (`steady_200`, `steady_2000`,
/// `steady_2000_20_daemons`): `daemons` daemons with the default config on
/// one Redis (`redis.partitions` set to `partitions` when given: the tuned
/// `steady_200_4_partitions` and `steady_2000_4_partitions`), `rate` ×
/// `seconds` jobs due one every 1/`rate` s to nginx; [`paced_run`]'s
/// figures.
pub async fn steady(
    redis: &RedisServer,
    nginx: &Nginx,
    daemons: usize,
    rate: usize,
    seconds: f64,
    partitions: Option<u16>,
) -> Res<Figures> {
    let (cfg, store, fleet) = fresh_fleet(redis, nginx, daemons, partitions).await?;
    let n = (rate as f64 * seconds).round().max(1.0) as usize;
    let figures = paced_run(redis, nginx, &store, &cfg, n, rate).await;
    for daemon in fleet {
        daemon.stop().await?;
    }
    figures
}

/// Redis's CPU over `idle` (sleeping meanwhile), as % of a core.
async fn idle_redis_cpu_pct(redis: &RedisServer, idle: Duration) -> Res<f64> {
    let idle_cpu = redis.cpu_seconds().await?;
    tokio::time::sleep(idle).await;
    Ok((redis.cpu_seconds().await? - idle_cpu) / idle.as_secs_f64() * 100.0)
}

/// The measured part of [`fleet`] and [`steady`]: `n` jobs due one every
/// 1/`rate` s to nginx, enqueued before the first is due (which is 2 s or
/// more from now); the per-job costs from the first due time to nginx's
/// last answer ([`FleetCounters`]), `last_late_ms`, and [`paced_figures`].
async fn paced_run(
    redis: &RedisServer,
    nginx: &Nginx,
    store: &Store,
    cfg: &Config,
    n: usize,
    rate: usize,
) -> Res<Figures> {
    let first_due = store.redis_time_ms().await? + 2_000 + n as i64 / 20;
    let due = |i: usize| first_due + (i as f64 * 1000.0 / rate as f64) as i64;
    preload(
        store,
        cfg,
        (0..n)
            .map(|i| {
                let url = nginx.url(0, &format!("/paced?due={}", due(i)));
                job(format!("fl-{i}"), url, due(i))
            })
            .collect(),
    )
    .await?;
    let lead = first_due - store.redis_time_ms().await?;
    if lead <= 0 {
        return Err(format!("enqueuing {n} jobs took past their first due time").into());
    }
    tokio::time::sleep(Duration::from_millis(lead as u64)).await;
    let counters = FleetCounters::read(redis).await?;
    let span = (due(n - 1) - first_due) as u64;
    let stats = nginx
        .wait_for(n as u64, Duration::from_millis(60_000 + span * 2))
        .await?;
    let mut figures = counters.per_job_since(redis, n).await?;
    figures.insert("last_late_ms", (stats.last_ms - due(n - 1)) as f64);
    figures.extend(paced_figures(nginx, stats.last_ms - first_due, n)?);
    Ok(figures)
}

/// What a paced run of `n` jobs shows at nginx: `late_p50_ms`,
/// `late_p99_ms` and `late_max_ms` (answer − due, from nginx's log: each
/// job's URI carries its due time), `early` (answers before their due time)
/// and `jobs_per_s` (n over first due → last answer, `span_ms`).
pub fn paced_figures(nginx: &Nginx, span_ms: i64, n: usize) -> Res<Figures> {
    let late = nginx.lateness()?;
    Ok(HashMap::from([
        ("late_p50_ms", percentile(&late, 0.50) as f64),
        ("late_p99_ms", percentile(&late, 0.99) as f64),
        ("late_max_ms", late.last().copied().unwrap_or(0) as f64),
        ("early", late.iter().filter(|l| **l < 0).count() as f64),
        ("jobs_per_s", n as f64 * 1000.0 / span_ms.max(1) as f64),
    ]))
}

/// Redis's CPU (its system part apart), the time it spent inside scripts,
/// its wakes, commands served and script calls, and this process's CPU,
/// read at the start of a paced run's measurement ([`paced_run`], and
/// BullMQ's in `peer_bullmq_steady_200`).
pub struct FleetCounters {
    redis_cpu: (f64, f64),
    stats: CommandStats,
    wakes: i64,
    own_cpu: f64,
}

impl FleetCounters {
    /// Reads the counters (in the order of the fields).
    pub async fn read(redis: &RedisServer) -> Res<FleetCounters> {
        Ok(FleetCounters {
            redis_cpu: redis.cpu_user_system().await?,
            stats: redis.command_stats().await?,
            wakes: redis.wakes(),
            own_cpu: own_cpu_seconds(),
        })
    }

    /// Reads them again (same order) and returns each increase per job of
    /// `n`: `redis_cpu_us_per_job` (user and system), of which
    /// `redis_system_us_per_job` in system calls and
    /// `redis_in_scripts_us_per_job` inside script commands (the rest is
    /// the event loop's reading, parsing and replying),
    /// `redis_wakes_per_job`, `redis_commands_per_job`,
    /// `script_calls_per_job`, `daemons_cpu_us_per_job`.
    pub async fn per_job_since(self, redis: &RedisServer, n: usize) -> Res<Figures> {
        let per_job = |v: f64| v / n as f64;
        let (user, system) = redis.cpu_user_system().await?;
        let stats = redis.command_stats().await?;
        let wakes = redis.wakes();
        let (user_before, system_before) = self.redis_cpu;
        Ok(HashMap::from([
            (
                "redis_cpu_us_per_job",
                per_job((user + system - user_before - system_before) * 1e6),
            ),
            (
                "redis_system_us_per_job",
                per_job((system - system_before) * 1e6),
            ),
            (
                "redis_in_scripts_us_per_job",
                per_job((stats.script_usec - self.stats.script_usec) as f64),
            ),
            ("redis_wakes_per_job", per_job((wakes - self.wakes) as f64)),
            (
                "redis_commands_per_job",
                per_job((stats.commands - self.stats.commands) as f64),
            ),
            (
                "script_calls_per_job",
                per_job((stats.scripts - self.stats.scripts) as f64),
            ),
            (
                "daemons_cpu_us_per_job",
                per_job((own_cpu_seconds() - self.own_cpu) * 1e6),
            ),
        ]))
    }
}

/// The floor under the fleet figures: Redis's CPU per round trip of the
/// cheapest command, `n` `PING`s one every 5 ms (the fleet scenarios'
/// pace) from one connection, idle time included as in those scenarios.
/// At this pace every request wakes an idle Redis, which costs far more
/// than a pipelined or back-to-back one.
pub async fn round_trip_floor(redis: &RedisServer, n: usize) -> Res<Figures> {
    let mut conn = redis.conn().await;
    let cpu = redis.cpu_seconds().await?;
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    for _ in 0..n {
        tick.tick().await;
        let _: String = ::redis::cmd("PING").query_async(&mut conn).await?;
    }
    let per_ping = (redis.cpu_seconds().await? - cpu) * 1e6 / n as f64;
    Ok(HashMap::from([("redis_cpu_us_per_ping", per_ping)]))
}
