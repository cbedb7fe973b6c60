//! The core engine end to end: on-time delivery, the retry ladder, dead
//! letters, lease recovery, concurrent carriers and wakeups.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use hookq::carrier::Carrier;
use hookq::clock::RedisClock;
use hookq::fleet::Fleet;
use hookq::job::JobInput;
use hookq::store::Store;
use hookq::wake::Signals;
use redis::AsyncCommands;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::receiver::Receiver;
use crate::support::redis::RedisServer;
use crate::support::{rfc3339_ms, wait_until};
use crate::{get_json, job_view, post_json, start_daemon, test_config, wait_until_idle};

async fn job_state(base: &str, id: &str) -> String {
    let view = job_view(base, id).await;
    view["state"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn due_now_job_is_delivered_with_its_headers() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();

    let (status, view) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": "pay-1", "url": receiver.url("/paid"), "body": {"order": 42}}),
    )
    .await;
    assert_eq!(status, 201, "{view}");
    assert_eq!(view["state"], "ready");

    let got = receiver.wait_for_count(1, Duration::from_secs(10)).await;
    let request = &got[0];
    assert_eq!(request.path, "/paid");
    assert_eq!(request.body, br#"{"order":42}"#.to_vec());
    let header = |name: &str| {
        request
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(header("webhook-id"), "pay-1");
    assert_eq!(header("hookq-attempt"), "1");
    assert_eq!(header("content-type"), "application/json");
    assert!(header("user-agent").starts_with("hookq/"));

    wait_until("job is delivered", Duration::from_secs(5), || async {
        job_state(&base, "pay-1").await == "delivered"
    })
    .await;
    let view = job_view(&base, "pay-1").await;
    assert_eq!(view["attempts"], 1);
    assert_eq!(view["history"][0]["status"], 200);
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn delayed_jobs_are_never_early() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();

    let mut due_by_id = HashMap::new();
    for i in 0..20 {
        let id = format!("later-{i}");
        let delay = format!("{}ms", 200 + i * 37);
        let (status, view) = post_json(
            &format!("{base}/v1/jobs"),
            json!({"id": id, "url": receiver.url("/later"), "delay": delay}),
        )
        .await;
        assert_eq!(status, 201, "{view}");
        assert_eq!(view["state"], "scheduled");
        due_by_id.insert(
            id,
            rfc3339_ms(view["next_attempt_at"].as_str().expect("due")),
        );
    }
    let got = receiver.wait_for_count(20, Duration::from_secs(15)).await;
    let mut lateness = Vec::new();
    for request in &got {
        let id = request.headers["webhook-id"].to_str().expect("ascii");
        let due = due_by_id[id];
        let received = request.received_ms();
        assert!(received >= due, "{id} arrived {}ms early", due - received);
        lateness.push(received - due);
    }
    lateness.sort_unstable();
    eprintln!(
        "delayed-job lateness (receive - due), debug build: min {}ms median {}ms max {}ms",
        lateness[0],
        lateness[lateness.len() / 2],
        lateness[lateness.len() - 1]
    );
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn failures_climb_the_whole_ladder_then_dead_letter() {
    let redis = RedisServer::start();
    let receiver = Receiver::with_status(500).await;
    let mut config = test_config(&redis);
    config.delivery.retry = vec![
        Duration::from_millis(100),
        Duration::from_millis(200),
        Duration::from_millis(300),
    ];
    let daemon = start_daemon(&config).await;
    let base = daemon.url();

    let (status, _) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": "ladder-1", "topic": "payments", "url": receiver.url("/fail")}),
    )
    .await;
    assert_eq!(status, 201);

    let got = receiver.wait_for_count(4, Duration::from_secs(10)).await;
    let attempts: Vec<String> = got
        .iter()
        .map(|r| {
            r.headers["hookq-attempt"]
                .to_str()
                .expect("ascii")
                .to_string()
        })
        .collect();
    assert_eq!(attempts, ["1", "2", "3", "4"]);
    for (k, rung_ms) in [(1usize, 100u128), (2, 200), (3, 300)] {
        let gap = got[k]
            .received_at
            .duration_since(got[k - 1].received_at)
            .expect("ordered")
            .as_millis();
        assert!(
            gap >= rung_ms,
            "attempt {} came {gap}ms after attempt {k}, rung is {rung_ms}ms",
            k + 1
        );
    }
    wait_until("job is dead", Duration::from_secs(5), || async {
        job_state(&base, "ladder-1").await == "dead"
    })
    .await;
    // No fifth attempt: the ladder is exhausted.
    assert_eq!(receiver.count(), 4);

    let view = job_view(&base, "ladder-1").await;
    assert_eq!(view["attempts"], 4);
    assert_eq!(view["history"].as_array().map(Vec::len), Some(4));
    assert_eq!(view["history"][0]["error"], "http_status");

    // The dead-letter entry carries what an operator needs to replay it.
    let store_config = config.clone();
    let keys =
        hookq::store::Keys::new(&store_config.redis.namespace, store_config.redis.partitions);
    let stream = keys.dead(keys.partition_of("ladder-1"));
    let mut conn = redis.conn().await;
    let entries: redis::streams::StreamRangeReply = conn.xrange_all(&stream).await.expect("XRANGE");
    assert_eq!(entries.ids.len(), 1);
    let entry = &entries.ids[0];
    let field =
        |name: &str| -> String { entry.get(name).unwrap_or_else(|| panic!("field {name}")) };
    assert_eq!(field("id"), "ladder-1");
    assert_eq!(field("topic"), "payments");
    assert_eq!(field("attempts"), "4");
    assert_eq!(field("last_status"), "500");
    assert!(
        field("last_error").starts_with("http_status"),
        "{}",
        field("last_error")
    );
    let job: serde_json::Value = serde_json::from_str(&field("job")).expect("job JSON");
    assert_eq!(job["url"], receiver.url("/fail"));
    assert!(field("dead_at").parse::<i64>().expect("ms") > 0);

    // The job left every live set.
    let p = keys.partition_of("ladder-1");
    let due: i64 = conn.zcard(keys.due(p)).await.expect("ZCARD");
    let inflight: i64 = conn.zcard(keys.inflight(p)).await.expect("ZCARD");
    assert_eq!((due, inflight), (0, 0));
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn an_expired_lease_returns_the_job_and_fences_the_late_outcome() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let mut config = test_config(&redis);
    config.delivery.timeout = Duration::from_millis(200);
    config.delivery.lease_margin = Duration::from_millis(200);
    // The whole history stays (not only the last attempt's summary).
    config.retention.keep_bodies = true;

    // A "daemon" claims the job and dies: the claim is made, no outcome follows.
    let store = Store::connect(&config).await.expect("store");
    let input = JobInput {
        id: Some("crash-1".into()),
        url: Some(receiver.url("/after-crash")),
        ..JobInput::default()
    };
    crate::enqueue_direct(&store, &config, input).await;
    let p = store.keys().partition_of("crash-1");
    let claimed = store.claim(p, 10).await.expect("claim");
    assert_eq!(claimed.jobs.len(), 1);
    let lost_attempt = claimed.jobs[0].clone();

    // A live daemon takes the job back once the lease expires and delivers it.
    let daemon = start_daemon(&config).await;
    let got = receiver.wait_for_count(1, Duration::from_secs(10)).await;
    assert_eq!(got[0].headers["hookq-attempt"], "2");
    let base = daemon.url();
    wait_until("job is delivered", Duration::from_secs(5), || async {
        job_state(&base, "crash-1").await == "delivered"
    })
    .await;
    let view = job_view(&base, "crash-1").await;
    let errors: Vec<&str> = view["history"]
        .as_array()
        .expect("history")
        .iter()
        .filter_map(|h| h["error"].as_str())
        .collect();
    assert_eq!(errors, ["lease_expired"]);

    // The dead attempt's outcome arrives late: it is discarded, not applied.
    let applied = store
        .complete(
            &lost_attempt,
            &store.delivery_from_json(&lost_attempt.spec_json, "{}"),
        )
        .await
        .expect("complete");
    assert!(!applied, "a stale lease must not complete the job");
    let failure = hookq::store::Failure {
        record: "{}",
        last_error: "late",
        last_status: Some(500),
        topic: "default",
        action: hookq::retry::FailAction::DeadLetter,
    };
    let outcome = store.fail(&lost_attempt, &failure).await.expect("fail");
    assert_eq!(outcome, hookq::store::FailOutcome::Stale);
    assert_eq!(job_state(&base, "crash-1").await, "delivered");
    daemon.stop().await.expect("clean stop");
}

/// Fencing while the next attempt is running: attempt 1's lease expires, a
/// daemon takes the job over, and while attempt 2 is still at the receiver
/// the outcome of attempt 1 arrives (as a success and as a failure). Both are
/// discarded; attempt 2's own outcome is the one recorded.
#[tokio::test]
async fn a_stale_outcome_is_discarded_while_the_next_attempt_is_in_flight() {
    let redis = RedisServer::start();
    let receiver = Receiver::slow(200, Duration::from_secs(3)).await;
    let mut config = test_config(&redis);
    config.delivery.timeout = Duration::from_secs(5);
    // The whole history stays (not only the last attempt's summary).
    config.retention.keep_bodies = true;
    // The "daemon" that claims attempt 1 and dies holds a short lease.
    let mut dying = config.clone();
    dying.delivery.timeout = Duration::from_millis(200);
    dying.delivery.lease_margin = Duration::from_millis(100);
    dying.validate().expect("valid config");
    let store = Store::connect(&dying).await.expect("store");
    let input = JobInput {
        id: Some("fence-1".into()),
        url: Some(receiver.url("/fence")),
        ..JobInput::default()
    };
    crate::enqueue_direct(&store, &config, input).await;
    let p = store.keys().partition_of("fence-1");
    let claimed = store.claim(p, 10).await.expect("claim");
    let stale = claimed
        .jobs
        .into_iter()
        .find(|j| j.id == "fence-1")
        .expect("attempt 1 claimed");
    assert_eq!(stale.attempt, 1);

    // A live daemon takes the job over; attempt 2 is held at the receiver.
    let daemon = start_daemon(&config).await;
    let got = receiver.wait_for_count(1, Duration::from_secs(10)).await;
    assert_eq!(got[0].headers["hookq-attempt"], "2");

    // Attempt 1's outcome arrives now.
    let applied = store
        .complete(&stale, &store.delivery_from_json(&stale.spec_json, "{}"))
        .await
        .expect("complete");
    let failure = hookq::store::Failure {
        record: "{}",
        last_error: "late",
        last_status: Some(500),
        topic: "default",
        action: hookq::retry::FailAction::DeadLetter,
    };
    let failed = store.fail(&stale, &failure).await.expect("fail");
    let record = store.get("fence-1").await.expect("get").expect("record");
    assert!(
        !applied,
        "attempt 1's success was recorded while attempt 2 was in flight"
    );
    assert_eq!(failed, hookq::store::FailOutcome::Stale);
    assert_eq!(
        (record.state, record.attempts),
        (hookq::job::State::Inflight, 2),
        "attempt 2 is still in flight, untouched"
    );

    // Attempt 2 finishes and is the one recorded.
    let base = daemon.url();
    wait_until("fence-1 is delivered", Duration::from_secs(10), || async {
        job_state(&base, "fence-1").await == "delivered"
    })
    .await;
    let view = job_view(&base, "fence-1").await;
    assert_eq!(view["attempts"], 2, "{view}");
    assert_eq!(view["history"][0]["status"], 200, "{view}");
    assert_eq!(view["history"][1]["error"], "lease_expired", "{view}");
    daemon.stop().await.expect("clean stop");
    assert_eq!(receiver.count(), 1, "no third attempt");
}

/// A lease that expires on the last attempt the ladder allows dead-letters
/// the job (`lease_expired`) instead of putting it back for an attempt the
/// ladder does not allow: a job whose attempts keep killing their daemon
/// cannot loop forever.
#[tokio::test]
async fn a_lease_lost_on_the_last_attempt_dead_letters_the_job() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let mut config = test_config(&redis);
    config.delivery.timeout = Duration::from_millis(200);
    config.delivery.lease_margin = Duration::from_millis(100);
    let store = Store::connect(&config).await.expect("store");
    let input = JobInput {
        id: Some("last-1".into()),
        url: Some(receiver.url("/last")),
        retry: Some(Vec::new()),
        ..JobInput::default()
    };
    crate::enqueue_direct(&store, &config, input).await;
    let p = store.keys().partition_of("last-1");
    let claimed = store.claim(p, 10).await.expect("claim");
    assert!(claimed
        .jobs
        .iter()
        .any(|j| j.id == "last-1" && j.attempt == 1));

    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    wait_until("last-1 is dead", Duration::from_secs(10), || async {
        job_state(&base, "last-1").await == "dead"
    })
    .await;
    let view = job_view(&base, "last-1").await;
    assert_eq!(view["attempts"], 1, "{view}");
    assert_eq!(view["history"][0]["error"], "lease_expired", "{view}");
    let keys = store.keys().clone();
    let mut conn = redis.conn().await;
    let entries: redis::streams::StreamRangeReply =
        conn.xrange_all(keys.dead(p)).await.expect("XRANGE");
    assert_eq!(entries.ids.len(), 1, "one dead letter");
    let last_error: String = entries.ids[0].get("last_error").expect("last_error");
    assert!(last_error.starts_with("lease_expired"), "{last_error}");
    // Nothing is left that could start another attempt.
    let (due, ready, inflight): (usize, usize, usize) = redis::pipe()
        .zcard(keys.due(p))
        .llen(keys.ready(p))
        .zcard(keys.inflight(p))
        .query_async(&mut conn)
        .await
        .expect("ZCARD, LLEN, ZCARD");
    assert_eq!((due, ready, inflight), (0, 0, 0));
    daemon.stop().await.expect("clean stop");
    assert_eq!(receiver.count(), 0, "no attempt beyond the ladder");
}

#[tokio::test]
async fn two_carriers_promote_ten_thousand_jobs_exactly_once() {
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    store.load_scripts().await.expect("scripts");

    // 10,000 jobs due within the same ~300 ms window, enqueued before any carrier runs.
    let now = store.redis_time_ms().await.expect("TIME");
    let mut enqueues = Vec::new();
    for i in 0..10_000 {
        let job = JobInput {
            id: Some(format!("bulk-{i}")),
            url: Some("http://127.0.0.1:9/".into()),
            run_at: Some(hookq::job::RunAt::Millis(now + 800 + (i % 300))),
            ..JobInput::default()
        }
        .validate(&config)
        .expect("valid")
        .new_job(&config);
        enqueues.push(job);
    }
    for chunk in enqueues.chunks(500) {
        let futures = chunk.iter().map(|job| store.enqueue(job));
        for result in futures_util::future::join_all(futures).await {
            result.expect("enqueue");
        }
    }

    let token = CancellationToken::new();
    let mut carriers = Vec::new();
    for _ in 0..2 {
        let store = Store::connect(&config).await.expect("store");
        let signals = Signals::new(config.redis.partitions);
        // Each owns every partition (no fleet beat): both act on all of
        // them, as two daemons do for a moment while the deal changes.
        let fleet = Fleet::new(config.redis.partitions);
        let carrier = Carrier::new(
            store,
            signals,
            RedisClock::new(),
            fleet,
            Duration::from_secs(1),
        );
        carriers.push(tokio::spawn(carrier.run(token.child_token())));
    }

    let keys = store.keys().clone();
    let mut conn = redis.conn().await;
    wait_until("all jobs promoted", Duration::from_secs(20), || {
        let mut conn = conn.clone();
        let keys = keys.clone();
        async move {
            let mut total = 0i64;
            for p in 0..keys.partitions() {
                total += conn.zcard::<_, i64>(keys.due(p)).await.expect("ZCARD");
            }
            total == 0
        }
    })
    .await;
    token.cancel();
    for c in carriers {
        c.await.expect("carrier task");
    }

    let mut seen = HashSet::new();
    let mut entries = 0;
    for p in 0..keys.partitions() {
        let ids: Vec<String> = conn.lrange(keys.ready(p), 0, -1).await.expect("LRANGE");
        entries += ids.len();
        seen.extend(ids);
    }
    assert_eq!(
        entries, 10_000,
        "ready-list entries (a double promotion adds one)"
    );
    assert_eq!(seen.len(), 10_000, "distinct jobs promoted");
}

#[tokio::test]
async fn two_daemons_deliver_each_job_once() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let config = test_config(&redis);
    let a = start_daemon(&config).await;
    let b = start_daemon(&config).await;

    let client = reqwest::Client::new();
    for i in 0..1000 {
        let base = if i % 2 == 0 { a.url() } else { b.url() };
        let response = client
            .post(format!("{base}/v1/jobs"))
            .json(&json!({"id": format!("dual-{i}"), "url": receiver.url("/dual"), "delay": format!("{}ms", i % 200)}))
            .send()
            .await
            .expect("sent");
        assert_eq!(response.status(), 201);
    }
    let got = receiver.wait_for_count(1000, Duration::from_secs(30)).await;
    let ids: HashSet<String> = got
        .iter()
        .map(|r| r.headers["webhook-id"].to_str().expect("ascii").to_string())
        .collect();
    assert_eq!(ids.len(), 1000);
    // A duplicate could still come from a lease yet to expire (an outcome
    // that was not recorded) or from an attempt still running: wait until
    // nothing is scheduled, ready or in flight, then stop both daemons (which
    // drains their running attempts) before counting again.
    wait_until_idle(&a.url(), Duration::from_secs(30)).await;
    a.stop().await.expect("clean stop");
    b.stop().await.expect("clean stop");
    assert_eq!(receiver.count(), 1000, "no job was delivered twice");
}

