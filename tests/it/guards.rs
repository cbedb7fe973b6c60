//! The Lua scripts' safety guards that no other test holds: each test here
//! is named in `scripts/lua-guards.sh` for the guard it holds, and fails
//! when that guard is deleted. The races are forced deterministically by
//! driving the store directly, as a daemon's workers would (no daemon runs,
//! so nothing else claims, reclaims or delivers meanwhile).

use std::time::Duration;

use hookq::job::{JobInput, State};
use hookq::store::{CancelOutcome, Claimed, FailOutcome, Store};
use redis::AsyncCommands;

use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::test_config;

/// Creates job `id` for an unreachable URL (nothing delivers it: no daemon
/// runs), due now or after `delay`.
async fn enqueue(store: &Store, config: &hookq::config::Config, id: &str, delay: Option<&str>) {
    let input = JobInput {
        id: Some(id.into()),
        url: Some("http://127.0.0.1:9/never".into()),
        delay: delay.map(str::to_string),
        ..JobInput::default()
    };
    crate::enqueue_direct(store, config, input).await;
}

/// Job `id`'s state and attempt count.
async fn state_of(store: &Store, id: &str) -> (State, u32) {
    let record = store.get(id).await.expect("get").expect("record");
    (record.state, record.attempts)
}

/// A failed attempt's outcome, as a worker records it.
fn failure(action: hookq::retry::FailAction) -> hookq::store::Failure<'static> {
    hookq::store::Failure {
        record: "{}",
        last_error: "late",
        last_status: Some(500),
        topic: "default",
        action,
    }
}

/// The outcome of an attempt whose lease expired arrives after the job was
/// reclaimed (ready again) and before the next attempt claimed it: the
/// fencing token still matches (a reclaim does not count an attempt), so
/// only the scripts' state check (`r.state == 'i'` in `complete_jobs.lua`,
/// `fail_job.lua` and `defer_jobs.lua`) refuses it. A success, a failure
/// (retry or dead letter) and a give-back all change nothing, and the next
/// claim gets attempt 2.
#[tokio::test]
async fn late_outcomes_of_a_reclaimed_attempt_change_nothing() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.delivery.timeout = Duration::from_millis(200);
    config.delivery.lease_margin = Duration::from_millis(100);
    config.validate().expect("valid config");
    let store = Store::connect(&config).await.expect("store");
    enqueue(&store, &config, "late", None).await;
    let lost: Claimed = crate::claim_direct(&store, "late").await;
    assert_eq!(lost.attempt, 1);
    let p = lost.partition;
    // The lease is timeout + margin (300 ms); the deadline only bounds it.
    wait_until(
        "attempt 1's lease is reclaimed",
        Duration::from_secs(10),
        || {
            let store = store.clone();
            async move { store.reclaim(p, 100).await.expect("reclaim").requeued == 1 }
        },
    )
    .await;
    assert_eq!(state_of(&store, "late").await, (State::Ready, 1));

    let delivered = store
        .complete(&lost, &store.delivery_from_json(&lost.spec_json, "{}"))
        .await
        .expect("complete");
    assert!(
        !delivered,
        "complete_jobs.lua recorded a reclaimed attempt's success"
    );
    assert_eq!(state_of(&store, "late").await, (State::Ready, 1));

    for action in [
        hookq::retry::FailAction::Retry(Duration::from_millis(10)),
        hookq::retry::FailAction::DeadLetter,
    ] {
        let outcome = store
            .fail(&lost, &failure(action.clone()))
            .await
            .expect("fail");
        assert_eq!(
            outcome,
            FailOutcome::Stale,
            "fail_job.lua applied a reclaimed attempt's failure ({action:?})"
        );
        assert_eq!(state_of(&store, "late").await, (State::Ready, 1));
    }

    let given_back = store
        .defer_many(p, &[(&lost, Duration::from_secs(3600))])
        .await
        .expect("defer");
    assert_eq!(
        given_back, 0,
        "defer_jobs.lua gave a reclaimed job back (uncounting the lost attempt)"
    );
    assert_eq!(state_of(&store, "late").await, (State::Ready, 1));

    // The job is still ready, once: the next claim is attempt 2.
    let next = store.claim(p, 100).await.expect("claim");
    let attempts: Vec<(String, u32)> = next.jobs.into_iter().map(|j| (j.id, j.attempt)).collect();
    assert_eq!(attempts, [("late".to_string(), 2)]);
}

/// A ready job that is cancelled leaves its id in the ready list as a
/// tombstone (no LREM on a long list). Once its summary has expired the id
/// may be created again, due in an hour; the old tombstone must not claim
/// the new job (`rec_ready` in `claim_ready.lua`: the record is there, but
/// scheduled and not due). (The cancelled job itself is skipped by a claim
/// because its live record is gone, guard or not.)
#[tokio::test]
async fn a_cancelled_ready_jobs_tombstone_claims_no_later_job_of_its_id() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.retention.finished = Duration::from_secs(1);
    config.validate().expect("valid config");
    let store = Store::connect(&config).await.expect("store");
    let id = "reused";
    let p = store.keys().partition_of(id);
    enqueue(&store, &config, id, None).await;
    assert_eq!(state_of(&store, id).await, (State::Ready, 0));
    assert_eq!(
        store.cancel(id).await.expect("cancel"),
        CancelOutcome::Cancelled
    );
    // Retention is 1 s; the deadline only bounds the wait for the summary
    // to expire.
    wait_until(
        "the cancelled job's summary expires",
        Duration::from_secs(30),
        || {
            let store = store.clone();
            async move { store.get(id).await.expect("get").is_none() }
        },
    )
    .await;
    let mut conn = redis.conn().await;
    let ready: Vec<String> = conn
        .lrange(store.keys().ready(p), 0, -1)
        .await
        .expect("LRANGE");
    assert_eq!(ready, [id], "the tombstone is still in the ready list");

    enqueue(&store, &config, id, Some("1h")).await;
    assert_eq!(state_of(&store, id).await, (State::Scheduled, 0));
    let claimed = store.claim(p, 100).await.expect("claim");
    let ids: Vec<&str> = claimed.jobs.iter().map(|j| j.id.as_str()).collect();
    assert!(
        ids.is_empty(),
        "a tombstone claimed a job due in an hour: {ids:?}"
    );
    assert_eq!(state_of(&store, id).await, (State::Scheduled, 0));
}

