//! The carrier: moves due jobs from each partition's `due` zset to its `ready`
//! list on time, and takes back attempts whose lease expired (`inflight`
//! zset → `ready` list or dead letter).
//!
//! There is no fixed-interval polling. The carrier remembers, per partition,
//! the earliest due time and the earliest lease deadline Redis reported, and
//! sleeps until the soonest of them. It is woken early by [`Signals`] when a
//! job with an earlier due time arrives (from this process or from another
//! instance, via the wake channel). Promotion runs in bounded batches
//! (`PROMOTE_BATCH` jobs per script call) so a mass-due spike never stalls
//! Redis. Each daemon carries only the partitions the fleet dealt to it
//! (see [`crate::fleet`]); two carriers on one partition (for a moment, while
//! the deal changes) are still safe because every move is one atomic
//! script.

use crate::backoff::Backoff;
use std::future::Future;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio_util::sync::CancellationToken;

use crate::clock::RedisClock;
use crate::fleet::Fleet;
use crate::store::{Promotion, Store, StoreResult};
use crate::wake::Signals;

/// Jobs moved per promotion script call (per partition's timers: see
/// [`carrier_batch`]).
pub const PROMOTE_BATCH: usize = 256;

/// Jobs the carrier moves per promotion call: [`PROMOTE_BATCH`] for each
/// partition a set of timers serves, so that shared timers (a single
/// Redis: one set for every partition) move in one call of a mass-due
/// spike what each partition's own would move, and each partition's claim
/// loop then finds a batch's worth in its ready list, not a sixteenth.
fn carrier_batch(keys: &crate::store::Keys) -> usize {
    let served = usize::from(keys.partitions()) / keys.timer_partitions().len().max(1);
    PROMOTE_BATCH * served.max(1)
}
/// Expired leases taken back per reclaim script call.
pub(crate) const RECLAIM_BATCH: usize = 256;
/// Longest sleep without re-reading Redis: a safety net only, timing never
/// depends on it (wakeups and known due times do).
pub(crate) const MAX_SLEEP: Duration = Duration::from_secs(60);

/// How far ahead of a known due time (by the daemon's estimate of Redis's
/// clock) the carrier wakes and starts asking Redis. Timers have millisecond
/// granularity and round up, and the estimate lags Redis's clock by up to a
/// round trip and Redis's rounding to the millisecond, so waking exactly
/// "at" the due time makes a job 1–2 ms late. Waking early
/// costs at most one promote call that finds nothing due yet (Redis's
/// `TIME` decides, so nothing is ever promoted early): after one, the
/// carrier waits for the due time itself.
pub(crate) const EARLY_WAKE_MS: i64 = 1;

/// What a promotion left for the carrier: when work is next due (Redis's
/// now after a full batch: more may be due already; None: nothing), and
/// whether the promotion came early for that time (within
/// [`EARLY_WAKE_MS`] of its horizon), so that the next one waits for the
/// time itself.
pub(crate) fn after_promotion(promotion: &Promotion) -> (Option<i64>, bool) {
    let next = if promotion.more_due() {
        Some(promotion.now)
    } else {
        promotion.next_due
    };
    let early =
        next.is_some_and(|d| d > promotion.horizon && d - promotion.horizon <= EARLY_WAKE_MS);
    (next, early)
}

