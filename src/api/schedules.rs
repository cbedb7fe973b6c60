//! `/v1/schedules`: create, read, list, change, pause, resume and delete
//! schedules (SPEC §12). Fire times are computed here with
//! [`crate::schedule`]; the store writes what they become.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::tenancy::{self, param, CallerExt};
use super::{parse_json, parse_limit, parse_query, ApiError, AppState};
use crate::job::{format_duration_ms, FieldError, RunAt};
use crate::schedule::{validate_schedule_id, CatchUp, Overlap, ScheduleInput, ScheduleSpec};
use crate::store::schedules::{Paused, PutOutcome, ScheduleRecord, ScheduleView, ScheduleWrite};
use crate::tenant::{external_id, internal_id};

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no schedule with id `{}`", external_id(id)),
    )
}

fn modified(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "modified",
        format!(
            "schedule `{}` changed while this change was prepared; read it again and retry",
            external_id(id)
        ),
    )
}

/// The next fire time of `spec` after `now` (its rule anchored at `anchor`).
fn next_after(spec: &ScheduleSpec, anchor: i64, now: i64) -> Result<Option<i64>, ApiError> {
    let rule = spec.timing.rule(anchor)?;
    Ok(spec.timing.next_after(&rule, now))
}

/// `POST /v1/schedules`: 201 new, 200 identical re-create, 409 conflict;
/// 400 `never_fires` naming `cron` or `end_at` for a schedule that can
/// never fire.
pub(super) async fn create(
    State(state): State<AppState>,
    caller: CallerExt,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let mut input: ScheduleInput = parse_json(&body?)?;
    input.tenant = Some(tenancy::acting(&caller, input.tenant.as_deref(), "tenant")?);
    let valid = input.validate(&state.config)?;
    let now = state.store.redis_time_ms().await?;
    let next = match valid.spec.timing.first_fire(now, now) {
        Ok(next) => Some(next),
        // A schedule that can never fire is refused, unless it is the
        // re-create of one that has since ended: still identical content.
        Err(never) => {
            return match state.store.get_schedule(&valid.id).await? {
                Some(stored) if stored.spec.same_content(&valid.spec) => {
                    Ok((StatusCode::OK, Json(stored.view())).into_response())
                }
                _ => Err(never.into()),
            }
        }
    };
    let write = ScheduleWrite::new(
        &state.config,
        &valid.id,
        &valid.spec,
        valid.paused,
        next,
        now,
        None,
    );
    let status = match state.store.put_schedule(&write).await? {
        PutOutcome::Written(_) => StatusCode::CREATED,
        PutOutcome::Identical => StatusCode::OK,
        PutOutcome::Conflict => {
            // The stored JSON may spell the same content otherwise.
            match state.store.get_schedule(&valid.id).await? {
                Some(stored) if stored.spec.same_content(&valid.spec) => StatusCode::OK,
                _ => {
                    return Err(ApiError::new(
                        StatusCode::CONFLICT,
                        "conflict",
                        format!(
                            "schedule `{}` exists with different content",
                            external_id(&valid.id)
                        ),
                    ))
                }
            }
        }
        PutOutcome::NotFound => return Err(not_found(&valid.id)),
    };
    match state.store.get_schedule(&valid.id).await? {
        Some(record) => Ok((status, Json(record.view())).into_response()),
        None => Err(not_found(&valid.id)),
    }
}

/// The internal id of schedule `id` of the tenant the request acts in
/// (`?tenant=`, a bound key's, or `default`; see [`tenancy::acting`]).
fn schedule_of(caller: &CallerExt, query: Option<&str>, id: &str) -> Result<String, ApiError> {
    let pairs = parse_query(query, &["tenant"])?;
    let tenant = tenancy::acting(caller, param(&pairs, "tenant"), "tenant")?;
    validate_schedule_id(id)?;
    Ok(internal_id(&tenant, id))
}