#[tokio::test]
async fn an_earlier_job_wakes_a_sleeping_carrier() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let config = test_config(&redis);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();

    // The carrier learns of a job an hour away and sleeps on it.
    let (status, _) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": "far", "url": receiver.url("/far"), "delay": "1h"}),
    )
    .await;
    assert_eq!(status, 201);
    // Wait until the daemon is demonstrably idle: its readiness says scripts are loaded.
    wait_until("daemon ready", Duration::from_secs(5), || async {
        get_json(&format!("{base}/readyz")).await.0 == 200
    })
    .await;

    // An earlier job arrives through another path (straight into Redis, as
    // another instance or the CLI would do): only the wake channel can tell.
    let store = Store::connect(&config).await.expect("store");
    let job = JobInput {
        id: Some("near".into()),
        url: Some(receiver.url("/near")),
        delay: Some("300ms".into()),
        ..JobInput::default()
    }
    .validate(&config)
    .expect("valid");
    let hookq::store::EnqueueOutcome::Created { due, .. } =
        store.enqueue(&job.new_job(&config)).await.expect("enqueue")
    else {
        panic!("job was not created");
    };
    let got = receiver.wait_for_count(1, Duration::from_secs(10)).await;
    assert_eq!(got[0].path, "/near");
    let late = got[0].received_ms() - due;
    assert!(late >= 0, "delivered {}ms early", -late);
    // Without a wakeup the carrier would sleep until the hour-away job (or its
    // 60 s safety re-read); anything near the due time proves the wakeup.
    assert!(
        late < 5_000,
        "delivered {late}ms late: the carrier was not woken"
    );
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_job_due_in_a_year_waits_in_the_timing_wheel() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let config = test_config(&redis);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();

    let (status, view) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": "renewal", "url": receiver.url("/renew"), "delay": "365d"}),
    )
    .await;
    assert_eq!(status, 201, "{view}");
    assert_eq!(view["state"], "scheduled");
    let due = rfc3339_ms(view["next_attempt_at"].as_str().expect("due"));
    let created = rfc3339_ms(view["created_at"].as_str().expect("created"));
    assert_eq!(due - created, 365 * 86_400_000);

    // Not in the due set: in the coarsest wheel bucket holding its due time,
    // which opens a sixteenth of its width before it starts.
    let keys = hookq::store::Keys::new(&config.redis.namespace, config.redis.partitions);
    let p = keys.partition_of("renewal");
    let mut conn = redis.conn().await;
    let members: usize = conn.zcard(keys.due(p)).await.expect("ZCARD");
    assert_eq!(members, 0, "a job a year away costs no due-set entry");
    let width = config.redis.wheel_bucket.as_millis() as i64 * 4096;
    let start = due - due % width;
    let buckets: Vec<(String, f64)> = conn
        .zrange_withscores(keys.wheel(p), 0, -1)
        .await
        .expect("ZRANGE");
    assert_eq!(
        buckets,
        [(format!("3:{start}"), (start - width / 16) as f64)]
    );
    let ids: Vec<String> = conn
        .lrange(format!("{}:3:{start}", keys.wheel(p)), 0, -1)
        .await
        .expect("LRANGE");
    assert_eq!(ids, [keys.wheel_entry(p, "renewal")]);
    assert_eq!(job_state(&base, "renewal").await, "scheduled");
    let (_, stats) = get_json(&format!("{base}/v1/stats")).await;
    assert_eq!(stats["scheduled"], 1, "{stats}");
    let (_, listed) = get_json(&format!("{base}/v1/jobs?state=scheduled")).await;
    assert_eq!(listed["jobs"][0]["id"], "renewal", "{listed}");
    assert_eq!(receiver.count(), 0);
    daemon.stop().await.expect("clean stop");
}

