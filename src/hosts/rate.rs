//! The per-host request rate (`delivery.per_host_rate`, `[[hosts]] rate`),
//! held across every daemon sharing the Redis.
//!
//! Redis keeps, per host, a budget per window of the Redis clock (1 s for
//! rates of 10/s and more; longer windows for slower rates, so the budget per
//! window stays a whole number). A daemon takes a chunk of the current
//! window's budget (`take_rate.lua`, about a tenth of it), spends it locally,
//! and asks again when it runs out: a few round trips a second per busy host,
//! never one per request. Inside a daemon, attempts are also spaced
//! 1/rate apart (with 10 ms of burst tolerance, as in GCRA), so a chunk is
//! not fired as one burst.

use std::time::Duration;

use tokio::time::Instant;

use crate::clock::RedisClock;
use crate::store::Store;

/// Chunks a window's budget is taken in, at most.
const CHUNKS_PER_WINDOW: u64 = 10;
/// How far ahead of its even spacing a daemon may run (a small burst), so
/// that rates above the timer's millisecond resolution are reachable.
const BURST_TOLERANCE: Duration = Duration::from_millis(10);

/// The shape of one rate: window length and requests per window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// Window length in ms.
    pub ms: u64,
    /// Requests allowed in one window, all daemons together.
    pub budget: u64,
}

impl Window {
    /// The window for `rate` requests per second (`rate > 0`): 1 s from
    /// 10/s up, otherwise long enough to hold 10 requests, so that the budget
    /// is a whole number within 10% of the rate.
    pub(crate) fn for_rate(rate: f64) -> Window {
        let seconds = if rate >= 10.0 {
            1.0
        } else {
            (10.0 / rate).ceil().min(3600.0)
        };
        Window {
            ms: (seconds * 1000.0) as u64,
            budget: ((rate * seconds).floor() as u64).max(1),
        }
    }

    /// Tokens asked for at once.
    pub(crate) fn chunk(&self) -> u64 {
        self.budget.div_ceil(CHUNKS_PER_WINDOW).max(1)
    }
}

/// One host's limiter in one daemon (owned by its lane's runner).
pub(crate) struct RateLimiter {
    host: String,
    window: Window,
    spacing: Duration,
    tokens: u64,
    valid_until: Instant,
    next_at: Instant,
}

impl RateLimiter {
    /// A limiter for `host` at `rate` requests per second (`rate > 0`).
    pub(crate) fn new(host: &str, rate: f64) -> Self {
        let now = Instant::now();
        RateLimiter {
            host: host.to_string(),
            window: Window::for_rate(rate),
            spacing: Duration::from_secs_f64(1.0 / rate),
            tokens: 0,
            valid_until: now,
            next_at: now,
        }
    }

    /// Waits until one more request to the host is allowed, and takes it.
    /// While Redis cannot be reached, waits and asks again (no request goes
    /// out unaccounted).
    pub(crate) async fn acquire(&mut self, store: &Store, clock: &RedisClock) {
        loop {
            let now = Instant::now();
            if self.tokens > 0 && now < self.valid_until {
                let allowed_at = self.next_at.checked_sub(BURST_TOLERANCE).unwrap_or(now);
                if allowed_at > now {
                    tokio::time::sleep_until(allowed_at).await;
                    continue;
                }
                self.tokens -= 1;
                self.next_at = self.next_at.max(now) + self.spacing;
                return;
            }
            match store
                .take_rate(
                    &self.host,
                    self.window.ms,
                    self.window.budget,
                    self.window.chunk(),
                )
                .await
            {
                Ok((granted, window_end)) => {
                    self.tokens = granted;
                    self.valid_until = tokio::time::Instant::from_std(clock.instant_at(window_end));
                    if granted == 0 {
                        metrics::counter!("hookq_host_rate_limited_total").increment(1);
                        tokio::time::sleep_until(
                            self.valid_until.max(now + Duration::from_millis(1)),
                        )
                        .await;
                    }
                }
                Err(err) => {
                    tracing::warn!(host = %self.host, cause = %err, "cannot take rate tokens yet");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_hold_whole_budgets_within_ten_percent() {
        assert_eq!(
            Window::for_rate(100.0),
            Window {
                ms: 1000,
                budget: 100
            }
        );
        assert_eq!(
            Window::for_rate(12.5),
            Window {
                ms: 1000,
                budget: 12
            }
        );
        assert_eq!(
            Window::for_rate(2.5),
            Window {
                ms: 4000,
                budget: 10
            }
        );
        assert_eq!(
            Window::for_rate(0.5),
            Window {
                ms: 20_000,
                budget: 10
            }
        );
        for rate in [0.01, 0.3, 1.0, 3.3, 9.99, 10.0, 55.5, 1234.5] {
            let w = Window::for_rate(rate);
            let actual = w.budget as f64 * 1000.0 / w.ms as f64;
            assert!(actual <= rate && actual >= rate * 0.9, "{rate}: {w:?}");
        }
        assert_eq!(Window::for_rate(1000.0).chunk(), 100);
        assert_eq!(Window::for_rate(5.0).chunk(), 1);
    }
}
