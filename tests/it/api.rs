//! The HTTP API against a real Redis and daemon: every route's happy path,
//! idempotency, races with the carrier, malformed input, auth and limits.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::receiver::Receiver;
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{get_json, job_view, post_json, start_daemon, test_config};

pub(crate) async fn send(method: reqwest::Method, url: &str, body: Option<Value>) -> (u16, Value) {
    let client = reqwest::Client::new();
    let mut request = client.request(method, url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request is sent");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn assert_error_shape(status: u16, body: &Value, context: &str) {
    assert!(
        (400..500).contains(&status),
        "{context}: status {status} {body}"
    );
    let error = &body["error"];
    assert!(error["code"].is_string(), "{context}: no code in {body}");
    assert!(
        error["message"].is_string(),
        "{context}: no message in {body}"
    );
    assert!(
        error.get("field").is_some(),
        "{context}: no field key in {body}"
    );
}

#[tokio::test]
async fn create_is_idempotent_by_id() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let url = format!("{}/v1/jobs", daemon.url());
    let job = json!({"id": "idem-1", "url": receiver.url("/x"), "delay": "1h", "body": {"a": 1}});

    let (first, view) = post_json(&url, job.clone()).await;
    assert_eq!(first, 201, "{view}");
    let (again, same) = post_json(&url, job.clone()).await;
    assert_eq!(again, 200, "{same}");
    assert_eq!(same["id"], "idem-1");
    assert_eq!(same["created_at"], view["created_at"]);
    let mut changed = job.clone();
    changed["body"] = json!({"a": 2});
    let (conflict, error) = post_json(&url, changed).await;
    assert_eq!(conflict, 409, "{error}");
    assert_eq!(error["error"]["code"], "conflict");
    assert_eq!(error["error"]["field"], "id");
    // The same job with another delay is another job: 409 too.
    let mut later = job.clone();
    later["delay"] = json!("2h");
    let (conflict, error) = post_json(&url, later).await;
    assert_eq!(conflict, 409, "a changed delay: {error}");
    assert_eq!(error["error"]["code"], "conflict");
    let (_, stored) = get_json(&format!("{}/v1/jobs/idem-1", daemon.url())).await;
    assert_eq!(
        stored["next_attempt_at"], view["next_attempt_at"],
        "the conflict changed nothing"
    );
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn every_route_works() {
    let redis = RedisServer::start();
    let receiver = Receiver::with_status(410).await;
    let mut config = test_config(&redis);
    config.redis.partitions = 2;
    let daemon = start_daemon(&config).await;
    let base = daemon.url();

    // Batch: results in request order, with each item's own status.
    let (status, batch) = post_json(
        &format!("{base}/v1/jobs/batch"),
        json!({"jobs": [
            {"id": "b-1", "url": receiver.url("/b"), "delay": "1h", "topic": "orders"},
            {"id": "b-2", "url": "not a url"},
            {"id": "b-1", "url": receiver.url("/b"), "delay": "1h", "topic": "orders"},
            {"id": "b-1", "url": receiver.url("/other"), "delay": "1h"},
            {"id": "b-3", "url": receiver.url("/b"), "delay": "2h"}
        ]}),
    )
    .await;
    assert_eq!(status, 200, "{batch}");
    let statuses: Vec<u64> = batch["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["status"].as_u64().expect("status"))
        .collect();
    assert_eq!(statuses, [201, 400, 200, 409, 201]);
    assert_eq!(batch["results"][1]["error"]["field"], "url");
    assert_eq!(batch["results"][0]["job"]["state"], "scheduled");

    // GET one.
    let (status, job) = get_json(&format!("{base}/v1/jobs/b-1")).await;
    assert_eq!((status, job["topic"].as_str()), (200, Some("orders")));

    // PATCH a scheduled job: new body and due time.
    let (status, patched) = send(
        reqwest::Method::PATCH,
        &format!("{base}/v1/jobs/b-3"),
        Some(json!({"body": {"v": 2}, "delay": "3h", "retry": ["1s"]})),
    )
    .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(patched["body"], json!({"v": 2}));
    assert_eq!(patched["max_attempts"], 2);
    assert_eq!(patched["state"], "scheduled");

    // List by state and topic, paging with a cursor.
    let (status, page) = get_json(&format!("{base}/v1/jobs?state=scheduled&limit=1")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["jobs"].as_array().map(Vec::len), Some(1));
    let mut seen = vec![page["jobs"][0]["id"].as_str().expect("id").to_string()];
    let mut cursor = page["next_cursor"].as_str().map(str::to_string);
    while let Some(c) = cursor {
        let (_, page) = get_json(&format!(
            "{base}/v1/jobs?state=scheduled&limit=1&cursor={c}"
        ))
        .await;
        for job in page["jobs"].as_array().expect("jobs") {
            seen.push(job["id"].as_str().expect("id").to_string());
        }
        cursor = page["next_cursor"].as_str().map(str::to_string);
    }
    seen.sort();
    assert_eq!(seen, ["b-1", "b-3"]);
    let (_, by_topic) = get_json(&format!("{base}/v1/jobs?topic=orders")).await;
    assert_eq!(by_topic["jobs"].as_array().map(Vec::len), Some(1));

    // DELETE cancels; a second DELETE is still 204; unknown is 404.
    let (status, _) = send(
        reqwest::Method::DELETE,
        &format!("{base}/v1/jobs/b-3"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, _) = send(
        reqwest::Method::DELETE,
        &format!("{base}/v1/jobs/b-3"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, body) = send(
        reqwest::Method::DELETE,
        &format!("{base}/v1/jobs/nope"),
        None,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    let cancelled = job_view(&base, "b-3").await;
    assert_eq!(cancelled["state"], "cancelled");
    let (status, _) = send(
        reqwest::Method::PATCH,
        &format!("{base}/v1/jobs/b-3"),
        Some(json!({"delay": "1s"})),
    )
    .await;
    assert_eq!(status, 409, "a cancelled job cannot be changed");

    // A 410 dead-letters at once; list, replay to a new URL, drop.
    let good = Receiver::ok().await;
    let (status, _) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": "gone-1", "topic": "orders", "url": receiver.url("/gone"),
            "headers": {"authorization": "Bearer merchant-secret", "x-trace": "t1"}}),
    )
    .await;
    assert_eq!(status, 201);
    wait_until("gone-1 is dead", Duration::from_secs(10), || async {
        job_view(&base, "gone-1").await["state"] == "dead"
    })
    .await;
    let (status, stats) = get_json(&format!("{base}/v1/stats")).await;
    assert_eq!(status, 200);
    assert_eq!(stats["dead"], 1, "{stats}");
    assert_eq!(stats["dead_lettered"], 1, "{stats}");
    assert_eq!(stats["scheduled"], 1, "{stats}");
    let (status, dead) = get_json(&format!("{base}/v1/dead-letters?topic=orders")).await;
    assert_eq!(status, 200, "{dead}");
    assert_eq!(dead["dead_letters"][0]["id"], "gone-1");
    assert_eq!(dead["dead_letters"][0]["last_status"], 410);

    let (status, dry) = post_json(
        &format!("{base}/v1/dead-letters/replay"),
        json!({"ids": ["gone-1"], "dry_run": true}),
    )
    .await;
    assert_eq!(
        (status, &dry["replayed"]),
        (200, &json!(["gone-1"])),
        "{dry}"
    );
    let (_, still) = get_json(&format!("{base}/v1/dead-letters")).await;
    assert_eq!(
        still["dead_letters"].as_array().map(Vec::len),
        Some(1),
        "dry run changed nothing"
    );

    let (status, report) = post_json(
        &format!("{base}/v1/dead-letters/replay"),
        json!({"all": true, "topic": "orders", "url": good.url("/moved")}),
    )
    .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["replayed"], json!(["gone-1"]));
    let got = good.wait_for_count(1, Duration::from_secs(10)).await;
    assert_eq!(got[0].path, "/moved");
    assert_eq!(got[0].headers["webhook-id"], "gone-1");
    // Another origin: the old receiver's credentials stay behind.
    assert!(
        !got[0].headers.contains_key("authorization") && !got[0].headers.contains_key("x-trace"),
        "a replay to another origin carried the job's headers: {:?}",
        got[0].headers
    );
    let (_, empty) = get_json(&format!("{base}/v1/dead-letters")).await;
    assert_eq!(empty["dead_letters"], json!([]));

    // Replaying again finds nothing; dropping an absent dead letter is 404.
    let (_, again) = post_json(
        &format!("{base}/v1/dead-letters/replay"),
        json!({"ids": ["gone-1"]}),
    )
    .await;
    assert_eq!(again["not_found"], json!(["gone-1"]));
    let (status, _) = send(
        reqwest::Method::DELETE,
        &format!("{base}/v1/dead-letters/gone-1"),
        None,
    )
    .await;
    assert_eq!(status, 404);

    // Health, readiness, metrics, OpenAPI.
    assert_eq!(get_json(&format!("{base}/healthz")).await.0, 200);
    assert_eq!(get_json(&format!("{base}/readyz")).await.0, 200);
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(metrics.contains("hookq_attempts_total"), "{metrics}");
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_dead_letter_can_be_dropped() {
    let redis = RedisServer::start();
    let receiver = Receiver::with_status(410).await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    crate::post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "drop-1", "url": receiver.url("/")}),
    )
    .await;
    wait_until("drop-1 is dead", Duration::from_secs(10), || async {
        job_view(&base, "drop-1").await["state"] == "dead"
    })
    .await;
    let (status, _) = send(
        reqwest::Method::DELETE,
        &format!("{base}/v1/dead-letters/drop-1"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (_, list) = get_json(&format!("{base}/v1/dead-letters")).await;
    assert_eq!(list["dead_letters"], json!([]));
    daemon.stop().await.expect("clean stop");
}

/// The paths of the routes `fn router` in `src/api/mod.rs` declares (the
/// path of each `.route(...)` call). Panics on a way of adding routes this
/// reader does not follow (`nest`, `route_service`, a merged router built
/// elsewhere), so that a route cannot hide from the check below.
fn routed_paths_in_source() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/api/mod.rs");
    let source = std::fs::read_to_string(path).expect("src/api/mod.rs");
    let start = source
        .find("pub(crate) fn router(")
        .expect("fn router in src/api/mod.rs");
    let body = &source[start..];
    let body = &body[..body.find("\n}\n").expect("the end of fn router")];
    for unread in [
        ".nest(",
        ".nest_service(",
        ".route_service(",
        ".fallback_service(",
    ] {
        assert!(
            !body.contains(unread),
            "fn router uses {unread}: teach this test to read its routes"
        );
    }
    for merged in body.split(".merge(").skip(1) {
        let name = merged.split(')').next().unwrap_or_default().trim();
        assert!(
            body.contains(&format!("let {name} = Router::new()")),
            "fn router merges `{name}`, built elsewhere: teach this test to read its routes"
        );
    }
    body.split(".route(")
        .skip(1)
        .map(|call| {
            let literal = &call[call.find('"').expect("a path literal") + 1..];
            literal[..literal.find('"').expect("the literal's end")].to_string()
        })
        .collect()
}