/// Jobs due in the same millisecond are promoted in enqueue order, whether
/// they waited in the due set all along or first in the timing wheel: the
/// first half is enqueued while the due time is still far enough for the
/// wheel (with 500 ms buckets), the second half once it is within the due
/// set's reach; ids sort against enqueue order.
#[tokio::test]
async fn jobs_due_in_the_same_millisecond_keep_enqueue_order() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.redis.partitions = 1;
    config.redis.wheel_bucket = Duration::from_millis(500);
    let store = Store::connect(&config).await.expect("store");
    let now = store.redis_time_ms().await.expect("TIME");
    let at = now + 1_200;
    let enqueue = |i: usize| {
        let input = JobInput {
            id: Some(format!("z-{:02}", 49 - i)),
            url: Some("http://127.0.0.1:9/".into()),
            run_at: Some(hookq::job::RunAt::Millis(at)),
            ..JobInput::default()
        };
        let (store, config) = (store.clone(), config.clone());
        async move { crate::enqueue_direct(&store, &config, input).await }
    };
    for i in 0..25 {
        enqueue(i).await;
    }
    let keys = store.keys().clone();
    let mut conn = redis.conn().await;
    let in_wheel: usize = conn.zcard(keys.wheel(0)).await.expect("ZCARD");
    assert_eq!(in_wheel, 1, "the first half waits in a wheel bucket");
    wait_until(
        "the due time is within the due set's reach",
        Duration::from_secs(5),
        || {
            let store = store.clone();
            async move { store.redis_time_ms().await.expect("TIME") >= at - 400 }
        },
    )
    .await;
    for i in 25..50 {
        enqueue(i).await;
    }
    let now = store.redis_time_ms().await.expect("TIME");
    assert!(
        at - now > 50,
        "the second half was enqueued too late to test the due set"
    );
    let members: usize = conn.zcard(keys.due(0)).await.expect("ZCARD");
    assert_eq!(members, 25, "the second half waits in the due set");

    let signals = Signals::new(1);
    let token = CancellationToken::new();
    let carrier = Carrier::new(
        store.clone(),
        signals,
        RedisClock::new(),
        Fleet::new(1),
        Duration::from_secs(1),
    );
    let task = tokio::spawn(carrier.run(token.child_token()));
    let ready = keys.ready(0);
    wait_until("all promoted", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        let ready = ready.clone();
        async move { conn.llen::<_, i64>(&ready).await.expect("LLEN") == 50 }
    })
    .await;
    token.cancel();
    task.await.expect("carrier");
    let ids: Vec<String> = conn.lrange(&ready, 0, -1).await.expect("LRANGE");
    let expected: Vec<String> = (0..50).map(|i| format!("z-{:02}", 49 - i)).collect();
    assert_eq!(
        ids, expected,
        "ids sort against enqueue order; order must be enqueue order"
    );
    let wheel_left: usize = conn.zcard(keys.wheel(0)).await.expect("ZCARD");
    assert_eq!(wheel_left, 0, "the opened bucket is gone");
}