/// A lease left in the in-flight set for a job that is not in flight (no
/// script leaves one; an operator's hand or a future bug could): when it
/// expires, reclaim drops it and leaves the job as it is (`r.state == 'i'`
/// in `reclaim_expired.lua`). A job scheduled in an hour is not made ready
/// now, and no attempt is counted.
#[tokio::test]
async fn a_lease_left_behind_for_a_scheduled_job_does_not_run_it_early() {
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    let id = "stray-lease";
    let p = store.keys().partition_of(id);
    enqueue(&store, &config, id, Some("1h")).await;
    let mut conn = redis.conn().await;
    let () = conn
        .zadd(store.keys().inflight(p), id, 1)
        .await
        .expect("ZADD");
    let reclaim = store.reclaim(p, 100).await.expect("reclaim");
    assert_eq!(
        (reclaim.requeued, reclaim.dead),
        (0, 0),
        "a scheduled job was taken back as a lost attempt: {reclaim:?}"
    );
    assert_eq!(state_of(&store, id).await, (State::Scheduled, 0));
    let leased: Option<f64> = conn
        .zscore(store.keys().inflight(p), id)
        .await
        .expect("ZSCORE");
    assert_eq!(leased, None, "the stray lease stays");
    let claimed = store.claim(p, 100).await.expect("claim");
    assert!(claimed.jobs.is_empty(), "{:?}", claimed.jobs);
}

/// Two changes of one schedule computed from the same version (two PATCHes
/// that read it at once): the first is written, the second is refused as a
/// conflict and changes nothing (the version check in `put_schedule.lua`;
/// the API then reads again and retries).
#[tokio::test]
async fn a_schedule_change_computed_from_an_older_version_is_refused() {
    use hookq::store::schedules::{PutOutcome, ScheduleWrite};
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    let spec_of = |every: &str| {
        let input: hookq::schedule::ScheduleInput = serde_json::from_value(serde_json::json!(
            {"id": "raced", "every": every, "job": {"url": "http://127.0.0.1:9/never"}}
        ))
        .expect("input");
        input.validate(&config).expect("valid").spec
    };
    let now = store.redis_time_ms().await.expect("time");
    let next = Some(now + 3_600_000);
    let hourly = spec_of("1h");
    let create = ScheduleWrite::new(&config, "raced", &hourly, false, next, now, None);
    assert_eq!(
        store.put_schedule(&create).await.expect("create"),
        PutOutcome::Written(1)
    );
    let daily = spec_of("24h");
    let first = ScheduleWrite::new(&config, "raced", &daily, false, next, now, Some(1));
    assert_eq!(
        store.put_schedule(&first).await.expect("change"),
        PutOutcome::Written(2)
    );
    let weekly = spec_of("168h");
    let second = ScheduleWrite::new(&config, "raced", &weekly, false, next, now, Some(1));
    assert_eq!(
        store.put_schedule(&second).await.expect("change"),
        PutOutcome::Conflict,
        "a change computed from version 1 overwrote version 2"
    );
    let base = crate::redis_snapshot(&redis).await;
    let spec: String = redis
        .conn()
        .await
        .hget(
            base.keys()
                .find(|k| k.ends_with("sched:raced"))
                .expect("the schedule's hash"),
            "spec",
        )
        .await
        .expect("HGET");
    assert!(spec.contains("24h") || spec.contains("86400"), "{spec}");
}

/// A host the breaker opened is closed only by a probe's success or an
/// operator: the daemons' check for timed pauses that ran out
/// (`host_resume` `expired`) leaves an open host open even once its probe
/// time has passed (`state ~= 'paused'` in `host_resume.lua`), and an
/// operator's resume of a host that is not blocked changes nothing (`state
/// == 'closed'`: the CLI and API report it as already running).
#[tokio::test]
async fn only_a_probe_or_an_operator_closes_an_open_host() {
    use hookq::store::hosts::HostState;
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    let host = "http://127.0.0.1:9";
    assert!(
        !store.host_resume(host, "operator").await.expect("resume"),
        "host_resume.lua resumed a host that was never blocked"
    );
    let open_for = Duration::from_millis(20);
    let failed = store
        .host_failure(host, 1, open_for, Duration::from_secs(1), "timeout", false)
        .await
        .expect("failure");
    assert_eq!(failed.state, HostState::Open, "{failed:?}");
    let probe_at = store
        .host_record(host)
        .await
        .expect("record")
        .next_probe_at
        .expect("an open host has a probe time");
    // The probe time is 20 ms away; the deadline only bounds the wait.
    wait_until("the probe time passes", Duration::from_secs(10), || {
        let store = store.clone();
        async move { store.redis_time_ms().await.expect("time") > probe_at }
    })
    .await;
    assert!(
        !store.host_resume(host, "expired").await.expect("resume"),
        "host_resume.lua closed an open host as if its pause had run out"
    );
    assert_eq!(
        store.host_record(host).await.expect("record").state,
        HostState::Open
    );
    assert!(store.host_resume(host, "operator").await.expect("resume"));
    assert_eq!(
        store.host_record(host).await.expect("record").state,
        HostState::Closed
    );
}
