//! What receivers and security reviewers see: Standard Webhooks signatures
//! checked by the official library, the SSRF guard, redirects, 410,
//! Retry-After, bounded response reading and per-host fairness.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::hanging::HangingHost;
use crate::support::receiver::{Receiver, Recorded, Reply};
use crate::support::redis::RedisServer;
use crate::support::{rfc3339_ms, wait_until};
use crate::{post_created, post_json, start_daemon, test_config};

pub(crate) const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const ROTATED: &str = "whsec_Vm9yc2ljaHQgYmVpbSBSb3RpZXJlbiEh";

/// A received request's headers and body.
type Signed = (Vec<(String, String)>, Vec<u8>);

/// Runs the official Python library over `requests`; one verdict per request.
pub(crate) fn verify_with_standardwebhooks(secret: &str, requests: &[Signed]) -> Vec<String> {
    let input = json!({
        "secret": secret,
        "requests": requests.iter().map(|(headers, body)| json!({
            "headers": headers.iter().cloned().collect::<std::collections::HashMap<_, _>>(),
            "body": String::from_utf8_lossy(body),
        })).collect::<Vec<_>>(),
    });
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/it/verify_standardwebhooks.py"
    );
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 runs (scripts/test.sh installs standardwebhooks)");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(input.to_string().as_bytes())
            .expect("write");
    }
    // Bounded: a hung interpreter fails the test instead of hanging it.
    let output =
        crate::wait_output_within(child, Duration::from_secs(60), "the standardwebhooks check");
    assert!(
        output.status.success(),
        "the standardwebhooks check failed to run"
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Asserts that the official library verifies every one of `requests`
/// (at least one) with `secret`.
pub(crate) fn assert_all_verify(secret: &str, requests: &[Recorded]) {
    let signed: Vec<_> = requests
        .iter()
        .map(|r| (headers_of(r), r.body.clone()))
        .collect();
    let verdicts = verify_with_standardwebhooks(secret, &signed);
    assert!(
        !verdicts.is_empty() && verdicts.iter().all(|v| v == "ok"),
        "{verdicts:?}"
    );
}

pub(crate) fn headers_of(r: &Recorded) -> Vec<(String, String)> {
    r.headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_string()))
        .collect()
}

/// A batch answered 200 with every item created (201).
fn assert_batch_created(status: u16, answer: &Value) {
    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().expect("results");
    let refused: Vec<&Value> = results.iter().filter(|r| r["status"] != 201).collect();
    assert!(
        refused.is_empty(),
        "{} of {} items not created, first: {}",
        refused.len(),
        results.len(),
        refused[0]
    );
}

#[tokio::test]
async fn signatures_verify_with_the_official_library() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let mut config = test_config(&redis);
    config.delivery.signing_secrets = vec![SECRET.into(), ROTATED.into()];
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    post_created(&format!("{base}/v1/jobs"), json!({"id": "signed-1", "url": receiver.url("/s"), "body": {"amount": 100, "note": "é ✓"}})).await;
    post_created(&format!("{base}/v1/jobs"), json!({"id": "signed-2", "url": receiver.url("/s"), "body_text": "a=1&b=2", "content_type": "application/x-www-form-urlencoded"})).await;
    let got = receiver.wait_for_count(2, Duration::from_secs(10)).await;
    for r in &got {
        let signature = r.headers["webhook-signature"].to_str().expect("ascii");
        assert_eq!(
            signature.split(' ').count(),
            2,
            "one signature per secret: {signature}"
        );
        assert!(r.headers.contains_key("webhook-timestamp"));
    }
    let requests: Vec<_> = got
        .iter()
        .map(|r| (headers_of(r), r.body.clone()))
        .collect();
    // Both the current and the rotated secret verify every request.
    for secret in [SECRET, ROTATED] {
        let verdicts = verify_with_standardwebhooks(secret, &requests);
        assert_eq!(verdicts, ["ok", "ok"], "secret {secret}");
    }
    // An altered body, or an unknown secret, fails verification.
    let mut tampered = requests.clone();
    tampered[0].1 = br#"{"amount": 1000000}"#.to_vec();
    let verdicts = verify_with_standardwebhooks(SECRET, &tampered);
    assert!(verdicts[0].starts_with("fail"), "{verdicts:?}");
    let other = "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    assert!(verify_with_standardwebhooks(other, &requests)
        .iter()
        .all(|v| v.starts_with("fail")));
    daemon.stop().await.expect("clean stop");
}

