//! Abuse of the API: thousands of random and malformed requests (random
//! methods and paths, broken and deeply nested JSON, invalid UTF-8, huge
//! headers, oversize bodies, wrong content types, numeric edges) and clients
//! that send their body a byte at a time, while valid traffic keeps flowing.
//! No request may get a 5xx, valid requests must succeed throughout, and the
//! memory of the daemon (a real `hookq serve` process) must stay bounded.
//! `HOOKQ_ABUSE_REQUESTS` sets the count (default 10,000).

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::ops::{base_url, free_port, spawn_serve, wait_ready};
use crate::support::redis::RedisServer;

/// Resident memory of process `pid` in KiB (the daemon runs alone in it, so
/// the tests running beside this one do not count); panics if it cannot be
/// read, so an unreadable `/proc` cannot pass the memory bound.
pub(crate) fn rss_kib(pid: u32) -> u64 {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {path} to measure the daemon's memory: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in {path}:\n{status}"))
}

const PATHS: &[&str] = &[
    "/v1/jobs",
    "/v1/jobs/batch",
    "/v1/jobs/x",
    "/v1/jobs/%00%ff",
    "/v1/jobs/..%2f..%2fetc",
    "/v1/stats",
    "/v1/dead-letters",
    "/v1/dead-letters/replay",
    "/v1/dead-letters/1-1",
    "/v1/jobs?state=nope&limit=-1",
    "/v1/jobs?limit=99999999999999999999",
    "/v1/jobs?cursor=%ff%fe",
    "/openapi.json",
    "/nope",
];

/// One random malformed request: (method, path, content type, body).
fn malformed(rng: &mut StdRng) -> (reqwest::Method, String, &'static str, Vec<u8>) {
    let methods = [
        reqwest::Method::GET,
        reqwest::Method::POST,
        reqwest::Method::PUT,
        reqwest::Method::PATCH,
        reqwest::Method::DELETE,
    ];
    let method = methods[rng.random_range(0..methods.len())].clone();
    let path = PATHS[rng.random_range(0..PATHS.len())].to_string();
    let content_type = [
        "application/json",
        "text/plain",
        "application/x-www-form-urlencoded",
        "",
    ][rng.random_range(0..4)];
    let body: Vec<u8> = match rng.random_range(0..10) {
        0 => (0..rng.random_range(0..300)).map(|_| rng.random()).collect(),
        1 => b"{\"url\": \"http://x/\", \"body\": \xff\xfe}".to_vec(),
        2 => "[".repeat(rng.random_range(1..100_000)).into_bytes(),
        3 => format!("{{\"url\":\"http://127.0.0.1:9/\",\"run_at\":{}}}", rng.random::<i64>()).into_bytes(),
        4 => format!("{{\"url\":\"http://127.0.0.1:9/\",\"delay\":\"{}s\"}}", rng.random::<u64>()).into_bytes(),
        5 => json!({"url": "http://127.0.0.1:9/", "retry": (0..rng.random_range(0..50)).map(|_| "1ms").collect::<Vec<_>>(), "timeout": "1e9s"}).to_string().into_bytes(),
        6 => json!({"jobs": (0..rng.random_range(0..1500)).map(|i| json!({"id": i})).collect::<Vec<_>>()}).to_string().into_bytes(),
        7 => vec![b'a'; rng.random_range(0..3 * 1024 * 1024)],
        8 => json!({"url": "http://127.0.0.1:9/", "headers": {"x-a": "b\r\nc", "webhook-id": "x"}, "id": "a".repeat(200)}).to_string().into_bytes(),
        _ => json!({"ids": [1, null, {}], "all": "yes", "since": -5}).to_string().into_bytes(),
    };
    (method, path, content_type, body)
}

/// Whether sending failed because the server closed the connection while
/// the body was still being written (a broken pipe or reset underneath): the
/// server answered without reading the whole body, as it may for a request
/// it refuses. Any other failure (refused connection, timeout, garbage
/// answer) is not this.
fn refused_mid_body(e: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            );
        }
        source = err.source();
    }
    false
}

