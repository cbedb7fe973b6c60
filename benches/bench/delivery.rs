//! The delivery-rate scenarios, all measured at nginx: jobs due at one
//! moment to one host (plain, ordered, signed, traced, by the naive design,
//! on a cluster), the default against the lifted per-host limit, many
//! healthy hosts and one host beside a hanging one, the shared per-host
//! rate of two daemons, and an open host's parked backlog.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hookq::config::{Config, SigningMode};
use hookq::daemon::Daemon;
use hookq::job::{now_ms, JobInput};
use hookq::store::Store;

use crate::common::{
    check_lead, cluster_config, config, default_config, job, lead_ms, loaded_store,
    own_cpu_seconds, preload, Meter,
};
use crate::naive::{self, Runner};
use crate::nginx::Nginx;
use crate::support::cluster::RedisCluster;
use crate::support::hanging::HangingHost;
use crate::support::redis::RedisServer;
use crate::{Figures, Res};

/// Two signing secrets (as during a rotation) in `mode`: every attempt
/// carries two signatures.
pub fn sign(config: &mut Config, mode: SigningMode) {
    config.delivery.signing_secrets = vec![
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
        "whsec_Vm9yc2ljaHQgYmVpbSBSb3RpZXJlbiEh".into(),
    ];
    config.delivery.signing_mode = mode;
}

/// n jobs all due at the same moment to one nginx host (per-host limit
/// lifted to 512, SPEC §10's throughput setting), delivered by hookq or by
/// the naive design, with `tweak` applied to hookq's config; rate = n /
/// (last 2xx − due).
pub async fn delivery_rate(
    redis: &RedisServer,
    nginx: &Nginx,
    n: usize,
    naive: bool,
    tweak: impl Fn(&mut Config),
) -> Res<Figures> {
    delivery_rate_of(redis, nginx, n, naive, None, tweak).await
}

/// [`delivery_rate`] of `n` jobs spread over `keys` ordering keys (SPEC
/// §11.5), created key by key in rounds (job j of every key, then j + 1),
/// so each key's jobs are attempted one at a time in that order.
pub async fn delivery_rate_ordered(
    redis: &RedisServer,
    nginx: &Nginx,
    n: usize,
    keys: usize,
) -> Res<Figures> {
    delivery_rate_of(redis, nginx, n, false, Some(keys), |_| {}).await
}

/// [`delivery_rate`], its jobs spread over `ordering_keys` keys when given
/// (see [`delivery_rate_ordered`]).
async fn delivery_rate_of(
    redis: &RedisServer,
    nginx: &Nginx,
    n: usize,
    naive: bool,
    ordering_keys: Option<usize>,
    tweak: impl Fn(&mut Config),
) -> Res<Figures> {
    redis.flush().await?;
    nginx.reset().await?;
    let mut cfg = config(redis);
    tweak(&mut cfg);
    let store = loaded_store(&cfg).await?;
    let due = store.redis_time_ms().await? + 3000 + (n as i64 / 50);
    let url = nginx.url(0, "/rate");
    if naive {
        naive::preload(redis, (0..n).map(|i| (format!("nr-{i}"), due)).collect()).await?;
    } else {
        let jobs = match ordering_keys {
            None => (0..n)
                .map(|i| job(format!("dr-{i}"), url.clone(), due))
                .collect(),
            Some(keys) => (0..n)
                .map(|i| {
                    let (round, key) = (i / keys, i % keys);
                    JobInput {
                        ordering_key: Some(format!("key-{key}")),
                        ..job(format!("do-{key}-{round}"), url.clone(), due)
                    }
                })
                .collect(),
        };
        preload(&store, &cfg, jobs).await?;
    }
    let meter = Meter::start(redis, nginx).await?;
    let runner = Runner::start(redis, &cfg, naive, url).await?;
    let stats = nginx.wait_for(n as u64, Duration::from_secs(600)).await?;
    let figures = meter.figures(redis, nginx, stats, due, n).await?;
    runner.stop().await?;
    Ok(figures)
}

