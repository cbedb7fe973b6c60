//! A finished job's summary keeps its whole attempt history in compact form
//! (SPEC §11.2): each attempt's start, duration and status or error kind, the
//! last one also its message. Delivered after retries, cancelled after
//! failures or with an attempt in flight, and the longest ladder; what a
//! summary costs in Redis memory, and that its shards stay listpacks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hookq::config::Config;
use hookq::job::JobInput;
use hookq::retry::FailAction;
use hookq::store::{Failure, Store};
use serde_json::{json, Value};

use crate::support::receiver::{Receiver, Recorded, Reply};
use crate::support::redis::RedisServer;
use crate::support::store::{complete_claimed, made_summary_shards};
use crate::support::{rfc3339_ms, wait_until};
use crate::{get_json, job_view, post_created, start_daemon, test_config};

/// A receiver answering request n (from 0) with `reply(n)`.
async fn receiver_by_count(reply: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Receiver {
    let n = AtomicUsize::new(0);
    Receiver::start(Arc::new(move |_: &Recorded| {
        reply(n.fetch_add(1, Ordering::SeqCst))
    }))
    .await
}

/// Waits until job `id` is summarized (its record gone), and returns its view.
async fn wait_summarized(base: &str, id: &str) -> Value {
    wait_until(
        &format!("{id} is summarized"),
        Duration::from_secs(20),
        || async { job_view(base, id).await["summarized"] == true },
    )
    .await;
    job_view(base, id).await
}

/// The history of `view`, checked for its shape: newest first, numbered
/// down from `attempts`, starts in order.
fn history(view: &Value) -> &Vec<Value> {
    let h = view["history"].as_array().expect("history");
    for pair in h.windows(2) {
        assert!(
            rfc3339_ms(pair[0]["at"].as_str().expect("at"))
                >= rfc3339_ms(pair[1]["at"].as_str().expect("at")),
            "newest first: {view}"
        );
    }
    h
}

/// A job that fails once (a 500) and is delivered on its second attempt
/// shows both attempts once it is a summary: statuses, kinds, numbers, and
/// starts and durations as the receiver saw them.
#[tokio::test]
async fn a_job_delivered_after_a_500_shows_both_attempts() {
    let redis = RedisServer::start();
    let receiver = receiver_by_count(|n| {
        if n == 0 {
            Reply::status(500).with_delay(Duration::from_millis(30))
        } else {
            Reply::status(204)
        }
    })
    .await;
    let config = test_config(&redis);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "retried", "url": receiver.url("/r")}),
    )
    .await;
    let view = wait_summarized(&base, "retried").await;
    assert_eq!(view["state"], "delivered", "{view}");
    assert_eq!(view["attempts"], 2, "{view}");
    let h = history(&view);
    assert_eq!(h.len(), 2, "{view}");
    assert_eq!(
        (&h[0]["attempt"], &h[0]["status"]),
        (&json!(2), &json!(204))
    );
    assert!(h[0].get("error").is_none(), "{view}");
    assert_eq!(
        (&h[1]["attempt"], &h[1]["status"]),
        (&json!(1), &json!(500))
    );
    assert_eq!(h[1]["error"], "http_status", "{view}");
    // Starts within a second of the requests' arrival; the first took at
    // least the receiver's 30 ms delay and less than the attempt timeout.
    let got = receiver.requests();
    assert_eq!(got.len(), 2);
    for (attempt, request) in h.iter().rev().zip(&got) {
        let at = rfc3339_ms(attempt["at"].as_str().expect("at"));
        assert!(
            (request.received_ms() - at).abs() < 1_000,
            "{attempt} vs {}",
            request.received_ms()
        );
    }
    let took = h[1]["duration_ms"].as_u64().expect("duration");
    assert!((30..2_000).contains(&took), "{view}");
    // The gap between them is the ladder's first rung (50 ms) at least.
    let gap =
        rfc3339_ms(h[0]["at"].as_str().expect("at")) - rfc3339_ms(h[1]["at"].as_str().expect("at"));
    assert!(gap >= 50, "{view}");
    daemon.stop().await.expect("clean stop");
}

