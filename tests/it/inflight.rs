//! Cancel and PATCH of a job a worker already has (SPEC §16, §6): a cancel
//! answered 204 means no attempt is ever sent; once the job is claimed
//! (held in a daemon for its host, or in flight) a cancel answers 202
//! `in_flight: true` (the attempt under way may arrive, none after it) and
//! a PATCH 409 `in_flight`, changing nothing. Against real daemons, Redis,
//! receivers, the CLI binary and the console in Chromium.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::api::send;
use crate::support::hanging::HangingHost;
use crate::support::receiver::{Receiver, Recorded, Reply};
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{get_json, job_view, post_created, start_daemon, test_config};

/// Wall-clock epoch ms (the daemon reads Redis's clock: the same machine's).
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

/// The attempts each `webhook-id` received (a set would hide a double).
fn arrivals(receiver: &Receiver) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for r in receiver.requests() {
        let id = r.header("webhook-id").expect("webhook-id").to_string();
        *out.entry(id).or_default() += 1;
    }
    out
}

/// Asserts a 202 cancel's answer: `{"state": "cancelled", "in_flight": true}`
/// naming the job.
fn assert_in_flight_cancel(status: u16, body: &Value, id: &str) {
    assert_eq!(status, 202, "cancel of {id}: {body}");
    assert_eq!(
        body,
        &json!({"id": id, "tenant": "default", "state": "cancelled", "in_flight": true}),
        "cancel of {id}"
    );
}

/// Asserts a PATCH of `id` answers 409 `in_flight` and leaves its view as
/// it was.
/// A PATCH of job `id` (on `jobs`, the jobs URL) answers 409
/// `not_scheduled`: it is ready or finished, not in flight.
pub(crate) async fn assert_patch_not_scheduled(jobs: &str, id: &str) {
    let (status, body) = send(
        reqwest::Method::PATCH,
        &format!("{jobs}/{id}"),
        Some(json!({"delay": "1h"})),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (409, &json!("not_scheduled")),
        "{body}"
    );
}

async fn assert_patch_refused(base: &str, id: &str) {
    let before = job_view(base, id).await;
    assert_eq!(before["state"], "inflight", "{before}");
    let url = format!("{base}/v1/jobs/{id}");
    for patch in [json!({"body": {"v": "new"}}), json!({"delay": "1h"})] {
        let (status, body) = send(reqwest::Method::PATCH, &url, Some(patch.clone())).await;
        assert_eq!(status, 409, "PATCH {patch} of {id}: {body}");
        assert_eq!(body["error"]["code"], "in_flight", "PATCH {patch}: {body}");
        assert!(body["error"]["message"].is_string(), "{body}");
    }
    assert_eq!(
        job_view(base, id).await,
        before,
        "a refused PATCH changed {id}"
    );
}

/// A job claimed and held for its busy host (per-host limit 1, the lane
/// taken by an attempt to a host that never answers): PATCH 409
/// `in_flight`, cancel 202; once the lane is free it is never attempted.
#[tokio::test]
async fn a_job_held_for_its_busy_host_cancels_202_and_is_never_attempted() {
    let redis = RedisServer::start();
    let host = HangingHost::start().await;
    let mut config = test_config(&redis);
    config.delivery.per_host_concurrency = 1;
    // A claimed job waits in memory for its host at most half the lease
    // margin, then goes back to Redis until its booked turn: the default
    // margin (20 s) keeps `held` claimed throughout the test.
    config.delivery.lease_margin = Duration::from_secs(20);
    config.delivery.max_timeout = Duration::from_secs(10);
    config.validate().expect("valid config");
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let jobs = format!("{base}/v1/jobs");
    // `first` takes the host's one lane until its 6 s timeout (time for
    // the requests below, under load too), then dies (no retry); `held`
    // waits behind it, claimed.
    post_created(
        &jobs,
        json!({"id": "first", "url": host.url("/a"), "timeout": "6s", "retry": []}),
    )
    .await;
    wait_until(
        "first reaches the host",
        Duration::from_secs(15),
        || async { host.accepted() == 1 },
    )
    .await;
    post_created(
        &jobs,
        json!({"id": "held", "url": host.url("/b"), "body": {"v": "old"}}),
    )
    .await;
    wait_until("held is claimed", Duration::from_secs(15), || async {
        job_view(&base, "held").await["state"] == "inflight"
    })
    .await;

    assert_patch_refused(&base, "held").await;
    let (status, body) = send(reqwest::Method::DELETE, &format!("{jobs}/held"), None).await;
    assert_in_flight_cancel(status, &body, "held");
    assert_eq!(job_view(&base, "held").await["state"], "cancelled");

    wait_until("first dies", Duration::from_secs(20), || async {
        job_view(&base, "first").await["state"] == "dead"
    })
    .await;
    // A finished job's PATCH keeps its own answer.
    assert_patch_not_scheduled(&jobs, "first").await;
    // The lane is free now: a held job that was not dropped starts at once,
    // or, past its time in memory (half the lease margin after its claim,
    // which came before first died), goes back to Redis, where a cancelled
    // job stays cancelled. Wait past that bound, then stop (draining any
    // attempt) and count.
    tokio::time::sleep(config.delivery.lease_margin / 2).await;
    daemon.stop().await.expect("clean stop");
    assert_eq!(host.accepted(), 1, "the cancelled held job was attempted");
}

