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
/// reclaimed (ready again, the lost attempt counted) and before the next
/// attempt claimed it: its lease is gone (`complete_jobs.lua`) and its
/// attempt is not the next one (`fail_job.lua`, `defer_jobs.lua`). A
/// success, a failure (retry or dead letter) and a give-back all change
/// nothing, and the next claim gets attempt 2.
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

/// An outcome for a claim whose job was given back unattempted (a daemon
/// bug, or an operator's hand: no daemon records an attempt it gave back)
/// finds the job no longer in flight, its counter where the claim found
/// it, so the attempt number alone would match: the lease check
/// (`rec_in_flight` in `fail_job.lua`, `defer_jobs.lua` and `park_jobs.lua`)
/// refuses it. A failure, a second give-back and a parking change nothing.
#[tokio::test]
async fn an_outcome_of_a_claim_given_back_changes_nothing() {
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    enqueue(&store, &config, "given", None).await;
    let claim: Claimed = crate::claim_direct(&store, "given").await;
    assert_eq!(claim.attempt, 1);
    let p = claim.partition;
    let hour = Duration::from_secs(3600);
    let given_back = store.defer_many(p, &[(&claim, hour)]).await.expect("defer");
    assert_eq!(given_back, 1);
    assert_eq!(state_of(&store, "given").await, (State::Scheduled, 0));

    for action in [
        hookq::retry::FailAction::Retry(Duration::from_millis(10)),
        hookq::retry::FailAction::DeadLetter,
    ] {
        let outcome = store
            .fail(&claim, &failure(action.clone()))
            .await
            .expect("fail");
        assert_eq!(
            outcome,
            FailOutcome::Stale,
            "fail_job.lua applied the failure of a claim given back ({action:?})"
        );
    }
    let again = store.defer_many(p, &[(&claim, hour)]).await.expect("defer");
    assert_eq!(again, 0, "defer_jobs.lua gave a job back twice");
    let parked = store
        .park(p, "http://127.0.0.1:9", &[&claim])
        .await
        .expect("park");
    assert_eq!(parked, 0, "park_jobs.lua parked a job given back");
    assert_eq!(state_of(&store, "given").await, (State::Scheduled, 0));
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

/// An id twice in its partition's ready list (a push that raced another,
/// or an operator's hand) is claimed once by a claim that takes both: one
/// job handed over, one lease, one attempt counted (`taken` in
/// `claim_ready.lua`, kept only for a claim of several ids).
#[tokio::test]
async fn an_id_twice_in_one_claim_is_claimed_once() {
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    let id = "twice";
    let p = store.keys().partition_of(id);
    enqueue(&store, &config, id, None).await;
    assert_eq!(state_of(&store, id).await, (State::Ready, 0));
    let mut conn = redis.conn().await;
    let () = conn.rpush(store.keys().ready(p), id).await.expect("RPUSH");
    let ready: Vec<String> = conn
        .lrange(store.keys().ready(p), 0, -1)
        .await
        .expect("LRANGE");
    assert_eq!(ready, [id, id], "the id is twice in the ready list");

    let claimed = store.claim(p, 100).await.expect("claim");
    let handed: Vec<(&str, u32)> = claimed
        .jobs
        .iter()
        .map(|j| (j.id.as_str(), j.attempt))
        .collect();
    assert_eq!(handed, [(id, 1)], "the claim handed the job over twice");
    let leases: Vec<String> = conn
        .zrange(store.keys().inflight(p), 0, -1)
        .await
        .expect("ZRANGE");
    assert_eq!(leases, [id]);
    assert_eq!(state_of(&store, id).await, (State::Inflight, 1));
}

/// A lease left in the in-flight set for a job that is not in flight (no
/// script leaves one; an operator's hand or a future bug could): when it
/// expires, reclaim drops it and leaves the job as it is (`rec_may_fly`
/// and `r.due <= now` in `reclaim_expired.lua`: a claim takes a job only
/// when it is due within the claim ahead). A job scheduled in an hour (in
/// the timing wheel) or in 5 s (in the due set) is not made ready now, and
/// no attempt is counted.
#[tokio::test]
async fn a_lease_left_behind_for_a_scheduled_job_does_not_run_it_early() {
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    let mut conn = redis.conn().await;
    for (id, delay) in [("stray-wheel", "1h"), ("stray-due", "5s")] {
        let p = store.keys().partition_of(id);
        enqueue(&store, &config, id, Some(delay)).await;
        let () = conn
            .zadd(store.keys().inflight(p), id, 1)
            .await
            .expect("ZADD");
        let reclaim = store.reclaim(p, 100).await.expect("reclaim");
        assert_eq!(
            (reclaim.requeued, reclaim.dead),
            (0, 0),
            "a job scheduled in {delay} was taken back as a lost attempt: {reclaim:?}"
        );
        assert_eq!(state_of(&store, id).await, (State::Scheduled, 0), "{id}");
        let leased: Option<f64> = conn
            .zscore(store.keys().inflight(p), id)
            .await
            .expect("ZSCORE");
        assert_eq!(leased, None, "the stray lease of {id} stays");
        let claimed = store.claim(p, 100).await.expect("claim");
        assert!(claimed.jobs.is_empty(), "{:?}", claimed.jobs);
    }
}

/// A job in flight whose id comes into its ready list again (a push that
/// raced another, or an operator's hand) is not claimed a second time: a
/// claim leaves the record as it was, and the lease alone says the job is
/// in flight (`leased` in `claim_ready.lua`).
#[tokio::test]
async fn a_job_in_flight_is_not_claimed_again_when_its_id_comes_back() {
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    let id = "again";
    let p = store.keys().partition_of(id);
    enqueue(&store, &config, id, None).await;
    let first = crate::claim_direct(&store, id).await;
    assert_eq!(first.attempt, 1);
    let mut conn = redis.conn().await;
    let () = conn.rpush(store.keys().ready(p), id).await.expect("RPUSH");
    let again = store.claim(p, 100).await.expect("claim");
    assert!(again.jobs.is_empty(), "claimed twice: {:?}", again.jobs);
    let lease: Option<f64> = conn
        .zscore(store.keys().inflight(p), id)
        .await
        .expect("ZSCORE");
    assert_eq!(
        lease,
        Some(
            first
                .lease
                .token
                .parse::<f64>()
                .expect("a lease of its own: its deadline")
        ),
        "the lease changed"
    );
    assert_eq!(state_of(&store, id).await, (State::Inflight, 1));
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
    let p = store.keys().partition_of("raced");
    let mut conn = redis.conn().await;
    let rule: String = conn
        .hget(store.keys().schedule(p, "raced"), "spec")
        .await
        .expect("HGET");
    assert!(
        rule.contains("\"every_ms\":86400000"),
        "version 2's rule is kept: {rule}"
    );
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

/// A receiver that answers 429 with `Retry-After: <retry_after>` s after
/// holding each request for `hold`, per path.
async fn retry_after_receiver(
    answers: &'static [(&'static str, u64, Duration)],
) -> crate::support::receiver::Receiver {
    use crate::support::receiver::{Receiver, Recorded, Reply};
    Receiver::start(std::sync::Arc::new(move |r: &Recorded| {
        let (_, retry_after, hold) = answers
            .iter()
            .find(|(path, _, _)| *path == r.path)
            .copied()
            .unwrap_or(("", 1, Duration::ZERO));
        Reply {
            headers: vec![("retry-after".into(), retry_after.to_string())],
            delay: Some(hold),
            ..Reply::status(429)
        }
    }))
    .await
}