/// `GET /v1/schedules/{id}`.
pub(super) async fn show(
    State(state): State<AppState>,
    caller: CallerExt,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let id = schedule_of(&caller, query.as_deref(), &id)?;
    match state.store.get_schedule(&id).await? {
        Some(record) => Ok(Json(record.view()).into_response()),
        None => Err(not_found(&id)),
    }
}

/// `GET /v1/schedules?tenant=&limit=&cursor=`: schedules in id order per
/// partition; without `tenant`, every tenant's (a bound key's own alone).
pub(super) async fn list(
    State(state): State<AppState>,
    caller: CallerExt,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pairs = parse_query(query.as_deref(), &["tenant", "limit", "cursor"])?;
    let tenant = tenancy::filter(&caller, param(&pairs, "tenant"), "tenant")?;
    let get = |name: &str| {
        pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let limit = parse_limit(get("limit"))?;
    let after = get("cursor")
        .map(|c| parse_cursor(c, state.store.keys().partitions()))
        .transpose()?;
    let (records, next) = state
        .store
        .list_schedules(tenant.as_deref(), limit, after)
        .await?;
    let schedules: Vec<ScheduleView> = records.into_iter().map(ScheduleRecord::view).collect();
    let next_cursor = next.map(|(p, id)| format!("{p}.{id}"));
    Ok(
        Json(serde_json::json!({"schedules": schedules, "next_cursor": next_cursor}))
            .into_response(),
    )
}

/// A schedules cursor: `<partition>.<last id shown>` (the id may be empty;
/// an internal id, `<tenant>/<id>` outside the default tenant).
fn parse_cursor(text: &str, partitions: u16) -> Result<(u16, String), ApiError> {
    let bad = || {
        ApiError::from(FieldError::new(
            "invalid_cursor",
            "cursor",
            "cursor is not one this API gave",
        ))
    };
    let (p, id) = text.split_once('.').ok_or_else(bad)?;
    let p: u16 = p.parse().map_err(|_| bad())?;
    let (tenant, own) = crate::tenant::split_id(id);
    let bad_id = validate_schedule_id(own).is_err() || !crate::tenant::is_tenant_name(tenant);
    if p >= partitions || (!id.is_empty() && bad_id) {
        return Err(bad());
    }
    Ok((p, id.to_string()))
}

/// The fields `PATCH /v1/schedules/{id}` may change (any but `id`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SchedulePatch {
    cron: Option<String>,
    every: Option<String>,
    timezone: Option<String>,
    start_at: Option<RunAt>,
    end_at: Option<RunAt>,
    overlap: Option<String>,
    catch_up: Option<String>,
    paused: Option<bool>,
    job: Option<Box<RawValue>>,
}

/// The input a client could have sent for `spec`.
fn input_of(spec: &ScheduleSpec) -> Result<ScheduleInput, ApiError> {
    let job = serde_json::to_string(&spec.job.to_input(None))
        .ok()
        .and_then(|json| RawValue::from_string(json).ok());
    Ok(ScheduleInput {
        id: None,
        tenant: None,
        cron: spec.timing.cron.clone(),
        every: spec.timing.every_ms.map(format_duration_ms),
        timezone: Some(spec.timing.timezone.clone()),
        start_at: spec.timing.start_at.map(RunAt::Millis),
        end_at: spec.timing.end_at.map(RunAt::Millis),
        overlap: Some(
            match spec.overlap {
                Overlap::Allow => "allow",
                Overlap::Skip => "skip",
            }
            .into(),
        ),
        catch_up: Some(
            match spec.timing.catch_up {
                CatchUp::Latest => "latest",
                CatchUp::None => "none",
                CatchUp::All => "all",
            }
            .into(),
        ),
        paused: None,
        job,
    })
}

