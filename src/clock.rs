//! The daemon's estimate of Redis's clock.
//!
//! Redis's `TIME` is hookq's only clock: scripts decide what is due. The daemon
//! uses its own clock only to decide how long to sleep, converting Redis
//! epoch-ms into a local deadline with an offset learned from every script
//! reply that carries Redis's time. Skewed local clocks therefore cost at most
//! an extra round trip (waking early), never an early or double delivery.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Shared estimate of `redis_ms - local_ms`.
#[derive(Clone, Default)]
pub struct RedisClock {
    offset_ms: Arc<AtomicI64>,
}

fn local_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl RedisClock {
    /// A clock assuming no skew until the first observation.
    pub fn new() -> Self {
        RedisClock::default()
    }

    /// Records that Redis's clock read `redis_ms` just now.
    pub(crate) fn observe(&self, redis_ms: i64) {
        self.offset_ms
            .store(redis_ms - local_ms(), Ordering::Relaxed);
    }

    /// Estimated Redis time now, epoch ms.
    pub(crate) fn now_ms(&self) -> i64 {
        local_ms() + self.offset_ms.load(Ordering::Relaxed)
    }

    /// The local instant at which Redis's clock will read `redis_ms`.
    pub(crate) fn instant_at(&self, redis_ms: i64) -> Instant {
        // Capped at a day: callers sleep far less, and Instant + a huge
        // Duration would overflow.
        let ahead = redis_ms.saturating_sub(self.now_ms()).clamp(0, 86_400_000) as u64;
        Instant::now() + Duration::from_millis(ahead)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Every bound below is bracketed by readings taken around the call, not a
    // fixed tolerance, so a loaded machine that stalls between two lines
    // widens the bracket instead of failing the test.

    #[test]
    fn offset_follows_observations() {
        let clock = RedisClock::new();
        let before = local_ms();
        clock.observe(before + 60_000);
        let now = clock.now_ms();
        let after = local_ms();
        // observe() read the local clock at some t in [before, now's read]:
        // the estimate is Redis's 60 s ahead, never more, never less than
        // the time that passed in between.
        assert!(
            (before + 60_000..=after + 60_000).contains(&now),
            "Redis estimated at {now}, local clock read {before}..{after}"
        );
    }

    #[test]
    fn instant_at_waits_out_the_remaining_time() {
        let clock = RedisClock::new();
        clock.observe(local_ms() + 60_000);
        let start = Instant::now();
        let target = clock.now_ms() + 500;
        let at = clock.instant_at(target);
        let end = Instant::now();
        // At most 500 ms after the call; at least 500 ms after it started,
        // less what elapsed during it (and 2 ms of whole-ms rounding).
        assert!(
            at <= end + Duration::from_millis(500),
            "{:?} after the call",
            at - end
        );
        assert!(
            at + (end - start) + Duration::from_millis(2) >= start + Duration::from_millis(500),
            "{:?} after the start, {:?} spent in the call",
            at.saturating_duration_since(start),
            end - start
        );
        assert!(clock.instant_at(0) <= Instant::now(), "the past is now");
        let capped = clock.instant_at(clock.now_ms() + 10 * 86_400_000);
        assert!(
            capped <= Instant::now() + Duration::from_secs(86_400),
            "capped at a day"
        );
    }
}
