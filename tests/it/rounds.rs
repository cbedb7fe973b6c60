//! Round leases (see "Round leases" in `lua/prelude.lua`): the jobs a claim
//! takes straight from the promotion share one lease. What holds it: they
//! read in flight everywhere (view, listing, counts); each outcome ends its
//! own part and the round ends with its last; a failure or a cancel of one
//! of them turns the round into leases of the jobs' own and the others
//! complete as before; an expired round is taken back but for the jobs
//! already delivered; an outcome sent again after it was recorded changes
//! nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hookq::job::State;
use hookq::store::{CancelOutcome, Claimed, FailOutcome, Store};

use crate::support::redis::RedisServer;
use crate::support::wait_until;

/// Partitions of these tests' stores (a single Redis: one round space).
const PARTITIONS: u16 = 4;

/// A store on a fresh Redis with [`PARTITIONS`] partitions, and jobs
/// `ids` created due together shortly (in their due sets: a job due now
/// goes to its ready list, which a claim reads job by job).
async fn store_with_jobs_due(redis: &RedisServer, ids: &[&str]) -> Store {
    let (config, store) = crate::partitioned_store(redis, PARTITIONS).await;
    let due = store.redis_time_ms().await.expect("time") + 300;
    for id in ids {
        crate::enqueue_at(&store, &config, id, due).await;
    }
    store
}