/// Waits (15 s at most) until every job of `ids` has one attempt in its
/// history: its outcome is recorded, so the breaker has seen it (a worker
/// tells the breaker before it records the outcome).
async fn wait_attempted(base: &str, ids: &[&str]) {
    for id in ids {
        wait_until(
            &format!("{id}'s attempt is recorded"),
            Duration::from_secs(15),
            || async {
                crate::job_view(base, id).await["history"]
                    .as_array()
                    .is_some_and(|h| !h.is_empty())
            },
        )
        .await;
    }
}

/// An operator pauses a host while an attempt is at it; the attempt then
/// answers 429 with `Retry-After: 1`. The operator's pause stays, with no
/// end (`host_pause.lua`: a Retry-After never replaces an operator's
/// pause), and a daemon's check for a timed pause that ran out does not
/// lift it (`till == 0` in `host_resume.lua`).
#[tokio::test]
async fn an_operators_pause_outlasts_a_retry_after_answer() {
    use hookq::store::hosts::HostState;
    static ANSWERS: [(&str, u64, Duration); 1] = [("/paced", 1, Duration::from_secs(2))];
    let redis = RedisServer::start();
    let receiver = retry_after_receiver(&ANSWERS).await;
    let mut config = test_config(&redis);
    config.delivery.timeout = Duration::from_secs(5);
    config.validate().expect("valid config");
    let daemon = crate::start_daemon(&config).await;
    let base = daemon.url();
    let store = Store::connect(&config).await.expect("store");
    let host = format!("http://{}", receiver.addr());
    let host_path: String = url::form_urlencoded::byte_serialize(host.as_bytes()).collect();
    crate::post_created(
        &format!("{base}/v1/jobs"),
        serde_json::json!({"id": "paced", "url": receiver.url("/paced")}),
    )
    .await;
    // The attempt is held at the receiver for 2 s: the pause comes first.
    receiver.wait_for_count(1, Duration::from_secs(10)).await;
    let (status, answer) = crate::post_json(
        &format!("{base}/v1/hosts/{host_path}/pause"),
        serde_json::json!({}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    wait_attempted(&base, &["paced"]).await;
    let record = store.host_record(&host).await.expect("record");
    assert_eq!(
        (record.state, record.next_probe_at, record.reason.as_deref()),
        (HostState::Paused, None, Some("operator")),
        "a Retry-After replaced the operator's pause: {record:?}"
    );
    assert!(
        !store.host_resume(&host, "expired").await.expect("resume"),
        "an expiry check lifted an operator's pause"
    );
    assert_eq!(
        store.host_record(&host).await.expect("record").state,
        HostState::Paused
    );
    daemon.stop().await.expect("clean stop");
}

/// Two attempts at one host answer 429: the first with `Retry-After: 30`,
/// the second, later, with `Retry-After: 1`. The host stays paused for the
/// longer time (`host_pause.lua`: a pause is never shortened), and a
/// daemon's check for a timed pause that ran out does not lift it before
/// its end (`now < till` in `host_resume.lua`).
#[tokio::test]
async fn a_shorter_retry_after_never_shortens_a_pause() {
    use hookq::store::hosts::HostState;
    // Both requests are at the receiver before the first answer (1 s).
    static ANSWERS: [(&str, u64, Duration); 2] = [
        ("/long", 30, Duration::from_secs(1)),
        ("/short", 1, Duration::from_millis(2500)),
    ];
    let redis = RedisServer::start();
    let receiver = retry_after_receiver(&ANSWERS).await;
    let mut config = test_config(&redis);
    config.delivery.timeout = Duration::from_secs(5);
    config.validate().expect("valid config");
    let daemon = crate::start_daemon(&config).await;
    let base = daemon.url();
    let store = Store::connect(&config).await.expect("store");
    let host = format!("http://{}", receiver.addr());
    let (status, answer) = crate::post_json(
        &format!("{base}/v1/jobs/batch"),
        serde_json::json!({"jobs": [
            {"id": "long", "url": receiver.url("/long")},
            {"id": "short", "url": receiver.url("/short")},
        ]}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    receiver.wait_for_count(2, Duration::from_secs(10)).await;
    wait_attempted(&base, &["long", "short"]).await;
    let now = store.redis_time_ms().await.expect("time");
    let record = store.host_record(&host).await.expect("record");
    assert_eq!(record.state, HostState::Paused, "{record:?}");
    let until = record.next_probe_at.expect("a timed pause has an end");
    assert!(
        until > now + 20_000,
        "the pause ends in {} ms, not ~30 s: the shorter Retry-After shortened it",
        until - now
    );
    assert!(
        !store.host_resume(&host, "expired").await.expect("resume"),
        "an expiry check lifted a pause before its end"
    );
    assert_eq!(
        store.host_record(&host).await.expect("record").state,
        HostState::Paused
    );
    daemon.stop().await.expect("clean stop");
}

/// A job waiting in a timing-wheel bucket is changed to be due now: its id
/// stays in the bucket as a tombstone (no LREM). It is claimed, and while
/// its attempt is in flight the bucket opens: the tombstone is skipped
/// (`r.state == 'w'` in the prelude's `promote_due_jobs`), so the job is
/// not scheduled a second time, and no second attempt starts beside the
/// first.
#[tokio::test]
async fn a_wheel_tombstone_does_not_reschedule_a_job_in_flight() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    // 100 ms buckets: a job due in 2 s waits in a level-1 bucket.
    config.redis.wheel_bucket = Duration::from_millis(100);
    config.validate().expect("valid config");
    let store = Store::connect(&config).await.expect("store");
    let id = "moved-near";
    let p = store.keys().partition_of(id);
    enqueue(&store, &config, id, Some("2s")).await;
    let mut conn = redis.conn().await;
    let buckets: usize = conn.zcard(store.keys().wheel(p)).await.expect("ZCARD");
    assert_eq!(buckets, 1, "the job waits in a wheel bucket");
    let stored = store.get(id).await.expect("get").expect("record");
    let change = hookq::store::Reschedule {
        id,
        old_spec_json: &stored.spec_json,
        new_spec_json: &stored.spec_json,
        due: Some(hookq::job::Due::After(0)),
        max_attempts: stored.max_attempts,
        lease_ms: None,
        given: hookq::job::GIVEN_DELAY,
    };
    let changed = store.reschedule(&change).await.expect("reschedule");
    assert!(
        matches!(changed, hookq::store::RescheduleOutcome::Changed { .. }),
        "{changed:?}"
    );
    store.promote(p, 100).await.expect("promote");
    let claim = crate::claim_direct(&store, id).await;
    assert_eq!(claim.attempt, 1);

    // The bucket opens about 2 s after the create; the deadline only
    // bounds the wait.
    wait_until("the old bucket opens", Duration::from_secs(15), || {
        let store = store.clone();
        let redis = &redis;
        async move {
            store.promote(p, 100).await.expect("promote");
            let mut conn = redis.conn().await;
            let left: usize = conn.zcard(store.keys().wheel(p)).await.expect("ZCARD");
            left == 0
        }
    })
    .await;
    assert_eq!(
        state_of(&store, id).await,
        (State::Inflight, 1),
        "the bucket's tombstone rescheduled a job in flight"
    );
    // (A job with a lease is never in a due set, nor promoted from one: a
    // claim of the jobs it promotes does not look for their leases.)
    let due: usize = conn.zcard(store.keys().due(p)).await.expect("ZCARD");
    let ready: Vec<String> = conn
        .lrange(store.keys().ready(p), 0, -1)
        .await
        .expect("LRANGE");
    assert_eq!(
        (due, ready),
        (0, Vec::<String>::new()),
        "the bucket's tombstone rescheduled a job in flight"
    );
    store.promote(p, 100).await.expect("promote");
    let again = store.claim(p, 100).await.expect("claim");
    assert!(again.jobs.is_empty(), "a second attempt: {:?}", again.jobs);
}

/// Two operators replay the same dead letter, the second from a listing
/// read before the first replay; by then the revived job was delivered
/// (only its summary is left). The second replay finds no dead letter and
/// revives nothing (`#entry == 0` in `replay_dead.lua`): the job is not
/// delivered twice.
#[tokio::test]
async fn a_dead_letter_replayed_twice_revives_its_job_once() {
    use hookq::store::ReplayOutcome;
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    let id = "replayed";
    enqueue(&store, &config, id, None).await;
    let claim = crate::claim_direct(&store, id).await;
    let outcome = store
        .fail(&claim, &failure(hookq::retry::FailAction::DeadLetter))
        .await
        .expect("fail");
    assert!(
        matches!(outcome, FailOutcome::DeadLettered(_)),
        "{outcome:?}"
    );
    let letter = store
        .find_dead(id)
        .await
        .expect("find")
        .expect("the dead letter");
    let spec = claim.spec_json.as_str();
    assert_eq!(
        store.replay(&letter, spec, 3).await.expect("replay"),
        ReplayOutcome::Revived
    );
    let revived = crate::claim_direct(&store, id).await;
    let done = store
        .complete(&revived, &store.delivery_from_json(spec, "{}"))
        .await
        .expect("complete");
    assert!(done);
    assert_eq!(state_of(&store, id).await.0, State::Delivered);

    assert_eq!(
        store.replay(&letter, spec, 3).await.expect("replay"),
        ReplayOutcome::Gone,
        "a dead letter already replayed revived its delivered job"
    );
    assert_eq!(state_of(&store, id).await.0, State::Delivered);
    let p = store.keys().partition_of(id);
    let claimed = store.claim(p, 100).await.expect("claim");
    assert!(claimed.jobs.is_empty(), "{:?}", claimed.jobs);
}

/// A script of `lua/` as the store compiles it for a single Redis with the
/// default wheel, with the whole prelude (the store keeps only the parts
/// the script uses). The binary holds `lua/` as written, so that
/// `scripts/lua-guards.sh`'s patch of a guard reaches this copy too.
fn as_compiled(source: &str) -> String {
    format!(
        "local IN_CLUSTER = false\nlocal WHEEL_BUCKET = 65536\n{}\n{source}",
        include_str!("../../lua/prelude.lua")
    )
}

/// One call of `lua/fire_schedules.lua` for schedule `id` of partition `p`,
/// as a firer makes it after reading the schedule waiting for `read_time`
/// at version `version`: fire time `fire` is to fire, then `next`. Returns how many fire times it recorded
/// (0: it found the schedule changed since the read, and changed nothing).
pub(crate) async fn fire_as_read(
    redis: &RedisServer,
    store: &Store,
    id: &str,
    read_time: i64,
    version: u64,
    fire: i64,
    next: i64,
) -> i64 {
    let source = as_compiled(include_str!("../../lua/fire_schedules.lua"));
    let keys = store.keys();
    let p = keys.partition_of(id);
    let fires = keys.fires(p);
    let prefix = fires.strip_suffix("fires").expect("<ns>:{p}:fires");
    let mut conn = redis.conn().await;
    let out: Vec<i64> = redis::Script::new(&source)
        .key(&fires)
        .key(keys.due(p))
        .key(keys.ready(p))
        .key(keys.seq(p))
        .arg(prefix)
        .arg("guards:wake")
        .arg(p)
        .arg(id)
        .arg(read_time)
        .arg(version)
        .arg(fire.to_string())
        .arg("")
        .arg(next.to_string())
        .invoke_async(&mut conn)
        .await
        .expect("fire_schedules");
    out[2]
}

/// A firer's call made from a read that is no longer current changes
/// nothing (`fire_schedules.lua`: "of two daemons firing the same schedule
/// at once one wins, the other changes nothing"):
/// - after the schedule fired its time and that job was delivered, a
///   second firer with the same read (the fire time already passed) does
///   not create the job again;
/// - after a change (PATCH: a new version, the same next fire time), a
///   firing computed from the old version does not fire nor write the old
///   rule's next time;
/// - a firing of a fire time whose job is still live (a change moved the
///   next fire time back onto it) does not re-create that job over its
///   attempt in flight.
#[tokio::test]
async fn stale_firings_change_nothing() {
    use hookq::store::schedules::{PutOutcome, ScheduleWrite};
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    let id = "fired";
    let p = store.keys().partition_of(id);
    let spec_of = |url: &str| {
        let input: hookq::schedule::ScheduleInput = serde_json::from_value(
            serde_json::json!({"id": id, "every": "1h", "job": {"url": url}}),
        )
        .expect("input");
        input.validate(&config).expect("valid").spec
    };
    let now = store.redis_time_ms().await.expect("time");
    // Every fire time is in the past (a fire time ahead of Redis's clock
    // takes another path, not exercised here).
    let hour = 3_600_000;
    let t = now - 2 * hour - 1_000;
    let first = spec_of("http://127.0.0.1:9/first");
    let create = ScheduleWrite::new(&config, id, &first, false, Some(t), t - hour, None);
    assert_eq!(
        store.put_schedule(&create).await.expect("create"),
        PutOutcome::Written(1)
    );
    let job = format!("{id}:{t}");

    // The winner fires t; its job is delivered.
    assert_eq!(fire_as_read(&redis, &store, id, t, 1, t, t + hour).await, 1);
    let claim = crate::claim_in(&store, p, &job).await;
    let delivery = store.delivery_from_json(&claim.spec_json, "{}");
    assert!(store.complete(&claim, &delivery).await.expect("complete"));
    // A second firer read the same (t, version 1).
    assert_eq!(
        fire_as_read(&redis, &store, id, t, 1, t, t + hour).await,
        0,
        "a firing of a fire time already passed was applied"
    );
    assert_eq!(state_of(&store, &job).await.0, State::Delivered);
    let claimed = store.claim(p, 100).await.expect("claim");
    assert!(claimed.jobs.is_empty(), "fired twice: {:?}", claimed.jobs);

    // A change keeps the next fire time t + 1h and bumps the version.
    let t2 = t + hour;
    let second = spec_of("http://127.0.0.1:9/second");
    let change = ScheduleWrite::new(&config, id, &second, false, Some(t2), t - hour, Some(1));
    assert_eq!(
        store.put_schedule(&change).await.expect("change"),
        PutOutcome::Written(2)
    );
    let schedule = store.keys().schedule(p, id);
    let mut conn = redis.conn().await;
    assert_eq!(
        fire_as_read(&redis, &store, id, t2, 1, t2, t2 + 5 * hour).await,
        0,
        "a firing computed from version 1 was applied to version 2"
    );
    let next: String = conn.hget(&schedule, "next").await.expect("HGET");
    assert_eq!(next, t2.to_string(), "the old rule's next time was written");
    assert!(store
        .get(&format!("{id}:{t2}"))
        .await
        .expect("get")
        .is_none());

    // Version 2 fires t2; its job is claimed; a change moves the next fire
    // time back onto t2 (version 3), and a firing of t2 from that read
    // comes while the job is in flight.
    assert_eq!(
        fire_as_read(&redis, &store, id, t2, 2, t2, t2 + hour).await,
        1
    );
    let job2 = format!("{id}:{t2}");
    let claim2 = crate::claim_in(&store, p, &job2).await;
    assert_eq!(claim2.attempt, 1);
    let back = ScheduleWrite::new(&config, id, &second, false, Some(t2), t - hour, Some(2));
    assert_eq!(
        store.put_schedule(&back).await.expect("change"),
        PutOutcome::Written(3)
    );
    fire_as_read(&redis, &store, id, t2, 3, t2, t2 + hour).await;
    assert_eq!(
        state_of(&store, &job2).await,
        (State::Inflight, 1),
        "a firing re-created a job over its attempt in flight"
    );
    // (A claim leaves the record as it was, so a re-created one would read
    // the same: its id back in the ready list shows it.)
    let ready: Vec<String> = redis
        .conn()
        .await
        .lrange(store.keys().ready(p), 0, -1)
        .await
        .expect("LRANGE");
    assert!(
        !ready.contains(&job2),
        "a firing re-created a job over its attempt in flight: {ready:?}"
    );
    let again = store.claim(p, 100).await.expect("claim");
    assert!(again.jobs.is_empty(), "a second attempt: {:?}", again.jobs);
}

/// An operator pauses a host twice: the second pause changes nothing (the
/// pause keeps its start time, and no second `host.paused` alert goes out:
/// `till == 0 and current == 0` in `host_pause.lua`).
#[tokio::test]
async fn a_second_operator_pause_keeps_the_first() {
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let daemon = crate::start_daemon(&config).await;
    let base = daemon.url();
    let store = Store::connect(&config).await.expect("store");
    let host = "http://127.0.0.1:9";
    let pause_url = format!(
        "{base}/v1/hosts/{}/pause",
        url::form_urlencoded::byte_serialize(host.as_bytes()).collect::<String>()
    );
    let (status, answer) = crate::post_json(&pause_url, serde_json::json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let first = store.host_record(host).await.expect("record");
    let since = first.opened_at.expect("a paused host has a start");
    // The second pause comes at a later millisecond of Redis's clock.
    wait_until("Redis's clock moves on", Duration::from_secs(5), || {
        let store = store.clone();
        async move { store.redis_time_ms().await.expect("time") > since }
    })
    .await;
    let (status, answer) = crate::post_json(&pause_url, serde_json::json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let second = store.host_record(host).await.expect("record");
    assert_eq!(
        second.opened_at,
        Some(since),
        "a second pause restarted the first: {second:?}"
    );
    daemon.stop().await.expect("clean stop");
}

/// Claims job `id` and records its attempt's failure as its last: returns
/// its dead letter's stream entry id.
async fn kill(store: &Store, id: &str) -> String {
    let claim = crate::claim_direct(store, id).await;
    match store
        .fail(&claim, &failure(hookq::retry::FailAction::DeadLetter))
        .await
        .expect("fail")
    {
        FailOutcome::DeadLettered(entry) => entry,
        other => panic!("{id} was not dead-lettered: {other:?}"),
    }
}

/// Job `id` dies, its dead record expires (`retention.finished` must be
/// short), and the id is created again and dies again: its two dead
/// letters' entry ids, older first (the index names the newer).
async fn dead_twice(store: &Store, config: &hookq::config::Config, id: &str) -> (String, String) {
    enqueue(store, config, id, None).await;
    let older = kill(store, id).await;
    // The deadline only bounds the wait for the dead record to expire (its
    // letter stays: letters go by the stream's cap).
    wait_until("the dead record expires", Duration::from_secs(30), || {
        let store = store.clone();
        async move { store.get(id).await.expect("get").is_none() }
    })
    .await;
    enqueue(store, config, id, None).await;
    let newer = kill(store, id).await;
    let found = store.find_dead(id).await.expect("find").expect("letter");
    assert_eq!(found.entry_id, newer);
    (older, newer)
}

/// A job id dead twice (its dead record expired, and the id was created
/// again and died again) has two letters in its partition's stream. When
/// the stream's cap drops the older one, the index keeps pointing at the
/// newer (`HGET ... == entry` in the prelude's `dead_forget`): the job's
/// dead letter is still found by id once its dead record has expired.
#[tokio::test]
async fn dropping_a_jobs_older_dead_letter_keeps_its_newer_one_found() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.retention.finished = Duration::from_secs(1);
    config.retention.dead_letters_max = 2;
    config.validate().expect("valid config");
    let store = Store::connect(&config).await.expect("store");
    let id = "twice-dead";
    let p = store.keys().partition_of(id);
    let (older, newer) = dead_twice(&store, &config, id).await;

    // A third letter in the partition puts the stream over its cap of 2:
    // the oldest, the job's first letter, goes.
    let other = (0..)
        .map(|n| format!("other-{n}"))
        .find(|o| store.keys().partition_of(o) == p)
        .expect("an id of the same partition");
    enqueue(&store, &config, &other, None).await;
    kill(&store, &other).await;
    let mut conn = redis.conn().await;
    let left: Vec<redis::Value> = redis::cmd("XRANGE")
        .arg(store.keys().dead(p))
        .arg(&older)
        .arg(&older)
        .query_async(&mut conn)
        .await
        .expect("XRANGE");
    assert!(left.is_empty(), "the older letter is dropped by the cap");
    // Once the second dead record has expired too, only the index names
    // the newer letter (a dead record names its own letter).
    wait_until(
        "the second dead record expires",
        Duration::from_secs(30),
        || {
            let store = store.clone();
            async move { store.get(id).await.expect("get").is_none() }
        },
    )
    .await;
    let found = store.find_dead(id).await.expect("find");
    assert_eq!(
        found.map(|d| d.entry_id),
        Some(newer),
        "dropping the older letter lost the index's pointer to the newer"
    );
}

/// The walk that indexes dead letters made before the index existed hands
/// over a batch read before the job died again: the older letter in that
/// batch does not replace the index's pointer to the newer one (`newer` in
/// `index_dead.lua`; the walk drives the script as `index_dead_letters`
/// does, with a batch read earlier).
#[tokio::test]
async fn a_stale_index_batch_keeps_a_jobs_newest_letter() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.retention.finished = Duration::from_secs(1);
    config.validate().expect("valid config");
    let store = Store::connect(&config).await.expect("store");
    let id = "indexed";
    let p = store.keys().partition_of(id);
    let (older, newer) = dead_twice(&store, &config, id).await;
    let mut conn = redis.conn().await;
    let written: i64 = redis::Script::new(&as_compiled(include_str!("../../lua/index_dead.lua")))
        .key(store.keys().dead(p))
        .key(store.keys().dead_index(p))
        .arg(0)
        .arg(id)
        .arg(&older)
        .invoke_async(&mut conn)
        .await
        .expect("index_dead");
    assert_eq!(written, 0, "an older letter replaced the pointer");
    let found = store.find_dead(id).await.expect("find").expect("letter");
    assert_eq!(found.entry_id, newer, "the index names the older letter");
}

/// One call of `lua/host_drain.lua` for `host` (`step`: take, done or
/// note; a take's turn lasts 10 s), as a daemon's breaker makes it; true
/// when granted. The keys are the host's record and the blocked set, found
/// in Redis by name (the store does not expose them).
async fn drain_step(redis: &RedisServer, host: &str, step: &str) -> bool {
    let mut conn = redis.conn().await;
    let find = |pattern: String| {
        let mut conn = conn.clone();
        async move {
            let keys: Vec<String> = conn.keys(&pattern).await.expect("KEYS");
            assert_eq!(keys.len(), 1, "{pattern}: {keys:?}");
            keys.into_iter().next().expect("one key")
        }
    };
    let record = find(format!("*:{{hosts}}:host:{host}")).await;
    let blocked = find("*:{hosts}:blocked".to_string()).await;
    let code: i64 = redis::Script::new(&as_compiled(include_str!("../../lua/host_drain.lua")))
        .key(record)
        .key(blocked)
        .arg(host)
        .arg(step)
        .arg(10_000)
        .invoke_async(&mut conn)
        .await
        .expect("host_drain");
    code == 1
}

/// Turns at draining a host's parked jobs (`host_drain.lua`): one daemon
/// at a time holds the turn (a second take while it runs is refused: `score
/// > now`); a daemon that just parked jobs for the host leaves the turn's
/// end where it is (`note` on a host in the blocked set changes nothing:
/// else a second drainer could take it at once); and a host the breaker
/// opened again is not drained when its probe time comes, only probed
/// (`state ~= 'closed'`).
#[tokio::test]
async fn one_daemon_at_a_time_drains_a_closed_host() {
    use hookq::store::hosts::HostState;
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    let host = "http://127.0.0.1:9";
    let open_for = Duration::from_millis(20);
    let max_open = Duration::from_secs(1);
    // Opened by a failure, closed by an operator: due now for a drain.
    let failed = store
        .host_failure(host, 1, open_for, max_open, "timeout", false)
        .await
        .expect("failure");
    assert_eq!(failed.state, HostState::Open);
    assert!(store.host_resume(host, "operator").await.expect("resume"));

    assert!(drain_step(&redis, host, "take").await, "the first turn");
    assert!(
        !drain_step(&redis, host, "take").await,
        "a second daemon took the turn while the first held it"
    );
    assert!(
        !drain_step(&redis, host, "note").await,
        "a note moved the host in the blocked set"
    );
    assert!(
        !drain_step(&redis, host, "take").await,
        "after a note, a second daemon took the turn while the first held it"
    );
    assert!(drain_step(&redis, host, "done").await, "the drain ends");

    // Opened again: its probe time (20 ms away) comes and passes.
    let failed = store
        .host_failure(host, 1, open_for, max_open, "timeout", false)
        .await
        .expect("failure");
    assert_eq!(failed.state, HostState::Open);
    let probe_at = store
        .host_record(host)
        .await
        .expect("record")
        .next_probe_at
        .expect("probe time");
    wait_until("the probe time passes", Duration::from_secs(10), || {
        let store = store.clone();
        async move { store.redis_time_ms().await.expect("time") > probe_at }
    })
    .await;
    assert!(
        !drain_step(&redis, host, "take").await,
        "an open host was drained instead of probed"
    );
}

/// A migration run again over records it already converted (a `hookq
/// migrate` killed in the middle of a partition, and run again) skips
/// them: a dead job's kept record (a string of layout 3) is neither read
/// as a layout-1 hash (`TYPE ... ~= 'hash'` in `migrate_jobs.lua`) nor
/// converted again as a layout-2 string (its 34th byte is not the spec's
/// `{`: `migrate_records.lua`), and reads as before.
#[tokio::test]
async fn migrating_again_skips_records_already_converted() {
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    let id = "converted";
    let p = store.keys().partition_of(id);
    enqueue(&store, &config, id, None).await;
    kill(&store, id).await;
    let before = store.get(id).await.expect("get").expect("record");
    assert_eq!(before.state, State::Dead);
    let kept = store.keys().job(p, id);
    let job_prefix = kept.strip_suffix(id).expect("<ns>:{p}:job:<id>");
    let fires = store.keys().fires(p);
    let prefix = fires.strip_suffix("fires").expect("<ns>:{p}:fires");
    let mut conn = redis.conn().await;

    let from_hashes: (i64, i64) =
        redis::Script::new(&as_compiled(include_str!("../../lua/migrate_jobs.lua")))
            .key(store.keys().seq(p))
            .arg(job_prefix)
            .arg(prefix)
            .arg(id)
            .invoke_async(&mut conn)
            .await
            .expect("migrate_jobs");
    assert_eq!(from_hashes, (0, 1), "migrate_jobs converted a record again");
    let from_strings: (i64, i64) =
        redis::Script::new(&as_compiled(include_str!("../../lua/migrate_records.lua")))
            .key(store.keys().stats(p))
            .arg(job_prefix)
            .arg(id)
            .invoke_async(&mut conn)
            .await
            .expect("migrate_records");
    assert_eq!(
        from_strings,
        (0, 1),
        "migrate_records converted a record again"
    );
    let after = store.get(id).await.expect("get").expect("record");
    assert_eq!(
        (after.state, after.attempts, &after.spec_json),
        (before.state, before.attempts, &before.spec_json)
    );
}

/// An ordered schedule lives in its ordering key's partition; its id's own
/// partition holds a stub naming it (see `place_schedule.lua`). A create of
/// the same id finds the schedule that exists, wherever it lives, and
/// conflicts with it (other content) instead of making a second schedule
/// of that id:
/// - without an ordering key, the create goes to the id's partition, finds
///   the stub and follows it (`ELSEWHERE` in `put_schedule.lua`);
/// - a schedule without an ordering key lives in its id's partition; a
///   create with one is placed there, not in the key's partition
///   (`if f[1] then return here end` in `place_schedule.lua`).
#[tokio::test]
async fn a_schedule_id_has_one_schedule_ordered_or_not() {
    use hookq::store::schedules::{PutOutcome, ScheduleWrite};
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    let spec_of = |id: &str, ordering_key: Option<&str>| {
        let mut job = serde_json::json!({"url": "http://127.0.0.1:9/never"});
        if let Some(key) = ordering_key {
            job["ordering_key"] = key.into();
        }
        let input: hookq::schedule::ScheduleInput =
            serde_json::from_value(serde_json::json!({"id": id, "every": "1h", "job": job}))
                .expect("input");
        input.validate(&config).expect("valid").spec
    };
    let now = store.redis_time_ms().await.expect("time");
    let next = Some(now + 3_600_000);
    for (id, ordered_first) in [("ordered-first", true), ("plain-first", false)] {
        let own = store.keys().partition_of(id);
        // An ordering key whose partition is not the id's.
        let key = (0..)
            .map(|n| format!("acct-{n}"))
            .find(|k| store.keys().order_partition(&format!("default:{k}")) != own)
            .expect("a key of another partition");
        let ordered = spec_of(id, Some(&key));
        let plain = spec_of(id, None);
        let (first, second) = if ordered_first {
            (&ordered, &plain)
        } else {
            (&plain, &ordered)
        };
        let create = |spec| ScheduleWrite::new(&config, id, spec, false, next, now, None);
        assert_eq!(
            store.put_schedule(&create(first)).await.expect("create"),
            PutOutcome::Written(1),
            "{id}"
        );
        assert_eq!(
            store.put_schedule(&create(second)).await.expect("create"),
            PutOutcome::Conflict,
            "{id}: a second schedule of one id was created"
        );
    }
    // One schedule hash per id (a stub has no spec).
    let mut conn = redis.conn().await;
    for id in ["ordered-first", "plain-first"] {
        let keys: Vec<String> = conn.keys(format!("*:sched:{id}")).await.expect("KEYS");
        let mut with_spec = 0;
        for key in keys {
            let spec: Option<String> = conn.hget(&key, "spec").await.expect("HGET");
            with_spec += usize::from(spec.is_some());
        }
        assert_eq!(with_spec, 1, "{id}");
    }
}
