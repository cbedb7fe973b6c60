//! What hookq keeps in Redis, and how little: jobs due far ahead wait in the
//! timing wheel's compact buckets and reach the due set only near their time,
//! with cancel and change handled as tombstones.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;

use crate::support::receiver::{Receiver, Recorded, Reply};
use crate::support::redis::RedisServer;
use crate::support::store::{complete_claimed, finish_all_claimable, made_summary_shards};
use crate::support::{rfc3339_ms, wait_until};
use crate::{get_json, job_view, post_created, start_daemon, test_config};

async fn send(method: reqwest::Method, url: &str, body: Option<serde_json::Value>) -> u16 {
    let mut request = reqwest::Client::new().request(method, url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.expect("request").status().as_u16()
}

/// With 50 ms wheel buckets (levels of 50 ms, 3.2 s and 204.8 s), jobs a few
/// seconds away wait in a level-2 bucket, move to level 1 and then to the
/// due set, and are delivered once, not before their due time. A cancelled
/// job's and a changed job's old entries are skipped when their bucket
/// opens; a retry far enough ahead waits in the wheel too; at the end the
/// wheel is empty and counts nothing.
#[tokio::test]
async fn far_jobs_cascade_through_the_wheel_and_arrive_once_on_time() {
    let redis = RedisServer::start();
    let failed_once = Arc::new(AtomicBool::new(false));
    let receiver = {
        let failed_once = failed_once.clone();
        Receiver::start(Arc::new(move |r: &Recorded| {
            if r.path == "/retry" && !failed_once.swap(true, Ordering::SeqCst) {
                Reply::status(500)
            } else {
                Reply::status(204)
            }
        }))
        .await
    };
    let mut config = test_config(&redis);
    config.redis.wheel_bucket = Duration::from_millis(50);
    config.delivery.retry = vec![Duration::from_millis(600)];
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let keys = hookq::store::Keys::new(&config.redis.namespace, config.redis.partitions);
    let mut conn = redis.conn().await;

    let create = |id: &str, delay: &str| json!({"id": id, "url": receiver.url(&format!("/{id}")), "delay": delay});
    let mut due_at = std::collections::HashMap::new();
    for (id, delay) in [
        ("near", "20ms"),
        ("level-1", "700ms"),
        ("level-2", "3500ms"),
        ("cancelled", "3500ms"),
        ("sooner", "3500ms"),
        ("later", "3400ms"),
    ] {
        let view = post_created(&format!("{base}/v1/jobs"), create(id, delay)).await;
        let due = view["next_attempt_at"].as_str().expect("due").to_string();
        due_at.insert(id.to_string(), due);
    }
    let retry = json!({"id": "retry", "url": receiver.url("/retry")});
    post_created(&format!("{base}/v1/jobs"), retry).await;

    // Where each waits: level-2 jobs in a level-2 bucket, not the due set.
    let p = keys.partition_of("level-2");
    let start = {
        let ms = rfc3339_ms(&due_at["level-2"]);
        ms - ms % 3200
    };
    let bucket: Vec<String> = conn
        .lrange(format!("{}:2:{start}", keys.wheel(p)), 0, -1)
        .await
        .expect("LRANGE");
    assert!(
        bucket.contains(&keys.wheel_entry(p, "level-2")),
        "{bucket:?}"
    );
    let (_, stats) = get_json(&format!("{base}/v1/stats")).await;
    assert!(stats["scheduled"].as_u64() >= Some(5), "{stats}");

    // Tombstones: cancel one, bring one forward, push one back.
    let status = send(
        reqwest::Method::DELETE,
        &format!("{base}/v1/jobs/cancelled"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    for (id, delay) in [("sooner", "300ms"), ("later", "3700ms")] {
        let status = send(
            reqwest::Method::PATCH,
            &format!("{base}/v1/jobs/{id}"),
            Some(json!({"delay": delay})),
        )
        .await;
        assert_eq!(status, 200, "PATCH {id}");
        let view = job_view(&base, id).await;
        due_at.insert(
            id.to_string(),
            view["next_attempt_at"].as_str().expect("due").into(),
        );
    }

    // near, level-1, level-2, sooner, later, and retry twice. The count is
    // taken once nothing more can arrive: every job finished with exactly
    // the attempts it needed (so none was claimed again after a lease ran
    // out, and no first try can straggle in late), each answered before it
    // was recorded, and the cancelled one never attempted.
    receiver.wait_for_count(7, Duration::from_secs(20)).await;
    crate::wait_until_idle(&base, Duration::from_secs(10)).await;
    for (id, state, attempts) in [
        ("near", "delivered", 1),
        ("level-1", "delivered", 1),
        ("level-2", "delivered", 1),
        ("sooner", "delivered", 1),
        ("later", "delivered", 1),
        ("retry", "delivered", 2),
        ("cancelled", "cancelled", 0),
    ] {
        let view = job_view(&base, id).await;
        assert_eq!(
            (view["state"].as_str(), view["attempts"].as_u64()),
            (Some(state), Some(attempts)),
            "{id}: {view}"
        );
    }
    let got = receiver.requests();
    let mut paths: Vec<&str> = got.iter().map(|r| r.path.as_str()).collect();
    paths.sort();
    assert_eq!(
        paths,
        ["/later", "/level-1", "/level-2", "/near", "/retry", "/retry", "/sooner"],
        "each once (the retry twice), the cancelled one never"
    );
    for r in &got {
        let id = &r.path[1..];
        if let Some(due) = due_at.get(id) {
            let late = r.received_ms() - rfc3339_ms(due);
            assert!(late >= 0, "{id} delivered {}ms early", -late);
        }
    }
    for p in 0..config.redis.partitions {
        let buckets: usize = conn.zcard(keys.wheel(p)).await.expect("ZCARD");
        let counted: Option<i64> = conn.hget(keys.stats(p), "wheel").await.expect("HGET");
        assert_eq!(
            (buckets, counted.unwrap_or(0)),
            (0, 0),
            "partition {p}: the wheel is empty"
        );
    }
    daemon.stop().await.expect("clean stop");
}

/// A delivered and a cancelled job leave no record or history behind but a
/// summary that still answers `GET /v1/jobs/{id}`, `hookq show`, listings,
/// cancel, PATCH and an idempotent re-create (compared by content, however
/// the JSON is spelled); it expires with the retention period.
#[tokio::test]
async fn finished_jobs_leave_summaries_that_still_answer() {
    let redis = RedisServer::start();
    let receiver = Receiver::start(Arc::new(|r: &Recorded| {
        if r.path == "/fails" {
            Reply::status(503)
        } else {
            Reply::status(204)
        }
    }))
    .await;
    let mut config = test_config(&redis);
    config.delivery.retry = vec![Duration::from_secs(3600)];
    config.retention.finished = Duration::from_secs(3);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let keys = hookq::store::Keys::new(&config.redis.namespace, config.redis.partitions);
    let mut conn = redis.conn().await;

    let delivered = json!({"id": "sum-ok", "topic": "orders", "url": receiver.url("/ok"),
        "headers": {"x-api-key": "k"}, "body": {"order": 1, "items": [1, 2]}});
    post_created(&format!("{base}/v1/jobs"), delivered.clone()).await;
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "sum-cancel", "topic": "orders", "url": receiver.url("/fails")}),
    )
    .await;
    let view = crate::wait_state(&base, "sum-ok", "delivered").await;
    assert_eq!(view["summarized"], true, "{view}");
    assert_eq!(view["topic"], "orders");
    assert_eq!(view["attempts"], 1);
    assert_eq!(view["history"][0]["status"], 204, "{view}");
    for gone in ["url", "method", "headers", "body"] {
        assert!(view.get(gone).is_none(), "{gone} in {view}");
    }
    let p = keys.partition_of("sum-ok");
    let (live, kept): (bool, i64) = redis::pipe()
        .hexists(keys.live_records(p, "sum-ok"), "sum-ok")
        .exists(&[keys.job(p, "sum-ok"), keys.history(p, "sum-ok")])
        .query_async(&mut conn)
        .await
        .expect("exists");
    assert_eq!((live, kept), (false, 0), "the record and history are gone");

    // The failing job waits an hour for its retry; cancelling it keeps its
    // last failure in the summary.
    wait_until(
        "sum-cancel failed once",
        Duration::from_secs(10),
        || async { job_view(&base, "sum-cancel").await["attempts"] == 1 },
    )
    .await;
    let url = format!("{base}/v1/jobs/sum-cancel");
    assert_eq!(send(reqwest::Method::DELETE, &url, None).await, 204);
    let (_, view) = get_json(&url).await;
    assert_eq!(view["state"], "cancelled", "{view}");
    assert_eq!(view["summarized"], true, "{view}");
    assert_eq!(view["history"][0]["status"], 503, "{view}");
    assert_eq!(view["history"][0]["error"], "http_status", "{view}");
    assert_eq!(
        send(reqwest::Method::DELETE, &url, None).await,
        204,
        "already cancelled"
    );

    // Cancel and PATCH of a delivered summary conflict; a re-create with the
    // same content (spelled differently) is idempotent, another conflicts.
    let ok_url = format!("{base}/v1/jobs/sum-ok");
    assert_eq!(send(reqwest::Method::DELETE, &ok_url, None).await, 409);
    let patch = json!({"body": {"order": 2}});
    assert_eq!(
        send(reqwest::Method::PATCH, &ok_url, Some(patch)).await,
        409
    );
    let respelled = json!({"body": {"items": [1, 2], "order": 1}, "url": receiver.url("/ok"),
        "id": "sum-ok", "headers": {"x-api-key": "k"}, "topic": "orders"});
    let (status, again) = crate::post_json(&format!("{base}/v1/jobs"), respelled).await;
    assert_eq!(
        (status, &again["state"]),
        (200, &json!("delivered")),
        "{again}"
    );
    let mut changed = delivered.clone();
    changed["body"] = json!({"order": 2});
    let (status, _) = crate::post_json(&format!("{base}/v1/jobs"), changed).await;
    assert_eq!(status, 409);
    assert_eq!(
        receiver.count_distinct("webhook-id"),
        2,
        "nothing delivered again"
    );

    // Listings find summaries by state and topic.
    let (_, page) = get_json(&format!("{base}/v1/jobs?state=delivered&topic=orders")).await;
    let ids: Vec<&str> = page["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|j| j["id"].as_str())
        .collect();
    assert_eq!(ids, ["sum-ok"], "{page}");
    let (_, page) = get_json(&format!("{base}/v1/jobs?state=cancelled")).await;
    assert_eq!(page["jobs"][0]["id"], "sum-cancel", "{page}");
    let (_, page) = get_json(&format!("{base}/v1/jobs?topic=nope")).await;
    assert_eq!(page["jobs"], json!([]), "{page}");

    // `hookq show` reads the summary too.
    let out = crate::ops::hookq(
        &redis,
        &config.redis.namespace,
        &["show", "sum-ok", "--json"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        (&shown["state"], &shown["summarized"]),
        (&json!("delivered"), &json!(true))
    );

    // Summaries expire with the retention period (3 s, bucket 750 ms).
    wait_until("the summaries expire", Duration::from_secs(10), || async {
        get_json(&ok_url).await.0 == 404 && get_json(&url).await.0 == 404
    })
    .await;
    daemon.stop().await.expect("clean stop");
}

/// `retention.keep_bodies = true` keeps a delivered job whole (url,
/// headers, body, history), expiring after the retention period.
#[tokio::test]
async fn keep_bodies_keeps_finished_jobs_whole() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let mut config = test_config(&redis);
    config.retention.keep_bodies = true;
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "kept", "url": receiver.url("/k"), "body": {"a": 1}}),
    )
    .await;
    let view = crate::wait_state(&base, "kept", "delivered").await;
    assert!(view.get("summarized").is_none(), "{view}");
    assert_eq!(view["body"], json!({"a": 1}));
    assert_eq!(view["url"], receiver.url("/k"));
    let keys = hookq::store::Keys::new(&config.redis.namespace, config.redis.partitions);
    let mut conn = redis.conn().await;
    let ttl: i64 = conn
        .pttl(keys.job(keys.partition_of("kept"), "kept"))
        .await
        .expect("pttl");
    assert!(ttl > 0, "the kept record expires (pttl {ttl})");
    daemon.stop().await.expect("clean stop");
}

