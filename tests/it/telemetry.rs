//! Span export over OTLP/HTTP (`telemetry.otlp_endpoint`) to an in-test
//! collector on loopback that decodes the protobuf with the OpenTelemetry
//! proto crate: the ingest and attempt spans arrive in the creator's trace,
//! with their attributes, the attempt's span being the parent the receiver
//! was told; and with the collector down, every job is still delivered.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;

use crate::support::receiver::Receiver;
use crate::support::redis::RedisServer;
use crate::support::{free_port, wait_until};
use crate::{start_daemon, test_config};

/// Spans a collector received.
type Spans = Arc<Mutex<Vec<Span>>>;

/// An OTLP/HTTP collector on a loopback port: its base URL and its spans.
async fn collector() -> (String, Spans) {
    let spans: Spans = Arc::default();
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            post(|State(spans): State<Spans>, body: Bytes| async move {
                let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let mut all = spans.lock().expect("lock");
                for resource in request.resource_spans {
                    for scope in resource.scope_spans {
                        all.extend(scope.spans);
                    }
                }
                axum::http::StatusCode::OK
            }),
        )
        .with_state(spans.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), spans)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The value of attribute `key` of `span`, as text.
fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref()?.value.clone())
        .map(|v| match v {
            AnyValue::StringValue(s) => s,
            AnyValue::IntValue(i) => i.to_string(),
            other => format!("{other:?}"),
        })
}

#[tokio::test]
async fn spans_of_ingest_and_attempts_reach_the_collector() {
    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let (endpoint, spans) = collector().await;
    let mut config = test_config(&redis);
    config.telemetry.otlp_endpoint = endpoint;
    let daemon = start_daemon(&config).await;
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/jobs", daemon.url()))
        .header("traceparent", format!("00-{TRACE}-00f067aa0ba902b7-01"))
        .json(&json!({"id": "otel-1", "topic": "orders", "url": receiver.url("/hook")}))
        .send()
        .await
        .expect("create");
    assert_eq!(answer.status(), 201);
    let got = receiver.wait_for_count(1, Duration::from_secs(10)).await;
    let sent = got[0]
        .header("traceparent")
        .expect("traceparent")
        .to_string();
    wait_until(
        "both spans are exported",
        Duration::from_secs(15),
        || async { spans.lock().expect("lock").len() >= 2 },
    )
    .await;
    let spans = spans.lock().expect("lock").clone();
    let named = |name: &str| {
        spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} span in {spans:?}"))
            .clone()
    };
    let (ingest, attempt) = (named("hookq.ingest"), named("hookq.attempt"));
    for span in [&ingest, &attempt] {
        assert_eq!(hex(&span.trace_id), TRACE, "{}", span.name);
        assert_eq!(
            hex(&span.parent_span_id),
            "00f067aa0ba902b7",
            "{}",
            span.name
        );
        assert_eq!(attribute(span, "hookq.job.id").as_deref(), Some("otel-1"));
        assert_eq!(attribute(span, "hookq.topic").as_deref(), Some("orders"));
    }
    assert_eq!(attribute(&attempt, "hookq.attempt").as_deref(), Some("1"));
    assert_eq!(
        attribute(&attempt, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(
        attribute(&attempt, "hookq.outcome").as_deref(),
        Some("delivered")
    );
    assert_eq!(
        attribute(&attempt, "server.address"),
        Some(format!("http://{}", receiver.addr()))
    );
    // The receiver was told the attempt's span as its parent.
    assert_eq!(
        sent,
        format!("00-{TRACE}-{}-01", hex(&attempt.span_id)),
        "the traceparent sent is the attempt span's"
    );
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_collector_that_is_down_costs_no_delivery() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let mut config = test_config(&redis);
    // A loopback port nothing listens on.
    config.telemetry.otlp_endpoint = format!("http://127.0.0.1:{}", free_port());
    let daemon = start_daemon(&config).await;
    let jobs: Vec<_> = (0..500)
        .map(|i| json!({"id": format!("down-{i}"), "url": receiver.url("/x")}))
        .collect();
    let (status, answer) = crate::post_json(
        &format!("{}/v1/jobs/batch", daemon.url()),
        json!({ "jobs": jobs }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    receiver.wait_for_count(500, Duration::from_secs(30)).await;
    assert_eq!(receiver.count_distinct("webhook-id"), 500);
    daemon.stop().await.expect("clean stop");
}