/// A record removed or mangled by hand (or evicted under a wrong
/// `maxmemory-policy`) must not wedge its partition: a record without its
/// spec (a due-set member whose record was deleted is promoted into one) is
/// dropped from the ready list unclaimed, and the jobs around it go on.
#[tokio::test]
async fn records_deleted_by_hand_do_not_wedge_the_partition() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.redis.partitions = 1;
    let store = Store::connect(&config).await.expect("store");
    let new_job = |id: &str| {
        JobInput {
            id: Some(id.into()),
            url: Some("http://127.0.0.1:9/".into()),
            delay: Some("50ms".into()),
            ..JobInput::default()
        }
        .validate(&config)
        .expect("valid job")
        .new_job(&config)
    };
    for id in ["keep-1", "gone-1", "keep-2"] {
        store.enqueue(&new_job(id)).await.expect("enqueue");
    }
    let keys = store.keys().clone();
    let mut conn = redis.conn().await;
    let _: () = conn
        .hdel(keys.live_records(0, "gone-1"), "gone-1")
        .await
        .expect("HDEL");
    // A bare record on the ready list, as an old promote would have left.
    let _: () = conn
        .hset(keys.live_records(0, "bare-1"), "bare-1", "r")
        .await
        .expect("HSET");
    let _: () = conn.rpush(keys.ready(0), "bare-1").await.expect("RPUSH");

    // Promoted once due by Redis's clock (50 ms on): the due set empties,
    // gone-1's member included.
    let due = keys.due(0);
    wait_until(
        "every due member is promoted",
        Duration::from_secs(10),
        || {
            let (store, mut conn, due) = (store.clone(), conn.clone(), due.clone());
            async move {
                store.promote(0, 100).await.expect("promote");
                conn.zcard::<_, usize>(&due).await.expect("ZCARD") == 0
            }
        },
    )
    .await;
    let mut claimed: Vec<String> = store
        .claim(0, 10)
        .await
        .expect("claim")
        .jobs
        .into_iter()
        .map(|j| j.id)
        .collect();
    claimed.sort();
    assert_eq!(claimed, ["keep-1", "keep-2"]);
    let (due, ready): (usize, usize) = redis::pipe()
        .zcard(keys.due(0))
        .llen(keys.ready(0))
        .query_async(&mut conn)
        .await
        .expect("ZCARD, LLEN");
    assert_eq!((due, ready), (0, 0), "nothing left behind");
    for id in ["gone-1", "bare-1"] {
        let left: bool = conn
            .hexists(keys.live_records(0, id), id)
            .await
            .expect("HEXISTS");
        assert!(!left, "{id}: bare records are deleted");
    }
}