/// Per origin: each receiver verifies with its own secrets (one per master
/// secret, so rotation still works), which verify nothing sent to another
/// origin; the API and the CLI print the same secrets.
#[tokio::test]
async fn per_origin_secrets_verify_only_their_receivers_messages() {
    let redis = RedisServer::start();
    let (a, b) = (Receiver::ok().await, Receiver::ok().await);
    let mut config = test_config(&redis);
    config.delivery.signing_secrets = vec![SECRET.into(), ROTATED.into()];
    config.delivery.signing_mode = hookq::config::SigningMode::PerOrigin;
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    for (id, receiver) in [("to-a", &a), ("to-b", &b)] {
        post_created(
            &format!("{base}/v1/jobs"),
            json!({"id": id, "url": receiver.url("/hook"), "body": {"for": id}}),
        )
        .await;
    }
    let mut signed = Vec::new();
    for receiver in [&a, &b] {
        let got = receiver.wait_for_count(1, Duration::from_secs(10)).await;
        signed.push(
            got.iter()
                .map(|r| (headers_of(r), r.body.clone()))
                .collect::<Vec<_>>(),
        );
    }
    let (to_a, to_b) = (signed[0].clone(), signed[1].clone());
    let secrets_of = |url: String| {
        let base = base.clone();
        async move {
            let (status, answer) =
                crate::get_json(&format!("{base}/v1/signing-secret?url={url}")).await;
            assert_eq!(status, 200, "{answer}");
            answer["secrets"]
                .as_array()
                .expect("secrets")
                .iter()
                .map(|s| s.as_str().expect("text").to_string())
                .collect::<Vec<_>>()
        }
    };
    let a_secrets = secrets_of(a.url("/other/path")).await;
    let b_secrets = secrets_of(b.url("/")).await;
    assert_eq!(a_secrets.len(), 2);
    for secret in &a_secrets {
        assert_eq!(verify_with_standardwebhooks(secret, &to_a), ["ok"]);
        assert!(verify_with_standardwebhooks(secret, &to_b)[0].starts_with("fail"));
    }
    for secret in &b_secrets {
        assert_eq!(verify_with_standardwebhooks(secret, &to_b), ["ok"]);
        assert!(verify_with_standardwebhooks(secret, &to_a)[0].starts_with("fail"));
    }
    // The master secrets themselves verify nothing.
    assert!(verify_with_standardwebhooks(SECRET, &to_a)[0].starts_with("fail"));
    // The CLI prints A's.
    let out = crate::output_within(
        {
            let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_hookq"));
            command
                .args(["signing-secret", &a.url("/")])
                .env("HOOKQ_REDIS__URL", redis.url())
                .env(
                    "HOOKQ_DELIVERY__SIGNING_SECRETS",
                    format!("[\"{SECRET}\", \"{ROTATED}\"]"),
                )
                .env("HOOKQ_DELIVERY__SIGNING_MODE", "per_origin")
                .env_remove("HOOKQ_CONFIG");
            command
        },
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{out:?}");
    let printed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(printed, a_secrets);
    // An invalid URL names `url`.
    let (status, error) = crate::get_json(&format!("{base}/v1/signing-secret?url=ftp://x")).await;
    assert_eq!(status, 400, "{error}");
    assert_eq!(error["error"]["field"], "url");
    daemon.stop().await.expect("clean stop");
}

/// Trace context: a create's `traceparent` reaches every attempt with the
/// same trace id and a fresh span id (a batch's, every item's); its
/// `tracestate` goes along; a job without one, or with a malformed one,
/// gets a trace of its own; the view shows the trace id; another
/// `traceparent` on a re-create is the same job.
#[tokio::test]
async fn a_creators_trace_context_reaches_every_attempt() {
    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = format!("00-{TRACE}-00f067aa0ba902b7-01");
    let redis = RedisServer::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    // The first attempt of `traced` fails, so that two attempts arrive.
    let receiver = Receiver::start(Arc::new(move |r: &Recorded| {
        if r.path == "/traced" && counter.fetch_add(1, Ordering::SeqCst) == 0 {
            Reply::status(500)
        } else {
            Reply::status(204)
        }
    }))
    .await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let client = reqwest::Client::new();
    let create = |path: &str, body: Value, traceparent: Option<&str>| {
        let mut request = client.post(format!("{base}{path}")).json(&body);
        if let Some(tp) = traceparent {
            request = request
                .header("traceparent", tp)
                .header("tracestate", "vendor=abc");
        }
        request.send()
    };
    let created = create(
        "/v1/jobs",
        json!({"id": "traced", "url": receiver.url("/traced")}),
        Some(&parent),
    )
    .await
    .expect("create");
    assert_eq!(created.status(), 201);
    let view: Value = created.json().await.expect("view");
    assert_eq!(view["trace_id"], TRACE);
    let batch = create(
        "/v1/jobs/batch",
        json!({"jobs": [{"id": "b-1", "url": receiver.url("/b")}, {"id": "b-2", "url": receiver.url("/b")}]}),
        Some(&parent),
    )
    .await
    .expect("batch");
    assert_eq!(batch.status(), 200);
    let mut own_traces = std::collections::HashMap::new();
    for (id, tp) in [("untraced", None), ("malformed", Some("00-zz-not-a-trace"))] {
        let answer = create(
            "/v1/jobs",
            json!({"id": id, "url": receiver.url("/own")}),
            tp,
        )
        .await
        .expect("create");
        assert_eq!(
            answer.status(),
            201,
            "a malformed traceparent is ignored, never refused"
        );
        let view: Value = answer.json().await.expect("view");
        own_traces.insert(id, view["trace_id"].as_str().expect("trace id").to_string());
    }
    let got = receiver.wait_for_count(6, Duration::from_secs(15)).await;
    let trace_of = |r: &Recorded| -> (String, String) {
        let tp = r
            .header("traceparent")
            .expect("every attempt has a traceparent");
        let parts: Vec<&str> = tp.split('-').collect();
        assert_eq!((parts.len(), parts[0], parts[3]), (4, "00", "01"), "{tp}");
        (parts[1].to_string(), parts[2].to_string())
    };
    let mut spans = std::collections::HashSet::new();
    for r in &got {
        let (trace, span) = trace_of(r);
        assert!(spans.insert(span.clone()), "span {span} sent twice");
        assert_ne!(span, "00f067aa0ba902b7");
        let id = r.header("webhook-id").expect("id");
        if ["traced", "b-1", "b-2"].contains(&id) {
            assert_eq!(trace, TRACE, "{id}");
            assert_eq!(r.header("tracestate"), Some("vendor=abc"));
        } else {
            assert_ne!(trace, TRACE, "{id}");
            assert_eq!(r.header("tracestate"), None);
            assert_eq!(
                own_traces[id], trace,
                "{id}: the view showed the attempts' trace"
            );
        }
    }
    assert_eq!(got.iter().filter(|r| r.path == "/traced").count(), 2);
    // A re-create with another trace context is the same job.
    let again = create(
        "/v1/jobs",
        json!({"id": "untraced", "url": receiver.url("/own")}),
        Some(&parent),
    )
    .await
    .expect("re-create");
    assert_eq!(again.status(), 200);
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn private_targets_are_refused_and_dead_lettered_at_once() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let port = receiver
        .url("/")
        .split(':')
        .nth(2)
        .and_then(|p| p.split('/').next())
        .expect("port")
        .to_string();
    let mut config = test_config(&redis);
    config.delivery.allow_private = false;
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    // Loopback targets only: were the guard to fail, a test must still send
    // nothing beyond this machine. The private, link-local (metadata) and
    // other classes are held by the unit tests of `delivery::ssrf`.
    let targets = [
        ("lit-v4", format!("http://127.0.0.1:{port}/")),
        ("name", format!("http://localhost:{port}/")),
        ("lit-v6", format!("http://[::1]:{port}/")),
        ("mapped", format!("http://[::ffff:127.0.0.1]:{port}/")),
        ("other-loopback", format!("http://127.0.0.2:{port}/")),
    ];
    for (id, url) in &targets {
        let (status, body) =
            post_json(&format!("{base}/v1/jobs"), json!({"id": id, "url": url})).await;
        assert_eq!(status, 201, "{body}");
    }
    for (id, _) in &targets {
        let view = crate::wait_state(&base, id, "dead").await;
        assert_eq!(view["attempts"], 1, "{id}: no retry for a refused target");
        assert_eq!(view["history"][0]["error"], "ssrf_blocked", "{id}: {view}");
    }
    assert_eq!(receiver.count(), 0, "nothing reached the loopback receiver");
    daemon.stop().await.expect("clean stop");

    // An allowlisted range lets the same loopback target through.
    let mut config = test_config(&redis);
    config.redis.namespace = "allow".into();
    config.delivery.allow_private = false;
    config.delivery.allow_cidrs = vec!["127.0.0.0/8".into()];
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "allowed", "url": format!("http://localhost:{port}/ok")}),
    )
    .await;
    receiver.wait_for_count(1, Duration::from_secs(10)).await;
    crate::wait_state(&base, "allowed", "delivered").await;
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn redirects_are_failures_and_410_is_final() {
    let redis = RedisServer::start();
    let receiver = Receiver::start(Arc::new(|r: &Recorded| match r.path.as_str() {
        "/moved" => Reply {
            status: 302,
            headers: vec![("location".into(), "/elsewhere".into())],
            body: Vec::new(),
            delay: None,
        },
        "/far" => Reply {
            status: 301,
            headers: vec![("location".into(), format!("/{}", "x".repeat(300_000)))],
            body: Vec::new(),
            delay: None,
        },
        "/gone" => Reply::status(410),
        _ => Reply::status(200),
    }))
    .await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    // A receiver's huge Location is kept cut to 1 KiB, in the attempt and
    // in its error text.
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "far", "url": receiver.url("/far"), "retry": []}),
    )
    .await;
    let far = crate::wait_state(&base, "far", "dead").await;
    let attempt = &far["history"][0];
    let location = attempt["location"].as_str().expect("location kept");
    assert!(
        location.starts_with("/xxx") && location.len() <= 1024 + 3,
        "{} bytes",
        location.len()
    );
    assert!(
        attempt.to_string().len() < 4096,
        "{} bytes",
        attempt.to_string().len()
    );
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "redir", "url": receiver.url("/moved"), "retry": []}),
    )
    .await;
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "gone", "url": receiver.url("/gone")}),
    )
    .await;
    let redir = crate::wait_state(&base, "redir", "dead").await;
    assert_eq!(redir["history"][0]["error"], "redirect");
    assert_eq!(redir["history"][0]["location"], "/elsewhere");
    let gone = crate::wait_state(&base, "gone", "dead").await;
    assert_eq!(
        gone["attempts"], 1,
        "410 is not retried although rungs are left"
    );
    assert!(
        receiver.requests().iter().all(|r| r.path != "/elsewhere"),
        "the redirect was followed"
    );
    daemon.stop().await.expect("clean stop");
}

