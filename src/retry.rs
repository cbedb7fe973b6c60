//! The retry ladder as data: given a job's ladder, the attempt that just failed
//! and how it failed, decide when the next attempt is due or that the job is
//! dead. A pure function, so every rule of SPEC §4 is unit-tested here.

use std::time::Duration;

/// What to do after a failed attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum FailAction {
    /// Schedule the next attempt this long after now.
    Retry(Duration),
    /// Move the job to the dead-letter stream.
    DeadLetter,
}

/// How an attempt failed, as far as retrying is concerned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum FailureKind {
    /// Worth retrying on the next rung; `retry_after` is what a 429/503 asked for.
    Retryable {
        /// The receiver's `Retry-After`, if it sent one.
        retry_after: Option<Duration>,
    },
    /// Retrying cannot help (410, a configured dead-letter status, SSRF refusal).
    Permanent,
}

/// Decides what follows failed attempt number `attempt` (1-based).
///
/// - A permanent failure dead-letters.
/// - After failure k the next attempt waits `ladder[k-1]`; with no rung left
///   the job is dead-lettered.
/// - Jitter adds `jitter * unit_sample * rung` (never subtracts): `jitter` is
///   the configured fraction 0..=1 and `unit_sample` a random draw in 0..1.
/// - A `Retry-After` makes the wait at least that long, capped at the ladder's
///   last rung.
pub(crate) fn next_delay(
    ladder: &[Duration],
    attempt: u32,
    failure: FailureKind,
    jitter: f64,
    unit_sample: f64,
) -> FailAction {
    let retry_after = match failure {
        FailureKind::Permanent => return FailAction::DeadLetter,
        FailureKind::Retryable { retry_after } => retry_after,
    };
    let Some(rung) = attempt
        .checked_sub(1)
        .and_then(|k| ladder.get(k as usize))
        .copied()
    else {
        return FailAction::DeadLetter;
    };
    let extra = rung.mul_f64((jitter * unit_sample).clamp(0.0, 1.0));
    let mut delay = rung + extra;
    if let (Some(asked), Some(last)) = (retry_after, ladder.last()) {
        delay = delay.max(asked.min(*last));
    }
    FailAction::Retry(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    const RETRY: FailureKind = FailureKind::Retryable { retry_after: None };

    #[test]
    fn default_ladder_gives_nine_attempts_over_about_a_day() {
        let ladder = crate::config::default_ladder();
        let mut total = Duration::ZERO;
        let mut attempt = 1;
        while let FailAction::Retry(d) = next_delay(&ladder, attempt, RETRY, 0.0, 0.0) {
            total += d;
            attempt += 1;
        }
        assert_eq!(attempt, 9, "the 9th failure dead-letters");
        assert_eq!(
            total,
            secs(15 + 180 + 600 + 1800 + 3600 + 7200 + 21600 + 54000)
        );
        assert!(total > secs(24 * 3600) && total < secs(25 * 3600));
    }

    #[test]
    fn each_rung_in_order() {
        let ladder = [secs(1), secs(2), secs(3)];
        assert_eq!(
            next_delay(&ladder, 1, RETRY, 0.0, 0.0),
            FailAction::Retry(secs(1))
        );
        assert_eq!(
            next_delay(&ladder, 2, RETRY, 0.0, 0.0),
            FailAction::Retry(secs(2))
        );
        assert_eq!(
            next_delay(&ladder, 3, RETRY, 0.0, 0.0),
            FailAction::Retry(secs(3))
        );
        assert_eq!(
            next_delay(&ladder, 4, RETRY, 0.0, 0.0),
            FailAction::DeadLetter
        );
        assert_eq!(
            next_delay(&ladder, 0, RETRY, 0.0, 0.0),
            FailAction::DeadLetter
        );
    }

    #[test]
    fn empty_ladder_means_one_attempt() {
        assert_eq!(next_delay(&[], 1, RETRY, 0.0, 0.0), FailAction::DeadLetter);
    }

    #[test]
    fn permanent_failures_dead_letter_at_once() {
        let ladder = [secs(1), secs(2)];
        assert_eq!(
            next_delay(&ladder, 1, FailureKind::Permanent, 0.0, 0.0),
            FailAction::DeadLetter
        );
    }

    #[test]
    fn jitter_only_adds() {
        let ladder = [secs(10)];
        for sample in [0.0, 0.25, 0.5, 0.999] {
            match next_delay(&ladder, 1, RETRY, 0.5, sample) {
                FailAction::Retry(d) => {
                    assert!(d >= secs(10) && d <= secs(15), "{d:?}");
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            next_delay(&ladder, 1, RETRY, 1.0, 0.5),
            FailAction::Retry(secs(15))
        );
    }

    #[test]
    fn retry_after_raises_the_wait_but_is_capped_by_the_last_rung() {
        let ladder = [secs(1), secs(60)];
        let asked = |s| FailureKind::Retryable {
            retry_after: Some(secs(s)),
        };
        assert_eq!(
            next_delay(&ladder, 1, asked(30), 0.0, 0.0),
            FailAction::Retry(secs(30))
        );
        assert_eq!(
            next_delay(&ladder, 1, asked(3600), 0.0, 0.0),
            FailAction::Retry(secs(60))
        );
        // A Retry-After shorter than the rung never shortens it.
        assert_eq!(
            next_delay(&ladder, 2, asked(5), 0.0, 0.0),
            FailAction::Retry(secs(60))
        );
        // Still dead when no rung is left.
        assert_eq!(
            next_delay(&ladder, 3, asked(5), 0.0, 0.0),
            FailAction::DeadLetter
        );
    }
}
