//! How a job is shown back: its lifecycle [`State`] and the [`JobView`]
//! that `GET /v1/jobs/{id}` and `hookq show` present, header values
//! [`REDACTED`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{format_duration_ms, format_ms, shown_url, trace_id_of, JobSpec, Method, ValidJob};

/// What every view shows in place of a header's value: header values are
/// write-only (they often hold the receiver's credentials); deliveries send
/// them, nothing shows them.
pub(crate) const REDACTED: &str = "[redacted]";

/// Serializes headers as their names, each with the value [`REDACTED`].
fn serialize_redacted<S: serde::Serializer>(
    headers: &BTreeMap<String, String>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(headers.keys().map(|name| (name, REDACTED)))
}

/// Lifecycle states of SPEC §3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Waiting for its due time (also between retries).
    Scheduled,
    /// Due, waiting for a worker.
    Ready,
    /// An attempt is running under a lease.
    Inflight,
    /// An attempt got a 2xx.
    Delivered,
    /// Dead-lettered.
    Dead,
    /// Deleted before completion.
    Cancelled,
}

impl State {
    /// Parses the `state` field of a job hash.
    pub fn parse(s: &str) -> Option<State> {
        Some(match s {
            "scheduled" => State::Scheduled,
            "ready" => State::Ready,
            "inflight" => State::Inflight,
            "delivered" => State::Delivered,
            "dead" => State::Dead,
            "cancelled" => State::Cancelled,
            _ => return None,
        })
    }

    /// The name used in Redis and in the API.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            State::Scheduled => "scheduled",
            State::Ready => "ready",
            State::Inflight => "inflight",
            State::Delivered => "delivered",
            State::Dead => "dead",
            State::Cancelled => "cancelled",
        }
    }
}

/// A job as `GET /v1/jobs/{id}` and `hookq show` present it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct JobView {
    /// Job id within its tenant (the `webhook-id` in the default tenant,
    /// `<tenant>/<id>` in another).
    pub id: String,
    /// The tenant it belongs to.
    pub tenant: String,
    /// Topic.
    pub topic: String,
    /// Target URL, credentials masked ([`shown_url`]; absent from a
    /// finished job's summary).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// HTTP method (absent from a finished job's summary).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<Method>,
    /// Extra headers: shown by name, every value [`REDACTED`].
    #[serde(
        skip_serializing_if = "BTreeMap::is_empty",
        serialize_with = "serialize_redacted"
    )]
    pub headers: BTreeMap<String, String>,
    /// JSON body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<Box<RawValue>>,
    /// Text body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_text: Option<String>,
    /// Content type of the text body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// The job's own retry ladder, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry: Option<Vec<String>>,
    /// The job's own timeout, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Lifecycle state.
    pub state: State,
    /// Attempts started so far.
    pub attempts: u32,
    /// Attempts allowed in total.
    pub max_attempts: u32,
    /// Due time of the next attempt (RFC 3339), while one is pending.
    pub next_attempt_at: Option<String>,
    /// Creation time (RFC 3339).
    pub created_at: String,
    /// Last change (RFC 3339).
    pub updated_at: String,
    /// Most recent attempts first, at most 20 (a summary keeps each one's
    /// start, duration and status or error kind, and the last one's message).
    pub history: Vec<serde_json::Value>,
    /// True when the job finished and only its summary remains (no url,
    /// method, headers or body; `retention.keep_bodies` keeps them).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub summarized: bool,
    /// The trace its attempts belong to (the creator's `traceparent`, or
    /// one of the job's own); absent from a finished job's summary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// Its ordering key, if any (absent from a finished job's summary).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    /// The schedule that fired it, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule_id: Option<String>,
    /// While the job is held back behind earlier jobs of its ordering key:
    /// the id of the job just ahead of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// While held (in the view of the one job): the job that holds its
    /// ordering key, the first of the key's unfinished jobs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
    /// With `held_by`: that job's due time while it waits for it (the key
    /// is held at least until then), null once it is due (ready, in
    /// flight, or parked for its host).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_until: Option<Option<String>>,
}

/// What a job's view shows besides its id and spec.
pub(crate) struct ViewFacts {
    /// Its state.
    pub state: State,
    /// Attempts made.
    pub attempts: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// When it is (or was) due, epoch ms.
    pub due: i64,
    /// When it was created, epoch ms.
    pub created: i64,
    /// When it last changed, epoch ms.
    pub updated: i64,
    /// Its attempt records, newest first, as shown.
    pub history: Vec<serde_json::Value>,
    /// Only a finished job's summary remains (no url, method or trace).
    pub summarized: bool,
    /// Held behind this id of its ordering key.
    pub waiting_for: Option<String>,
    /// The job that holds its ordering key, when read.
    pub held_by: Option<String>,
    /// That job's due time (epoch ms) while it waits for it.
    pub waiting_until: Option<i64>,
}

