//! Dead-letter routes: list, replay, drop.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::tenancy::{self, param, CallerExt};
use super::{parse_json, parse_limit, parse_query, ApiError, AppState};
use crate::deadletter::{self, parse_since, Revival, Selection};
use crate::job::{validate_id, validate_topic};
use crate::store::listing::{Cursor, CursorKind};
use crate::tenant::{external_id, internal_id};

/// `GET /v1/dead-letters?tenant=&topic=&since=&limit=&cursor=`: without
/// `tenant`, every tenant's (a bound key's own alone).
pub(super) async fn list(
    State(state): State<AppState>,
    caller: CallerExt,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pairs = parse_query(
        query.as_deref(),
        &["tenant", "topic", "since", "limit", "cursor"],
    )?;
    let tenant = tenancy::filter(&caller, param(&pairs, "tenant"), "tenant")?;
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
    let page = state
        .store
        .list_dead(tenant.as_deref(), topic, since, limit, cursor)
        .await?;
    Ok(
        Json(serde_json::json!({"dead_letters": page.items, "next_cursor": page.next_cursor}))
            .into_response(),
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayInput {
    tenant: Option<String>,
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

/// `POST /v1/dead-letters/replay`: `ids` of one tenant (`tenant`, a bound
/// key's, or `default`), or `all` of one tenant's (with `tenant` or a bound
/// key) or of every tenant's.
pub(super) async fn replay(
    State(state): State<AppState>,
    caller: CallerExt,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let input: ReplayInput = parse_json(&body?)?;
    let tenant = if input.ids.is_empty() {
        tenancy::filter(&caller, input.tenant.as_deref(), "tenant")?
    } else {
        Some(tenancy::acting(&caller, input.tenant.as_deref(), "tenant")?)
    };
    let selection = Selection {
        tenant,
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
    caller: CallerExt,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let id = dead_of(&caller, query.as_deref(), &id)?;
    match state.store.find_dead(&id).await? {
        Some(dead) => Ok(Json(dead).into_response()),
        None => Err(no_dead_letter(&id)),
    }
}

/// The internal id of job `id` of the tenant the request acts in
/// (`?tenant=`, a bound key's, or `default`; see [`tenancy::acting`]).
fn dead_of(caller: &CallerExt, query: Option<&str>, id: &str) -> Result<String, ApiError> {
    let pairs = parse_query(query, &["tenant"])?;
    let tenant = tenancy::acting(caller, param(&pairs, "tenant"), "tenant")?;
    validate_id(id)?;
    Ok(internal_id(&tenant, id))
}

fn no_dead_letter(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no dead letter for job `{}`",
            crate::job::quote(external_id(id))
        ),
    )
}

/// `DELETE /v1/dead-letters/{id}`: drop job `id`'s dead letter.
pub(super) async fn drop(
    State(state): State<AppState>,
    caller: CallerExt,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let id = dead_of(&caller, query.as_deref(), &id)?;
    if state.store.drop_dead(&id).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(no_dead_letter(&id))
    }
}
