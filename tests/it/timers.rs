//! Shared timers (a single Redis, layout 5): every partition's scheduled
//! jobs wait in partition 0's due sets and timing wheel, so that a round of
//! promotion is one call; what takes them out acts on each job's own
//! partition (its id's FNV-1a computed in Lua, as the store's
//! `partition_of`, or the pointer of a job placed by its ordering key).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use hookq::job::now_ms;
use serde_json::json;

use crate::support::receiver::{Receiver, Recorded, Reply};
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{post_created, start_daemon, test_config};

/// Partitions of these tests: more than the suite's usual 4, so that the
/// jobs of one promotion fall in many.
const PARTITIONS: u16 = 16;

/// One promotion of partition 0 moves the due jobs of every partition,
/// each to its own partition's ready list (where a claim of that
/// partition finds its record), and names the partitions whose lists it
/// started; no other partition has a due set; the stats count each
/// scheduled job once.
#[tokio::test]
async fn one_promotion_sends_every_partitions_jobs_to_their_own_lists() {
    let redis = RedisServer::start();
    let (config, store) = crate::partitioned_store(&redis, PARTITIONS).await;
    let keys = store.keys().clone();

    let due = store.redis_time_ms().await.expect("time") + 300;
    let mut by_partition: BTreeMap<u16, BTreeSet<String>> = BTreeMap::new();
    // Ids of several lengths and characters (the hash runs over bytes).
    for i in 0..200 {
        let id = match i % 4 {
            0 => format!("spread-{i}"),
            1 => format!("ORDER_{i:08}"),
            2 => format!("{i}.x-{}", ":_".repeat(i % 5)),
            _ => format!("a{i}"),
        };
        crate::enqueue_at(&store, &config, &id, due).await;
        by_partition
            .entry(keys.partition_of(&id))
            .or_default()
            .insert(id);
    }
    assert_eq!(
        by_partition.len(),
        PARTITIONS as usize,
        "every partition has jobs"
    );

    let mut conn = redis.conn().await;
    let own_due = hookq::store::Keys::in_cluster(&config.redis.namespace, PARTITIONS);
    for p in 0..PARTITIONS {
        let exists: bool = redis::cmd("EXISTS")
            .arg(own_due.due(p))
            .query_async(&mut conn)
            .await
            .expect("EXISTS");
        assert!(!exists, "partition {p} has a due set of its own");
    }
    let members: usize = redis::cmd("ZCARD")
        .arg(keys.due(0))
        .query_async(&mut conn)
        .await
        .expect("ZCARD");
    assert_eq!(members, 200);
    let stats = store.stats().await.expect("stats");
    assert_eq!(stats.scheduled, 200, "each scheduled job counted once");

    // Promote partition 0 until its jobs come due.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let promotion = loop {
        assert!(tokio::time::Instant::now() < deadline, "never promoted");
        let promotion = store.promote(0, 256).await.expect("promote");
        if promotion.moved > 0 {
            break promotion;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(promotion.moved, 200, "one call for every partition's jobs");
    let started: BTreeSet<u16> = promotion.started_in.iter().copied().collect();
    assert_eq!(started, (0..PARTITIONS).collect(), "every list started");

    for (p, ids) in &by_partition {
        let claim = store.claim(*p, 256).await.expect("claim");
        let claimed: BTreeSet<String> = claim.jobs.iter().map(|j| j.id.clone()).collect();
        assert_eq!(&claimed, ids, "partition {p} claims its own jobs");
        assert!(claim.jobs.iter().all(|j| j.partition == *p));
    }
}

/// A daemon delivers, each once and none early, jobs of every partition
/// that waited in the shared due set, in the shared wheel (16 ms buckets,
/// so that buckets open while the test runs) and behind their ordering key
/// in another partition than their id's, in their key's order.
#[tokio::test]
async fn a_daemon_delivers_every_partitions_jobs_from_the_shared_timers() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let mut config = test_config(&redis);
    config.redis.partitions = PARTITIONS;
    config.redis.wheel_bucket = Duration::from_millis(16);
    config.validate().expect("valid config");
    let daemon = start_daemon(&config).await;
    let base = daemon.url();

    // (Redis runs on this machine: its clock is the local one.)
    let start = now_ms();
    let mut due_of: HashMap<String, i64> = HashMap::new();
    for i in 0..120u64 {
        let id = format!("t-{i}");
        // 100 ms to ~2.5 s ahead: the nearer ones in the due set, the
        // others in the wheel's buckets of two levels.
        let delay = 100 + (i * 20);
        let run_at = start + delay as i64;
        post_created(
            &format!("{base}/v1/jobs"),
            json!({"id": id, "url": receiver.url("/t"), "run_at": run_at}),
        )
        .await;
        due_of.insert(id, run_at);
    }
    // Ordered jobs: one key's line lives in the key's partition, its ids
    // hash all over.
    let ordered: Vec<String> = (0..12).map(|n| format!("line-{n}")).collect();
    for id in &ordered {
        post_created(
            &format!("{base}/v1/jobs"),
            json!({"id": id, "url": receiver.url("/o"), "ordering_key": "acct-7",
                "run_at": start + 400}),
        )
        .await;
    }

    let total = due_of.len() + ordered.len();
    let got = receiver
        .wait_for_count(total, Duration::from_secs(30))
        .await;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut line = Vec::new();
    for request in &got {
        let id = request
            .header("webhook-id")
            .expect("webhook-id")
            .to_string();
        if let Some(due) = due_of.get(&id) {
            assert!(
                request.received_ms() >= *due,
                "{id} arrived {} ms early",
                due - request.received_ms()
            );
        } else {
            line.push(id.clone());
        }
        *seen.entry(id).or_default() += 1;
    }
    assert_eq!(seen.len(), total, "every job arrived");
    assert_eq!(line, ordered, "the line in its order");
    // Nothing is left scheduled, and nothing arrives twice.
    wait_until("no job left scheduled", Duration::from_secs(10), || async {
        let (_, stats) = crate::get_json(&format!("{base}/v1/stats")).await;
        stats["scheduled"] == 0 && stats["ready"] == 0 && stats["inflight"] == 0
    })
    .await;
    assert_eq!(receiver.count(), total, "no job delivered twice");
    // Each delivery was recorded: a lease put in another partition's
    // in-flight set would make its outcome stale and leave its job unfinished.
    for id in due_of.keys().chain(&ordered) {
        let (_, job) = crate::get_json(&format!("{base}/v1/jobs/{id}")).await;
        assert_eq!(job["state"], "delivered", "{id}: {job}");
    }
    daemon.stop().await.expect("stops");
}

