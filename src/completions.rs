//! Batched recording of successful attempts.
//!
//! A busy daemon finishes thousands of attempts a second. Instead of one
//! `complete_jobs` call per attempt, attempt tasks hand their outcome to a
//! single flusher task and wait for the answer; the flusher takes everything
//! queued so far, groups it by partition and records it with one script
//! call: on a single Redis one call for every partition's jobs (up to
//! [`MAX_TOGETHER`] jobs a call), in a cluster one call a partition (they
//! go out together on the multiplexed connection). A batch gathers after
//! its first job for up to [`WINDOW`] (none when `delivery.claim_ahead` is
//! 0: each batch goes at once). After four fifths of it ([`rides_after`]),
//! it goes in the same wake as the next claims: on a single Redis it rides
//! with the next batch of calls (see `store::batcher`), elsewhere with the
//! carrier's next round; or it goes sooner when it is full ([`GATHER_MAX`]
//! jobs, [`MAX_BATCH`] per partition's call at most), so that at a steady
//! load each partition's outcomes reach Redis in one call per window rather
//! than one call per job; under load, jobs also queue up while the previous
//! batch is in flight.
//!
//! An attempt task keeps its lease until its outcome is recorded; its
//! worker permit and its room in the claim budget are free meanwhile. A
//! job's state reads `inflight` until then (up to [`WINDOW`] after the
//! answer). A daemon killed within the window leaves the job to its lease:
//! delivered again, never lost.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::store::{Claimed, Delivery, Lease, Outcome, Store, StoreError, StoreResult};
use crate::wake::Signals;

/// Longest a delivery's outcome waits for its batch (by default; see
/// [`window_for`]). At 200 jobs/s an outcome call then carries ~5 jobs
/// (3.1 at 250 ms): 7 % fewer Redis instructions a job (docs/performance.md).
const WINDOW: Duration = Duration::from_millis(400);

/// The outcome window of a daemon with `delivery.claim_ahead` and
/// `delivery.lease_margin`: none without claiming ahead (each outcome goes
/// at once), and at most half the lease margin, so that a lease outlives
/// its attempt's wait for the batch.
pub(crate) fn window_for(claim_ahead: Duration, lease_margin: Duration) -> Duration {
    if claim_ahead.is_zero() {
        Duration::ZERO
    } else {
        WINDOW.min(lease_margin / 2)
    }
}

/// Most jobs recorded by one script call (bounds the script's run time).
const MAX_BATCH: usize = 256;

/// Most jobs one call records when it holds several partitions' (a
/// single Redis): its arguments (six a job, six more a partition) then fit
/// a batch with riders (`store::batcher`'s 1,024) with up to 16 partitions,
/// so a steady load's window of outcomes rides with a claim round as one
/// call (with more partitions a full call goes alone at its ride's end).
const MAX_TOGETHER: usize = 150;

/// Most jobs one batch gathers, over every partition: a batch is recorded
/// with one call per partition (on a single Redis, whole partitions packed
/// into calls, [`calls_of`]), so a batch cut at one call's [`MAX_BATCH`]
/// would send a sixteenth of that per partition at 2,000 jobs/s (measured
/// with a 250 ms window: 16 jobs a call against 32 with this, and 6 % fewer
/// Redis instructions a job; see docs/performance.md).
const GATHER_MAX: usize = MAX_BATCH * 4;

/// How long after its first job a batch starts to go with the next claims:
/// four fifths of its window (measured with a 250 ms window, three fifths
/// gave 2.6 jobs a call at 200 jobs/s against 3.1, and 4 % more Redis
/// instructions a job).
fn rides_after(window: Duration) -> Duration {
    window * 4 / 5
}

/// Whether a batch of `gathered` jobs, `waited` after its first job, keeps
/// gathering alone (it neither is full nor may go with a claim round yet).
fn gathers_alone(gathered: usize, waited: Duration, window: Duration) -> bool {
    gathered < GATHER_MAX && waited < rides_after(window)
}

struct Pending {
    partition: u16,
    id: String,
    attempt: u32,
    lease: Lease,
    delivery: Delivery,
    reply: oneshot::Sender<StoreResult<bool>>,
}

/// The handle attempt tasks record successes through.
#[derive(Clone)]
pub(crate) struct Completions {
    queue: mpsc::UnboundedSender<Pending>,
}

