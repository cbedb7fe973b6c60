//! hookq's integration tests: one binary, a module per area. Every test owns a
//! real `redis-server` on a private port and real HTTP receivers on loopback,
//! and runs the daemon in-process on `127.0.0.1:0`.

mod support;

mod abuse;
mod api;
mod chaos;
mod cluster;
mod crash;
mod delivery;
mod engine;
mod ops;

use std::time::Duration;

use hookq::config::Config;
use hookq::daemon::Daemon;
use support::redis::RedisServer;

/// A config for tests: the given Redis, private targets allowed, an API on a
/// free port, and short timeouts and ladders.
pub fn test_config(redis: &RedisServer) -> Config {
    let mut config = Config::default();
    config.redis.url = redis.url();
    config.redis.partitions = 4;
    config.api.listen = "127.0.0.1:0".into();
    config.delivery.allow_private = true;
    config.delivery.timeout = Duration::from_secs(2);
    config.delivery.max_timeout = Duration::from_secs(5);
    config.delivery.lease_margin = Duration::from_millis(300);
    config.delivery.retry = vec![Duration::from_millis(50), Duration::from_millis(100)];
    config.delivery.shutdown_grace = Duration::from_secs(2);
    config.validate().expect("test config is valid");
    config
}

/// A size knob for the long variant of a test: the number in environment
/// variable `name`, or `default` (the short run of the normal suite).
pub fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Starts a daemon with `config`.
pub async fn start_daemon(config: &Config) -> Daemon {
    support::init_tracing();
    Daemon::start(config.clone()).await.expect("daemon starts")
}

/// POSTs `body` to `url` and returns the status and the JSON answer.
pub async fn post_json(url: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let response = reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .expect("request is sent");
    let status = response.status().as_u16();
    let json = response.json().await.unwrap_or(serde_json::Value::Null);
    (status, json)
}

/// GETs `url` and returns the status and the JSON answer.
pub async fn get_json(url: &str) -> (u16, serde_json::Value) {
    let response = reqwest::get(url).await.expect("request is sent");
    let status = response.status().as_u16();
    let json = response.json().await.unwrap_or(serde_json::Value::Null);
    (status, json)
}

/// Every key of the Redis with its DUMP, to prove a request changed nothing.
pub async fn redis_snapshot(redis: &RedisServer) -> std::collections::BTreeMap<String, Vec<u8>> {
    use redis::AsyncCommands;
    let mut conn = redis.conn().await;
    let keys: Vec<String> = conn.keys("*").await.expect("KEYS");
    let mut out = std::collections::BTreeMap::new();
    for key in keys {
        let dump: Vec<u8> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("DUMP");
        out.insert(key, dump);
    }
    out
}