/// A job a schedule fired lives in the schedule's partition, not its id's;
/// its retry, due far enough ahead to wait in the shared wheel (16 ms
/// buckets), is found there by its entry's tag and sent.
#[tokio::test]
async fn a_fired_jobs_retry_waits_in_the_shared_wheel_and_is_sent() {
    let redis = RedisServer::start();
    let receiver = Receiver::start(std::sync::Arc::new(|r: &Recorded| {
        if r.header("hookq-attempt") == Some("1") {
            Reply::status(500)
        } else {
            Reply::status(204)
        }
    }))
    .await;
    let mut config = test_config(&redis);
    config.redis.partitions = PARTITIONS;
    config.redis.wheel_bucket = Duration::from_millis(16);
    config.delivery.retry = vec![Duration::from_millis(300)];
    config.validate().expect("valid config");
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    post_created(
        &format!("{base}/v1/schedules"),
        json!({"id": "tick", "every": "2s", "job": {"url": receiver.url("/tick")}}),
    )
    .await;
    // The first fire (in 2 s): attempt 1 fails, attempt 2 follows the
    // retry, before the second fire.
    let got = receiver.wait_for_count(2, Duration::from_secs(30)).await;
    assert_eq!(got[0].header("hookq-attempt"), Some("1"));
    assert_eq!(got[1].header("hookq-attempt"), Some("2"));
    assert_eq!(got[0].header("webhook-id"), got[1].header("webhook-id"));
    daemon.stop().await.expect("stops");
}
