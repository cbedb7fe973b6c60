//! The stored content of a job, [`JobSpec`] (canonical JSON in the job
//! hash's `job` field): how it is stored and compared, what an attempt
//! sends, and the ladder, attempts and timeout that apply to it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::identity::BodyIdentity;
use super::{format_duration_ms, format_ms, shown_url, JobInput, RunAt, TraceContext, REDACTED};
use crate::config::Config;

/// Topic given to jobs that name none.
pub(crate) const DEFAULT_TOPIC: &str = "default";

/// HTTP method of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Method {
    /// `POST` (the default).
    #[default]
    #[serde(rename = "POST")]
    Post,
    /// `PUT`.
    #[serde(rename = "PUT")]
    Put,
    /// `PATCH`.
    #[serde(rename = "PATCH")]
    Patch,
}

impl Method {
    fn is_post(&self) -> bool {
        *self == Method::Post
    }

    /// The name as the API spells it (`POST`, `PUT`, `PATCH`).
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
        }
    }

    /// The method for reqwest.
    pub(crate) fn as_http(&self) -> reqwest::Method {
        match self {
            Method::Post => reqwest::Method::POST,
            Method::Put => reqwest::Method::PUT,
            Method::Patch => reqwest::Method::PATCH,
        }
    }
}

/// `given` flag of a due time given as `delay` (see [`JobSpec::given_due`]).
pub const GIVEN_DELAY: u64 = 1 << 47;
/// `given` of a job created with neither `run_at` nor `delay` (due now).
pub(crate) const GIVEN_NEITHER: u64 = 1 << 46;

/// The stored content of a job (everything but its id and its live state).
/// Serialized compactly, defaults omitted. When a job is created again with
/// the same id, the store compares the JSON byte for byte (the fast path) and
/// then [`JobSpec::same_content`] decides (the same JSON value of `body`,
/// however it was spelled).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobSpec {
    /// Grouping for filters, metrics and replay.
    #[serde(default = "default_topic", skip_serializing_if = "is_default_topic")]
    pub topic: String,
    /// Where attempts are sent.
    pub url: String,
    /// HTTP method of attempts.
    #[serde(default, skip_serializing_if = "Method::is_post")]
    pub method: Method,
    /// Extra request headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// JSON body, exactly as the client sent it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Box<RawValue>>,
    /// Verbatim text body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_text: Option<String>,
    /// Content type of `body_text`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// Absolute due time as given (epoch ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_at: Option<i64>,
    /// Relative due time as given (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// The job's own retry ladder (ms), overriding the configured one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_ms: Option<Vec<u64>>,
    /// The job's own attempt timeout (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Jobs of the same topic and ordering key are attempted one at a time,
    /// in order of creation (SPEC §11.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    /// The schedule that fired this job (SPEC §12), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_id: Option<String>,
    /// The W3C trace context of the request that created the job (not
    /// content: a re-create with another one is the same job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceContext>,
}

pub(super) fn default_topic() -> String {
    DEFAULT_TOPIC.to_string()
}

fn is_default_topic(t: &String) -> bool {
    t == DEFAULT_TOPIC
}

impl JobSpec {
    /// The JSON a record stores: the canonical JSON without `run_at` and
    /// `delay_ms`, which the record's header keeps as [`JobSpec::given_due`].
    pub(crate) fn stored_json(&self) -> String {
        JobSpec {
            run_at: None,
            delay_ms: None,
            ..self.clone()
        }
        .to_json()
    }

    /// The due time as given (`run_at`, `delay_ms` or neither), packed as the
    /// record header's `given` field: `run_at` ms, 2^47 + `delay_ms`, or
    /// 2^46 for neither.
    pub(crate) fn given_due(&self) -> u64 {
        match (self.run_at, self.delay_ms) {
            (Some(ms), _) => ms.max(0) as u64,
            (None, Some(ms)) => GIVEN_DELAY | ms,
            (None, None) => GIVEN_NEITHER,
        }
    }

    /// Restores `run_at` and `delay_ms` from a record header's `given`
    /// field, where a stored spec leaves them out.
    pub(crate) fn restore_given(&mut self, given: u64) {
        if self.run_at.is_some() || self.delay_ms.is_some() || given == GIVEN_NEITHER {
            return;
        }
        if given & GIVEN_DELAY != 0 {
            self.delay_ms = Some(given & !GIVEN_DELAY);
        } else if given & GIVEN_NEITHER == 0 {
            self.run_at = Some(given as i64);
        }
    }

