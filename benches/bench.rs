//! hookq's benchmark: starts its own `redis-server` and a fast HTTP sink (this
//! same binary re-executed with `--sink`, so the sink is a separate process),
//! runs hookq in-process, and measures the SPEC §10 scenarios, each several
//! times, printing one JSON line per scenario (medians) and a markdown table.
//!
//! `scripts/bench.sh` runs it in release mode; `--quick` shrinks every
//! scenario to a smoke test (used by the test suite; no timing assertions).

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hookq::config::Config;
use hookq::daemon::Daemon;
use hookq::job::{JobInput, RunAt};
use hookq::store::Store;
use serde_json::{json, Value};

/// The test kit: free ports, Redis servers and clusters, waits.
#[path = "../tests/it/support/mod.rs"]
mod support;
use support::cluster::RedisCluster;
use support::free_port;
use support::redis::RedisServer;

/// mimalloc instead of the system allocator: the delivery hot path allocates
/// per request (hyper, reqwest, redis), and the profile showed glibc malloc's
/// bookkeeping (`_int_malloc`, `malloc_consolidate`, `unlink_chunk`) as the
/// largest user-space cost.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

// ---------------------------------------------------------------- the sink

/// What the sink has seen since its last reset.
#[derive(Default)]
struct SinkState {
    count: u64,
    first_ms: i64,
    last_ms: i64,
    /// receive − due (ms), for jobs whose body carries `due`.
    lateness: Vec<i64>,
}

async fn run_sink(port: u16) -> Res<()> {
    use axum::body::Bytes;
    use axum::extract::State;
    use axum::routing::{get, post};
    let state = Arc::new(Mutex::new(SinkState::default()));
    let app = axum::Router::new()
        .route(
            "/count",
            get(|State(s): State<Arc<Mutex<SinkState>>>| async move {
                s.lock().map(|g| g.count).unwrap_or_default().to_string()
            }),
        )
        .route(
            "/stats",
            get(|State(s): State<Arc<Mutex<SinkState>>>| async move {
                let s = s.lock().map(|g| json!({"count": g.count, "first_ms": g.first_ms, "last_ms": g.last_ms, "lateness": g.lateness})).unwrap_or_default();
                axum::Json(s)
            }),
        )
        .route(
            "/reset",
            post(|State(s): State<Arc<Mutex<SinkState>>>| async move {
                if let Ok(mut g) = s.lock() {
                    *g = SinkState::default();
                }
                "ok"
            }),
        )
        .route(
            "/hang",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                "late"
            }),
        )
        .fallback(|State(s): State<Arc<Mutex<SinkState>>>, body: Bytes| async move {
            let received_us = now_us();
            let received = received_us / 1000;
            let due = serde_json::from_slice::<Value>(&body).ok().and_then(|v| v["due"].as_i64());
            if let Ok(mut g) = s.lock() {
                g.count += 1;
                if g.first_ms == 0 {
                    g.first_ms = received;
                }
                g.last_ms = received;
                if let Some(due) = due {
                    // Microseconds: the lateness bars are a few ms.
                    g.lateness.push(received_us - due * 1000);
                }
            }
            "ok"
        })
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    axum::serve(listener, app).await?;
    Ok(())
}

struct Sink {
    child: Child,
    base: String,
    client: reqwest::Client,
}