/// One run of `one_host_default` and `one_host_lifted`: the same `n` jobs
/// due at once to one nginx host, delivered by hookq with its default config
/// (per-host limit 64), then with `per_host_concurrency = 512`. The default
/// run's figures carry `ratio_to_lifted_pct` (default rate / lifted rate ×
/// 100, SPEC §11.6: at least 90), from this same run.
pub async fn one_host(redis: &RedisServer, nginx: &Nginx, n: usize) -> Res<(Figures, Figures)> {
    let mut default = one_host_run(redis, nginx, n, default_config(redis)).await?;
    let mut lifted_cfg = default_config(redis);
    lifted_cfg.delivery.per_host_concurrency = 512;
    let lifted = one_host_run(redis, nginx, n, lifted_cfg).await?;
    let rate = |f: &Figures| f.get("jobs_per_s").copied().unwrap_or(0.0);
    default.insert(
        "ratio_to_lifted_pct",
        rate(&default) / rate(&lifted).max(1e-9) * 100.0,
    );
    Ok((default, lifted))
}

/// `n` jobs due at once to nginx's first host, delivered by hookq with `cfg`.
async fn one_host_run(redis: &RedisServer, nginx: &Nginx, n: usize, cfg: Config) -> Res<Figures> {
    redis.flush().await?;
    nginx.reset().await?;
    let store = loaded_store(&cfg).await?;
    let due = store.redis_time_ms().await? + lead_ms(n);
    let url = nginx.url(0, "/one");
    preload(
        &store,
        &cfg,
        (0..n)
            .map(|i| job(format!("oh-{i}"), url.clone(), due))
            .collect(),
    )
    .await?;
    check_lead(&store, due).await?;
    let meter = Meter::start(redis, nginx).await?;
    let daemon = Daemon::start(cfg).await?;
    let stats = nginx.wait_for(n as u64, Duration::from_secs(600)).await?;
    let figures = meter.figures(redis, nginx, stats, due, n).await?;
    daemon.stop().await?;
    Ok(figures)
}

/// SPEC §11.6's hanging-host bar: `healthy` jobs spread round-robin over the
/// [`NGINX_SERVERS`](crate::nginx::NGINX_SERVERS) nginx hosts, all due at once, delivered by hookq with its
/// default config except `delivery.timeout = 5s` (instead of 10s, so that
/// runs stay short; the hanging attempts time out sooner, which does not
/// help the healthy hosts: their slots are not the hanging host's), first
/// alone, then with `hanging` more jobs due at the same moment to a
/// [`HangingHost`]. Reports both healthy rates (n_healthy / (last healthy 2xx
/// − due)), `healthy_kept_pct` (with / alone × 100; the bar: at least 90),
/// and `jobs_per_s` with the per-healthy-job costs of the run with the
/// hanging host.
pub async fn many_hosts(
    redis: &RedisServer,
    nginx: &Nginx,
    healthy: usize,
    hanging: usize,
) -> Res<Figures> {
    let mut rates = Vec::new();
    let mut figures = Figures::new();
    for with_hang in [false, true] {
        redis.flush().await?;
        nginx.reset().await?;
        let mut cfg = default_config(redis);
        cfg.delivery.timeout = Duration::from_secs(5);
        let store = loaded_store(&cfg).await?;
        let hang = HangingHost::start().await;
        let total = healthy + if with_hang { hanging } else { 0 };
        let due = store.redis_time_ms().await? + lead_ms(total);
        let mut jobs: Vec<JobInput> = (0..healthy)
            .map(|i| job(format!("mh-{i}"), nginx.url(i, "/many"), due))
            .collect();
        if with_hang {
            jobs.extend((0..hanging).map(|i| job(format!("hang-{i}"), hang.url("/hang"), due)));
        }
        preload(&store, &cfg, jobs).await?;
        check_lead(&store, due).await?;
        let meter = Meter::start(redis, nginx).await?;
        let daemon = Daemon::start(cfg).await?;
        let stats = nginx
            .wait_for(healthy as u64, Duration::from_secs(600))
            .await?;
        let run = meter.figures(redis, nginx, stats, due, healthy).await?;
        rates.push(run.get("jobs_per_s").copied().unwrap_or(0.0));
        if with_hang {
            figures.extend(run);
        } else {
            for (name, alone) in [
                ("alone_redis_cpu_us_per_job", "redis_cpu_us_per_job"),
                ("alone_hookq_cpu_us_per_job", "hookq_cpu_us_per_job"),
                ("alone_script_calls_per_job", "script_calls_per_job"),
            ] {
                figures.insert(name, run.get(alone).copied().unwrap_or(0.0));
            }
        }
        // Stop claiming, then close the held connections: the attempts in
        // flight to the hanging host fail at once and the stop is quick.
        daemon.token().cancel();
        drop(hang);
        tokio::time::timeout(Duration::from_secs(30), daemon.wait())
            .await
            .map_err(|_| "hookq did not stop within 30 s")??;
    }
    figures.remove("first_late_ms");
    figures.insert("alone_jobs_per_s", rates[0]);
    figures.insert("with_hanging_jobs_per_s", rates[1]);
    figures.insert("healthy_kept_pct", rates[1] / rates[0].max(1e-9) * 100.0);
    Ok(figures)
}

