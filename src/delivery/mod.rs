//! Delivery: one HTTP attempt of one job, and its classification into an
//! outcome the retry ladder understands. Owns the shared reqwest client
//! (keep-alive, no redirects, SSRF-guarded resolver), the signer, and the
//! attempt record written to the job's history. Touches no Redis state.

pub(crate) mod signing;
pub(crate) mod ssrf;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Serialize;

use crate::config::Config;
use crate::job::JobSpec;
use crate::retry::FailureKind;
use signing::Signer;

use crate::telemetry::Telemetry;
use ssrf::{AddressPolicy, GuardedResolver};

/// Bytes of a response body kept in the attempt history.
pub(crate) const RESPONSE_BODY_CAP: usize = 1024;
/// The `user-agent` of every attempt.
pub(crate) const USER_AGENT: &str = concat!("hookq/", env!("CARGO_PKG_VERSION"));

/// Why an attempt failed, as recorded in the history (`error` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ErrorKind {
    /// The receiver answered a non-2xx status.
    HttpStatus,
    /// The receiver answered a 3xx (redirects are not followed).
    Redirect,
    /// The attempt took longer than its timeout.
    Timeout,
    /// The connection could not be made (refused, reset, DNS, TLS).
    Connect,
    /// The target address is private and the SSRF guard refused it.
    SsrfBlocked,
    /// Any other transport error (bad response, body error).
    Request,
    /// The stored job could not be read.
    InvalidJob,
}

impl ErrorKind {
    /// The snake_case name.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            ErrorKind::HttpStatus => "http_status",
            ErrorKind::Redirect => "redirect",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Connect => "connect",
            ErrorKind::SsrfBlocked => "ssrf_blocked",
            ErrorKind::Request => "request",
            ErrorKind::InvalidJob => "invalid_job",
        }
    }
}

/// What an attempt amounted to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Outcome {
    /// A 2xx: the job is delivered.
    Delivered,
    /// Anything else.
    Failed(FailureKind),
}

/// One attempt as it is kept in the job's history (JSON).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AttemptRecord {
    /// Attempt number (1-based).
    pub attempt: u32,
    /// Start, epoch ms on Redis's clock.
    pub at: i64,
    /// Duration in ms.
    pub duration_ms: u64,
    /// HTTP status, when a response came.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Error kind, when the attempt failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorKind>,
    /// Error message, when the attempt failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `Location` of a 3xx.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// First bytes of the response body (lossy UTF-8).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub response: String,
}

impl AttemptRecord {
    /// `kind: message` for the dead-letter entry's `last_error`.
    pub(crate) fn last_error(&self) -> String {
        match (&self.error, &self.message) {
            (Some(kind), Some(msg)) => format!("{}: {msg}", kind.as_str()),
            (Some(kind), None) => kind.as_str().to_string(),
            _ => String::new(),
        }
    }

    /// The record as JSON.
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The result of one attempt.
#[derive(Debug, Clone)]
pub(crate) struct AttemptReport {
    /// Delivered or how it failed.
    pub outcome: Outcome,
    /// The history record.
    pub record: AttemptRecord,
}

/// Makes attempts. Cheap to clone; one shared connection pool.
#[derive(Clone)]
pub(crate) struct Deliverer {
    client: reqwest::Client,
    signer: Arc<Signer>,
    policy: Arc<AddressPolicy>,
    dead_letter_statuses: Arc<Vec<u16>>,
    telemetry: Arc<Telemetry>,
}

impl Deliverer {
    /// Builds the client from `[delivery]`.
    pub(crate) fn new(config: &Config) -> anyhow::Result<Deliverer> {
        let d = &config.delivery;
        let cidrs = d
            .allow_cidrs
            .iter()
            .map(|c| c.parse())
            .collect::<Result<Vec<ipnet::IpNet>, _>>()?;
        let policy = Arc::new(AddressPolicy::new(d.allow_private, cidrs));
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(GuardedResolver::new(policy.clone())))
            .pool_max_idle_per_host(d.per_host_concurrency)
            .pool_idle_timeout(Duration::from_secs(60))
            .connect_timeout(d.timeout.min(Duration::from_secs(10)))
            .tcp_nodelay(true)
            .user_agent(USER_AGENT)
            .build()?;
        Ok(Deliverer {
            client,
            signer: Arc::new(Signer::from_config(d)?),
            policy,
            dead_letter_statuses: Arc::new(d.dead_letter_statuses.clone()),
            telemetry: Arc::new(Telemetry::off()),
        })
    }

