//! hookq's benchmark. It starts its own processes, all on free loopback ports
//! and all killed when it ends (Drop guards, even on error):
//! - a `redis-server` with stock settings (the test kit's; persistence off),
//!   except where a scenario says otherwise (`memory_1m_scheduled` sets the
//!   tuned `hash-max-listpack-value` it reports beside the stock figure);
//! - nginx answering `return 204` on 20 ports ([`Nginx`]): the reference
//!   receiver of SPEC §10/§11.6 for every delivery-rate scenario, counted
//!   through its access log;
//! - a Rust sink (this same binary re-executed with `--sink`, a separate
//!   process) for the lateness scenarios, which read each job's due time from
//!   the body it receives;
//! - with `--peers`, BullMQ (`benches/peers/`, Node) on the same Redis and the
//!   same nginx.
//!
//! hookq runs in-process (`Daemon::start`). Each scenario runs several times
//! (`--runs N`, default 3) and prints one JSON line of medians, then a
//! markdown table of every figure. `scripts/bench.sh` runs it in release mode;
//! `--quick` shrinks every scenario to a smoke test (used by the test suite;
//! no timing assertions, no Node); `--only A,B` runs the scenarios whose names
//! start with A or B (`NAME$`: exactly NAME); `--peers` adds
//! `peer_bullmq_one_host` (`--peer-concurrency N` sets BullMQ's worker
//! concurrency).
//!
//! `memory_steady_load` runs last, once, and **takes 10 minutes** in the full
//! run (2,000 jobs/s; `--quick`: 5 s at 200 jobs/s); `--steady-secs N`,
//! `--steady-rate N`, `--steady-retention N` and `--steady-sample N` change
//! its length, rate, `retention.finished` and sampling period.

mod backlog;
mod common;
mod delivery;
mod fleet;
mod ingest;
mod lateness;
mod memory;
mod naive;
mod nginx;
mod schedules;
mod sink;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hookq::config::SigningMode;
use hookq::daemon::Daemon;
use hookq::doctor::RECOMMENDED_LISTPACK_VALUE;
use serde_json::{json, Value};

use backlog::{console_paint, promotion};
use common::{cpu_seconds_of, default_config, median, start_redis, Meter};
use delivery::{
    delivery_rate, delivery_rate_cluster, delivery_rate_ordered, hanging, many_hosts, one_host,
    open_host_backlog, rate_two_daemons, sign,
};
use fleet::{fleet, round_trip_floor};
use ingest::{ingest_batch, ingest_single, ingest_single_wrk};
use lateness::{lateness, lateness_with};
use memory::{memory, memory_finished, memory_finished_retried, STOCK_LISTPACK_VALUE};
use nginx::{Nginx, NginxStats, NGINX_SERVERS};
use schedules::schedules_firing;
use sink::{run_sink, Sink};

/// The test kit: free ports, Redis servers and clusters, waits.
#[path = "../../tests/it/support/mod.rs"]
mod support;
use support::cluster::RedisCluster;
use support::free_port;
use support::process::OwnedProcess;
use support::redis::RedisServer;

/// mimalloc instead of the system allocator: the delivery hot path allocates
/// per request (hyper, reqwest, redis), and the profile showed glibc malloc's
/// bookkeeping (`_int_malloc`, `malloc_consolidate`, `unlink_chunk`) as the
/// largest user-space cost.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What a bench step returns: a value, or an error that ends the run.
type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

// ---------------------------------------------------------------- scenarios

/// One scenario's figures from one run.
type Figures = HashMap<&'static str, f64>;

// ---------------------------------------------------------------- steady load

/// The settings of `memory_steady_load` (defaults by run size, each one
/// overridable: `--steady-secs`, `--steady-rate`, `--steady-retention`,
/// `--steady-sample`, all in whole seconds or jobs per second).
#[derive(Clone, Copy, Debug)]
struct SteadyLoad {
    /// Jobs created per second, in a batch every [`STEADY_TICK`].
    rate: usize,
    /// How long the load runs.
    duration: Duration,
    /// The daemon's `retention.finished`.
    retention: Duration,
    /// How often Redis's memory is sampled.
    sample_every: Duration,
    /// Jobs are due now or up to this much later (a quarter each at 0, ⅓,
    /// ⅔ and all of it).
    max_delay: Duration,
}

/// How often the steady load generator sends a batch.
const STEADY_TICK: Duration = Duration::from_millis(50);

/// The size of each steady-load job's JSON body, in bytes.
const STEADY_BODY_BYTES: usize = 200;

impl SteadyLoad {
    /// Full run: 2,000 jobs/s for 10 minutes, retention 60 s, a sample every
    /// 10 s, due within 3 s. Quick: 200 jobs/s for 5 s, retention 2 s, a
    /// sample every second, due within 600 ms.
    fn defaults(quick: bool) -> SteadyLoad {
        let secs = Duration::from_secs;
        if quick {
            SteadyLoad {
                rate: 200,
                duration: secs(5),
                retention: secs(2),
                sample_every: secs(1),
                max_delay: Duration::from_millis(600),
            }
        } else {
            SteadyLoad {
                rate: 2000,
                duration: secs(600),
                retention: secs(60),
                sample_every: secs(10),
                max_delay: secs(3),
            }
        }
    }
}

/// The body of steady-load job `n`: exactly [`STEADY_BODY_BYTES`] of JSON
/// (an event name, the job's number as a fixed-width string, padding).
fn steady_body(n: u64) -> String {
    let head = format!("{{\"event\":\"order.paid\",\"order\":\"{n:012}\",\"pad\":\"");
    let pad = STEADY_BODY_BYTES.saturating_sub(head.len() + 2);
    format!("{head}{}\"}}", "x".repeat(pad))
}

