//! What the second security review (issue 35) asked of the transport,
//! authentication, configuration and alerts, end to end against a real
//! daemon, Redis and receivers: a trickled request is cut at its total
//! deadline and gives its connection slot back; without tokens a web page
//! of another origin cannot change anything, body or no body; `/metrics`
//! needs a read key once keys are configured; a config error never shows
//! a URL's password; alerts verify with `alerts.signing_secret` whatever
//! the signing mode.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::support::receiver::Receiver;
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{post_json, start_daemon, test_config};

/// Added to every bound computed from the config: the time a loaded
/// machine (two cores shared with builds) may take to schedule the timer,
/// answer and read the answer.
const SLACK: Duration = Duration::from_secs(3);

/// How often the trickling clients send their next byte: well under every
/// timeout of these tests, so a timer that restarts on each byte never
/// fires.
const DRIP: Duration = Duration::from_millis(100);

/// What a trickling connection saw: how long after its first trickled
/// byte the server answered or closed, and what it answered.
struct Cut {
    after: Duration,
    answer: String,
}

/// Sends `head` on `stream`, then one byte of `drip` every [`DRIP`] until
/// the server answers and closes (or the bytes run out); fails unless that
/// happens within `within` of the head. A write the server refuses (it
/// closed) ends the sending, not the reading.
async fn trickle(mut stream: TcpStream, head: &[u8], drip: &[u8], within: Duration) -> Cut {
    stream.write_all(head).await.expect("the head is sent");
    let start = Instant::now();
    let mut ticks = tokio::time::interval(DRIP);
    let mut left = drip.iter();
    let mut seen = Vec::new();
    loop {
        let mut buf = [0u8; 4096];
        tokio::select! {
            _ = ticks.tick() => {
                if let Some(byte) = left.next() {
                    let _ = stream.write_all(std::slice::from_ref(byte)).await;
                }
            }
            read = stream.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    return Cut {
                        after: start.elapsed(),
                        answer: String::from_utf8_lossy(&seen).into_owned(),
                    }
                }
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            },
            _ = tokio::time::sleep_until(start + within) => panic!(
                "the trickling connection was not cut within {within:?}; it saw: {}",
                String::from_utf8_lossy(&seen)
            ),
        }
    }
}

/// The head of a JSON POST announcing a body of `len` bytes.
fn post_head(len: usize) -> Vec<u8> {
    format!(
        "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
    )
    .into_bytes()
}