/// A job whose first attempt times out and second succeeds shows the
/// timeout's kind (no status) in its summary; its topic is long enough
/// (39 bytes) that even the summary's head and topic need two pieces.
#[tokio::test]
async fn a_timeout_before_the_delivery_shows_its_kind() {
    let redis = RedisServer::start();
    let receiver = receiver_by_count(|n| {
        if n == 0 {
            Reply::status(204).with_delay(Duration::from_millis(1_500))
        } else {
            Reply::status(204)
        }
    })
    .await;
    let config = test_config(&redis);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "slow-first", "url": receiver.url("/s"), "timeout": "300ms",
            "topic": "payments.refunds.completed.eu-west-1.v2"}),
    )
    .await;
    let view = wait_summarized(&base, "slow-first").await;
    assert_eq!(view["state"], "delivered", "{view}");
    assert_eq!(
        view["topic"], "payments.refunds.completed.eu-west-1.v2",
        "{view}"
    );
    let h = history(&view);
    assert_eq!(h.len(), 2, "{view}");
    assert_eq!(h[0]["status"], 204, "{view}");
    assert_eq!(h[1]["error"], "timeout", "{view}");
    assert!(h[1].get("status").is_none(), "{view}");
    let took = h[1]["duration_ms"].as_u64().expect("duration");
    assert!((300..1_500).contains(&took), "the timeout's 300 ms: {view}");
    daemon.stop().await.expect("clean stop");
}

/// A job cancelled while it waits after two refused connections keeps both
/// attempts (kind `connect`), the last with its message.
#[tokio::test]
async fn a_job_cancelled_after_two_refused_connections_shows_both() {
    let redis = RedisServer::start();
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let mut config = test_config(&redis);
    config.delivery.retry = vec![Duration::from_millis(50), Duration::from_secs(3600)];
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "refused", "url": format!("http://127.0.0.1:{closed}/x")}),
    )
    .await;
    wait_until("two attempts made", Duration::from_secs(15), || async {
        let view = job_view(&base, "refused").await;
        view["attempts"] == 2 && view["state"] == "scheduled"
    })
    .await;
    let url = format!("{base}/v1/jobs/refused");
    let status = reqwest::Client::new()
        .delete(&url)
        .send()
        .await
        .expect("DELETE")
        .status();
    assert_eq!(status, 204);
    let (_, view) = get_json(&url).await;
    assert_eq!(
        (&view["state"], &view["summarized"]),
        (&json!("cancelled"), &json!(true)),
        "{view}"
    );
    let h = history(&view);
    assert_eq!(h.len(), 2, "{view}");
    assert_eq!(
        (&h[0]["attempt"], &h[0]["error"]),
        (&json!(2), &json!("connect"))
    );
    assert!(
        h[0]["message"].as_str().is_some_and(|m| m.len() >= 20),
        "the last attempt keeps 32 bytes of its error text: {view}"
    );
    assert_eq!(
        (&h[1]["attempt"], &h[1]["error"]),
        (&json!(1), &json!("connect"))
    );
    daemon.stop().await.expect("clean stop");
}

/// A job cancelled while its second attempt is in flight keeps its first
/// attempt, numbered 1 (the attempt in flight has no outcome to keep).
#[tokio::test]
async fn a_cancel_during_the_second_attempt_keeps_the_first() {
    let redis = RedisServer::start();
    let receiver = receiver_by_count(|n| {
        if n == 0 {
            Reply::status(503)
        } else {
            Reply::status(204).with_delay(Duration::from_millis(1_500))
        }
    })
    .await;
    let config = test_config(&redis);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "in-flight", "url": receiver.url("/f")}),
    )
    .await;
    receiver.wait_for_count(2, Duration::from_secs(15)).await;
    let url = format!("{base}/v1/jobs/in-flight");
    let status = reqwest::Client::new()
        .delete(&url)
        .send()
        .await
        .expect("DELETE")
        .status();
    assert_eq!(status, 202, "cancelled with an attempt in flight");
    let (_, view) = get_json(&url).await;
    assert_eq!(
        (&view["state"], &view["attempts"]),
        (&json!("cancelled"), &json!(2)),
        "{view}"
    );
    let h = history(&view);
    assert_eq!(h.len(), 1, "{view}");
    assert_eq!(
        (&h[0]["attempt"], &h[0]["status"]),
        (&json!(1), &json!(503)),
        "{view}"
    );
    // A repeated cancel answers as the first did: the summary knows an
    // attempt was under way (its newest kept attempt is 1 of 2).
    let again = reqwest::Client::new()
        .delete(&url)
        .send()
        .await
        .expect("DELETE")
        .status();
    assert_eq!(again, 202, "a repeated cancel of a job cancelled in flight");
    daemon.stop().await.expect("clean stop");
}

