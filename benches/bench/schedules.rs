//! The schedules scenario (SPEC §12's bar): many schedules firing through
//! one daemon, their jobs delivered to nginx; the firing lateness read from
//! the delivered jobs' summaries, Redis bytes per schedule and CPU per
//! firing.

use std::time::Duration;

use hookq::config::Config;
use hookq::daemon::Daemon;
use hookq::store::Store;
use serde_json::json;

use crate::common::{default_config, loaded_store, percentile, Meter};
use crate::nginx::Nginx;
use crate::support::redis::RedisServer;
use crate::{Figures, Res};

/// SPEC §12's bar: `n` schedules firing every `every_ms` (the full run:
/// 100,000 every minute, about 1,700 firings a second), their fire times
/// spread evenly over the interval, fired by one daemon with the default
/// config for `rounds` intervals, jobs delivered to nginx. Reports the
/// firing lateness (fired job created − fire time, both Redis's clock,
/// read from the delivered jobs' summaries) p50/p99/max, Redis bytes per
/// schedule (`used_memory` before and after creating them), and Redis CPU
/// per firing (the firing and the job's delivery).
pub async fn schedules_firing(
    redis: &RedisServer,
    nginx: &Nginx,
    n: usize,
    every_ms: i64,
    rounds: i64,
) -> Res<Figures> {
    redis.flush().await?;
    nginx.reset().await?;
    let cfg = default_config(redis);
    let store = loaded_store(&cfg).await?;
    let url = nginx.url(0, "/schedules");
    let before = redis.used_memory().await?;
    let now = store.redis_time_ms().await?;
    put_schedules(&store, &cfg, &url, n, every_ms, now).await?;
    let after = redis.used_memory().await?;
    let meter = Meter::start(redis, nginx).await?;
    let daemon = Daemon::start(cfg.clone()).await?;
    // Every schedule fires `rounds` times from one interval after `now`.
    let end = now + every_ms * (rounds + 1);
    while store.redis_time_ms().await? < end + 1000 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let firings = n as u64 * rounds as u64;
    let stats = nginx.wait_for(firings, Duration::from_secs(120)).await?;
    daemon.stop().await?;
    let mut figures = meter
        .figures(redis, nginx, stats, now, firings as usize)
        .await?;
    let lateness = firing_lateness(&store, &cfg, firings as usize).await?;
    let redis_cpu_per_firing = figures.get("redis_cpu_us_per_job").copied().unwrap_or(0.0);
    figures.retain(|k, _| *k == "hookq_cpu_us_per_job");
    figures.insert("schedules", n as f64);
    figures.insert("firings", lateness.len() as f64);
    figures.insert("firings_per_s", n as f64 * 1000.0 / every_ms as f64);
    figures.insert("lateness_p50_ms", percentile(&lateness, 0.5) as f64);
    figures.insert("lateness_p99_ms", percentile(&lateness, 0.99) as f64);
    figures.insert(
        "lateness_max_ms",
        lateness.last().copied().unwrap_or(0) as f64,
    );
    figures.insert(
        "redis_bytes_per_schedule",
        (after - before) as f64 / n as f64,
    );
    figures.insert("redis_cpu_us_per_firing", redis_cpu_per_firing);
    Ok(figures)
}

/// Writes `n` schedules `sched-000000`… firing every `every_ms` to `url`,
/// their fire times spread evenly over one interval from `now` (Redis's
/// clock), 500 writes at a time; every one is validated before any is
/// written.
async fn put_schedules(
    store: &Store,
    cfg: &Config,
    url: &str,
    n: usize,
    every_ms: i64,
    now: i64,
) -> Res<()> {
    use hookq::schedule::ScheduleInput;
    use hookq::store::schedules::{PutOutcome, ScheduleWrite};
    let every = format!("{}ms", every_ms);
    let mut specs = Vec::with_capacity(n);
    for i in 0..n {
        let input: ScheduleInput = serde_json::from_value(json!({
            "id": format!("sched-{i:06}"), "every": every,
            "start_at": now + (i as i64 * every_ms) / n as i64,
            "job": {"url": url, "body": {"report": "hourly"}}}))?;
        let valid = input.validate(cfg)?;
        specs.push(valid);
    }
    for chunk in specs.chunks(500) {
        let writes = chunk.iter().map(|valid| {
            let rule = valid.spec.timing.rule(now);
            let next = rule
                .ok()
                .and_then(|rule| valid.spec.timing.next_after(&rule, now));
            let write = ScheduleWrite::new(cfg, &valid.id, &valid.spec, false, next, now, None);
            async move { store.put_schedule(&write).await }
        });
        for outcome in futures_util::future::join_all(writes).await {
            if !matches!(outcome?, PutOutcome::Written(_)) {
                return Err("a schedule was not written".into());
            }
        }
    }
    Ok(())
}

/// The firing lateness of every delivered job a schedule fired (the job's
/// creation − its fire time, both Redis's clock, from the summaries),
/// sorted; `expected` sizes the list.
async fn firing_lateness(store: &Store, cfg: &Config, expected: usize) -> Res<Vec<i64>> {
    let mut lateness = Vec::with_capacity(expected);
    let mut cursor = None;
    loop {
        let page = store
            .list_jobs(None, Some(hookq::job::State::Delivered), None, 1000, cursor)
            .await?;
        for job in &page.items {
            if let Some((_, at)) = hookq::schedule::fired_by(&job.id) {
                lateness.push(job.created - at);
            }
        }
        match page.next_cursor {
            Some(next) => {
                cursor = Some(hookq::store::listing::Cursor::parse(
                    &next,
                    cfg.redis.partitions,
                    hookq::store::listing::CursorKind::Jobs,
                    "cursor",
                )?)
            }
            None => break,
        }
    }
    lateness.sort_unstable();
    Ok(lateness)
}
