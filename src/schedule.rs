//! Schedules (SPEC §12): a schedule creates an ordinary job at each of its
//! fire times. This module owns the schedule as a client writes it, its
//! validation, and the fire-time arithmetic: a `cron` expression on the wall
//! clock of an IANA time zone, or a fixed interval. The next fire time is
//! computed here; Redis only compares and advances it (`lua/fire_schedules.lua`).

use std::str::FromStr;

use chrono::{LocalResult, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::config::Config;
use crate::job::{parse_duration, parse_run_at, FieldError, JobInput, JobSpec, RunAt};

/// Fire times a catch-up (`catch_up = "all"`) creates at most.
pub(crate) const MAX_CATCH_UP: usize = 1000;

/// How old a fire time may be and still count as on time rather than
/// missed (for `catch_up = "none"`): a daemon busy for a moment, or a
/// Redis failover, is not "no daemon ran".
pub(crate) const ON_TIME_GRACE_MS: i64 = 10_000;

/// The shortest `every`.
pub(crate) const MIN_EVERY_MS: u64 = 1000;

/// The characters of a schedule id besides letters and digits (no `:`,
/// which separates a fired job's id from its fire time).
const SCHEDULE_ID_EXTRA: &[u8] = b"._-";

/// The longest schedule id.
const SCHEDULE_ID_MAX: usize = 100;

/// Checks a schedule id: `[A-Za-z0-9._-]{1,100}`.
pub(crate) fn validate_schedule_id(id: &str) -> Result<(), FieldError> {
    crate::job::validate_charset(id, SCHEDULE_ID_MAX, SCHEDULE_ID_EXTRA, "invalid_id", "id")
}

/// The schedule id and fire time of a job a schedule fired: its id is
/// `<schedule id>:<fire time ms>` (13 digits), both internal ids (a
/// schedule of tenant `t` fires `t/<id>:<time>`). Such a job lives in its
/// schedule's partition, where the firing creates it.
pub fn fired_by(job_id: &str) -> Option<(&str, i64)> {
    let (schedule, at) = job_id.rsplit_once(':')?;
    // Fire times are epoch ms: 13 digits from 2001 to 2286. Checked first:
    // every create asks, and most ids fail here.
    if at.len() != 13 || !at.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // A schedule of another tenant than `default` is `<tenant>/<id>`.
    let (tenant, bare) = crate::tenant::split_id(schedule);
    if !crate::job::is_charset(bare, SCHEDULE_ID_MAX, SCHEDULE_ID_EXTRA)
        || !crate::tenant::is_tenant_name(tenant)
    {
        return None;
    }
    Some((schedule, at.parse().ok()?))
}

/// The id of the job schedule `schedule` fires at `at_ms`.
pub(crate) fn job_id(schedule: &str, at_ms: i64) -> String {
    format!("{schedule}:{at_ms}")
}

/// What a fire time does while the previous firing's job is unfinished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// Fire anyway.
    #[default]
    Allow,
    /// Create no job; the fire time is recorded as `skipped`.
    Skip,
}

/// What fire times missed while no daemon ran become.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// One job for the most recent missed time.
    #[default]
    Latest,
    /// No job.
    None,
    /// One job per missed time (at most [`MAX_CATCH_UP`]).
    All,
}

/// A schedule as a client sends it (`POST /v1/schedules`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleInput {
    /// Client-chosen id; generated when absent.
    pub id: Option<String>,
    /// Its tenant (default `default`; the API fills in a bound key's).
    pub tenant: Option<String>,
    /// A cron expression (5 fields, or 6 with leading seconds; macros).
    pub cron: Option<String>,
    /// A fixed interval (humantime, at least 1 s).
    pub every: Option<String>,
    /// IANA time zone of `cron` (default `UTC`).
    pub timezone: Option<String>,
    /// No fire time before this.
    pub start_at: Option<RunAt>,
    /// No fire time after this.
    pub end_at: Option<RunAt>,
    /// `allow` or `skip`.
    pub overlap: Option<String>,
    /// `latest`, `none` or `all`.
    pub catch_up: Option<String>,
    /// Created paused.
    pub paused: Option<bool>,
    /// The job template: every job field but `id`, `run_at` and `delay`.
    pub job: Option<Box<RawValue>>,
}