/// SPEC §11.1's shared rate: `n` jobs due at once to one nginx host with
/// `delivery.per_host_rate = rate`, delivered by two daemons (default config
/// otherwise) sharing the Redis. `achieved_per_s` is the mean of nginx's
/// 2xx per whole second, the first and last (partly used) seconds left out;
/// `max_second` the busiest of those seconds; `of_rate_pct` = achieved /
/// rate × 100 (held within 10%). The budget windows are seconds of Redis's
/// clock, which is nginx's (one machine).
pub async fn rate_two_daemons(
    redis: &RedisServer,
    nginx: &Nginx,
    n: usize,
    rate: f64,
) -> Res<Figures> {
    redis.flush().await?;
    nginx.reset().await?;
    let mut cfg = default_config(redis);
    cfg.delivery.per_host_rate = rate;
    let store = loaded_store(&cfg).await?;
    let due = store.redis_time_ms().await? + lead_ms(n);
    let url = nginx.url(0, "/rate");
    preload(
        &store,
        &cfg,
        (0..n)
            .map(|i| job(format!("rt-{i}"), url.clone(), due))
            .collect(),
    )
    .await?;
    let meter = Meter::start(redis, nginx).await?;
    let first = Daemon::start(cfg.clone()).await?;
    let second = Daemon::start(cfg).await?;
    let stats = nginx.wait_for(n as u64, Duration::from_secs(600)).await?;
    let mut figures = meter.figures(redis, nginx, stats, due, n).await?;
    first.stop().await?;
    second.stop().await?;
    let seconds = nginx.full_seconds()?;
    if seconds.is_empty() {
        return Err(format!("{n} jobs at {rate}/s took less than three seconds").into());
    }
    let achieved = seconds.iter().sum::<u64>() as f64 / seconds.len() as f64;
    figures.remove("first_late_ms");
    figures.remove("jobs_per_s");
    figures.insert("achieved_per_s", achieved);
    figures.insert(
        "max_second",
        seconds.iter().copied().max().unwrap_or(0) as f64,
    );
    figures.insert("of_rate_pct", achieved / rate * 100.0);
    Ok(figures)
}

