//! Optional OTLP/HTTP export of spans (`telemetry.otlp_endpoint`): one span
//! when a job is created (`hookq.ingest`) and one per attempt
//! (`hookq.attempt`), both in the job's trace (its creator's, or the one
//! derived from its id), the attempt's span id being the one its
//! `traceparent` carries, so the receiver's own spans hang below it.
//!
//! Spans go through the OpenTelemetry SDK's batch processor: a bounded
//! queue drained by a thread of its own every second, so an export never
//! blocks a delivery; when the collector is down or slow the queue fills
//! and spans are dropped, never jobs. Off (the default), nothing is
//! recorded and each attempt still gets a `traceparent` of a fresh span id.

use std::time::Duration;

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};

use crate::config::Config;
use crate::job::{attempt_traceparent, trace_id_of, JobSpec, TraceContext};

/// How long one export may take before it is given up.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the queue is drained.
const EXPORT_EVERY: Duration = Duration::from_secs(1);
/// Spans waiting for export at most; more are dropped.
const QUEUE: usize = 8192;

/// The span exporter of one daemon, or nothing when export is off.
pub(crate) struct Telemetry {
    provider: Option<SdkTracerProvider>,
    tracer: Option<opentelemetry_sdk::trace::SdkTracer>,
}

impl Telemetry {
    /// No export.
    pub(crate) fn off() -> Telemetry {
        Telemetry {
            provider: None,
            tracer: None,
        }
    }

    /// The exporter `telemetry.otlp_endpoint` asks for (off when empty):
    /// spans are POSTed to `<endpoint>/v1/traces` as OTLP protobuf.
    pub(crate) fn start(config: &Config) -> anyhow::Result<Telemetry> {
        let endpoint = config.telemetry.otlp_endpoint.trim_end_matches('/');
        if endpoint.is_empty() {
            return Ok(Telemetry::off());
        }
        let url = if endpoint.ends_with("/v1/traces") {
            endpoint.to_string()
        } else {
            format!("{endpoint}/v1/traces")
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(url)
            .with_timeout(EXPORT_TIMEOUT)
            .with_headers(Default::default())
            .build()
            .map_err(|e| anyhow::anyhow!("config key `telemetry.otlp_endpoint`: {e}"))?;
        let batch = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_scheduled_delay(EXPORT_EVERY)
                    .with_max_queue_size(QUEUE)
                    .build(),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(batch)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name("hookq")
                    .build(),
            )
            .build();
        let tracer = provider.tracer("hookq");
        Ok(Telemetry {
            provider: Some(provider),
            tracer: Some(tracer),
        })
    }

    /// Records the creation of job `id` (a span that ends at once).
    pub(crate) fn ingest(&self, id: &str, topic: &str, trace: Option<&TraceContext>) {
        let Some(tracer) = &self.tracer else { return };
        let mut span = tracer
            .span_builder("hookq.ingest")
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("hookq.job.id", id.to_string()),
                KeyValue::new("hookq.topic", topic.to_string()),
            ])
            .start_with_context(tracer, &job_context(id, trace));
        span.end();
    }

    /// Opens the span of one attempt; its `traceparent` goes with the
    /// request, and [`AttemptSpan::finish`] records how it went.
    pub(crate) fn attempt(&self, id: &str, spec: &JobSpec, attempt: u32) -> AttemptSpan {
        let trace = spec.trace.as_ref();
        let Some(tracer) = &self.tracer else {
            return AttemptSpan {
                span: None,
                traceparent: attempt_traceparent(id, trace),
            };
        };
        let span = tracer
            .span_builder("hookq.attempt")
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("hookq.job.id", id.to_string()),
                KeyValue::new("hookq.topic", spec.topic.clone()),
                KeyValue::new("server.address", crate::job::host_key(&spec.url)),
                KeyValue::new("hookq.attempt", i64::from(attempt)),
            ])
            .start_with_context(tracer, &job_context(id, trace));
        let context = span.span_context();
        let traceparent = format!(
            "00-{}-{}-{:02x}",
            context.trace_id(),
            context.span_id(),
            context.trace_flags().to_u8()
        );
        AttemptSpan {
            span: Some(span),
            traceparent,
        }
    }

    /// Sends what is queued (waits for at most the export timeout).
    pub(crate) fn shutdown(&self) {
        if let Some(provider) = &self.provider {
            if let Err(err) = provider.shutdown() {
                tracing::debug!(cause = %err, "span export at shutdown");
            }
        }
    }
}

/// The span of one attempt while it runs.
pub(crate) struct AttemptSpan {
    span: Option<opentelemetry_sdk::trace::Span>,
    traceparent: String,
}

impl AttemptSpan {
    /// The `traceparent` the attempt sends.
    pub(crate) fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// Ends the span with the answer's status (if any) and the outcome
    /// (`delivered` or `failed`, with the error kind).
    pub(crate) fn finish(self, status: Option<u16>, error: Option<&str>) {
        let Some(mut span) = self.span else { return };
        if let Some(status) = status {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        match error {
            None => {
                span.set_attribute(KeyValue::new("hookq.outcome", "delivered"));
                span.set_status(Status::Ok);
            }
            Some(kind) => {
                span.set_attribute(KeyValue::new("hookq.outcome", "failed"));
                span.set_attribute(KeyValue::new("error.type", kind.to_string()));
                span.set_status(Status::error(kind.to_string()));
            }
        }
        span.end();
    }
}

/// The context a job's spans start in: its creator's span (a remote
/// parent), or, for a job created without one, a root of its own whose ids
/// are derived from the job id (the same for every attempt, stored nowhere).
fn job_context(id: &str, trace: Option<&TraceContext>) -> Context {
    let trace_id = TraceId::from_hex(&trace_id_of(id, trace)).unwrap_or(TraceId::INVALID);
    let (span_id, flags) = match trace {
        Some(context) => (
            SpanId::from_hex(context.parent_id()).unwrap_or(SpanId::INVALID),
            TraceFlags::new(u8::from_str_radix(context.flags(), 16).unwrap_or(1)),
        ),
        None => (
            SpanId::from_hex(&trace_id_of(id, None)[..16]).unwrap_or(SpanId::INVALID),
            TraceFlags::SAMPLED,
        ),
    };
    Context::new().with_remote_span_context(SpanContext::new(
        trace_id,
        span_id,
        flags,
        true,
        TraceState::default(),
    ))
}