/// The router serves exactly what `openapi.json` documents: every
/// documented operation is routed, and no route or method is served that
/// the document leaves out. Routes come from `fn router`'s source (the
/// console's page and assets, and `/` that leads to it, are the only
/// ones left out of the API's document); what each path answers to every method comes from the
/// running daemon (the fallback answers 404 "no such route", a path
/// without the method 405).
#[tokio::test]
async fn openapi_document_is_served_and_matches_the_router() {
    const CONSOLE: [&str; 5] = ["/", "/ui", "/ui/", "/ui/app.js", "/ui/app.css"];
    let redis = RedisServer::start();
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let served = reqwest::get(format!("{base}/openapi.json"))
        .await
        .expect("get")
        .text()
        .await
        .expect("text");
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json"))
        .expect("openapi.json");
    assert_eq!(served, committed);
    let doc: Value = serde_json::from_str(&committed).expect("valid JSON");
    let documented: HashMap<String, Vec<String>> = doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .map(|(path, ops)| {
            let methods = ops
                .as_object()
                .expect("ops")
                .keys()
                .filter(|m| *m != "parameters")
                .map(|m| m.to_uppercase())
                .collect();
            (path.clone(), methods)
        })
        .collect();

    // Every route of the router is documented: a plain path as such, a
    // catch-all (`{*rest}`) by the documented paths under it.
    let mut paths: Vec<String> = documented.keys().cloned().collect();
    for routed in routed_paths_in_source() {
        if CONSOLE.contains(&routed.as_str()) {
            continue;
        }
        match routed.split_once("{*") {
            Some((prefix, _)) => assert!(
                documented.keys().any(|p| p.starts_with(prefix)),
                "the router serves {routed}, and openapi.json documents nothing under it"
            ),
            None => {
                assert!(
                    documented.contains_key(&routed),
                    "the router serves {routed}, which openapi.json does not document"
                );
            }
        }
        if !paths.contains(&routed) && !routed.contains("{*") {
            paths.push(routed);
        }
    }

    // Each of these paths answers exactly the documented methods.
    let mut mismatches = Vec::new();
    for path in &paths {
        let concrete = path
            .split('/')
            .map(|s| if s.starts_with('{') { "some-id" } else { s })
            .collect::<Vec<_>>()
            .join("/");
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
            let (status, body) = send(
                reqwest::Method::from_bytes(method.as_bytes()).expect("method"),
                &format!("{base}{concrete}"),
                Some(json!({})),
            )
            .await;
            let routed =
                !(status == 404 && body["error"]["message"] == "no such route") && status != 405;
            let listed = documented
                .get(path)
                .is_some_and(|methods| methods.iter().any(|m| m == method));
            if routed != listed {
                mismatches.push(format!(
                    "{method} {path}: documented {listed}, routed {routed} ({status} {body})"
                ));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "the router and openapi.json disagree:\n{}",
        mismatches.join("\n")
    );
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn tokens_are_required_when_configured() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.api.tokens = vec!["s3cret-token".into()];
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let client = reqwest::Client::new();
    let none = client
        .get(format!("{base}/v1/stats"))
        .send()
        .await
        .expect("sent");
    assert_eq!(none.status(), 401);
    let body: Value = none.json().await.expect("json");
    assert_eq!(body["error"]["code"], "unauthorized");
    let wrong = client
        .get(format!("{base}/v1/stats"))
        .bearer_auth("s3cret-tokem")
        .send()
        .await
        .expect("sent");
    assert_eq!(wrong.status(), 401);
    let right = client
        .get(format!("{base}/v1/stats"))
        .bearer_auth("s3cret-token")
        .send()
        .await
        .expect("sent");
    assert_eq!(right.status(), 200);
    // Health endpoints need no token.
    assert_eq!(
        client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .expect("sent")
            .status(),
        200
    );
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn redis_down_answers_503_then_the_daemon_resumes() {
    let mut redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    redis.kill();
    let (status, body) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"url": "http://127.0.0.1:9/"}),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "redis_unavailable");
    // A batch whose every partition call fails answers 503 as a whole.
    let (status, body) = post_json(
        &format!("{base}/v1/jobs/batch"),
        json!({"jobs": [{"id": "down-1", "url": "http://127.0.0.1:9/"}, {"id": "down-2", "url": "http://127.0.0.1:9/"}]}),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "redis_unavailable");
    assert_eq!(get_json(&format!("{base}/readyz")).await.0, 503);

    // Redis comes back: readiness returns and jobs flow again, unattended.
    redis.restart();
    wait_until("ready again", Duration::from_secs(20), || async {
        get_json(&format!("{base}/readyz")).await.0 == 200
    })
    .await;
    let (status, body) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"url": receiver.url("/back"), "delay": "100ms"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    receiver.wait_for_count(1, Duration::from_secs(20)).await;
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn malformed_requests_get_4xx_and_change_nothing() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.api.max_body = 4096;
    config.api.max_batch_body = 64 * 1024;
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    // One existing job, so PATCH/DELETE cases have something to refuse to touch.
    let (status, _) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": "keep", "url": "http://127.0.0.1:9/", "delay": "1h"}),
    )
    .await;
    assert_eq!(status, 201);
    let before = crate::redis_snapshot(&redis).await;

    let url = "http://127.0.0.1:9/x";
    let big = "x".repeat(5000);
    let many: Vec<Value> = (0..1001)
        .map(|i| json!({"id": format!("m{i}"), "url": url}))
        .collect();
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let cases: Vec<(&str, &str, String, Option<&str>)> = vec![
        // (method, path, raw body, expected field)
        ("POST", "/v1/jobs", "".into(), None),
        ("POST", "/v1/jobs", "not json".into(), None),
        ("POST", "/v1/jobs", "[]".into(), None),
        ("POST", "/v1/jobs", "null".into(), None),
        (
            "POST",
            "/v1/jobs",
            r#"{"url": "http://a.example/"} x"#.into(),
            None,
        ),
        ("POST", "/v1/jobs", "{}".into(), Some("url")),
        ("POST", "/v1/jobs", r#"{"url": 5}"#.into(), Some("url")),
        (
            "POST",
            "/v1/jobs",
            r#"{"url": "ftp://a.example/"}"#.into(),
            Some("url"),
        ),
        (
            "POST",
            "/v1/jobs",
            r#"{"url": "/relative"}"#.into(),
            Some("url"),
        ),
        (
            "POST",
            "/v1/jobs",
            r#"{"url": "http://a.example/\u001b[2K\nstate delivered"}"#.into(),
            Some("url"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "http://a.example/{}"}}"#, "a".repeat(2100)),
            Some("url"),
        ),
        (
            "POST",
            "/v1/jobs",
            r#"{"url": "http://"}"#.into(),
            Some("url"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "id": ""}}"#),
            Some("id"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "id": "a b"}}"#),
            Some("id"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "id": "{}"}}"#, "i".repeat(129)),
            Some("id"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "id": 7}}"#),
            Some("id"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "topic": "a/b"}}"#),
            Some("topic"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "topic": ""}}"#),
            Some("topic"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "method": "GET"}}"#),
            Some("method"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "method": 1}}"#),
            Some("method"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "delay": "soon"}}"#),
            Some("delay"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "delay": "-5s"}}"#),
            Some("delay"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "delay": "100y"}}"#),
            Some("delay"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "delay": 30}}"#),
            Some("delay"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "delay": "1s", "run_at": 1}}"#),
            Some("delay"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "run_at": -1}}"#),
            Some("run_at"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "run_at": "tomorrow"}}"#),
            Some("run_at"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "run_at": "2999-01-01T00:00:00Z"}}"#),
            Some("run_at"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "run_at": 1.5}}"#),
            Some("run_at"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "retry": "1s"}}"#),
            Some("retry"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "retry": ["1s", "x"]}}"#),
            Some("retry[1]"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "retry": ["0s"]}}"#),
            Some("retry[0]"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "timeout": "1h"}}"#),
            Some("timeout"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "timeout": "0s"}}"#),
            Some("timeout"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "headers": {{"webhook-signature": "v1,x"}}}}"#),
            Some("headers.webhook-signature"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "headers": {{"Webhook-Id": "x"}}}}"#),
            Some("headers.Webhook-Id"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "headers": {{"Transfer-Encoding": "chunked"}}}}"#),
            Some("headers.Transfer-Encoding"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "headers": {{"bad name": "x"}}}}"#),
            Some("headers.bad name"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "headers": {{"x-a": "a\nb"}}}}"#),
            Some("headers.x-a"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "headers": {{"x-a": 1}}}}"#),
            Some("headers.x-a"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "body": {{}}, "body_text": "x"}}"#),
            Some("body_text"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "content_type": "text/xml"}}"#),
            Some("content_type"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "body_text": 5}}"#),
            Some("body_text"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "surprise": true}}"#),
            Some("surprise"),
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "body": "{big}"}}"#),
            None,
        ),
        (
            "POST",
            "/v1/jobs",
            format!(r#"{{"url": "{url}", "body": {deep}}}"#),
            None,
        ),
        ("POST", "/v1/jobs/batch", "{}".into(), Some("jobs")),
        (
            "POST",
            "/v1/jobs/batch",
            r#"{"jobs": []}"#.into(),
            Some("jobs"),
        ),
        (
            "POST",
            "/v1/jobs/batch",
            r#"{"jobs": {}}"#.into(),
            Some("jobs"),
        ),
        (
            "POST",
            "/v1/jobs/batch",
            json!({"jobs": many}).to_string(),
            Some("jobs"),
        ),
        ("GET", "/v1/jobs/bad%20id", "".into(), Some("id")),
        ("GET", "/v1/jobs?state=sleeping", "".into(), Some("state")),
        ("GET", "/v1/jobs?limit=0", "".into(), Some("limit")),
        ("GET", "/v1/jobs?limit=abc", "".into(), Some("limit")),
        ("GET", "/v1/jobs?cursor=zzz", "".into(), Some("cursor")),
        ("GET", "/v1/jobs?cursor=99:0", "".into(), Some("cursor")),
        (
            "GET",
            "/v1/jobs?cursor=0:9223372036854775807&state=ready",
            "".into(),
            Some("cursor"),
        ),
        ("GET", "/v1/jobs?cursor=0:abc", "".into(), Some("cursor")),
        (
            "GET",
            "/v1/dead-letters?cursor=0:(x",
            "".into(),
            Some("cursor"),
        ),
        (
            "GET",
            "/v1/dead-letters?cursor=0:1.2.3",
            "".into(),
            Some("cursor"),
        ),
        ("GET", "/v1/jobs?colour=red", "".into(), Some("colour")),
        ("GET", "/v1/jobs?topic=a/b", "".into(), Some("topic")),
        (
            "GET",
            "/v1/dead-letters?since=whenever",
            "".into(),
            Some("since"),
        ),
        (
            "PATCH",
            "/v1/jobs/keep",
            r#"{"topic": "x"}"#.into(),
            Some("topic"),
        ),
        (
            "PATCH",
            "/v1/jobs/keep",
            r#"{"url": "nope"}"#.into(),
            Some("url"),
        ),
        (
            "PATCH",
            "/v1/jobs/keep",
            r#"{"delay": "1s", "run_at": 5}"#.into(),
            Some("delay"),
        ),
        (
            "PATCH",
            "/v1/jobs/keep",
            r#"{"retry": ["never"]}"#.into(),
            Some("retry[0]"),
        ),
        (
            "PATCH",
            "/v1/jobs/keep",
            r#"{"headers": {"host": "x"}}"#.into(),
            Some("headers.host"),
        ),
        (
            "PATCH",
            "/v1/jobs/missing",
            r#"{"delay": "1s"}"#.into(),
            None,
        ),
        ("DELETE", "/v1/jobs/bad%20id", "".into(), Some("id")),
        ("POST", "/v1/dead-letters/replay", "{}".into(), Some("all")),
        (
            "POST",
            "/v1/dead-letters/replay",
            r#"{"ids": ["a"], "all": true}"#.into(),
            Some("all"),
        ),
        (
            "POST",
            "/v1/dead-letters/replay",
            r#"{"ids": ["a b"]}"#.into(),
            Some("ids[0]"),
        ),
        (
            "POST",
            "/v1/dead-letters/replay",
            r#"{"all": true, "url": "mailto:x"}"#.into(),
            Some("url"),
        ),
        (
            "POST",
            "/v1/dead-letters/replay",
            r#"{"all": true, "since": "later"}"#.into(),
            Some("since"),
        ),
        ("DELETE", "/v1/dead-letters/keep", "".into(), None),
        ("GET", "/v1/dead-letters/bad%20id", "".into(), Some("id")),
        ("GET", "/v1/dead-letters/keep", "".into(), None),
        (
            "GET",
            "/v1/signing-secret?url=ftp://x",
            "".into(),
            Some("url"),
        ),
        ("GET", "/v1/signing-secret", "".into(), Some("url")),
        ("GET", "/v1/hosts?state=shut", "".into(), Some("state")),
        ("GET", "/v1/hosts?cursor=", "".into(), Some("cursor")),
        ("GET", "/v1/hosts?limit=0", "".into(), Some("limit")),
        ("GET", "/v1/hosts/__main__", "".into(), Some("host")),
        (
            "POST",
            "/v1/hosts/ftp%3A%2F%2Fx/pause",
            "".into(),
            Some("host"),
        ),
        (
            "POST",
            "/v1/hosts/h%3A99999/resume",
            "".into(),
            Some("host"),
        ),
        ("GET", "/v1/nothing-here", "".into(), None),
        ("POST", "/v1/schedules", "not json".into(), None),
        (
            "POST",
            "/v1/schedules",
            r#"{"every": "1ms", "job": {"url": "http://a.example/"}}"#.into(),
            Some("every"),
        ),
        (
            "POST",
            "/v1/schedules",
            r#"{"every": "1m", "job": {"url": "x"}}"#.into(),
            Some("job.url"),
        ),
        ("GET", "/v1/schedules?limit=0", "".into(), Some("limit")),
        ("GET", "/v1/schedules?cursor=x", "".into(), Some("cursor")),
        ("GET", "/v1/schedules/a:b", "".into(), Some("id")),
        ("PATCH", "/v1/schedules/a:b", "{}".into(), Some("id")),
        ("DELETE", "/v1/schedules/a:b", "".into(), Some("id")),
        ("POST", "/v1/schedules/a:b/pause", "".into(), Some("id")),
        ("POST", "/v1/schedules/a:b/resume", "".into(), Some("id")),
        ("GET", "/v1/tenants/Bad_Name", "".into(), Some("name")),
        ("GET", "/v1/stats?tenant=Bad", "".into(), Some("tenant")),
    ];
    // The table covers every documented operation that takes input (a body,
    // a query or an id in the path): a route added without a malformed case
    // fails here.
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json"))
            .expect("openapi.json"),
    )
    .expect("openapi.json is JSON");
    let matches = |template: &str, path: &str| {
        let path = path.split('?').next().unwrap_or(path);
        let (t, p): (Vec<&str>, Vec<&str>) =
            (template.split('/').collect(), path.split('/').collect());
        t.len() == p.len() && t.iter().zip(&p).all(|(a, b)| a.starts_with('{') || a == b)
    };
    for (template, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("ops") {
            let takes_input = template.contains('{')
                || op.get("requestBody").is_some()
                || op["parameters"].as_array().is_some_and(|p| !p.is_empty());
            if method == "parameters" || !takes_input {
                continue;
            }
            assert!(
                cases
                    .iter()
                    .any(|(m, p, _, _)| m.eq_ignore_ascii_case(method) && matches(template, p)),
                "no malformed case for {} {template}",
                method.to_uppercase()
            );
        }
    }
    let client = reqwest::Client::new();
    for (method, path, body, field) in &cases {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = client.request(method.clone(), format!("{base}{path}"));
        if !body.is_empty() {
            request = request
                .header("content-type", "application/json")
                .body(body.clone());
        }
        let response = request.send().await.expect("sent");
        let status = response.status().as_u16();
        let json: Value =
            serde_json::from_str(&response.text().await.expect("text")).unwrap_or(Value::Null);
        let context = format!(
            "{method} {path} {}",
            body.chars().take(80).collect::<String>()
        );
        assert_error_shape(status, &json, &context);
        if let Some(field) = field {
            assert_eq!(
                json["error"]["field"].as_str(),
                Some(*field),
                "{context}: {json}"
            );
        }
    }
    // An oversized body is 413 with the JSON shape.
    let response = client
        .post(format!("{base}/v1/jobs"))
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"url": "{url}", "body_text": "{}"}}"#,
            "y".repeat(10_000)
        ))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), 413);
    let json: Value = response.json().await.expect("json");
    assert_eq!(json["error"]["code"], "body_too_large");

    assert_eq!(
        crate::redis_snapshot(&redis).await,
        before,
        "a refused request changed Redis"
    );
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn patch_and_delete_racing_the_carrier_are_all_or_nothing() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    const JOBS: usize = 200;
    let mut jobs = Vec::new();
    for i in 0..JOBS {
        jobs.push(json!({"id": format!("race-{i}"), "url": receiver.url("/race"), "body": {"v": "old"}, "delay": format!("{}ms", 100 + (i % 50))}));
    }
    let (status, _) = post_json(&format!("{base}/v1/jobs/batch"), json!({"jobs": jobs})).await;
    assert_eq!(status, 200);

    // Race the carrier: PATCH the even jobs, DELETE the odd ones, all at once.
    let mut tasks = Vec::new();
    for i in 0..JOBS {
        let url = format!("{base}/v1/jobs/race-{i}");
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                send(
                    reqwest::Method::PATCH,
                    &url,
                    Some(json!({"body": {"v": "new"}})),
                )
                .await
                .0
            } else {
                send(reqwest::Method::DELETE, &url, None).await.0
            }
        }));
    }
    let mut answers = HashMap::new();
    for (i, task) in tasks.into_iter().enumerate() {
        answers.insert(i, task.await.expect("task"));
    }

    // Every job ends delivered or cancelled; wait for the dust to settle.
    wait_until("every job finished", Duration::from_secs(20), || async {
        let (_, stats) = get_json(&format!("{base}/v1/stats")).await;
        stats["scheduled"] == 0 && stats["inflight"] == 0
    })
    .await;
    // Each job's final state; then a stop drains any attempt still under
    // way (one cancelled in flight), so that what arrived is all there is.
    let mut views = Vec::new();
    for i in 0..JOBS {
        views.push(job_view(&base, &format!("race-{i}")).await);
    }
    daemon.stop().await.expect("clean stop");
    let delivered: HashMap<String, Value> = receiver
        .requests()
        .into_iter()
        .map(|r| {
            let id = r.headers["webhook-id"].to_str().expect("ascii").to_string();
            (id, serde_json::from_slice(&r.body).expect("json body"))
        })
        .collect();
    let mut arrivals: HashMap<String, usize> = HashMap::new();
    for r in receiver.requests() {
        let id = r.header("webhook-id").expect("webhook-id").to_string();
        *arrivals.entry(id).or_default() += 1;
    }
    let mut patched = 0;
    let mut cancelled = 0;
    for (i, view) in views.iter().enumerate() {
        let id = format!("race-{i}");
        let answer = answers[&i];
        if i % 2 == 0 {
            match answer {
                200 => {
                    patched += 1;
                    assert_eq!(
                        delivered.get(&id),
                        Some(&json!({"v": "new"})),
                        "{id}: PATCH 200 but old body sent"
                    );
                }
                409 => assert_eq!(
                    delivered.get(&id),
                    Some(&json!({"v": "old"})),
                    "{id}: PATCH 409 but body changed"
                ),
                other => panic!("{id}: PATCH answered {other}"),
            }
            assert_eq!(view["state"], "delivered");
        } else {
            match answer {
                204 | 202 => {
                    cancelled += 1;
                    assert_eq!(view["state"], "cancelled", "{id}");
                    // 204: cancelled before any worker had it, it never
                    // arrives; 202: cancelled in flight, only that attempt
                    // may.
                    let arrived = arrivals.get(&id).copied().unwrap_or(0);
                    let may = usize::from(answer == 202);
                    assert!(
                        arrived <= may,
                        "{id}: cancel answered {answer}, arrived {arrived} times"
                    );
                }
                409 => assert_eq!(view["state"], "delivered", "{id}"),
                other => panic!("{id}: DELETE answered {other}"),
            }
        }
    }
    eprintln!(
        "race: {patched} PATCHes applied, {cancelled} DELETEs applied of {} each",
        JOBS / 2
    );
}

