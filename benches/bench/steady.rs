//! `memory_steady_load`: Redis memory under a steady load of jobs created
//! through the API ([`SteadyLoad`] its settings), sampled over the run: the
//! generator, the sampler, and the plateau and trend of the last third.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hookq::daemon::Daemon;
use serde_json::{json, Value};

use crate::common::{default_config, median};
use crate::nginx::Nginx;
use crate::support::redis::RedisServer;
use crate::{Figures, Res};

/// The settings of `memory_steady_load` (defaults by run size, each one
/// overridable: `--steady-secs`, `--steady-rate`, `--steady-retention`,
/// `--steady-sample`, all in whole seconds or jobs per second).
#[derive(Clone, Copy, Debug)]
pub struct SteadyLoad {
    /// Jobs created per second, in a batch every [`STEADY_TICK`].
    pub rate: usize,
    /// How long the load runs.
    pub duration: Duration,
    /// The daemon's `retention.finished`.
    pub retention: Duration,
    /// How often Redis's memory is sampled.
    pub sample_every: Duration,
    /// Jobs are due now or up to this much later (a quarter each at 0, ⅓,
    /// ⅔ and all of it).
    pub max_delay: Duration,
}

/// How often the steady load generator sends a batch.
const STEADY_TICK: Duration = Duration::from_millis(50);

/// The size of each steady-load job's JSON body, in bytes.
const STEADY_BODY_BYTES: usize = 200;

impl SteadyLoad {
    /// Full run: 2,000 jobs/s for 10 minutes, retention 60 s, a sample every
    /// 10 s, due within 3 s. Quick: 200 jobs/s for 5 s, retention 2 s, a
    /// sample every second, due within 600 ms.
    pub fn defaults(quick: bool) -> SteadyLoad {
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
pub async fn memory_steady_load(
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
