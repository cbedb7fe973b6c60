//! Jobs claimed ahead of their due time (`delivery.claim_ahead`, SPEC §16),
//! held in the daemon until it comes.
//!
//! A claim takes the jobs due within the next `claim_ahead` (at most 50 ms)
//! along with those due already, so that spread-out jobs reach Redis in
//! batches rather than one call each. Each waits here, under its lease and
//! holding its permit of the claim budget, until the daemon's estimate of
//! Redis's clock reads its due time (the estimate never runs ahead of
//! Redis's own, see `clock`: never early). A cancel
//! message drops a held job; a stop gives the held jobs back to Redis, each
//! still due at its time.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::hosts::lanes::Entry;

/// Held jobs by due time (then id, for a total order).
#[derive(Default)]
pub(crate) struct Holding {
    jobs: Mutex<BTreeMap<(i64, String), Entry>>,
    /// Signalled when a job is held: the holder looks at the earliest again.
    pub(crate) changed: Notify,
}

impl Holding {
    fn jobs(&self) -> MutexGuard<'_, BTreeMap<(i64, String), Entry>> {
        match self.jobs.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Holds `entry` until its due time.
    pub(crate) fn hold(&self, entry: Entry) {
        let key = (entry.job.due, entry.job.id.clone());
        self.jobs().insert(key, entry);
        self.changed.notify_one();
    }

    /// The earliest due time held, if any.
    pub(crate) fn earliest(&self) -> Option<i64> {
        self.jobs().keys().next().map(|(due, _)| *due)
    }

    /// Takes out the jobs that [`may_start`] at `now` (the estimate of
    /// Redis's clock), earliest first.
    pub(crate) fn take_due(&self, now: i64) -> Vec<Entry> {
        let mut jobs = self.jobs();
        let mut due = Vec::new();
        while let Some(first) = jobs.first_entry() {
            if !may_start(first.key().0, now) {
                break;
            }
            due.push(first.remove());
        }
        due
    }

    /// Drops the held jobs whose id is in `ids` (cancelled); how many.
    pub(crate) fn remove(&self, ids: &HashSet<String>) -> usize {
        let mut jobs = self.jobs();
        let before = jobs.len();
        jobs.retain(|(_, id), _| !ids.contains(id));
        before - jobs.len()
    }

    /// Takes out every held job.
    pub(crate) fn drain(&self) -> Vec<Entry> {
        std::mem::take(&mut *self.jobs()).into_values().collect()
    }
}

/// Whether a job due at `due` may start when the estimate of Redis's clock
/// reads `now` (see the module doc).
pub(crate) fn may_start(due: i64, now: i64) -> bool {
    due <= now
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job starts once the estimate reads its due millisecond.
    #[test]
    fn a_job_starts_at_its_due_millisecond() {
        assert!(!may_start(1_000, 999));
        assert!(may_start(1_000, 1_000));
        assert!(may_start(1_000, 1_001));
    }
}