/// A job cancelled while ready (due, waiting for a worker: the only worker
/// is busy and the daemon's claim budget, two jobs per worker, and its
/// reserve are full)
/// answers 204 and never reaches its receiver.
#[tokio::test]
async fn a_cancelled_ready_job_never_arrives() {
    use crate::support::receiver::{Recorded, Reply};
    let redis = RedisServer::start();
    let receiver = Receiver::start(std::sync::Arc::new(|r: &Recorded| {
        let hold = r
            .path
            .starts_with("/hold")
            .then_some(Duration::from_secs(3));
        Reply {
            delay: hold,
            ..Reply::status(200)
        }
    }))
    .await;
    let mut config = test_config(&redis);
    config.delivery.workers = 1;
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let jobs = format!("{base}/v1/jobs");
    // hold-1 takes the worker; hold-2, claimed, waits for it: the budget
    // is full; hold-3 is claimed from the reserve (its ready list started
    // while the budget was full), so the next job stays ready (unclaimed)
    // until hold-1 ends.
    crate::post_created(
        &jobs,
        json!({"id": "hold-1", "url": receiver.url("/hold"), "timeout": "5s"}),
    )
    .await;
    receiver.wait_for_count(1, Duration::from_secs(10)).await;
    for id in ["hold-2", "hold-3"] {
        crate::post_created(
            &jobs,
            json!({"id": id, "url": receiver.url("/hold"), "timeout": "5s"}),
        )
        .await;
        crate::wait_state(&base, id, "inflight").await;
    }
    let view = crate::post_created(
        &jobs,
        json!({"id": "queued", "url": receiver.url("/queued")}),
    )
    .await;
    assert_eq!(view["state"], "ready", "{view}");
    // Ready, not claimed: a PATCH is refused as not scheduled (not in flight).
    crate::inflight::assert_patch_not_scheduled(&jobs, "queued").await;
    let (status, body) = send(reqwest::Method::DELETE, &format!("{jobs}/queued"), None).await;
    assert_eq!(status, 204, "{body}");
    let (_, view) = get_json(&format!("{jobs}/queued")).await;
    assert_eq!(view["state"], "cancelled", "{view}");
    assert_eq!(
        view["history"],
        json!([]),
        "cancelled before any attempt: {view}"
    );

    // Once the worker is free and nothing is left to run, stop (draining
    // any attempt) and look at what arrived.
    crate::wait_until_idle(&base, Duration::from_secs(10)).await;
    daemon.stop().await.expect("clean stop");
    let paths: Vec<String> = receiver.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        ["/hold", "/hold", "/hold"],
        "the cancelled job arrived"
    );
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            ".{0,40}".prop_map(Value::String),
            prop_oneof![
                Just("http://127.0.0.1:9/x"),
                Just("1h"),
                Just("2030-01-01T00:00:00Z"),
                Just("POST"),
                Just("webhook-id")
            ]
            .prop_map(|s| Value::String(s.into())),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("url".to_string()),
                        Just("id".to_string()),
                        Just("delay".to_string()),
                        Just("run_at".to_string()),
                        Just("body".to_string()),
                        Just("body_text".to_string()),
                        Just("headers".to_string()),
                        Just("retry".to_string()),
                        Just("timeout".to_string()),
                        Just("method".to_string()),
                        Just("topic".to_string()),
                        "[a-z_]{1,8}",
                    ],
                    inner,
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    #[test]
    fn arbitrary_json_never_gets_a_5xx() {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let redis = RedisServer::start();
        let daemon = runtime.block_on(start_daemon(&test_config(&redis)));
        let url = format!("{}/v1/jobs", daemon.url());
        let client = reqwest::Client::new();
        let config = ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        };
        proptest!(config, |(body in arb_json())| {
            let status = runtime.block_on(async {
                client.post(&url).json(&body).send().await.expect("sent").status().as_u16()
            });
            prop_assert!(status < 500, "{} answered {}", body, status);
        });
        runtime.block_on(daemon.stop()).expect("clean stop");
    }
}