/// `PATCH /v1/schedules/{id}`: the fields given replace the schedule's
/// (`cron` and `every` replace each other; `job` replaces the template
/// whole), validated as a create; it applies from the next fire time.
pub(super) async fn patch(
    State(state): State<AppState>,
    caller: CallerExt,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let id = schedule_of(&caller, query.as_deref(), &id)?;
    let patch: SchedulePatch = parse_json(&body?)?;
    let Some(record) = state.store.get_schedule(&id).await? else {
        return Err(not_found(&id));
    };
    let mut input = input_of(&record.spec)?;
    if patch.cron.is_some() || patch.every.is_some() {
        input.cron = patch.cron;
        input.every = patch.every;
    }
    input.timezone = patch.timezone.or(input.timezone);
    input.start_at = patch.start_at.or(input.start_at);
    input.end_at = patch.end_at.or(input.end_at);
    input.overlap = patch.overlap.or(input.overlap);
    input.catch_up = patch.catch_up.or(input.catch_up);
    input.job = patch.job.or(input.job);
    let spec = input.spec(&state.config)?;
    if spec.job.ordering_list() != record.spec.job.ordering_list() {
        // Its jobs live in their ordering key's partition.
        return Err(ApiError {
            field: Some("job.ordering_key".into()),
            ..ApiError::new(
                StatusCode::CONFLICT,
                "ordering_key_fixed",
                format!("schedule `{}`'s job ordering key (and topic, when it has one) cannot change; create a new schedule instead", external_id(&id)),
            )
        });
    }
    let paused = patch.paused.unwrap_or(record.paused);
    let now = state.store.redis_time_ms().await?;
    let next = if spec.timing == record.spec.timing {
        // An ended schedule may still change its template or overlap.
        next_after(&spec, record.anchor, now)?
    } else {
        // New timing that can never fire is refused.
        Some(spec.timing.first_fire(record.anchor, now)?)
    };
    change(&state, &id, &spec, paused, next, &record).await
}

/// Writes a change of `record` and answers its view.
async fn change(
    state: &AppState,
    id: &str,
    spec: &ScheduleSpec,
    paused: bool,
    next: Option<i64>,
    record: &ScheduleRecord,
) -> Result<Response, ApiError> {
    let write = ScheduleWrite::new(
        &state.config,
        id,
        spec,
        paused,
        next,
        record.anchor,
        Some(record.version),
    );
    match state.store.put_schedule(&write).await? {
        PutOutcome::Written(_) | PutOutcome::Identical => {}
        PutOutcome::Conflict => return Err(modified(id)),
        PutOutcome::NotFound => return Err(not_found(id)),
    }
    match state.store.get_schedule(id).await? {
        Some(record) => Ok(Json(record.view()).into_response()),
        None => Err(not_found(id)),
    }
}

/// `POST /v1/schedules/{id}/pause`: no fire time until resumed (those in
/// between are skipped, never caught up).
pub(super) async fn pause(
    State(state): State<AppState>,
    caller: CallerExt,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let id = schedule_of(&caller, query.as_deref(), &id)?;
    set_paused(&state, &id, true).await
}

/// `POST /v1/schedules/{id}/resume`: fires again from the next fire time
/// after now.
pub(super) async fn resume(
    State(state): State<AppState>,
    caller: CallerExt,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let id = schedule_of(&caller, query.as_deref(), &id)?;
    set_paused(&state, &id, false).await
}

/// Pauses or resumes schedule `id` (an internal id).
async fn set_paused(state: &AppState, id: &str, paused: bool) -> Result<Response, ApiError> {
    match state
        .store
        .set_schedule_paused(&state.config, id, paused)
        .await?
    {
        Paused::Now(record) => Ok(Json(record.view()).into_response()),
        Paused::NotFound => Err(not_found(id)),
        Paused::KeptChanging => Err(modified(id)),
    }
}

/// `DELETE /v1/schedules/{id}`: 204; the jobs it fired stay.
pub(super) async fn delete(
    State(state): State<AppState>,
    caller: CallerExt,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let id = schedule_of(&caller, query.as_deref(), &id)?;
    if state.store.drop_schedule(&id).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(not_found(&id))
    }
}