impl Completions {
    /// Starts the flusher task; it ends once every handle is dropped and the
    /// queue is drained.
    /// A batch gathers for up to `window` after its first job, or until
    /// `round` is notified (a carrier round claims: the batch goes with it).
    pub(crate) fn start(store: Store, window: Duration, round: Arc<Signals>) -> Completions {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(flush(store, rx, window, round));
        Completions { queue }
    }

    /// Records a 2xx for `job`; waits until Redis has answered. True when
    /// recorded, false when the lease was stale; a failed call gives every
    /// job of its batch the same error ([`StoreError::Shared`]). `again`
    /// when this outcome was sent before (see [`Lease::again`]).
    pub(crate) async fn complete(
        &self,
        job: &Claimed,
        delivery: Delivery,
        again: bool,
    ) -> StoreResult<bool> {
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            partition: job.partition,
            id: job.id.clone(),
            attempt: job.attempt,
            lease: Lease {
                again,
                ..job.lease.clone()
            },
            delivery,
            reply,
        };
        if self.queue.send(pending).is_err() {
            return Err(StoreError::reply(
                "complete_jobs",
                "the completion flusher has stopped",
            ));
        }
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::reply(
                "complete_jobs",
                "the completion flusher dropped the job",
            ))
        })
    }
}

async fn flush(
    store: Store,
    mut rx: mpsc::UnboundedReceiver<Pending>,
    window: Duration,
    signals: Arc<Signals>,
) {
    let mut batch = Vec::new();
    // On a batching store, outcomes ride with the next batch (see
    // `store::batcher`) instead of waiting for a round here.
    let rides = store.batches_calls();
    while rx.recv_many(&mut batch, GATHER_MAX).await > 0 {
        let first = tokio::time::Instant::now();
        // From `rounds_from` on, the carrier's next round takes the batch
        // along; at `until` it goes alone.
        let (rounds_from, until) = (first + rides_after(window), first + window);
        while !window.is_zero() && batch.len() < GATHER_MAX {
            let room = GATHER_MAX - batch.len();
            let with_rounds = !gathers_alone(batch.len(), first.elapsed(), window);
            if with_rounds && rides {
                break;
            }
            let next = if with_rounds { until } else { rounds_from };
            tokio::select! {
                n = rx.recv_many(&mut batch, room) => {
                    if n == 0 {
                        break;
                    }
                }
                _ = tokio::time::sleep_until(next) => {
                    if with_rounds {
                        break;
                    }
                }
                _ = signals.round.notified(), if with_rounds => break,
            }
        }
        // A full batch goes at once.
        let ride_until = (rides && !window.is_zero() && batch.len() < GATHER_MAX).then_some(until);
        let mut by_partition: BTreeMap<u16, Vec<Pending>> = BTreeMap::new();
        for pending in batch.drain(..) {
            by_partition
                .entry(pending.partition)
                .or_default()
                .push(pending);
        }
        let together = store.completes_partitions_together();
        let calls: Vec<_> = calls_of(by_partition, together)
            .into_iter()
            .map(|call| record(&store, call, ride_until))
            .collect();
        futures_util::future::join_all(calls).await;
    }
}

/// One `complete_jobs` call's jobs, by partition.
type Call<T> = Vec<(u16, Vec<T>)>;

/// The calls that record a batch's jobs (`by_partition`): one per
/// partition, or, when one call may hold several partitions (`together`,
/// a single Redis), whole partitions packed in order into calls of up to
/// [`MAX_TOGETHER`] jobs. A partition's jobs are not split between calls
/// unless they are more than a call holds ([`MAX_BATCH`] a call then): each
/// partition a call holds costs it a few commands of its own (fencing,
/// summaries' bucket, counters), so a burst's batch, ~64 jobs a partition,
/// goes as two partitions a call rather than every partition in every call.
fn calls_of<T>(by_partition: BTreeMap<u16, Vec<T>>, together: bool) -> Vec<Call<T>> {
    let mut calls: Vec<Call<T>> = Vec::new();
    let mut room = 0;
    for (p, mut jobs) in by_partition {
        if !together || jobs.len() > MAX_TOGETHER {
            while jobs.len() > MAX_BATCH {
                let rest = jobs.split_off(MAX_BATCH);
                calls.push(vec![(p, jobs)]);
                jobs = rest;
            }
            calls.push(vec![(p, jobs)]);
            room = 0;
            continue;
        }
        match calls.last_mut() {
            Some(call) if jobs.len() <= room => {
                room -= jobs.len();
                call.push((p, jobs));
            }
            _ => {
                room = MAX_TOGETHER - jobs.len();
                calls.push(vec![(p, jobs)]);
            }
        }
    }
    calls
}