/// The delay the daemon scheduled after job `id`'s first (failed) attempt,
/// in ms, read while the job waits for its second: the failure script sets
/// the next due time and `updated_at` from one reading of Redis's clock,
/// so their difference is the delay exactly. Waits up to 20 s.
async fn delay_after_first_attempt(base: &str, id: &str) -> i64 {
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let view = crate::job_view(base, id).await;
        if view["attempts"] == 1 && view["state"] == "scheduled" {
            if let (Some(next), Some(updated)) = (
                view["next_attempt_at"].as_str(),
                view["updated_at"].as_str(),
            ) {
                return rfc3339_ms(next) - rfc3339_ms(updated);
            }
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{id} was not seen waiting for its second attempt: {view}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A 429/503 with `Retry-After` (seconds or HTTP date) delays the next
/// attempt to at least that, capped at the ladder's last rung (README,
/// "Outcome"; SPEC §4): 1 s asked gives exactly 1 s, an hour asked exactly
/// the last rung (1.5 s). Each job is attempted exactly twice.
#[tokio::test]
async fn retry_after_delays_the_next_attempt_within_the_ladder() {
    let redis = RedisServer::start();
    // Requests received, over all three receivers.
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let responder = Arc::new(move |r: &Recorded| {
        seen.fetch_add(1, Ordering::SeqCst);
        let first = r.headers["hookq-attempt"] == "1";
        let retry_after = match r.path.as_str() {
            "/seconds" => "1".to_string(),
            "/date" => {
                httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(2))
            }
            _ => "3600".to_string(),
        };
        if first {
            Reply {
                status: if r.path == "/date" { 429 } else { 503 },
                headers: vec![("retry-after".into(), retry_after)],
                body: Vec::new(),
                delay: None,
            }
        } else {
            Reply::status(200)
        }
    });
    // One host per case: a Retry-After also pauses its whole host (SPEC
    // §11.1), capped at `breaker.max_open`.
    let receivers = [
        Receiver::start(responder.clone()).await,
        Receiver::start(responder.clone()).await,
        Receiver::start(responder).await,
    ];
    let mut config = test_config(&redis);
    let last_rung = Duration::from_millis(1500);
    config.delivery.retry = vec![Duration::from_millis(50), last_rung];
    config.breaker.open_for = Duration::from_secs(1);
    config.breaker.max_open = last_rung;
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    for ((id, path), receiver) in [
        ("ra-seconds", "/seconds"),
        ("ra-date", "/date"),
        ("ra-capped", "/capped"),
    ]
    .into_iter()
    .zip(&receivers)
    {
        post_created(
            &format!("{base}/v1/jobs"),
            json!({"id": id, "url": receiver.url(path)}),
        )
        .await;
    }
    // Rung 1 is 50 ms; Retry-After raises it to what was asked, and an hour
    // asked is cut to the ladder's last rung.
    let (seconds, capped) = tokio::join!(
        delay_after_first_attempt(&base, "ra-seconds"),
        delay_after_first_attempt(&base, "ra-capped"),
    );
    assert_eq!(
        seconds, 1000,
        "Retry-After: 1 gave the next attempt a delay of {seconds} ms"
    );
    assert_eq!(
        capped,
        last_rung.as_millis() as i64,
        "Retry-After: 3600 is capped at the ladder's last rung"
    );
    let mut got = Vec::new();
    for receiver in &receivers {
        got.extend(receiver.wait_for_count(2, Duration::from_secs(20)).await);
    }
    let gap = |path: &str| {
        let times: Vec<_> = got
            .iter()
            .filter(|r| r.path == path)
            .map(|r| r.received_at)
            .collect();
        times[1].duration_since(times[0]).expect("ordered")
    };
    assert!(
        gap("/seconds") >= Duration::from_millis(1000),
        "{:?}",
        gap("/seconds")
    );
    assert!(
        gap("/date") >= Duration::from_millis(1000),
        "{:?}",
        gap("/date")
    );
    // The host's pause is capped at breaker.max_open (1.5 s) too.
    assert!(gap("/capped") >= last_rung, "{:?}", gap("/capped"));
    for id in ["ra-seconds", "ra-date", "ra-capped"] {
        let view = crate::wait_state(&base, id, "delivered").await;
        assert_eq!(view["attempts"], 2, "{id}: {view}");
    }
    // Every job delivered on its second attempt, and no attempt after that
    // can start (each finished with two attempts claimed): every request
    // has arrived, and there are exactly two per job.
    assert_eq!(
        calls.load(Ordering::SeqCst),
        6,
        "requests received for three jobs of two attempts each"
    );
    daemon.stop().await.expect("clean stop");
}

/// A server whose response body never ends (or is 10 MiB), sent slowly.
async fn streaming_server(endless: bool) -> String {
    use axum::body::Body;
    use futures_util::stream;
    let app = axum::Router::new().fallback(move || async move {
        let chunk = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
        let limit = if endless { usize::MAX } else { 160 }; // 160 x 64 KiB = 10 MiB
        let body = stream::iter((0..limit).map(move |_| Ok::<_, std::io::Error>(chunk.clone())));
        axum::response::Response::new(Body::from_stream(body))
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/stream")
}

#[tokio::test]
async fn huge_and_endless_responses_are_read_only_to_the_cap() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    // The history keeps the response prefix (a summary keeps no response).
    config.retention.keep_bodies = true;
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let huge = streaming_server(false).await;
    let endless = streaming_server(true).await;
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "huge", "url": huge}),
    )
    .await;
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "endless", "url": endless}),
    )
    .await;
    // An endless body would never finish if it were read to the end; the
    // attempt ends after 1 KiB and is delivered well within its 2 s timeout.
    for id in ["huge", "endless"] {
        let view = crate::wait_state(&base, id, "delivered").await;
        assert_eq!(view["history"][0]["status"], 200, "{view}");
        let kept = view["history"][0]["response"]
            .as_str()
            .expect("response prefix")
            .len();
        assert_eq!(kept, 1024, "{id}: the history keeps exactly the cap");
        assert!(
            view["history"][0]["duration_ms"].as_u64().expect("ms") < 2000,
            "{view}"
        );
    }
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_hanging_host_does_not_hold_up_a_healthy_one() {
    let redis = RedisServer::start();
    let hanging = Receiver::slow(200, Duration::from_secs(60)).await;
    let healthy = Receiver::ok().await;
    let mut config = test_config(&redis);
    config.delivery.workers = 16;
    config.delivery.per_host_concurrency = 4;
    config.delivery.timeout = Duration::from_secs(3);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();

    // 200 jobs to the hanging host first, then 1,000 to the healthy one.
    let hang_jobs: Vec<Value> = (0..200)
        .map(|i| json!({"id": format!("hang-{i}"), "url": hanging.url("/h")}))
        .collect();
    let (status, answer) =
        post_json(&format!("{base}/v1/jobs/batch"), json!({"jobs": hang_jobs})).await;
    assert_batch_created(status, &answer);
    let started = Instant::now();
    let good_jobs: Vec<Value> = (0..1000)
        .map(|i| json!({"id": format!("good-{i}"), "url": healthy.url("/g")}))
        .collect();
    let (status, answer) =
        post_json(&format!("{base}/v1/jobs/batch"), json!({"jobs": good_jobs})).await;
    assert_batch_created(status, &answer);
    healthy.wait_for_count(1000, Duration::from_secs(60)).await;
    let took = started.elapsed();
    eprintln!(
        "1,000 jobs to a healthy host behind 200 to a hanging one (16 workers, 4 per host): all delivered in {took:?}; hanging host saw {} requests",
        hanging.count()
    );
    // At most 4 attempts at a time reach the hanging host; each lasts the 3 s timeout.
    let windows = took.as_secs() / 3 + 2;
    assert!(
        hanging.count() as u64 <= 4 * windows,
        "{} attempts reached the hanging host in {took:?}",
        hanging.count()
    );
    daemon.stop().await.expect("clean stop");
}

