//! What the security review (issue 24) asked for, end to end against a real
//! daemon, Redis and receivers: header values are write-only in every view
//! (API, CLI, dead letters) while deliveries still send them; a job moved to
//! another origin leaves its headers behind unless they are given again.

use std::time::Duration;

use serde_json::{json, Value};

use crate::abuse::rss_kib;
use crate::ops::{hookq, serve_ready};
use crate::support::receiver::Receiver;
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{get_json, job_view, post_created, post_json, start_daemon, test_config, wait_state};

/// Header values no view may show.
const SECRETS: [&str; 2] = ["Bearer merchant-s3cret-7f3a", "key-9c2e51"];

/// The job's headers: an authorization and an API key.
fn secret_headers() -> Value {
    json!({"Authorization": SECRETS[0], "X-Api-Key": SECRETS[1]})
}

/// Panics if `text` (what some view showed) holds a secret header value.
fn assert_no_secret(text: &str, what: &str) {
    for secret in SECRETS {
        assert!(!text.contains(secret), "{what} shows `{secret}`: {text}");
    }
}

/// Panics unless `view`'s headers are exactly these names, each redacted.
fn assert_redacted_names(view: &Value, names: &[&str], what: &str) {
    let expected: serde_json::Map<String, Value> = names
        .iter()
        .map(|n| (n.to_string(), json!("[redacted]")))
        .collect();
    if names.is_empty() {
        assert!(view.get("headers").is_none(), "{what}: {view}");
    } else {
        assert_eq!(view["headers"], Value::Object(expected), "{what}: {view}");
    }
}

