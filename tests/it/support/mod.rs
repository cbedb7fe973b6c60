//! The one test kit, shared by the integration tests, the harness self-check
//! and the benchmark (`#[path]`-included): a free loopback port, a real
//! `redis-server` per test ([`redis::RedisServer`]) or a real cluster
//! ([`cluster::RedisCluster`]), a real recording HTTP receiver
//! ([`receiver::Receiver`]), a host that accepts and never answers
//! ([`hanging::HangingHost`]), a receiver that measures how many requests
//! are open at once ([`inflight::InFlightReceiver`]), processes owned down
//! to their grandchildren ([`process::OwnedProcess`]), a headless Chromium over WebDriver
//! ([`browser::Browser`]), condition waits with deadlines, claimed jobs
//! recorded as delivered ([`store::complete_claimed`]), and test logging.
#![allow(dead_code)]

pub mod browser;
pub mod cluster;
pub mod hanging;
pub mod inflight;
pub mod process;
pub mod receiver;
pub mod redis;
pub mod store;

use std::future::Future;
use std::net::TcpListener;
use std::time::Duration;

/// A loopback port that was free a moment ago (the OS picks it; never 6379,
/// the port of a Redis someone may run on this machine).
pub fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0 to pick a port");
        let port = listener
            .local_addr()
            .expect("local addr of a bound socket")
            .port();
        if port != 6379 {
            return port;
        }
    }
}

/// SIGKILLs every process of the process group `pgid` (a test's child that
/// was started as the leader of its own group). The group outlives its
/// leader, so grandchildren die even when the child itself has exited.
pub fn kill_process_group(pgid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// Polls `cond` every 5 ms until it holds; panics naming `what` once
/// `deadline` has passed.
pub async fn wait_until<F, Fut>(what: &str, deadline: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = tokio::time::Instant::now() + deadline;
    loop {
        if cond().await {
            return;
        }
        if tokio::time::Instant::now() >= until {
            panic!("timed out after {deadline:?} waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// An RFC 3339 time (as the API writes them) in milliseconds since the Unix
/// epoch; panics if `text` is not one.
pub fn rfc3339_ms(text: &str) -> i64 {
    let t = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .expect("RFC 3339 time");
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

/// Installs a `tracing` fmt subscriber for tests, once per process (later
/// calls do nothing); the filter comes from `RUST_LOG`, default `warn`.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}
