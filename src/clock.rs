//! The daemon's estimate of Redis's clock.
//!
//! Redis's `TIME` is hookq's only clock: scripts decide what is due. The daemon
//! uses its own clock only to decide how long to sleep, converting Redis
//! epoch-ms into a local deadline with an offset learned from every script
//! reply that carries Redis's time. Skewed local clocks therefore cost at most
//! an extra round trip (waking early), never an early or double delivery.
//!
//! The estimate never runs ahead of Redis's clock: Redis's time in a reply
//! is its millisecond, rounded down, read before the reply left, and the
//! local clock is read in microseconds when the reply arrives, so each
//! offset learned is at most the true one. The estimate keeps the largest
//! of them (the tightest: the reply whose trip was shortest, read nearest
//! the end of Redis's millisecond), aged by the most two clocks can drift
//! apart ([`DRIFT_PPM`]), and takes a newer one, however loose, once the
//! kept one is [`TRUST`] old (a clock stepped back is then followed
//! again). A reply slowed on its way (a busy daemon, a loaded host) so no
//! longer holds every held job back by its delay. A daemon holding a job
//! claimed ahead can send it once the estimate reads its due millisecond.
//! The local clock is the monotonic one: a step of the local wall clock
//! does not move the estimate.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The most Redis's clock and the local one drift apart, in parts per
/// million: NTP slews a clock by at most 500 ppm, so two disciplined clocks
/// part by at most 1,000 ppm (1 µs a ms).
const DRIFT_PPM: i64 = 1_000;

/// How long the tightest offset is kept against looser newer ones (µs).
const TRUST: i64 = 1_000_000;

/// Shared estimate of Redis's clock less the local (monotonic) one.
#[derive(Clone)]
pub struct RedisClock {
    estimate: Arc<Mutex<Estimate>>,
}

impl Default for RedisClock {
    fn default() -> Self {
        RedisClock::new()
    }
}

/// The offset kept: Redis's clock less the local one (µs), and when it was
/// learned (local µs); `observed` is false until a reply has been seen
/// (the offset is then the local wall clock's: no skew assumed).
#[derive(Clone, Copy, Debug)]
struct Estimate {
    offset_us: i64,
    at_us: i64,
    observed: bool,
}

impl Estimate {
    /// The offset at local time `now_us`: the kept one less the drift it
    /// may have gathered since (rounded up: never more than the true one).
    fn offset_at(&self, now_us: i64) -> i64 {
        if !self.observed {
            return self.offset_us;
        }
        let age = now_us.saturating_sub(self.at_us).max(0);
        self.offset_us - (age.saturating_mul(DRIFT_PPM) + 999_999) / 1_000_000
    }

    /// Learns `offset_us`, observed at local time `now_us`: kept when it is
    /// the tighter one (or the kept one is [`TRUST`] old, or none was seen).
    fn observe(&mut self, offset_us: i64, now_us: i64) {
        if !self.observed
            || now_us.saturating_sub(self.at_us) > TRUST
            || offset_us >= self.offset_at(now_us)
        {
            *self = Estimate {
                offset_us,
                at_us: now_us,
                observed: true,
            };
        }
    }
}

/// The local monotonic clock, µs since the process's first reading.
fn local_us() -> i64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_micros() as i64
}

