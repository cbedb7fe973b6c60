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
    pub fn observe(&self, redis_ms: i64) {
        self.offset_ms
            .store(redis_ms - local_ms(), Ordering::Relaxed);
    }

    /// Estimated Redis time now, epoch ms.
    pub fn now_ms(&self) -> i64 {
        local_ms() + self.offset_ms.load(Ordering::Relaxed)
    }

    /// The local instant at which Redis's clock will read `redis_ms`.
    pub fn instant_at(&self, redis_ms: i64) -> Instant {
        // Capped at a day: callers sleep far less, and Instant + a huge
        // Duration would overflow.
        let ahead = redis_ms.saturating_sub(self.now_ms()).clamp(0, 86_400_000) as u64;
        Instant::now() + Duration::from_millis(ahead)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_follows_observations() {
        let clock = RedisClock::new();
        clock.observe(local_ms() + 60_000);
        let diff = clock.now_ms() - local_ms();
        assert!((59_990..=60_010).contains(&diff), "{diff}");
        let at = clock.instant_at(clock.now_ms() + 500);
        let wait = at.saturating_duration_since(Instant::now());
        assert!(wait > Duration::from_millis(480) && wait <= Duration::from_millis(500));
        assert!(clock.instant_at(0) <= Instant::now());
    }
}
