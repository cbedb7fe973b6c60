//! The daemon's estimate of Redis's clock.
//!
//! Redis's `TIME` is hookq's only clock: scripts decide what is due. The daemon
//! uses its own clock only to decide how long to sleep, converting Redis
//! epoch-ms into a local deadline with an offset learned from every script
//! reply that carries Redis's time. Skewed local clocks therefore cost at most
//! an extra round trip (waking early), never an early or double delivery.
//!
//! The estimate never runs ahead of Redis's clock (between observations,
//! while both clocks run at the same rate): Redis's time in a reply is its
//! millisecond, rounded down, read before the reply left, and the local
//! clock is read in microseconds when the reply arrives, so the offset
//! learned is at most the true one. A daemon holding a job claimed ahead
//! can send it once the estimate reads its due millisecond.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Shared estimate of Redis's clock less the local one, in microseconds.
#[derive(Clone, Default)]
pub struct RedisClock {
    offset_us: Arc<AtomicI64>,
}

/// The local clock, epoch µs.
fn local_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// The offset learned from Redis's clock reading `redis_ms` (its
/// millisecond, rounded down) when the local clock reads `local_us`
/// (after Redis read it): at most the true offset.
fn offset_of(redis_ms: i64, local_us: i64) -> i64 {
    redis_ms.saturating_mul(1000) - local_us
}

/// The estimate of Redis's clock, epoch µs, when the local clock reads
/// `local_us`.
fn estimate_us(local_us: i64, offset_us: i64) -> i64 {
    local_us.saturating_add(offset_us)
}

impl RedisClock {
    /// A clock assuming no skew until the first observation.
    pub fn new() -> Self {
        RedisClock::default()
    }

    /// Records that Redis's clock read `redis_ms` (a script's or `TIME`'s
    /// reply, just received).
    pub(crate) fn observe(&self, redis_ms: i64) {
        self.offset_us
            .store(offset_of(redis_ms, local_us()), Ordering::Relaxed);
    }

    /// Estimated Redis time now, epoch ms (never ahead of Redis's own, see
    /// the module doc).
    pub(crate) fn now_ms(&self) -> i64 {
        self.now_us().div_euclid(1000)
    }

    fn now_us(&self) -> i64 {
        estimate_us(local_us(), self.offset_us.load(Ordering::Relaxed))
    }

    /// The local instant at which the estimate of Redis's clock will read
    /// `redis_ms`.
    pub(crate) fn instant_at(&self, redis_ms: i64) -> Instant {
        // Capped at a day: callers sleep far less, and Instant + a huge
        // Duration would overflow.
        let ahead = redis_ms
            .saturating_mul(1000)
            .saturating_sub(self.now_us())
            .clamp(0, 86_400_000_000) as u64;
        Instant::now() + Duration::from_micros(ahead)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Every bound below is bracketed by readings taken around the call, not a
    // fixed tolerance, so a loaded machine that stalls between two lines
    // widens the bracket instead of failing the test.

    fn local_ms() -> i64 {
        local_us().div_euclid(1000)
    }

    /// Redis's clock runs `skew_us` ahead of the local one; a reply read
    /// Redis's clock at local time `read_us` and arrived `trip_us` later;
    /// the estimate is then read at every later microsecond for 3 ms: its
    /// millisecond is never past Redis's.
    #[test]
    fn the_estimate_never_runs_ahead_of_redis() {
        let skews = [0, 1, 250, 499, 500, 999, 1_000, 1_001, -1, -999, 60_000_321];
        for skew_us in skews {
            for read_us in [
                1_764_000_000_000_000_i64,
                1_764_000_000_000_999,
                1_764_000_000_000_500,
            ] {
                for trip_us in [0, 1, 100, 999, 1_000, 2_500] {
                    let redis_ms = (read_us + skew_us).div_euclid(1000);
                    let offset = offset_of(redis_ms, read_us + trip_us);
                    for later_us in 0..3_000 {
                        let local = read_us + trip_us + later_us;
                        let estimate_ms = estimate_us(local, offset).div_euclid(1000);
                        let redis_now_ms = (local + skew_us).div_euclid(1000);
                        assert!(
                            estimate_ms <= redis_now_ms,
                            "skew {skew_us} us, trip {trip_us} us, {later_us} us on: \
                             estimate {estimate_ms} ms, Redis {redis_now_ms} ms"
                        );
                    }
                    // And it lags by at most the trip and Redis's rounding.
                    let local = read_us + trip_us;
                    assert!(estimate_us(local, offset) >= local + skew_us - trip_us - 1_000);
                }
            }
        }
    }

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
