//! The ingest scenarios: jobs created through the API in batches and one
//! request each (from in-process clients, with and without a replica
//! acknowledging every write), and single creates driven by wrk.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hookq::daemon::Daemon;
use serde_json::{json, Value};

use crate::common::config;
use crate::support::redis::RedisServer;
use crate::{Figures, Res};

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

/// A replica of `redis` on loopback, once it is in sync.
async fn replica_of(redis: &RedisServer) -> Res<RedisServer> {
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &redis.port().to_string()]);
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let mut conn = replica.conn().await;
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await?;
        if info.contains("master_link_status:up") {
            return Ok(replica);
        }
        if Instant::now() > until {
            return Err("the replica did not sync within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates `n` jobs through the batch API (1,000 per request, 4 clients);
/// with `acked`, a replica runs and every write waits for it
/// (`redis.ack_replicas = 1`).
pub async fn ingest_batch(redis: &RedisServer, n: usize, acked: bool) -> Res<Figures> {
    redis.flush().await?;
    let mut cfg = config(redis);
    let replica = if acked {
        cfg.redis.ack_replicas = 1;
        Some(replica_of(redis).await?)
    } else {
        None
    };
    let daemon = Daemon::start(cfg).await?;
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
    drop(replica);
    Ok(HashMap::from([(
        "jobs_per_s",
        (batches * 1000) as f64 / took,
    )]))
}

/// Creates `n` jobs one request each (32 clients); with `acked`, each
/// waits for a replica as in [`ingest_batch`].
pub async fn ingest_single(redis: &RedisServer, n: usize, acked: bool) -> Res<Figures> {
    redis.flush().await?;
    let mut cfg = config(redis);
    let replica = if acked {
        cfg.redis.ack_replicas = 1;
        Some(replica_of(redis).await?)
    } else {
        None
    };
    let daemon = Daemon::start(cfg).await?;
    let bodies: Vec<String> = (0..n)
        .map(|i| json!({"id": format!("is-{i}"), "url": "http://127.0.0.1:9/", "delay": "1h", "body": {"n": i}}).to_string())
        .collect();
    let took = post_all(&format!("{}/v1/jobs", daemon.url()), bodies, 32, 201).await?;
    daemon.stop().await?;
    drop(replica);
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
pub async fn ingest_single_wrk(redis: &RedisServer, seconds: u64) -> Res<Figures> {
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