/// A client that sends a create request's body one byte every 50 ms.
async fn slow_body(addr: std::net::SocketAddr, stop: tokio_util::sync::CancellationToken) {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return;
    };
    let body = json!({"url": "http://127.0.0.1:9/", "delay": "1h"}).to_string();
    let head = format!(
        "POST /v1/jobs HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len() + 10_000
    );
    if stream.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    for byte in body.bytes().cycle() {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        if stream.write_all(&[byte]).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn thousands_of_malformed_requests_get_no_5xx_and_valid_traffic_flows() {
    let requests = crate::env_count("HOOKQ_ABUSE_REQUESTS", 10_000);
    let redis = RedisServer::start();
    let port = free_port();
    let daemon = spawn_serve(&redis, port, &[]);
    wait_ready(port).await;
    let base = base_url(port);
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let rss_before = rss_kib(daemon.pid());

    let stop = tokio_util::sync::CancellationToken::new();
    let slow: Vec<_> = (0..50)
        .map(|_| tokio::spawn(slow_body(addr, stop.clone())))
        .collect();

    let seed: u64 = rand::rng().random();
    eprintln!("api abuse seed {seed}");
    // Valid traffic has its own connection pool: the server may close an
    // abusive connection (an oversize body answered 413 before it is read),
    // which must not fail an unrelated request that reuses it.
    let valid_client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let workers = 16;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (client, valid_client, base) = (client.clone(), valid_client.clone(), base.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed.wrapping_add(w as u64));
            let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
            let mut valid_ok = 0usize;
            for i in (w..requests).step_by(workers) {
                if i % 10 == 0 {
                    // Valid traffic, interleaved: a create and a read.
                    let id = format!("valid-{i}");
                    let r = valid_client
                        .post(format!("{base}/v1/jobs"))
                        .json(&json!({"id": id, "url": "http://127.0.0.1:9/", "delay": "1h"}))
                        .send()
                        .await
                        .expect("valid create is answered");
                    assert_eq!(r.status(), 201, "valid create");
                    let r = valid_client
                        .get(format!("{base}/v1/jobs/{id}"))
                        .send()
                        .await
                        .expect("valid read is answered");
                    assert_eq!(r.status(), 200, "valid read");
                    valid_ok += 2;
                    continue;
                }
                let (method, path, content_type, body) = malformed(&mut rng);
                let mut request = client.request(method.clone(), format!("{base}{path}"));
                if !content_type.is_empty() {
                    request = request.header("content-type", content_type);
                }
                if i % 97 == 0 {
                    request = request.header("x-huge", "h".repeat(64 * 1024));
                }
                if i % 89 == 0 {
                    for n in 0..200 {
                        request = request.header(format!("x-many-{n}"), "v");
                    }
                }
                let has_body = !body.is_empty();
                match request.body(body).send().await {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        assert!(status < 500, "{method} {path} answered {status}");
                        *statuses.entry(status).or_default() += 1;
                    }
                    // The one failure allowed: a request with a body (an
                    // oversize one, or one sent to a route or method that
                    // does not exist) refused by answering early and
                    // closing the connection while the client still writes
                    // the body (a broken pipe or reset underneath).
                    // Oversize headers are answered 431 once read; a
                    // timeout, a refused connection or a garbled answer
                    // fails the test.
                    Err(e) if has_body && refused_mid_body(&e) => {
                        *statuses.entry(0).or_default() += 1;
                    }
                    Err(e) => panic!("{method} {path}: {e:?}"),
                }
            }
            (statuses, valid_ok)
        }));
    }
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let mut valid_ok = 0;
    for task in tasks {
        let (s, v) = task.await.expect("worker");
        for (k, n) in s {
            *statuses.entry(k).or_default() += n;
        }
        valid_ok += v;
    }
    stop.cancel();
    for s in slow {
        let _ = s.await;
    }
    let rss_after = rss_kib(daemon.pid());
    eprintln!(
        "api abuse: {requests} requests, statuses {statuses:?} (0 = connection closed while the body was sent), \
         {valid_ok} valid requests served, RSS {} → {} MiB",
        rss_before / 1024,
        rss_after / 1024
    );
    assert!(statuses.keys().all(|s| *s < 500));
    let ready = reqwest::get(format!("{base}/readyz"))
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200, "the daemon is healthy afterwards");
    assert!(
        rss_after < rss_before + 300 * 1024,
        "memory grew from {rss_before} KiB to {rss_after} KiB"
    );
}
