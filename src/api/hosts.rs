//! Host routes: list and show hosts with their breaker state, pause and
//! resume a host (SPEC §11.1).
//!
//! A host is `scheme://host:port`; in a path it may be written as is
//! (`/v1/hosts/https://api.example.com:443`), percent-encoded, or loosely
//! (`api.example.com` means `https://api.example.com:443`).

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::{parse_limit, parse_query, ApiError, AppState};
use crate::hosts::{parse_host, view};
use crate::job::FieldError;
use crate::store::hosts::HostState;

fn host_param(text: &str) -> Result<String, ApiError> {
    parse_host(text)
        .map_err(|e| FieldError::new("invalid_host", "host", format!("host {e}")).into())
}

/// `GET /v1/hosts?state=&limit=&cursor=`.
pub(super) async fn list(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let pairs = parse_query(query.as_deref(), &["state", "limit", "cursor"])?;
    let get = |name: &str| {
        pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let filter = match get("state") {
        None => None,
        Some(name) => Some(HostState::named(name).ok_or_else(|| {
            FieldError::new(
                "invalid_state",
                "state",
                "state must be closed, open, half_open or paused",
            )
        })?),
    };
    let limit = parse_limit(get("limit"))?;
    // The cursor is a position in the sorted host names: any text will do.
    let cursor = match get("cursor") {
        Some("") => {
            return Err(FieldError::new("invalid_cursor", "cursor", "cursor is empty").into())
        }
        other => other.map(str::to_string),
    };
    let (hosts, next_cursor) = view::list(
        &state.store,
        state.lanes.rules(),
        Some(&state.lanes),
        filter,
        limit,
        cursor.as_deref(),
    )
    .await?;
    Ok(Json(json!({"hosts": hosts, "next_cursor": next_cursor})))
}

/// `GET /v1/hosts/{host}`, `POST /v1/hosts/{host}/pause` and `/resume`
/// (one wildcard route: a host may contain `/`, as in `https://h:443`).
pub(super) async fn one(
    State(state): State<AppState>,
    method: Method,
    Path(rest): Path<String>,
) -> Result<Response, ApiError> {
    let (text, action) = match rest.rsplit_once('/') {
        Some((host, "pause")) => (host, Some(true)),
        Some((host, "resume")) => (host, Some(false)),
        _ => (rest.as_str(), None),
    };
    let allowed = match action {
        Some(_) => "POST",
        None => "GET, HEAD",
    };
    let fits = match action {
        Some(_) => method == Method::POST,
        None => method == Method::GET || method == Method::HEAD,
    };
    if !fits {
        let mut response = ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{method} is not allowed here; allowed: {allowed}"),
        )
        .into_response();
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(allowed));
        return Ok(response);
    }
    let host = host_param(text)?;
    match action {
        Some(true) => state.breaker.pause(&host).await?,
        Some(false) => state.breaker.resume(&host).await?,
        None => {}
    }
    let view = view::view(&state.store, state.lanes.rules(), Some(&state.lanes), &host).await?;
    Ok(Json(serde_json::to_value(view).unwrap_or_default()).into_response())
}