/// A claim for no jobs claims none (the script reads the ready list with
/// LRANGE, where 0..-1 would mean all of it).
#[tokio::test]
async fn a_claim_for_zero_jobs_claims_none() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.redis.partitions = 1;
    let store = Store::connect(&config).await.expect("store");
    let job = JobInput {
        id: Some("z-1".into()),
        url: Some("http://127.0.0.1:9/".into()),
        ..JobInput::default()
    }
    .validate(&config)
    .expect("valid job")
    .new_job(&config);
    store.enqueue(&job).await.expect("enqueue");
    assert!(store.claim(0, 0).await.expect("claim").jobs.is_empty());
    assert_eq!(store.claim(0, 1).await.expect("claim").jobs.len(), 1);
}

/// Creates job `id`, due after `delay` (None: now), for a receiver that is
/// never reached (the test claims and settles it by hand).
async fn enqueue_unreached(
    store: &Store,
    config: &hookq::config::Config,
    id: &str,
    delay: Option<&str>,
) {
    let input = JobInput {
        id: Some(id.into()),
        url: Some("http://127.0.0.1:9/never".into()),
        delay: delay.map(str::to_string),
        ..JobInput::default()
    };
    crate::enqueue_direct(store, config, input).await;
}

/// Creates job `id`, claims it (attempt 1), lets that lease expire and be
/// reclaimed, and claims it again (attempt 2): the claims of both attempts.
async fn lose_first_lease(
    store: &Store,
    config: &hookq::config::Config,
    id: &str,
) -> (hookq::store::Claimed, hookq::store::Claimed) {
    enqueue_unreached(store, config, id, None).await;
    let first = crate::claim_direct(store, id).await;
    let p = first.partition;
    wait_until(
        "the lease of attempt 1 expires",
        Duration::from_secs(10),
        || {
            let store = store.clone();
            async move { store.reclaim(p, 100).await.expect("reclaim").requeued == 1 }
        },
    )
    .await;
    let second = crate::claim_direct(store, id).await;
    (first, second)
}