/// Thousands of summaries in one partition split their bucket into shards
/// (each small enough for Redis's compact encoding); the store finds every
/// one where the scripts put it, and a listing pages through each once.
/// (The jobs come and finish 250 at a time, so the bucket, sized for the
/// first 250, grows by splitting.)
#[tokio::test]
async fn many_summaries_split_into_shards_and_are_all_found() {
    let redis = RedisServer::start();
    let (config, store) = one_partition_store(&redis, None).await;
    let n = 2_000;
    let jobs = many_jobs(&config, "many", n);
    let mut recorded = 0;
    for chunk in jobs.chunks(250) {
        store.enqueue_many(chunk).await.expect("enqueue");
        recorded += finish_all_claimable(&store).await;
    }
    assert_eq!(recorded, n);
    let buckets = store.summary_buckets(0).await.expect("buckets");
    let shards: u32 = buckets.iter().map(|b| b.shards).sum();
    assert!(shards >= 40, "2,000 summaries split into {shards} shards");
    let made = assert_shards_compact_and_expiring(&redis, &store, &buckets).await;
    assert!(made >= 40, "{made} of {shards} shards hold summaries");
    for i in (0..n).step_by(7) {
        let record = store
            .get(&format!("many-{i:05}"))
            .await
            .expect("get")
            .expect("found");
        assert!(record.summarized);
        assert_eq!(record.state, hookq::job::State::Delivered);
    }
    let mut seen = std::collections::BTreeSet::new();
    for record in crate::list_every_page(&store, hookq::job::State::Delivered, 333).await {
        assert!(seen.insert(record.id.clone()), "{} listed twice", record.id);
    }
    assert_eq!(seen.len(), n, "every summary listed once");

    // A delivery prepared for the other retention mode is refused whole.
    let whole = hookq::store::Delivery::whole("{}".into());
    let lease = hookq::store::Lease {
        token: "1".into(),
        again: false,
        max_attempts: 1,
        created: 0,
    };
    assert!(store
        .complete_many(0, &[("many-00000", 1, &lease, &whole)], None)
        .await
        .is_err());
}

