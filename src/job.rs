//! The job: what a client sends (`JobInput`), how it is validated into what is
//! stored (`JobSpec`, canonical JSON in the job hash's `job` field) and how it
//! is shown back (`JobView`).
//!
//! Validation is the one gate between the outside world and Redis: every
//! refusal is a [`FieldError`] naming the JSON field, and nothing reaches the
//! store before the whole job has passed.
//!
//! The parts, each in its own file (this module re-exports their items, so
//! callers name them `job::…`):
//! - `input`: [`JobInput`], [`FieldError`], [`ValidJob`], [`NewJob`] and
//!   [`JobInput::validate`], which checks every field in order;
//! - `fields`: the checks of ids, topics, ordering keys, headers and the
//!   body, and how a refusal quotes its input (`quote`);
//! - `urls`: target URLs checked, shown masked, compared and keyed by host;
//! - `times`: durations and times parsed from input and formatted for views;
//! - `spec`: the stored content, [`JobSpec`];
//! - `trace`: the W3C trace context, [`TraceContext`];
//! - `view`: [`State`] and `JobView`, how a job is shown back;
//! - `identity`: a JSON body's identity, numbers compared exactly.

mod fields;
mod identity;
mod input;
mod spec;
mod times;
mod trace;
mod urls;
mod view;

use fields::validate_body;
pub(crate) use fields::{
    cut, is_charset, quote, validate_charset, validate_headers, validate_id, validate_ordering_key,
    validate_tenant, validate_topic, MAX_QUOTE,
};
pub use input::{Due, FieldError, JobInput, NewJob, RunAt, ValidJob};
use spec::default_topic;
pub(crate) use spec::DEFAULT_TOPIC;
pub use spec::{JobSpec, Method, GIVEN_DELAY};
pub use times::now_ms;
pub(crate) use times::{
    format_duration_ms, format_ms, parse_delay, parse_duration, parse_retry, parse_run_at,
    parse_timeout, MAX_AHEAD,
};
pub use trace::TraceContext;
pub(crate) use trace::{attempt_traceparent, trace_id_of};
pub use urls::host_key;
pub(crate) use urls::{same_origin, shown_url, validate_url};
pub use view::State;
pub(crate) use view::{JobView, ViewFacts, REDACTED};

/// Helpers shared by the job modules' tests.
#[cfg(test)]
mod testing {
    use super::*;

    /// `json` as a client sends it, validated against the default config.
    pub(super) fn input(json: &str) -> Result<ValidJob, FieldError> {
        let input: JobInput = serde_json::from_str(json).expect("parses");
        input.validate(&crate::config::Config::default())
    }
}