/// A change that sends job `id` elsewhere, computed from `old_spec_json`.
fn redirect<'a>(id: &'a str, old_spec_json: &'a str) -> hookq::store::Reschedule<'a> {
    hookq::store::Reschedule {
        id,
        old_spec_json,
        new_spec_json: r#"{"url":"http://127.0.0.1:9/elsewhere"}"#,
        due: Some(hookq::job::Due::After(10)),
        max_attempts: 3,
        lease_ms: None,
        given: hookq::job::GIVEN_DELAY | 10,
    }
}

/// Every move that arrives late — a defer or an outcome of an attempt whose
/// lease was taken over or whose job was cancelled, a cancel of a finished
/// job, a change of a job that is no longer scheduled or was changed
/// meanwhile — changes nothing. Each case is one guard in a Lua script;
/// `scripts/lua-guards.sh` deletes each guard and sees a test fail.
#[tokio::test]
async fn late_moves_change_nothing() {
    use hookq::job::State;
    use hookq::store::{CancelOutcome, RescheduleOutcome};
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.delivery.timeout = Duration::from_millis(200);
    config.delivery.lease_margin = Duration::from_millis(100);
    let store = Store::connect(&config).await.expect("store");
    let state_of = |id: &'static str| {
        let store = store.clone();
        async move {
            let record = store.get(id).await.expect("get").expect("record");
            (record.state, record.attempts)
        }
    };

    // A defer by attempt 1 after its lease expired and attempt 2 was claimed.
    let (first, second) = lose_first_lease(&store, &config, "defer-stale").await;
    let p = first.partition;
    assert_eq!(second.attempt, 2);
    let deferred = store
        .defer_many(p, &[(&first, Duration::from_millis(10))])
        .await
        .expect("defer");
    assert_eq!(deferred, 0, "attempt 1's defer was applied over attempt 2");
    assert_eq!(state_of("defer-stale").await, (State::Inflight, 2));

    // A defer, and a success, of an attempt whose job was cancelled meanwhile.
    enqueue_unreached(&store, &config, "defer-cancelled", None).await;
    let claim = crate::claim_direct(&store, "defer-cancelled").await;
    let inflight_key = store
        .keys()
        .inflight(store.keys().partition_of("defer-cancelled"));
    assert_eq!(
        store.cancel("defer-cancelled").await.expect("cancel"),
        CancelOutcome::CancelledInFlight
    );
    let mut conn = redis.conn().await;
    let leased: Option<f64> = conn
        .zscore(&inflight_key, "defer-cancelled")
        .await
        .expect("ZSCORE");
    assert_eq!(leased, None, "a cancelled job keeps its lease");
    let deferred = store
        .defer_many(claim.partition, &[(&claim, Duration::from_millis(10))])
        .await
        .expect("defer");
    assert_eq!(deferred, 0, "a cancelled job was deferred back to life");
    assert!(
        !store
            .complete(&claim, &store.delivery_from_json(&claim.spec_json, "{}"))
            .await
            .expect("complete"),
        "a cancelled job was recorded as delivered"
    );
    assert_eq!(state_of("defer-cancelled").await, (State::Cancelled, 1));

    // A cancel of a delivered job.
    enqueue_unreached(&store, &config, "done", None).await;
    let claim = crate::claim_direct(&store, "done").await;
    assert!(store
        .complete(&claim, &store.delivery_from_json(&claim.spec_json, "{}"))
        .await
        .expect("complete"));
    assert_eq!(
        store.cancel("done").await.expect("cancel"),
        CancelOutcome::Finished
    );
    assert_eq!(state_of("done").await, (State::Delivered, 1));

    // A lease left behind for a job no longer in flight (no script leaves
    // one; an operator's hand or a future bug could): reclaim drops the
    // lease and leaves the job as it is.
    let p = store.keys().partition_of("done");
    let () = conn
        .zadd(store.keys().inflight(p), "done", 1)
        .await
        .expect("ZADD");
    let reclaim = store.reclaim(p, 100).await.expect("reclaim");
    assert_eq!((reclaim.requeued, reclaim.dead), (0, 0), "{reclaim:?}");
    assert_eq!(state_of("done").await, (State::Delivered, 1));
    let leased: Option<f64> = conn
        .zscore(store.keys().inflight(p), "done")
        .await
        .expect("ZSCORE");
    assert_eq!(leased, None);

    // A change of a job that is no longer scheduled, and one computed from
    // a spec that has changed since.
    enqueue_unreached(&store, &config, "patched", Some("1h")).await;
    let stored = store.get("patched").await.expect("get").expect("record");
    let stale_spec = r#"{"url":"http://127.0.0.1:9/before"}"#;
    assert_eq!(
        store
            .reschedule(&redirect("patched", stale_spec))
            .await
            .expect("reschedule"),
        RescheduleOutcome::Modified
    );
    assert_eq!(
        store
            .get("patched")
            .await
            .expect("get")
            .expect("record")
            .spec_json,
        stored.spec_json
    );
    enqueue_unreached(&store, &config, "ready-now", None).await;
    let ready = store.get("ready-now").await.expect("get").expect("record");
    assert_eq!(
        store
            .reschedule(&redirect("ready-now", &ready.spec_json))
            .await
            .expect("reschedule"),
        RescheduleOutcome::NotScheduled(State::Ready)
    );
    assert_eq!(
        store
            .get("ready-now")
            .await
            .expect("get")
            .expect("record")
            .spec_json,
        ready.spec_json
    );
    // A scheduled job whose due time has passed reads as ready although no
    // carrier moved it (its record still says scheduled), and a change is
    // refused as for any ready job.
    enqueue_unreached(&store, &config, "due-unmoved", Some("50ms")).await;
    wait_until(
        "due-unmoved reads as ready",
        Duration::from_secs(5),
        || async {
            store
                .get("due-unmoved")
                .await
                .expect("get")
                .expect("record")
                .state
                == State::Ready
        },
    )
    .await;
    let due = store
        .get("due-unmoved")
        .await
        .expect("get")
        .expect("record");
    assert_eq!(
        store
            .reschedule(&redirect("due-unmoved", &due.spec_json))
            .await
            .expect("reschedule"),
        RescheduleOutcome::NotScheduled(State::Ready)
    );
}

