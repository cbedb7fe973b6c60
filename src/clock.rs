//! The daemon's estimate of Redis's clock.
//!
//! Redis's `TIME` is hookq's only clock: scripts decide what is due. The daemon
//! uses its own clock only to decide how long to sleep, converting Redis
//! epoch-ms into a local deadline with an offset learned from every script
//! reply that carries Redis's time. Skewed local clocks therefore cost at most
//! an extra round trip (waking early), never an early or double delivery.
//!
//! The estimate never runs ahead of Redis's clock (while both clocks run
//! at the same rate): Redis's time in a reply is its millisecond, rounded
//! down, read before the reply left, and the local clock is read in
//! microseconds when the reply arrives, so each offset learned is at most
//! the true one. The estimate takes the last reply's offset or, when
//! tighter, the largest of the last second's (the reply whose trip was
//! shortest, read nearest the end of Redis's millisecond), aged by the most
//! two clocks can drift apart ([`DRIFT_PPM`]) so that keeping an older one
//! never takes the estimate past where the last reply puts it and Redis's
//! clock. A reply slowed on its way (a busy daemon, a loaded host) so no
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

/// The longest wait [`RedisClock::instant_at`] gives (a day, in µs):
/// callers sleep far less, and an Instant a huge Duration on would
/// overflow.
const MAX_WAIT: i64 = 86_400_000_000;

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

/// Offsets of Redis's clock less the local one (µs): the last reply's, and
/// the tightest of the last [`TRUST`] with when it was learned (local µs).
/// Before any reply, both are the local wall clock's (no skew assumed).
#[derive(Clone, Copy, Debug)]
struct Estimate {
    last_us: i64,
    best_us: i64,
    best_at_us: i64,
}

impl Estimate {
    /// An estimate that has seen no reply at local time `now_us`: Redis's
    /// clock taken to be `offset_us` from the local one (the first reply
    /// replaces it, as it is older than [`TRUST`]).
    fn assuming(offset_us: i64, now_us: i64) -> Estimate {
        Estimate {
            last_us: offset_us,
            best_us: offset_us,
            best_at_us: now_us - TRUST - 1,
        }
    }

    /// The offset at local time `now_us`: the last reply's, or the tightest
    /// one less the drift it may have gathered since (rounded up) when that
    /// is still larger.
    fn offset_at(&self, now_us: i64) -> i64 {
        let age = now_us.saturating_sub(self.best_at_us).max(0);
        let aged = self
            .best_us
            .saturating_sub(age.saturating_mul(DRIFT_PPM).saturating_add(999_999) / 1_000_000);
        aged.max(self.last_us)
    }

    /// How long after local time `now_us` the estimate reads `target_us`
    /// (0 when it does already): by the last reply's offset, or sooner by
    /// the tightest one, which gains DRIFT_PPM less than a µs a µs.
    /// Capped at [`MAX_WAIT`] (a reading may be "never": `i64::MAX`).
    fn wait_for(&self, target_us: i64, now_us: i64) -> i64 {
        let behind_by = |offset: i64| {
            target_us
                .saturating_sub(now_us.saturating_add(offset))
                .clamp(0, MAX_WAIT)
        };
        let by_last = behind_by(self.last_us);
        let behind = behind_by(self.offset_at(now_us));
        let by_best = behind + (behind * DRIFT_PPM + 999_999 - DRIFT_PPM) / (1_000_000 - DRIFT_PPM);
        by_last.min(by_best).min(MAX_WAIT)
    }

    /// Learns `offset_us`, observed at local time `now_us`: the last one,
    /// and the tightest when it is (or the kept one is [`TRUST`] old).
    fn observe(&mut self, offset_us: i64, now_us: i64) {
        self.last_us = offset_us;
        if now_us.saturating_sub(self.best_at_us) > TRUST || offset_us >= self.offset_at(now_us) {
            self.best_us = offset_us;
            self.best_at_us = now_us;
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
            estimate: Arc::new(Mutex::new(Estimate::assuming(wall_us() - local, local))),
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
    /// `redis_ms` (by the offsets known now).
    pub(crate) fn instant_at(&self, redis_ms: i64) -> Instant {
        let local = local_us();
        let wait = self
            .estimate()
            .wait_for(redis_ms.saturating_mul(1000), local);
        Instant::now() + Duration::from_micros(wait as u64)
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
        let mut e = Estimate::assuming(0, 0);
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
    /// rounded up), never below the last reply's (which does not age: a
    /// long idle wait lags no more than it did), and a newer one replaces
    /// it once it is TRUST old.
    #[test]
    fn a_kept_offset_ages_down_to_the_last_and_expires() {
        let mut e = observed(5_000, 0);
        assert_eq!(e.offset_at(500_000), 5_000, "the last reply's, unaged");
        e.observe(4_000, 10);
        assert_eq!(e.offset_at(10), 4_999, "aged, rounded up");
        assert_eq!(e.offset_at(500_000), 4_500);
        assert_eq!(e.offset_at(60_000_000), 4_000, "down to the last");
        e.observe(1_000, TRUST + 100);
        assert_eq!(
            e.offset_at(TRUST + 100),
            1_000,
            "a stepped-back Redis is followed"
        );
    }

    /// The wait for a reading ends when the estimate reads it, not before
    /// (a second wake) and not later: by the last reply's offset, or by
    /// the kept one, which gains a little less than the local clock.
    #[test]
    fn the_wait_ends_when_the_estimate_reads_the_time() {
        let mut e = observed(5_000, 0);
        e.observe(3_000, 100_000);
        for (target, now) in [
            (150_000, 100_000),
            (2_000_000, 100_000),
            (40_000_000, 100_000),
        ] {
            let wait = e.wait_for(target, now);
            let at = now + wait;
            assert!(
                estimate_us(at, e.offset_at(at)) >= target,
                "{target}: early by its own reading"
            );
            assert!(
                estimate_us(at - 1, e.offset_at(at - 1)) < target,
                "{target}: {wait} us is late"
            );
        }
        assert_eq!(e.wait_for(0, 100_000), 0, "the past is now");
        assert_eq!(e.wait_for(i64::MAX, 100_000), MAX_WAIT, "never is a day");
    }

    /// Redis's clock runs slower or faster than the local one by up to
    /// DRIFT_PPM, and replies take 0 to 3 ms to arrive: keeping a tighter
    /// older offset never takes the estimate past both Redis's clock and
    /// where the last reply alone puts it (which, at equal rates, is never
    /// past Redis's: see above).
    #[test]
    fn a_kept_offset_never_runs_ahead_under_drift() {
        for ppm in [-DRIFT_PPM, -300, 0, 300, DRIFT_PPM] {
            // Redis's clock (epoch us) at local time `l` (us).
            let redis_us = |l: i64| 1_764_000_000_000_000 + l + l * ppm / 1_000_000;
            let mut e = Estimate::assuming(0, 0);
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
                    let estimate = estimate_us(at, e.offset_at(at));
                    let bound = redis_us(at).max(estimate_us(at, e.last_us));
                    assert!(
                        estimate <= bound,
                        "drift {ppm} ppm, step {step}, {later} us on: estimate {estimate}, bound {bound}"
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
