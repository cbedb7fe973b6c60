//! Shared integration-test harness: a real `redis-server` per test
//! ([`redis::RedisServer`]), a real recording HTTP receiver
//! ([`receiver::Receiver`]), condition waits with deadlines, and test logging.
#![allow(dead_code)]

pub mod cluster;
pub mod process;
pub mod receiver;
pub mod redis;

use std::future::Future;
use std::time::Duration;

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
