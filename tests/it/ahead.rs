//! Claim ahead (SPEC §16): jobs due within `delivery.claim_ahead` (at most
//! 50 ms) are promoted and claimed together and held in the daemon to their
//! due time. What holds it: Redis never hands a job over earlier than that
//! (by its own clock); a change made before the hand-over wins over it; a
//! held job is never sent early; and the held jobs of a daemon killed with
//! `kill -9` come back when their leases expire.

use std::collections::HashMap;
use std::time::Duration;

use hookq::store::{CancelOutcome, RescheduleOutcome, Store};
use redis::AsyncCommands;
use serde_json::json;

use crate::support::receiver::Receiver;
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::test_config;

/// The local clock, epoch ms (Redis runs on this machine: the same clock).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

/// The default and largest claim ahead, in ms.
const AHEAD_MS: i64 = 50;

/// A change of job `id` from spec `old` to `new` (due at `due`, or as it
/// was), with the config's attempts and lease.
fn change_of<'a>(
    config: &hookq::config::Config,
    id: &'a str,
    old: &'a str,
    new: &'a str,
    due: Option<hookq::job::Due>,
) -> hookq::store::Reschedule<'a> {
    hookq::store::Reschedule {
        id,
        old_spec_json: old,
        new_spec_json: new,
        due,
        max_attempts: config.delivery.retry.len() as u32 + 1,
        lease_ms: None,
        given: hookq::job::GIVEN_DELAY,
    }
}