/// The summary tests' store: one partition over `redis`, finished jobs
/// kept `retention` (the test default when None); with its config.
async fn one_partition_store(
    redis: &RedisServer,
    retention: Option<Duration>,
) -> (hookq::config::Config, hookq::store::Store) {
    let mut config = test_config(redis);
    config.redis.partitions = 1;
    if let Some(retention) = retention {
        config.retention.finished = retention;
    }
    let store = hookq::store::Store::connect(&config).await.expect("store");
    (config, store)
}

/// `n` valid jobs `<prefix>-00000`, ... to an address nothing is sent to.
fn many_jobs(config: &hookq::config::Config, prefix: &str, n: usize) -> Vec<hookq::job::NewJob> {
    (0..n)
        .map(|i| {
            let input: hookq::job::JobInput = serde_json::from_value(
                json!({"id": format!("{prefix}-{i:05}"), "url": "http://127.0.0.1:9/", "topic": "t"}),
            )
            .expect("input");
            input.validate(config).expect("valid").new_job(config)
        })
        .collect()
}

/// Checks that every shard of `buckets` (partition 0) that exists is a
/// listpack and expires; how many exist.
async fn assert_shards_compact_and_expiring(
    redis: &RedisServer,
    store: &hookq::store::Store,
    buckets: &[hookq::store::Bucket],
) -> u32 {
    let mut conn = redis.conn().await;
    let made = made_summary_shards(&mut conn, store, buckets).await;
    for (key, ttl) in &made {
        let encoding: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("encoding");
        assert_eq!(encoding, "listpack", "{key}");
        assert!(*ttl > 0, "{key} expires with its bucket (pttl {ttl})");
    }
    made.len() as u32
}

