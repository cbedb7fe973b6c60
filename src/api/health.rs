//! Health and metrics: `/healthz` (the process answers), `/readyz` (Redis
//! answers and the scripts are loaded) and `/metrics`, with the job gauges
//! it reads from Redis at most once per [`STATS_EVERY`].

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::{ApiError, AppState};

pub(super) async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

pub(super) async fn readyz(
    State(state): State<AppState>,
) -> Result<Json<serde_json::Value>, ApiError> {
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

pub(super) async fn metrics_text(State(state): State<AppState>) -> Response {
    // Jobs by state are read from Redis at scrape time (a few commands per
    // partition), so every instance reports the shared truth; at most once
    // per STATS_EVERY however often it is scraped (`/metrics` may be
    // open to anyone, and every read costs Redis).
    if stats_due() {
        refresh_job_gauges(&state).await;
    }
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

/// Longest the `hookq_jobs` gauges go without a read from Redis while
/// `/metrics` is scraped.
pub(crate) const STATS_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether the job gauges should be read from Redis again (true at most
/// once per [`STATS_EVERY`] in this process).
fn stats_due() -> bool {
    static LAST: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);
    let mut last = match LAST.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    };
    let now = std::time::Instant::now();
    if last.is_some_and(|t| now.duration_since(t) < STATS_EVERY) {
        return false;
    }
    *last = Some(now);
    true
}

/// Reads the job counts behind the `hookq_jobs` gauges.
async fn refresh_job_gauges(state: &AppState) {
    if let Ok(stats) = state.store.stats().await {
        for (name, value) in [
            ("scheduled", stats.scheduled),
            ("ready", stats.ready),
            ("inflight", stats.inflight),
            ("dead", stats.dead),
        ] {
            metrics::gauge!("hookq_jobs", "state" => name).set(value as f64);
        }
        metrics::gauge!("hookq_oldest_ready_lag_seconds")
            .set(stats.oldest_ready_lag_ms as f64 / 1000.0);
    }
}
