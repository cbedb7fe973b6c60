//! What a client sends, [`JobInput`], and its validation into a
//! [`ValidJob`]: every field checked in order, the first refusal a
//! [`FieldError`] naming the field, and the [`NewJob`] the enqueue script
//! takes.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{
    default_topic, parse_delay, parse_retry, parse_run_at, parse_timeout, quote, validate_body,
    validate_headers, validate_id, validate_ordering_key, validate_topic, validate_url, JobSpec,
    Method,
};
use crate::config::Config;

/// A refused input: a machine code, a sentence, and the JSON path of the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FieldError {
    /// Machine-readable code, e.g. `invalid_url`.
    pub code: &'static str,
    /// Human sentence.
    pub message: String,
    /// JSON path of the offending field, if one.
    pub field: Option<String>,
}

impl FieldError {
    /// A refusal of `field` with `code` and `message`.
    pub(crate) fn new(code: &'static str, field: &str, message: impl Into<String>) -> Self {
        FieldError {
            code,
            message: message.into(),
            field: Some(field.to_string()),
        }
    }
}

/// `run_at` as a client may send it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RunAt {
    /// Epoch milliseconds.
    Millis(i64),
    /// RFC 3339 timestamp.
    Text(String),
}

/// A job as a client sends it (`POST /v1/jobs`, `hookq enqueue`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobInput {
    /// Client-chosen id; a ULID is generated when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The tenant it belongs to (SPEC §15), default `default`; the API
    /// fills in a bound key's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Grouping, default `default`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Target URL (required).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `POST`, `PUT` or `PATCH`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Extra headers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    /// JSON body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<Box<RawValue>>,
    /// Verbatim text body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_text: Option<String>,
    /// Content type of `body_text`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// Absolute due time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_at: Option<RunAt>,
    /// Relative due time (humantime).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<String>,
    /// Retry ladder override (humantime list).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry: Option<Vec<String>>,
    /// Attempt timeout (humantime).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Ordering key: jobs of one topic sharing it are attempted one at a
    /// time, in order of creation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
}

/// When a job is due, as the store should compute it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// At this epoch millisecond.
    At(i64),
    /// This many ms after Redis's clock reads the enqueue.
    After(u64),
}

/// A job to create, as the enqueue script takes it.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// Job id.
    pub id: String,
    /// Canonical spec JSON.
    pub spec_json: String,
    /// [`JobSpec::given_due`]: the due time as given, kept in the record's
    /// header (the stored spec JSON leaves it out).
    pub given: u64,
    /// Due time.
    pub due: Due,
    /// Attempts allowed in total.
    pub max_attempts: u32,
    /// The job's own lease, when its timeout differs from the default.
    pub lease_ms: Option<u64>,
    /// Its ordering list ([`JobSpec::ordering_list`]), if any.
    pub order: Option<String>,
}

/// A job that passed validation and is ready to be stored.
#[derive(Debug, Clone)]
pub struct ValidJob {
    /// The internal id ([`crate::tenant::internal_id`] of its tenant and
    /// the id given or generated).
    pub id: String,
    /// The content.
    pub spec: JobSpec,
    /// Its due time.
    pub due: Due,
}

impl ValidJob {
    /// The store's view of this job for the enqueue script.
    pub fn new_job(&self, config: &Config) -> NewJob {
        NewJob {
            id: self.id.clone(),
            spec_json: self.spec.stored_json(),
            given: self.spec.given_due(),
            due: self.due,
            max_attempts: self.spec.max_attempts(config),
            order: self.spec.ordering_list(),
            lease_ms: self
                .spec
                .timeout_ms
                .map(|t| config.lease_for(Duration::from_millis(t)).as_millis() as u64),
        }
    }
}

impl JobInput {
    /// Validates every field and builds the job to store; `id` is generated
    /// when absent.
    pub fn validate(self, config: &Config) -> Result<ValidJob, FieldError> {
        let id = self.valid_id()?;
        let tenant = self
            .tenant
            .as_deref()
            .unwrap_or(crate::tenant::DEFAULT_TENANT);
        crate::job::validate_tenant(tenant, "tenant")?;
        let id = crate::tenant::internal_id(tenant, &id);
        let topic = self.topic.clone().unwrap_or_else(default_topic);
        validate_topic(&topic)?;
        let url = self.valid_url()?;
        let method = parse_method(self.method.as_deref())?;
        let headers = self.headers.clone().unwrap_or_default();
        validate_headers(&headers)?;
        validate_body(&self, config)?;
        let timing = self.valid_timing(config)?;
        if let Some(key) = &self.ordering_key {
            validate_ordering_key(key)?;
        }
        let due = timing.due();
        let spec = JobSpec {
            topic,
            url,
            method,
            headers,
            body: self.body,
            body_text: self.body_text,
            content_type: self.content_type,
            run_at: timing.run_at,
            delay_ms: timing.delay_ms,
            retry_ms: timing.retry_ms,
            timeout_ms: timing.timeout_ms,
            ordering_key: self.ordering_key,
            schedule_id: None,
            trace: None,
        };
        Ok(ValidJob { id, spec, due })
    }

    /// The job's id: the one given, validated, or a new ULID.
    fn valid_id(&self) -> Result<String, FieldError> {
        match &self.id {
            Some(id) => {
                validate_id(id)?;
                Ok(id.clone())
            }
            None => Ok(ulid::Ulid::new().to_string()),
        }
    }