/// When a schedule fires: all a firing needs (its stored JSON is read
/// without the job template).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// The cron expression, as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The interval, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<u64>,
    /// IANA time zone name.
    pub timezone: String,
    /// No fire time before this (epoch ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<i64>,
    /// No fire time after this (epoch ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<i64>,
    /// Catch-up rule.
    #[serde(default)]
    pub catch_up: CatchUp,
}

/// A validated schedule: what it fires and when (its content, compared on
/// a re-create; the id and whether it is paused are not content).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScheduleSpec {
    /// When it fires.
    #[serde(flatten)]
    pub timing: Timing,
    /// Overlap rule.
    #[serde(default)]
    pub overlap: Overlap,
    /// The job template (its spec as a job would store it, without due time).
    pub job: JobSpec,
}

/// A schedule that passed validation.
#[derive(Debug, Clone)]
pub struct ValidSchedule {
    /// Its id (given or generated).
    pub id: String,
    /// Its content.
    pub spec: ScheduleSpec,
    /// Created paused.
    pub paused: bool,
}

/// Prefixes a template's field error with `job.`.
fn in_job(mut e: FieldError) -> FieldError {
    let field = e.field.take().unwrap_or_default();
    e.field = Some(if field.is_empty() {
        "job".into()
    } else {
        format!("job.{field}")
    });
    e
}

/// Parses a time field (`start_at`, `end_at`) as a job's `run_at` is parsed.
fn parse_time(value: &RunAt, field: &str) -> Result<i64, FieldError> {
    parse_run_at(value).map_err(|mut e| {
        e.message = e.message.replace("run_at", field);
        e.field = Some(field.into());
        e
    })
}

impl ScheduleInput {
    /// Validates every field (the template like a job, its errors naming
    /// `job.<field>`); the id is generated when absent.
    pub fn validate(self, config: &Config) -> Result<ValidSchedule, FieldError> {
        let id = match &self.id {
            Some(id) => {
                validate_schedule_id(id)?;
                id.clone()
            }
            None => ulid::Ulid::new().to_string(),
        };
        let tenant = self
            .tenant
            .as_deref()
            .unwrap_or(crate::tenant::DEFAULT_TENANT);
        crate::job::validate_tenant(tenant, "tenant")?;
        let spec = self.spec(config)?;
        Ok(ValidSchedule {
            id: crate::tenant::internal_id(tenant, &id),
            spec,
            paused: self.paused.unwrap_or(false),
        })
    }

    /// The content of this input, validated.
    pub(crate) fn spec(&self, config: &Config) -> Result<ScheduleSpec, FieldError> {
        let every_ms = self.every_ms()?;
        let timezone = self.timezone.clone().unwrap_or_else(|| "UTC".into());
        parse_timezone(&timezone)?;
        let (start_at, end_at) = self.window()?;
        let overlap = parse_overlap(self.overlap.as_deref())?;
        let catch_up = parse_catch_up(self.catch_up.as_deref())?;
        let job = self.job_template(config)?;
        Ok(ScheduleSpec {
            timing: Timing {
                cron: self.cron.clone(),
                every_ms,
                timezone,
                start_at,
                end_at,
                catch_up,
            },
            overlap,
            job,
        })
    }

    /// Checks that exactly one of `cron` and `every` is given, and that it
    /// is valid: the interval in ms for `every`, None for `cron`.
    fn every_ms(&self) -> Result<Option<u64>, FieldError> {
        match (&self.cron, &self.every) {
            (Some(_), Some(_)) => Err(FieldError::new(
                "conflicting_fields",
                "cron",
                "give either cron or every, not both",
            )),
            (None, None) => Err(FieldError::new(
                "missing_field",
                "cron",
                "a schedule needs cron or every",
            )),
            (Some(cron), None) => {
                parse_cron(cron)?;
                Ok(None)
            }
            (None, Some(every)) => {
                let every = parse_duration(every, "every")?;
                if every > crate::job::MAX_AHEAD {
                    // Also keeps the fire-time arithmetic far from i64's end.
                    return Err(FieldError::new(
                        "invalid_duration",
                        "every",
                        "every must be at most 10 years",
                    ));
                }
                let ms = every.as_millis() as u64;
                if ms < MIN_EVERY_MS {
                    return Err(FieldError::new(
                        "invalid_duration",
                        "every",
                        "every must be at least 1s",
                    ));
                }
                Ok(Some(ms))
            }
        }
    }