/// The wall clock, epoch µs.
fn wall_us() -> i64 {
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
        let local = local_us();
        RedisClock {
            estimate: Arc::new(Mutex::new(Estimate {
                offset_us: wall_us() - local,
                at_us: local,
                observed: false,
            })),
        }
    }

    fn estimate(&self) -> MutexGuard<'_, Estimate> {
        match self.estimate.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Records that Redis's clock read `redis_ms` (a script's or `TIME`'s
    /// reply, just received).
    pub(crate) fn observe(&self, redis_ms: i64) {
        let local = local_us();
        self.estimate().observe(offset_of(redis_ms, local), local);
    }

    /// Estimated Redis time now, epoch ms (never ahead of Redis's own, see
    /// the module doc).
    pub(crate) fn now_ms(&self) -> i64 {
        self.now_us().div_euclid(1000)
    }

    fn now_us(&self) -> i64 {
        let local = local_us();
        estimate_us(local, self.estimate().offset_at(local))
    }

    /// The local instant at which the estimate of Redis's clock will read
    /// `redis_ms` (the estimate ages as it goes: it gains DRIFT_PPM less
    /// than a microsecond a local microsecond).
    pub(crate) fn instant_at(&self, redis_ms: i64) -> Instant {
        // Capped at a day: callers sleep far less, and Instant + a huge
        // Duration would overflow.
        let behind = redis_ms
            .saturating_mul(1000)
            .saturating_sub(self.now_us())
            .clamp(0, 86_400_000_000);
        let ahead = (behind + (behind * DRIFT_PPM + 999_999 - DRIFT_PPM) / (1_000_000 - DRIFT_PPM))
            .min(86_400_000_000);
        Instant::now() + Duration::from_micros(ahead as u64)
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

    fn observed(offset_us: i64, at_us: i64) -> Estimate {
        let mut e = Estimate {
            offset_us: 0,
            at_us: 0,
            observed: false,
        };
        e.observe(offset_us, at_us);
        e
    }

    /// A looser offset (a reply slowed on its way) does not pull the
    /// estimate back while the tighter one is trusted; a tighter one wins.
    #[test]
    fn the_tightest_offset_is_kept() {
        let mut e = observed(5_000, 1_000_000);
        // 3 ms slower on its way, 10 ms later: kept the first, aged 10 us.
        e.observe(2_000, 1_010_000);
        assert_eq!(e.offset_at(1_010_000), 5_000 - 10);
        // A tighter one replaces it.
        e.observe(5_400, 1_020_000);
        assert_eq!(e.offset_at(1_020_000), 5_400);
    }

    /// The kept offset ages by the most the clocks may drift (1 us a ms,
    /// rounded up), and a newer one replaces it once it is TRUST old.
    #[test]
    fn a_kept_offset_ages_and_expires() {
        let e = observed(5_000, 0);
        assert_eq!(e.offset_at(0), 5_000);
        assert_eq!(e.offset_at(1), 4_999);
        assert_eq!(e.offset_at(500_000), 4_500);
        let mut e = observed(5_000, 0);
        e.observe(1_000, TRUST + 1);
        assert_eq!(
            e.offset_at(TRUST + 1),
            1_000,
            "a stepped-back Redis is followed"
        );
    }

    /// Redis's clock runs slower or faster than the local one by up to
    /// DRIFT_PPM, and replies take 0 to 3 ms to arrive: the estimate kept
    /// from them never reads past Redis's millisecond.
    #[test]
    fn the_estimate_never_runs_ahead_under_drift() {
        for ppm in [-DRIFT_PPM, -300, 0, 300, DRIFT_PPM] {
            // Redis's clock (epoch us) at local time `l` (us).
            let redis_us = |l: i64| 1_764_000_000_000_000 + l + l * ppm / 1_000_000;
            let mut e = Estimate {
                offset_us: 0,
                at_us: 0,
                observed: false,
            };
            let mut local = 0_i64;
            for step in 0..4_000_i64 {
                // A reply every 0.7 to 31 ms, its trip 0 to 3 ms.
                local += 700 + (step * 7_919) % 30_300;
                let trip = (step * 104_729) % 3_000;
                e.observe(
                    offset_of(redis_us(local - trip).div_euclid(1000), local),
                    local,
                );
                for later in [0, 1, 999, 20_000, 900_000] {
                    let at = local + later;
                    let estimate_ms = estimate_us(at, e.offset_at(at)).div_euclid(1000);
                    let redis_ms = redis_us(at).div_euclid(1000);
                    assert!(
                        estimate_ms <= redis_ms,
                        "drift {ppm} ppm, step {step}, {later} us on: estimate {estimate_ms}, Redis {redis_ms}"
                    );
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
        // At most 500 ms after the call, and the 0.5 ms the estimate ages
        // meanwhile (1 us a ms); at least 500 ms after it started, less
        // what elapsed during it (and 2 ms of whole-ms rounding).
        assert!(
            at <= end + Duration::from_micros(500_501),
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
