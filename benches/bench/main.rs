//! hookq's benchmark. It starts its own processes, all on free loopback ports
//! and all killed when it ends (Drop guards, even on error):
//! - a `redis-server` with stock settings (the test kit's; persistence off),
//!   except where a scenario says otherwise (`memory_1m_scheduled` sets the
//!   tuned `hash-max-listpack-value` it reports beside the stock figure);
//! - nginx answering `return 204` on 20 ports ([`Nginx`](nginx::Nginx)):
//!   the reference receiver of SPEC §10/§11.6 for every delivery-rate
//!   scenario, counted through its access log;
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
//! `peer_bullmq_one_host` and `peer_bullmq_steady_200` (`--peer-concurrency
//! N` sets BullMQ's worker concurrency).
//!
//! `memory_steady_load` runs last, once, and **takes 10 minutes** in the full
//! run (2,000 jobs/s; `--quick`: 5 s at 200 jobs/s); `--steady-secs N`,
//! `--steady-rate N`, `--steady-retention N` and `--steady-sample N` change
//! its length, rate, `retention.finished` and sampling period.
//!
//! Where the parts are: this file holds the command line ([`Options`]), a
//! scenario's JSON line ([`Scenario`]) and the closing table;
//! [`scenarios`] lists every scenario with its sizes and runs them in
//! order. The receivers are [`nginx`] and [`sink`]; [`common`] holds the
//! shared helpers (configs, CPU, percentiles, preloading, [`common::Meter`])
//! and [`naive`] the naive design. One module per scenario group:
//! [`ingest`], [`delivery`], [`schedules`], [`fleet`] (and the steady
//! scenarios), [`lateness`], [`memory`], [`backlog`] (promotion, the
//! console's first paint),
//! [`steady`] (`memory_steady_load`), [`tenants`] (`tenants_fair`) and
//! [`peers`] (BullMQ).

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
mod scenarios;
mod schedules;
mod sink;
mod steady;
mod tenants;

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use common::median;
use peers::BULLMQ_CONCURRENCY;
use scenarios::bench;
use sink::run_sink;
use steady::SteadyLoad;

/// The test kit: free ports, Redis servers and clusters, waits.
#[path = "../../tests/it/support/mod.rs"]
mod support;

/// mimalloc instead of the system allocator: the delivery hot path allocates
/// per request (hyper, reqwest, redis), and the profile showed glibc malloc's
/// bookkeeping (`_int_malloc`, `malloc_consolidate`, `unlink_chunk`) as the
/// largest user-space cost.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What a bench step returns: a value, or an error that ends the run.
type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// One scenario's figures from one run.
type Figures = HashMap<&'static str, f64>;

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
    /// `--peers`: also run `peer_bullmq_one_host` and
    /// `peer_bullmq_steady_200` (need Node).
    peers: bool,
    /// `--peer-concurrency N`: BullMQ's worker concurrency.
    peer_concurrency: usize,
    /// `memory_steady_load`'s settings: [`SteadyLoad::defaults`], changed by
    /// `--steady-secs N`, `--steady-rate N` (jobs/s), `--steady-retention N`
    /// and `--steady-sample N` (seconds).
    steady: SteadyLoad,
}

/// What `--help` prints: the flags [`Options::parse`] takes.
const USAGE: &str = "\
usage: scripts/bench.sh [FLAG]...   (cargo bench --bench bench -- [FLAG]...)
  --quick               every scenario at smoke-test size (no Node, no assertions)
  --only A,B            scenarios whose name starts with A or B (NAME$: exactly NAME)
  --runs N              runs per scenario (default 3; 1 with --quick)
  --peers               also BullMQ (peer_bullmq_one_host, peer_bullmq_steady_200; needs Node)
  --peer-concurrency N  BullMQ's worker concurrency
  --steady-secs N       memory_steady_load: how long (seconds)
  --steady-rate N       memory_steady_load: jobs created per second
  --steady-retention N  memory_steady_load: retention.finished (seconds)
  --steady-sample N     memory_steady_load: seconds between samples
  --help                this text; nothing runs
Without --only every scenario runs: a full run takes over half an hour.";

/// The flags that take a value (the one after them).
const VALUE_FLAGS: [&str; 7] = [
    "--only",
    "--runs",
    "--peer-concurrency",
    "--steady-secs",
    "--steady-rate",
    "--steady-retention",
    "--steady-sample",
];

/// The flags that stand alone (`--bench` is cargo's, passed to every
/// benchmark target).
const SWITCHES: [&str; 4] = ["--quick", "--peers", "--bench", "--help"];

impl Options {
    /// The options of `args` (the program's name first), or an error naming
    /// the flag that is unknown, lacks its value or has one that is not a
    /// whole number: a mistyped flag must not start a run that takes half
    /// an hour.
    fn parse(args: &[String]) -> Result<Options, String> {
        let mut rest = args.iter().skip(1);
        while let Some(arg) = rest.next() {
            if VALUE_FLAGS.contains(&arg.as_str()) {
                if rest.next().is_none() {
                    return Err(format!("flag `{arg}` needs a value"));
                }
            } else if !SWITCHES.contains(&arg.as_str()) {
                return Err(format!("unknown argument `{arg}`"));
            }
        }
        let value = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
        };
        let number = |flag: &str| -> Result<Option<u64>, String> {
            value(flag)
                .map(|v| {
                    v.parse::<u64>()
                        .map_err(|_| format!("flag `{flag}`: `{v}` is not a whole number"))
                })
                .transpose()
        };
        let quick = args.iter().any(|a| a == "--quick");
        let mut steady = SteadyLoad::defaults(quick);
        if let Some(secs) = number("--steady-secs")? {
            steady.duration = Duration::from_secs(secs.max(1));
        }
        if let Some(rate) = number("--steady-rate")? {
            steady.rate = rate.max(1) as usize;
        }
        if let Some(secs) = number("--steady-retention")? {
            // hookq refuses a retention under a second.
            steady.retention = Duration::from_secs(secs.max(1));
        }
        if let Some(secs) = number("--steady-sample")? {
            steady.sample_every = Duration::from_secs(secs.max(1));
        }
        Ok(Options {
            quick,
            runs: number("--runs")?
                .map(|r| r.max(1) as usize)
                .unwrap_or(if quick { 1 } else { 3 }),
            only: value("--only")
                .map(|o| o.split(',').map(str::to_string).collect())
                .unwrap_or_default(),
            peers: args.iter().any(|a| a == "--peers"),
            peer_concurrency: number("--peer-concurrency")?
                .map(|c| c.max(1) as usize)
                .unwrap_or(BULLMQ_CONCURRENCY),
            steady,
        })
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
    if args.iter().any(|a| a == "--help") {
        println!("{USAGE}");
        return std::process::ExitCode::SUCCESS;
    }
    let opts = match Options::parse(&args) {
        Ok(opts) => opts,
        Err(e) => {
            eprintln!("bench: {e}\n\n{USAGE}");
            return std::process::ExitCode::from(2);
        }
    };
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
