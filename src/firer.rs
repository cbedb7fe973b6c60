//! The firer: fires the schedules of the partitions dealt to this daemon
//! (SPEC §12). Like the carrier for jobs, it does not poll: it sleeps until
//! the earliest next fire time of its partitions and is woken early when a
//! schedule is created, changed or resumed with an earlier time (the
//! partition's wake message `f<p>:<ms>`), or when the fleet deals it a
//! partition. Each firing is one script per partition and batch
//! (`Store::fire_due`); two daemons firing one partition at once (while
//! the deal changes) cannot double a fire time: the script advances each
//! schedule only from the time it was read at.

use crate::backoff::Backoff;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::RedisClock;
use crate::fleet::Fleet;
use crate::store::schedules::FireRound;
use crate::store::Store;
use crate::wake::Signals;

/// Fires due schedules.
pub(crate) struct Firer {
    store: Store,
    signals: Arc<Signals>,
    clock: RedisClock,
    fleet: Arc<Fleet>,
}

impl Firer {
    /// A firer over `store` for the partitions `fleet` deals this daemon.
    pub(crate) fn new(
        store: Store,
        signals: Arc<Signals>,
        clock: RedisClock,
        fleet: Arc<Fleet>,
    ) -> Self {
        Firer {
            store,
            signals,
            clock,
            fleet,
        }
    }

    /// Runs until `token` is cancelled.
    pub(crate) async fn run(self, token: CancellationToken) {
        let mut table = Timetable::new(self.store.keys().partitions());
        let mut deal = self.fleet.watch();
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let now = self.clock.now_ms();
            table.take_deal_and_hints(&self.fleet, &self.signals);
            if self.fire_due_partitions(&mut table, now, &backoff).await {
                backoff.step();
            } else {
                backoff.reset();
            }
            let earliest = table.earliest();
            // Nothing to fire: sleep until a wake message (a new, changed
            // or resumed schedule; every partition after a reconnect) or a
            // new deal.
            let wait = (earliest != i64::MAX)
                .then(|| Duration::from_millis((earliest - self.clock.now_ms()).max(0) as u64));
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(wait.unwrap_or_default()), if wait.is_some() => {}
                _ = self.signals.firer.notified() => {}
                Ok(()) = deal.changed() => {}
            }
        }
    }

    /// Fires every owned partition due by `now`, in order, and sets when
    /// each is read next; a partition Redis fails on is read again after
    /// `backoff`'s current wait. Returns whether any partition failed.
    async fn fire_due_partitions(
        &self,
        table: &mut Timetable,
        now: i64,
        backoff: &Backoff,
    ) -> bool {
        let mut failed = false;
        for p in 0..table.next.len() as u16 {
            let i = p as usize;
            if !table.is_due(i, now) {
                continue;
            }
            match self.store.fire_due(p).await {
                Ok(round) => {
                    record_round(&round);
                    // A time not yet due by Redis's clock (this
                    // daemon's estimate of it ran ahead: the clocks
                    // drifted since it was learned) is read again a
                    // millisecond later, not at once.
                    let floor = if round.fired.is_empty() { now + 1 } else { now };
                    table.next[i] = round.next.unwrap_or(i64::MAX).max(floor);
                }
                Err(err) => {
                    failed = true;
                    metrics::counter!("hookq_redis_errors_total", "component" => "firer")
                        .increment(1);
                    tracing::warn!(cause = %err, partition = p, "cannot fire schedules yet");
                    table.next[i] = now + backoff.current().as_millis() as i64;
                }
            }
        }
        failed
    }
}

/// Records a firing round's metrics: each firing's lateness, and the
/// counts of fire times fired and skipped.
fn record_round(round: &FireRound) {
    for lateness_ms in &round.fired {
        metrics::histogram!("hookq_schedule_firing_lateness_seconds")
            .record(*lateness_ms as f64 / 1000.0);
    }
    metrics::counter!("hookq_schedule_firings_total", "outcome" => "fired")
        .increment(round.fired.len() as u64);
    metrics::counter!("hookq_schedule_firings_total", "outcome" => "skipped")
        .increment(round.skipped as u64);
}

/// When each partition fires next, and which partitions this daemon owns.
struct Timetable {
    /// Per partition: when to fire next (0: read now; i64::MAX: not ours).
    next: Vec<i64>,
    /// Per partition: whether the fleet dealt it to this daemon.
    owned: Vec<bool>,
}

impl Timetable {
    /// A timetable of `partitions` partitions, none owned yet.
    fn new(partitions: u16) -> Self {
        Timetable {
            next: vec![0i64; partitions as usize],
            owned: vec![false; partitions as usize],
        }
    }

    /// Takes in the current deal and the pending wake hints: a partition
    /// newly dealt is read now, one dealt away is not read, and a hint
    /// brings an owned partition's fire time forward.
    fn take_deal_and_hints(&mut self, fleet: &Fleet, signals: &Signals) {
        for p in 0..self.next.len() as u16 {
            let i = p as usize;
            let owns = fleet.owns(p);
            if owns && !self.owned[i] {
                self.next[i] = 0;
            } else if !owns {
                self.next[i] = i64::MAX;
            }
            self.owned[i] = owns;
            if let Some(hint) = signals.take_fire_hint(p) {
                if owns {
                    self.next[i] = self.next[i].min(hint);
                }
            }
        }
    }

    /// Whether partition `i` is owned and due by `now`.
    fn is_due(&self, i: usize, now: i64) -> bool {
        self.owned[i] && self.next[i] <= now
    }

    /// The earliest fire time of the owned partitions (i64::MAX: none).
    fn earliest(&self) -> i64 {
        self.next
            .iter()
            .zip(&self.owned)
            .filter(|(_, o)| **o)
            .map(|(n, _)| *n)
            .min()
            .unwrap_or(i64::MAX)
    }
}
