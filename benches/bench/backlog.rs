//! What a large backlog costs beyond memory: promoting due jobs beside many
//! parked ones, and the console's first paint over a million jobs (in a
//! headless Chromium).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hookq::daemon::Daemon;
use hookq::job::JobInput;

use crate::common::{config, default_config, job, loaded_store, median, preload};
use crate::support::redis::RedisServer;
use crate::{support, Figures, Res};

/// Time to promote `due` jobs while `parked` other jobs wait far ahead.
pub async fn promotion(redis: &RedisServer, parked: usize, due_n: usize) -> Res<Figures> {
    redis.flush().await?;
    let mut cfg = config(redis);
    cfg.redis.partitions = 16;
    let store = loaded_store(&cfg).await?;
    let now = store.redis_time_ms().await?;
    preload(
        &store,
        &cfg,
        (0..parked)
            .map(|i| {
                job(
                    format!("park-{i}"),
                    "http://x.example/".into(),
                    now + 86_400_000 + i as i64,
                )
            })
            .collect(),
    )
    .await?;
    // Read the clock again: parking a million jobs takes a while, and jobs
    // already due when created would skip the due set altogether.
    let now = store.redis_time_ms().await?;
    preload(
        &store,
        &cfg,
        (0..due_n)
            .map(|i| job(format!("due-{i}"), "http://x.example/".into(), now + 1500))
            .collect(),
    )
    .await?;
    while store.redis_time_ms().await? < now + 1600 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    let mut moved = 0;
    for p in 0..cfg.redis.partitions {
        loop {
            let r = store.promote(p, hookq::carrier::PROMOTE_BATCH).await?;
            moved += r.moved;
            if r.moved < hookq::carrier::PROMOTE_BATCH {
                break;
            }
        }
    }
    let took = started.elapsed();
    if moved != due_n {
        return Err(format!("promoted {moved} of {due_n}").into());
    }
    Ok(HashMap::from([(
        "us_per_job",
        took.as_secs_f64() * 1e6 / due_n as f64,
    )]))
}

/// The console's first paint with `n` jobs scheduled in Redis (SPEC
/// §11.3: under 300 ms with 1,000,000): the daemon in-process with its
/// default config, a headless Chromium loading each page afresh `loads`
/// times. A page's figure is the median time from the start of its
/// navigation until its data is drawn (`document.body.dataset.painted`,
/// which the console sets then).
pub async fn console_paint(redis: &RedisServer, n: usize, loads: usize) -> Res<Figures> {
    redis.flush().await?;
    let cfg = default_config(redis);
    let store = loaded_store(&cfg).await?;
    let first_due = store.redis_time_ms().await? + 3_600_000;
    let spacing = 86_400_000 / n as i64;
    let jobs: Vec<JobInput> = (0..n)
        .map(|i| {
            let due = first_due + i as i64 * spacing;
            job(
                format!("ui-{i:023}"),
                "http://sink.example/hook".into(),
                due,
            )
        })
        .collect();
    preload(&store, &cfg, jobs).await?;
    let daemon = Daemon::start(cfg).await?;
    let base = daemon.url();
    let browser = support::browser::Browser::start().await;
    let mut figures = Figures::new();
    let one_job = format!("#/job/ui-{:023}", n / 2);
    for (name, page) in [
        ("overview_ms", "#/overview"),
        ("jobs_ms", "#/jobs"),
        ("job_ms", one_job.as_str()),
        ("dead_letters_ms", "#/dead"),
        ("hosts_ms", "#/hosts"),
    ] {
        let mut times = Vec::new();
        for _ in 0..loads {
            browser.goto("about:blank").await;
            browser.goto(&format!("{base}/ui{page}")).await;
            browser.wait_for("body[data-painted]").await;
            let painted = browser
                .eval("return Number(document.body.dataset.painted)")
                .await;
            times.push(painted.as_f64().ok_or("no paint time")?);
        }
        figures.insert(name, median(times));
    }
    daemon.stop().await?;
    redis.flush().await?;
    Ok(figures)
}