/// A job whose first attempt's lease expires (its daemon died after the
/// claim) and whose second is delivered keeps the lost attempt in its
/// summary as `lease_expired`, without a duration, as its history had it.
#[tokio::test]
async fn a_lost_lease_before_the_delivery_shows_as_lease_expired() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let mut config = test_config(&redis);
    config.delivery.timeout = Duration::from_millis(200);
    config.delivery.lease_margin = Duration::from_millis(200);
    let store = Store::connect(&config).await.expect("store");
    let input = JobInput {
        id: Some("lost-1".into()),
        url: Some(receiver.url("/lost")),
        ..JobInput::default()
    };
    crate::enqueue_direct(&store, &config, input).await;
    crate::claim_direct(&store, "lost-1").await;
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let view = wait_summarized(&base, "lost-1").await;
    assert_eq!(
        (&view["state"], &view["attempts"]),
        (&json!("delivered"), &json!(2)),
        "{view}"
    );
    let h = history(&view);
    assert_eq!(h.len(), 2, "{view}");
    assert_eq!(
        (&h[0]["attempt"], &h[0]["status"]),
        (&json!(2), &json!(200)),
        "{view}"
    );
    assert_eq!(
        (&h[1]["attempt"], &h[1]["error"]),
        (&json!(1), &json!("lease_expired")),
        "{view}"
    );
    assert!(
        h[1].get("duration_ms").is_none() && h[1].get("status").is_none(),
        "{view}"
    );
    daemon.stop().await.expect("clean stop");
}

/// A delivered job's summary takes its counters from the job's claim (the
/// outcome does not read the record): its creation time, attempts and
/// attempts allowed read as they did before. A job with a lease of its own
/// (from its `timeout`) is recorded too: the outcome's token, its lease's
/// deadline, counts the job's lease, not the default one (a wrong token
/// would leave the job in flight until its lease ran out, then run it
/// again).
#[tokio::test]
async fn a_summary_keeps_what_the_claim_read_and_a_lease_of_its_own_is_recorded() {
    let redis = RedisServer::start();
    let receiver = receiver_by_count(|_| Reply::status(200)).await;
    let config = test_config(&redis);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let created = post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "own-lease", "url": receiver.url("/n"), "timeout": "3s", "retry": ["1s"]}),
    )
    .await;
    let view = wait_summarized(&base, "own-lease").await;
    assert_eq!(
        (
            &view["state"],
            &view["attempts"],
            &view["max_attempts"],
            &view["created_at"]
        ),
        (
            &json!("delivered"),
            &json!(1),
            &json!(2),
            &created["created_at"]
        ),
        "{view}"
    );
    assert_eq!(receiver.count(), 1, "delivered once");
    daemon.stop().await.expect("clean stop");
}

