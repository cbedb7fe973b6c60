//! The error shape: [`ApiError`], sent as `{"error": {"code", "message",
//! "field"}}`, and the conversions onto it from field errors, bad cursors,
//! store failures and body rejections.

use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::server;
use crate::job::FieldError;
use crate::store::listing::BadCursor;
use crate::store::StoreError;

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
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
        }
    }
}

/// Longest error message sent, in bytes: a backstop behind each message's
/// own quote of its input ([`crate::job::quote`]).
pub(crate) const MAX_MESSAGE: usize = 1024;

/// Longest `field` sent, in bytes (a backstop: a field quotes its input's
/// names cut at [`crate::job::MAX_QUOTE`]).
const MAX_FIELD: usize = 256;

impl ApiError {
    /// The error as its JSON shows it (`{"code", "message", "field"}`),
    /// the message cut at [`MAX_MESSAGE`] bytes and the field at
    /// [`MAX_FIELD`].
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let message = crate::job::cut(&self.message, MAX_MESSAGE);
        let field = self.field.as_deref().map(|f| crate::job::cut(f, MAX_FIELD));
        json!({"code": self.code, "message": message, "field": field})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": self.to_json()});
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

impl From<BadCursor> for ApiError {
    fn from(e: BadCursor) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_cursor",
            message: e.message,
            field: Some(e.field),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::from(&e)
    }
}

impl From<&StoreError> for ApiError {
    fn from(e: &StoreError) -> Self {
        match e {
            StoreError::Shared(inner) => ApiError::from(inner.as_ref()),
            StoreError::NotReplicated { .. } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_replicated",
                format!("{e}; the write may have landed: retrying with the same id is safe"),
            ),
            StoreError::Redis(err) if err.code() == Some("OOM") => {
                // maxmemory with noeviction: Redis refused the script before
                // it ran, so nothing was written.
                metrics::counter!("hookq_redis_errors_total", "component" => "api").increment(1);
                tracing::warn!(cause = %err, "redis is out of memory");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "redis_out_of_memory",
                    "the job store (Redis) is at maxmemory; nothing was written; retry later",
                )
            }
            StoreError::Redis(err) => {
                metrics::counter!("hookq_redis_errors_total", "component" => "api").increment(1);
                tracing::warn!(cause = %err, "redis unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "redis_unavailable",
                    "the job store (Redis) is unavailable; retry later",
                )
            }
            StoreError::Schema { .. } => {
                tracing::error!(cause = %e, "redis holds another layout");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "schema_mismatch",
                    "the job store (Redis) holds data of another hookq layout; run `hookq migrate`",
                )
            }
            StoreError::Partitions { .. } => {
                tracing::error!(cause = %e, "redis holds another partition count");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "partitions_mismatch",
                    "the job store (Redis) holds data in another number of partitions than redis.partitions",
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
        // A body that did not arrive within `api.body_timeout`.
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&r);
        while let Some(err) = source {
            if err.is::<server::BodyTimedOut>() {
                return ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "body_timeout",
                    server::BodyTimedOut.to_string(),
                );
            }
            source = err.source();
        }
        let status = r.status();
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "body_too_large"
        } else {
            "bad_request"
        };
        ApiError::new(status, code, r.body_text())
    }
}