    /// The same, with each attempt's span exported through `telemetry`.
    pub(crate) fn with_telemetry(mut self, telemetry: Arc<Telemetry>) -> Deliverer {
        self.telemetry = telemetry;
        self
    }

    /// Sends attempt `attempt` of job `id`; `started_at` is Redis-clock ms.
    pub(crate) async fn attempt(
        &self,
        id: &str,
        attempt: u32,
        spec: &JobSpec,
        timeout: Duration,
        started_at: i64,
    ) -> AttemptReport {
        let span = self.telemetry.attempt(id, spec, attempt);
        let started = Instant::now();
        let result = tokio::time::timeout(
            timeout,
            self.send(id, attempt, spec, timeout, span.traceparent()),
        )
        .await;
        let duration_ms = started.elapsed().as_millis() as u64;
        let mut record = AttemptRecord {
            attempt,
            at: started_at,
            duration_ms,
            status: None,
            error: None,
            message: None,
            location: None,
            response: String::new(),
        };
        let outcome = match result {
            Err(_) => {
                record.error = Some(ErrorKind::Timeout);
                record.message = Some(format!(
                    "no complete response within {}",
                    humantime::format_duration(timeout)
                ));
                Outcome::Failed(FailureKind::Retryable { retry_after: None })
            }
            Ok(Err((kind, message))) => {
                record.error = Some(kind);
                record.message = Some(message);
                if kind == ErrorKind::SsrfBlocked || kind == ErrorKind::InvalidJob {
                    Outcome::Failed(FailureKind::Permanent)
                } else {
                    Outcome::Failed(FailureKind::Retryable { retry_after: None })
                }
            }
            Ok(Ok(response)) => self.classify(response, &mut record),
        };
        let failed = match (&outcome, record.error) {
            (Outcome::Delivered, _) => None,
            (_, Some(kind)) => Some(kind.as_str()),
            (_, None) => Some("http_status"),
        };
        span.finish(record.status, failed);
        AttemptReport { outcome, record }
    }

    /// The outcome of an attempt that got `response`, noted in `record`.
    fn classify(&self, response: Response, record: &mut AttemptRecord) -> Outcome {
        let status = response.status;
        record.status = Some(status);
        record.response = response.body_prefix;
        if (200..300).contains(&status) {
            return Outcome::Delivered;
        }
        if (300..400).contains(&status) {
            record.error = Some(ErrorKind::Redirect);
            record.location = response.location.clone();
            record.message = Some(format!(
                "redirect {status} not followed{}",
                response
                    .location
                    .map(|l| format!(" (location: {l})"))
                    .unwrap_or_default()
            ));
        } else {
            record.error = Some(ErrorKind::HttpStatus);
            record.message = Some(format!("receiver answered {status}"));
        }
        if self.dead_letter_statuses.contains(&status) {
            return Outcome::Failed(FailureKind::Permanent);
        }
        let retry_after = if status == 429 || status == 503 {
            response.retry_after
        } else {
            None
        };
        Outcome::Failed(FailureKind::Retryable { retry_after })
    }

    /// Sends attempt `attempt` of job `id`, signed, with its headers and
    /// trace context; what the receiver answered.
    async fn send(
        &self,
        id: &str,
        attempt: u32,
        spec: &JobSpec,
        timeout: Duration,
        traceparent: &str,
    ) -> Result<Response, (ErrorKind, String)> {
        let url = reqwest::Url::parse(&spec.url)
            .map_err(|e| (ErrorKind::InvalidJob, format!("url: {e}")))?;
        self.policy
            .check_url_host(&url)
            .map_err(|blocked| (ErrorKind::SsrfBlocked, blocked.to_string()))?;
        let (body, content_type) = spec.payload();
        // Signed before the URL moves into the request (per origin, the
        // signature needs its origin).
        let signed = self.sign(id, body, &url);
        let request = self
            .client
            .request(spec.method.as_http(), url)
            .timeout(timeout)
            .header("content-type", content_type)
            .header("webhook-id", id)
            .header("hookq-attempt", attempt.to_string());
        let mut request = with_job_and_trace_headers(request, spec, traceparent);
        if let Some((timestamp, signature)) = signed {
            request = request
                .header("webhook-timestamp", timestamp.to_string())
                .header("webhook-signature", signature);
        }
        let response = request
            .body(body.to_vec())
            .send()
            .await
            .map_err(|e| classify_error(&e))?;
        Ok(Response::read(response).await)
    }