async fn patch(url: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .patch(url)
        .json(&body)
        .send()
        .await
        .expect("PATCH is sent");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn header_values_never_show_in_a_view_and_stay_with_their_origin() {
    let redis = RedisServer::start();
    let failing = Receiver::with_status(500).await;
    let other = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let jobs = format!("{base}/v1/jobs");

    // Create and batch answers, job view and listing.
    let created = post_created(
        &jobs,
        json!({"id": "sec-dead", "url": failing.url("/hook"), "headers": secret_headers()}),
    )
    .await;
    assert_no_secret(&created.to_string(), "the create answer");
    assert_redacted_names(&created, &["Authorization", "X-Api-Key"], "create");
    let (status, batch) = post_json(
        &format!("{jobs}/batch"),
        json!({"jobs": [{"id": "sec-later", "url": failing.url("/hook"), "delay": "1h",
            "headers": secret_headers()}]}),
    )
    .await;
    assert!(status < 300, "batch answered {status}: {batch}");
    assert_no_secret(&batch.to_string(), "the batch answer");
    let (_, view) = get_json(&format!("{jobs}/sec-later")).await;
    assert_redacted_names(&view, &["Authorization", "X-Api-Key"], "job view");
    let (_, list) = get_json(&format!("{jobs}?state=scheduled")).await;
    assert_no_secret(&list.to_string(), "the job listing");
    assert_eq!(list["jobs"][0]["id"], "sec-later", "{list}");

    // Deliveries still send the values; the dead letter and the dead job do
    // not show them.
    let dead = wait_state(&base, "sec-dead", "dead").await;
    assert_no_secret(&dead.to_string(), "the dead job's view");
    let sent = failing.requests();
    assert!(!sent.is_empty());
    assert_eq!(sent[0].header("authorization"), Some(SECRETS[0]));
    assert_eq!(sent[0].header("x-api-key"), Some(SECRETS[1]));
    let (_, letters) = get_json(&format!("{base}/v1/dead-letters")).await;
    assert_no_secret(&letters.to_string(), "the dead-letter listing");
    assert_redacted_names(
        &letters["dead_letters"][0]["job"],
        &["Authorization", "X-Api-Key"],
        "dead letter",
    );

    // The CLI: `show` as JSON and as a table.
    let out = hookq(&redis, "hookq", &["show", "sec-dead", "--json"]);
    assert!(out.status.success(), "{out:?}");
    assert_no_secret(&String::from_utf8_lossy(&out.stdout), "hookq show --json");
    let out = hookq(&redis, "hookq", &["show", "sec-later"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert_no_secret(&table, "hookq show");
    assert!(
        table.contains("Authorization, X-Api-Key (values redacted)"),
        "{table}"
    );

    // PATCH: the same origin keeps the headers, another drops them unless
    // the change gives them again.
    let one = format!("{jobs}/sec-later");
    let (status, kept) = patch(&one, json!({"url": failing.url("/elsewhere")})).await;
    assert_eq!(status, 200, "{kept}");
    assert_redacted_names(&kept, &["Authorization", "X-Api-Key"], "same origin");
    let (status, moved) = patch(&one, json!({"url": other.url("/new")})).await;
    assert_eq!(status, 200, "{moved}");
    assert_redacted_names(&moved, &[], "another origin");
    let (status, given) = patch(
        &one,
        json!({"url": failing.url("/back"), "headers": {"X-Api-Key": "k2"}}),
    )
    .await;
    assert_eq!(status, 200, "{given}");
    assert_redacted_names(&given, &["X-Api-Key"], "headers given again");

    // Replay to another origin with headers given anew: those arrive, the
    // old ones do not.
    let (status, report) = post_json(
        &format!("{base}/v1/dead-letters/replay"),
        json!({"ids": ["sec-dead"], "url": other.url("/replayed"), "headers": {"X-New": "n1"}}),
    )
    .await;
    assert_eq!(status, 200, "{report}");
    let got = other.wait_for_count(1, Duration::from_secs(10)).await;
    assert_eq!(got[0].path, "/replayed");
    assert_eq!(got[0].header("x-new"), Some("n1"));
    assert!(
        got[0].header("authorization").is_none() && got[0].header("x-api-key").is_none(),
        "{:?}",
        got[0].headers
    );

    // A replay's headers are checked like a job's; the CLI names its flag.
    let (status, error) = post_json(
        &format!("{base}/v1/dead-letters/replay"),
        json!({"all": true, "headers": {"Webhook-Signature": "forged"}}),
    )
    .await;
    assert_eq!(status, 400, "{error}");
    assert_eq!(error["error"]["field"], "headers.Webhook-Signature");
    let out = hookq(
        &redis,
        "hookq",
        &["replay", "--dead-letters", "--all", "--header", "no-colon"],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--header"));
}

/// Bytes of one large job's body (the API takes up to 1 MiB).
const LARGE_BODY: usize = 900_000;

#[tokio::test]
async fn a_list_over_large_jobs_stays_small_in_bytes_and_memory() {
    let redis = RedisServer::start();
    let (daemon, base) = serve_ready(&redis, &[]).await;
    let jobs = 40;
    let blob = "x".repeat(LARGE_BODY);
    for i in 0..jobs {
        post_created(
            &format!("{base}/v1/jobs"),
            json!({"id": format!("big-{i}"), "url": "http://127.0.0.1:9/never", "delay": "1h",
                "body": {"blob": blob}}),
        )
        .await;
    }
    let before = rss_kib(daemon.pid());

    // Every page stays small, and the pages together hold every job.
    let mut seen = std::collections::BTreeSet::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut url = format!("{base}/v1/jobs?limit=1000");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let response = reqwest::get(&url).await.expect("GET /v1/jobs");
        let status = response.status();
        let text = response.text().await.expect("page body");
        assert_eq!(status, 200, "{url}: {text}");
        assert!(
            text.len() < 64 * 1024,
            "a page of the listing holds {} bytes",
            text.len()
        );
        assert!(!text.contains("xxxx"), "a listed job shows its body");
        let page: Value = serde_json::from_str(&text).expect("JSON page");
        for job in page["jobs"].as_array().expect("jobs") {
            assert!(seen.insert(job["id"].as_str().expect("id").to_string()));
        }
        pages += 1;
        assert!(pages <= 64, "the listing does not end");
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    assert_eq!(seen.len(), jobs, "the pages missed jobs");
    assert!(pages >= 4, "{pages} pages: 36 MB of jobs read in too few");
    let grown_mib = rss_kib(daemon.pid()).saturating_sub(before) / 1024;
    assert!(grown_mib < 48, "listing grew the daemon by {grown_mib} MiB");

    // The job itself still shows its body.
    let one = job_view(&base, "big-0").await;
    assert_eq!(one["body"]["blob"].as_str().map(str::len), Some(LARGE_BODY));
}

#[tokio::test]
async fn dead_letters_are_found_by_id_without_reading_the_stream() {
    let redis = RedisServer::start();
    let failing = Receiver::with_status(500).await;
    let mut config = test_config(&redis);
    config.retention.dead_letters_max = 5;
    config.breaker.failures = 0;
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let ids: Vec<String> = (0..60).map(|i| format!("dl-{i}")).collect();
    for id in &ids {
        post_created(
            &format!("{base}/v1/jobs"),
            json!({"id": id, "url": failing.url("/x"), "retry": [], "body": {"n": id}}),
        )
        .await;
    }
    crate::wait_until_idle(&base, Duration::from_secs(30)).await;
    let mut conn = redis.conn().await;
    let partitions = config.redis.partitions;
    let mut kept = 0;
    for p in 0..partitions {
        let stream: usize = redis::cmd("XLEN")
            .arg(format!("hookq:{{{p}}}:dead"))
            .query_async(&mut conn)
            .await
            .expect("XLEN");
        let index: Vec<String> = redis::cmd("HKEYS")
            .arg(format!("hookq:{{{p}}}:dead:ids"))
            .query_async(&mut conn)
            .await
            .expect("HKEYS");
        let pointers = index.iter().filter(|f| !f.starts_with('~')).count();
        assert_eq!(stream.min(5), stream, "the cap holds");
        assert_eq!(
            pointers, stream,
            "partition {p}: the index follows the stream"
        );
        kept += stream;
    }

    // Each job's dead letter is found by id (with its body), or, trimmed
    // away by the cap, answers 404 as an unknown id does; none of it reads
    // the stream beyond the one entry.
    let before = stream_reads(&redis).await;
    let mut found = Vec::new();
    for id in &ids {
        let (status, dead) = get_json(&format!("{base}/v1/dead-letters/{id}")).await;
        match status {
            200 => {
                assert_eq!(dead["id"], id.as_str());
                assert_eq!(dead["job"]["body"]["n"], id.as_str(), "{dead}");
                found.push(id.clone());
            }
            404 => {}
            other => panic!("{id}: {other} {dead}"),
        }
    }
    assert_eq!(found.len(), kept);
    let reads = stream_reads(&redis).await - before;
    assert!(
        reads <= ids.len() as i64,
        "{reads} stream reads to look up {} dead letters",
        ids.len()
    );
    let before = stream_reads(&redis).await;
    for i in 0..100 {
        let (status, _) = get_json(&format!("{base}/v1/dead-letters/unknown-{i}")).await;
        assert_eq!(status, 404);
    }
    assert_eq!(
        stream_reads(&redis).await,
        before,
        "an unknown id read the stream"
    );
    let (_, listed) = get_json(&format!("{base}/v1/dead-letters")).await;
    let listed = listed["dead_letters"].as_array().expect("list").clone();
    assert_eq!(listed.len(), kept);
    assert!(listed.iter().all(|d| d["job"].get("body").is_none()));

    // Dead letters of a hookq from before the index: their pointers and
    // the dead jobs' records are gone; a restarted daemon indexes them.
    daemon.stop().await.expect("stops");
    for p in 0..partitions {
        let _: () = redis::cmd("DEL")
            .arg(format!("hookq:{{{p}}}:dead:ids"))
            .query_async(&mut conn)
            .await
            .expect("DEL");
    }
    for id in &found {
        let _: () = redis::cmd("DEL")
            .arg(format!("hookq:{{{}}}:job:{id}", partition_of(&config, id)))
            .query_async(&mut conn)
            .await
            .expect("DEL");
    }
    let (status, _) = {
        let daemon = start_daemon(&config).await;
        let base = daemon.url();
        crate::support::wait_until(
            "the dead letters are indexed",
            Duration::from_secs(15),
            || async {
                let mut conn = redis.conn().await;
                let mut complete = true;
                for p in 0..partitions {
                    let done: bool = redis::cmd("HEXISTS")
                        .arg(format!("hookq:{{{p}}}:dead:ids"))
                        .arg("~complete")
                        .query_async(&mut conn)
                        .await
                        .expect("HEXISTS");
                    complete &= done;
                }
                complete
            },
        )
        .await;
        for id in &found {
            let (status, dead) = get_json(&format!("{base}/v1/dead-letters/{id}")).await;
            assert_eq!(status, 200, "{id}: {dead}");
        }
        // Dropping one removes its pointer with it.
        let response = reqwest::Client::new()
            .delete(format!("{base}/v1/dead-letters/{}", found[0]))
            .send()
            .await
            .expect("DELETE");
        assert_eq!(response.status(), 204);
        let answer = get_json(&format!("{base}/v1/dead-letters/{}", found[0])).await;
        daemon.stop().await.expect("stops");
        answer
    };
    assert_eq!(status, 404);
    let pointer: Option<String> = redis::cmd("HGET")
        .arg(format!(
            "hookq:{{{}}}:dead:ids",
            partition_of(&config, &found[0])
        ))
        .arg(&found[0])
        .query_async(&mut conn)
        .await
        .expect("HGET");
    assert_eq!(pointer, None);
}

/// The partition of job `id` under `config`.
fn partition_of(config: &hookq::config::Config, id: &str) -> u16 {
    hookq::store::Keys::new(&config.redis.namespace, config.redis.partitions).partition_of(id)
}

/// `XRANGE` and `XREVRANGE` calls Redis has served.
async fn stream_reads(redis: &RedisServer) -> i64 {
    redis
        .calls_of(|l| l.starts_with("cmdstat_xrange:") || l.starts_with("cmdstat_xrevrange:"))
        .await
        .expect("INFO commandstats")
}

/// `hookq new-key`'s answer: the token and the `[[api.keys]]` entry.
pub(crate) fn new_key(
    redis: &RedisServer,
    name: &str,
    scopes: &str,
) -> (String, hookq::config::ApiKey) {
    let out = hookq(
        redis,
        "hookq",
        &["new-key", "--name", name, "--scopes", scopes, "--json"],
    );
    assert!(out.status.success(), "{out:?}");
    let key: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let scopes = key["scopes"]
        .as_array()
        .expect("scopes")
        .iter()
        .map(|s| serde_json::from_value(s.clone()).expect("scope"))
        .collect();
    let entry = hookq::config::ApiKey {
        name: name.into(),
        token_sha256: key["token_sha256"].as_str().expect("digest").into(),
        scopes,
        tenant: None,
    };
    (key["token"].as_str().expect("token").into(), entry)
}

/// Sends `method` to `url` with bearer `token` (none: no header) and JSON
/// `body`: the status, the JSON answer (Null when there is none) and the
/// headers.
pub(crate) async fn call(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value, reqwest::header::HeaderMap) {
    let mut request = reqwest::Client::new().request(method, url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request is sent");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::Null),
        headers,
    )
}

#[tokio::test]
async fn keys_do_only_what_their_scopes_allow() {
    use reqwest::Method;
    let redis = RedisServer::start();
    let (reader, read_key) = new_key(&redis, "support", "read");
    let (writer, write_key) = new_key(&redis, "shop", "read,write");
    let (admin, admin_key) = new_key(&redis, "ops", "admin");
    let mut config = test_config(&redis);
    config.api.keys = vec![read_key, write_key, admin_key];
    config.api.tokens = vec!["all-scopes-token".into()];
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let jobs = format!("{base}/v1/jobs");
    let job = json!({"id": "scoped-1", "url": "http://127.0.0.1:9/x", "delay": "1h"});

    for token in [None, Some("wrong-token"), Some(&reader[..reader.len() - 1])] {
        let (status, error, _) = call(Method::GET, &jobs, token, None).await;
        assert_eq!(status, 401, "{token:?}: {error}");
        assert_eq!(error["error"]["code"], "unauthorized");
    }
    let forbidden = |status: u16, error: &Value, what: &str| {
        assert_eq!(status, 403, "{what}: {error}");
        assert_eq!(error["error"]["code"], "forbidden", "{what}");
    };
    // read: looks, changes nothing.
    let (status, _, _) = call(Method::GET, &jobs, Some(&reader), None).await;
    assert_eq!(status, 200);
    let (status, error, _) = call(Method::POST, &jobs, Some(&reader), Some(job.clone())).await;
    forbidden(status, &error, "read key creates");
    // write: creates, patches, cancels; no replay, no host pause.
    let (status, created, _) = call(Method::POST, &jobs, Some(&writer), Some(job.clone())).await;
    assert_eq!(status, 201, "{created}");
    let replay = format!("{base}/v1/dead-letters/replay");
    let (status, error, _) = call(
        Method::POST,
        &replay,
        Some(&writer),
        Some(json!({"all": true})),
    )
    .await;
    forbidden(status, &error, "write key replays");
    let (status, error, _) = call(
        Method::POST,
        &format!("{base}/v1/hosts/api.example.com/pause"),
        Some(&reader),
        None,
    )
    .await;
    forbidden(status, &error, "read key pauses");
    // admin: replays and pauses, but cannot read without `read`.
    let (status, report, _) = call(
        Method::POST,
        &replay,
        Some(&admin),
        Some(json!({"all": true, "dry_run": true})),
    )
    .await;
    assert_eq!(status, 200, "{report}");
    let (status, paused, _) = call(
        Method::POST,
        &format!("{base}/v1/hosts/api.example.com/pause"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, 200, "{paused}");
    let (status, error, _) = call(Method::GET, &jobs, Some(&admin), None).await;
    forbidden(status, &error, "admin key without read lists");
    // api.tokens: every scope.
    let (status, _, _) = call(
        Method::DELETE,
        &format!("{jobs}/scoped-1"),
        Some("all-scopes-token"),
        None,
    )
    .await;
    assert_eq!(status, 204);

    // Every error is JSON, a wrong method and an unknown route included,
    // and every answer forbids sniffing and framing.
    let (status, error, headers) =
        call(Method::PUT, &jobs, Some("all-scopes-token"), Some(job)).await;
    assert_eq!(status, 405, "{error}");
    assert_eq!(error["error"]["code"], "method_not_allowed");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let (status, error, headers) = call(Method::GET, &format!("{base}/nothing"), None, None).await;
    assert_eq!(status, 404);
    assert_eq!(error["error"]["code"], "not_found");
    let csp = headers["content-security-policy"].to_str().expect("ascii");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
}

/// Reads from `stream` until it is closed (read returns 0 or fails) or
/// `within` passes; whether it was closed, and what was read.
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> (bool, String) {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let until = tokio::time::Instant::now() + within;
    loop {
        let mut buf = [0u8; 4096];
        match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
            Err(_) => return (false, String::from_utf8_lossy(&seen).into_owned()),
            Ok(Ok(0)) | Ok(Err(_)) => return (true, String::from_utf8_lossy(&seen).into_owned()),
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

/// Slow and idle clients are cut off at the `[api]` limits, and a client
/// past `max_connections` is closed at once, while the others are served.
#[tokio::test]
async fn slow_idle_and_surplus_connections_are_closed() {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.api.header_timeout = Duration::from_millis(300);
    config.api.body_timeout = Duration::from_millis(300);
    config.api.idle_timeout = Duration::from_millis(600);
    config.api.max_connections = 4;
    let daemon = start_daemon(&config).await;
    let addr = daemon.addr();
    let limit = Duration::from_secs(5);

    // Headers that never end.
    let mut slow_headers = TcpStream::connect(addr).await.expect("connect");
    slow_headers
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .expect("write");
    let (closed, _) = closed_within(&mut slow_headers, limit).await;
    assert!(closed, "a request whose headers never end is cut off");

    // A body that never arrives: 408, then closed.
    let mut slow_body = TcpStream::connect(addr).await.expect("connect");
    slow_body
        .write_all(
            b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"url\":",
        )
        .await
        .expect("write");
    let (closed, answer) = closed_within(&mut slow_body, limit).await;
    assert!(closed, "a body that never arrives is cut off: {answer}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");

    // Idle after a complete request: closed after the idle timeout.
    let mut idle = TcpStream::connect(addr).await.expect("connect");
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("write");
    let (closed, answer) = closed_within(&mut idle, limit).await;
    assert!(closed && answer.starts_with("HTTP/1.1 200"), "{answer}");

    daemon.stop().await.expect("clean stop");

    // Four connections held open: a fifth is closed at once, the four are
    // still served, and once one goes a new one is taken. A daemon whose
    // header and idle timeouts (60 s) outlast this part, so that only the
    // connection limit can close a connection here.
    config.api.header_timeout = Duration::from_secs(60);
    config.api.idle_timeout = Duration::from_secs(60);
    let daemon = start_daemon(&config).await;
    let addr = daemon.addr();
    // Each of the four is served a request (kept alive): the server has
    // accepted it and holds a slot for it.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .expect("write");
        let answer = first_answer(&mut stream, limit).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        held.push(stream);
    }
    let mut surplus = TcpStream::connect(addr).await.expect("the kernel accepts");
    let (closed, answer) = closed_within(&mut surplus, limit).await;
    assert!(
        closed && answer.is_empty(),
        "a fifth connection is closed unanswered: {answer}"
    );
    held[0]
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    let (_, answer) = closed_within(&mut held[0], limit).await;
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "a held connection is served: {answer}"
    );
    held.remove(0);
    wait_until("a slot is free again", limit, || async {
        reqwest::get(format!("http://{addr}/healthz"))
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    // The refusal is counted.
    drop(held);
    wait_until("the refused connection is counted", limit, || async {
        let Ok(response) = reqwest::get(format!("http://{addr}/metrics")).await else {
            return false;
        };
        let text = response.text().await.unwrap_or_default();
        crate::metric_sum(&text, "hookq_api_connections_refused_total") >= 1.0
    })
    .await;
    daemon.stop().await.expect("clean stop");
}

/// Reads from `stream` until one whole `content-length` answer has
/// arrived (the connection stays open); panics after `within`.
async fn first_answer(stream: &mut tokio::net::TcpStream, within: Duration) -> String {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let until = tokio::time::Instant::now() + within;
    loop {
        let text = String::from_utf8_lossy(&seen).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .expect("a content-length");
            if body.len() >= length {
                return text;
            }
        }
        let mut buf = [0u8; 4096];
        match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => seen.extend_from_slice(&buf[..n]),
            other => panic!("no whole answer within {within:?} ({other:?}): {text}"),
        }
    }
}

/// `GET /v1/stats` carries the counts of each partition, and they add up
/// to the totals.
#[tokio::test]
async fn stats_show_each_partitions_counts() {
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    for i in 0..20 {
        post_created(
            &format!("{base}/v1/jobs"),
            json!({"id": format!("st-{i}"), "url": "http://127.0.0.1:9/x", "delay": "1h"}),
        )
        .await;
    }
    let (status, stats) = get_json(&format!("{base}/v1/stats")).await;
    assert_eq!(status, 200, "{stats}");
    let partitions = stats["partitions"].as_array().expect("partitions");
    assert_eq!(partitions.len(), usize::from(config.redis.partitions));
    let scheduled: u64 = partitions
        .iter()
        .map(|p| p["scheduled"].as_u64().expect("scheduled"))
        .sum();
    assert_eq!(scheduled, 20);
    assert_eq!(stats["scheduled"], 20);
    assert_eq!(partitions[3]["partition"], 3);
    daemon.stop().await.expect("clean stop");
}

/// A primary and a replica of it, the replica in sync.
async fn primary_with_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    wait_until(
        "the replica is in sync",
        Duration::from_secs(20),
        || async {
            let mut conn = replica.conn().await;
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            info.contains("master_link_status:up")
        },
    )
    .await;
    (primary, replica)
}

/// Sends `sig` (`STOP`, `CONT`) to the Redis `server`: a stopped replica
/// keeps its link to the primary but acknowledges nothing.
fn signal_redis(server: &RedisServer, sig: &str) {
    let pid = server.pid().expect("the server runs");
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{sig} {pid}");
}

/// Whether the job record of `id` is on `server` (a primary or a replica).
async fn has_job(server: &RedisServer, config: &hookq::config::Config, id: &str) -> bool {
    let keys = hookq::store::Keys::new(&config.redis.namespace, config.redis.partitions);
    let p = keys.partition_of(id);
    let mut conn = server.conn().await;
    redis::cmd("HEXISTS")
        .arg(keys.live_records(p, id))
        .arg(id)
        .query_async(&mut conn)
        .await
        .expect("HEXISTS")
}

/// `redis.ack_replicas`: a write is acknowledged only once a replica has
/// it. With the replica stopped (SIGSTOP: its link stays up, it acks
/// nothing) a create lands on the primary but its answer waits, blocked
/// in `WAIT`; resumed, the replica gets the job and only then does the 201
/// come. Loopback replication is sub-millisecond, so a check of the
/// replica after an ordinary create would pass without `WAIT`; this one
/// cannot. With the replica gone, doctor warns.
#[tokio::test]
async fn acknowledged_writes_wait_for_their_replica() {
    let (primary, mut replica) = primary_with_replica().await;
    let mut config = test_config(&primary);
    config.redis.ack_replicas = 1;
    // Long enough that the stopped replica, not the timeout, ends the wait.
    config.redis.ack_timeout = Duration::from_secs(20);
    let daemon = start_daemon(&config).await;
    let jobs = format!("{}/v1/jobs", daemon.url());
    let job = |id: &str| json!({"id": id, "url": "http://127.0.0.1:9/x", "delay": "1h"});
    post_created(&jobs, job("acked-1")).await;
    assert!(has_job(&replica, &config, "acked-1").await);

    signal_redis(&replica, "STOP");
    let create = tokio::spawn({
        let jobs = jobs.clone();
        async move {
            let answer = post_json(&jobs, job("acked-2")).await;
            (answer, std::time::Instant::now())
        }
    });
    // The write landed on the primary, and the daemon waits for the
    // replica (its connection blocked in WAIT) instead of answering.
    wait_until(
        "the create landed and waits in WAIT",
        Duration::from_secs(10),
        || async {
            has_job(&primary, &config, "acked-2").await
                && primary
                    .info_field("clients", "blocked_clients")
                    .await
                    .is_ok_and(|n| n >= 1)
        },
    )
    .await;
    assert!(
        !create.is_finished(),
        "the create was answered while the replica could not have it"
    );
    let resumed_at = std::time::Instant::now();
    signal_redis(&replica, "CONT");
    let ((status, answer), answered_at) = create.await.expect("the create task");
    assert_eq!(status, 201, "{answer}");
    assert!(
        answered_at > resumed_at,
        "acknowledged before the replica was resumed"
    );
    assert!(
        has_job(&replica, &config, "acked-2").await,
        "the acknowledged job is not on the replica"
    );

    replica.kill();
    wait_until(
        "the primary lost its replica",
        Duration::from_secs(10),
        || async {
            primary
                .info_field("replication", "connected_slaves")
                .await
                .is_ok_and(|n| n == 0)
        },
    )
    .await;
    let report = hookq::doctor::run(&config).await;
    let replicas = report
        .checks
        .iter()
        .find(|c| c.name == "replicas")
        .expect("doctor checks the replicas");
    assert!(replicas.detail.contains("0 replica"), "{}", replicas.detail);
    assert_eq!(replicas.status, hookq::doctor::Status::Warn);
    daemon.stop().await.expect("clean stop");
}

/// With the replica stopped, every write the API acknowledges answers 503
/// `not_replicated` (naming no field: the client retries the same id):
/// create, batch, PATCH, cancel, replay and drop of dead letters, and
/// the schedule writes (create, PATCH, pause, resume, delete). Nothing is
/// acknowledged; once the replica is back, the same create is answered.
#[tokio::test]
async fn no_write_is_acknowledged_while_the_replica_is_stopped() {
    use crate::api::send;
    use reqwest::Method;
    let (primary, replica) = primary_with_replica().await;
    let gone = Receiver::with_status(410).await;
    let mut config = test_config(&primary);
    config.redis.ack_replicas = 1;
    config.redis.ack_timeout = Duration::from_millis(300);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let job = |id: &str| json!({"id": id, "url": "http://127.0.0.1:9/x", "delay": "1h"});
    // What the writes act on, made while the replica is live.
    for id in ["to-patch", "to-cancel"] {
        post_created(&format!("{base}/v1/jobs"), job(id)).await;
    }
    for id in ["dead-replay", "dead-drop"] {
        post_created(
            &format!("{base}/v1/jobs"),
            json!({"id": id, "url": gone.url("/gone"), "retry": []}),
        )
        .await;
        wait_state(&base, id, "dead").await;
    }
    let schedule = json!({"id": "sched", "every": "1h", "job": {"url": "http://127.0.0.1:9/s"}});
    let (status, created) = post_json(&format!("{base}/v1/schedules"), schedule).await;
    assert_eq!(status, 201, "{created}");

    signal_redis(&replica, "STOP");
    let writes: Vec<(Method, String, Option<Value>)> = vec![
        (Method::POST, "/v1/jobs".into(), Some(job("new-1"))),
        (
            Method::POST,
            "/v1/jobs/batch".into(),
            Some(json!({"jobs": [job("batch-1"), job("batch-2"), job("batch-3")]})),
        ),
        (
            Method::PATCH,
            "/v1/jobs/to-patch".into(),
            Some(json!({"delay": "2h"})),
        ),
        (Method::DELETE, "/v1/jobs/to-cancel".into(), None),
        (
            Method::POST,
            "/v1/dead-letters/replay".into(),
            Some(json!({"ids": ["dead-replay"]})),
        ),
        (Method::DELETE, "/v1/dead-letters/dead-drop".into(), None),
        (
            Method::POST,
            "/v1/schedules".into(),
            Some(json!({"id": "sched-2", "every": "1h", "job": {"url": "http://127.0.0.1:9/s"}})),
        ),
        (
            Method::PATCH,
            "/v1/schedules/sched".into(),
            Some(json!({"every": "2h"})),
        ),
        (Method::POST, "/v1/schedules/sched/pause".into(), None),
        (Method::POST, "/v1/schedules/sched/resume".into(), None),
        (Method::DELETE, "/v1/schedules/sched".into(), None),
    ];
    for (method, path, body) in writes {
        let (status, answer) = send(method.clone(), &format!("{base}{path}"), body).await;
        assert_eq!(
            (status, &answer["error"]["code"]),
            (503, &json!("not_replicated")),
            "{method} {path} was acknowledged without its replica: {answer}"
        );
        assert!(answer["error"]["field"].is_null(), "{answer}");
    }
    signal_redis(&replica, "CONT");
    // The write may have landed: the same create again is answered.
    wait_until(
        "the same create is acknowledged once the replica is back",
        Duration::from_secs(20),
        || async {
            let (status, _) = post_json(&format!("{base}/v1/jobs"), job("new-1")).await;
            status == 200 || status == 201
        },
    )
    .await;
    daemon.stop().await.expect("clean stop");
}

/// A recorded outcome is `WAIT`ed for too: with the replica stopped, the
/// daemon does not take a delivery's success (complete) or a failure
/// (fail) as recorded: it records it again (each try counted in
/// `hookq_writes_not_replicated_total`) until the replica is back, and the
/// replica then holds the job's record as the primary does. Each outcome
/// on a primary, replica and daemon of its own.
#[tokio::test]
async fn outcomes_are_recorded_only_once_their_replica_has_them() {
    let ok = Receiver::ok().await;
    let failing = Receiver::with_status(500).await;
    tokio::join!(
        outcome_waits_for_its_replica("outcome-complete", &ok, "delivered"),
        outcome_waits_for_its_replica("outcome-fail", &failing, "scheduled"),
    );
}

/// Job `id` to `receiver`, attempted while the replica is stopped: its
/// outcome is recorded again until the replica is back, then the job is
/// in `state` and the replica holds its record as the primary does.
async fn outcome_waits_for_its_replica(id: &str, receiver: &Receiver, state: &str) {
    let (primary, replica) = primary_with_replica().await;
    let config = test_config(&primary);
    // A daemon process of its own, so that its metrics are its own.
    let env = [
        ("HOOKQ_REDIS__ACK_REPLICAS", "1"),
        // Room for a live replica's acknowledgement on a loaded machine
        // (at 200 ms the create once answered 503 in a full run).
        ("HOOKQ_REDIS__ACK_TIMEOUT", "1s"),
        // A recording is retried until the attempt's lease would expire:
        // a long one leaves time for several tries while the replica is
        // stopped.
        ("HOOKQ_DELIVERY__TIMEOUT", "20s"),
    ];
    let (_serve, base) = serve_ready(&primary, &env).await;
    let not_replicated = || {
        let base = base.clone();
        async move {
            let text = crate::metrics_text(&base).await;
            crate::metric_sum(&text, "hookq_writes_not_replicated_total")
        }
    };
    let keys = hookq::store::Keys::new(&config.redis.namespace, config.redis.partitions);
    let record = |server: &RedisServer| {
        let key = keys.live_records(keys.partition_of(id), id);
        let id = id.to_string();
        let url = server.url();
        async move {
            let mut conn = redis::Client::open(url)
                .expect("url")
                .get_multiplexed_async_connection()
                .await
                .expect("connect");
            let value: Option<Vec<u8>> = redis::cmd("HGET")
                .arg(key)
                .arg(id)
                .query_async(&mut conn)
                .await
                .expect("HGET");
            value
        }
    };
    // Acknowledged while the replica is live; due 3 s later, by when it is
    // stopped (the next two steps take milliseconds). The next rung is an
    // hour away: one attempt only.
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": id, "url": receiver.url(&format!("/{id}")), "retry": ["1h"], "delay": "3s"}),
    )
    .await;
    assert_eq!(not_replicated().await, 0.0);
    signal_redis(&replica, "STOP");
    wait_until(
        &format!("{id}: its outcome is recorded again while unreplicated"),
        Duration::from_secs(15),
        || async { not_replicated().await >= 2.0 },
    )
    .await;
    signal_redis(&replica, "CONT");
    wait_state(&base, id, state).await;
    wait_until(
        &format!("{id}: the replica holds the recorded outcome"),
        Duration::from_secs(20),
        || async { record(&replica).await == record(&primary).await },
    )
    .await;
    let attempts = receiver
        .requests()
        .iter()
        .filter(|r| r.path == format!("/{id}"))
        .count();
    assert_eq!(attempts, 1, "{id} was attempted again");
}