/// With a ladder of 8 short rungs, a job failing 8 times (each a different
/// status) and delivered on its 9th and last attempt shows all 9, in order,
/// from a summary that needs continuation fields: in its view, the
/// listing and `hookq show`.
#[tokio::test]
async fn a_job_delivered_on_its_last_of_nine_attempts_shows_all() {
    let redis = RedisServer::start();
    let statuses = [500u16, 502, 503, 504, 429, 418, 409, 301];
    let receiver = receiver_by_count(move |n| match statuses.get(n) {
        Some(s) => Reply::status(*s),
        None => Reply::status(200),
    })
    .await;
    let mut config = test_config(&redis);
    config.delivery.retry = vec![Duration::from_millis(20); 8];
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "stubborn", "topic": "orders.paid", "url": receiver.url("/n")}),
    )
    .await;
    let view = wait_summarized(&base, "stubborn").await;
    assert_eq!(
        (&view["state"], &view["attempts"], &view["max_attempts"]),
        (&json!("delivered"), &json!(9), &json!(9)),
        "{view}"
    );
    let h = history(&view);
    assert_eq!(h.len(), 9, "{view}");
    let numbers: Vec<u64> = h.iter().filter_map(|a| a["attempt"].as_u64()).collect();
    assert_eq!(numbers, [9, 8, 7, 6, 5, 4, 3, 2, 1]);
    let got: Vec<u64> = h
        .iter()
        .rev()
        .filter_map(|a| a["status"].as_u64())
        .collect();
    let mut sent: Vec<u64> = statuses.iter().map(|s| u64::from(*s)).collect();
    sent.push(200);
    assert_eq!(got, sent, "{view}");
    assert_eq!(h[1]["error"], "redirect", "{view}");
    assert_eq!(h[2]["error"], "http_status", "{view}");
    // The listing and `hookq show` read it whole too.
    let (_, page) = get_json(&format!("{base}/v1/jobs?state=delivered&topic=orders.paid")).await;
    assert_eq!(page["jobs"][0]["id"], "stubborn", "{page}");
    let out = crate::ops::hookq(&redis, &config.redis.namespace, &["show", "stubborn"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rows = |kind: &str| text.lines().filter(|l| l.contains(kind)).count();
    assert_eq!(
        (rows("http_status"), rows("redirect")),
        (7, 1),
        "a row per failed attempt in hookq show:\n{text}"
    );
    daemon.stop().await.expect("clean stop");
}

fn job(id: String) -> hookq::job::NewJob {
    let input: JobInput = serde_json::from_value(json!({
        "id": id, "topic": "orders.paid", "url": "http://sink.example/hook",
    }))
    .expect("input");
    let config = Config::default();
    input.validate(&config).expect("valid").new_job(&config)
}

/// Every job of partition 0 due now, claimed (promoted first).
async fn claim_all(store: &Store) -> Vec<hookq::store::Claimed> {
    store.promote(0, 100_000).await.expect("promote");
    let mut all = Vec::new();
    loop {
        let claimed = store.claim(0, 256).await.expect("claim").jobs;
        if claimed.is_empty() {
            return all;
        }
        all.extend(claimed);
    }
}

/// Jobs `ids` (of partition 0) delivered after `failures` failed attempts
/// each (a 503 in 31 ms), through the store as the daemon records them.
async fn finish(store: &Store, ids: &[String], failures: u32) {
    let n = ids.len();
    let jobs: Vec<_> = ids.iter().map(|id| job(id.clone())).collect();
    for chunk in jobs.chunks(500) {
        store.enqueue_many(chunk).await.expect("enqueue");
    }
    for _ in 0..failures {
        let claimed = claim_all(store).await;
        assert_eq!(claimed.len(), n, "every job claimed once a round");
        for c in &claimed {
            let record = format!(
                r#"{{"attempt":{},"at":{},"duration_ms":31,"status":503,"error":"http_status","message":"receiver answered 503"}}"#,
                c.attempt, c.claimed_at
            );
            let failure = Failure {
                record: &record,
                last_error: "http_status: receiver answered 503",
                last_status: Some(503),
                topic: "orders.paid",
                action: FailAction::Retry(Duration::ZERO),
            };
            store.fail(c, &failure).await.expect("fail");
        }
    }
    let claimed = claim_all(store).await;
    assert_eq!(claimed.len(), n, "every job claimed for its delivery");
    for batch in claimed.chunks(256) {
        let ok = complete_claimed(store, 0, batch, |c| {
            format!(
                r#"{{"attempt":{},"at":{},"duration_ms":12,"status":204}}"#,
                c.attempt, c.claimed_at
            )
        })
        .await
        .expect("complete");
        assert!(ok.iter().all(|d| *d));
    }
}

/// A Redis with the hash listpack limits the summary layout is sized for:
/// values of at most 64 bytes (Redis's default) and 128 entries (stricter
/// than Redis's default 512, so a shard that would outgrow it shows).
async fn stock_redis() -> RedisServer {
    let redis = RedisServer::start();
    for (key, value) in [
        ("hash-max-listpack-entries", "128"),
        ("hash-max-listpack-value", "64"),
    ] {
        redis.config_set(key, value).await.expect("CONFIG SET");
    }
    redis
}

/// Bytes of the partition's summary shards (MEMORY USAGE, every element
/// counted), after checking each that exists is still a listpack.
async fn summary_bytes(redis: &RedisServer, store: &Store) -> i64 {
    let buckets = store.summary_buckets(0).await.expect("buckets");
    let mut conn = redis.conn().await;
    let mut total: i64 = 0;
    for (key, _) in made_summary_shards(&mut conn, store, &buckets).await {
        total += redis.listpack_bytes(&key).await.expect("summary shard");
    }
    total
}

/// With stock Redis settings, 2,000 jobs delivered on their first attempt
/// cost at most 100 bytes each as summaries (26-character ids, topic
/// `orders.paid`); delivered on their second, at most 12 bytes more; on
/// their ninth, every shard is still a listpack and every attempt is read
/// back. The one-retry summaries are read back whole too.
#[tokio::test]
async fn summaries_with_history_stay_small_and_listpacks() {
    let n = 2_000;
    let mut per_job = Vec::new();
    for failures in [0u32, 1, 8] {
        let redis = stock_redis().await;
        let mut config = test_config(&redis);
        config.redis.partitions = 1;
        let store = Store::connect(&config).await.expect("store");
        let ids: Vec<String> = (0..n).map(|i| format!("mem-{i:022}")).collect();
        finish(&store, &ids, failures).await;
        let bytes = summary_bytes(&redis, &store).await;
        per_job.push(bytes as f64 / n as f64);
        for i in (0..n).step_by(97) {
            let id = format!("mem-{i:022}");
            assert_eq!(id.len(), 26);
            let record = store.get(&id).await.expect("get").expect("found");
            assert!(record.summarized, "{id}");
            assert_eq!(
                record.history.len(),
                failures as usize + 1,
                "{id}: {:?}",
                record.history
            );
            let oldest: Value =
                serde_json::from_str(record.history.last().expect("one")).expect("JSON");
            let want = if failures == 0 { 204 } else { 503 };
            assert_eq!(oldest["status"], want, "{id}: {:?}", record.history);
        }
    }
    let (first, one_retry, nine) = (per_job[0], per_job[1], per_job[2]);
    eprintln!(
        "summary bytes per job: first attempt {first:.1}, second {one_retry:.1}, ninth {nine:.1} \
         ({:.1} per earlier attempt)",
        (nine - first) / 8.0
    );
    assert!(first <= 100.0, "first attempt: {first:.1} B");
    assert!(
        one_retry - first <= 12.0,
        "one earlier attempt: {:.1} B",
        one_retry - first
    );
}

/// Short ids (whose last 8 bytes a continuation field's name does not
/// share) with 21 attempts each (the 20 earlier ones the history list
/// keeps, in five fields a summary): their bucket splits by fields, not
/// ids, so every shard stays a listpack; each continuation field moves with
/// its id, so every summary reads back whole; and a listing pages through
/// each job once (no continuation field listed as a job).
#[tokio::test]
async fn long_histories_of_short_ids_survive_shard_splits() {
    let redis = stock_redis().await;
    let mut config = test_config(&redis);
    config.redis.partitions = 1;
    let store = Store::connect(&config).await.expect("store");
    let ids: Vec<String> = (0..600).map(|i| format!("h{i}")).collect();
    finish(&store, &ids, 20).await;
    summary_bytes(&redis, &store).await;
    let shards: u32 = store
        .summary_buckets(0)
        .await
        .expect("buckets")
        .iter()
        .map(|b| b.shards)
        .sum();
    assert!(
        shards >= 60,
        "600 summaries of 5 fields split into {shards} shards"
    );
    for id in &ids {
        let record = store.get(id).await.expect("get").expect("found");
        assert_eq!(record.history.len(), 21, "{id}: {:?}", record.history);
    }
    let mut seen = std::collections::HashMap::new();
    for job in crate::list_every_page(&store, hookq::job::State::Delivered, 250).await {
        assert_eq!(job.history.len(), 21, "{}: {:?}", job.id, job.history);
        *seen.entry(job.id.clone()).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), ids.len(), "every job listed");
    assert!(seen.values().all(|n| *n == 1), "each once");
}