impl JobView {
    /// The view of job `id` (its internal id) with `spec` and `facts`: its
    /// tenant and the ids it names (its own, the jobs ahead of it, its
    /// schedule) within that tenant.
    pub(crate) fn of(id: String, spec: JobSpec, facts: ViewFacts) -> JobView {
        let summarized = facts.summarized;
        let (tenant, own) = crate::tenant::split_id(&id);
        let external = |internal: String| crate::tenant::external_id(&internal).to_string();
        JobView {
            trace_id: (!summarized).then(|| trace_id_of(&id, spec.trace.as_ref())),
            tenant: tenant.to_string(),
            id: own.to_string(),
            topic: spec.topic,
            url: (!summarized).then(|| shown_url(&spec.url)),
            method: (!summarized).then_some(spec.method),
            headers: spec.headers,
            body: spec.body,
            body_text: spec.body_text,
            content_type: spec.content_type,
            retry: spec
                .retry_ms
                .map(|rungs| rungs.into_iter().map(format_duration_ms).collect()),
            timeout: spec.timeout_ms.map(format_duration_ms),
            state: facts.state,
            attempts: facts.attempts,
            max_attempts: facts.max_attempts,
            next_attempt_at: matches!(facts.state, State::Scheduled | State::Ready)
                .then(|| format_ms(facts.due)),
            created_at: format_ms(facts.created),
            updated_at: format_ms(facts.updated),
            history: facts.history,
            summarized,
            ordering_key: spec.ordering_key,
            schedule_id: spec.schedule_id.map(external),
            waiting_for: facts.waiting_for.map(external),
            waiting_until: facts
                .held_by
                .is_some()
                .then(|| facts.waiting_until.map(format_ms)),
            held_by: facts.held_by.map(external),
        }
    }

    /// The view of `job` as just created: in `state`, due at `due`,
    /// created and last changed `now`, no attempt made, `max_attempts`
    /// allowed, and held behind `waiting_for` when its ordering key has an
    /// earlier job.
    pub(crate) fn created(
        job: ValidJob,
        state: State,
        due: i64,
        now: i64,
        max_attempts: u32,
        waiting_for: Option<String>,
    ) -> JobView {
        let facts = ViewFacts {
            state,
            attempts: 0,
            max_attempts,
            due,
            created: now,
            updated: now,
            history: Vec::new(),
            summarized: false,
            waiting_for,
            held_by: None,
            waiting_until: None,
        };
        JobView::of(job.id, job.spec, facts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::testing::input;
    use crate::job::{trace_id_of, Method};

    /// Header values are write-only: the view and a dead letter's job show
    /// the names only.
    #[test]
    fn views_show_header_names_but_never_values() {
        let spec = input(
            r#"{"url":"https://a.example/","headers":{"Authorization":"Bearer s3cret-token","X-Trace":"t1"}}"#,
        )
        .expect("valid")
        .spec;
        let shown = spec.to_shown_json();
        assert_eq!(
            shown["headers"],
            serde_json::json!({"Authorization": REDACTED, "X-Trace": REDACTED})
        );
        let view = JobView {
            id: "a".into(),
            tenant: "default".into(),
            topic: "t".into(),
            url: Some(spec.url.clone()),
            method: Some(Method::Post),
            headers: spec.headers.clone(),
            body: None,
            body_text: None,
            content_type: None,
            retry: None,
            timeout: None,
            state: State::Scheduled,
            attempts: 0,
            max_attempts: 1,
            next_attempt_at: None,
            created_at: String::new(),
            updated_at: String::new(),
            history: Vec::new(),
            summarized: false,
            trace_id: Some(trace_id_of("a", None)),
            ordering_key: None,
            schedule_id: None,
            waiting_for: None,
            held_by: None,
            waiting_until: None,
        };
        let json = serde_json::to_string(&view).expect("serializes");
        assert!(!json.contains("s3cret") && !json.contains("t1"), "{json}");
        assert!(json.contains(r#""Authorization":"[redacted]""#), "{json}");
        assert_eq!(spec.headers["Authorization"], "Bearer s3cret-token");
    }
}
