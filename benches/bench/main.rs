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
mod peers;
mod schedules;
mod sink;
mod steady;

use std::collections::HashMap;
use std::time::Duration;

use hookq::config::SigningMode;
use hookq::doctor::RECOMMENDED_LISTPACK_VALUE;
use serde_json::{json, Value};

use backlog::{console_paint, promotion};
use common::{median, start_redis};
use delivery::{
    delivery_rate, delivery_rate_cluster, delivery_rate_ordered, hanging, many_hosts, one_host,
    open_host_backlog, rate_two_daemons, sign,
};
use fleet::{fleet, round_trip_floor};
use ingest::{ingest_batch, ingest_single, ingest_single_wrk};
use lateness::{lateness, lateness_with};
use memory::{memory, memory_finished, memory_finished_retried, STOCK_LISTPACK_VALUE};
use nginx::{Nginx, NGINX_SERVERS};
use peers::{peer_bullmq, BULLMQ_CONCURRENCY};
use schedules::schedules_firing;
use sink::{run_sink, Sink};
use steady::{memory_steady_load, SteadyLoad};

/// The test kit: free ports, Redis servers and clusters, waits.
#[path = "../../tests/it/support/mod.rs"]
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

/// What a bench step returns: a value, or an error that ends the run.
type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

// ---------------------------------------------------------------- scenarios

/// One scenario's figures from one run.
type Figures = HashMap<&'static str, f64>;

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