/// One sample of `memory_steady_load`.
struct SteadySample {
    /// Seconds since the load started.
    at: f64,
    /// `INFO memory` `used_memory`.
    used_memory: i64,
    /// Jobs the generator had created so far (answered 201).
    created: u64,
    /// `GET /v1/stats` `delivered`.
    delivered: u64,
    /// `GET /v1/stats` scheduled + ready + inflight: the live backlog.
    live: u64,
    /// `DBSIZE`: keys in Redis (finished records and histories included
    /// until they expire, and until Redis reclaims them).
    keys: i64,
    /// `INFO stats` `expired_stale_perc`: Redis's running estimate of the
    /// share of keys with a TTL that have expired but are not reclaimed yet,
    /// in %. Redis reclaims expired keys in a background sweep, so `keys`
    /// and `used_memory` hold more than retention alone implies.
    expired_stale_pct: f64,
}

/// One [`SteadySample`], `created` being the generator's count so far.
async fn steady_sample(
    redis: &RedisServer,
    mut conn: ::redis::aio::MultiplexedConnection,
    client: &reqwest::Client,
    stats_url: &reqwest::Url,
    start: tokio::time::Instant,
    created: u64,
) -> Res<SteadySample> {
    let at = (start.elapsed().as_secs_f64() * 10.0).round() / 10.0;
    let used_memory = redis.used_memory().await?;
    let stats: Value = client.get(stats_url.clone()).send().await?.json().await?;
    let count = |k: &str| stats[k].as_u64().unwrap_or(0);
    let keys: i64 = ::redis::cmd("DBSIZE").query_async(&mut conn).await?;
    let info: String = ::redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await?;
    let expired_stale_pct = info
        .lines()
        .find_map(|l| l.strip_prefix("expired_stale_perc:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    Ok(SteadySample {
        at,
        used_memory,
        created,
        delivered: count("delivered"),
        live: count("scheduled") + count("ready") + count("inflight"),
        keys,
        expired_stale_pct,
    })
}

/// `memory_steady_load`: Redis memory under steady load (the issue "at
/// 2,000 jobs/s for 10 minutes, Redis memory levels off at what retention
/// implies"). **The full run takes 10 minutes** (plus up to a minute to
/// drain), and runs once whatever `--runs` says; `--quick` runs 5 s at
/// 200 jobs/s; `--steady-secs N` and the other `--steady-*` flags change it
/// (see [`SteadyLoad`]).
///
/// The bench's stock Redis and nginx (`return 204`, first host), hookq
/// in-process with its default config except `retention.finished` (60 s in
/// the full run, 2 s in `--quick`, short so that the plateau shows within
/// the run). A generator creates jobs through `POST /v1/jobs/batch`, paced:
/// every 50 ms a batch of rate / 20 jobs, each with a 26-character id, a
/// 200-byte JSON body, due now or within a few seconds. Every
/// `sample_every` (and at the start and end) it samples `used_memory`, the
/// jobs created and delivered (`GET /v1/stats`), the live backlog and
/// `DBSIZE`. After the load it waits until nginx has answered every created
/// job.
///
/// Figures: `rate_per_s` (achieved: created / load seconds), `duration_s`,
/// `retention_s`, `plateau_bytes` (median `used_memory` over the last third
/// of the load), `peak_bytes`, `growth_last_third_pct` (`used_memory` at the
/// end of the load against the first sample of the last third, in %; two
/// samples, so Redis's expiry sawtooth moves it by several %),
/// `trend_last_third_pct` (the same change read off a least-squares line
/// through every sample of the last third, in % of the plateau),
/// `baseline_bytes` (before the load), `retained_jobs_implied` (rate ×
/// retention: the finished jobs retention keeps), `plateau_bytes_per_retained_job`
/// ((plateau − baseline) / (rate × retention): what a finished job costs
/// while it is kept, plus the small live backlog and the partitions' own
/// structures, which the first jobs create: about 1 MB, most of the figure
/// at `--quick` sizes, under 10 B per job in the full run), `plateau_keys`,
/// `redis_cpu_us_per_job` and `script_calls_per_job` (Redis's CPU and
/// script calls from the load's start until every job was delivered, per
/// delivered job: creating, delivering and expiring it), `refused_jobs`
/// (batch items that did not answer 201). Beside the medians, the JSON line
/// carries `retention` (humantime), `samples` ([seconds, used_memory]) and
/// `counts` (the columns `counts_columns` names: seconds, created,
/// delivered, live, keys, expired_stale_pct; see [`SteadySample`]).
async fn memory_steady_load(
    redis: &RedisServer,
    nginx: &Nginx,
    load: SteadyLoad,
) -> Res<(Figures, serde_json::Map<String, Value>)> {
    redis.flush().await?;
    nginx.reset().await?;
    let mut cfg = default_config(redis);
    cfg.retention.finished = load.retention;
    let daemon = Daemon::start(cfg).await?;
    let client = reqwest::Client::new();
    let plan = SteadyPlan::new(&load, &daemon.url(), nginx.url(0, "/steady"))?;
    let stats_url: reqwest::Url = format!("{}/v1/stats", daemon.url()).parse()?;
    let counts = SteadyCounts::default();

    let baseline = redis.used_memory().await?;
    let scripts_before = redis.script_calls().await?;
    let cpu_before = redis.cpu_seconds().await?;
    let start = tokio::time::Instant::now();
    let end = start + load.duration;
    let sampling = SteadySampling {
        redis,
        conn: redis.conn().await,
        client: &client,
        stats_url: &stats_url,
        counts: &counts,
        start,
    };
    let (generated, samples) = tokio::join!(
        steady_generate(&client, &plan, &counts, start, end),
        sampling.every(load.sample_every, end),
    );
    generated?;
    let samples = samples?;
    let load_secs = start.elapsed().as_secs_f64();
    let created = counts.created.load(Ordering::Relaxed);

    nginx
        .wait_for(created, Duration::from_secs(60) + load.max_delay)
        .await?;
    // Redis's costs before the stats request, which has its own.
    let redis_cpu = redis.cpu_seconds().await? - cpu_before;
    let scripts = redis.script_calls().await? - scripts_before;
    let stats: Value = client.get(stats_url).send().await?.json().await?;
    let totals = SteadyTotals {
        load_secs,
        created,
        refused: counts.refused.load(Ordering::Relaxed),
        baseline,
        redis_cpu,
        scripts,
        delivered: stats["delivered"].as_u64().unwrap_or(0).max(1) as f64,
    };
    daemon.stop().await?;
    Ok((
        steady_figures(&load, &totals, &samples),
        steady_extra(load.retention, &samples),
    ))
}