    /// The job's URL, required and validated.
    fn valid_url(&self) -> Result<String, FieldError> {
        let url = self
            .url
            .clone()
            .ok_or_else(|| FieldError::new("missing_field", "url", "url is required"))?;
        validate_url(&url, "url")
    }

    /// The job's timing fields, parsed: `run_at` or `delay` (not both),
    /// `retry` and `timeout`, checked in that order.
    fn valid_timing(&self, config: &Config) -> Result<JobTiming, FieldError> {
        if self.run_at.is_some() && self.delay.is_some() {
            return Err(FieldError::new(
                "conflicting_fields",
                "delay",
                "give either run_at or delay, not both",
            ));
        }
        Ok(JobTiming {
            run_at: self.run_at.as_ref().map(parse_run_at).transpose()?,
            delay_ms: self.delay.as_deref().map(parse_delay).transpose()?,
            retry_ms: self.retry.as_deref().map(parse_retry).transpose()?,
            timeout_ms: self
                .timeout
                .as_deref()
                .map(|t| parse_timeout(t, config))
                .transpose()?,
        })
    }
}

/// A job's `method`: POST when absent, else POST, PUT or PATCH in any case.
fn parse_method(method: Option<&str>) -> Result<Method, FieldError> {
    match method {
        None => Ok(Method::Post),
        Some(m) if m.eq_ignore_ascii_case("POST") => Ok(Method::Post),
        Some(m) if m.eq_ignore_ascii_case("PUT") => Ok(Method::Put),
        Some(m) if m.eq_ignore_ascii_case("PATCH") => Ok(Method::Patch),
        Some(m) => Err(FieldError::new(
            "invalid_method",
            "method",
            format!("method `{}` is not POST, PUT or PATCH", quote(m)),
        )),
    }
}

/// A job's timing fields, validated ([`JobInput::validate`]).
struct JobTiming {
    /// `run_at`, epoch ms.
    run_at: Option<i64>,
    /// `delay`, ms.
    delay_ms: Option<u64>,
    /// `retry`, the ladder in ms.
    retry_ms: Option<Vec<u64>>,
    /// `timeout`, ms.
    timeout_ms: Option<u64>,
}

impl JobTiming {
    /// When the job is due: at `run_at`, else after `delay`, else now.
    fn due(&self) -> Due {
        match (self.run_at, self.delay_ms) {
            (Some(at), _) => Due::At(at),
            (None, Some(d)) => Due::After(d),
            (None, None) => Due::After(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::testing::input;

    #[test]
    fn minimal_job_gets_defaults_and_an_id() {
        let job = input(r#"{"url":"https://example.com/hook"}"#).expect("valid");
        assert_eq!(job.id.len(), 26);
        assert_eq!(job.spec.topic, "default");
        assert_eq!(job.due, Due::After(0));
        assert_eq!(job.spec.to_json(), r#"{"url":"https://example.com/hook"}"#);
    }

    #[test]
    fn due_times() {
        let at =
            input(r#"{"url":"http://a.example/","run_at":"2030-01-01T00:00:00Z"}"#).expect("valid");
        assert_eq!(at.due, Due::At(1_893_456_000_000));
        let ms = input(r#"{"url":"http://a.example/","run_at":1893456000000}"#).expect("valid");
        assert_eq!(ms.due, Due::At(1_893_456_000_000));
        let d = input(r#"{"url":"http://a.example/","delay":"1h 30m"}"#).expect("valid");
        assert_eq!(d.due, Due::After(5_400_000));
        let year = input(r#"{"url":"http://a.example/","delay":"365d"}"#).expect("valid");
        assert_eq!(year.due, Due::After(365 * 86_400_000));
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (r#"{}"#, "url"),
            (r#"{"url":"ftp://a.example/"}"#, "url"),
            (r#"{"url":"/relative"}"#, "url"),
            (r#"{"url":"http://a.example/","id":"has space"}"#, "id"),
            (r#"{"url":"http://a.example/","topic":"a/b"}"#, "topic"),
            (r#"{"url":"http://a.example/","method":"GET"}"#, "method"),
            (r#"{"url":"http://a.example/","delay":"soon"}"#, "delay"),
            (
                r#"{"url":"http://a.example/","delay":"1s","run_at":1}"#,
                "delay",
            ),
            (r#"{"url":"http://a.example/","run_at":-5}"#, "run_at"),
            (
                r#"{"url":"http://a.example/","run_at":"tomorrow"}"#,
                "run_at",
            ),
            (
                r#"{"url":"http://a.example/","retry":["1s","0s"]}"#,
                "retry[1]",
            ),
            (r#"{"url":"http://a.example/","timeout":"2h"}"#, "timeout"),
            (
                r#"{"url":"http://a.example/","headers":{"Webhook-Signature":"x"}}"#,
                "headers.Webhook-Signature",
            ),
            (
                r#"{"url":"http://a.example/","headers":{"connection":"close"}}"#,
                "headers.connection",
            ),
            (
                r#"{"url":"http://a.example/","headers":{"x-a":"line\nbreak"}}"#,
                "headers.x-a",
            ),
            (
                r#"{"url":"http://a.example/","headers":{"x-b":"caf\u00e9"}}"#,
                "headers.x-b",
            ),
            (
                r#"{"url":"http://a.example/","body":1,"body_text":"x"}"#,
                "body_text",
            ),
            (
                r#"{"url":"http://a.example/","content_type":"text/xml"}"#,
                "content_type",
            ),
        ];
        for (json, field) in cases {
            let err = input(json).expect_err(json);
            assert_eq!(err.field.as_deref(), Some(field), "{json}: {err:?}");
        }
    }
}