/// A job cancelled while its attempt is at the receiver: PATCH 409
/// `in_flight`, cancel 202; the attempt's failure is discarded (no retry),
/// the job stays cancelled with nothing left to run, and the ledger counts
/// it once, as cancelled.
#[tokio::test]
async fn a_job_cancelled_mid_attempt_answers_202_and_is_not_retried() {
    let redis = RedisServer::start();
    let receiver = Receiver::start(std::sync::Arc::new(|r: &Recorded| {
        if r.header("hookq-attempt") == Some("1") {
            Reply::status(500).with_delay(Duration::from_secs(3))
        } else {
            Reply::status(200)
        }
    }))
    .await;
    let mut config = test_config(&redis);
    // Long enough for the stop below to drain the 3 s attempt.
    config.delivery.shutdown_grace = Duration::from_secs(10);
    config.validate().expect("valid config");
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let jobs = format!("{base}/v1/jobs");
    post_created(
        &jobs,
        json!({"id": "flying", "url": receiver.url("/f"), "timeout": "5s", "body": {"v": "old"}}),
    )
    .await;
    receiver.wait_for_count(1, Duration::from_secs(10)).await;
    assert_patch_refused(&base, "flying").await;
    let (status, body) = send(reqwest::Method::DELETE, &format!("{jobs}/flying"), None).await;
    assert_in_flight_cancel(status, &body, "flying");
    // A repeated cancel answers the same while the attempt may still come.
    let (status, body) = send(reqwest::Method::DELETE, &format!("{jobs}/flying"), None).await;
    assert_in_flight_cancel(status, &body, "flying");
    // A stop drains the running attempt: its 500 is handled before it returns.
    daemon.stop().await.expect("clean stop");

    // A second daemon finds nothing to run: no job is left live, so no
    // attempt can ever follow.
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    crate::wait_until_idle(&base, Duration::from_secs(10)).await;
    let view = job_view(&base, "flying").await;
    assert_eq!(view["state"], "cancelled", "{view}");
    let (status, tenant) = get_json(&format!("{base}/v1/tenants/default")).await;
    assert_eq!(status, 200, "{tenant}");
    for (counter, n) in [
        ("created", 1),
        ("cancelled", 1),
        ("delivered", 0),
        ("dead_lettered", 0),
        ("live", 0),
    ] {
        assert_eq!(tenant[counter], n, "{counter}: {tenant}");
    }
    daemon.stop().await.expect("clean stop");
    assert_eq!(receiver.count(), 1, "the cancelled job was retried");
}