/// What a steady load counted, besides its samples.
struct SteadyTotals {
    /// Seconds from the load's start to its end.
    load_secs: f64,
    /// Jobs answered 201.
    created: u64,
    /// Batch items answered anything else.
    refused: u64,
    /// `used_memory` before the load.
    baseline: i64,
    /// Redis's CPU seconds from the load's start until every job was
    /// delivered.
    redis_cpu: f64,
    /// Script calls over the same span.
    scripts: i64,
    /// Jobs delivered (`GET /v1/stats`), at least 1.
    delivered: f64,
}

/// The figures of `memory_steady_load` (see there) from its `totals` and
/// `samples`.
fn steady_figures(load: &SteadyLoad, totals: &SteadyTotals, samples: &[SteadySample]) -> Figures {
    let third = LastThird::of(samples, load.duration);
    let peak = samples.iter().map(|s| s.used_memory).max().unwrap_or(0);
    let baseline = totals.baseline as f64;
    let rate = totals.created as f64 / totals.load_secs;
    let retention_s = load.retention.as_secs_f64();
    HashMap::from([
        ("rate_per_s", rate),
        ("duration_s", totals.load_secs),
        ("retention_s", retention_s),
        ("baseline_bytes", baseline),
        ("plateau_bytes", third.plateau),
        ("peak_bytes", peak as f64),
        ("growth_last_third_pct", third.growth_pct),
        ("trend_last_third_pct", third.trend_pct),
        ("retained_jobs_implied", rate * retention_s),
        (
            "plateau_bytes_per_retained_job",
            (third.plateau - baseline) / (rate * retention_s).max(1.0),
        ),
        ("plateau_keys", third.plateau_keys),
        (
            "redis_cpu_us_per_job",
            totals.redis_cpu * 1e6 / totals.delivered,
        ),
        (
            "script_calls_per_job",
            totals.scripts as f64 / totals.delivered,
        ),
        ("refused_jobs", totals.refused as f64),
    ])
}

/// The steady generator's plan: where its batches go and what they hold.
struct SteadyPlan {
    /// `POST /v1/jobs/batch` of the daemon.
    batch_url: reqwest::Url,
    /// The jobs' target (nginx's first host).
    target: String,
    /// Jobs per batch: rate × [`STEADY_TICK`], at least 1.
    per_batch: u64,
    /// Batches over the load's duration.
    batches: u64,
    /// The jobs' delays in ms, by job number mod 4: 0, ⅓, ⅔ and all of
    /// `max_delay`.
    delays_ms: Vec<u64>,
}

impl SteadyPlan {
    /// The plan of `load` against the daemon at `api`, jobs to `target`.
    fn new(load: &SteadyLoad, api: &str, target: String) -> Res<SteadyPlan> {
        Ok(SteadyPlan {
            batch_url: format!("{api}/v1/jobs/batch").parse()?,
            target,
            per_batch: (load.rate as f64 * STEADY_TICK.as_secs_f64())
                .round()
                .max(1.0) as u64,
            batches: (load.duration.as_millis() / STEADY_TICK.as_millis()).max(1) as u64,
            delays_ms: (0..4)
                .map(|q| load.max_delay.as_millis() as u64 * q / 3)
                .collect(),
        })
    }

    /// The JSON body of batch `b`: jobs `b × per_batch` on, each with a
    /// 26-character id and a [`steady_body`].
    fn batch_body(&self, b: u64) -> String {
        let jobs: Vec<String> = (0..self.per_batch)
            .map(|i| {
                let n = b * self.per_batch + i;
                format!(
                    "{{\"id\":\"steady{n:020}\",\"url\":\"{}\",\"delay\":\"{}ms\",\"body\":{}}}",
                    self.target,
                    self.delays_ms[(n % 4) as usize],
                    steady_body(n)
                )
            })
            .collect();
        format!("{{\"jobs\":[{}]}}", jobs.join(","))
    }
}

/// What the steady generator has counted so far (the sampler reads it).
#[derive(Default)]
struct SteadyCounts {
    /// Jobs answered 201.
    created: AtomicU64,
    /// Batch items answered anything else.
    refused: AtomicU64,
}

/// The generator: a batch every tick from `start`; a late tick is caught up
/// at once (Burst), so the rate holds as long as hookq keeps up. Returns at
/// `end`.
async fn steady_generate(
    client: &reqwest::Client,
    plan: &SteadyPlan,
    counts: &SteadyCounts,
    start: tokio::time::Instant,
    end: tokio::time::Instant,
) -> Res<()> {
    let mut tick = tokio::time::interval_at(start, STEADY_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for b in 0..plan.batches {
        tick.tick().await;
        let r = client
            .post(plan.batch_url.clone())
            .header("content-type", "application/json")
            .body(plan.batch_body(b))
            .send()
            .await?;
        if r.status() != 200 {
            let status = r.status();
            let text = r.text().await.unwrap_or_default();
            return Err(format!("{} answered {status}: {text}", plan.batch_url).into());
        }
        let answer: Value = r.json().await?;
        let ok = answer["results"]
            .as_array()
            .map(|a| a.iter().filter(|r| r["status"] == 201).count() as u64)
            .unwrap_or(0);
        counts.created.fetch_add(ok, Ordering::Relaxed);
        counts
            .refused
            .fetch_add(plan.per_batch - ok, Ordering::Relaxed);
    }
    tokio::time::sleep_until(end).await;
    Ok(())
}

/// What the steady sampler reads from.
struct SteadySampling<'a> {
    redis: &'a RedisServer,
    /// For `DBSIZE` and `INFO stats`.
    conn: ::redis::aio::MultiplexedConnection,
    client: &'a reqwest::Client,
    /// `GET /v1/stats` of the daemon.
    stats_url: &'a reqwest::Url,
    counts: &'a SteadyCounts,
    /// When the load started.
    start: tokio::time::Instant,
}

