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
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio_util::sync::CancellationToken;

use crate::clock::RedisClock;
use crate::fleet::Fleet;
use crate::store::{Promotion, Store};
use crate::wake::Signals;

/// Jobs moved per promotion script call.
pub const PROMOTE_BATCH: usize = 256;
/// Expired leases taken back per reclaim script call.
pub const RECLAIM_BATCH: usize = 256;
/// Longest sleep without re-reading Redis: a safety net only, timing never
/// depends on it (wakeups and known due times do).
pub const MAX_SLEEP: Duration = Duration::from_secs(60);

/// How far ahead of a known due time (by the daemon's estimate of Redis's
/// clock) the carrier wakes and starts asking Redis. Timers have millisecond
/// granularity and round up, and the estimate can be a millisecond off, so
/// waking exactly "at" the due time makes a job 1–2 ms late. Waking early
/// costs at most one promote call that finds nothing due yet (Redis's
/// `TIME` decides, so nothing is ever promoted early): after one, the
/// carrier waits for the due time itself.
pub const EARLY_WAKE_MS: i64 = 1;

/// What a promotion left for the carrier: when work is next due (Redis's
/// now after a full batch: more may be due already; None: nothing), and
/// whether the promotion came early for that time (within
/// [`EARLY_WAKE_MS`]), so that the next one waits for the time itself.
pub fn after_promotion(promotion: &Promotion) -> (Option<i64>, bool) {
    let next = if promotion.moved == PROMOTE_BATCH {
        Some(promotion.now)
    } else {
        promotion.next_due
    };
    let early = next.is_some_and(|d| d > promotion.now && d - promotion.now <= EARLY_WAKE_MS);
    (next, early)
}

/// Sentinel for "nothing known to be due".
const NEVER: i64 = i64::MAX;

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
        let partitions = self.store.keys().partitions();
        let mut next_due = vec![0i64; partitions as usize];
        let mut next_lease = vec![0i64; partitions as usize];
        let mut owned = vec![false; partitions as usize];
        // Per partition: the last promote came early for `next_due` (so the
        // next one waits for the due time itself).
        let mut came_early = vec![false; partitions as usize];
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(1600));
        loop {
            for p in 0..partitions {
                let i = p as usize;
                let owns = self.fleet.owns(p);
                if owns && !owned[i] {
                    // Gained (or at start): read both sets afresh.
                    next_due[i] = 0;
                    next_lease[i] = 0;
                    came_early[i] = false;
                } else if !owns {
                    // Another daemon carries it.
                    next_due[i] = NEVER;
                    next_lease[i] = NEVER;
                }
                owned[i] = owns;
                let early = self.signals.take_came_early(p);
                if let Some(hint) = self.signals.take_due_hint(p) {
                    if owns && hint < next_due[i] {
                        next_due[i] = hint;
                        came_early[i] = early;
                    }
                }
            }
            let now = self.clock.now_ms();
            let due_now: Vec<u16> = (0..partitions)
                .filter(|p| {
                    let lead = if came_early[*p as usize] {
                        0
                    } else {
                        EARLY_WAKE_MS
                    };
                    next_due[*p as usize] <= now.saturating_add(lead)
                })
                .collect();
            let leases_now: Vec<u16> = (0..partitions)
                .filter(|p| next_lease[*p as usize] <= now)
                .collect();

            let mut again = false;
            let mut ok = true;
            // A partition whose claim loop waits with room gets its
            // promotion handed over: one call promotes and claims, and the
            // loop reports the next due time back as a hint.
            let mut to_promote = Vec::with_capacity(due_now.len());
            for &p in &due_now {
                if self.signals.hand_promotion(p) {
                    next_due[p as usize] = NEVER;
                    came_early[p as usize] = false;
                } else {
                    to_promote.push(p);
                }
            }
            let promotions = join_all(
                to_promote
                    .iter()
                    .map(|&p| self.store.promote(p, PROMOTE_BATCH)),
            )
            .await;
            for (&p, result) in to_promote.iter().zip(promotions) {
                match result {
                    Ok(promotion) => {
                        self.clock.observe(promotion.now);
                        if promotion.moved > 0 {
                            self.signals.ready(p);
                            metrics::counter!("hookq_promoted_total")
                                .increment(promotion.moved as u64);
                        }
                        again |= promotion.moved == PROMOTE_BATCH;
                        let (next, early) = after_promotion(&promotion);
                        next_due[p as usize] = next.unwrap_or(NEVER);
                        came_early[p as usize] = early;
                    }
                    Err(err) => {
                        ok = false;
                        metrics::counter!("hookq_redis_errors_total", "component" => "carrier")
                            .increment(1);
                        tracing::warn!(partition = p, cause = %err, "promotion failed");
                    }
                }
            }
            let reclaims = join_all(
                leases_now
                    .iter()
                    .map(|&p| self.store.reclaim(p, RECLAIM_BATCH)),
            )
            .await;
            for (&p, result) in leases_now.iter().zip(reclaims) {
                match result {
                    Ok(reclaim) => {
                        if reclaim.requeued > 0 {
                            self.signals.ready(p);
                        }
                        if reclaim.requeued + reclaim.dead > 0 {
                            tracing::warn!(
                                partition = p,
                                requeued = reclaim.requeued,
                                dead_lettered = reclaim.dead,
                                "took back attempts whose lease expired"
                            );
                            metrics::counter!("hookq_leases_expired_total")
                                .increment((reclaim.requeued + reclaim.dead) as u64);
                        }
                        let recheck = reclaim.now + self.lease_recheck.as_millis() as i64;
                        next_lease[p as usize] = if reclaim.requeued + reclaim.dead == RECLAIM_BATCH
                        {
                            again = true;
                            0
                        } else {
                            reclaim.next_deadline.unwrap_or(NEVER).min(recheck)
                        };
                    }
                    Err(err) => {
                        ok = false;
                        metrics::counter!("hookq_redis_errors_total", "component" => "carrier")
                            .increment(1);
                        tracing::warn!(partition = p, cause = %err, "lease recovery failed");
                    }
                }
            }

            if !ok {
                // Redis is unreachable or failing: back off, then re-read everything.
                tokio::select! {
                    biased;
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(backoff.step()) => {}
                }
                continue;
            }
            backoff.reset();
            if again {
                // A full batch: more may be due. Let workers run, then continue.
                tokio::task::yield_now().await;
                if token.is_cancelled() {
                    return;
                }
                continue;
            }

            let earliest = next_due
                .iter()
                .zip(&came_early)
                .map(|(&d, &early)| match d {
                    NEVER => NEVER,
                    d if early => d,
                    d => d - EARLY_WAKE_MS,
                })
                .chain(next_lease.iter().copied())
                .min()
                .unwrap_or(NEVER);
            let max_wake = tokio::time::Instant::now() + MAX_SLEEP;
            let wake_at = if earliest == NEVER {
                max_wake
            } else {
                tokio::time::Instant::from_std(self.clock.instant_at(earliest)).min(max_wake)
            };
            tokio::select! {
                biased;
                _ = token.cancelled() => return,
                _ = self.signals.carrier.notified() => {}
                _ = tokio::time::sleep_until(wake_at) => {
                    if wake_at == max_wake {
                        next_due.iter_mut().for_each(|d| *d = 0);
                    }
                }
            }
        }
    }
}