/// Whether a connection to `addr` is closed unanswered at once (every
/// connection slot is taken) rather than served `/healthz`.
async fn refused_at_once(addr: SocketAddr) -> bool {
    let mut stream = TcpStream::connect(addr).await.expect("the kernel accepts");
    let _ = stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await;
    let mut buf = [0u8; 256];
    matches!(
        tokio::time::timeout(SLACK, stream.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// `api.body_timeout` bounds the whole body, not the gap between its
/// bytes: `max_connections` clients each announce a 600-byte body and
/// trickle it a byte per 100 ms (a gap timer of 500 ms would never fire and
/// hold every slot for the 60 s the bodies take). Each is answered 408
/// `body_timeout` between body_timeout and body_timeout + slack after its
/// head, and `/healthz`, refused while they hold every slot, answers
/// within that bound too.
#[tokio::test]
async fn a_trickled_body_is_cut_at_body_timeout_and_frees_its_slot() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.api.body_timeout = Duration::from_millis(500);
    // Only the body's deadline may cut these connections.
    config.api.header_timeout = Duration::from_secs(60);
    config.api.idle_timeout = Duration::from_secs(60);
    config.api.max_connections = 4;
    let daemon = start_daemon(&config).await;
    let addr = daemon.addr();
    let bound = config.api.body_timeout + SLACK;
    let body = vec![b' '; 600];
    let mut trickles = Vec::new();
    for _ in 0..config.api.max_connections {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let body = body.clone();
        trickles.push(tokio::spawn(async move {
            // Longer than `bound`: the slot check below fails first.
            trickle(stream, &post_head(body.len()), &body, bound + SLACK).await
        }));
    }
    // Connected before the probe, so accepted before it: they hold every
    // slot (each for at least body_timeout).
    let probed = Instant::now();
    assert!(
        refused_at_once(addr).await,
        "the trickling clients hold every slot"
    );
    wait_until(
        "/healthz answers once the trickles are cut",
        bound,
        || async {
            reqwest::get(format!("http://{addr}/healthz"))
                .await
                .is_ok_and(|r| r.status() == 200)
        },
    )
    .await;
    assert!(probed.elapsed() < bound, "{:?}", probed.elapsed());
    for trickle in trickles {
        let cut = trickle.await.expect("the trickle ran");
        assert!(
            cut.answer.starts_with("HTTP/1.1 408") && cut.answer.contains("body_timeout"),
            "{}",
            cut.answer
        );
        assert!(
            cut.after >= config.api.body_timeout && cut.after < bound,
            "cut after {:?}",
            cut.after
        );
    }
    daemon.stop().await.expect("clean stop");
}

/// A request's head has a total deadline (`api.header_timeout`), and a
/// connection with no request in progress is closed `api.idle_timeout`
/// after it was accepted or its last request ended, however it trickles:
/// a head sent a byte per 100 ms never ends, and is cut by whichever of the
/// two is the shorter (500 ms, the other 60 s), within that + slack; also
/// when it is the second request of a kept-alive connection, the first
/// answered.
#[tokio::test]
async fn a_trickled_head_is_cut_at_header_or_idle_timeout() {
    let redis = RedisServer::start();
    let short = Duration::from_millis(500);
    let long = Duration::from_secs(60);
    let head = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    let served_then_head = format!("{head}\r\n{head}");
    let drip = [b"X-Drip: ".as_slice(), &[b'x'; 600]].concat();
    for (header_timeout, idle_timeout, sent, answered) in [
        (short, long, head.to_string(), 0),
        (long, short, head.to_string(), 0),
        (long, short, served_then_head, 1),
    ] {
        let mut config = test_config(&redis);
        config.api.header_timeout = header_timeout;
        config.api.idle_timeout = idle_timeout;
        config.api.body_timeout = long;
        let daemon = start_daemon(&config).await;
        let stream = TcpStream::connect(daemon.addr()).await.expect("connect");
        let cut = trickle(stream, sent.as_bytes(), &drip, short + SLACK).await;
        assert_eq!(
            cut.answer.matches("HTTP/1.1 200").count(),
            answered,
            "header {header_timeout:?}, idle {idle_timeout:?}: {}",
            cut.answer
        );
        daemon.stop().await.expect("clean stop");
    }
}

/// The path segment of `receiver`'s host in `/v1/hosts/{host}`.
fn host_path(receiver: &Receiver) -> String {
    let host = format!("http://{}", receiver.addr());
    url::form_urlencoded::byte_serialize(host.as_bytes()).collect()
}

/// Sends `method` to `url` with `headers` (and a JSON `body` if any);
/// the status and the JSON answer.
async fn send(
    method: reqwest::Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new().request(method, url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request is sent");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Without tokens, a change sent by a page of another origin is refused
/// 403 `forbidden` naming `origin`, body or no body: pausing a host or a
/// schedule, resuming, creating a job, with `Origin: http://evil.example`
/// (a header value only: nothing leaves loopback), `Origin: null`, a page
/// on another port of localhost (`same-site`), or `Sec-Fetch-Site:
/// cross-site` alone. Nothing changes. The daemon's own origin (as the
/// console sends it, in each form) and no `Origin` at all (curl) are
/// served, and reads are never refused.
#[tokio::test]
async fn without_tokens_changes_from_another_origin_are_refused() {
    use reqwest::Method;
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let port = daemon.addr().port();
    let (status, answer) = post_json(
        &format!("{base}/v1/schedules"),
        json!({"id": "s", "every": "1h", "job": {"url": receiver.url("/s")}}),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let host = format!("{base}/v1/hosts/{}", host_path(&receiver));
    let next_port = format!("http://localhost:{}", port + 1);
    let foreign: [&[(&str, &str)]; 5] = [
        &[("origin", "http://evil.example")],
        &[
            ("origin", "http://evil.example"),
            ("sec-fetch-site", "cross-site"),
        ],
        &[("origin", "null")],
        &[("origin", &next_port), ("sec-fetch-site", "same-site")],
        &[("sec-fetch-site", "cross-site")],
    ];
    let changes = [
        (Method::POST, format!("{host}/pause"), None),
        (Method::POST, format!("{base}/v1/schedules/s/pause"), None),
        (Method::POST, format!("{base}/v1/schedules/s/resume"), None),
        (Method::DELETE, format!("{base}/v1/schedules/s"), None),
        (
            Method::POST,
            format!("{base}/v1/jobs"),
            Some(json!({"id": "j", "url": receiver.url("/j"), "delay": "1h"})),
        ),
    ];
    for headers in foreign {
        for (method, url, body) in &changes {
            let (status, answer) = send(method.clone(), url, headers, body.clone()).await;
            assert_eq!(
                (status, &answer["error"]["code"], &answer["error"]["field"]),
                (403, &json!("forbidden"), &json!("origin")),
                "{method} {url} {headers:?}: {answer}"
            );
        }
    }
    let state = |url: String| async move { send(Method::GET, &url, &[], None).await };
    let (_, view) = state(host.clone()).await;
    assert_ne!(view["state"], "paused", "{view}");
    let (_, view) = state(format!("{base}/v1/schedules/s")).await;
    assert_eq!(view["state"], "active", "{view}");
    let (status, _) = state(format!("{base}/v1/jobs/j")).await;
    assert_eq!(status, 404);
    // A read from another origin is served (the page cannot read it).
    let (status, _) = send(
        Method::GET,
        &format!("{base}/v1/schedules/s"),
        &[("origin", "http://evil.example")],
        None,
    )
    .await;
    assert_eq!(status, 200);

    // The daemon's own origin, in each of its forms, and no Origin.
    let own = format!("http://127.0.0.1:{port}");
    let localhost = format!("http://localhost:{port}");
    for (url, headers, state_after) in [
        (
            format!("{base}/v1/schedules/s/pause"),
            vec![("origin", own.as_str()), ("sec-fetch-site", "same-origin")],
            "paused",
        ),
        (
            format!("{base}/v1/schedules/s/resume"),
            vec![("origin", localhost.as_str())],
            "active",
        ),
        (format!("{base}/v1/schedules/s/pause"), vec![], "paused"),
    ] {
        let (status, answer) = send(Method::POST, &url, &headers, None).await;
        assert_eq!(
            (status, &answer["state"]),
            (200, &json!(state_after)),
            "{url} {headers:?}: {answer}"
        );
    }
    let (status, answer) = send(
        Method::POST,
        &format!("{host}/pause"),
        &[("origin", own.as_str())],
        None,
    )
    .await;
    assert_eq!(
        (status, &answer["state"]),
        (200, &json!("paused")),
        "{answer}"
    );
    let (status, answer) = send(
        Method::POST,
        &format!("{base}/v1/jobs"),
        &[("origin", own.as_str())],
        Some(json!({"id": "j", "url": receiver.url("/j"), "delay": "1h"})),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    daemon.stop().await.expect("clean stop");
}

/// With `[[api.keys]]` or `api.tokens`, `/metrics` needs a key with the
/// read scope: 401 without a known token, 403 for a key without `read`,
/// 200 with one (and with a token of `api.tokens`). `api.metrics_public`
/// opens it; without keys or tokens it is open.
#[tokio::test]
async fn metrics_need_a_read_key_once_keys_are_configured() {
    let redis = RedisServer::start();
    let (reader, read_key) = crate::security::new_key(&redis, "scraper", "read");
    let (writer, write_key) = crate::security::new_key(&redis, "producer", "write");
    let scrape = |base: String, token: Option<String>| async move {
        let mut request = reqwest::Client::new().get(format!("{base}/metrics"));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("sent");
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    };
    let mut config = test_config(&redis);
    config.api.keys = vec![read_key, write_key];
    config.api.tokens = vec!["a-token-of-api-tokens".into()];
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    for (token, status) in [
        (None, 401),
        (Some("not-a-known-token".to_string()), 401),
        (Some(writer.clone()), 403),
    ] {
        let (got, text) = scrape(base.clone(), token.clone()).await;
        assert_eq!(got, status, "{token:?}: {text}");
        assert!(!text.contains("hookq_"), "{text}");
    }
    for token in [reader.clone(), "a-token-of-api-tokens".to_string()] {
        let (got, text) = scrape(base.clone(), Some(token)).await;
        assert_eq!(got, 200, "{text}");
        assert!(text.contains("hookq_promoted_total"), "{text}");
    }
    daemon.stop().await.expect("clean stop");

    config.api.metrics_public = true;
    let daemon = start_daemon(&config).await;
    let (got, text) = scrape(daemon.url(), None).await;
    assert_eq!(got, 200, "api.metrics_public: {text}");
    daemon.stop().await.expect("clean stop");

    let daemon = start_daemon(&test_config(&redis)).await;
    let (got, text) = scrape(daemon.url(), None).await;
    assert_eq!(got, 200, "no keys: {text}");
    daemon.stop().await.expect("clean stop");
}

/// A config error that quotes a value which may hold a URL masks its
/// password: `redis.cluster_nodes` given as a string, a malformed
/// `alerts.url`, an unterminated `redis.url` string (TOML's excerpt), and
/// the cluster nodes from the environment. The real binary is started with
/// each; it exits 2 naming the key, and its stderr never has the password.
#[test]
fn config_errors_mask_url_passwords() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "[redis]\ncluster_nodes = \"redis://:S3cretPW@127.0.0.1:7000\"\n",
            None,
            "redis.cluster_nodes",
        ),
        (
            "[alerts]\nurl = \"http://alice:S3cretPW@alerts.example:99999/in\"\n",
            None,
            "alerts.url",
        ),
        (
            "[redis]\nurl = \"redis://:S3cretPW@127.0.0.1:7000\n",
            None,
            "line 2",
        ),
        (
            "",
            Some("rediss://admin:S3cretPW@127.0.0.1:7000"),
            "redis.cluster_nodes",
        ),
    ];
    for (i, (file, env_nodes, named)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("c{i}.toml"));
        std::fs::write(&path, file).expect("write");
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_hookq"));
        command
            .arg("--config")
            .arg(&path)
            .arg("serve")
            .env_remove("HOOKQ_CONFIG");
        if let Some(nodes) = env_nodes {
            command.env("HOOKQ_REDIS__CLUSTER_NODES", nodes);
        }
        let out = crate::output_within(command, Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{file}: {stderr}");
        assert!(stderr.contains(named), "{file}: {stderr}");
        assert!(!stderr.contains("S3cretPW"), "{file}: {stderr}");
        assert!(stderr.contains("***@"), "{file}: {stderr}");
    }
}

/// With `delivery.signing_mode = "per_origin"` (the jobs' receivers each
/// verify with a secret derived for their origin), alerts are still signed
/// with `alerts.signing_secret` itself: the alert receiver, which knows
/// only that, verifies them with the official Standard Webhooks library.
#[tokio::test]
async fn alerts_are_signed_with_their_own_secret_in_per_origin_mode() {
    use crate::delivery::{assert_all_verify, SECRET};
    let redis = RedisServer::start();
    let alerts = Receiver::ok().await;
    let receiver = Receiver::ok().await;
    let mut config = test_config(&redis);
    config.delivery.signing_secrets = vec![SECRET.into()];
    config.delivery.signing_mode = hookq::config::SigningMode::PerOrigin;
    config.alerts.url = alerts.url("/alerts");
    config.alerts.signing_secret = SECRET.into();
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let (status, answer) = post_json(
        &format!("{base}/v1/hosts/{}/pause", host_path(&receiver)),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    wait_until("the host.paused alert", Duration::from_secs(30), || async {
        alerts.requests().iter().any(|r| {
            r.json()
                .as_array()
                .is_some_and(|events| events.iter().any(|e| e["type"] == "host.paused"))
        })
    })
    .await;
    assert_all_verify(SECRET, &alerts.requests());
    daemon.stop().await.expect("clean stop");
}

/// A web page of another origin than the daemon's (same site: another
/// port of 127.0.0.1): an HTTP server of its own answering every path with
/// a small HTML page; its address and task.
async fn another_origins_page() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let app = axum::Router::new().fallback(|| async {
        axum::response::Html("<!doctype html><title>elsewhere</title><p>another origin</p>")
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the page's server");
    let addr = listener.local_addr().expect("its address");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, task)
}

/// In a real browser (headless Chromium), without tokens: a page of
/// another origin that POSTs to a host's pause (no body, `no-cors`, what
/// any page may send without asking) pauses nothing, since the browser
/// sends its `Origin` and `Sec-Fetch-Site`; the daemon's own page (the
/// console's origin) pauses the host with the same request.
#[tokio::test]
async fn a_page_of_another_origin_cannot_pause_a_host_in_a_real_browser() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let host = format!("{base}/v1/hosts/{}", host_path(&receiver));
    let (page, server) = another_origins_page().await;
    let browser = crate::support::browser::Browser::start().await;
    let post = format!(
        "const done = arguments[arguments.length - 1];
         fetch('{host}/pause', {{method: 'POST', mode: 'no-cors'}})
           .then((r) => done(r.type + ' ' + r.status), (e) => done('error ' + e));"
    );
    browser.goto(&format!("http://{page}/")).await;
    let sent = browser.eval_async(&post).await;
    assert_eq!(sent, "opaque 0", "the page's request went out");
    let (_, view) = send(reqwest::Method::GET, &host, &[], None).await;
    assert_ne!(view["state"], "paused", "{view}");
    browser.goto(&format!("{base}/ui")).await;
    let sent = browser.eval_async(&post).await;
    assert_eq!(sent, "basic 200", "the daemon's own page");
    let (_, view) = send(reqwest::Method::GET, &host, &[], None).await;
    assert_eq!(view["state"], "paused", "{view}");
    server.abort();
    daemon.stop().await.expect("clean stop");
}