impl SteadySampling<'_> {
    /// A sample at the start, every `every`, and at `end`.
    async fn every(&self, every: Duration, end: tokio::time::Instant) -> Res<Vec<SteadySample>> {
        let mut samples = Vec::new();
        let mut k = 0u32;
        loop {
            let at = (self.start + every * k).min(end);
            tokio::time::sleep_until(at).await;
            let created = self.counts.created.load(Ordering::Relaxed);
            samples.push(
                steady_sample(
                    self.redis,
                    self.conn.clone(),
                    self.client,
                    self.stats_url,
                    self.start,
                    created,
                )
                .await?,
            );
            if at >= end {
                return Ok(samples);
            }
            k += 1;
        }
    }
}

/// The last third of a steady load (its samples from ⅔ of `duration` on).
struct LastThird {
    /// Median `used_memory`.
    plateau: f64,
    /// Median `DBSIZE`.
    plateau_keys: f64,
    /// `used_memory` of its last sample against its first, in %.
    growth_pct: f64,
    /// The same change read off a least-squares line through its samples,
    /// in % of the plateau.
    trend_pct: f64,
}

impl LastThird {
    /// The last third of `samples`, of a load that ran for `duration`.
    fn of(samples: &[SteadySample], duration: Duration) -> LastThird {
        let from = duration.as_secs_f64() * 2.0 / 3.0;
        let last_third: Vec<&SteadySample> = samples.iter().filter(|s| s.at >= from).collect();
        let plateau = median(last_third.iter().map(|s| s.used_memory as f64).collect());
        let growth_pct = match (last_third.first(), last_third.last()) {
            (Some(a), Some(b)) if a.used_memory > 0 => {
                (b.used_memory - a.used_memory) as f64 / a.used_memory as f64 * 100.0
            }
            _ => 0.0,
        };
        LastThird {
            plateau,
            plateau_keys: median(last_third.iter().map(|s| s.keys as f64).collect()),
            growth_pct,
            trend_pct: trend_pct(&last_third, plateau),
        }
    }
}

/// The change of `used_memory` over `samples` read off their least-squares
/// line, in % of `plateau`; 0 for fewer than two distinct times or no
/// plateau.
fn trend_pct(samples: &[&SteadySample], plateau: f64) -> f64 {
    let n = samples.len() as f64;
    let mean_x = samples.iter().map(|s| s.at).sum::<f64>() / n.max(1.0);
    let mean_y = samples.iter().map(|s| s.used_memory as f64).sum::<f64>() / n.max(1.0);
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for s in samples {
        sxy += (s.at - mean_x) * (s.used_memory as f64 - mean_y);
        sxx += (s.at - mean_x).powi(2);
    }
    let span = match (samples.first(), samples.last()) {
        (Some(a), Some(b)) => b.at - a.at,
        _ => 0.0,
    };
    if sxx > 0.0 && plateau > 0.0 {
        sxy / sxx * span / plateau * 100.0
    } else {
        0.0
    }
}

/// The fields `memory_steady_load` prints beside its medians: `retention`,
/// `samples` ([seconds, used_memory]), `counts` and `counts_columns`.
fn steady_extra(retention: Duration, samples: &[SteadySample]) -> serde_json::Map<String, Value> {
    let mut extra = serde_json::Map::new();
    extra.insert(
        "retention".into(),
        json!(humantime::format_duration(retention).to_string()),
    );
    extra.insert(
        "samples".into(),
        json!(samples
            .iter()
            .map(|s| json!([s.at, s.used_memory]))
            .collect::<Vec<_>>()),
    );
    extra.insert(
        "counts".into(),
        json!(samples
            .iter()
            .map(|s| {
                json!([
                    s.at,
                    s.created,
                    s.delivered,
                    s.live,
                    s.keys,
                    s.expired_stale_pct
                ])
            })
            .collect::<Vec<_>>()),
    );
    extra.insert(
        "counts_columns".into(),
        json!([
            "seconds",
            "created",
            "delivered",
            "live",
            "keys",
            "expired_stale_pct"
        ]),
    );
    extra
}

// ---------------------------------------------------------------- peers

/// BullMQ's worker concurrency in `peer_bullmq_one_host` unless
/// `--peer-concurrency N` says otherwise: the best of those tried on the
/// 2-core machine with nothing else running (100,000 jobs, medians of 3):
/// 32 → 12.2k jobs/s, 64 → 12.5k, 256 → 10.6k, 512 → 8.6k (more
/// concurrency costs node more CPU per job, and the first job starts later).
/// 64 is also hookq's default per-host limit.
const BULLMQ_CONCURRENCY: usize = 64;

/// `benches/peers/`, the Node project of the peers.
fn peers_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers")
}