    /// `start_at` and `end_at` as epoch ms, checked: the end, when both
    /// are given, after the start.
    fn window(&self) -> Result<(Option<i64>, Option<i64>), FieldError> {
        let start_at = self
            .start_at
            .as_ref()
            .map(|t| parse_time(t, "start_at"))
            .transpose()?;
        let end_at = self
            .end_at
            .as_ref()
            .map(|t| parse_time(t, "end_at"))
            .transpose()?;
        if let (Some(start), Some(end)) = (start_at, end_at) {
            if end <= start {
                return Err(FieldError::new(
                    "invalid_time",
                    "end_at",
                    "end_at must be after start_at",
                ));
            }
        }
        Ok((start_at, end_at))
    }

    /// The job template, validated as a job (its errors naming
    /// `job.<field>`); it may not give an id, `run_at` or `delay`.
    fn job_template(&self, config: &Config) -> Result<JobSpec, FieldError> {
        let job = self
            .job
            .as_ref()
            .ok_or_else(|| FieldError::new("missing_field", "job", "job is required"))?;
        let input: JobInput = serde_json::from_str(job.get()).map_err(|e| {
            FieldError::new(
                "invalid_json",
                "job",
                format!("job: {}", crate::job::quote(&e.to_string())),
            )
        })?;
        if input.tenant.is_some() {
            return Err(in_job(FieldError::new(
                "not_allowed",
                "tenant",
                "a schedule's job takes no tenant: its jobs are the schedule's tenant's",
            )));
        }
        for (given, field) in [
            (input.id.is_some(), "id"),
            (input.run_at.is_some(), "run_at"),
            (input.delay.is_some(), "delay"),
        ] {
            if given {
                return Err(in_job(FieldError::new(
                    "not_allowed",
                    field,
                    format!("a schedule's job takes no {field}: the schedule gives each job its id and due time"),
                )));
            }
        }
        Ok(input.validate(config).map_err(in_job)?.spec)
    }
}

/// Parses `overlap`: `allow` (the default) or `skip`.
fn parse_overlap(text: Option<&str>) -> Result<Overlap, FieldError> {
    match text {
        None | Some("allow") => Ok(Overlap::Allow),
        Some("skip") => Ok(Overlap::Skip),
        Some(other) => Err(FieldError::new(
            "invalid_overlap",
            "overlap",
            format!(
                "overlap `{}` is not allow or skip",
                crate::job::quote(other)
            ),
        )),
    }
}

/// Parses `catch_up`: `latest` (the default), `none` or `all`.
fn parse_catch_up(text: Option<&str>) -> Result<CatchUp, FieldError> {
    match text {
        None | Some("latest") => Ok(CatchUp::Latest),
        Some("none") => Ok(CatchUp::None),
        Some("all") => Ok(CatchUp::All),
        Some(other) => Err(FieldError::new(
            "invalid_catch_up",
            "catch_up",
            format!(
                "catch_up `{}` is not latest, none or all",
                crate::job::quote(other)
            ),
        )),
    }
}

/// Parses a cron expression: 5 fields, or 6 with leading seconds; month and
/// weekday names; `@hourly`, `@daily`, `@weekly`, `@monthly` (and
/// `@yearly`). The parser's reason is in the message.
pub(crate) fn parse_cron(text: &str) -> Result<croner::Cron, FieldError> {
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .build()
        .parse(text.trim())
        .map_err(|e| {
            FieldError::new(
                "invalid_cron",
                "cron",
                format!(
                    "cron `{}` is not a valid cron expression: {}",
                    crate::job::quote(text),
                    crate::job::quote(&e.to_string())
                ),
            )
        })
}

/// Parses an IANA time zone name.
pub(crate) fn parse_timezone(name: &str) -> Result<Tz, FieldError> {
    Tz::from_str(name).map_err(|_| {
        FieldError::new(
            "invalid_timezone",
            "timezone",
            format!(
                "timezone `{}` is not an IANA time zone name (e.g. Europe/Berlin)",
                crate::job::quote(name)
            ),
        )
    })
}