/// SPEC §11.6's open-host bar: `n` jobs due at once to a host whose breaker
/// is open (opened before the run, `breaker.open_for = 10m` so that no probe
/// falls in the measurement), default config otherwise. hookq claims them
/// once and parks them; then, while the host stays open, Redis's CPU is
/// measured over `window` (`redis_cpu_pct_while_open`: CPU seconds / wall
/// seconds × 100; the bar: under 1). Then the host is resumed and the
/// backlog drains to nginx (`drain_jobs_per_s`: n / (last 2xx − resume)).
/// `park_script_calls_per_job`: script calls from the start to all parked.
pub async fn open_host_backlog(
    redis: &RedisServer,
    nginx: &Nginx,
    n: usize,
    window: Duration,
) -> Res<Figures> {
    redis.flush().await?;
    nginx.reset().await?;
    let mut cfg = default_config(redis);
    cfg.breaker.open_for = Duration::from_secs(600);
    let store = loaded_store(&cfg).await?;
    let url = nginx.url(0, "/open");
    let host = hookq::job::host_key(&url);
    open_breaker(&store, &cfg, &host).await?;
    let due = store.redis_time_ms().await? + lead_ms(n);
    preload(
        &store,
        &cfg,
        (0..n)
            .map(|i| job(format!("ob-{i}"), url.clone(), due))
            .collect(),
    )
    .await?;
    let scripts_before = redis.script_calls().await?;
    let daemon = Daemon::start(cfg).await?;
    wait_until_parked(&store, &host, n).await?;
    let park_scripts = redis.script_calls().await? - scripts_before;
    let cpu_pct_while_open = redis_cpu_pct_over(redis, window).await?;
    if nginx.read_log()?.count != 0 {
        return Err("a job of the open host was delivered".into());
    }
    let resumed = now_ms();
    store.host_resume(&host, "operator").await?;
    let stats = nginx.wait_for(n as u64, Duration::from_secs(600)).await?;
    daemon.stop().await?;
    Ok(HashMap::from([
        ("redis_cpu_pct_while_open", cpu_pct_while_open),
        ("park_script_calls_per_job", park_scripts as f64 / n as f64),
        (
            "drain_jobs_per_s",
            n as f64 / ((stats.last_ms - resumed).max(1) as f64 / 1000.0),
        ),
    ]))
}

/// Opens `host`'s breaker with one recorded failure (for `cfg`'s
/// `open_for`, up to its `max_open`); fails if it did not open.
async fn open_breaker(store: &Store, cfg: &Config, host: &str) -> Res<()> {
    let opened = store
        .host_failure(
            host,
            1,
            cfg.breaker.open_for,
            cfg.breaker.max_open,
            "bench",
            false,
        )
        .await?;
    if !opened.opened {
        return Err("the bench could not open the host".into());
    }
    Ok(())
}