/// POSTs a raw body (the bytes exactly as given) and returns the status and
/// the JSON answer.
async fn post_raw(url: &str, body: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("request is sent");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// RFC 3339 in UTC with exactly three fractional digits.
fn is_rfc3339_millis(value: &Value) -> bool {
    let Some(text) = value.as_str() else {
        return false;
    };
    let bytes = text.as_bytes();
    text.len() == 24
        && bytes.iter().enumerate().all(|(i, b)| match i {
            4 | 7 => *b == b'-',
            10 => *b == b'T',
            13 | 16 => *b == b':',
            19 => *b == b'.',
            23 => *b == b'Z',
            _ => b.is_ascii_digit(),
        })
}

#[tokio::test]
async fn every_time_in_a_response_is_rfc3339_with_milliseconds() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let failing = Receiver::with_status(500).await;
    let mut config = test_config(&redis);
    config.delivery.retry = vec![];
    let daemon = start_daemon(&config).await;
    let base = daemon.url();

    let (status, created) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": "t-ok", "url": receiver.url("/"), "delay": "1h"}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    for field in ["created_at", "updated_at", "next_attempt_at"] {
        assert!(is_rfc3339_millis(&created[field]), "{field}: {created}");
    }

    let (status, answer) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": "t-now", "url": receiver.url("/")}),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    receiver.wait_for_count(1, Duration::from_secs(10)).await;
    let view = crate::wait_state(&base, "t-now", "delivered").await;
    let at = &view["history"][0]["at"];
    assert!(is_rfc3339_millis(at), "history at: {view}");

    // A dead letter: its time and its job's run_at.
    let run_at = time::OffsetDateTime::now_utc().unix_timestamp() * 1000;
    let (status, answer) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": "t-dead", "url": failing.url("/"), "run_at": run_at}),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    wait_until("t-dead is dead-lettered", Duration::from_secs(10), || {
        let url = format!("{base}/v1/dead-letters");
        async move {
            let (_, v) = get_json(&url).await;
            v["dead_letters"].as_array().is_some_and(|l| !l.is_empty())
        }
    })
    .await;
    let (_, letters) = get_json(&format!("{base}/v1/dead-letters")).await;
    let letter = &letters["dead_letters"][0];
    assert!(is_rfc3339_millis(&letter["dead_at"]), "{letter}");
    assert!(is_rfc3339_millis(&letter["job"]["run_at"]), "{letter}");
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_create_retried_with_other_json_spelling_is_idempotent() {
    let redis = RedisServer::start();
    let daemon = start_daemon(&test_config(&redis)).await;
    let jobs = format!("{}/v1/jobs", daemon.url());
    let url = "http://127.0.0.1:9/hook";
    let first = format!(
        r#"{{"id": "sem", "url": "{url}", "delay": "1h", "body": {{"order": 42, "items": [1, 2], "note": "a b"}}}}"#
    );
    let (status, answer) = post_raw(&jobs, &first).await;
    assert_eq!(status, 201, "{answer}");

    // Whitespace and key order (of the body and of the job) do not matter.
    let respelled = format!(
        r#"{{"body":{{"note":"a b","items":[1,2],"order":42}},"delay":"1h","url":"{url}","id":"sem"}}"#
    );
    let (status, answer) = post_raw(&jobs, &respelled).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], "sem");

    // The stored body keeps the first spelling, byte for byte.
    let text = reqwest::get(format!("{jobs}/sem"))
        .await
        .expect("get")
        .text()
        .await
        .expect("text");
    assert!(
        text.contains(r#""body":{"order": 42, "items": [1, 2], "note": "a b"}"#),
        "{text}"
    );

    // Another value, another delay, or a body_text spelled otherwise: 409.
    for (what, body) in [
        (
            "another body value",
            format!(
                r#"{{"id":"sem","url":"{url}","delay":"1h","body":{{"order":43,"items":[1,2],"note":"a b"}}}}"#
            ),
        ),
        (
            "another delay",
            format!(
                r#"{{"id":"sem","url":"{url}","delay":"2h","body":{{"order":42,"items":[1,2],"note":"a b"}}}}"#
            ),
        ),
    ] {
        let (status, answer) = post_raw(&jobs, &body).await;
        assert_eq!(status, 409, "{what}: {answer}");
        assert_eq!(answer["error"]["code"], "conflict", "{what}");
    }
    let (status, answer) = post_raw(
        &jobs,
        &format!(r#"{{"id":"txt","url":"{url}","delay":"1h","body_text":"a=1&b=2"}}"#),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = post_raw(
        &jobs,
        &format!(r#"{{"id":"txt","url":"{url}","delay":"1h","body_text":"a=1& b=2"}}"#),
    )
    .await;
    assert_eq!(status, 409, "body_text is compared byte for byte: {answer}");

    // The batch route answers the same per item, also for a duplicate id
    // within one request.
    let (status, answer) = post_raw(
        &format!("{jobs}/batch"),
        &format!(
            r#"{{"jobs":[{respelled},{{"id":"b2","url":"{url}","body":{{"x": 1,"y": 2}}}},{{"id":"b2","url":"{url}","body":{{"y":2,"x":1}}}}]}}"#
        ),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let statuses: Vec<&Value> = answer["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| &r["status"])
        .collect();
    assert_eq!(
        statuses,
        [&json!(200), &json!(201), &json!(200)],
        "{answer}"
    );
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_truncated_body_names_a_real_field_or_none() {
    let redis = RedisServer::start();
    let daemon = start_daemon(&test_config(&redis)).await;
    let jobs = format!("{}/v1/jobs", daemon.url());
    for (body, field) in [
        (r#"{"url": "http://127.0.0.1:9/"#, json!("url")),
        (
            r#"{"url": "http://127.0.0.1:9/", "retry": ["1s","#,
            json!("retry"),
        ),
        (r#"{"url""#, Value::Null),
        ("{", Value::Null),
    ] {
        let before = crate::redis_snapshot(&redis).await;
        let (status, answer) = post_raw(&jobs, body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_json", "{body}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{body}: {answer}");
        assert_eq!(
            crate::redis_snapshot(&redis).await,
            before,
            "{body} changed Redis"
        );
    }
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_finished_job_cannot_be_cancelled() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let failing = Receiver::with_status(410).await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    for (id, url, finished) in [
        ("fin-delivered", receiver.url("/"), "delivered"),
        ("fin-dead", failing.url("/"), "dead"),
    ] {
        crate::post_created(&format!("{base}/v1/jobs"), json!({"id": id, "url": url})).await;
        crate::wait_state(&base, id, finished).await;
        let (status, answer) = send(
            reqwest::Method::DELETE,
            &format!("{base}/v1/jobs/{id}"),
            None,
        )
        .await;
        assert_eq!(status, 409, "{id}: {answer}");
        assert_eq!(answer["error"]["code"], "finished", "{id}: {answer}");
        let view = job_view(&base, id).await;
        assert_eq!(view["state"], finished, "{id}: {view}");
    }
    daemon.stop().await.expect("clean stop");
}

/// A body in anything but JSON is refused with 415 naming `content-type`
/// and writes nothing: a web page can send `text/plain` or a form
/// cross-site without a CORS preflight. JSON with a charset is fine, and a
/// request without a body needs no content type.
#[tokio::test]
async fn bodies_must_be_json() {
    let redis = RedisServer::start();
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let body = r#"{"id": "cross-site", "url": "http://127.0.0.1:9/", "delay": "1h"}"#;
    let before = crate::redis_snapshot(&redis).await;
    let client = reqwest::Client::new();
    for (path, content_type) in [
        ("/v1/jobs", Some("text/plain")),
        ("/v1/jobs", Some("application/x-www-form-urlencoded")),
        ("/v1/jobs", Some("multipart/form-data; boundary=x")),
        ("/v1/jobs", None),
        ("/v1/dead-letters/replay", Some("text/plain")),
        ("/v1/jobs/batch", Some("text/plain;charset=utf-8")),
    ] {
        let mut request = client.post(format!("{base}{path}")).body(body);
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        let response = request.send().await.expect("answered");
        assert_eq!(response.status(), 415, "{path} with {content_type:?}");
        let answer: serde_json::Value = response.json().await.expect("JSON error");
        assert_eq!(answer["error"]["code"], "unsupported_media_type");
        assert_eq!(answer["error"]["field"], "content-type");
    }
    assert_eq!(
        crate::redis_snapshot(&redis).await,
        before,
        "a refused body changed Redis"
    );
    let created = client
        .post(format!("{base}/v1/jobs"))
        .header("content-type", "application/json; charset=utf-8")
        .body(body)
        .send()
        .await
        .expect("answered");
    assert_eq!(created.status(), 201);
    daemon.stop().await.expect("clean stop");
}

/// Without tokens, a request whose `Host` is a DNS name (what a page that
/// rebinds its own name to this address sends) answers 421 naming `host`;
/// an IP address or `localhost` is served.
#[tokio::test]
async fn without_tokens_only_ip_or_localhost_hosts_are_served() {
    let redis = RedisServer::start();
    let daemon = start_daemon(&test_config(&redis)).await;
    let port = daemon.addr().port();
    let client = reqwest::Client::new();
    let get = |host: String| {
        let client = client.clone();
        let url = format!("{}/v1/stats", daemon.url());
        async move {
            client
                .get(url)
                .header("host", host)
                .send()
                .await
                .expect("answered")
        }
    };
    let refused = get(format!("rebind.example:{port}")).await;
    assert_eq!(refused.status(), 421);
    let answer: serde_json::Value = refused.json().await.expect("JSON error");
    assert_eq!(answer["error"]["field"], "host");
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        assert_eq!(get(host.clone()).await.status(), 200, "{host}");
    }
    daemon.stop().await.expect("clean stop");
}

/// `/` leads a person who opens the daemon's address to the console.
#[tokio::test]
async fn the_root_leads_to_the_console() {
    let redis = RedisServer::start();
    let daemon = start_daemon(&test_config(&redis)).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let answer = client
        .get(format!("{}/", daemon.url()))
        .send()
        .await
        .expect("GET /");
    assert_eq!(answer.status(), 307);
    assert_eq!(answer.headers()["location"], "/ui");
    let page = reqwest::get(format!("{}/", daemon.url()))
        .await
        .expect("GET / followed");
    assert_eq!(page.status(), 200);
    assert!(
        page.text().await.expect("text").contains("app.js"),
        "the console's page"
    );
}
