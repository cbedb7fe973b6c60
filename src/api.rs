//! The HTTP ingest API (axum): job creation and lookup, health, readiness and
//! metrics. Handlers validate with [`crate::job`] and change state only through
//! [`Store`]; every error leaves as `{"error": {"code", "message", "field"}}`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::config::Config;
use crate::job::{validate_id, FieldError, JobInput, JobView, ValidJob};
use crate::store::{EnqueueOutcome, JobRecord, Store, StoreError};

/// An API error: status plus the JSON error body.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Machine code.
    pub code: &'static str,
    /// Human sentence.
    pub message: String,
    /// JSON path of the offending field.
    pub field: Option<String>,
}

impl ApiError {
    /// An error without a field.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
        }
    }

    fn not_found(id: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no job with id `{id}`"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body =
            json!({"error": {"code": self.code, "message": self.message, "field": self.field}});
        (self.status, Json(body)).into_response()
    }
}

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        let status = if e.code == "body_too_large" {
            StatusCode::PAYLOAD_TOO_LARGE
        } else {
            StatusCode::BAD_REQUEST
        };
        ApiError {
            status,
            code: e.code,
            message: e.message,
            field: e.field,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Redis(err) => {
                tracing::warn!(cause = %err, "redis unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "redis_unavailable",
                    "the job store (Redis) is unavailable; retry later",
                )
            }
            StoreError::Reply { .. } => {
                tracing::error!(cause = %e, "unexpected store reply");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "unexpected store reply",
                )
            }
        }
    }
}

impl From<BytesRejection> for ApiError {
    fn from(r: BytesRejection) -> Self {
        let status = r.status();
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "body_too_large"
        } else {
            "bad_request"
        };
        ApiError::new(status, code, r.body_text())
    }
}

/// State shared by the handlers.
#[derive(Clone)]
pub struct AppState {
    /// The job store.
    pub store: Store,
    /// The configuration.
    pub config: Arc<Config>,
    /// Set once the scripts are loaded.
    pub scripts_loaded: Arc<AtomicBool>,
    /// Renders `/metrics`, when a recorder is installed.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

/// The router of the whole API.
pub fn router(state: AppState) -> Router {
    let max_body = state.config.api.max_body as usize;
    let v1 = Router::new()
        .route("/v1/jobs", post(create_job))
        .route("/v1/jobs/{id}", get(get_job))
        .layer(DefaultBodyLimit::max(max_body))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .merge(v1)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .with_state(state)
}

/// Rejects `/v1/*` requests without a configured bearer token (constant-time
/// comparison) when `api.tokens` is not empty.
async fn require_token(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let tokens = &state.config.api.tokens;
    if tokens.is_empty() {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let mut ok = false;
    for token in tokens {
        ok |= constant_time_eq(presented.as_bytes(), token.as_bytes());
    }
    if ok {
        next.run(request).await
    } else {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong `Authorization: Bearer <token>`",
        )
        .into_response()
    }
}

/// Compares without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Parses a JSON request body, naming the field of a type error.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let message = inner.to_string();
        let field = (path != ".").then_some(path);
        let code = if inner.is_syntax() || inner.is_eof() {
            "invalid_json"
        } else if field.is_none() {
            "invalid_request"
        } else {
            "invalid_field"
        };
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code,
            message,
            field,
        }
    })?;
    de.end()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", e.to_string()))?;
    Ok(value)
}

/// Creates one job; 201 new, 200 identical re-create, 409 conflicting re-create.
pub async fn create_one(
    state: &AppState,
    input: JobInput,
) -> Result<(StatusCode, JobView), ApiError> {
    let job = input.validate(&state.config)?;
    let outcome = state.store.enqueue(&job.new_job(&state.config)).await?;
    match outcome {
        EnqueueOutcome::Created {
            state: job_state,
            due,
            now,
        } => {
            let view = created_record(job, job_state, due, now, &state.config).view();
            Ok((StatusCode::CREATED, view))
        }
        EnqueueOutcome::Identical => match state.store.get(&job.id).await? {
            Some(record) => Ok((StatusCode::OK, record.view())),
            None => Err(ApiError::not_found(&job.id)),
        },
        EnqueueOutcome::Conflict => Err(ApiError {
            status: StatusCode::CONFLICT,
            code: "conflict",
            message: format!("a job with id `{}` exists with different content", job.id),
            field: Some("id".into()),
        }),
    }
}

fn created_record(
    job: ValidJob,
    state: crate::job::State,
    due: i64,
    now: i64,
    config: &Config,
) -> JobRecord {
    JobRecord {
        max_attempts: job.spec.max_attempts(config),
        id: job.id,
        spec: job.spec,
        state,
        attempts: 0,
        due,
        created: now,
        updated: now,
        history: Vec::new(),
    }
}

async fn create_job(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let input: JobInput = parse_json(&body?)?;
    let (status, view) = create_one(&state, input).await?;
    Ok((status, Json(view)).into_response())
}

async fn get_job(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    validate_id(&id)?;
    match state.store.get(&id).await? {
        Some(record) => Ok(Json(record.view()).into_response()),
        None => Err(ApiError::not_found(&id)),
    }
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

async fn readyz(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    state.store.ping().await?;
    if !state.scripts_loaded.load(Ordering::Acquire) {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "scripts are not loaded yet",
        ));
    }
    Ok(Json(json!({"status": "ready"})))
}

async fn metrics_text(State(state): State<AppState>) -> Response {
    match &state.metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "metrics are not enabled",
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"secret-token", b"secret-token"));
        assert!(!constant_time_eq(b"secret-token", b"secret-tokem"));
        assert!(!constant_time_eq(b"short", b"secret-token"));
    }

    #[test]
    fn parse_errors_name_fields() {
        let e = parse_json::<JobInput>(br#"{"url": 5}"#).expect_err("type");
        assert_eq!(e.field.as_deref(), Some("url"));
        let e = parse_json::<JobInput>(br#"{"url": "http://a.example/", "bogus": 1}"#)
            .expect_err("unknown");
        assert_eq!(e.field.as_deref(), Some("bogus"));
        let e = parse_json::<JobInput>(br#"{"url": "#).expect_err("syntax");
        assert_eq!(e.code, "invalid_json");
        let e = parse_json::<JobInput>(br#"{"url": "http://a.example/"} trailing"#)
            .expect_err("trailing");
        assert_eq!(e.code, "invalid_json");
    }
}