impl Sink {
    async fn start() -> Res<Sink> {
        let port = free_port();
        let child = Command::new(std::env::current_exe()?)
            .arg("--sink")
            .arg(port.to_string())
            .stdout(Stdio::null())
            .spawn()?;
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        for _ in 0..200 {
            if client.post(format!("{base}/reset")).send().await.is_ok() {
                return Ok(Sink {
                    child,
                    base,
                    client,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err("sink did not start".into())
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn reset(&self) -> Res<()> {
        self.client.post(self.url("/reset")).send().await?;
        Ok(())
    }

    async fn stats(&self) -> Res<Value> {
        Ok(self
            .client
            .get(self.url("/stats"))
            .send()
            .await?
            .json()
            .await?)
    }

    async fn wait_for(&self, n: u64, deadline: Duration) -> Res<Value> {
        let until = Instant::now() + deadline;
        loop {
            // Poll the bare count: the full stats carry every lateness sample
            // and would cost the sink and this process more than hookq does.
            let count: u64 = self
                .client
                .get(self.url("/count"))
                .send()
                .await?
                .text()
                .await?
                .trim()
                .parse()
                .unwrap_or(0);
            if count >= n {
                return self.stats().await;
            }
            if Instant::now() > until {
                return Err(format!("sink got {count} of {n} within {deadline:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------- redis

/// The benchmark's Redis: the test kit's server with persistence off and
/// `hash-max-listpack-value 1024`, as `scripts/run.sh` and the README
/// recommend (`memory_1m_scheduled_stock_redis` measures the stock setting).
fn start_redis() -> RedisServer {
    RedisServer::start_with(&["--hash-max-listpack-value", "1024"])
}

/// The daemon config for a three-master cluster.
fn cluster_config(cluster: &RedisCluster) -> Config {
    let mut c = config(&cluster.nodes[0]);
    c.redis.cluster_nodes = cluster.seeds();
    c
}

// ---------------------------------------------------------------- helpers

fn config(redis: &RedisServer) -> Config {
    let mut c = Config::default();
    c.redis.url = redis.url();
    c.api.listen = "127.0.0.1:0".into();
    c.delivery.allow_private = true;
    c.delivery.per_host_concurrency = 512;
    c.log.level = "warn".into();
    c
}

/// CPU seconds this process has used (user + system), from /proc; 0 where
/// /proc is missing. The daemon runs in this process during a scenario.
fn own_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which ends with ')'): utime and stime
    // are the 12th and 13th, in clock ticks (100 per second on Linux).
    let rest = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// Enqueues `jobs` through the store (pipelined, for setting up scenarios).
async fn preload(store: &Store, config: &Config, jobs: Vec<JobInput>) -> Res<()> {
    for chunk in jobs.chunks(1000) {
        let new: Vec<_> = chunk
            .iter()
            .cloned()
            .map(|j| j.validate(config).map(|v| v.new_job(config)))
            .collect::<Result<_, _>>()?;
        for outcome in store.enqueue_many(&new).await? {
            outcome?;
        }
    }
    Ok(())
}

fn job(id: String, url: String, due_ms: i64) -> JobInput {
    JobInput {
        id: Some(id),
        url: Some(url),
        run_at: Some(RunAt::Millis(due_ms)),
        body: serde_json::value::RawValue::from_string(format!("{{\"due\":{due_ms}}}")).ok(),
        ..JobInput::default()
    }
}

// ---------------------------------------------------------------- scenarios

/// One scenario's figures from one run.
type Figures = HashMap<&'static str, f64>;

/// POSTs every body to `url` from `clients` concurrent tasks; each answer
/// must have status `expected`. Returns the seconds it took.
async fn post_all(url: &str, bodies: Vec<String>, clients: usize, expected: u16) -> Res<f64> {
    let client = reqwest::Client::new();
    let bodies = Arc::new(bodies);
    // Parsed once: the load generator should not spend its CPU (which
    // hookq shares) re-parsing the same URL for every request.
    let url: reqwest::Url = url.parse()?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..clients {
        let (client, url, bodies) = (client.clone(), url.clone(), bodies.clone());
        tasks.push(tokio::spawn(async move {
            for body in bodies.iter().skip(worker).step_by(clients) {
                let r = client
                    .post(url.clone())
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await?;
                if r.status() != expected {
                    return Err::<(), Box<dyn std::error::Error + Send + Sync>>(
                        format!("{url} answered {}", r.status()).into(),
                    );
                }
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(started.elapsed().as_secs_f64())
}

async fn ingest_batch(redis: &RedisServer, n: usize) -> Res<Figures> {
    redis.flush().await?;
    let daemon = Daemon::start(config(redis)).await?;
    // Request bodies are encoded before the clock starts: the load generator
    // shares the machine, and its JSON encoding is not hookq's cost.
    let batches = n / 1000;
    let bodies: Vec<String> = (0..batches)
        .map(|b| {
            let jobs: Vec<Value> = (0..1000)
                .map(|i| json!({"id": format!("ib-{b}-{i}"), "url": "http://127.0.0.1:9/", "delay": "1h", "body": {"n": i}}))
                .collect();
            json!({ "jobs": jobs }).to_string()
        })
        .collect();
    let took = post_all(&format!("{}/v1/jobs/batch", daemon.url()), bodies, 4, 200).await?;
    daemon.stop().await?;
    Ok(HashMap::from([(
        "jobs_per_s",
        (batches * 1000) as f64 / took,
    )]))
}

async fn ingest_single(redis: &RedisServer, n: usize) -> Res<Figures> {
    redis.flush().await?;
    let daemon = Daemon::start(config(redis)).await?;
    let bodies: Vec<String> = (0..n)
        .map(|i| json!({"id": format!("is-{i}"), "url": "http://127.0.0.1:9/", "delay": "1h", "body": {"n": i}}).to_string())
        .collect();
    let took = post_all(&format!("{}/v1/jobs", daemon.url()), bodies, 32, 201).await?;
    daemon.stop().await?;
    Ok(HashMap::from([("requests_per_s", n as f64 / took)]))
}

/// wrk's script for `ingest_single_wrk`: a distinct id per request
/// (`w-<thread>-<n>`), otherwise the body `ingest_single` sends.
const WRK_SCRIPT: &str = r#"
local next_thread = 0
function setup(thread)
  thread:set("tid", next_thread)
  next_thread = next_thread + 1
end
local n = 0
function request()
  n = n + 1
  local body = string.format(
    '{"id":"w-%d-%d","url":"http://127.0.0.1:9/","delay":"1h","body":{"n":%d}}', tid, n, n)
  return wrk.format("POST", "/v1/jobs", {["Content-Type"] = "application/json"}, body)
end
"#;

/// Single creates driven by wrk (C, one thread, 32 connections) for
/// `seconds`, instead of the in-process reqwest client: the load generator
/// shares the two cores with hookq and Redis, and wrk spends less of them.
/// Every answer must be a 2xx (wrk reports the others).
async fn ingest_single_wrk(redis: &RedisServer, seconds: u64) -> Res<Figures> {
    redis.flush().await?;
    let daemon = Daemon::start(config(redis)).await?;
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("create.lua");
    std::fs::write(&script, WRK_SCRIPT)?;
    let out = tokio::process::Command::new("wrk")
        .args(["-t1", "-c32", "-d"])
        .arg(format!("{seconds}s"))
        .arg("-s")
        .arg(&script)
        .arg(daemon.url())
        .output()
        .await
        .map_err(|e| format!("wrk (scripts/test.sh installs it): {e}"))?;
    daemon.stop().await?;
    let report = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || report.contains("Non-2xx") || report.contains("Socket errors") {
        return Err(format!("wrk failed or saw errors:\n{report}").into());
    }
    let rate = report
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .ok_or_else(|| format!("no Requests/sec in wrk's report:\n{report}"))?;
    Ok(HashMap::from([("requests_per_s", rate)]))
}

/// n jobs all due at the same moment; rate = n / (last 2xx − due).
async fn delivery_rate(redis: &RedisServer, sink: &Sink, n: usize, naive: bool) -> Res<Figures> {
    redis.flush().await?;
    sink.reset().await?;
    let cfg = config(redis);
    let store = Store::connect(&cfg).await?;
    store.load_scripts().await?;
    let due = store.redis_time_ms().await? + 3000 + (n as i64 / 50);
    let url = sink.url("/rate");
    if naive {
        naive::preload(redis, (0..n).map(|i| (format!("nr-{i}"), due)).collect()).await?;
    } else {
        preload(
            &store,
            &cfg,
            (0..n)
                .map(|i| job(format!("dr-{i}"), url.clone(), due))
                .collect(),
        )
        .await?;
    }
    let scripts_before = redis.script_calls().await?;
    let redis_cpu_before = redis.cpu_seconds().await?;
    let own_cpu_before = own_cpu_seconds();
    let runner = Runner::start(redis, &cfg, naive, url).await?;
    let stats = sink.wait_for(n as u64, Duration::from_secs(600)).await?;
    let scripts = redis.script_calls().await? - scripts_before;
    let redis_cpu = redis.cpu_seconds().await? - redis_cpu_before;
    let own_cpu = own_cpu_seconds() - own_cpu_before;
    runner.stop().await?;
    let last = stats["last_ms"].as_i64().unwrap_or(0);
    let first = stats["first_ms"].as_i64().unwrap_or(0);
    let span = (last - due).max(1) as f64 / 1000.0;
    Ok(HashMap::from([
        ("jobs_per_s", n as f64 / span),
        ("first_late_ms", (first - due) as f64),
        ("script_calls_per_job", scripts as f64 / n as f64),
        ("redis_cpu_us_per_job", redis_cpu * 1e6 / n as f64),
        ("hookq_cpu_us_per_job", own_cpu * 1e6 / n as f64),
    ]))
}

/// End-to-end delivery rate of `n` jobs due at the same moment, hookq on a
/// three-master Redis Cluster (same partitions, same daemon settings as
/// `delivery_rate`); Redis CPU is the sum over the masters.
async fn delivery_rate_cluster(cluster: &RedisCluster, sink: &Sink, n: usize) -> Res<Figures> {
    cluster.flush().await?;
    sink.reset().await?;
    let cfg = cluster_config(cluster);
    let store = Store::connect(&cfg).await?;
    store.load_scripts().await?;
    let due = store.redis_time_ms().await? + 3000 + (n as i64 / 50);
    let url = sink.url("/rate");
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
    let stats = sink.wait_for(n as u64, Duration::from_secs(600)).await?;
    let scripts = cluster.script_calls().await? - scripts_before;
    let redis_cpu = cluster.cpu_seconds().await? - redis_cpu_before;
    let own_cpu = own_cpu_seconds() - own_cpu_before;
    daemon.stop().await?;
    let last = stats["last_ms"].as_i64().unwrap_or(0);
    let span = (last - due).max(1) as f64 / 1000.0;
    Ok(HashMap::from([
        ("jobs_per_s", n as f64 / span),
        ("script_calls_per_job", scripts as f64 / n as f64),
        ("redis_cpu_us_per_job", redis_cpu * 1e6 / n as f64),
        ("hookq_cpu_us_per_job", own_cpu * 1e6 / n as f64),
    ]))
}

/// Lateness (receive − due at the sink) with jobs due evenly at `rate`/s
/// for `seconds`, or one at a time (`rate` = 0: idle, `count` jobs 150 ms apart
/// with the previous one delivered first).
async fn lateness(
    redis: &RedisServer,
    sink: &Sink,
    rate: usize,
    seconds: usize,
    naive: bool,
) -> Res<Figures> {
    redis.flush().await?;
    sink.reset().await?;
    let cfg = config(redis);
    let store = Store::connect(&cfg).await?;
    store.load_scripts().await?;
    let url = sink.url("/late");
    let runner = Runner::start(redis, &cfg, naive, url.clone()).await?;
    let n;
    if rate == 0 {
        // Idle: one job at a time, each enqueued while nothing else is pending.
        n = seconds;
        for i in 0..n {
            let due = store.redis_time_ms().await? + 150 + (i as i64 * 7) % 50;
            if naive {
                naive::preload(redis, vec![(format!("il-{i}"), due)]).await?;
            } else {
                preload(&store, &cfg, vec![job(format!("il-{i}"), url.clone(), due)]).await?;
            }
            sink.wait_for(i as u64 + 1, Duration::from_secs(10)).await?;
        }
    } else {
        n = rate * seconds;
        let start = store.redis_time_ms().await? + 2000;
        let step = 1000.0 / rate as f64;
        let dues: Vec<i64> = (0..n).map(|i| start + (i as f64 * step) as i64).collect();
        if naive {
            naive::preload(
                redis,
                dues.iter()
                    .enumerate()
                    .map(|(i, d)| (format!("sl-{i}"), *d))
                    .collect(),
            )
            .await?;
        } else {
            preload(
                &store,
                &cfg,
                dues.iter()
                    .enumerate()
                    .map(|(i, d)| job(format!("sl-{i}"), url.clone(), *d))
                    .collect(),
            )
            .await?;
        }
        sink.wait_for(n as u64, Duration::from_secs(seconds as u64 + 120))
            .await?;
    }
    let stats = sink.stats().await?;
    runner.stop().await?;
    let mut late: Vec<i64> = stats["lateness"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    late.sort_unstable();
    let ms = |us: i64| (us as f64 / 100.0).round() / 10.0;
    Ok(HashMap::from([
        ("p50_ms", ms(percentile(&late, 0.50))),
        ("p90_ms", ms(percentile(&late, 0.90))),
        ("p99_ms", ms(percentile(&late, 0.99))),
        ("max_ms", ms(late.last().copied().unwrap_or(0))),
        ("early", late.iter().filter(|l| **l < 0).count() as f64),
    ]))
}

/// `hash-max-listpack-value` as hookq recommends it (README, doctor,
/// scripts/run.sh): job records up to this size stay in Redis's compact
/// listpack encoding.
const RECOMMENDED_LISTPACK_VALUE: u32 = 1024;
/// Redis's own default.
const STOCK_LISTPACK_VALUE: u32 = 64;

/// Redis memory per scheduled job (body `{"due":<13 digits>}`, 22 bytes) with
/// Redis's `hash-max-listpack-value` set to `listpack_value`.
async fn memory(redis: &RedisServer, n: usize, listpack_value: u32) -> Res<Figures> {
    redis.flush().await?;
    redis
        .config_set("hash-max-listpack-value", &listpack_value.to_string())
        .await?;
    let cfg = config(redis);
    let store = Store::connect(&cfg).await?;
    store.load_scripts().await?;
    let before = redis.used_memory().await?;
    let due = store.redis_time_ms().await? + 86_400_000;
    let id_width = 7;
    preload(
        &store,
        &cfg,
        (0..n)
            .map(|i| {
                job(
                    format!("mem-{i:0id_width$}"),
                    "http://sink.example/hook".into(),
                    due + i as i64,
                )
            })
            .collect(),
    )
    .await?;
    let after = redis.used_memory().await?;
    redis
        .config_set(
            "hash-max-listpack-value",
            &RECOMMENDED_LISTPACK_VALUE.to_string(),
        )
        .await?;
    let per_job = (after - before) as f64 / n as f64;
    let body = format!("{{\"due\":{due}}}").len() as f64;
    Ok(HashMap::from([
        ("bytes_per_job", per_job),
        ("beyond_body", per_job - body),
    ]))
}

/// Time to promote `due` jobs while `parked` other jobs wait far ahead.
async fn promotion(redis: &RedisServer, parked: usize, due_n: usize) -> Res<Figures> {
    redis.flush().await?;
    let mut cfg = config(redis);
    cfg.redis.partitions = 16;
    let store = Store::connect(&cfg).await?;
    store.load_scripts().await?;
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

/// Delivery rate to a healthy endpoint, alone and next to a hanging one.
async fn hanging(redis: &RedisServer, sink: &Sink, n: usize) -> Res<Figures> {
    let mut rates = Vec::new();
    for with_hang in [false, true] {
        redis.flush().await?;
        sink.reset().await?;
        let mut cfg = config(redis);
        cfg.delivery.per_host_concurrency = 64;
        cfg.delivery.timeout = Duration::from_secs(5);
        let store = Store::connect(&cfg).await?;
        store.load_scripts().await?;
        let due = store.redis_time_ms().await? + 3000 + (n as i64 / 50);
        let mut jobs: Vec<JobInput> = (0..n)
            .map(|i| job(format!("ok-{i}"), sink.url("/ok"), due))
            .collect();
        if with_hang {
            // The hanging endpoint is another host name for the same sink.
            let hang = sink.url("/hang").replace("127.0.0.1", "localhost");
            jobs.extend((0..n / 10).map(|i| job(format!("hang-{i}"), hang.clone(), due)));
        }
        preload(&store, &cfg, jobs).await?;
        let daemon = Daemon::start(cfg).await?;
        let stats = sink.wait_for(n as u64, Duration::from_secs(600)).await?;
        let span = (stats["last_ms"].as_i64().unwrap_or(0) - due).max(1) as f64 / 1000.0;
        rates.push(n as f64 / span);
        daemon.token().cancel();
        let _ = tokio::time::timeout(Duration::from_secs(2), daemon.wait()).await;
    }
    Ok(HashMap::from([
        ("alone_jobs_per_s", rates[0]),
        ("with_hanging_jobs_per_s", rates[1]),
        // Percent the healthy host's rate drops next to the hanging one
        // (the bar: at most 10).
        ("drop_pct", (1.0 - rates[1] / rates[0]) * 100.0),
    ]))
}

// ---------------------------------------------------------------- runners

/// hookq or the naive design, delivering to the sink.
enum Runner {
    Hookq(Daemon),
    Naive(
        tokio_util::sync::CancellationToken,
        Vec<tokio::task::JoinHandle<()>>,
    ),
}

impl Runner {
    async fn start(redis: &RedisServer, cfg: &Config, naive: bool, url: String) -> Res<Runner> {
        if naive {
            Ok(naive::start(redis.url(), url).await?)
        } else {
            Ok(Runner::Hookq(Daemon::start(cfg.clone()).await?))
        }
    }

    async fn stop(self) -> Res<()> {
        match self {
            Runner::Hookq(d) => d.stop().await?,
            Runner::Naive(token, tasks) => {
                token.cancel();
                for t in tasks {
                    let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
                }
            }
        }
        Ok(())
    }
}

/// The naive design of the seed notes: a 1-second polling loop over the
/// ZSET moving jobs one round trip at a time, and workers popping a list.
mod naive {
    use super::*;

    pub async fn preload(redis: &RedisServer, jobs: Vec<(String, i64)>) -> Res<()> {
        let mut c = redis::Client::open(redis.url())?
            .get_multiplexed_async_connection()
            .await?;
        for chunk in jobs.chunks(1000) {
            let mut pipe = redis::pipe();
            for (id, due) in chunk {
                pipe.zadd("naive:due", id, *due).ignore();
                pipe.set(format!("naive:job:{id}"), format!("{{\"due\":{due}}}"))
                    .ignore();
            }
            pipe.query_async::<()>(&mut c).await?;
        }
        Ok(())
    }

    pub async fn start(redis_url: String, sink_url: String) -> Res<Runner> {
        let token = tokio_util::sync::CancellationToken::new();
        let client = redis::Client::open(redis_url)?;
        let mut tasks = Vec::new();
        let mut conn = client.get_multiplexed_async_connection().await?;
        let t = token.clone();
        tasks.push(tokio::spawn(async move {
            while !t.is_cancelled() {
                let now = (now_ms()) as f64;
                let due: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                    .arg("naive:due")
                    .arg(0)
                    .arg(now)
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_default();
                for id in due {
                    let removed: i64 = redis::cmd("ZREM")
                        .arg("naive:due")
                        .arg(&id)
                        .query_async(&mut conn)
                        .await
                        .unwrap_or(0);
                    if removed == 1 {
                        let _: Result<i64, _> = redis::cmd("RPUSH")
                            .arg("naive:ready")
                            .arg(&id)
                            .query_async(&mut conn)
                            .await;
                    }
                }
                tokio::select! {
                    _ = t.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }));
        let http = reqwest::Client::new();
        for _ in 0..64 {
            let t = token.clone();
            let http = http.clone();
            let url = sink_url.clone();
            let mut conn = client.get_multiplexed_async_connection().await?;
            tasks.push(tokio::spawn(async move {
                while !t.is_cancelled() {
                    let popped: Option<(String, String)> = redis::cmd("BLPOP")
                        .arg("naive:ready")
                        .arg(0.5)
                        .query_async(&mut conn)
                        .await
                        .unwrap_or(None);
                    let Some((_, id)) = popped else { continue };
                    let body: Option<String> = redis::cmd("GET")
                        .arg(format!("naive:job:{id}"))
                        .query_async(&mut conn)
                        .await
                        .unwrap_or(None);
                    if let Some(body) = body {
                        let _ = http
                            .post(&url)
                            .header("content-type", "application/json")
                            .body(body)
                            .send()
                            .await;
                        let _: Result<i64, _> = redis::cmd("DEL")
                            .arg(format!("naive:job:{id}"))
                            .query_async(&mut conn)
                            .await;
                    }
                }
            }));
        }
        Ok(Runner::Naive(token, tasks))
    }
}

// ---------------------------------------------------------------- main

struct Scenario {
    name: String,
    runs: Vec<Figures>,
}

impl Scenario {
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
}

async fn bench(quick: bool, runs: usize, only: Option<String>) -> Res<Vec<Scenario>> {
    let redis = start_redis();
    let sink = Sink::start().await?;
    let s = |full: usize, small: usize| if quick { small } else { full };
    let mut out = Vec::new();
    // `--only NAME` runs the scenarios whose name starts with NAME; a trailing
    // `$` (`--only 'delivery_rate$'`) asks for that exact name.
    let wanted = |name: &str| {
        only.as_deref().is_none_or(|o| match o.strip_suffix('$') {
            Some(exact) => name == exact,
            None => name.starts_with(o),
        })
    };
    macro_rules! scenario {
        ($name:expr, $runs:expr, $body:expr) => {
            if wanted(&$name) {
                let mut figures = Vec::new();
                for _ in 0..$runs {
                    figures.push($body.await?);
                }
                let sc = Scenario { name: $name.to_string(), runs: figures };
                let line: serde_json::Map<String, Value> = sc.medians().into_iter().map(|(k, v)| (k.to_string(), json!((v * 10.0).round() / 10.0))).collect();
                println!("{}", json!({"scenario": sc.name, "runs": $runs, "median": line}));
                out.push(sc);
            }
        };
    }
    scenario!(
        "ingest_batch",
        runs,
        ingest_batch(&redis, s(100_000, 2_000))
    );
    scenario!("ingest_single", runs, ingest_single(&redis, s(20_000, 500)));
    scenario!(
        "ingest_single_wrk",
        runs,
        ingest_single_wrk(&redis, s(5, 1) as u64)
    );
    scenario!(
        "delivery_rate",
        runs,
        delivery_rate(&redis, &sink, s(100_000, 2_000), false)
    );
    scenario!(
        "delivery_rate_naive",
        runs,
        delivery_rate(&redis, &sink, s(100_000, 2_000), true)
    );
    if wanted("delivery_rate_cluster_3_masters") {
        let cluster = RedisCluster::start_with(0);
        scenario!(
            "delivery_rate_cluster_3_masters",
            runs,
            delivery_rate_cluster(&cluster, &sink, s(100_000, 2_000))
        );
    }
    scenario!(
        "lateness_idle",
        runs,
        lateness(&redis, &sink, 0, s(40, 5), false)
    );
    scenario!(
        "lateness_idle_naive",
        runs,
        lateness(&redis, &sink, 0, s(20, 3), true)
    );
    scenario!(
        "lateness_2000_per_s",
        runs,
        lateness(&redis, &sink, s(2000, 200), s(10, 2), false)
    );
    scenario!(
        "lateness_2000_per_s_naive",
        runs,
        lateness(&redis, &sink, s(2000, 200), s(10, 2), true)
    );
    scenario!(
        "memory_1m_scheduled",
        1,
        memory(&redis, s(1_000_000, 10_000), RECOMMENDED_LISTPACK_VALUE)
    );
    scenario!(
        "memory_1m_scheduled_stock_redis",
        1,
        memory(&redis, s(1_000_000, 10_000), STOCK_LISTPACK_VALUE)
    );
    scenario!(
        "promotion_10k_scheduled",
        runs,
        promotion(&redis, s(10_000, 1_000), s(10_000, 1_000))
    );
    scenario!(
        "promotion_1m_scheduled",
        if quick { 1 } else { runs },
        promotion(&redis, s(1_000_000, 10_000), s(10_000, 1_000))
    );
    scenario!(
        "hanging_endpoint",
        runs,
        hanging(&redis, &sink, s(20_000, 1_000))
    );
    Ok(out)
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
    let quick = args.iter().any(|a| a == "--quick");
    let runs = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .and_then(|r| r.parse().ok())
        .unwrap_or(if quick { 1 } else { 3 });
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench(quick, runs, only)) {
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
