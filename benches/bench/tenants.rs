//! `tenants_fair` (SPEC §15): one tenant's bulk beside another tenant's
//! steady trickle, and two saturated tenants with weights 3:1, each on
//! hookq's default config (one daemon, stock Redis, nginx as receiver).

use std::time::Duration;

use hookq::config::Config;
use hookq::daemon::Daemon;
use hookq::job::JobInput;
use hookq::store::Store;
use hookq::tenant::{internal_id, TenantEntry};
use serde_json::Value;

use crate::common::{check_lead, default_config, job, lead_ms, loaded_store, percentile, Meter};
use crate::nginx::Nginx;
use crate::sink::Sink;
use crate::support::redis::RedisServer;
use crate::{Figures, Res};

/// B's jobs: one every this many ms.
const TRICKLE_EVERY_MS: i64 = 10;

/// Enqueues `jobs` as tenant `tenant`'s (their ids become `<tenant>/<id>`).
async fn preload_for(store: &Store, cfg: &Config, tenant: &str, jobs: Vec<JobInput>) -> Res<()> {
    for chunk in jobs.chunks(1000) {
        let mut new = Vec::with_capacity(chunk.len());
        for input in chunk.iter().cloned() {
            let mut job = input.validate(cfg)?.new_job(cfg);
            job.id = internal_id(tenant, &job.id);
            new.push(job);
        }
        for outcome in store.enqueue_many(&new).await? {
            outcome?;
        }
    }
    Ok(())
}

/// `n` jobs of tenant `bulk` due at once to nginx's first host, alone
/// (`trickle` false) or with tenant `pay`'s jobs due one every
/// [`TRICKLE_EVERY_MS`] to the sink for `trickle_ms` from the same moment;
/// the bulk's figures, and the sink's stats with the trickle.
async fn bulk_run(
    redis: &RedisServer,
    nginx: &Nginx,
    sink: &Sink,
    n: usize,
    trickle_ms: i64,
) -> Res<(Figures, Option<Value>)> {
    redis.flush().await?;
    nginx.reset().await?;
    sink.reset().await?;
    let cfg = default_config(redis);
    let store = loaded_store(&cfg).await?;
    let trickle = (trickle_ms / TRICKLE_EVERY_MS).max(0) as usize;
    let due = store.redis_time_ms().await? + lead_ms(n + trickle);
    let url = nginx.url(0, "/bulk");
    let bulk = (0..n)
        .map(|i| job(format!("b-{i}"), url.clone(), due))
        .collect();
    preload_for(&store, &cfg, "bulk", bulk).await?;
    let pay = (0..trickle)
        .map(|i| {
            job(
                format!("p-{i}"),
                sink.url("/pay"),
                due + i as i64 * TRICKLE_EVERY_MS,
            )
        })
        .collect();
    preload_for(&store, &cfg, "pay", pay).await?;
    check_lead(&store, due).await?;
    let meter = Meter::start(redis, nginx).await?;
    let daemon = Daemon::start(cfg).await?;
    let stats = nginx.wait_for(n as u64, Duration::from_secs(600)).await?;
    let figures = meter.figures(redis, nginx, stats, due, n).await?;
    let paid = if trickle > 0 {
        Some(
            sink.wait_for(trickle as u64, Duration::from_secs(120))
                .await?,
        )
    } else {
        None
    };
    daemon.stop().await?;
    Ok((figures, paid))
}

/// Sleeps until Redis's clock reads `ms`.
async fn sleep_until(store: &Store, ms: i64) -> Res<()> {
    let now = store.redis_time_ms().await?;
    tokio::time::sleep(Duration::from_millis((ms - now).max(0) as u64)).await;
    Ok(())
}

/// Tenants `x` (weight 3) and `y` (weight 1), `each` jobs each due at once
/// to nginx's first and second hosts: their shares of what nginx answered
/// over `window`, from 1 s after the due moment.
async fn weighted_run(
    redis: &RedisServer,
    nginx: &Nginx,
    each: usize,
    window: Duration,
) -> Res<(u64, u64)> {
    redis.flush().await?;
    nginx.reset().await?;
    let mut cfg = default_config(redis);
    cfg.tenants = vec![TenantEntry {
        name: "x".into(),
        weight: Some(3),
        max_live_jobs: None,
        create_rate: None,
    }];
    let store = loaded_store(&cfg).await?;
    let due = store.redis_time_ms().await? + lead_ms(2 * each);
    for (tenant, server) in [("x", 0), ("y", 1)] {
        let url = nginx.url(server, "/weighted");
        let jobs = (0..each)
            .map(|i| job(format!("w-{i}"), url.clone(), due))
            .collect();
        preload_for(&store, &cfg, tenant, jobs).await?;
    }
    check_lead(&store, due).await?;
    let daemon = Daemon::start(cfg).await?;
    sleep_until(&store, due + 1000).await?;
    let (x0, y0) = (nginx.count_on(0)?, nginx.count_on(1)?);
    sleep_until(&store, due + 1000 + window.as_millis() as i64).await?;
    let (x1, y1) = (nginx.count_on(0)?, nginx.count_on(1)?);
    daemon.stop().await?;
    if y1 - y0 == 0 || x1 - x0 + y1 - y0 >= 2 * each as u64 {
        return Err("tenants_fair: a tenant ran dry inside the window; raise `each`".into());
    }
    Ok((x1 - x0, y1 - y0))
}

/// `tenants_fair`: the bulk's rate alone and beside the trickle
/// (`bulk_kept_pct`, the bar ≥ 90), the trickle's lateness at the sink
/// (`pay_p99_ms`, the bar ≤ 50), and the weighted shares over `window`
/// (`weighted_ratio` x:y, the bar within 10% of 3).
pub async fn tenants_fair(
    redis: &RedisServer,
    nginx: &Nginx,
    sink: &Sink,
    n: usize,
    window: Duration,
) -> Res<Figures> {
    let (alone, _) = bulk_run(redis, nginx, sink, n, 0).await?;
    let rate = |f: &Figures| f.get("jobs_per_s").copied().unwrap_or(0.0);
    // The trickle lasts 90% of the bulk's drain alone: throughout it.
    let drain_ms = (n as f64 / rate(&alone).max(1.0) * 1000.0 * 0.9) as i64;
    let (mut figures, paid) = bulk_run(redis, nginx, sink, n, drain_ms).await?;
    let mut late: Vec<i64> = paid
        .as_ref()
        .and_then(|s| s["lateness"].as_array())
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    late.sort_unstable();
    figures.insert("bulk_alone_jobs_per_s", rate(&alone));
    figures.insert(
        "bulk_kept_pct",
        rate(&figures) / rate(&alone).max(1e-9) * 100.0,
    );
    figures.insert("pay_jobs", late.len() as f64);
    figures.insert("pay_p50_ms", percentile(&late, 0.5) as f64 / 1000.0);
    figures.insert("pay_p99_ms", percentile(&late, 0.99) as f64 / 1000.0);
    figures.insert(
        "pay_max_ms",
        late.last().copied().unwrap_or(0) as f64 / 1000.0,
    );
    // Enough for both to stay saturated through the window.
    let each = ((rate(&alone) * (window.as_secs_f64() + 2.0)) as usize).max(1000);
    let (x, y) = weighted_run(redis, nginx, each, window).await?;
    figures.insert("weighted_x", x as f64);
    figures.insert("weighted_y", y as f64);
    figures.insert("weighted_ratio", x as f64 / (y as f64).max(1.0));
    Ok(figures)
}
