//! Dead-letter routes: list, replay, drop.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::{parse_json, parse_limit, parse_query, ApiError, AppState};
use crate::deadletter::{self, parse_since, Revival, Selection};
use crate::job::{validate_id, validate_topic};
use crate::store::listing::{Cursor, CursorKind};

/// `GET /v1/dead-letters?topic=&limit=&cursor=`.
pub(super) async fn list(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pairs = parse_query(query.as_deref(), &["topic", "since", "limit", "cursor"])?;
    let get = |name: &str| {
        pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let topic = get("topic");
    if let Some(t) = topic {
        validate_topic(t)?;
    }
    let since = get("since").map(|s| parse_since(s, "since")).transpose()?;
    let limit = parse_limit(get("limit"))?;
    let cursor = get("cursor")
        .map(|c| {
            Cursor::parse(
                c,
                state.store.keys().partitions(),
                CursorKind::DeadLetters,
                "cursor",
            )
        })
        .transpose()?;
    let page = state.store.list_dead(topic, since, limit, cursor).await?;
    Ok(
        Json(serde_json::json!({"dead_letters": page.items, "next_cursor": page.next_cursor}))
            .into_response(),
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayInput {
    #[serde(default)]
    ids: Vec<String>,
    #[serde(default)]
    all: bool,
    topic: Option<String>,
    since: Option<String>,
    url: Option<String>,
    headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    dry_run: bool,
}

/// `POST /v1/dead-letters/replay`.
pub(super) async fn replay(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let input: ReplayInput = parse_json(&body?)?;
    let selection = Selection {
        ids: input.ids,
        all: input.all,
        topic: input.topic,
        since_ms: input
            .since
            .as_deref()
            .map(|s| parse_since(s, "since"))
            .transpose()?,
    };
    selection.validate()?;
    let change = Revival::new(input.url.as_deref(), input.headers)?;
    let report = deadletter::replay(
        &state.store,
        &state.config,
        &selection,
        &change,
        input.dry_run,
        |_| {},
    )
    .await?;
    Ok(Json(report).into_response())
}

/// `GET /v1/dead-letters/{id}`: job `id`'s newest dead letter, with its
/// body (listings leave bodies out).
pub(super) async fn show(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    validate_id(&id)?;
    match state.store.find_dead(&id).await? {
        Some(dead) => Ok(Json(dead).into_response()),
        None => Err(no_dead_letter(&id)),
    }
}

fn no_dead_letter(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no dead letter for job `{}`", crate::job::quote(id)),
    )
}

/// `DELETE /v1/dead-letters/{id}`: drop job `id`'s dead letter.
pub(super) async fn drop(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    validate_id(&id)?;
    if state.store.drop_dead(&id).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(no_dead_letter(&id))
    }
}
