//! The job input holes of the second security review (issue 35), end to end
//! against a real daemon and Redis: credentials in a job's URL, exact number
//! identity, error messages that quote at most 100 bytes of their input,
//! header names given twice, and a schedule's reserved fire ids.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::receiver::Receiver;
use crate::support::redis::RedisServer;
use crate::{get_json, post_created, post_json, start_daemon, test_config};

/// Most bytes an error message quotes of its input (SPEC §14).
const MAX_QUOTE: usize = 100;

/// Sends `body` (JSON text, as written) with `method` to `url`; the status
/// and the answer's text.
async fn send_raw(method: reqwest::Method, url: &str, body: String) -> (u16, String) {
    let response = reqwest::Client::new()
        .request(method, url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("request is sent");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// POSTs `body` (JSON text, as written: numbers no `Value` can hold) to
/// `url`; the status and the JSON answer.
async fn post_raw(url: &str, body: String) -> (u16, Value) {
    let (status, text) = send_raw(reqwest::Method::POST, url, body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn patch(url: &str, body: Value) -> (u16, Value) {
    let (status, text) = send_raw(reqwest::Method::PATCH, url, body.to_string()).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Panics unless `answer` is a 400 naming `field`.
fn assert_refused(status: u16, answer: &Value, field: &str, what: &str) {
    assert_eq!(status, 400, "{what}: {answer}");
    assert_eq!(answer["error"]["field"], field, "{what}: {answer}");
}

/// A job's URL may not carry `user:password@`: create, batch item, PATCH,
/// dead-letter replay and a schedule's job template all refuse it (400
/// naming the url field), and no answer shows the password.
#[tokio::test]
async fn urls_with_credentials_are_refused_everywhere() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let jobs = format!("{base}/v1/jobs");
    let secret = "S3cretPW";
    let with_password = format!("http://alice:{secret}@{}/hook", receiver.addr());
    let with_user = format!("http://apikey-4f2a@{}/hook", receiver.addr());
    for url in [&with_password, &with_user] {
        let (status, answer) = post_json(&jobs, json!({"url": url, "delay": "1h"})).await;
        assert_refused(status, &answer, "url", "create");
        assert!(!answer.to_string().contains(secret), "{answer}");
    }
    let (status, answer) = post_json(
        &format!("{jobs}/batch"),
        json!({"jobs": [{"id": "b-1", "url": with_password, "delay": "1h"}]}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let item = &answer["results"][0];
    assert_eq!(item["status"], 400, "{answer}");
    assert_eq!(item["error"]["field"], "url", "{answer}");
    assert!(!answer.to_string().contains(secret), "{answer}");

    post_created(
        &jobs,
        json!({"id": "p-1", "url": receiver.url("/hook"), "delay": "1h"}),
    )
    .await;
    let (status, answer) = patch(&format!("{jobs}/p-1"), json!({"url": with_password})).await;
    assert_refused(status, &answer, "url", "PATCH");
    let (_, view) = get_json(&format!("{jobs}/p-1")).await;
    assert_eq!(
        view["url"],
        receiver.url("/hook"),
        "the PATCH changed nothing"
    );

    let (status, answer) = post_json(
        &format!("{base}/v1/dead-letters/replay"),
        json!({"ids": ["p-1"], "url": with_password}),
    )
    .await;
    assert_refused(status, &answer, "url", "replay");

    let (status, answer) = post_json(
        &format!("{base}/v1/schedules"),
        json!({"id": "s-1", "every": "1h", "job": {"url": with_password}}),
    )
    .await;
    assert_refused(status, &answer, "job.url", "schedule");
}

/// A job stored with credentials in its URL (before they were refused:
/// written here straight through the store, as an older hookq did) never
/// shows its password: job view, listing, dead letter (listed and read)
/// and `hookq show` show the URL with its credentials masked.
#[tokio::test]
async fn a_url_stored_with_credentials_is_masked_in_every_view() {
    let redis = RedisServer::start();
    let failing = Receiver::with_status(500).await;
    let config = test_config(&redis);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let store = hookq::store::Store::connect(&config).await.expect("store");
    let secret = "S3cretPW";
    let stored_url = format!("http://alice:{secret}@{}/hook", failing.addr());
    for (id, extra) in [
        ("cred-live", json!({"delay": "1h"})),
        ("cred-dead", json!({"retry": []})),
    ] {
        let mut input = json!({"id": id, "url": failing.url("/hook")});
        input
            .as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        let input: hookq::job::JobInput = serde_json::from_value(input).expect("input");
        let mut job = input.validate(&config).expect("valid");
        job.spec.url = stored_url.clone();
        store.enqueue(&job.new_job(&config)).await.expect("stored");
    }
    crate::wait_state(&base, "cred-dead", "dead").await;

    let masked = format!("http://***@{}/hook", failing.addr());
    let (_, view) = get_json(&format!("{base}/v1/jobs/cred-live")).await;
    assert_eq!(view["url"], masked, "{view}");
    let (_, list) = get_json(&format!("{base}/v1/jobs?state=scheduled")).await;
    assert_eq!(list["jobs"][0]["url"], masked, "{list}");
    let (_, letters) = get_json(&format!("{base}/v1/dead-letters")).await;
    assert_eq!(
        letters["dead_letters"][0]["job"]["url"], masked,
        "{letters}"
    );
    let (_, letter) = get_json(&format!("{base}/v1/dead-letters/cred-dead")).await;
    assert_eq!(letter["job"]["url"], masked, "{letter}");
    let shown = crate::ops::hookq(&redis, &config.redis.namespace, &["show", "cred-live"]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains(&masked), "{shown}");
    for text in [
        view.to_string(),
        list.to_string(),
        letters.to_string(),
        letter.to_string(),
        shown.to_string(),
    ] {
        assert!(!text.contains(secret), "{text}");
    }
}

/// Two bodies are the same content only if every number is the same
/// exactly: `1e400` is refused (400 naming `body`), 2^64 and 2^64 + 1 are
/// two bodies (409 on the second create of the id), and a body re-spelled
/// with its numbers unchanged is the same job (200). Batch items and a
/// schedule's job template are compared the same way.
#[tokio::test]
async fn numbers_are_compared_exactly() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let jobs = format!("{base}/v1/jobs");
    let url = receiver.url("/hook");
    let job = |id: &str, body: &str| {
        format!(r#"{{"id":"{id}","url":"{url}","delay":"1h","body":{body}}}"#)
    };
    const TWO_64: &str = "18446744073709551616";
    const TWO_64_PLUS_1: &str = "18446744073709551617";

    let (status, answer) = post_raw(&jobs, job("huge", r#"{"x":1e400,"a":1}"#)).await;
    assert_refused(status, &answer, "body", "1e400");
    let (status, answer) = post_raw(&jobs, job("n-1", &format!(r#"{{"n":{TWO_64},"a":1}}"#))).await;
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = post_raw(
        &jobs,
        job("n-1", &format!(r#"{{"n":{TWO_64_PLUS_1},"a":1}}"#)),
    )
    .await;
    assert_eq!(status, 409, "2^64 + 1 is another body than 2^64: {answer}");
    let (status, answer) = post_raw(
        &jobs,
        job("n-1", &format!(r#"{{ "a": 1, "n": {TWO_64} }}"#)),
    )
    .await;
    assert_eq!(status, 200, "the same numbers re-spelled: {answer}");
    let (_, view) = get_json(&format!("{jobs}/n-1")).await;
    assert_eq!(view["body"]["a"], 1, "{view}");

    // Batch items: the same rule, item by item.
    let batch = format!(
        r#"{{"jobs":[{},{},{}]}}"#,
        job("n-1", &format!(r#"{{"n":{TWO_64_PLUS_1},"a":1}}"#)),
        job("n-1", &format!(r#"{{"a":1,"n":{TWO_64}}}"#)),
        job("huge", "[1e400]"),
    );
    let (status, answer) = post_raw(&format!("{jobs}/batch"), batch).await;
    assert_eq!(status, 200, "{answer}");
    let statuses: Vec<&Value> = (0..3).map(|i| &answer["results"][i]["status"]).collect();
    assert_eq!(
        statuses,
        [&json!(409), &json!(200), &json!(400)],
        "{answer}"
    );
    assert_eq!(answer["results"][2]["error"]["field"], "body", "{answer}");

    // A schedule's job template.
    let schedule = |n: &str| {
        format!(r#"{{"id":"s-n","every":"1h","job":{{"url":"{url}","body":{{"n":{n}}}}}}}"#)
    };
    let schedules = format!("{base}/v1/schedules");
    let (status, answer) = post_raw(&schedules, schedule(TWO_64)).await;
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = post_raw(&schedules, schedule(TWO_64_PLUS_1)).await;
    assert_eq!(status, 409, "{answer}");
    let (status, answer) = post_raw(&schedules, schedule("1e400")).await;
    assert_refused(status, &answer, "job.body", "a template with 1e400");
}

/// An error message quotes at most 100 bytes of what it refuses: a batch
/// of 1,000 items, each with a 10 KB header name that is not valid, answers
/// about 1,000 short errors (it answered each name twice, 20 MB); a 1 MB
/// value of a field that is quoted answers under 1 KB.
#[tokio::test]
async fn error_messages_quote_at_most_100_bytes_of_their_input() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let jobs = format!("{base}/v1/jobs");
    let url = receiver.url("/hook");

    let items = 1000;
    let bad_name = format!("{} x", "n".repeat(10_000));
    let batch: Vec<Value> = (0..items)
        .map(|i| json!({"id": format!("q-{i}"), "url": url, "headers": {bad_name.clone(): "v"}}))
        .collect();
    let (status, text) = send_raw(
        reqwest::Method::POST,
        &format!("{jobs}/batch"),
        json!({"jobs": batch}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{}", &text[..text.len().min(500)]);
    let answer: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        answer["results"][items - 1]["error"]["code"],
        "invalid_header"
    );
    // Per item: the name quoted twice (message and field), each at most
    // MAX_QUOTE bytes and `…`, and under 200 bytes of JSON around them.
    let bound = items * (2 * (MAX_QUOTE + 3) + 200);
    assert!(
        text.len() < bound,
        "{} bytes answered for {items} refused items (bound {bound})",
        text.len()
    );

    // One field at a time: 1 MB of it (under api.max_body), quoted in
    // the answer at most MAX_QUOTE bytes.
    let huge = "7".repeat(1_000_000);
    for (field, body) in [
        ("url", json!({"url": format!("http://a.example/{huge}")})),
        ("method", json!({"url": url, "method": huge})),
        ("delay", json!({"url": url, "delay": huge})),
        ("run_at", json!({"url": url, "run_at": huge})),
        ("retry[0]", json!({"url": url, "retry": [huge]})),
        ("retry", json!({"url": url, "retry": huge})),
        ("id", json!({"url": url, "id": huge})),
        ("topic", json!({"url": url, "topic": huge})),
        ("ordering_key", json!({"url": url, "ordering_key": huge})),
        (huge.as_str(), json!({"url": url, huge.clone(): 1})),
    ] {
        let (status, text) = send_raw(reqwest::Method::POST, &jobs, body.to_string()).await;
        let name = &field[..field.len().min(20)];
        assert_eq!(status, 400, "{name}: {}", &text[..text.len().min(500)]);
        assert!(
            text.len() < 1024,
            "{name}: {} bytes: {}",
            text.len(),
            &text[..500]
        );
    }
    let (status, text) = send_raw(
        reqwest::Method::POST,
        &format!("{base}/v1/dead-letters/replay"),
        json!({"all": true, "since": huge}).to_string(),
    )
    .await;
    assert_eq!(status, 400, "{}", &text[..text.len().min(500)]);
    assert!(text.len() < 1024, "since: {} bytes", text.len());
    // A query parameter's name (hyper takes a URI of some 64 KB).
    let long_name = "p".repeat(30_000);
    let (status, answer) = get_json(&format!("{jobs}?{long_name}=1")).await;
    assert_eq!(status, 400);
    assert!(
        answer.to_string().len() < 1024,
        "{} bytes",
        answer.to_string().len()
    );
}

/// Header names are case-insensitive: `X-A` and `x-a` in one job's
/// `headers` would both be sent; create, batch item, PATCH, replay and a
/// schedule's job template refuse them, naming `headers`.
#[tokio::test]
async fn header_names_given_twice_in_any_case_are_refused() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let jobs = format!("{base}/v1/jobs");
    let url = receiver.url("/hook");
    let twice = json!({"X-A": "1", "x-a": "2"});

    let (status, answer) =
        post_json(&jobs, json!({"url": url, "delay": "1h", "headers": twice})).await;
    assert_refused(status, &answer, "headers", "create");
    let (_, answer) = post_json(
        &format!("{jobs}/batch"),
        json!({"jobs": [{"id": "h-b", "url": url, "delay": "1h", "headers": twice}]}),
    )
    .await;
    assert_eq!(answer["results"][0]["status"], 400, "{answer}");
    assert_eq!(
        answer["results"][0]["error"]["field"], "headers",
        "{answer}"
    );
    post_created(
        &jobs,
        json!({"id": "h-1", "url": url, "delay": "1h", "headers": {"X-A": "1"}}),
    )
    .await;
    let (status, answer) = patch(&format!("{jobs}/h-1"), json!({"headers": twice})).await;
    assert_refused(status, &answer, "headers", "PATCH");
    let (status, answer) = post_json(
        &format!("{base}/v1/dead-letters/replay"),
        json!({"ids": ["h-1"], "headers": twice}),
    )
    .await;
    assert_refused(status, &answer, "headers", "replay");
    let (status, answer) = post_json(
        &format!("{base}/v1/schedules"),
        json!({"id": "s-h", "every": "1h", "job": {"url": url, "headers": twice}}),
    )
    .await;
    assert_refused(status, &answer, "job.headers", "schedule");
    // One name in each case is fine.
    post_created(
        &jobs,
        json!({"url": url, "delay": "1h", "headers": {"X-A": "1", "X-B": "2"}}),
    )
    .await;
}

/// A schedule's fire ids (`<schedule id>:<13 digits>`) are its own: a
/// create of one by hand is refused (409 `reserved_id` naming `id`), alone,
/// in a batch, or with an ordering key that places the job elsewhere, and
/// whether the schedule lives in its id's partition or, with an ordering
/// key of its own, in its key's. The schedule's firing still creates its
/// job, with the template's URL (a hand-made job of that id took its place:
/// the receiver got the hand-made URL).
#[tokio::test]
async fn a_schedules_fire_ids_are_its_own() {
    let redis = RedisServer::start();
    let template = Receiver::ok().await;
    let hand = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let jobs = format!("{base}/v1/jobs");
    let schedules = format!("{base}/v1/schedules");
    post_created(
        &schedules,
        json!({"id": "tk", "every": "2s", "job": {"url": template.url("/tmpl")}}),
    )
    .await;
    post_created(
        &schedules,
        json!({"id": "tko", "every": "1h", "job": {"url": template.url("/o"), "ordering_key": "ko"}}),
    )
    .await;
    let first = template.wait_for_count(1, Duration::from_secs(15)).await;
    let fired = first[0]
        .header("webhook-id")
        .expect("webhook-id")
        .to_string();
    let at: i64 = fired
        .strip_prefix("tk:")
        .and_then(|t| t.parse().ok())
        .expect("a fire id");
    let next = format!("tk:{}", at + 2000);

    let assert_reserved = |status: u16, answer: &Value, what: &str| {
        assert_eq!(status, 409, "{what}: {answer}");
        assert_eq!(answer["error"]["code"], "reserved_id", "{what}: {answer}");
        assert_eq!(answer["error"]["field"], "id", "{what}: {answer}");
    };
    let (status, answer) = post_json(&jobs, json!({"id": next, "url": hand.url("/hand")})).await;
    assert_reserved(status, &answer, "the next fire time");
    // An ordering key whose jobs live in neither the schedule's partition
    // nor the job id's (a create there never passes where the schedule
    // lives: only a check before it can see the schedule).
    let config = test_config(&redis);
    let keys = hookq::store::keys::Keys::new(&config.redis.namespace, config.redis.partitions);
    let elsewhere = |schedule_home: &str, id: &str| {
        let taken = [keys.partition_of(schedule_home), keys.partition_of(id)];
        (0..)
            .map(|i| format!("k{i}"))
            .find(|k| !taken.contains(&keys.partition_of(&format!("default:{k}"))))
            .expect("a key in another partition")
    };
    let id = format!("tk:{}", at + 4000);
    let (status, answer) = post_json(
        &jobs,
        json!({"id": id, "url": hand.url("/hand"), "ordering_key": elsewhere("tk", &id)}),
    )
    .await;
    assert_reserved(status, &answer, "with an ordering key");
    let (_, answer) = post_json(
        &format!("{jobs}/batch"),
        json!({"jobs": [{"id": format!("tk:{}", at + 6000), "url": hand.url("/hand")}]}),
    )
    .await;
    let item = &answer["results"][0];
    assert_eq!(item["status"], 409, "batch: {answer}");
    assert_eq!(item["error"]["code"], "reserved_id", "batch: {answer}");
    // `tko` lives in the partition of its key `ko` (a stub in its id's).
    for body in [
        json!({"id": "tko:1234567890123", "url": hand.url("/hand")}),
        json!({"id": "tko:1234567890123", "url": hand.url("/hand"),
            "ordering_key": elsewhere("default:ko", "tko:1234567890123")}),
        json!({"id": "tko:1234567890123", "url": hand.url("/hand"), "ordering_key": "ko"}),
    ] {
        let (status, answer) = post_json(&jobs, body.clone()).await;
        assert_reserved(status, &answer, &body.to_string());
    }
    // No such schedule, or not 13 digits: an id like any other.
    for id in ["nosuch:1234567890123", "tk:123456789012"] {
        post_created(
            &jobs,
            json!({"id": id, "url": hand.url("/later"), "delay": "1h"}),
        )
        .await;
    }

    // The firing of `next` creates the schedule's job, sent to the
    // template's URL (the receiver of the template's URL got it).
    crate::support::wait_until(
        "the next fire time is delivered",
        Duration::from_secs(15),
        || {
            let template = &template;
            let next = next.clone();
            async move {
                template
                    .requests()
                    .iter()
                    .any(|r| r.header("webhook-id") == Some(next.as_str()))
            }
        },
    )
    .await;
    let (_, view) = get_json(&format!("{jobs}/{next}")).await;
    assert_eq!(view["schedule_id"], "tk", "{view}");
    assert_eq!(hand.count(), 0, "a hand-made job was delivered");
}