/// A partition's first bucket of summaries starts with the shards its live
/// jobs will fill (2,000 jobs: 50 shards of 40) and does not split as they
/// finish; the next bucket starts with as many as the one before it filled,
/// however few jobs are live then. Every shard written expires with its
/// bucket.
#[tokio::test]
async fn a_new_bucket_starts_with_the_shards_it_will_need() {
    let redis = RedisServer::start();
    // Buckets 4 s wide (a quarter of the retention).
    let (config, store) = one_partition_store(&redis, Some(Duration::from_secs(16))).await;
    let jobs = many_jobs(&config, "pre", 2_001);
    // (Started at the beginning of a bucket's span, so that the 2,000
    // finish within one bucket however slow the host.)
    wait_until(
        "the start of a bucket's span",
        Duration::from_secs(10),
        || async { store.redis_time_ms().await.expect("TIME") % 4_000 < 300 },
    )
    .await;
    for chunk in jobs[..2_000].chunks(500) {
        store.enqueue_many(chunk).await.expect("enqueue");
    }
    store.promote(0, 100_000).await.expect("promote");
    let one = store.claim(0, 1).await.expect("claim").jobs;
    complete_claimed(&store, 0, &one, |_| {
        r#"{"at":1,"duration_ms":2,"status":200}"#.into()
    })
    .await
    .expect("complete");
    let first = store.summary_buckets(0).await.expect("buckets");
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].shards, 50, "sized for 2,000 live jobs: {first:?}");
    assert_eq!(finish_all_claimable(&store).await, 1_999);
    let filled = store.summary_buckets(0).await.expect("buckets");
    assert_eq!(
        filled.len(),
        1,
        "all finished within the bucket: {filled:?}"
    );
    assert_eq!(filled[0].shards, 50, "no split: {filled:?}");
    assert_eq!(filled[0].count, 2_000);
    let made = assert_shards_compact_and_expiring(&redis, &store, &filled).await;
    assert!(made >= 45, "{made} of 50 shards written");

    // One job finishing in the next bucket: 1 live job, 2,000 fields
    // before it.
    store.enqueue_many(&jobs[2_000..]).await.expect("enqueue");
    let (next, buckets) = finish_one_in_the_next_bucket(&store, &filled[0]).await;
    assert_eq!(next.shards, 50, "sized like the one before: {buckets:?}");
    assert_eq!(
        assert_shards_compact_and_expiring(&redis, &store, std::slice::from_ref(&next)).await,
        1
    );
    assert!(
        store
            .get("pre-02000")
            .await
            .expect("get")
            .expect("found")
            .summarized
    );
}

