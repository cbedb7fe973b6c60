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
use crate::store::Store;
use crate::wake::Signals;

/// Fires due schedules.
pub struct Firer {
    store: Store,
    signals: Arc<Signals>,
    clock: RedisClock,
    fleet: Arc<Fleet>,
}

impl Firer {
    /// A firer over `store` for the partitions `fleet` deals this daemon.
    pub fn new(store: Store, signals: Arc<Signals>, clock: RedisClock, fleet: Arc<Fleet>) -> Self {
        Firer {
            store,
            signals,
            clock,
            fleet,
        }
    }

    /// Runs until `token` is cancelled.
    pub async fn run(self, token: CancellationToken) {
        let partitions = self.store.keys().partitions();
        // Per partition: when to fire next (0: read now; i64::MAX: not ours).
        let mut next = vec![0i64; partitions as usize];
        let mut owned = vec![false; partitions as usize];
        let mut deal = self.fleet.watch();
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let now = self.clock.now_ms();
            for p in 0..partitions {
                let i = p as usize;
                let owns = self.fleet.owns(p);
                if owns && !owned[i] {
                    next[i] = 0;
                } else if !owns {
                    next[i] = i64::MAX;
                }
                owned[i] = owns;
                if let Some(hint) = self.signals.take_fire_hint(p) {
                    if owns {
                        next[i] = next[i].min(hint);
                    }
                }
            }
            let mut failed = false;
            for p in 0..partitions {
                let i = p as usize;
                if !owned[i] || next[i] > now {
                    continue;
                }
                match self.store.fire_due(p).await {
                    Ok(round) => {
                        for (_, lateness_ms) in &round.fired {
                            metrics::histogram!("hookq_schedule_firing_lateness_seconds")
                                .record(*lateness_ms as f64 / 1000.0);
                        }
                        metrics::counter!("hookq_schedule_firings_total", "outcome" => "fired")
                            .increment(round.fired.len() as u64);
                        metrics::counter!("hookq_schedule_firings_total", "outcome" => "skipped")
                            .increment(round.skipped as u64);
                        // A time not yet due by Redis's clock (this
                        // daemon's estimate of it ran ahead) is read again
                        // a millisecond later, not at once.
                        let floor = if round.fired.is_empty() { now + 1 } else { now };
                        next[i] = round.next.unwrap_or(i64::MAX).max(floor);
                    }
                    Err(err) => {
                        failed = true;
                        metrics::counter!("hookq_redis_errors_total", "component" => "firer")
                            .increment(1);
                        tracing::warn!(cause = %err, partition = p, "cannot fire schedules yet");
                        next[i] = now + backoff.current().as_millis() as i64;
                    }
                }
            }
            if failed {
                backoff.step();
            } else {
                backoff.reset();
            }
            let earliest = next
                .iter()
                .zip(&owned)
                .filter(|(_, o)| **o)
                .map(|(n, _)| *n)
                .min()
                .unwrap_or(i64::MAX);
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
}