/// Promotes and claims in one call, as a daemon's round does, until the
/// claim takes `n` jobs (10 s at most); the claim's jobs.
async fn claim_round(store: &Store, n: usize) -> Vec<Claimed> {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let claimed = store.claim_promoting(0, 64, 256).await.expect("claim").jobs;
        if !claimed.is_empty() {
            assert_eq!(claimed.len(), n, "one claim takes them all");
            return claimed;
        }
        assert!(tokio::time::Instant::now() < until, "nothing claimed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The live rounds' tokens.
async fn rounds(redis: &RedisServer, store: &Store) -> Vec<String> {
    let mut conn = redis.conn().await;
    redis::cmd("ZRANGE")
        .arg(store.keys().rounds(0))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .expect("ZRANGE rounds")
}

/// Job `id`'s own lease (its score in its partition's in-flight set).
async fn own_lease(redis: &RedisServer, store: &Store, job: &Claimed) -> Option<f64> {
    let mut conn = redis.conn().await;
    redis::cmd("ZSCORE")
        .arg(store.keys().inflight(job.partition))
        .arg(&job.id)
        .query_async(&mut conn)
        .await
        .expect("ZSCORE")
}

/// Records a 2xx for `job`; whether it was current.
async fn complete(store: &Store, job: &Claimed) -> bool {
    let delivery = store.delivery_from_json(&job.spec_json, r#"{"status":200}"#);
    store.complete(job, &delivery).await.expect("complete")
}

/// A 500 whose next attempt is due `delay` after now.
fn retrying_after(delay: Duration) -> hookq::store::Failure<'static> {
    hookq::store::Failure {
        record: "{}",
        last_error: "http_status: 500",
        last_status: Some(500),
        topic: "default",
        action: hookq::retry::FailAction::Retry(delay),
    }
}

/// Job `id`'s state and attempts made.
async fn state_of(store: &Store, id: &str) -> (State, u32) {
    let record = store.get(id).await.expect("get").expect("known");
    (record.state, record.attempts)
}

/// The jobs of one promoting claim share one lease: one round, no lease of
/// their own, every job in flight in its view, the listing and the counts;
/// the round lives until the last of their outcomes.
#[tokio::test]
async fn jobs_claimed_from_the_promotion_share_one_round_until_their_last_outcome() {
    let redis = RedisServer::start();
    let ids = ["ra", "rb", "rc", "rd", "re", "rf"];
    let store = store_with_jobs_due(&redis, &ids).await;
    let claimed = claim_round(&store, ids.len()).await;
    let partitions: std::collections::BTreeSet<u16> = claimed.iter().map(|j| j.partition).collect();
    assert!(
        partitions.len() > 1,
        "the round spans partitions: {partitions:?}"
    );
    let token = claimed[0].lease.token.clone();
    assert!(token.contains('/'), "a round's token: {token}");
    assert!(claimed.iter().all(|j| j.lease.token == token));
    assert_eq!(rounds(&redis, &store).await, [token.to_string()]);
    for job in &claimed {
        assert_eq!(own_lease(&redis, &store, job).await, None, "{}", job.id);
        assert_eq!(state_of(&store, &job.id).await, (State::Inflight, 1));
    }
    assert_eq!(store.stats().await.expect("stats").inflight, 6);
    let listed = store
        .list_jobs(None, Some(State::Inflight), None, 100, None)
        .await
        .expect("list");
    let mut listed: Vec<String> = listed.items.into_iter().map(|r| r.id).collect();
    listed.sort();
    assert_eq!(listed, ids);

    for job in &claimed[..5] {
        assert!(complete(&store, job).await, "{} is current", job.id);
    }
    assert_eq!(rounds(&redis, &store).await.len(), 1, "one job left in it");
    assert_eq!(state_of(&store, "rf").await.0, State::Inflight);
    assert!(complete(&store, &claimed[5]).await);
    assert!(
        rounds(&redis, &store).await.is_empty(),
        "ended with its last"
    );
    let mut conn = redis.conn().await;
    let left: usize = redis::cmd("HLEN")
        .arg(store.keys().round_jobs(0))
        .query_async(&mut conn)
        .await
        .expect("HLEN");
    assert_eq!(left, 1, "nothing of the round is left but the counter");
    for id in ids {
        assert_eq!(state_of(&store, id).await, (State::Delivered, 1));
    }
    assert_eq!(store.stats().await.expect("stats").inflight, 0);
}

/// A failure and a cancel of two jobs of a round turn it into leases of
/// the jobs' own (the round's deadline): the others complete; the
/// cancelled job's outcome and the failed job's late success are stale.
#[tokio::test]
async fn a_failure_or_a_cancel_in_a_round_leaves_the_others_to_complete() {
    let redis = RedisServer::start();
    let ids = ["fa", "fb", "fc", "fd"];
    let store = store_with_jobs_due(&redis, &ids).await;
    let claimed = claim_round(&store, ids.len()).await;
    let by_id = |id: &str| {
        claimed
            .iter()
            .find(|j| j.id == id)
            .expect("claimed")
            .clone()
    };
    let (failed, cancelled) = (by_id("fa"), by_id("fb"));
    // One of them delivered first: it gets no lease of its own later.
    assert!(complete(&store, &by_id("fd")).await);
    let outcome = store
        .fail(&failed, &retrying_after(Duration::from_secs(600)))
        .await
        .expect("fail");
    assert!(matches!(outcome, FailOutcome::Scheduled(_)), "{outcome:?}");
    assert!(rounds(&redis, &store).await.is_empty(), "materialized");
    let deadline: f64 = failed
        .lease
        .token
        .split('/')
        .next()
        .and_then(|d| d.parse().ok())
        .expect("the token names its deadline");
    for id in ["fb", "fc"] {
        assert_eq!(own_lease(&redis, &store, &by_id(id)).await, Some(deadline));
    }
    assert_eq!(own_lease(&redis, &store, &failed).await, None);
    assert_eq!(own_lease(&redis, &store, &by_id("fd")).await, None);
    assert_eq!(state_of(&store, "fa").await, (State::Scheduled, 1));

    assert_eq!(
        store.cancel("fb").await.expect("cancel"),
        CancelOutcome::CancelledInFlight
    );
    assert!(
        !complete(&store, &cancelled).await,
        "a cancelled job's outcome"
    );
    assert_eq!(state_of(&store, "fb").await.0, State::Cancelled);
    assert!(complete(&store, &by_id("fc")).await, "fc is current");
    for id in ["fc", "fd"] {
        assert_eq!(state_of(&store, id).await, (State::Delivered, 1));
    }
    assert!(!complete(&store, &failed).await, "its failure was recorded");
    assert_eq!(state_of(&store, "fa").await, (State::Scheduled, 1));
    assert_eq!(store.stats().await.expect("stats").inflight, 0);
}

/// A round whose daemon went away: once its deadline passes, lease
/// recovery takes back its jobs (in every partition) but the one already
/// delivered, and their late outcomes are stale.
#[tokio::test]
async fn an_expired_round_is_taken_back_but_for_its_delivered_jobs() {
    let redis = RedisServer::start();
    let ids = ["xa", "xb", "xc", "xd", "xe"];
    let store = store_with_jobs_due(&redis, &ids).await;
    let claimed = claim_round(&store, ids.len()).await;
    assert!(complete(&store, &claimed[0]).await);
    let requeued = AtomicUsize::new(0);
    wait_until(
        "the round's jobs are taken back",
        Duration::from_secs(15),
        || async {
            let first = store.reclaim(0, 100).await.expect("reclaim");
            requeued.fetch_add(first.requeued, Ordering::Relaxed);
            for q in first.materialized_in {
                let there = store.reclaim(q, 100).await.expect("reclaim");
                requeued.fetch_add(there.requeued, Ordering::Relaxed);
            }
            requeued.load(Ordering::Relaxed) == ids.len() - 1
        },
    )
    .await;
    assert!(rounds(&redis, &store).await.is_empty());
    assert_eq!(
        state_of(&store, &claimed[0].id).await,
        (State::Delivered, 1)
    );
    for job in &claimed[1..] {
        assert_eq!(
            state_of(&store, &job.id).await,
            (State::Ready, 1),
            "{}",
            job.id
        );
        assert!(!complete(&store, job).await, "{}'s late outcome", job.id);
    }
}

/// An outcome sent again (its first call was applied, its answer lost)
/// finds its job recorded: stale, and the round still waits for its other
/// job, whose outcome then ends it.
#[tokio::test]
async fn an_outcome_sent_again_after_it_was_recorded_changes_nothing() {
    let redis = RedisServer::start();
    let store = store_with_jobs_due(&redis, &["aa", "ab"]).await;
    let claimed = claim_round(&store, 2).await;
    assert!(complete(&store, &claimed[0]).await);
    let mut again = claimed[0].clone();
    again.lease.again = true;
    assert!(!complete(&store, &again).await, "recorded already");
    assert_eq!(rounds(&redis, &store).await.len(), 1, "still waiting");
    assert_eq!(state_of(&store, &claimed[1].id).await.0, State::Inflight);
    let mut second = claimed[1].clone();
    second.lease.again = true;
    assert!(
        complete(&store, &second).await,
        "sent again, not yet recorded"
    );
    assert!(rounds(&redis, &store).await.is_empty());
    assert_eq!(
        state_of(&store, &claimed[1].id).await,
        (State::Delivered, 1)
    );
}

/// A job of a live round whose id comes to its ready list again (as a
/// tombstone would) is not claimed a second time from the list.
#[tokio::test]
async fn a_job_in_a_round_is_not_claimed_again_from_a_list() {
    let redis = RedisServer::start();
    let store = store_with_jobs_due(&redis, &["la", "lb"]).await;
    let claimed = claim_round(&store, 2).await;
    let job = &claimed[0];
    let mut conn = redis.conn().await;
    let () = redis::cmd("RPUSH")
        .arg(store.keys().ready(job.partition))
        .arg(&job.id)
        .query_async(&mut conn)
        .await
        .expect("RPUSH");
    let again = store.claim(job.partition, 100).await.expect("claim").jobs;
    assert!(again.is_empty(), "claimed twice: {again:?}");
    assert!(complete(&store, job).await, "its round's lease holds");
}

/// The claim's check against live rounds forgets a round once it ended
/// (the index it keeps between calls): a job of an ended round that comes
/// to a ready list again, its retry due, is claimed, while another round
/// lives.
#[tokio::test]
async fn a_round_that_ended_no_longer_hides_its_jobs_from_a_claim() {
    let redis = RedisServer::start();
    let (config, store) = crate::partitioned_store(&redis, PARTITIONS).await;
    let now = store.redis_time_ms().await.expect("time");
    for (id, due) in [("ea", now + 300), ("eb", now + 300), ("ec", now + 1_000)] {
        crate::enqueue_at(&store, &config, id, due).await;
    }
    let first = claim_round(&store, 2).await;
    let ea = first.iter().find(|j| j.id == "ea").expect("ea").clone();
    // The claim's index learns the first round.
    let mut conn = redis.conn().await;
    let () = redis::cmd("RPUSH")
        .arg(store.keys().ready(ea.partition))
        .arg("ea")
        .query_async(&mut conn)
        .await
        .expect("RPUSH");
    assert!(store
        .claim(ea.partition, 100)
        .await
        .expect("claim")
        .jobs
        .is_empty());
    let second = claim_round(&store, 1).await;
    assert_eq!(second[0].id, "ec");
    // ea fails (the first round ends, materialized), its retry falls due
    // and goes to its ready list while the second round lives.
    let outcome = store
        .fail(&ea, &retrying_after(Duration::from_millis(1)))
        .await
        .expect("fail");
    assert!(matches!(outcome, FailOutcome::Scheduled(_)), "{outcome:?}");
    assert_eq!(rounds(&redis, &store).await.len(), 1, "the second lives");
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    let again = loop {
        store.promote(0, 256).await.expect("promote");
        let claimed = store.claim(ea.partition, 100).await.expect("claim").jobs;
        if let Some(job) = claimed.into_iter().find(|j| j.id == "ea") {
            break job;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "ea's retry is never claimed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(again.attempt, 2);
}