/// Polls every 20 ms until `n` jobs of `host` are parked (within 600 s).
async fn wait_until_parked(store: &Store, host: &str, n: usize) -> Res<()> {
    let until = Instant::now() + Duration::from_secs(600);
    loop {
        let parked: u64 = store
            .parked_counts(host)
            .await?
            .iter()
            .map(|(_, c)| c)
            .sum();
        if parked as usize >= n {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(format!("{parked} of {n} jobs parked within 600 s").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Redis's CPU over `window` (sleeping meanwhile) as % of the wall time
/// that passed.
async fn redis_cpu_pct_over(redis: &RedisServer, window: Duration) -> Res<f64> {
    let cpu_before = redis.cpu_seconds().await?;
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let cpu = redis.cpu_seconds().await? - cpu_before;
    let wall = started.elapsed().as_secs_f64();
    Ok(cpu / wall * 100.0)
}

/// End-to-end delivery rate of `n` jobs due at the same moment, hookq on a
/// three-master Redis Cluster (same partitions, same daemon settings as
/// `delivery_rate`); Redis CPU is the sum over the masters.
pub async fn delivery_rate_cluster(
    cluster: &RedisCluster,
    nginx: &Nginx,
    n: usize,
) -> Res<Figures> {
    cluster.flush().await?;
    nginx.reset().await?;
    let cfg = cluster_config(cluster);
    let store = loaded_store(&cfg).await?;
    let due = store.redis_time_ms().await? + 3000 + (n as i64 / 50);
    let url = nginx.url(0, "/rate");
    preload(
        &store,
        &cfg,
        (0..n)
            .map(|i| job(format!("dc-{i}"), url.clone(), due))
            .collect(),
    )
    .await?;
    let scripts_before = cluster.script_calls().await?;
    let redis_cpu_before = cluster.cpu_seconds().await?;
    let own_cpu_before = own_cpu_seconds();
    let daemon = Daemon::start(cfg.clone()).await?;
    let stats = nginx.wait_for(n as u64, Duration::from_secs(600)).await?;
    let scripts = cluster.script_calls().await? - scripts_before;
    let redis_cpu = cluster.cpu_seconds().await? - redis_cpu_before;
    let own_cpu = own_cpu_seconds() - own_cpu_before;
    daemon.stop().await?;
    let span = (stats.last_ms - due).max(1) as f64 / 1000.0;
    Ok(HashMap::from([
        ("jobs_per_s", n as f64 / span),
        ("script_calls_per_job", scripts as f64 / n as f64),
        ("redis_cpu_us_per_job", redis_cpu * 1e6 / n as f64),
        ("hookq_cpu_us_per_job", own_cpu * 1e6 / n as f64),
    ]))
}

/// Delivery rate to one healthy nginx host (per-host limit 64, timeout 5s),
/// alone and next to a [`HangingHost`] with a tenth as many jobs due at the
/// same moment (SPEC §10's bar; `many_hosts_one_hanging` is §11.6's). 100,000
/// healthy jobs: a run of a second or less (20,000 jobs) measured mostly the
/// first half second, when the hanging host's jobs are still being sorted
/// out, and its figure moved between −9 % and +30 % from run to run.
/// `given_back`: jobs given back to a due set for a later turn of their host.
pub async fn hanging(redis: &RedisServer, nginx: &Nginx, n: usize) -> Res<Figures> {
    let mut rates = Vec::new();
    let mut given_back = 0.0;
    let cfg_partitions = config(redis).redis.partitions;
    for with_hang in [false, true] {
        redis.flush().await?;
        nginx.reset().await?;
        let mut cfg = config(redis);
        cfg.delivery.per_host_concurrency = 64;
        cfg.delivery.timeout = Duration::from_secs(5);
        let store = loaded_store(&cfg).await?;
        let hang = HangingHost::start().await;
        let due = store.redis_time_ms().await? + 3000 + (n as i64 / 50);
        let mut jobs: Vec<JobInput> = (0..n)
            .map(|i| job(format!("ok-{i}"), nginx.url(0, "/ok"), due))
            .collect();
        if with_hang {
            jobs.extend((0..n / 10).map(|i| job(format!("hang-{i}"), hang.url("/hang"), due)));
        }
        let total = jobs.len();
        preload(&store, &cfg, jobs).await?;
        let daemon = Daemon::start(cfg).await?;
        let stats = nginx.wait_for(n as u64, Duration::from_secs(600)).await?;
        let span = (stats.last_ms - due).max(1) as f64 / 1000.0;
        rates.push(n as f64 / span);
        if with_hang {
            // Less the preloaded jobs, which entered the due sets once each.
            given_back = (redis.due_sequence_total(cfg_partitions).await? - total as i64) as f64;
        }
        daemon.token().cancel();
        drop(hang);
        tokio::time::timeout(Duration::from_secs(30), daemon.wait())
            .await
            .map_err(|_| "hookq did not stop within 30 s")??;
    }
    Ok(HashMap::from([
        ("alone_jobs_per_s", rates[0]),
        ("with_hanging_jobs_per_s", rates[1]),
        // Percent the healthy host's rate drops next to the hanging one
        // (the bar: at most 10).
        ("drop_pct", (1.0 - rates[1] / rates[0]) * 100.0),
        // Jobs given back to the due set (for a later turn of their host)
        // until the healthy jobs were all delivered.
        ("given_back", given_back),
    ]))
}