/// Only the write that makes a summary shard gives it its expiry: a later
/// write to the shard (whose mark is already there) calls no `PEXPIREAT`,
/// and the shard still expires with its bucket.
#[tokio::test]
async fn only_the_write_that_makes_a_shard_sets_its_expiry() {
    let redis = RedisServer::start();
    let (config, store) = one_partition_store(&redis, None).await;
    let jobs = many_jobs(&config, "mark", 2);
    store.enqueue_many(&jobs).await.expect("enqueue");
    store.promote(0, 100).await.expect("promote");
    let claimed = store.claim(0, 2).await.expect("claim").jobs;
    assert_eq!(claimed.len(), 2);
    let attempt = |_: &hookq::store::Claimed| r#"{"at":1,"duration_ms":2,"status":200}"#.into();
    complete_claimed(&store, 0, &claimed[..1], attempt)
        .await
        .expect("complete");
    let buckets = store.summary_buckets(0).await.expect("buckets");
    assert_eq!(buckets.len(), 1, "{buckets:?}");
    assert_eq!(
        buckets[0].shards, 1,
        "two live jobs: one shard: {buckets:?}"
    );
    let calls = |command: &'static str| {
        let prefix = format!("cmdstat_{command}:");
        let redis = &redis;
        async move {
            redis
                .calls_of(|l| l.starts_with(&prefix))
                .await
                .expect("INFO commandstats")
        }
    };
    let (hset, pexpireat) = (calls("hset").await, calls("pexpireat").await);
    complete_claimed(&store, 0, &claimed[1..], attempt)
        .await
        .expect("complete");
    let (hset, pexpireat) = (
        calls("hset").await - hset,
        calls("pexpireat").await - pexpireat,
    );
    assert!(
        hset > 0 && pexpireat == 0,
        "the second summary's write set no expiry: {hset} HSET, {pexpireat} PEXPIREAT"
    );
    assert_eq!(
        assert_shards_compact_and_expiring(&redis, &store, &buckets).await,
        1
    );
    for job in &claimed {
        assert!(
            store
                .get(&job.id)
                .await
                .expect("get")
                .expect("found")
                .summarized
        );
    }
}