/// `stats` reports how long the oldest ready job has waited, on Redis's
/// clock: a job due a minute ago that no worker took shows a minute.
#[tokio::test]
async fn stats_report_the_oldest_ready_jobs_lag() {
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    let (secs, micros): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut redis.conn().await)
        .await
        .expect("TIME");
    let minute_ago = secs * 1000 + micros / 1000 - 60_000;
    crate::enqueue_at(&store, &config, "waiting", minute_ago).await;
    let stats = store.stats().await.expect("stats");
    assert_eq!(stats.ready, 1);
    assert!(
        (60_000..65_000).contains(&stats.oldest_ready_lag_ms),
        "lag {} ms, expected a minute",
        stats.oldest_ready_lag_ms
    );
}

/// Parking (jobs held for an open or paused host): a parked job keeps its
/// attempt count and reads `scheduled`; a park of an attempt whose lease was
/// taken over changes nothing; a parked job that was cancelled or changed
/// (PATCH) meanwhile is not moved back by the drain. Each case is a guard in
/// `park_jobs.lua` / `unpark_jobs.lua` (see `scripts/lua-guards.sh`).
#[tokio::test]
async fn parked_jobs_keep_their_attempts_and_late_moves_change_nothing() {
    use hookq::job::State;
    use hookq::store::{CancelOutcome, RescheduleOutcome};
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.delivery.timeout = Duration::from_millis(200);
    config.delivery.lease_margin = Duration::from_millis(100);
    let store = Store::connect(&config).await.expect("store");
    let host = "http://127.0.0.1:9";
    let state_of = |id: &'static str| {
        let store = store.clone();
        async move {
            let record = store.get(id).await.expect("get").expect("record");
            (record.state, record.attempts)
        }
    };

    // Parked, counted, drained back with its attempts intact.
    enqueue_unreached(&store, &config, "held", None).await;
    let claim = crate::claim_direct(&store, "held").await;
    let p = claim.partition;
    assert_eq!(store.park(p, host, &[&claim]).await.expect("park"), 1);
    assert_eq!(state_of("held").await, (State::Scheduled, 0));
    assert_eq!(store.stats().await.expect("stats").held_for_host, 1);
    assert_eq!(store.unpark(p, host, 10).await.expect("unpark"), (1, 0));
    assert_eq!(store.stats().await.expect("stats").held_for_host, 0);
    assert_eq!(store.promote(p, 10).await.expect("promote").moved, 1);
    let again = crate::claim_direct(&store, "held").await;
    assert_eq!(again.attempt, 1, "parking used up an attempt");

    // A park by attempt 1 after its lease expired and attempt 2 was claimed.
    let (first, second) = lose_first_lease(&store, &config, "park-stale").await;
    let p = first.partition;
    assert_eq!(second.attempt, 2);
    assert_eq!(
        store.park(p, host, &[&first]).await.expect("park"),
        0,
        "attempt 1's park was applied over attempt 2"
    );
    assert_eq!(state_of("park-stale").await, (State::Inflight, 2));

    // Cancelled while parked: the drain leaves it cancelled.
    enqueue_unreached(&store, &config, "park-cancelled", None).await;
    let claim = crate::claim_direct(&store, "park-cancelled").await;
    let p = claim.partition;
    assert_eq!(store.park(p, host, &[&claim]).await.expect("park"), 1);
    assert_eq!(
        store.cancel("park-cancelled").await.expect("cancel"),
        CancelOutcome::Cancelled
    );
    assert_eq!(store.unpark(p, host, 10).await.expect("unpark"), (0, 0));
    assert_eq!(state_of("park-cancelled").await, (State::Cancelled, 0));

    // Changed (PATCH) while parked: it joins the due set once, and the drain
    // does not add it a second time.
    enqueue_unreached(&store, &config, "park-patched", None).await;
    let claim = crate::claim_direct(&store, "park-patched").await;
    let p = claim.partition;
    assert_eq!(store.park(p, host, &[&claim]).await.expect("park"), 1);
    let changed = store
        .reschedule(&redirect("park-patched", &claim.spec_json))
        .await
        .expect("reschedule");
    assert!(
        matches!(changed, RescheduleOutcome::Changed { .. }),
        "{changed:?}"
    );
    assert_eq!(store.unpark(p, host, 10).await.expect("unpark"), (0, 0));
    let mut conn = redis.conn().await;
    let members: Vec<String> = conn
        .zrange(store.keys().due(p), 0, -1)
        .await
        .expect("ZRANGE");
    assert_eq!(
        members
            .iter()
            .filter(|m| m.ends_with("park-patched"))
            .count(),
        1,
        "{members:?}"
    );
}