    /// The attempt's signature of `body` for `url`, with its timestamp
    /// (Unix seconds): None when no secret is configured, or per-origin
    /// for a URL without an origin.
    fn sign(&self, id: &str, body: &[u8], url: &reqwest::Url) -> Option<(i64, String)> {
        (!self.signer.is_empty())
            .then(|| {
                let timestamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs() as i64)
                    .unwrap_or_default();
                let signature = self.signer.signature_header(id, timestamp, body, url)?;
                Some((timestamp, signature))
            })
            .flatten()
    }
}

/// `request` with the job's own headers, then the attempt's trace context
/// (`traceparent`, and the job's `tracestate` if it has one). A job's own
/// trace-context headers are left out.
fn with_job_and_trace_headers(
    mut request: reqwest::RequestBuilder,
    spec: &JobSpec,
    traceparent: &str,
) -> reqwest::RequestBuilder {
    for (name, value) in &spec.headers {
        // Jobs stored before trace-context names were reserved may
        // carry their own; the attempt's own go out instead.
        if name.eq_ignore_ascii_case("traceparent") || name.eq_ignore_ascii_case("tracestate") {
            continue;
        }
        request = request.header(name.as_str(), value.as_str());
    }
    request = request.header("traceparent", traceparent);
    if let Some(state) = spec.trace.as_ref().and_then(|t| t.state.as_deref()) {
        request = request.header("tracestate", state);
    }
    request
}

/// Longest `Location` kept from an answer, in bytes: it is stored with the
/// attempt (and in its error text), and a receiver chooses its size.
pub(crate) const LOCATION_CAP: usize = 1024;

/// What a receiver answered, reduced to what hookq keeps.
struct Response {
    status: u16,
    location: Option<String>,
    retry_after: Option<Duration>,
    body_prefix: String,
}

impl Response {
    /// Keeps the status, the `Location` (capped), the `Retry-After` and
    /// the body's first bytes of `response`.
    async fn read(response: reqwest::Response) -> Response {
        let status = response.status().as_u16();
        let headers = response.headers();
        let location = headers
            .get("location")
            .and_then(|v| v.to_str().ok())
            .map(|l| crate::job::cut(l, LOCATION_CAP).into_owned());
        let retry_after = headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let body_prefix = read_prefix(response).await;
        Response {
            status,
            location,
            retry_after,
            body_prefix,
        }
    }
}

/// Reads at most [`RESPONSE_BODY_CAP`] bytes of the body and drops the rest
/// (a huge or endless body costs no memory and no time beyond that).
async fn read_prefix(response: reqwest::Response) -> String {
    let mut stream = response.bytes_stream();
    let mut kept: Vec<u8> = Vec::new();
    while kept.len() < RESPONSE_BODY_CAP {
        match stream.next().await {
            Some(Ok(chunk)) => {
                let room = RESPONSE_BODY_CAP - kept.len();
                kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Some(Err(_)) | None => break,
        }
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// Parses `Retry-After`: delay-seconds or an HTTP date.
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(
        when.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// The kind and message of an attempt that got no response.
fn classify_error(err: &reqwest::Error) -> (ErrorKind, String) {
    if let Some(blocked) = ssrf::find_blocked(err) {
        return (ErrorKind::SsrfBlocked, blocked.to_string());
    }
    let kind = if err.is_timeout() {
        ErrorKind::Timeout
    } else if err.is_connect() {
        ErrorKind::Connect
    } else {
        ErrorKind::Request
    };
    (kind, error_chain(err))
}

/// The error and its sources, joined: reqwest's top-level message alone
/// ("error sending request") says too little.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after("120"), Some(Duration::from_secs(120)));
        let later = std::time::SystemTime::now() + Duration::from_secs(3600);
        let header = httpdate::fmt_http_date(later);
        let parsed = parse_retry_after(&header).expect("date parses");
        assert!(parsed > Duration::from_secs(3590) && parsed <= Duration::from_secs(3600));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon"), None);
    }
}
