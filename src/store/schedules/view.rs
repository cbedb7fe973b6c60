//! How a schedule read from Redis is shown: the view the API answers and
//! `hookq schedules show` prints, with its next fire times and last runs.

use serde::Serialize;

use super::ScheduleRecord;
use crate::job::{format_duration_ms, format_ms};
use crate::schedule::{job_id, CatchUp, Overlap};

/// Fire times a view lists ahead.
const NEXT_RUNS: usize = 5;

/// One recorded fire time, as a view shows it.
#[derive(Debug, Serialize)]
pub(crate) struct RunView {
    /// The fire time.
    pub at: String,
    /// The job it fired (or would have).
    pub job_id: String,
    /// `fired` or `skipped`.
    pub outcome: &'static str,
}

/// A schedule as the API and `hookq schedules show` present it.
#[derive(Debug, Serialize)]
pub(crate) struct ScheduleView {
    /// Its id within its tenant.
    pub id: String,
    /// Its tenant.
    pub tenant: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// Its cron expression.
    pub cron: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// Its interval.
    pub every: Option<String>,
    /// Its time zone.
    pub timezone: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// No fire time before.
    pub start_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// No fire time after.
    pub end_at: Option<String>,
    /// Overlap rule.
    pub overlap: Overlap,
    /// Catch-up rule.
    pub catch_up: CatchUp,
    /// `active`, `paused` or `ended`.
    pub state: &'static str,
    /// The next fire times.
    pub next_runs: Vec<String>,
    /// The last runs, newest first.
    pub last_runs: Vec<RunView>,
    /// The job template (header values redacted).
    pub job: serde_json::Value,
    /// Created.
    pub created_at: String,
    /// Last changed.
    pub updated_at: String,
}

impl ScheduleView {
    /// When it fires, in words: `cron <expr> (<zone>)` or `every <interval>`.
    pub(crate) fn when(&self) -> String {
        match (&self.cron, &self.every) {
            (Some(cron), _) => format!("cron {cron} ({})", self.timezone),
            (None, Some(every)) => format!("every {every}"),
            _ => "-".into(),
        }
    }
}

impl ScheduleRecord {
    /// This schedule as a listing shows it: its template without `body`
    /// and `body_text` (the schedule's own view has them), so that a
    /// page's answer stays small.
    pub(super) fn listed(mut self) -> ScheduleRecord {
        self.spec.job.body = None;
        self.spec.job.body_text = None;
        self
    }

    /// The API view of this schedule.
    pub(crate) fn view(self) -> ScheduleView {
        let record = self;
        let spec = &record.spec;
        let state = if record.paused {
            "paused"
        } else if record.next.is_none() {
            "ended"
        } else {
            "active"
        };
        let next_runs = match (spec.timing.rule(record.anchor), state, record.next) {
            (Ok(rule), "active", Some(next)) => std::iter::once(next)
                .chain(spec.timing.next_runs(&rule, next, NEXT_RUNS - 1))
                .collect(),
            // What it would fire once resumed (fire times while paused are
            // skipped).
            (Ok(rule), "paused", _) => {
                spec.timing
                    .next_runs(&rule, crate::job::now_ms(), NEXT_RUNS)
            }
            _ => Vec::new(),
        };
        ScheduleView {
            cron: spec.timing.cron.clone(),
            every: spec.timing.every_ms.map(format_duration_ms),
            timezone: spec.timing.timezone.clone(),
            start_at: spec.timing.start_at.map(format_ms),
            end_at: spec.timing.end_at.map(format_ms),
            overlap: spec.overlap,
            catch_up: spec.timing.catch_up,
            state,
            next_runs: next_runs.into_iter().map(format_ms).collect(),
            last_runs: record
                .last_runs
                .iter()
                .map(|run| RunView {
                    at: format_ms(run.at),
                    job_id: crate::tenant::external_id(&job_id(&record.id, run.at)).to_string(),
                    outcome: if run.fired { "fired" } else { "skipped" },
                })
                .collect(),
            job: spec.job.to_shown_json(),
            created_at: format_ms(record.created),
            updated_at: format_ms(record.updated),
            tenant: crate::tenant::tenant_of(&record.id).to_string(),
            id: crate::tenant::external_id(&record.id).to_string(),
        }
    }
}