/// A shard made by a split, which no summary is then written to, still
/// expires with its bucket: 40 summaries fill a one-shard bucket, and a
/// 41st (whose id hashes to shard 0) splits it, moving about half of them
/// to shard 1.
#[tokio::test]
async fn a_shard_made_by_a_split_expires_with_its_bucket() {
    let redis = RedisServer::start();
    let (config, store) = one_partition_store(&redis, None).await;
    let jobs = many_jobs(&config, "split", 40);
    store.enqueue_many(&jobs).await.expect("enqueue");
    assert_eq!(finish_all_claimable(&store).await, 40);
    let last = many_jobs(&config, LAST_OF_SPLIT, 1);
    store.enqueue_many(&last).await.expect("enqueue");
    assert_eq!(finish_all_claimable(&store).await, 1);
    let buckets = store.summary_buckets(0).await.expect("buckets");
    assert_eq!(buckets.len(), 1, "{buckets:?}");
    assert_eq!(buckets[0].shards, 2, "{buckets:?}");
    let keys = store.keys();
    let mut conn = redis.conn().await;
    let shard0 = keys.done_shard(0, &buckets[0].start, 0);
    let last_id = format!("{LAST_OF_SPLIT}-00000");
    let in_shard0: bool = conn.hexists(&shard0, &last_id).await.expect("HEXISTS");
    assert!(
        in_shard0,
        "the 41st summary went to shard 0 (else pick another id)"
    );
    assert_eq!(
        assert_shards_compact_and_expiring(&redis, &store, &buckets).await,
        2,
        "both shards hold summaries"
    );
}

/// The id prefix of the 41st job in
/// [`a_shard_made_by_a_split_expires_with_its_bucket`]: chosen so that its
/// id hashes to shard 0 of two.
const LAST_OF_SPLIT: &str = "tail";

/// A bucket is sized by the summaries the one before it held, not by the
/// shards that one started with: 2,040 live jobs size the first bucket at
/// 51 shards, but only 40 finish in it (2,000 are due in an hour), so the
/// next starts with one shard (neither 51, the first's shards, nor 51 for
/// the 2,001 jobs then live).
#[tokio::test]
async fn a_bucket_after_a_sparse_one_starts_small() {
    let redis = RedisServer::start();
    // Buckets 4 s wide (a quarter of the retention).
    let (config, store) = one_partition_store(&redis, Some(Duration::from_secs(16))).await;
    let later: Vec<hookq::job::NewJob> = (0..2_000)
        .map(|i| {
            let input: hookq::job::JobInput = serde_json::from_value(json!({
                "id": format!("later-{i:05}"), "url": "http://127.0.0.1:9/", "delay": "1h"
            }))
            .expect("input");
            input.validate(&config).expect("valid").new_job(&config)
        })
        .collect();
    for chunk in later.chunks(500) {
        store.enqueue_many(chunk).await.expect("enqueue");
    }
    store
        .enqueue_many(&many_jobs(&config, "now", 40))
        .await
        .expect("enqueue");
    store.promote(0, 100_000).await.expect("promote");
    assert_eq!(finish_all_claimable(&store).await, 40);
    let first = store.summary_buckets(0).await.expect("buckets");
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!((first[0].shards, first[0].count), (51, 40), "{first:?}");

    store
        .enqueue_many(&many_jobs(&config, "next", 1))
        .await
        .expect("enqueue");
    let (next, buckets) = finish_one_in_the_next_bucket(&store, &first[0]).await;
    assert_eq!(
        next.shards, 1,
        "sized by the 40 summaries before it: {buckets:?}"
    );
}

/// Waits for the span of the bucket after `bucket` (4 s wide), finishes the
/// one job that can be claimed then, and returns the bucket it made and all
/// of partition 0's buckets.
async fn finish_one_in_the_next_bucket(
    store: &hookq::store::Store,
    bucket: &hookq::store::Bucket,
) -> (hookq::store::Bucket, Vec<hookq::store::Bucket>) {
    let next_start = bucket.start.parse::<i64>().expect("bucket start") + 4_000;
    wait_until(
        "the next bucket's span",
        Duration::from_secs(10),
        || async { store.redis_time_ms().await.expect("TIME") >= next_start },
    )
    .await;
    assert_eq!(finish_all_claimable(store).await, 1);
    let buckets = store.summary_buckets(0).await.expect("buckets");
    let next = buckets
        .iter()
        .find(|b| b.start == next_start.to_string())
        .unwrap_or_else(|| panic!("a bucket from {next_start}: {buckets:?}"))
        .clone();
    (next, buckets)
}
