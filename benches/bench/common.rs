//! What the scenarios share: the bench's Redis, the daemon configs, CPU
//! readings from /proc, percentiles and medians, preloading jobs through the
//! store, a job whose body carries its due time, and [`Meter`], the per-job
//! costs of a delivery run counted at nginx.

use std::collections::HashMap;

use hookq::config::Config;
use hookq::job::{JobInput, RunAt};
use hookq::store::Store;

use crate::nginx::{Nginx, NginxStats};
use crate::support::cluster::RedisCluster;
use crate::support::redis::RedisServer;
use crate::{Figures, Res};

/// The benchmark's Redis: the test kit's server (persistence off) with
/// Redis's stock settings, as users run it (SPEC §10, §11.6).
pub fn start_redis() -> RedisServer {
    RedisServer::start()
}

/// The daemon config for a three-master cluster.
pub fn cluster_config(cluster: &RedisCluster) -> Config {
    let mut c = config(&cluster.nodes[0]);
    c.redis.cluster_nodes = cluster.seeds();
    c
}

/// hookq's default config with only what a test must set: this Redis, an
/// API on a free loopback port, deliveries to loopback allowed (the SSRF
/// guard refuses private addresses by default), quieter logs.
pub fn default_config(redis: &RedisServer) -> Config {
    let mut c = Config::default();
    c.redis.url = redis.url();
    c.api.listen = "127.0.0.1:0".into();
    c.delivery.allow_private = true;
    c.log.level = "warn".into();
    c
}

/// [`default_config`] with the per-host limit lifted to 512, for the
/// scenarios of SPEC §10 that measure throughput to one host.
pub fn config(redis: &RedisServer) -> Config {
    let mut c = default_config(redis);
    c.delivery.per_host_concurrency = 512;
    c
}

/// CPU seconds (user + system) process `pid` has used (`"self"`: this one),
/// from /proc; 0 where /proc is missing or the process is gone.
pub fn cpu_seconds_of(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
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

/// CPU seconds this process has used (user + system). The daemon runs in
/// this process during a scenario.
pub fn own_cpu_seconds() -> f64 {
    cpu_seconds_of("self")
}

/// The value at fraction `p` (0 to 1) of `sorted` (ascending), nearest
/// rank; 0 for no values.
pub fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The median of `values` (the upper one of an even count); 0 for none.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// A store on `cfg`'s Redis with every script loaded, for setting up a
/// scenario.
pub async fn loaded_store(cfg: &Config) -> Res<Store> {
    let store = Store::connect(cfg).await?;
    store.load_scripts().await?;
    Ok(store)
}

/// Enqueues `jobs` through the store (pipelined, for setting up scenarios).
pub async fn preload(store: &Store, config: &Config, jobs: Vec<JobInput>) -> Res<()> {
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

/// A job `id` to `url` due at `due_ms` whose body `{"due": due_ms}` lets the
/// sink measure its lateness.
pub fn job(id: String, url: String, due_ms: i64) -> JobInput {
    JobInput {
        id: Some(id),
        url: Some(url),
        run_at: Some(RunAt::Millis(due_ms)),
        body: serde_json::value::RawValue::from_string(format!("{{\"due\":{due_ms}}}")).ok(),
        ..JobInput::default()
    }
}

/// How far ahead of now a delivery-rate run puts its due moment: preloading
/// `n` jobs and starting the daemon must fit in it ([`check_lead`]).
pub fn lead_ms(n: usize) -> i64 {
    1000 + n as i64 / 25
}

/// Fails if Redis's clock has reached `due` (less a margin for starting the
/// daemon): the run's rate would start counting before anything could run.
pub async fn check_lead(store: &Store, due: i64) -> Res<()> {
    let now = store.redis_time_ms().await?;
    if now > due - 100 {
        return Err(format!(
            "preloading ended {} ms before the due moment: raise lead_ms",
            due - now
        )
        .into());
    }
    Ok(())
}

/// Counters read before a delivery run, for the per-job cost figures.
pub struct Meter {
    scripts: i64,
    redis_cpu: f64,
    own_cpu: f64,
    nginx_cpu: f64,
}

impl Meter {
    /// Reads the counters before a run.
    pub async fn start(redis: &RedisServer, nginx: &Nginx) -> Res<Meter> {
        Ok(Meter {
            scripts: redis.script_calls().await?,
            redis_cpu: redis.cpu_seconds().await?,
            own_cpu: own_cpu_seconds(),
            nginx_cpu: cpu_seconds_of(&nginx.pid().to_string()),
        })
    }

    /// The figures of a run of `n` jobs due at `due` (ms) that nginx has
    /// answered (`stats`): `jobs_per_s` = n / (last 2xx − due),
    /// `first_late_ms` (first 2xx − due), and per job: script calls, Redis
    /// CPU (INFO used_cpu_sys + used_cpu_user), this process's CPU (hookq
    /// runs in it), nginx's CPU.
    pub async fn figures(
        self,
        redis: &RedisServer,
        nginx: &Nginx,
        stats: NginxStats,
        due: i64,
        n: usize,
    ) -> Res<Figures> {
        let scripts = redis.script_calls().await? - self.scripts;
        let redis_cpu = redis.cpu_seconds().await? - self.redis_cpu;
        let own_cpu = own_cpu_seconds() - self.own_cpu;
        let nginx_cpu = cpu_seconds_of(&nginx.pid().to_string()) - self.nginx_cpu;
        let n = n as f64;
        let span = (stats.last_ms - due).max(1) as f64 / 1000.0;
        Ok(HashMap::from([
            ("jobs_per_s", n / span),
            ("first_late_ms", (stats.first_ms - due) as f64),
            ("script_calls_per_job", scripts as f64 / n),
            ("redis_cpu_us_per_job", redis_cpu * 1e6 / n),
            ("hookq_cpu_us_per_job", own_cpu * 1e6 / n),
            ("nginx_cpu_us_per_job", nginx_cpu * 1e6 / n),
        ]))
    }
}