/// Promotes and claims partition 0 until a claim hands something over (20 s
/// at most), as a daemon's rounds would; the jobs of that claim.
async fn claim_when_due(store: &Store) -> Vec<hookq::store::Claimed> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        assert!(tokio::time::Instant::now() < deadline, "nothing claimed");
        store.promote(0, 256).await.expect("promote");
        let claimed = store.claim(0, 10).await.expect("claim").jobs;
        if !claimed.is_empty() {
            return claimed;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A store on a fresh Redis with one partition and the default claim ahead.
async fn one_partition_store(redis: &RedisServer) -> (hookq::config::Config, Store) {
    let mut config = test_config(redis);
    config.redis.partitions = 1;
    config.validate().expect("valid config");
    assert_eq!(
        config.delivery.claim_ahead,
        Duration::from_millis(AHEAD_MS as u64),
        "the default"
    );
    let store = Store::connect(&config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    (config, store)
}

/// Promotes and claims partition 0 every couple of milliseconds: no call
/// moves or claims the job before Redis's clock reads 50 ms before its due
/// time, and the claim that takes it says its due time and leases it from
/// then.
#[tokio::test]
async fn redis_hands_a_job_over_at_most_claim_ahead_before_its_due_time() {
    let redis = RedisServer::start();
    let (config, store) = one_partition_store(&redis).await;
    let due = store.redis_time_ms().await.expect("time") + 400;
    crate::enqueue_at(&store, &config, "ahead", due).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let (claimed, claimed_at) = loop {
        assert!(tokio::time::Instant::now() < deadline, "never claimed");
        let promotion = store.promote(0, 256).await.expect("promote");
        assert!(
            promotion.moved == 0 || promotion.now >= due - AHEAD_MS,
            "promoted at {} for {due}",
            promotion.now
        );
        let claim = store.claim(0, 10).await.expect("claim");
        if let Some(job) = claim.jobs.into_iter().next() {
            break (job, claim.now);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    assert!(
        claimed_at >= due - AHEAD_MS,
        "claimed {} ms before its due time",
        due - claimed_at
    );
    assert_eq!((claimed.id.as_str(), claimed.due), ("ahead", due));
    let lease: f64 = redis::cmd("ZSCORE")
        .arg(store.keys().inflight(0))
        .arg("ahead")
        .query_async(&mut redis.conn().await)
        .await
        .expect("ZSCORE");
    let lease_ms = (config.delivery.timeout + config.delivery.lease_margin).as_millis() as i64;
    assert_eq!(
        lease as i64,
        due.max(claimed_at) + lease_ms,
        "the lease runs from the due time"
    );
}

/// Three jobs promoted ahead (their ids in the ready list, not yet
/// claimed): one cancelled, one moved a minute later, one changed in place.
/// The cancel is the plain kind (the API's 204), and the next claim takes
/// only the changed one, with its new spec.
#[tokio::test]
async fn a_change_before_the_hand_over_wins_over_a_promotion_ahead() {
    let redis = RedisServer::start();
    let (config, store) = one_partition_store(&redis).await;
    let due = store.redis_time_ms().await.expect("time") + 300;
    for id in ["gone", "moved", "changed"] {
        crate::enqueue_at(&store, &config, id, due).await;
    }
    wait_until(
        "the three are promoted ahead",
        Duration::from_secs(20),
        || {
            let store = store.clone();
            async move {
                let promotion = store.promote(0, 256).await.expect("promote");
                assert!(promotion.moved == 0 || promotion.now >= due - AHEAD_MS);
                promotion.moved == 3
            }
        },
    )
    .await;

    assert_eq!(
        store.cancel("gone").await.expect("cancel"),
        CancelOutcome::Cancelled
    );
    let spec = |id: &str| {
        let store = store.clone();
        let id = id.to_string();
        async move {
            store
                .get(&id)
                .await
                .expect("get")
                .expect("record")
                .spec_json
        }
    };
    let old = spec("moved").await;
    let change = change_of(
        &config,
        "moved",
        &old,
        &old,
        Some(hookq::job::Due::At(due + 60_000)),
    );
    let moved = store.reschedule(&change).await.expect("reschedule");
    assert!(
        matches!(moved, RescheduleOutcome::Changed { due: d, .. } if d == due + 60_000),
        "{moved:?}"
    );
    let old = spec("changed").await;
    let mut new: serde_json::Value = serde_json::from_str(&old).expect("spec");
    new["url"] = json!("http://127.0.0.1:9/changed");
    let new = new.to_string();
    let change = change_of(&config, "changed", &old, &new, None);
    let changed = store.reschedule(&change).await.expect("reschedule");
    assert!(
        matches!(changed, RescheduleOutcome::Changed { .. }),
        "{changed:?}"
    );

    let claimed = claim_when_due(&store).await;
    let ids: Vec<&str> = claimed.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, ["changed"], "only the job changed in place");
    assert!(claimed[0].spec_json.contains("/changed"), "the new spec");
    let moved = store.get("moved").await.expect("get").expect("record");
    assert_eq!(moved.state, hookq::job::State::Scheduled);
}

/// A job handed over ahead of its due time is in flight: a claim leaves
/// its record as it was (scheduled, due later) and its lease alone says
/// so. It reads as in flight on attempt 1, a change is refused
/// (`rec_in_flight` in `reschedule_job.lua`), and a cancel answers that it
/// was under way. (Its due time is moved ten minutes on by hand after the
/// claim, so that the change comes before it whatever the machine's load.)
#[tokio::test]
async fn a_job_handed_over_ahead_reads_in_flight_and_refuses_a_change() {
    let redis = RedisServer::start();
    let (config, store) = one_partition_store(&redis).await;
    let due = store.redis_time_ms().await.expect("time") + 200;
    crate::enqueue_at(&store, &config, "handed", due).await;
    let claimed = claim_when_due(&store).await;
    assert_eq!((claimed[0].id.as_str(), claimed[0].attempt), ("handed", 1));
    let keys = store.keys().clone();
    let mut conn = redis.conn().await;
    let mut record: Vec<u8> = conn
        .hget(keys.live_records(0, "handed"), "handed")
        .await
        .expect("HGET");
    assert_eq!(record[0], b's', "the claim wrote the record");
    let later = due + 600_000;
    record[11..17].copy_from_slice(&(later as u64).to_be_bytes()[2..]);
    let () = conn
        .hset(keys.live_records(0, "handed"), "handed", record)
        .await
        .expect("HSET");

    let view = store.get("handed").await.expect("get").expect("record");
    assert_eq!(
        (view.state, view.attempts, view.due),
        (hookq::job::State::Inflight, 1, later)
    );
    let spec = view.spec_json.clone();
    let change = change_of(
        &config,
        "handed",
        &spec,
        &spec,
        Some(hookq::job::Due::At(later + 60_000)),
    );
    let refused = store.reschedule(&change).await.expect("reschedule");
    assert_eq!(
        refused,
        RescheduleOutcome::NotScheduled(hookq::job::State::Inflight)
    );
    assert_eq!(
        store.cancel("handed").await.expect("cancel"),
        CancelOutcome::CancelledInFlight
    );
}

/// Jobs due together, and the daemon (`hookq serve`) killed with `kill -9`
/// once it holds them (a job reads `inflight` before its due time): a new
/// daemon delivers every one of them, none before its due time, those held
/// after their lease (attempt timeout + `lease_margin`) expired.
#[tokio::test]
async fn held_jobs_of_a_killed_daemon_come_back_when_their_leases_expire() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let env = [
        ("HOOKQ_DELIVERY__TIMEOUT", "1s"),
        ("HOOKQ_DELIVERY__LEASE_MARGIN", "500ms"),
    ];
    let lease_ms = 1_500;
    let mut dues: HashMap<String, i64> = HashMap::new();
    let mut held = Vec::new();
    // A loaded machine may miss the window: a round whose kill came too
    // early or too late is repeated, five times at most.
    for round in 0..5 {
        let (serve, base) = crate::ops::serve_ready(&redis, &env).await;
        let due = now_ms() + 1_500;
        let ids: Vec<String> = (0..20).map(|i| format!("k{round}-{i}")).collect();
        for id in &ids {
            let (status, answer) = crate::post_json(
                &format!("{base}/v1/jobs"),
                json!({"id": id, "url": receiver.url("/held"), "run_at": due}),
            )
            .await;
            assert_eq!(status, 201, "{answer}");
            dues.insert(id.clone(), due);
        }
        let mut seen_held = false;
        while now_ms() < due - 2 {
            let view = crate::job_view(&base, &ids[0]).await;
            if view["state"] == "inflight" {
                seen_held = now_ms() < due - 2;
                break;
            }
        }
        drop(serve);
        if seen_held {
            held = ids;
            break;
        }
        // Missed: a daemon delivers this round's jobs before the next.
        let (_serve, _) = crate::ops::serve_ready(&redis, &env).await;
        wait_until(
            "the missed round is delivered",
            Duration::from_secs(30),
            || async {
                let got = receiver.requests();
                ids.iter().all(|id| {
                    got.iter()
                        .any(|r| r.header("webhook-id") == Some(id.as_str()))
                })
            },
        )
        .await;
    }
    assert!(!held.is_empty(), "never saw a job held before its due time");

    let (_serve, base) = crate::ops::serve_ready(&redis, &env).await;
    wait_until(
        "every held job arrives",
        Duration::from_secs(60),
        || async {
            let views =
                futures_util::future::join_all(held.iter().map(|id| crate::job_view(&base, id)))
                    .await;
            views.iter().all(|v| v["state"] == "delivered")
        },
    )
    .await;
    let arrivals = receiver.requests();
    for id in &held {
        let due = dues[id];
        let times: Vec<i64> = arrivals
            .iter()
            .filter(|r| r.header("webhook-id").is_some_and(|h| h == id))
            .map(|r| r.received_ms())
            .collect();
        assert!(!times.is_empty(), "{id} never arrived");
        assert!(
            times.iter().all(|t| *t >= due),
            "{id} arrived before {due}: {times:?}"
        );
    }
    let first = crate::job_view(&base, &held[0]).await;
    let history = first["history"].as_array().expect("history");
    if history.iter().any(|a| a["error"] == "lease_expired") {
        let came_back = history
            .iter()
            .find(|a| a["error"] != "lease_expired")
            .and_then(|a| a["at"].as_str())
            .expect("the delivered attempt");
        let at = chrono::DateTime::parse_from_rfc3339(came_back)
            .expect("time")
            .timestamp_millis();
        assert!(
            at >= dues[&held[0]] + lease_ms - 50,
            "came back before its lease expired: {first}"
        );
    }
}

/// A delivery's outcome waits for its batch (up to 250 ms): the daemon
/// killed with `kill -9` after the receiver answered but before the
/// outcome was recorded loses nothing; the job is delivered again once its
/// lease expires (at least once), and then reads delivered.
#[tokio::test]
async fn an_outcome_lost_with_its_daemon_is_delivered_again() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let env = [
        ("HOOKQ_DELIVERY__TIMEOUT", "1s"),
        ("HOOKQ_DELIVERY__LEASE_MARGIN", "500ms"),
    ];
    let (serve, base) = crate::ops::serve_ready(&redis, &env).await;
    let (status, answer) = crate::post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": "unrecorded", "url": receiver.url("/once")}),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    receiver.wait_for_count(1, Duration::from_secs(20)).await;
    let view = crate::job_view(&base, "unrecorded").await;
    drop(serve);
    // Recorded already (a loaded machine may be that slow): nothing to
    // prove here but that it stays so.
    let recorded = view["state"] == "delivered";
    assert!(
        recorded || view["state"] == "inflight",
        "answered, not yet recorded: {view}"
    );

    let (_serve, base) = crate::ops::serve_ready(&redis, &env).await;
    wait_until(
        "the job reads delivered",
        Duration::from_secs(30),
        || async { crate::job_view(&base, "unrecorded").await["state"] == "delivered" },
    )
    .await;
    let arrived = receiver.count();
    if recorded {
        assert_eq!(arrived, 1, "recorded before the kill: sent once");
    } else {
        assert_eq!(
            arrived, 2,
            "unrecorded at the kill: sent again after its lease"
        );
    }
}

/// A promotion ahead opens the wheel's buckets due by its horizon, not only
/// those due by its now: jobs due in one millisecond, the first half in a
/// wheel bucket (enqueued more than a bucket ahead) and the second in the
/// due set, are promoted in enqueue order even when the promotion comes
/// between the horizon reaching their due time and the bucket's opening.
/// The due time is 5 ms into its 500 ms bucket, which opens 31 ms before
/// its start; a claim ahead of 300 ms (above the config's 50 ms bound,
/// which the store does not re-check) makes that window wide enough to hit
/// every time.
#[tokio::test]
async fn a_promotion_ahead_opens_the_buckets_due_by_its_horizon() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.redis.partitions = 1;
    config.redis.wheel_bucket = Duration::from_millis(500);
    config.delivery.claim_ahead = Duration::from_millis(300);
    let store = Store::connect(&config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    let now = store.redis_time_ms().await.expect("time");
    let bucket_start = (now + 1_200) / 500 * 500 + 500;
    let due = bucket_start + 5;
    let id = |i: usize| format!("z-{:02}", 49 - i);
    for i in 0..25 {
        crate::enqueue_at(&store, &config, &id(i), due).await;
    }
    let keys = store.keys().clone();
    let mut conn = redis.conn().await;
    let buckets: usize = conn.zcard(keys.wheel(0)).await.expect("ZCARD");
    assert_eq!(buckets, 1, "the first half waits in a wheel bucket");
    wait_until(
        "the horizon is past the due time",
        Duration::from_secs(5),
        || {
            let store = store.clone();
            async move { store.redis_time_ms().await.expect("time") >= due - 280 }
        },
    )
    .await;
    for i in 25..50 {
        crate::enqueue_at(&store, &config, &id(i), due).await;
    }
    let promotion = store.promote(0, 256).await.expect("promote");
    assert!(
        promotion.now < bucket_start - 31,
        "the test came too late: the bucket's own time to open ({} ms before the due time) had come",
        due - promotion.now
    );
    assert_eq!(promotion.moved, 50, "both halves move in one promotion");
    let ids: Vec<String> = conn.lrange(keys.ready(0), 0, -1).await.expect("LRANGE");
    let expected: Vec<String> = (0..50).map(id).collect();
    assert_eq!(ids, expected, "enqueue order (ids sort against it)");
}