/// When to promote next (Redis epoch ms) for the earliest due time `due`,
/// the last round having promoted at `last_round`. Unpaced (`ahead` 0), at
/// `wake`. Paced, at the first point of a grid every nine tenths of
/// `ahead` (its multiples, in Redis's epoch ms) from which the job can be
/// claimed (`ahead` ms before it) and after the last round, or a tenth of
/// `ahead` before the job at the latest (5 ms with the default 50 ms: a
/// claim round takes a millisecond or two, and the daemon holds the job to
/// its time). A round's work is mostly per partition, so the fewer rounds
/// the less Redis works per job (nine tenths against four fifths: ~7 %
/// less at 2,000 jobs/s, docs/performance.md). Spread-out jobs are then claimed
/// together, a round's worth at a time, instead of one wake each; and
/// since every daemon's clock follows Redis's, the daemons of a fleet meet
/// on the same points and wake Redis together, instead of each at its own
/// moment. (A point is never early for its jobs, so paced rounds need no
/// [`EARLY_WAKE_MS`].)
fn paced(wake: i64, due: i64, last_round: i64, ahead: i64) -> i64 {
    if ahead <= 0 {
        return wake;
    }
    let pace = (ahead * 9 / 10).max(1);
    let from = due.saturating_sub(ahead).max(last_round.saturating_add(1));
    let point = from
        .saturating_add(pace - 1)
        .div_euclid(pace)
        .saturating_mul(pace);
    point.min(due - (ahead - pace))
}

/// Wakes the claim loops of the partitions other than `promoting` whose
/// ready lists its promotion from shared timers started (`started_in`):
/// this daemon's at once, those another daemon carries by a message. (The
/// promoting partition's own loop the caller wakes or is.)
pub(crate) async fn wake_started(
    store: &Store,
    signals: &Signals,
    fleet: &Fleet,
    promoting: u16,
    started_in: &[u16],
) {
    let mut elsewhere = Vec::new();
    for &q in started_in.iter().filter(|&&q| q != promoting) {
        if fleet.owns(q) {
            signals.list_started(q);
        } else {
            elsewhere.push(q);
        }
    }
    store.announce_started(&elsewhere).await;
}

/// Sentinel for "nothing known to be due".
const NEVER: i64 = i64::MAX;

/// What the carrier knows about each partition between rounds: when work is
/// next due and when a lease next expires (epoch ms by Redis's clock; 0:
/// read the set afresh; [`NEVER`]: nothing known, or another daemon carries
/// it), whether this daemon carries it, and whether the last promote came
/// early for `next_due` (so the next one waits for the due time itself).
struct Timetable {
    next_due: Vec<i64>,
    next_lease: Vec<i64>,
    owned: Vec<bool>,
    /// Whether each partition has timers of its own (due sets, wheel): all
    /// of them in a cluster, partition 0 alone with shared timers (see
    /// [`crate::store::Keys::timer_partition`]); one without is never due.
    timers: Vec<bool>,
    came_early: Vec<bool>,
    /// `delivery.claim_ahead` in ms: a partition is promoted this long
    /// before its next due time.
    ahead: i64,
    /// When the last round promoted (Redis epoch ms, by the estimate).
    last_round: i64,
}

impl Timetable {
    /// A timetable for `partitions` partitions, none of them carried yet,
    /// those of `timers` with timers of their own, promoting `ahead` ms
    /// before due times.
    fn new(partitions: u16, timers: std::ops::Range<u16>, ahead: i64) -> Self {
        let n = partitions as usize;
        Timetable {
            next_due: vec![0; n],
            next_lease: vec![0; n],
            owned: vec![false; n],
            timers: (0..partitions).map(|p| timers.contains(&p)).collect(),
            came_early: vec![false; n],
            ahead,
            last_round: 0,
        }
    }

    /// Records whether this daemon carries partition `p` now: a partition
    /// just gained (or at start) has both sets read afresh, one carried
    /// elsewhere is never due here.
    fn set_owned(&mut self, p: u16, owns: bool) {
        let i = p as usize;
        if owns && !self.owned[i] {
            self.next_due[i] = if self.timers[i] { 0 } else { NEVER };
            self.next_lease[i] = 0;
            self.came_early[i] = false;
        } else if !owns {
            self.next_due[i] = NEVER;
            self.next_lease[i] = NEVER;
        }
        self.owned[i] = owns;
    }

    /// Takes a due-time hint for a carried partition `p` when it is earlier
    /// than the one known (`early`: the hint's promotion came early for it).
    fn take_hint(&mut self, p: u16, hint: i64, early: bool) {
        let i = p as usize;
        if self.owned[i] && self.timers[i] && hint < self.next_due[i] {
            self.next_due[i] = hint;
            self.came_early[i] = early;
        }
    }