/// 1,000 jobs due one every 5 ms, each cancelled 0–100 ms before its due
/// time: no job whose cancel answered 204 is ever received; one answered
/// 202 at most once; one answered 409 (delivered first) was received.
#[tokio::test]
async fn cancels_just_before_the_due_time_answer_204_only_when_nothing_is_sent() {
    const JOBS: i64 = 1000;
    const SPACING_MS: i64 = 5;
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let config = test_config(&redis);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    // Due from 5 s ahead (time to create them all), one every 5 ms.
    let first_due = now_ms() + 5000;
    let due = |i: i64| first_due + i * SPACING_MS;
    // Each cancel lands 0..=100 ms before its job's due time, spread.
    let lead = |i: i64| (i * 37) % 101;
    let batch: Vec<Value> = (0..JOBS)
        .map(|i| json!({"id": format!("c-{i}"), "url": receiver.url("/c"), "run_at": due(i)}))
        .collect();
    let (status, answer) =
        crate::post_json(&format!("{base}/v1/jobs/batch"), json!({"jobs": batch})).await;
    assert_eq!(status, 200, "{answer}");
    let created = answer["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter(|r| r["status"] == 201)
        .count();
    assert_eq!(created, JOBS as usize, "{answer}");
    assert!(now_ms() < due(0) - 100, "the jobs took too long to create");

    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for i in 0..JOBS {
        let client = client.clone();
        let url = format!("{base}/v1/jobs/c-{i}");
        let at = due(i) - lead(i);
        tasks.push(tokio::spawn(async move {
            let wait = u64::try_from(at - now_ms()).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let response = client.delete(&url).send().await.expect("DELETE");
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            (
                status,
                serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
            )
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("cancel task"));
    }

    // Every job ends cancelled or delivered; read each one's state, then
    // stop (draining any attempt under way) and count what arrived.
    crate::wait_until_idle(&base, Duration::from_secs(60)).await;
    let mut states = Vec::new();
    for i in 0..JOBS {
        states.push(job_view(&base, &format!("c-{i}")).await["state"].clone());
    }
    daemon.stop().await.expect("clean stop");
    let arrived = arrivals(&receiver);
    let (mut not_sent, mut in_flight, mut in_flight_arrived, mut delivered) = (0, 0, 0, 0);
    for (i, ((status, body), state)) in answers.iter().zip(&states).enumerate() {
        let id = format!("c-{i}");
        let n = arrived.get(&id).copied().unwrap_or(0);
        match status {
            204 => {
                not_sent += 1;
                assert_eq!(state, "cancelled", "{id}");
                assert_eq!(n, 0, "{id}: cancel answered 204, yet it arrived {n} times");
            }
            202 => {
                in_flight += 1;
                assert_in_flight_cancel(*status, body, &id);
                assert_eq!(state, "cancelled", "{id}");
                assert!(n <= 1, "{id}: cancelled in flight, arrived {n} times");
                in_flight_arrived += n;
            }
            409 => {
                delivered += 1;
                assert_eq!(body["error"]["code"], "finished", "{id}: {body}");
                assert_eq!(state, "delivered", "{id}");
                assert!(n >= 1, "{id}: delivered, but never arrived");
            }
            other => panic!("{id}: cancel answered {other}: {body}"),
        }
    }
    eprintln!(
        "cancels 0-100 ms before due, {JOBS} jobs: {not_sent} answered 204 (none arrived), \
         {in_flight} answered 202 ({in_flight_arrived} of them arrived), \
         {delivered} answered 409 (delivered first)"
    );
    assert_eq!(not_sent + in_flight + delivered, JOBS);
}

/// `hookq cancel` of a claimed job exits 0 and says, in words and in JSON,
/// that the attempt under way may still arrive; of a scheduled one, plainly
/// cancelled.
#[tokio::test]
async fn the_cli_says_when_a_cancelled_job_was_already_under_way() {
    use hookq::job::JobInput;
    let redis = RedisServer::start();
    let ns = "cli-inflight";
    let mut config = test_config(&redis);
    config.redis.namespace = ns.into();
    config.validate().expect("valid config");
    let store = hookq::store::Store::connect(&config).await.expect("store");
    for (id, delay) in [
        ("claimed", None),
        ("claimed-json", None),
        ("waiting", Some("1h")),
    ] {
        let input = JobInput {
            id: Some(id.into()),
            url: Some("http://127.0.0.1:9/never".into()),
            delay: delay.map(str::to_string),
            ..JobInput::default()
        };
        crate::enqueue_direct(&store, &config, input).await;
        if delay.is_none() {
            crate::claim_direct(&store, id).await;
        }
    }

    let out = crate::ops::hookq(&redis, ns, &["cancel", "claimed"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "cancelled claimed; an attempt already under way may still arrive\n"
    );
    let out = crate::ops::hookq(&redis, ns, &["--json", "cancel", "claimed-json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let answer: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        answer,
        json!({"id": "claimed-json", "tenant": "default", "state": "cancelled", "in_flight": true})
    );
    let out = crate::ops::hookq(&redis, ns, &["cancel", "waiting"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "cancelled waiting\n");
}

/// The console's cancel button says when the job was already under way
/// (its attempt is at a host that never answers), and says nothing more
/// for a job that no worker had.
#[tokio::test]
async fn the_console_says_when_a_cancelled_job_was_already_under_way() {
    use crate::support::browser::Browser;
    let redis = RedisServer::start();
    let host = HangingHost::start().await;
    let (token, key) = crate::security::new_key(&redis, "ops", "read,write");
    let mut config = test_config(&redis);
    config.api.keys = vec![key];
    config.delivery.max_timeout = Duration::from_secs(60);
    config.validate().expect("valid config");
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let jobs = format!("{base}/v1/jobs");
    crate::post_created_with(
        &jobs,
        &token,
        json!({"id": "flying", "url": host.url("/f"), "timeout": "60s"}),
    )
    .await;
    crate::post_created_with(
        &jobs,
        &token,
        json!({"id": "later", "url": host.url("/l"), "delay": "1h"}),
    )
    .await;
    wait_until(
        "flying reaches the host",
        Duration::from_secs(15),
        || async { host.accepted() == 1 },
    )
    .await;

    let browser = Browser::start().await;
    crate::console::log_in(&browser, &base, &token).await;
    browser.wait_text("#who", |t| !t.is_empty()).await;
    for (id, note) in [("flying", true), ("later", false)] {
        browser.goto(&format!("{base}/ui#/job/{id}")).await;
        browser.click("#cancel").await;
        browser
            .wait_text("#main table", |t| t.contains("cancelled"))
            .await;
        let shown = browser.text("#cancel-note").await;
        if note {
            let text = shown.expect("a note under the title");
            assert!(text.contains("may still arrive"), "{text}");
        } else {
            assert_eq!(shown, None, "{id} was never under way");
        }
        let (_, view) = crate::get_json_with(&format!("{jobs}/{id}"), &token).await;
        assert_eq!(view["state"], "cancelled", "{view}");
    }
    daemon.stop().await.expect("clean stop");
}

/// A repeated cancel answers as the first did, from a summary and from a
/// record kept whole (`retention.keep_bodies`): in flight for a job a
/// worker had when it was cancelled, cancelled outright for one never
/// claimed and for one cancelled between two attempts.
#[tokio::test]
async fn a_repeated_cancel_answers_as_the_first_did() {
    use hookq::job::JobInput;
    use hookq::store::{CancelOutcome, Failure, Store};
    let redis = RedisServer::start();
    for keep in [false, true] {
        let mut config = test_config(&redis);
        config.redis.namespace = format!("repeat-{keep}");
        config.retention.keep_bodies = keep;
        config.validate().expect("valid config");
        let store = Store::connect(&config).await.expect("store");
        let enqueue = |id: &'static str| {
            let input = JobInput {
                id: Some(id.into()),
                url: Some("http://127.0.0.1:9/never".into()),
                ..JobInput::default()
            };
            crate::enqueue_direct(&store, &config, input)
        };
        enqueue("never-claimed").await;
        enqueue("claimed").await;
        crate::claim_direct(&store, "claimed").await;
        // Attempt 1 failed, attempt 2 is an hour away.
        enqueue("between").await;
        let claim = crate::claim_direct(&store, "between").await;
        let failure = Failure {
            record: r#"{"attempt":1,"at":1,"duration_ms":5,"status":500}"#,
            last_error: "http_status",
            last_status: Some(500),
            topic: "default",
            action: hookq::retry::FailAction::Retry(Duration::from_secs(3600)),
        };
        store.fail(&claim, &failure).await.expect("fail");

        for (id, first, again) in [
            (
                "never-claimed",
                CancelOutcome::Cancelled,
                CancelOutcome::AlreadyCancelled,
            ),
            (
                "claimed",
                CancelOutcome::CancelledInFlight,
                CancelOutcome::AlreadyCancelledInFlight,
            ),
            (
                "between",
                CancelOutcome::Cancelled,
                CancelOutcome::AlreadyCancelled,
            ),
        ] {
            assert_eq!(
                store.cancel(id).await.expect("cancel"),
                first,
                "{id}, keep {keep}"
            );
            assert_eq!(
                store.cancel(id).await.expect("cancel"),
                again,
                "{id} again, keep {keep}"
            );
        }
    }
}
