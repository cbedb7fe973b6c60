//! Durations and times: a job's `run_at`, `delay`, `retry` and `timeout`
//! parsed from what a client writes (with their bounds), and times and
//! durations formatted as every response shows them.

use std::time::Duration;

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::{quote, FieldError, RunAt};
use crate::config::Config;

/// How far ahead a due time may lie (about 10 years).
pub(crate) const MAX_AHEAD: Duration = Duration::from_secs(10 * 366 * 24 * 3600);
/// Longest rung of a job's own retry ladder.
pub(crate) const MAX_RUNG: Duration = Duration::from_secs(30 * 24 * 3600);
/// Most rungs a job's own retry ladder may have.
pub(crate) const MAX_RUNGS: usize = 64;

/// Parses a humantime duration (`30s`, `1h`); `field` names it in errors.
pub(crate) fn parse_duration(text: &str, field: &str) -> Result<Duration, FieldError> {
    humantime::parse_duration(text).map_err(|e| {
        FieldError::new(
            "invalid_duration",
            field,
            format!(
                "{field} `{}` is not a duration like 30s or 1h 30m: {}",
                quote(text),
                quote(&e.to_string())
            ),
        )
    })
}

/// Parses `run_at` into epoch milliseconds.
pub(crate) fn parse_run_at(run_at: &RunAt) -> Result<i64, FieldError> {
    let ms = match run_at {
        RunAt::Millis(ms) => *ms,
        RunAt::Text(text) => {
            let t = OffsetDateTime::parse(text, &Rfc3339).map_err(|e| {
                FieldError::new(
                    "invalid_time",
                    "run_at",
                    format!(
                        "run_at `{}` is not an RFC 3339 time or epoch milliseconds: {e}",
                        quote(text)
                    ),
                )
            })?;
            (t.unix_timestamp_nanos() / 1_000_000) as i64
        }
    };
    if ms < 0 {
        return Err(FieldError::new(
            "invalid_time",
            "run_at",
            "run_at must not be before 1970",
        ));
    }
    let limit = now_ms() + MAX_AHEAD.as_millis() as i64;
    if ms > limit {
        return Err(FieldError::new(
            "invalid_time",
            "run_at",
            "run_at is more than 10 years ahead",
        ));
    }
    Ok(ms)
}

/// Parses `delay` into milliseconds.
pub(crate) fn parse_delay(text: &str) -> Result<u64, FieldError> {
    let d = parse_duration(text, "delay")?;
    if d > MAX_AHEAD {
        return Err(FieldError::new(
            "invalid_duration",
            "delay",
            "delay is more than 10 years",
        ));
    }
    Ok(d.as_millis() as u64)
}

/// Parses a retry ladder override.
pub(crate) fn parse_retry(items: &[String]) -> Result<Vec<u64>, FieldError> {
    if items.len() > MAX_RUNGS {
        return Err(FieldError::new(
            "invalid_retry",
            "retry",
            format!("retry has more than {MAX_RUNGS} rungs"),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let field = format!("retry[{i}]");
            let d = parse_duration(s, &field)?;
            if d.is_zero() || d > MAX_RUNG {
                return Err(FieldError::new(
                    "invalid_retry",
                    &field,
                    format!("{field} must be between 1ms and 30 days"),
                ));
            }
            Ok(d.as_millis() as u64)
        })
        .collect()
}

/// Parses a per-job timeout, bounded by `delivery.max_timeout`.
pub(crate) fn parse_timeout(text: &str, config: &Config) -> Result<u64, FieldError> {
    let d = parse_duration(text, "timeout")?;
    if d < Duration::from_millis(1) || d > config.delivery.max_timeout {
        return Err(FieldError::new(
            "invalid_timeout",
            "timeout",
            format!(
                "timeout must be between 1ms and {} (delivery.max_timeout)",
                humantime::format_duration(config.delivery.max_timeout)
            ),
        ));
    }
    Ok(d.as_millis() as u64)
}

/// RFC 3339 in UTC with exactly three fractional digits.
const RFC3339_MILLIS: &[time::format_description::FormatItem<'static>] = time::macros::format_description!(
    "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
);

/// Formats epoch milliseconds as RFC 3339 in UTC with milliseconds
/// (`2026-11-23T07:44:17.000Z`): the one time format of every response.
pub(crate) fn format_ms(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| t.format(RFC3339_MILLIS).ok())
        .unwrap_or_else(|| ms.to_string())
}

/// Formats a duration of milliseconds as humantime (`1m 30s`).
pub(crate) fn format_duration_ms(ms: u64) -> String {
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

/// This machine's wall clock in epoch ms (used for input sanity bounds and
/// to show a due scheduled record as ready; due times are compared against
/// Redis's clock).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_ms(1_795_415_873_572), "2026-11-23T06:37:53.572Z");
        assert_eq!(format_ms(1_795_415_873_000), "2026-11-23T06:37:53.000Z");
    }
}
