//! The fleet scenarios (SPEC §13): several daemons on one Redis, Redis's
//! CPU while idle and, at a steady 200 jobs/s, per delivered job; and the
//! floor under those figures, the CPU of one `PING` round trip at that pace.

use std::collections::HashMap;
use std::time::Duration;

use hookq::config::Config;
use hookq::store::Store;

use crate::common::{default_config, job, loaded_store, own_cpu_seconds, preload};
use crate::lateness::start_daemons;
use crate::nginx::Nginx;
use crate::support::redis::RedisServer;
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
/// answer's lateness.
pub async fn fleet(
    redis: &RedisServer,
    nginx: &Nginx,
    daemons: usize,
    n: usize,
    idle: Duration,
) -> Res<Figures> {
    redis.flush().await?;
    nginx.reset().await?;
    let cfg = default_config(redis);
    let store = loaded_store(&cfg).await?;
    let fleet = start_daemons(&cfg, daemons).await?;
    // Past the daemons' start-up work.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_pct = idle_redis_cpu_pct(redis, idle).await?;
    let mut figures = HashMap::from([("idle_redis_cpu_pct", idle_pct)]);
    if n > 0 {
        figures.extend(fleet_paced_run(redis, nginx, &store, &cfg, n).await?);
    }
    for daemon in fleet {
        daemon.stop().await?;
    }
    Ok(figures)
}

/// Redis's CPU over `idle` (sleeping meanwhile), as % of a core.
async fn idle_redis_cpu_pct(redis: &RedisServer, idle: Duration) -> Res<f64> {
    let idle_cpu = redis.cpu_seconds().await?;
    tokio::time::sleep(idle).await;
    Ok((redis.cpu_seconds().await? - idle_cpu) / idle.as_secs_f64() * 100.0)
}

/// The measured part of [`fleet`]: `n` jobs due one every 5 ms to nginx
/// from 2 s on, enqueued before the first is due; the per-job costs from
/// the first due time to nginx's last answer, and `last_late_ms`.
async fn fleet_paced_run(
    redis: &RedisServer,
    nginx: &Nginx,
    store: &Store,
    cfg: &Config,
    n: usize,
) -> Res<Figures> {
    const STEP_MS: i64 = 5;
    let first_due = store.redis_time_ms().await? + 2_000;
    let url = nginx.url(0, "/fleet");
    preload(
        store,
        cfg,
        (0..n)
            .map(|i| {
                job(
                    format!("fl-{i}"),
                    url.clone(),
                    first_due + i as i64 * STEP_MS,
                )
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
    let stats = nginx
        .wait_for(n as u64, Duration::from_secs(60 + n as u64 * 5 / 1000))
        .await?;
    let mut figures = counters.per_job_since(redis, n).await?;
    figures.insert(
        "last_late_ms",
        (stats.last_ms - (first_due + (n as i64 - 1) * STEP_MS)) as f64,
    );
    Ok(figures)
}

/// Redis's CPU, commands served and script calls, and this process's CPU,
/// read at the start of [`fleet_paced_run`]'s measurement.
struct FleetCounters {
    redis_cpu: f64,
    commands: i64,
    scripts: i64,
    own_cpu: f64,
}

impl FleetCounters {
    /// Reads the counters (in the order of the fields).
    async fn read(redis: &RedisServer) -> Res<FleetCounters> {
        Ok(FleetCounters {
            redis_cpu: redis.cpu_seconds().await?,
            commands: redis.command_calls().await?,
            scripts: redis.script_calls().await?,
            own_cpu: own_cpu_seconds(),
        })
    }

    /// Reads them again (same order) and returns each increase per job of
    /// `n`: `redis_cpu_us_per_job`, `redis_commands_per_job`,
    /// `script_calls_per_job`, `daemons_cpu_us_per_job`.
    async fn per_job_since(self, redis: &RedisServer, n: usize) -> Res<Figures> {
        let per_job = |v: f64| v / n as f64;
        Ok(HashMap::from([
            (
                "redis_cpu_us_per_job",
                per_job((redis.cpu_seconds().await? - self.redis_cpu) * 1e6),
            ),
            (
                "redis_commands_per_job",
                per_job((redis.command_calls().await? - self.commands) as f64),
            ),
            (
                "script_calls_per_job",
                per_job((redis.script_calls().await? - self.scripts) as f64),
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
