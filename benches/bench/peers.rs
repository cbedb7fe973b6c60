//! The peers (`--peers`): BullMQ (`benches/peers/`, Node) on the bench's
//! Redis and nginx, measured as hookq is (`peer_bullmq_one_host`, and
//! `peer_bullmq_steady_200` beside `steady_200`), and the install of its
//! pinned packages.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{cpu_seconds_of, Meter};
use crate::fleet::{paced_figures, FleetCounters};
use crate::nginx::{Nginx, NginxStats};
use crate::support::process::OwnedProcess;
use crate::support::redis::RedisServer;
use crate::{Figures, Res};

/// BullMQ's worker concurrency in `peer_bullmq_one_host` unless
/// `--peer-concurrency N` says otherwise: the best of those tried on the
/// 2-core machine with nothing else running (100,000 jobs, medians of 3):
/// 32 → 12.2k jobs/s, 64 → 12.5k, 256 → 10.6k, 512 → 8.6k (more
/// concurrency costs node more CPU per job, and the first job starts later).
/// 64 is also hookq's default per-host limit.
pub const BULLMQ_CONCURRENCY: usize = 64;

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
pub async fn peer_bullmq(
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
    let mut node = spawn_bullmq(&dir, &events, redis, nginx, n, concurrency, 0.0)?;
    let pid = node.pid().to_string();
    let due = wait_for_ready(&mut node, &events).await?;
    let meter = Meter::start(redis, nginx).await?;
    let node_cpu_before = cpu_seconds_of(&pid);
    let stats = wait_for_bullmq_answers(&mut node, nginx, n).await?;
    let node_cpu = cpu_seconds_of(&pid) - node_cpu_before;
    let mut figures = meter.figures(redis, nginx, stats, due, n).await?;
    figures.remove("hookq_cpu_us_per_job");
    figures.insert("peer_cpu_us_per_job", node_cpu * 1e6 / n as f64);
    figures.insert("worker_concurrency", concurrency as f64);
    close_bullmq(&mut node, &events, n).await?;
    Ok(figures)
}

/// `peer_bullmq_steady_200`: BullMQ beside `steady_200`, on the same Redis
/// and nginx: `rate` × `seconds` delayed jobs due one every 1/`rate` s, one
/// Worker with `concurrency`. Measured as hookq's paced run is, over the
/// same window (the first due time to nginx's last answer): per job, Redis's
/// CPU, commands and script calls ([`FleetCounters`]), node's CPU
/// (`peer_cpu_us_per_job`), and nginx's lateness figures
/// ([`paced_figures`]).
pub async fn peer_bullmq_steady(
    redis: &RedisServer,
    nginx: &Nginx,
    rate: usize,
    seconds: f64,
    concurrency: usize,
) -> Res<Figures> {
    let dir = ensure_peers_installed()?;
    redis.flush().await?;
    nginx.reset().await?;
    let n = (rate as f64 * seconds).round().max(1.0) as usize;
    let out_dir = tempfile::tempdir()?;
    let events = out_dir.path().join("events.jsonl");
    let step_ms = 1000.0 / rate as f64;
    let mut node = spawn_bullmq(&dir, &events, redis, nginx, n, concurrency, step_ms)?;
    let pid = node.pid().to_string();
    let due = wait_for_ready(&mut node, &events).await?;
    let wall_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    tokio::time::sleep(Duration::from_millis((due - wall_ms).max(0) as u64)).await;
    let counters = FleetCounters::read(redis).await?;
    let node_cpu_before = cpu_seconds_of(&pid);
    let stats = wait_for_bullmq_answers(&mut node, nginx, n).await?;
    let node_cpu = cpu_seconds_of(&pid) - node_cpu_before;
    let mut figures = counters.per_job_since(redis, n).await?;
    figures.remove("daemons_cpu_us_per_job");
    figures.insert("peer_cpu_us_per_job", node_cpu * 1e6 / n as f64);
    let last_due = due + ((n - 1) as f64 * step_ms) as i64;
    figures.insert("last_late_ms", (stats.last_ms - last_due) as f64);
    figures.extend(paced_figures(nginx, stats.last_ms - due, n)?);
    close_bullmq(&mut node, &events, n).await?;
    Ok(figures)
}

/// Waits for bullmq.js's `ready` event and returns its first due time
/// (wall clock, ms).
async fn wait_for_ready(node: &mut OwnedProcess, events: &std::path::Path) -> Res<i64> {
    let ready = wait_for_event(node, events, "ready", "get ready", 120).await?;
    Ok(ready["due"]
        .as_i64()
        .ok_or("bullmq.js's ready event has no due")?)
}

/// Checks bullmq.js's own count of `n`, then asks it to close (SIGTERM)
/// and waits up to 5 s; whatever happens, it is killed with its group when
/// `node` drops.
async fn close_bullmq(node: &mut OwnedProcess, events: &std::path::Path, n: usize) -> Res<()> {
    let pid = node.pid().to_string();
    let done = wait_for_event(node, events, "done", "report done", 10).await?;
    if done["count"].as_u64() != Some(n as u64) {
        return Err(format!("bullmq.js reported {done}, expected count {n}").into());
    }
    let _ = Command::new("kill").arg("-TERM").arg(&pid).status();
    let until = Instant::now() + Duration::from_secs(5);
    while node.try_wait().is_none() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Starts `node bullmq.js` in `dir` (its JSON event lines into `events`):
/// `n` jobs for nginx's first host, due at one moment (`step_ms` 0) or one
/// every `step_ms`, a worker with `concurrency`.
fn spawn_bullmq(
    dir: &std::path::Path,
    events: &std::path::Path,
    redis: &RedisServer,
    nginx: &Nginx,
    n: usize,
    concurrency: usize,
    step_ms: f64,
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
        .arg(step_ms.to_string())
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