/// Proxy variables in the daemon's environment are ignored: a proxy would
/// see (and could redirect) every delivery, and would bypass the SSRF guard's
/// check of the target's own address. A fake proxy that counts connections
/// must see none while the job reaches its receiver directly.
#[tokio::test]
async fn proxy_variables_in_the_environment_are_ignored() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    // Accepted connections are held open and never answered.
    let proxy = HangingHost::start().await;
    let proxy_url = proxy.url("");
    let p = proxy_url.as_str();
    let env = [
        ("HTTP_PROXY", p),
        ("HTTPS_PROXY", p),
        ("ALL_PROXY", p),
        ("http_proxy", p),
        ("https_proxy", p),
        ("all_proxy", p),
        ("NO_PROXY", ""),
        ("no_proxy", ""),
        ("HOOKQ_DELIVERY__TIMEOUT", "2s"),
    ];
    let (_serve, base) = crate::ops::serve_ready(&redis, &env).await;
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "direct", "url": receiver.url("/direct")}),
    )
    .await;
    wait_until(
        "the receiver or the proxy is reached",
        Duration::from_secs(15),
        || async { receiver.count() > 0 || proxy.accepted() > 0 },
    )
    .await;
    assert_eq!(
        proxy.accepted(),
        0,
        "a delivery went through the proxy from the environment"
    );
    let view = crate::wait_state(&base, "direct", "delivered").await;
    assert_eq!(view["attempts"], 1, "{view}");
    assert_eq!(receiver.count(), 1);
    assert_eq!(proxy.accepted(), 0, "the proxy saw nothing");
}

/// `GET /v1/signing-secret` prints no secret it should not: 409 `unsigned`
/// when nothing is signed, 409 `signing_mode_shared` in shared mode (the
/// receivers' secrets are then the configured ones).
#[tokio::test]
async fn receiver_secrets_are_refused_when_unsigned_or_shared() {
    let redis = RedisServer::start();
    let mut config = crate::test_config(&redis);
    let unsigned = crate::start_daemon(&config).await;
    let (status, answer) = crate::get_json(&format!(
        "{}/v1/signing-secret?url=http://127.0.0.1:9/",
        unsigned.url()
    ))
    .await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (409, &serde_json::json!("unsigned")),
        "{answer}"
    );
    unsigned.stop().await.expect("clean stop");
    config.delivery.signing_secrets = vec![SECRET.into()];
    let shared = crate::start_daemon(&config).await;
    let (status, answer) = crate::get_json(&format!(
        "{}/v1/signing-secret?url=http://127.0.0.1:9/",
        shared.url()
    ))
    .await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (409, &serde_json::json!("signing_mode_shared")),
        "{answer}"
    );
    assert!(!answer.to_string().contains("whsec_"), "{answer}");
    shared.stop().await.expect("clean stop");
}