    /// When partition `p` is next to be promoted (Redis epoch ms): its due
    /// time less the claim ahead and [`EARLY_WAKE_MS`] (unless the last
    /// promote came early for it), paced (see [`paced`]); [`NEVER`] when
    /// nothing is known to be due.
    fn promote_at(&self, p: usize) -> i64 {
        let due = self.next_due[p];
        if due == NEVER {
            return NEVER;
        }
        let lead = if self.came_early[p] { 0 } else { EARLY_WAKE_MS };
        paced(
            due.saturating_sub(self.ahead + lead),
            due,
            self.last_round,
            self.ahead,
        )
    }

    /// The partitions whose due set should be promoted at `now` (see
    /// [`Timetable::promote_at`]): a partition learnt of just after a round
    /// waits for the next one, unless its jobs would be late for it. A
    /// round that goes takes along every partition whose next job it can
    /// claim already (due within the claim ahead), so that partitions keep
    /// one rhythm, all of them in one batch a round, instead of each
    /// coming due a little after the others and waking Redis on its own. (A
    /// partition another daemon carries has no due time: never taken.)
    fn due_by(&self, now: i64) -> Vec<u16> {
        let horizon = now.saturating_add(self.ahead);
        let mut goes = false;
        let mut round = Vec::new();
        for p in 0..self.next_due.len() {
            let due = self.promote_at(p) <= now;
            goes |= due;
            if due || self.next_due[p] <= horizon {
                round.push(p as u16);
            }
        }
        if goes {
            round
        } else {
            Vec::new()
        }
    }

    /// The partitions with a lease deadline at or before `now`.
    fn leases_expired_by(&self, now: i64) -> Vec<u16> {
        (0..self.next_lease.len() as u16)
            .filter(|p| self.next_lease[*p as usize] <= now)
            .collect()
    }

    /// Sets partition `p`'s next due time (None: nothing due) and whether the
    /// promotion that found it came early for it.
    fn set_next_due(&mut self, p: u16, next: Option<i64>, early: bool) {
        self.next_due[p as usize] = next.unwrap_or(NEVER);
        self.came_early[p as usize] = early;
    }

    /// The soonest time (Redis epoch ms) the carrier has work: a partition
    /// to promote (see [`Timetable::promote_at`]) or a lease deadline;
    /// [`NEVER`] when nothing is known.
    fn earliest_wake(&self) -> i64 {
        let promote = (0..self.next_due.len())
            .map(|p| self.promote_at(p))
            .fold(NEVER, i64::min);
        self.next_lease.iter().copied().fold(promote, i64::min)
    }

    /// Notes that a round promoted at `now`.
    fn promoted_at(&mut self, now: i64) {
        self.last_round = now;
    }

    /// Forgets every known due time of a carried partition with timers, so
    /// that each due set is read again.
    fn reread_due(&mut self) {
        for p in 0..self.next_due.len() {
            if self.owned[p] && self.timers[p] {
                self.next_due[p] = 0;
            }
        }
    }
}

/// How one round of script calls over some partitions went.
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    /// A call failed (Redis unreachable or failing).
    failed: bool,
    /// A call handled a full batch: more may be waiting.
    full_batch: bool,
}

/// Calls `script` on every partition of `partitions` at once, then, in
/// partition order, hands each result to `record` (which says whether it was
/// a full batch) or counts and logs the failure with the message `failure`.
async fn call_each<T, Fut>(
    partitions: &[u16],
    script: impl Fn(u16) -> Fut,
    failure: &'static str,
    mut record: impl FnMut(u16, T) -> bool,
) -> Round
where
    Fut: Future<Output = StoreResult<T>>,
{
    let results = join_all(partitions.iter().map(|&p| script(p))).await;
    let mut round = Round::default();
    for (&p, result) in partitions.iter().zip(results) {
        match result {
            Ok(outcome) => round.full_batch |= record(p, outcome),
            Err(err) => {
                round.failed = true;
                metrics::counter!("hookq_redis_errors_total", "component" => "carrier")
                    .increment(1);
                tracing::warn!(partition = p, cause = %err, "{failure}");
            }
        }
    }
    round
}