/// The fire-time rule of a schedule.
#[derive(Debug, Clone)]
pub enum Rule {
    /// A cron expression on the wall clock of a zone.
    Cron(Box<croner::Cron>, Tz),
    /// Every `every_ms` after `anchor` (ms).
    Every {
        /// The interval.
        every_ms: i64,
        /// Fire times are anchor + k * every, k >= 1.
        anchor: i64,
    },
}

/// The fire times due at a firing, as the schedule's catch-up rule picks
/// them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Due {
    /// Fire times to create a job for, oldest first.
    pub fire: Vec<i64>,
    /// Fire times passed over (missed and not caught up), oldest first, at
    /// most the newest 10.
    pub skipped: Vec<i64>,
    /// The next fire time after them; None once the schedule has ended.
    pub next: Option<i64>,
}

impl ScheduleSpec {
    /// Whether `other` is the same schedule (its template compared as
    /// [`JobSpec::same_content`] compares jobs).
    pub(crate) fn same_content(&self, other: &ScheduleSpec) -> bool {
        self.timing == other.timing
            && self.overlap == other.overlap
            && self.job.same_content(&other.job)
    }
}

impl Timing {
    /// The rule of this schedule; `anchor` is its creation time (the
    /// anchor of `every` when there is no `start_at`).
    pub fn rule(&self, anchor: i64) -> Result<Rule, FieldError> {
        match (&self.cron, self.every_ms) {
            (Some(cron), _) => Ok(Rule::Cron(
                Box::new(parse_cron(cron)?),
                parse_timezone(&self.timezone)?,
            )),
            (None, Some(every)) => Ok(Rule::Every {
                every_ms: every as i64,
                anchor: self.start_at.unwrap_or(anchor),
            }),
            (None, None) => Err(FieldError::new(
                "missing_field",
                "cron",
                "a schedule needs cron or every",
            )),
        }
    }

    /// The first fire time strictly after `after_ms`, none before
    /// `start_at` or after `end_at` (None: the schedule has ended).
    pub fn next_after(&self, rule: &Rule, after_ms: i64) -> Option<i64> {
        let after = match self.start_at {
            Some(start) => after_ms.max(start - 1),
            None => after_ms,
        };
        // Strictly later, whatever the rule: the firing loops rely on it.
        let next = rule.next_after(after).filter(|&next| next > after)?;
        match self.end_at {
            Some(end) if next > end => None,
            _ => Some(next),
        }
    }

    /// The first fire time strictly after `now_ms` of a schedule whose
    /// rule is anchored at `anchor`, or the refusal of a schedule that can
    /// never fire: naming `cron` when its expression matches no time after
    /// now (the 30th of February, a year past), else `end_at` when its
    /// window closes before its first fire time (an `every` longer than the
    /// window, or an `end_at` already past).
    pub(crate) fn first_fire(&self, anchor: i64, now_ms: i64) -> Result<i64, FieldError> {
        let rule = self.rule(anchor)?;
        if let Some(next) = self.next_after(&rule, now_ms) {
            return Ok(next);
        }
        let from = self.start_at.map_or(now_ms, |start| now_ms.max(start - 1));
        match (&rule, rule.next_after(from), self.end_at) {
            (_, Some(first), Some(end)) => Err(FieldError::new(
                "never_fires",
                "end_at",
                format!(
                    "end_at {} is before the first fire time {}: this schedule would never fire",
                    crate::job::format_ms(end),
                    crate::job::format_ms(first)
                ),
            )),
            (Rule::Cron(..), _, _) => Err(FieldError::new(
                "never_fires",
                "cron",
                "cron matches no time from now on (e.g. a day its month does not have): this schedule would never fire",
            )),
            _ => Err(FieldError::new(
                "never_fires",
                "every",
                "every gives no fire time from now on: this schedule would never fire",
            )),
        }
    }

    /// The next `n` fire times strictly after `after_ms`.
    pub(crate) fn next_runs(&self, rule: &Rule, after_ms: i64, n: usize) -> Vec<i64> {
        let mut runs = Vec::with_capacity(n);
        let mut at = after_ms;
        while runs.len() < n {
            match self.next_after(rule, at) {
                Some(next) => {
                    runs.push(next);
                    at = next;
                }
                None => break,
            }
        }
        runs
    }

