//! The one backoff of every loop that retries Redis (connecting, loading
//! the scripts, the wake subscription, the carrier, the firer, recording an
//! attempt's outcome): a wait that doubles after each failure up to a cap,
//! and starts over after a success.

use std::time::Duration;

/// An exponential backoff.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// A backoff waiting `first`, then twice as long after each failure,
    /// at most `max`.
    pub(crate) fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            current: first,
        }
    }

    /// The wait before the next retry.
    pub(crate) fn current(&self) -> Duration {
        self.current
    }

    /// The wait before the next retry; the one after it is twice as long
    /// (at most the cap).
    pub(crate) fn step(&mut self) -> Duration {
        let wait = self.current;
        self.current = (self.current * 2).min(self.max);
        wait
    }

    /// Starts over at the first wait (after a success).
    pub(crate) fn reset(&mut self) {
        self.current = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_starts_over() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let waits: Vec<u64> = (0..4).map(|_| b.step().as_millis() as u64).collect();
        assert_eq!(waits, [100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.current(), Duration::from_millis(100));
    }
}