/// The promotion and lease-recovery loop of one daemon.
pub struct Carrier {
    store: Store,
    signals: Arc<Signals>,
    clock: RedisClock,
    /// Which partitions this daemon carries.
    fleet: Arc<Fleet>,
    /// How often an empty or far-off in-flight set is re-read: no lease
    /// granted after a check can expire sooner than this after it.
    lease_recheck: Duration,
}

impl Carrier {
    /// A carrier over `store`; `lease_recheck` should not exceed the shortest
    /// lease (the lease margin does not).
    pub fn new(
        store: Store,
        signals: Arc<Signals>,
        clock: RedisClock,
        fleet: Arc<Fleet>,
        lease_recheck: Duration,
    ) -> Self {
        Carrier {
            store,
            signals,
            clock,
            fleet,
            lease_recheck,
        }
    }

    /// Runs until `token` is cancelled.
    pub async fn run(self, token: CancellationToken) {
        let keys = self.store.keys();
        let mut times = Timetable::new(
            keys.partitions(),
            keys.timer_partitions(),
            self.store.claim_ahead_ms(),
        );
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(1600));
        loop {
            self.read_fleet_and_hints(&mut times);
            let now = self.clock.now_ms();
            let due_now = times.due_by(now);
            if !due_now.is_empty() {
                times.promoted_at(now);
            }
            let leases_now = times.leases_expired_by(now);
            // The claims and promotions this round sets off go to Redis
            // as one batch (see `store::batcher`).
            self.store.expect_calls(due_now.len());
            let to_promote = self.hand_over_promotions(&mut times, &due_now);
            if !due_now.is_empty() {
                // The outcomes gathered meanwhile go with this round's claims.
                self.signals.round.notify_waiters();
            }
            let promoted = self.promote(&mut times, &to_promote).await;
            let reclaimed = self.reclaim(&mut times, &leases_now).await;

            if promoted.failed || reclaimed.failed {
                // Redis is unreachable or failing: back off, then try again
                // (the due times and deadlines known so far are kept).
                tokio::select! {
                    biased;
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(backoff.step()) => {}
                }
                continue;
            }
            backoff.reset();
            if promoted.full_batch || reclaimed.full_batch {
                // A full batch: more may be due. Let workers run, then continue.
                tokio::task::yield_now().await;
                if token.is_cancelled() {
                    return;
                }
                continue;
            }
            if self.sleep_until_work(&mut times, &token).await.is_break() {
                return;
            }
        }
    }

    /// Brings `times` up to date with the partitions the fleet deals this
    /// daemon and the due-time hints the signals carry.
    /// (A hint for a partition without timers of its own is one for the
    /// partition whose timers it uses.)
    fn read_fleet_and_hints(&self, times: &mut Timetable) {
        let keys = self.store.keys();
        for p in 0..keys.partitions() {
            times.set_owned(p, self.fleet.owns(p));
            let early = self.signals.take_came_early(p);
            if let Some(hint) = self.signals.take_due_hint(p) {
                times.take_hint(keys.timer_partition(p), hint, early);
            }
        }
    }

    /// Hands the promotion of each due partition whose claim loop waits with
    /// room to that loop (one call promotes and claims, and the loop reports
    /// the next due time back as a hint); returns the partitions left to
    /// promote here.
    fn hand_over_promotions(&self, times: &mut Timetable, due_now: &[u16]) -> Vec<u16> {
        let mut to_promote = Vec::with_capacity(due_now.len());
        for &p in due_now {
            if self.signals.hand_promotion(p) {
                times.set_next_due(p, None, false);
            } else {
                to_promote.push(p);
            }
        }
        to_promote
    }

    /// Promotes a batch of due jobs on each of `partitions`, wakes their claim
    /// loops and records their next due times.
    async fn promote(&self, times: &mut Timetable, partitions: &[u16]) -> Round {
        let store = &self.store;
        let batch = carrier_batch(store.keys());
        let promote = |p| store.promote(p, batch);
        let mut started = Vec::new();
        let round = call_each(partitions, promote, "promotion failed", |p, promotion| {
            self.clock.observe(promotion.now);
            if promotion.started {
                // A tenant's jobs the busy claim loop has not seen: claim
                // them now, without waiting for a chunk of room.
                self.signals.list_started(p);
            } else if promotion.moved > 0 && promotion.started_in.is_empty() {
                self.signals.ready(p);
            }
            // (From shared timers, other partitions' lists too.)
            if !promotion.started_in.is_empty() {
                started.push((p, promotion.started_in.clone()));
            }
            if promotion.moved > 0 {
                metrics::counter!("hookq_promoted_total").increment(promotion.moved as u64);
            }
            let (next, early) = after_promotion(&promotion);
            times.set_next_due(p, next, early);
            self.signals.set_backlog(p, promotion.more_due());
            promotion.more_due()
        })
        .await;
        for (p, started_in) in started {
            wake_started(&self.store, &self.signals, &self.fleet, p, &started_in).await;
        }
        round
    }

    /// Takes back a batch of expired leases on each of `partitions`, wakes
    /// their claim loops for the requeued jobs and records when to look again.
    async fn reclaim(&self, times: &mut Timetable, partitions: &[u16]) -> Round {
        let store = &self.store;
        let reclaim = |p| store.reclaim(p, RECLAIM_BATCH);
        call_each(
            partitions,
            reclaim,
            "lease recovery failed",
            |p, reclaim| {
                let taken_back = reclaim.requeued + reclaim.dead;
                if reclaim.requeued > 0 {
                    self.signals.ready(p);
                }
                if taken_back > 0 {
                    tracing::warn!(
                        partition = p,
                        requeued = reclaim.requeued,
                        dead_lettered = reclaim.dead,
                        "took back attempts whose lease expired"
                    );
                    metrics::counter!("hookq_leases_expired_total").increment(taken_back as u64);
                }
                let recheck = reclaim.now + self.lease_recheck.as_millis() as i64;
                let full_batch = taken_back == RECLAIM_BATCH;
                times.next_lease[p as usize] = if full_batch {
                    0
                } else {
                    reclaim.next_deadline.unwrap_or(NEVER).min(recheck)
                };
                // (Jobs of expired round leases, now expired leases there.)
                for &q in &reclaim.materialized_in {
                    if let Some(next) = times.next_lease.get_mut(q as usize) {
                        *next = 0;
                    }
                }
                full_batch || !reclaim.materialized_in.is_empty()
            },
        )
        .await
    }

    /// Sleeps until the earliest known due time or lease deadline (at most
    /// [`MAX_SLEEP`], after which every due set is read again) or a wakeup;
    /// breaks when `token` is cancelled.
    async fn sleep_until_work(
        &self,
        times: &mut Timetable,
        token: &CancellationToken,
    ) -> ControlFlow<()> {
        let earliest = times.earliest_wake();
        let max_wake = tokio::time::Instant::now() + MAX_SLEEP;
        let wake_at = if earliest == NEVER {
            max_wake
        } else {
            tokio::time::Instant::from_std(self.clock.instant_at(earliest)).min(max_wake)
        };
        tokio::select! {
            biased;
            _ = token.cancelled() => return ControlFlow::Break(()),
            _ = self.signals.carrier.notified() => {}
            _ = tokio::time::sleep_until(wake_at) => {
                if wake_at == max_wake {
                    times.reread_due();
                }
            }
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shared timers serve every partition, so a promotion of them moves a
    /// batch for each; a cluster partition's own timers move one batch.
    #[test]
    fn a_promotion_of_shared_timers_moves_a_batch_per_partition() {
        use crate::store::Keys;
        assert_eq!(carrier_batch(&Keys::new("hq", 16)), 16 * PROMOTE_BATCH);
        assert_eq!(carrier_batch(&Keys::new("hq", 1)), PROMOTE_BATCH);
        assert_eq!(carrier_batch(&Keys::in_cluster("hq", 16)), PROMOTE_BATCH);
    }

    /// A partition learnt of just after a round (its due time reported by
    /// a claim of that round) waits for the next round, unless waiting
    /// would leave its jobs less than a tenth of the claim ahead; the
    /// wake time agrees with the partitions due.
    #[test]
    fn a_partition_learnt_after_a_round_waits_for_the_next_unless_late() {
        let mut times = Timetable::new(3, 0..3, 50);
        for p in 0..3 {
            times.set_owned(p, true);
            times.set_next_due(p, None, false);
        }
        // (No lease known to expire.)
        times.next_lease = vec![NEVER; 3];
        times.promoted_at(1_000);
        // Due 1,051: within the claim ahead of 1,001, but paced to the
        // next round at 1,035 (the grid: multiples of 45 ms).
        times.set_next_due(1, Some(1_051), false);
        assert!(times.due_by(1_001).is_empty(), "no round of its own");
        assert_eq!(times.earliest_wake(), 1_035);
        assert_eq!(times.due_by(1_035), [1]);
        // Due 1,012: promoted at 1,007 at the latest (a tenth of ahead
        // before it), and that round takes partition 1 along (its job is
        // due within the claim ahead of 1,007).
        times.set_next_due(2, Some(1_012), false);
        assert_eq!(times.earliest_wake(), 1_007);
        assert!(times.due_by(1_006).is_empty());
        assert_eq!(times.due_by(1_007), [1, 2]);
        assert_eq!(times.due_by(1_035), [1, 2]);
    }

    /// A round takes along the partitions whose next jobs it can claim
    /// (due within the claim ahead of it), and only those: partitions due
    /// a little after one another are claimed in one round, not a round
    /// each.
    #[test]
    fn a_round_takes_along_the_partitions_it_can_claim_already() {
        let mut times = Timetable::new(4, 0..4, 50);
        for p in 0..4 {
            times.set_owned(p, true);
        }
        times.next_lease = vec![NEVER; 4];
        times.promoted_at(1_000);
        // Partition 0 must go at 1,007 (a tenth of ahead before its job);
        // 1 and 2 are due within the claim ahead of 1,007 and go with it;
        // 3 is not, and waits for the paced round at 1,035.
        times.set_next_due(0, Some(1_012), false);
        times.set_next_due(1, Some(1_030), false);
        times.set_next_due(2, Some(1_057), false);
        times.set_next_due(3, Some(1_058), false);
        assert!(times.due_by(1_006).is_empty());
        assert_eq!(times.due_by(1_007), [0, 1, 2]);
        // A partition another daemon carries is never taken along.
        times.set_owned(1, false);
        assert_eq!(times.due_by(1_007), [0, 2]);
    }

    /// Two daemons whose last rounds came at different moments promote
    /// their next due partitions at the same point of the shared grid
    /// (every 45 ms for a claim ahead of 50 ms), so that their calls reach
    /// Redis together; each job still goes at least 5 ms before its time.
    #[test]
    fn daemons_meet_on_the_grid() {
        let daemon = |last_round: i64, due: i64| {
            let mut times = Timetable::new(1, 0..1, 50);
            times.set_owned(0, true);
            times.next_lease = vec![NEVER];
            times.promoted_at(last_round);
            times.set_next_due(0, Some(due), false);
            times.earliest_wake()
        };
        assert_eq!(daemon(1_000, 1_100), 1_080);
        assert_eq!(daemon(1_013, 1_095), 1_080);
        assert_eq!(daemon(1_027, 1_121), 1_080);
        // A job due just after a point's reach goes at the next point, 5
        // ms before it at the latest.
        assert_eq!(daemon(1_000, 1_131), 1_125);
        assert_eq!(daemon(1_000, 1_130), 1_080);
        // Not twice at the point of the last round.
        assert_eq!(daemon(1_080, 1_131), 1_125);
        assert_eq!(daemon(1_080, 1_125), 1_120);
    }
}