    /// The fire times due at `now_ms` for a schedule whose next fire time
    /// is `first` (due: `first <= now_ms`). A time due less than
    /// [`ON_TIME_GRACE_MS`] ago is late, not missed: it fires whatever the
    /// rule (a daemon taking over a dead one's partitions fires every such
    /// time). Older ones were missed while no daemon ran, and the catch-up
    /// rule picks: `all` fires them (the newest [`MAX_CATCH_UP`]), `latest`
    /// the newest of them, `none` none.
    pub(crate) fn due(&self, rule: &Rule, first: i64, now_ms: i64) -> Due {
        let mut times = std::collections::VecDeque::new();
        times.push_back(first);
        let mut at = first;
        let next = loop {
            match self.next_after(rule, at) {
                Some(t) if t <= now_ms => {
                    times.push_back(t);
                    if times.len() > MAX_CATCH_UP {
                        times.pop_front();
                    }
                    at = t;
                }
                other => break other,
            }
        };
        let (missed, late): (Vec<i64>, Vec<i64>) = times
            .into_iter()
            .partition(|t| now_ms - t >= ON_TIME_GRACE_MS);
        let (mut fire, skipped) = match self.catch_up {
            CatchUp::All => (missed, Vec::new()),
            CatchUp::Latest => match missed.split_last() {
                Some((latest, earlier)) => (vec![*latest], earlier.to_vec()),
                None => (Vec::new(), Vec::new()),
            },
            CatchUp::None => (Vec::new(), missed),
        };
        fire.extend(late);
        let skipped = skipped[skipped.len().saturating_sub(10)..].to_vec();
        Due {
            fire,
            skipped,
            next,
        }
    }
}

impl Rule {
    /// The first time of this rule strictly after `after_ms`.
    pub(crate) fn next_after(&self, after_ms: i64) -> Option<i64> {
        match self {
            Rule::Every { every_ms, anchor } => {
                let k = if after_ms < *anchor {
                    1
                } else {
                    (after_ms - anchor) / every_ms + 1
                };
                anchor.checked_add(k.checked_mul(*every_ms)?)
            }
            Rule::Cron(cron, tz) => cron_next(cron, *tz, after_ms),
        }
    }
}

/// The first instant strictly after `after_ms` whose wall time in `tz`
/// matches `cron`. The cron fields are matched on the wall clock (walked as
/// if it were UTC, which has no gaps or repeats), then each matching wall
/// time becomes an instant: a wall time that occurs twice (the clock set
/// back) fires once, at its first occurrence; one that does not occur (the
/// clock set forward) fires at the first instant after the gap.
pub(crate) fn cron_next(cron: &croner::Cron, tz: Tz, after_ms: i64) -> Option<i64> {
    let after = Utc.timestamp_millis_opt(after_ms).single()?;
    let mut wall = after.with_timezone(&tz).naive_local();
    // A wall time is matched at most a few times before it maps past
    // `after` (once more per repeated hour): the bound only stops a
    // pattern that never matches.
    for _ in 0..64 {
        let next_wall = cron
            .find_next_occurrence(&Utc.from_utc_datetime(&wall), false)
            .ok()?
            .naive_utc();
        let at = match tz.from_local_datetime(&next_wall) {
            LocalResult::Single(t) => t.timestamp_millis(),
            LocalResult::Ambiguous(first, _) => first.timestamp_millis(),
            LocalResult::None => gap_end(tz, next_wall)?,
        };
        if at > after_ms {
            return Some(at);
        }
        wall = next_wall;
    }
    None
}