async fn record(store: &Store, call: Call<Pending>, ride_until: Option<tokio::time::Instant>) {
    let items: Vec<Vec<Outcome<'_>>> = call
        .iter()
        .map(|(_, jobs)| {
            jobs.iter()
                .map(|j| (j.id.as_str(), j.attempt, &j.lease, &j.delivery))
                .collect()
        })
        .collect();
    let groups: Vec<(u16, &[Outcome<'_>])> = call
        .iter()
        .zip(&items)
        .map(|((p, _), outcomes)| (*p, outcomes.as_slice()))
        .collect();
    let answer = store.complete_partitions(&groups, ride_until).await;
    let jobs = call.into_iter().flat_map(|(_, jobs)| jobs);
    match answer {
        Ok(done) => {
            for (job, recorded) in jobs.zip(done) {
                let _ = job.reply.send(Ok(recorded));
            }
        }
        Err(err) => {
            let err = Arc::new(err);
            for job in jobs {
                let _ = job.reply.send(Err(StoreError::Shared(err.clone())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_redis_records_every_partitions_jobs_in_as_few_calls_as_fit() {
        let batch = |sizes: &[(u16, usize)]| -> BTreeMap<u16, Vec<usize>> {
            sizes.iter().map(|&(p, n)| (p, (0..n).collect())).collect()
        };
        let shape = |calls: Vec<Call<usize>>| -> Vec<Vec<(u16, usize)>> {
            calls
                .into_iter()
                .map(|call| call.into_iter().map(|(p, jobs)| (p, jobs.len())).collect())
                .collect()
        };
        // A steady load's window: one call for every partition.
        let window = batch(&[(0, 5), (3, 4), (15, 6)]);
        assert_eq!(
            shape(calls_of(window.clone(), true)),
            vec![vec![(0, 5), (3, 4), (15, 6)]]
        );
        // A cluster: one call a partition.
        assert_eq!(
            shape(calls_of(window, false)),
            vec![vec![(0, 5)], vec![(3, 4)], vec![(15, 6)]]
        );
        // A burst's batch: whole partitions, as many as a call holds.
        let burst: Vec<(u16, usize)> = (0..16).map(|p| (p, 64)).collect();
        let calls = shape(calls_of(batch(&burst), true));
        assert_eq!(calls.len(), 8);
        assert!(calls.iter().all(|c| c.len() == 2), "{calls:?}");
        assert_eq!(calls[7], vec![(14, 64), (15, 64)]);
        // A partition with more than a call holds goes alone, cut at
        // MAX_BATCH, and the next ones start a call of their own.
        let big = calls_of(batch(&[(1, 10), (2, MAX_BATCH + 1), (3, 5)]), true);
        assert_eq!(
            shape(big),
            vec![
                vec![(1, 10)],
                vec![(2, MAX_BATCH)],
                vec![(2, 1)],
                vec![(3, 5)]
            ]
        );
        let split = calls_of(batch(&[(2, MAX_BATCH + 1)]), true);
        assert_eq!(split[1][0].1, vec![MAX_BATCH], "in order");
        assert_eq!(
            shape(calls_of(batch(&[(4, MAX_BATCH + 1)]), false)),
            vec![vec![(4, MAX_BATCH)], vec![(4, 1)]]
        );
    }

    #[test]
    fn a_batch_fills_every_partitions_call_before_it_is_full() {
        let window = Duration::from_millis(250);
        // More than one call's worth, early: 16 partitions would each get
        // a sixteenth of it, so the batch keeps gathering.
        assert!(gathers_alone(
            MAX_BATCH + 44,
            Duration::from_millis(100),
            window
        ));
        assert!(!gathers_alone(
            GATHER_MAX,
            Duration::from_millis(100),
            window
        ));
    }

    #[test]
    fn a_batch_rides_with_the_claims_only_late_in_its_window() {
        let window = Duration::from_millis(250);
        assert!(gathers_alone(30, Duration::from_millis(190), window));
        assert!(!gathers_alone(30, Duration::from_millis(200), window));
    }

    #[test]
    fn the_window_is_at_most_half_the_lease_margin() {
        let ahead = Duration::from_millis(50);
        assert_eq!(window_for(ahead, Duration::from_secs(20)), WINDOW);
        let short = window_for(ahead, Duration::from_millis(100));
        assert_eq!(short, Duration::from_millis(50));
        assert_eq!(
            window_for(Duration::ZERO, Duration::from_secs(20)),
            Duration::ZERO
        );
    }
}