    /// The canonical JSON (every field).
    pub(crate) fn to_json(&self) -> String {
        // A struct of strings, numbers and already-valid raw JSON cannot fail to serialize.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether `other` means the same job: every field equal, and `body` the
    /// same JSON value whatever its whitespace or key order, numbers
    /// compared exactly ([`BodyIdentity`]; a body that is not JSON only
    /// equals itself byte for byte; `body_text` is compared byte for byte,
    /// as it is sent).
    pub(crate) fn same_content(&self, other: &JobSpec) -> bool {
        let body_value = |spec: &JobSpec| {
            spec.body
                .as_ref()
                .map(|raw| BodyIdentity::of(raw.get()).ok_or_else(|| raw.get().to_string()))
        };
        self.topic == other.topic
            && self.url == other.url
            && self.method == other.method
            && self.headers == other.headers
            && self.body_text == other.body_text
            && self.content_type == other.content_type
            && self.run_at == other.run_at
            && self.delay_ms == other.delay_ms
            && self.retry_ms == other.retry_ms
            && self.timeout_ms == other.timeout_ms
            && self.ordering_key == other.ordering_key
            && self.schedule_id == other.schedule_id
            && body_value(self) == body_value(other)
    }

    /// What a finished job's summary keeps of its spec: the topic alone.
    pub(crate) fn summary_of(topic: String) -> JobSpec {
        JobSpec {
            topic,
            url: String::new(),
            method: Method::default(),
            headers: BTreeMap::new(),
            body: None,
            body_text: None,
            content_type: None,
            run_at: None,
            delay_ms: None,
            retry_ms: None,
            timeout_ms: None,
            ordering_key: None,
            schedule_id: None,
            trace: None,
        }
    }

    /// An 8-byte digest of the content, equal for two specs exactly when
    /// [`JobSpec::same_content`] holds but for the due time (up to SHA-1
    /// collisions): the SHA-1 of the spec as a JSON value (object keys
    /// sorted, `body` parsed), without `run_at` and `delay_ms`, followed,
    /// when the body has numbers a JSON value cannot hold exactly, by
    /// those numbers ([`BodyIdentity`]; a body that is not JSON, by its
    /// text). A finished job's summary keeps it in place of the spec, so
    /// an identical re-create is still known as one (a finished job's due
    /// time is no longer compared).
    pub(crate) fn content_digest(&self) -> [u8; 8] {
        use sha1::Digest;
        let undated = JobSpec {
            run_at: None,
            delay_ms: None,
            trace: None,
            body: None,
            ..self.clone()
        };
        let mut value = serde_json::to_value(&undated).unwrap_or_default();
        let mut text = String::new();
        if let (Some(raw), Some(fields)) = (&self.body, value.as_object_mut()) {
            match BodyIdentity::of(raw.get()) {
                Some(body) => {
                    if let Some(exact) = body.exact_json() {
                        // JSON text never holds a raw NUL: no collision.
                        text = format!("\0{exact}");
                    }
                    fields.insert("body".into(), body.value);
                }
                None => text = format!("\0\0{}", raw.get()),
            }
        }
        let text = format!("{value}{text}");
        let digest = sha1::Sha1::digest(text.as_bytes());
        let mut out = [0u8; 8];
        out.copy_from_slice(&digest[..8]);
        out
    }

    /// The spec as the input a client could have sent for it (`run_at` in
    /// epoch ms, durations in humantime), so that a merged change goes
    /// through the very same validation as a create.
    pub(crate) fn to_input(&self, id: Option<String>) -> JobInput {
        let durations = |ms: &[u64]| ms.iter().map(|ms| format_duration_ms(*ms)).collect();
        JobInput {
            id,
            tenant: None,
            topic: Some(self.topic.clone()),
            url: Some(self.url.clone()),
            method: Some(self.method.as_str().to_string()),
            headers: (!self.headers.is_empty()).then(|| self.headers.clone()),
            body: self.body.clone(),
            body_text: self.body_text.clone(),
            content_type: self.content_type.clone(),
            run_at: self.run_at.map(RunAt::Millis),
            delay: self.delay_ms.map(format_duration_ms),
            retry: self.retry_ms.as_deref().map(durations),
            timeout: self.timeout_ms.map(format_duration_ms),
            ordering_key: self.ordering_key.clone(),
        }
    }

    /// The spec as a client would write it, with `run_at` in RFC 3339,
    /// header values [`REDACTED`] and URL credentials masked
    /// ([`shown_url`]): what a dead letter and a schedule's template show.
    pub(crate) fn to_shown_json(&self) -> serde_json::Value {
        let mut input = self.to_input(None);
        input.url = input.url.as_deref().map(shown_url);
        input.run_at = self.run_at.map(|ms| RunAt::Text(format_ms(ms)));
        if let Some(headers) = &mut input.headers {
            headers.values_mut().for_each(|v| *v = REDACTED.to_string());
        }
        serde_json::to_value(input).unwrap_or(serde_json::Value::Null)
    }

    /// The request body of an attempt and its content type.
    pub(crate) fn payload(&self) -> (&[u8], &str) {
        match (&self.body, &self.body_text) {
            (Some(raw), _) => (raw.get().as_bytes(), "application/json"),
            (None, Some(text)) => (
                text.as_bytes(),
                self.content_type
                    .as_deref()
                    .unwrap_or("text/plain; charset=utf-8"),
            ),
            (None, None) => (b"", "application/json"),
        }
    }

    /// The ordering list the job belongs to, `<topic>:<ordering key>`
    /// (ordering keys are per topic), or None without an ordering key.
    /// Keys are per tenant too: the list's Redis key names the job's line,
    /// [`crate::tenant::order_line`] of its internal id and this list.
    pub(crate) fn ordering_list(&self) -> Option<String> {
        let key = self.ordering_key.as_ref()?;
        Some(format!("{}:{key}", self.topic))
    }

    /// The retry ladder that applies to this job.
    pub(crate) fn ladder(&self, config: &Config) -> Vec<Duration> {
        match &self.retry_ms {
            Some(ms) => ms.iter().map(|m| Duration::from_millis(*m)).collect(),
            None => config.delivery.retry.clone(),
        }
    }

    /// Attempts allowed in total: one plus a rung per retry.
    pub(crate) fn max_attempts(&self, config: &Config) -> u32 {
        let rungs = self
            .retry_ms
            .as_ref()
            .map_or(config.delivery.retry.len(), Vec::len);
        rungs as u32 + 1
    }

    /// The attempt timeout that applies to this job.
    pub(crate) fn timeout(&self, config: &Config) -> Duration {
        self.timeout_ms
            .map_or(config.delivery.timeout, Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::testing::input;
    use crate::job::TraceContext;

    #[test]
    fn body_is_kept_verbatim() {
        let job =
            input(r#"{"url":"http://a.example/","body": {"b":1, "a":[1,2]}}"#).expect("valid");
        assert_eq!(job.spec.payload().0, br#"{"b":1, "a":[1,2]}"#);
        let text = input(r#"{"url":"http://a.example/","body_text":"a=1&b=2","content_type":"application/x-www-form-urlencoded"}"#)
            .expect("valid");
        assert_eq!(
            text.spec.payload(),
            (&b"a=1&b=2"[..], "application/x-www-form-urlencoded")
        );
    }

    /// `same_content` and the digest that stands for it once a job is a
    /// summary agree: spelling does not matter, values do.
    #[test]
    fn same_content_and_its_digest_ignore_json_spelling_but_not_values() {
        let spec = |json: &str| input(json).expect("valid").spec;
        let a = spec(r#"{"url":"https://a.example/","body":{"a": 1, "b": [1, 2]},"delay":"1h"}"#);
        let respelled =
            spec(r#"{"delay":"1h","body":{"b":[1,2],"a":1},"url":"https://a.example/"}"#);
        assert!(a.same_content(&respelled));
        assert_eq!(a.content_digest(), respelled.content_digest());
        for other in [
            r#"{"url":"https://a.example/","body":{"a": 2, "b": [1, 2]},"delay":"1h"}"#,
            r#"{"url":"https://a.example/","body":{"a": 1, "b": [2, 1]},"delay":"1h"}"#,
            r#"{"url":"https://b.example/","body":{"a": 1, "b": [1, 2]},"delay":"1h"}"#,
            r#"{"url":"https://a.example/","body_text":"{\"a\": 1, \"b\": [1, 2]}","delay":"1h"}"#,
            r#"{"topic":"t","url":"https://a.example/","body":{"a": 1, "b": [1, 2]},"delay":"1h"}"#,
        ] {
            assert!(!a.same_content(&spec(other)), "{other}");
            assert_ne!(a.content_digest(), spec(other).content_digest(), "{other}");
        }
        // The due time is content while a job lives; its digest leaves it
        // out (a finished job's due time is history).
        let later =
            spec(r#"{"url":"https://a.example/","body":{"a": 1, "b": [1, 2]},"delay":"2h"}"#);
        assert!(!a.same_content(&later));
        assert_eq!(a.content_digest(), later.content_digest());
        let text = spec(r#"{"url":"https://a.example/","body_text":"a=1&b=2"}"#);
        let spaced = spec(r#"{"url":"https://a.example/","body_text":"a=1& b=2"}"#);
        assert!(!text.same_content(&spaced));
    }

    /// Numbers are compared exactly: 2^64 and 2^64 + 1 differ, as do
    /// bodies with numbers past an f64's precision; the digest agrees, and
    /// for a body of ordinary numbers it is the digest summaries stored
    /// before (the spec as one JSON value).
    #[test]
    fn numbers_are_content_to_the_last_digit() {
        let spec = |json: &str| input(json).expect("valid").spec;
        let a = spec(r#"{"url":"https://a.example/","body":{"n":18446744073709551616,"x":1}}"#);
        let b = spec(r#"{"url":"https://a.example/","body":{"n":18446744073709551617,"x":1}}"#);
        let a_again =
            spec(r#"{"url":"https://a.example/","body":{"x":1, "n":18446744073709551616}}"#);
        assert!(!a.same_content(&b));
        assert_ne!(a.content_digest(), b.content_digest());
        assert!(a.same_content(&a_again));
        assert_eq!(a.content_digest(), a_again.content_digest());
        let plain =
            spec(r#"{"url":"https://a.example/","topic":"t","body":{"b":[0.5,-3],"a":"x"}}"#);
        let undated = JobSpec {
            run_at: None,
            delay_ms: None,
            trace: None,
            ..plain.clone()
        };
        use sha1::Digest;
        let before = sha1::Sha1::digest(
            serde_json::to_value(&undated)
                .expect("value")
                .to_string()
                .as_bytes(),
        );
        assert_eq!(plain.content_digest()[..], before[..8]);
    }

    #[test]
    fn the_given_due_time_leaves_the_stored_json_for_the_header() {
        let spec = |json: &str| input(json).expect("valid").spec;
        for json in [
            r#"{"url":"https://a.example/","delay":"90s"}"#,
            r#"{"url":"https://a.example/","run_at":1893456000000}"#,
            r#"{"url":"https://a.example/"}"#,
            r#"{"url":"https://a.example/","delay":"0s"}"#,
        ] {
            let given = spec(json);
            let stored = given.stored_json();
            assert!(
                !stored.contains("run_at") && !stored.contains("delay"),
                "{stored}"
            );
            let mut read: JobSpec = serde_json::from_str(&stored).expect("stored JSON");
            read.restore_given(given.given_due());
            assert_eq!(
                (read.run_at, read.delay_ms),
                (given.run_at, given.delay_ms),
                "{json}"
            );
        }
        // The digest leaves the due time out too: a finished job's is history.
        let later = spec(r#"{"url":"https://a.example/","delay":"2h"}"#);
        let sooner = spec(r#"{"url":"https://a.example/","delay":"1h"}"#);
        assert_eq!(later.content_digest(), sooner.content_digest());
    }

    /// The trace context is not content: a re-create carrying another one
    /// is the same job, and a summary's digest does not see it.
    #[test]
    fn a_trace_context_is_not_content() {
        let plain = input(r#"{"url":"https://a.example/"}"#)
            .expect("valid")
            .spec;
        let mut traced = plain.clone();
        traced.trace = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            None,
        );
        assert!(plain.same_content(&traced));
        assert_eq!(plain.content_digest(), traced.content_digest());
        let stored: JobSpec = serde_json::from_str(&traced.to_json()).expect("round trip");
        assert_eq!(stored.trace, traced.trace);
    }

    #[test]
    fn the_input_form_shows_times_and_durations_as_a_client_writes_them() {
        let spec = input(
            r#"{"url":"https://a.example/","method":"PUT","run_at":1795415873572,"retry":["1s","1m"],"timeout":"5s","body":{"a":1}}"#,
        )
        .expect("valid")
        .spec;
        let shown = spec.to_shown_json();
        assert_eq!(shown["run_at"], "2026-11-23T06:37:53.572Z");
        assert_eq!(shown["retry"], serde_json::json!(["1s", "1m"]));
        assert_eq!(shown["timeout"], "5s");
        assert_eq!(shown["method"], "PUT");
        assert_eq!(shown["body"], serde_json::json!({"a": 1}));
    }
}