/// The first instant whose wall time in `tz` is after `wall`, a wall time
/// the clock skipped (found by bisection: offsets lie within ±15 h of UTC).
fn gap_end(tz: Tz, wall: NaiveDateTime) -> Option<i64> {
    let as_utc = wall.and_utc().timestamp_millis();
    let local = |ms: i64| {
        Utc.timestamp_millis_opt(ms)
            .single()
            .map(|t| t.with_timezone(&tz).naive_local())
    };
    let (mut early, mut late) = (as_utc - 15 * 3_600_000, as_utc + 15 * 3_600_000);
    if local(early)? >= wall || local(late)? < wall {
        return None;
    }
    while late - early > 1 {
        let mid = early + (late - early) / 2;
        if local(mid)? < wall {
            early = mid;
        } else {
            late = mid;
        }
    }
    Some(late)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_errors_quote_at_most_100_bytes_of_the_input() {
        let long = "x".repeat(10_000);
        let cron = parse_cron(&format!("* * * * * {long}")).expect_err("bad cron");
        let zone = parse_timezone(&long).expect_err("bad zone");
        let overlap = parse_overlap(Some(&long)).expect_err("bad overlap");
        let catch_up = parse_catch_up(Some(&long)).expect_err("bad catch_up");
        for err in [cron, zone, overlap, catch_up] {
            assert!(
                err.message.len() < 400,
                "{}: {}",
                err.message.len(),
                err.message
            );
        }
    }

    fn ms(text: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(text)
            .expect("RFC 3339")
            .timestamp_millis()
    }

    fn cron_rule(expr: &str, tz: &str) -> Rule {
        Rule::Cron(
            Box::new(parse_cron(expr).expect("cron")),
            parse_timezone(tz).expect("tz"),
        )
    }

    #[test]
    fn every_fires_at_anchor_plus_multiples() {
        let rule = Rule::Every {
            every_ms: 1000,
            anchor: 10_500,
        };
        assert_eq!(rule.next_after(0), Some(11_500));
        assert_eq!(rule.next_after(10_500), Some(11_500));
        assert_eq!(rule.next_after(11_499), Some(11_500));
        assert_eq!(rule.next_after(11_500), Some(12_500));
    }

    /// A rule that would not move forward (an interval stored before it was
    /// bounded, wrapped negative) ends the schedule instead of looping.
    #[test]
    fn a_rule_that_does_not_move_forward_ends() {
        let timing: Timing = serde_json::from_value(serde_json::json!({
            "every_ms": u64::MAX - 1,
            "timezone": "UTC",
        }))
        .expect("timing");
        let rule = timing.rule(1_000).expect("rule");
        assert_eq!(timing.next_after(&rule, 5_000), None);
        assert!(timing.next_runs(&rule, 5_000, 5).is_empty());
        let due = timing.due(&rule, 2_000, 5_000);
        assert_eq!(due.next, None);
    }

    #[test]
    fn cron_follows_the_wall_clock_of_its_zone() {
        let daily = cron_rule("0 9 * * *", "Europe/Berlin");
        // 09:00 in Berlin is 08:00 UTC in winter, 07:00 UTC in summer.
        assert_eq!(
            daily.next_after(ms("2026-01-10T12:00:00Z")),
            Some(ms("2026-01-11T08:00:00Z"))
        );
        assert_eq!(
            daily.next_after(ms("2026-07-10T12:00:00Z")),
            Some(ms("2026-07-11T07:00:00Z"))
        );
        let macro_daily = cron_rule("@daily", "UTC");
        assert_eq!(
            macro_daily.next_after(ms("2026-01-10T12:00:00Z")),
            Some(ms("2026-01-11T00:00:00Z"))
        );
        let seconds = cron_rule("*/20 * * * * *", "UTC");
        assert_eq!(
            seconds.next_after(ms("2026-01-10T12:00:05Z")),
            Some(ms("2026-01-10T12:00:20Z"))
        );
        let names = cron_rule("0 0 1 JAN MON", "UTC");
        assert!(names.next_after(ms("2026-01-10T12:00:00Z")).is_some());
    }

    /// Berlin sets its clocks forward on 2026-03-29 (02:00 CET -> 03:00
    /// CEST, at 01:00 UTC): 02:30 does not happen that day and fires once,
    /// at 03:00 CEST; every other day it fires at 02:30.
    #[test]
    fn a_skipped_wall_time_fires_once_after_the_gap() {
        let rule = cron_rule("30 2 * * *", "Europe/Berlin");
        assert_eq!(
            rule.next_after(ms("2026-03-28T12:00:00Z")),
            Some(ms("2026-03-29T01:00:00Z"))
        );
        assert_eq!(
            rule.next_after(ms("2026-03-29T01:00:00Z")),
            Some(ms("2026-03-30T00:30:00Z"))
        );
        // Several skipped wall times map to the same instant: one firing.
        let quarter = cron_rule("*/15 2 * * *", "Europe/Berlin");
        let gap = ms("2026-03-29T01:00:00Z");
        assert_eq!(quarter.next_after(gap - 1), Some(gap));
        assert_eq!(
            quarter.next_after(gap),
            Some(ms("2026-03-30T00:00:00Z")),
            "02:00 CEST of the next day"
        );
    }

    /// Berlin sets its clocks back on 2026-10-25 (03:00 CEST -> 02:00 CET,
    /// at 01:00 UTC): 02:30 happens twice that day and fires once, at its
    /// first occurrence.
    #[test]
    fn a_repeated_wall_time_fires_once() {
        let rule = cron_rule("30 2 * * *", "Europe/Berlin");
        let first = ms("2026-10-25T00:30:00Z"); // 02:30 CEST
        assert_eq!(rule.next_after(ms("2026-10-24T12:00:00Z")), Some(first));
        // Not again at 02:30 CET (01:30 UTC): the next is the next day's.
        assert_eq!(rule.next_after(first), Some(ms("2026-10-26T01:30:00Z")));
        // An hourly cron keeps firing every hour through the change, and
        // fires the repeated hour's :00 once.
        let hourly = cron_rule("0 * * * *", "Europe/Berlin");
        let mut at = ms("2026-10-24T23:30:00Z");
        let mut seen = Vec::new();
        for _ in 0..4 {
            at = hourly.next_after(at).expect("next");
            seen.push(at);
        }
        assert_eq!(
            seen,
            [
                ms("2026-10-25T00:00:00Z"), // 02:00 CEST
                ms("2026-10-25T02:00:00Z"), // 03:00 CET (02:00 CET repeated: not again)
                ms("2026-10-25T03:00:00Z"),
                ms("2026-10-25T04:00:00Z"),
            ]
        );
    }

    #[test]
    fn a_schedule_that_can_never_fire_names_the_field_to_blame() {
        let timing = |cron: Option<&str>, every_ms, start_at, end_at| Timing {
            cron: cron.map(String::from),
            every_ms,
            timezone: "UTC".into(),
            start_at,
            end_at,
            catch_up: CatchUp::Latest,
        };
        let now = ms("2026-03-01T00:00:00Z");
        let blame = |t: Timing| t.first_fire(now, now).map_err(|e| e.field);
        let field = |name: &str| Err(Some(name.to_string()));
        assert_eq!(
            blame(timing(Some("0 0 30 2 *"), None, None, None)),
            field("cron")
        );
        assert_eq!(
            blame(timing(Some("0 0 31 4 *"), None, None, Some(now + 1))),
            field("cron")
        );
        assert_eq!(
            blame(timing(Some("@daily"), None, None, Some(now - 1))),
            field("end_at")
        );
        // A window shorter than one `every` from its start.
        let hour = 3_600_000;
        let short = timing(None, Some(hour as u64), Some(now), Some(now + hour - 1));
        assert_eq!(blame(short), field("end_at"));
        let one = timing(None, Some(hour as u64), Some(now), Some(now + hour));
        assert_eq!(blame(one), Ok(now + hour));
        assert_eq!(
            blame(timing(Some("0 0 29 2 *"), None, None, None)),
            Ok(ms("2028-02-29T00:00:00Z"))
        );
    }

    #[test]
    fn start_and_end_bound_the_fire_times() {
        let spec = Timing {
            cron: None,
            every_ms: Some(60_000),
            timezone: "UTC".into(),
            start_at: Some(1_000_000),
            end_at: Some(1_200_000),
            catch_up: CatchUp::Latest,
        };
        let rule = spec.rule(0).expect("rule");
        assert_eq!(spec.next_after(&rule, 0), Some(1_060_000));
        assert_eq!(
            spec.next_runs(&rule, 0, 5),
            vec![1_060_000, 1_120_000, 1_180_000]
        );
        assert_eq!(spec.next_after(&rule, 1_180_000), None);
    }

    #[test]
    fn catch_up_picks_the_missed_fire_times() {
        let mut spec = Timing {
            cron: None,
            every_ms: Some(60_000),
            timezone: "UTC".into(),
            start_at: None,
            end_at: None,
            catch_up: CatchUp::Latest,
        };
        let rule = spec.rule(0).expect("rule");
        // Late, not missed: times due less than the grace ago fire under
        // every rule (a takeover of a dead daemon's partitions).
        for catch_up in [CatchUp::Latest, CatchUp::None, CatchUp::All] {
            spec.catch_up = catch_up;
            let due = spec.due(&rule, 60_000, 60_050);
            assert_eq!((due.fire, due.next), (vec![60_000], Some(120_000)));
            let second = spec.clone();
            let every_second = Timing {
                every_ms: Some(1000),
                ..second
            };
            let rule = every_second.rule(0).expect("rule");
            let due = every_second.due(&rule, 1000, 5_500);
            assert_eq!(due.fire, vec![1000, 2000, 3000, 4000, 5000]);
        }
        // Five minutes missed.
        let now = 5 * 60_000 + 30_000;
        spec.catch_up = CatchUp::All;
        let due = spec.due(&rule, 60_000, now);
        assert_eq!(due.fire, vec![60_000, 120_000, 180_000, 240_000, 300_000]);
        assert_eq!(due.next, Some(360_000));
        spec.catch_up = CatchUp::Latest;
        let due = spec.due(&rule, 60_000, now);
        assert_eq!(due.fire, vec![300_000]);
        assert_eq!(due.skipped, vec![60_000, 120_000, 180_000, 240_000]);
        spec.catch_up = CatchUp::None;
        let due = spec.due(&rule, 60_000, now);
        assert!(due.fire.is_empty());
        assert_eq!(due.next, Some(360_000));
        // All, after a long outage: the newest 1,000.
        spec.catch_up = CatchUp::All;
        let due = spec.due(&rule, 60_000, 5000 * 60_000);
        assert_eq!(due.fire.len(), MAX_CATCH_UP);
        assert_eq!(due.fire.last(), Some(&(5000 * 60_000)));
    }

    #[test]
    fn fired_job_ids_name_their_schedule() {
        assert_eq!(
            fired_by("nightly:1767225600000"),
            Some(("nightly", 1767225600000))
        );
        assert_eq!(
            fired_by(&job_id("a.b-c", 1767225600001)),
            Some(("a.b-c", 1767225600001))
        );
        // A schedule of another tenant: its internal id, tenant and all.
        assert_eq!(
            fired_by(&job_id("billing/nightly", 1767225600000)),
            Some(("billing/nightly", 1767225600000))
        );
        assert_eq!(fired_by("Bad Tenant/nightly:1767225600000"), None);
        assert_eq!(fired_by("a/b/c:1767225600000"), None);
        assert_eq!(fired_by("order:12345"), None);
        assert_eq!(fired_by("order:abc"), None);
        assert_eq!(fired_by("no-colon"), None);
        assert_eq!(fired_by(":5"), None);
    }

    #[test]
    fn bad_schedules_name_their_field() {
        let config = Config::default();
        let check = |json: &str, field: &str| {
            let input: ScheduleInput = serde_json::from_str(json).expect("parses");
            let err = input.validate(&config).expect_err(json);
            assert_eq!(err.field.as_deref(), Some(field), "{json}: {err:?}");
        };
        let job = r#""job": {"url": "https://a.example/"}"#;
        check(&format!(r#"{{{job}}}"#), "cron");
        check(
            &format!(r#"{{"cron": "* * * * *", "every": "1m", {job}}}"#),
            "cron",
        );
        check(&format!(r#"{{"cron": "61 * * * *", {job}}}"#), "cron");
        check(&format!(r#"{{"every": "500ms", {job}}}"#), "every");
        check(&format!(r#"{{"every": "300000000y", {job}}}"#), "every");
        check(
            &format!(r#"{{"cron": "@daily", "timezone": "Mars/Olympus", {job}}}"#),
            "timezone",
        );
        check(
            &format!(r#"{{"every": "1m", "start_at": 2000, "end_at": 1000, {job}}}"#),
            "end_at",
        );
        check(
            &format!(r#"{{"every": "1m", "overlap": "never", {job}}}"#),
            "overlap",
        );
        check(
            &format!(r#"{{"every": "1m", "catch_up": "some", {job}}}"#),
            "catch_up",
        );
        check(r#"{"every": "1m", "job": {"url": "ftp://a/"}}"#, "job.url");
        check(
            r#"{"every": "1m", "job": {"url": "https://a.example/", "delay": "1m"}}"#,
            "job.delay",
        );
        check(
            r#"{"every": "1m", "job": {"url": "https://a.example/", "id": "x"}}"#,
            "job.id",
        );
        check(r#"{"every": "1m"}"#, "job");
        check(
            r#"{"id": "a:b", "every": "1m", "job": {"url": "https://a.example/"}}"#,
            "id",
        );
    }
}