/// Checks that node runs and installs the peers' pinned packages (the
/// versions of `package-lock.json`) unless `node_modules` is there.
/// `npm install --no-save` rather than `npm ci`: the lock omits the
/// optional native helpers of other platforms that the registry lacks
/// (msgpackr-extract's darwin and win32 builds), and `npm ci` refuses such a
/// lock while `npm install` installs it as it is, without rewriting it.
/// `--ignore-scripts`: the one install script (msgpackr-extract's) is
/// optional; msgpackr works without it.
fn ensure_peers_installed() -> Res<std::path::PathBuf> {
    let dir = peers_dir();
    let node = Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        return Err(
            "node is missing: --peers needs Node.js and npm (apt-get install nodejs npm)".into(),
        );
    }
    if !dir.join("node_modules").is_dir() {
        eprintln!("bench: npm install in {}", dir.display());
        let out = Command::new("npm")
            .args([
                "install",
                "--no-save",
                "--ignore-scripts",
                "--no-audit",
                "--no-fund",
            ])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("npm (apt-get install npm): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "npm install in {} failed:\n{}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
    }
    Ok(dir)
}

/// The first JSON line of `path` whose `event` is `event`.
fn read_event(path: &std::path::Path, event: &str) -> Option<Value> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == event)
}

/// `peer_bullmq_one_host`: BullMQ (`benches/peers/bullmq.js`) on the same
/// Redis and the same nginx host as `one_host_default`: it adds `n` delayed
/// jobs due at one moment (`addBulk` with `delay`), and one Worker with
/// `concurrency` POSTs each job's data to nginx. Measured like hookq, from
/// nginx's log: `jobs_per_s` = n / (last 2xx − due), `first_late_ms`, and
/// per job: script calls and Redis CPU (from the worker's start, after the
/// jobs are added), node's CPU (`peer_cpu_us_per_job`, /proc/<pid>/stat
/// utime + stime over the same span), nginx's CPU.
async fn peer_bullmq(
    redis: &RedisServer,
    nginx: &Nginx,
    n: usize,
    concurrency: usize,
) -> Res<Figures> {
    let dir = ensure_peers_installed()?;
    redis.flush().await?;
    nginx.reset().await?;
    let out_dir = tempfile::tempdir()?;
    let events = out_dir.path().join("events.jsonl");
    let mut node = spawn_bullmq(&dir, &events, redis, nginx, n, concurrency)?;
    let pid = node.pid().to_string();
    let ready = wait_for_event(&mut node, &events, "ready", "get ready", 120).await?;
    let due = ready["due"]
        .as_i64()
        .ok_or("bullmq.js's ready event has no due")?;
    let meter = Meter::start(redis, nginx).await?;
    let node_cpu_before = cpu_seconds_of(&pid);
    let stats = wait_for_bullmq_answers(&mut node, nginx, n).await?;
    let node_cpu = cpu_seconds_of(&pid) - node_cpu_before;
    let mut figures = meter.figures(redis, nginx, stats, due, n).await?;
    figures.remove("hookq_cpu_us_per_job");
    figures.insert("peer_cpu_us_per_job", node_cpu * 1e6 / n as f64);
    figures.insert("worker_concurrency", concurrency as f64);
    // Its own count must agree; then it is asked to close (SIGTERM) and,
    // whatever happens, killed with its group when `node` drops.
    let done = wait_for_event(&mut node, &events, "done", "report done", 10).await?;
    if done["count"].as_u64() != Some(n as u64) {
        return Err(format!("bullmq.js reported {done}, expected count {n}").into());
    }
    let _ = Command::new("kill").arg("-TERM").arg(&pid).status();
    let until = Instant::now() + Duration::from_secs(5);
    while node.try_wait().is_none() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(figures)
}

/// Starts `node bullmq.js` in `dir` (its JSON event lines into `events`):
/// `n` jobs for nginx's first host, a worker with `concurrency`.
fn spawn_bullmq(
    dir: &std::path::Path,
    events: &std::path::Path,
    redis: &RedisServer,
    nginx: &Nginx,
    n: usize,
    concurrency: usize,
) -> Res<OwnedProcess> {
    // addBulk stores ~15k jobs/s here: the lead leaves room for twice that.
    let lead = 3000 + n / 8;
    let mut command = Command::new("node");
    command
        .current_dir(dir)
        .arg("bullmq.js")
        .arg(redis.url())
        .arg(nginx.url(0, "/bullmq"))
        .arg(n.to_string())
        .arg(concurrency.to_string())
        .arg(lead.to_string())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(events)?);
    Ok(OwnedProcess::spawn(command, "node bullmq.js"))
}