/// The breaker's records: the threshold opens a host, its probe time turns
/// it half-open, and one probe at a time is granted until the probe's lease
/// runs out (a guard in `host_probe.lua`).
#[tokio::test]
async fn the_breaker_grants_one_probe_at_a_time() {
    use hookq::store::hosts::HostState;
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    let host = "http://127.0.0.1:9";
    let open_for = Duration::from_millis(20);
    let max_open = Duration::from_secs(1);
    let fail = || store.host_failure(host, 2, open_for, max_open, "timeout", false);
    assert_eq!(fail().await.expect("failure").state, HostState::Closed);
    let second = fail().await.expect("failure");
    assert!(
        second.opened && second.state == HostState::Open,
        "{second:?}"
    );
    let lease = Duration::from_millis(300);
    wait_until("the probe time comes", Duration::from_secs(10), || async {
        store.host_probe(host, "begin", lease).await.expect("begin")
    })
    .await;
    assert_eq!(
        store.host_record(host).await.expect("record").state,
        HostState::HalfOpen
    );
    assert!(store.host_probe(host, "take", lease).await.expect("take"));
    assert!(
        !store.host_probe(host, "take", lease).await.expect("take"),
        "a second probe was granted while the first runs"
    );
    wait_until(
        "the probe's lease runs out",
        Duration::from_secs(10),
        || async { store.host_probe(host, "take", lease).await.expect("take") },
    )
    .await;
    // A success that is not the probe does not close it; the probe's does.
    assert!(!store.host_success(host, false).await.expect("success"));
    assert!(store.host_success(host, true).await.expect("success"));
    let record = store.host_record(host).await.expect("record");
    assert_eq!(
        (record.state, record.consecutive_failures),
        (HostState::Closed, 0)
    );
}