/// Waits up to `seconds` for bullmq.js to write its `event` line to
/// `events` and returns it; if node exits first or the time runs out, fails
/// with "bullmq.js did not {`failure`}" and its log.
async fn wait_for_event(
    node: &mut OwnedProcess,
    events: &std::path::Path,
    event: &str,
    failure: &str,
    seconds: u64,
) -> Res<Value> {
    let until = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(found) = read_event(events, event) {
            return Ok(found);
        }
        if node.try_wait().is_some() || Instant::now() > until {
            return Err(format!("bullmq.js did not {failure}; its log:\n{}", node.log()).into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls nginx's log until it has answered `n` BullMQ jobs (within 600 s);
/// fails with bullmq.js's log if node exits first or the time runs out.
async fn wait_for_bullmq_answers(
    node: &mut OwnedProcess,
    nginx: &Nginx,
    n: usize,
) -> Res<NginxStats> {
    let until = Instant::now() + Duration::from_secs(600);
    loop {
        let stats = nginx.read_log()?;
        if stats.count >= n as u64 {
            return Ok(stats);
        }
        if node.try_wait().is_some() || Instant::now() > until {
            return Err(format!(
                "nginx answered {} of {n} BullMQ jobs; bullmq.js's log:\n{}",
                stats.count,
                node.log()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------- main

/// A scenario's figures over its runs.
struct Scenario {
    name: String,
    runs: Vec<Figures>,
    /// Fields printed beside `median` in the JSON line (a series, a setting
    /// that is not a number); empty for most scenarios.
    extra: serde_json::Map<String, Value>,
}

impl Scenario {
    /// Every figure's median over the runs, by name.
    fn medians(&self) -> Vec<(&'static str, f64)> {
        let mut keys: Vec<&'static str> = self
            .runs
            .first()
            .map(|r| r.keys().copied().collect())
            .unwrap_or_default();
        keys.sort_unstable();
        keys.into_iter()
            .map(|k| {
                (
                    k,
                    median(self.runs.iter().filter_map(|r| r.get(k).copied()).collect()),
                )
            })
            .collect()
    }

    /// The scenario `name` of `runs`, its JSON line printed ([`report`]).
    ///
    /// [`report`]: Scenario::report
    fn report_of(
        name: &str,
        runs: Vec<Figures>,
        extra: serde_json::Map<String, Value>,
    ) -> Scenario {
        Scenario {
            name: name.to_string(),
            runs,
            extra,
        }
        .report()
    }

    /// Prints the scenario's JSON line: `{"scenario", "runs", "median"}`
    /// and its `extra` fields.
    fn report(self) -> Scenario {
        let line: serde_json::Map<String, Value> = self
            .medians()
            .into_iter()
            .map(|(k, v)| (k.to_string(), json!((v * 10.0).round() / 10.0)))
            .collect();
        let mut out = json!({"scenario": self.name, "runs": self.runs.len(), "median": line});
        if let Some(out) = out.as_object_mut() {
            out.extend(self.extra.clone());
        }
        println!("{out}");
        self
    }
}

/// The command line of a bench run.
struct Options {
    /// `--quick`: every scenario at smoke-test size.
    quick: bool,
    /// `--runs N`: runs per scenario (default 3; 1 with `--quick`).
    runs: usize,
    /// `--only A,B`: name prefixes (`NAME$`: an exact name); empty = all.
    only: Vec<String>,
    /// `--peers`: also run `peer_bullmq_one_host` (needs Node).
    peers: bool,
    /// `--peer-concurrency N`: BullMQ's worker concurrency.
    peer_concurrency: usize,
    /// `memory_steady_load`'s settings: [`SteadyLoad::defaults`], changed by
    /// `--steady-secs N`, `--steady-rate N` (jobs/s), `--steady-retention N`
    /// and `--steady-sample N` (seconds).
    steady: SteadyLoad,
}

impl Options {
    fn parse(args: &[String]) -> Options {
        let value = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
        };
        let quick = args.iter().any(|a| a == "--quick");
        let number = |flag: &str| value(flag).and_then(|v| v.parse::<u64>().ok());
        let mut steady = SteadyLoad::defaults(quick);
        if let Some(secs) = number("--steady-secs") {
            steady.duration = Duration::from_secs(secs.max(1));
        }
        if let Some(rate) = number("--steady-rate") {
            steady.rate = rate.max(1) as usize;
        }
        if let Some(secs) = number("--steady-retention") {
            // hookq refuses a retention under a second.
            steady.retention = Duration::from_secs(secs.max(1));
        }
        if let Some(secs) = number("--steady-sample") {
            steady.sample_every = Duration::from_secs(secs.max(1));
        }
        Options {
            quick,
            runs: value("--runs")
                .and_then(|r| r.parse().ok())
                .unwrap_or(if quick { 1 } else { 3 }),
            only: value("--only")
                .map(|o| o.split(',').map(str::to_string).collect())
                .unwrap_or_default(),
            peers: args.iter().any(|a| a == "--peers"),
            peer_concurrency: value("--peer-concurrency")
                .and_then(|c| c.parse().ok())
                .unwrap_or(BULLMQ_CONCURRENCY),
            steady,
        }
    }

    /// Whether `--only` asks for the scenario `name`.
    fn wanted(&self, name: &str) -> bool {
        self.only.is_empty()
            || self.only.iter().any(|o| match o.strip_suffix('$') {
                Some(exact) => name == exact,
                None => name.starts_with(o.as_str()),
            })
    }
}

/// What every scenario shares: the command line, the bench's Redis, nginx
/// and sink.
struct Rig<'a> {
    opts: &'a Options,
    redis: &'a RedisServer,
    nginx: &'a Nginx,
    sink: &'a Sink,
}

impl Rig<'_> {
    /// `full` in a full run, `small` with `--quick`.
    fn size(&self, full: usize, small: usize) -> usize {
        if self.opts.quick {
            small
        } else {
            full
        }
    }

    /// Runs scenario `name` `runs` times, if `--only` wants it, and prints
    /// and keeps its report in `out`.
    async fn run<Fut>(
        &self,
        out: &mut Vec<Scenario>,
        name: &str,
        runs: usize,
        mut body: impl FnMut() -> Fut,
    ) -> Res<()>
    where
        Fut: std::future::Future<Output = Res<Figures>>,
    {
        if self.opts.wanted(name) {
            let mut figures = Vec::new();
            for _ in 0..runs {
                figures.push(body().await?);
            }
            out.push(Scenario::report_of(name, figures, serde_json::Map::new()));
        }
        Ok(())
    }
}

/// Runs every scenario `opts` asks for, in the order the report lists them,
/// on one Redis, one nginx and one sink.
async fn bench(opts: &Options) -> Res<Vec<Scenario>> {
    let redis = start_redis();
    let nginx = Nginx::start(NGINX_SERVERS).await?;
    let sink = Sink::start().await?;
    let rig = Rig {
        opts,
        redis: &redis,
        nginx: &nginx,
        sink: &sink,
    };
    let mut out = Vec::new();
    ingest_scenarios(&rig, &mut out).await?;
    delivery_scenarios(&rig, &mut out).await?;
    one_host_scenarios(&rig, &mut out).await?;
    fleet_scenarios(&rig, &mut out).await?;
    lateness_scenarios(&rig, &mut out).await?;
    memory_scenarios(&rig, &mut out).await?;
    backlog_scenarios(&rig, &mut out).await?;
    // Last, and once whatever --runs says: 10 minutes in the full run.
    if opts.wanted("memory_steady_load") {
        let (figures, extra) = memory_steady_load(&redis, &nginx, opts.steady).await?;
        out.push(Scenario::report_of(
            "memory_steady_load",
            vec![figures],
            extra,
        ));
    }
    Ok(out)
}

/// Job creation through the API: batches and single requests, with and
/// without a replica acknowledging each write, and single creates from wrk.
async fn ingest_scenarios(rig: &Rig<'_>, out: &mut Vec<Scenario>) -> Res<()> {
    let (redis, runs) = (rig.redis, rig.opts.runs);
    let batch = rig.size(100_000, 2_000);
    let single = rig.size(20_000, 500);
    for (name, acked) in [
        ("ingest_batch", false),
        ("ingest_batch_acked_1_replica", true),
    ] {
        rig.run(out, name, runs, move || ingest_batch(redis, batch, acked))
            .await?;
    }
    for (name, acked) in [
        ("ingest_single", false),
        ("ingest_single_acked_1_replica", true),
    ] {
        rig.run(out, name, runs, move || ingest_single(redis, single, acked))
            .await?;
    }
    let seconds = rig.size(5, 1) as u64;
    rig.run(out, "ingest_single_wrk", runs, move || {
        ingest_single_wrk(redis, seconds)
    })
    .await
}

/// Delivery rates to one nginx host: plain, ordered, signed, traced (with a
/// collector up and down), by the naive design and on a cluster; and
/// schedules firing.
async fn delivery_scenarios(rig: &Rig<'_>, out: &mut Vec<Scenario>) -> Res<()> {
    let (redis, nginx, runs) = (rig.redis, rig.nginx, rig.opts.runs);
    let n = rig.size(100_000, 2_000);
    rig.run(out, "delivery_rate", runs, move || {
        delivery_rate(redis, nginx, n, false, |_| {})
    })
    .await?;
    let keys = rig.size(10_000, 200);
    rig.run(out, "delivery_rate_ordered", runs, move || {
        delivery_rate_ordered(redis, nginx, n, keys)
    })
    .await?;
    let (schedules, every_ms) = (rig.size(100_000, 200), rig.size(60_000, 1000) as i64);
    rig.run(out, "schedules_100k_every_minute", runs, move || {
        schedules_firing(redis, nginx, schedules, every_ms, 2)
    })
    .await?;
    for (name, mode) in [
        ("delivery_rate_signed_shared", SigningMode::Shared),
        ("delivery_rate_signed_per_origin", SigningMode::PerOrigin),
    ] {
        rig.run(out, name, runs, move || {
            delivery_rate(redis, nginx, n, false, move |c| sign(c, mode))
        })
        .await?;
    }
    let collector = &nginx.url(1, "");
    rig.run(out, "delivery_rate_traced", runs, move || {
        delivery_rate(redis, nginx, n, false, move |c| {
            c.telemetry.otlp_endpoint = collector.clone()
        })
    })
    .await?;
    rig.run(out, "delivery_rate_collector_down", runs, move || {
        delivery_rate(redis, nginx, n, false, |c| {
            c.telemetry.otlp_endpoint = format!("http://127.0.0.1:{}", free_port())
        })
    })
    .await?;
    rig.run(out, "delivery_rate_naive", runs, move || {
        delivery_rate(redis, nginx, n, true, |_| {})
    })
    .await?;
    if rig.opts.wanted("delivery_rate_cluster_3_masters") {
        let cluster = &RedisCluster::start_with(0);
        rig.run(out, "delivery_rate_cluster_3_masters", runs, move || {
            delivery_rate_cluster(cluster, nginx, n)
        })
        .await?;
    }
    Ok(())
}

/// One host at SPEC §11.6's bars: the default and lifted per-host limits
/// (measured together), BullMQ with `--peers`, and many healthy hosts beside
/// a hanging one.
async fn one_host_scenarios(rig: &Rig<'_>, out: &mut Vec<Scenario>) -> Res<()> {
    let (redis, nginx, runs) = (rig.redis, rig.nginx, rig.opts.runs);
    let n = rig.size(100_000, 2_000);
    // One run measures both (the ratio is of rates from the same run).
    if rig.opts.wanted("one_host_default") || rig.opts.wanted("one_host_lifted") {
        let (mut default, mut lifted) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let (d, l) = one_host(redis, nginx, n).await?;
            default.push(d);
            lifted.push(l);
        }
        for (name, runs) in [("one_host_default", default), ("one_host_lifted", lifted)] {
            out.push(Scenario::report_of(name, runs, serde_json::Map::new()));
        }
    }
    if rig.opts.peers {
        let concurrency = rig.opts.peer_concurrency;
        rig.run(out, "peer_bullmq_one_host", runs, move || {
            peer_bullmq(redis, nginx, n, concurrency)
        })
        .await?;
    }
    let hanging = rig.size(10_000, 200);
    rig.run(out, "many_hosts_one_hanging", runs, move || {
        many_hosts(redis, nginx, n, hanging)
    })
    .await
}

/// SPEC §13's fleets and their round-trip floor, then the shared per-host
/// rate of two daemons and an open host's backlog.
async fn fleet_scenarios(rig: &Rig<'_>, out: &mut Vec<Scenario>) -> Res<()> {
    let (redis, nginx, runs) = (rig.redis, rig.nginx, rig.opts.runs);
    let n = rig.size(2_000, 200);
    let idle = Duration::from_secs(rig.size(5, 1) as u64);
    for daemons in [1, 5, 20] {
        rig.run(out, &format!("fleet_{daemons}_daemons"), runs, move || {
            fleet(redis, nginx, daemons, n, idle)
        })
        .await?;
    }
    rig.run(out, "fleet_round_trip_floor", runs, move || {
        round_trip_floor(redis, n)
    })
    .await?;
    let idle = Duration::from_secs(rig.size(10, 1) as u64);
    rig.run(out, "fleet_idle_50_daemons", runs, move || {
        fleet(redis, nginx, 50, 0, idle)
    })
    .await?;
    let (jobs, rate) = (
        rig.size(10_000, 250),
        if rig.opts.quick { 50.0 } else { 2000.0 },
    );
    rig.run(out, "rate_two_daemons", runs, move || {
        rate_two_daemons(redis, nginx, jobs, rate)
    })
    .await?;
    let (jobs, window) = (
        rig.size(10_000, 200),
        Duration::from_millis(rig.size(10_000, 500) as u64),
    );
    rig.run(out, "open_host_backlog", runs, move || {
        open_host_backlog(redis, nginx, jobs, window)
    })
    .await
}

/// Lateness at the sink: idle (one daemon, twenty, the naive design) and at
/// 2,000 jobs/s (hookq, the naive design).
async fn lateness_scenarios(rig: &Rig<'_>, out: &mut Vec<Scenario>) -> Res<()> {
    let (redis, sink, runs) = (rig.redis, rig.sink, rig.opts.runs);
    let idle = rig.size(40, 5);
    rig.run(out, "lateness_idle", runs, move || {
        lateness(redis, sink, 0, idle, false)
    })
    .await?;
    rig.run(out, "lateness_idle_20_daemons", runs, move || {
        lateness_with(redis, sink, 0, idle, false, 20)
    })
    .await?;
    let idle_naive = rig.size(20, 3);
    rig.run(out, "lateness_idle_naive", runs, move || {
        lateness(redis, sink, 0, idle_naive, true)
    })
    .await?;
    let (rate, seconds) = (rig.size(2000, 200), rig.size(10, 2));
    for (name, naive) in [
        ("lateness_2000_per_s", false),
        ("lateness_2000_per_s_naive", true),
    ] {
        rig.run(out, name, runs, move || {
            lateness(redis, sink, rate, seconds, naive)
        })
        .await?;
    }
    Ok(())
}

/// Redis memory per job, once each: scheduled (stock and tuned Redis, mixed
/// bodies) and finished (stock and tuned, bodies kept).
async fn memory_scenarios(rig: &Rig<'_>, out: &mut Vec<Scenario>) -> Res<()> {
    let redis = rig.redis;
    let (stock, tuned) = (STOCK_LISTPACK_VALUE, RECOMMENDED_LISTPACK_VALUE);
    let (million, finished) = (rig.size(1_000_000, 10_000), rig.size(100_000, 2_000));
    for (name, n, listpack_value, mixed) in [
        ("memory_10k_scheduled", 10_000, stock, false),
        ("memory_1m_scheduled", million, stock, false),
        ("memory_1m_scheduled_mixed_bodies", million, stock, true),
        ("memory_1m_scheduled_tuned_redis", million, tuned, false),
    ] {
        rig.run(out, name, 1, move || {
            memory(redis, n, listpack_value, mixed)
        })
        .await?;
    }
    for (name, listpack_value, keep_bodies) in [
        ("memory_100k_finished", stock, false),
        ("memory_100k_finished_tuned_redis", tuned, false),
        ("memory_100k_finished_keep_bodies", stock, true),
    ] {
        rig.run(out, name, 1, move || {
            memory_finished(redis, finished, listpack_value, keep_bodies)
        })
        .await?;
    }
    rig.run(out, "memory_100k_finished_10pct_retried", 1, move || {
        memory_finished_retried(redis, finished)
    })
    .await?;
    Ok(())
}

/// What a large backlog costs: promotion beside 10k and 1m parked jobs, the
/// console's first paint over 1m, and one host's rate beside a hanging one.
async fn backlog_scenarios(rig: &Rig<'_>, out: &mut Vec<Scenario>) -> Res<()> {
    let (redis, nginx, runs) = (rig.redis, rig.nginx, rig.opts.runs);
    let due = rig.size(10_000, 1_000);
    for (name, parked, runs) in [
        ("promotion_10k_scheduled", rig.size(10_000, 1_000), runs),
        (
            "promotion_1m_scheduled",
            rig.size(1_000_000, 10_000),
            rig.size(runs, 1),
        ),
    ] {
        rig.run(out, name, runs, move || promotion(redis, parked, due))
            .await?;
    }
    let (jobs, loads) = (rig.size(1_000_000, 10_000), rig.size(5, 1));
    rig.run(out, "console_first_paint_1m", 1, move || {
        console_paint(redis, jobs, loads)
    })
    .await?;
    let n = rig.size(100_000, 1_000);
    rig.run(out, "hanging_endpoint", runs, move || {
        hanging(redis, nginx, n)
    })
    .await
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--sink") {
        let port: u16 = args.get(i + 1).and_then(|p| p.parse().ok()).unwrap_or(0);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build();
        return match runtime.map(|rt| rt.block_on(run_sink(port))) {
            Ok(Ok(())) => std::process::ExitCode::SUCCESS,
            _ => std::process::ExitCode::FAILURE,
        };
    }
    let opts = Options::parse(&args);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench(&opts)) {
        Ok(scenarios) => {
            println!("\n| scenario | median of runs |\n| --- | --- |");
            for sc in &scenarios {
                let cells: Vec<String> = sc
                    .medians()
                    .iter()
                    .map(|(k, v)| format!("{k} {v:.1}"))
                    .collect();
                println!("| {} | {} |", sc.name, cells.join(", "));
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench failed: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
