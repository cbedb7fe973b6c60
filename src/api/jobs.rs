//! Job routes: create (one or a batch), read, change, cancel, list, stats.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::quota::{check_quota, Grant, Refusal};
use super::tenancy::{self, param, CallerExt};
use super::{parse_json, parse_limit, parse_query, ApiError, AppState};
use crate::job::{
    quote, validate_id, FieldError, JobInput, JobView, RunAt, State as JobState, TraceContext,
    ValidJob,
};
use crate::store::listing::{Cursor, CursorKind};
use crate::store::{CancelOutcome, EnqueueOutcome, JobRecord, Reschedule, RescheduleOutcome};
use crate::tenant::{external_id, internal_id};

/// Most jobs in one batch.
pub(crate) const MAX_BATCH: usize = 1000;

/// `text` quoted as an error quotes input ([`quote`]), owned.
fn quote_owned(text: &str) -> String {
    quote(text).into_owned()
}

fn conflict(id: &str) -> ApiError {
    ApiError {
        status: StatusCode::CONFLICT,
        code: "conflict",
        message: format!(
            "a job with id `{}` exists with different content",
            quote(external_id(id))
        ),
        field: Some("id".into()),
    }
}

/// 409 `reserved_id` naming `id`: `<schedule id>:<13 digits>` of an
/// existing schedule is that schedule's fire id (SPEC §14).
fn reserved(id: &str) -> ApiError {
    ApiError {
        status: StatusCode::CONFLICT,
        code: "reserved_id",
        message: format!(
            "job id `{}` is a fire id of an existing schedule; only its firing creates that job",
            quote(external_id(id))
        ),
        field: Some("id".into()),
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no job with id `{}`", quote(external_id(id))),
    )
}

/// The trace context a create request carries (`traceparent`,
/// `tracestate`); None when absent or malformed (never an error).
fn trace_of(headers: &HeaderMap) -> Option<TraceContext> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    TraceContext::parse(text("traceparent")?, text("tracestate"))
}

/// Creates one job (with the request's trace context); 201 new, 200
/// identical re-create, 409 conflicting re-create.
pub(crate) async fn create_one(
    state: &AppState,
    input: JobInput,
    trace: Option<TraceContext>,
) -> Result<(StatusCode, JobView), CreateError> {
    let mut job = input.validate(&state.config)?;
    job.spec.trace = trace;
    let grant = check_quota(state, crate::tenant::tenant_of(&job.id), 1).await?;
    if let Some(refusal) = &grant.refusal {
        if !exists(state, &job.id).await? {
            return Err(CreateError::Refused(refusal.again()));
        }
    }
    let outcome = state.store.enqueue(&job.new_job(&state.config)).await?;
    drop(grant);
    Ok(outcome_view(state, job, outcome).await?)
}

/// Whether job `id` exists (live or finished): a create of it writes no
/// new job (200 identical, 409 conflict), so a quota does not refuse it.
async fn exists(state: &AppState, id: &str) -> Result<bool, ApiError> {
    Ok(state.store.get(id).await?.is_some())
}

/// Why a create wrote nothing: an API error, or a quota's refusal (which
/// may carry `Retry-After`).
#[derive(Debug)]
pub(crate) enum CreateError {
    /// Invalid, conflicting, or Redis failed.
    Api(ApiError),
    /// Past a tenant's quota.
    Refused(Refusal),
}

impl<E: Into<ApiError>> From<E> for CreateError {
    fn from(e: E) -> Self {
        CreateError::Api(e.into())
    }
}

impl IntoResponse for CreateError {
    fn into_response(self) -> Response {
        match self {
            CreateError::Api(e) => e.into_response(),
            CreateError::Refused(r) => r.into_response(),
        }
    }
}

async fn outcome_view(
    state: &AppState,
    job: ValidJob,
    outcome: EnqueueOutcome,
) -> Result<(StatusCode, JobView), ApiError> {
    match outcome {
        EnqueueOutcome::Created {
            state: job_state,
            due,
            now,
            waiting_for,
        } => {
            state
                .telemetry
                .ingest(&job.id, &job.spec.topic, job.spec.trace.as_ref());
            let max_attempts = job.spec.max_attempts(&state.config);
            let view = JobView::created(job, job_state, due, now, max_attempts, waiting_for);
            Ok((StatusCode::CREATED, view))
        }
        EnqueueOutcome::Identical => match state.store.get(&job.id).await? {
            Some(record) => Ok((StatusCode::OK, record.view())),
            None => Err(not_found(&job.id)),
        },
        EnqueueOutcome::Conflict => Err(conflict(&job.id)),
        EnqueueOutcome::Reserved => Err(reserved(&job.id)),
    }
}

pub(super) async fn create_job(
    State(state): State<AppState>,
    caller: CallerExt,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let input = with_tenant(&caller, parse_json(&body?)?)?;
    match create_one(&state, input, trace_of(&headers)).await {
        Ok((status, view)) => Ok((status, Json(view)).into_response()),
        Err(e) => Ok(e.into_response()),
    }
}

/// `input` with the tenant it is created in filled in: its `tenant`, else
/// the key's, else `default` (403 `forbidden` naming `tenant` when a bound
/// key names another; see [`tenancy::acting`]).
fn with_tenant(caller: &CallerExt, mut input: JobInput) -> Result<JobInput, ApiError> {
    input.tenant = Some(tenancy::acting(caller, input.tenant.as_deref(), "tenant")?);
    Ok(input)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchInput {
    jobs: Vec<Box<RawValue>>,
}

/// One result of a batch, in request order.
#[derive(Serialize)]
struct BatchResult {
    id: Option<String>,
    status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    job: Option<JobView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<serde_json::Value>,
}

impl BatchResult {
    fn error(id: Option<String>, e: ApiError) -> BatchResult {
        BatchResult {
            id,
            status: e.status.as_u16(),
            job: None,
            error: Some(e.to_json()),
        }
    }
}

/// `POST /v1/jobs/batch`: each item validated and created on its own (one
/// pipelined round trip for all valid items), results in request order.
pub(super) async fn create_batch(
    State(state): State<AppState>,
    caller: CallerExt,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let batch: BatchInput = parse_json(&body?)?;
    let trace = trace_of(&headers);
    if batch.jobs.is_empty() || batch.jobs.len() > MAX_BATCH {
        return Err(FieldError::new(
            "invalid_batch",
            "jobs",
            format!("jobs must hold 1 to {MAX_BATCH} jobs"),
        )
        .into());
    }
    let mut results: Vec<Option<BatchResult>> = Vec::with_capacity(batch.jobs.len());
    let mut valid: Vec<(usize, ValidJob)> = Vec::new();
    for (i, raw) in batch.jobs.iter().enumerate() {
        let parsed = parse_json::<JobInput>(raw.get().as_bytes())
            .and_then(|input| with_tenant(&caller, input))
            .and_then(|input| input.validate(&state.config).map_err(ApiError::from));
        match parsed {
            Ok(mut job) => {
                job.spec.trace = trace.clone();
                results.push(None);
                valid.push((i, job));
            }
            Err(e) => {
                // The item's id as given, quoted like any refused input.
                let id = serde_json::from_str::<serde_json::Value>(raw.get())
                    .ok()
                    .and_then(|v| v.get("id").and_then(|id| id.as_str()).map(quote_owned));
                results.push(Some(BatchResult::error(id, e)));
            }
        }
    }
    let (valid, grants, retry_after) = apply_quotas(&state, valid, &mut results).await?;
    let new_jobs: Vec<_> = valid
        .iter()
        .map(|(_, j)| j.new_job(&state.config))
        .collect();
    let outcomes = state.store.enqueue_many(&new_jobs).await?;
    drop(grants);
    for ((i, job), outcome) in valid.into_iter().zip(outcomes) {
        let id = Some(external_id(&job.id).to_string());
        let result = match outcome {
            Ok(outcome) => match outcome_view(&state, job, outcome).await {
                Ok((status, view)) => BatchResult {
                    id,
                    status: status.as_u16(),
                    job: Some(view),
                    error: None,
                },
                Err(e) => BatchResult::error(id, e),
            },
            Err(e) => BatchResult::error(id, e.into()),
        };
        results[i] = Some(result);
    }
    let results: Vec<BatchResult> = results.into_iter().flatten().collect();
    let mut response = Json(serde_json::json!({ "results": results })).into_response();
    if let Some(seconds) = retry_after {
        response.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(seconds),
        );
    }
    Ok(response)
}

/// A batch's valid items past their tenant's quota, item-wise: per
/// tenant, the first items its quotas admit go on, each later one gets its
/// refusal (429) as its result. Answers the items to write, the grants to
/// hold until they are written, and the `Retry-After` of a rate refusal.
async fn apply_quotas(
    state: &AppState,
    valid: Vec<(usize, ValidJob)>,
    results: &mut [Option<BatchResult>],
) -> Result<(Vec<(usize, ValidJob)>, Vec<Grant>, Option<u64>), ApiError> {
    let mut per_tenant: BTreeMap<String, usize> = BTreeMap::new();
    for (_, job) in &valid {
        *per_tenant
            .entry(crate::tenant::tenant_of(&job.id).to_string())
            .or_default() += 1;
    }
    // In name order, so that two batches never wait on each other's locks.
    let mut grants: BTreeMap<String, Grant> = BTreeMap::new();
    for (tenant, n) in per_tenant {
        let grant = check_quota(state, &tenant, n).await?;
        grants.insert(tenant, grant);
    }
    let mut kept = Vec::with_capacity(valid.len());
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut retry_after = None;
    for (i, job) in valid {
        let tenant = crate::tenant::tenant_of(&job.id).to_string();
        let nth = seen.entry(tenant.clone()).or_default();
        *nth += 1;
        match grants.get(&tenant) {
            Some(grant) if *nth > grant.admitted && !exists(state, &job.id).await? => {
                if let Some(refusal) = &grant.refusal {
                    retry_after = retry_after.or(refusal.retry_after);
                    let refusal = refusal.again();
                    let id = external_id(&job.id).to_string();
                    results[i] = Some(BatchResult::error(Some(id), refusal.error));
                }
            }
            _ => kept.push((i, job)),
        }
    }
    Ok((kept, grants.into_values().collect(), retry_after))
}

/// The internal id of job `id` of the tenant the request acts in
/// (`?tenant=`, a bound key's, or `default`; see [`tenancy::acting`]).
fn job_of(caller: &CallerExt, query: Option<&str>, id: &str) -> Result<String, ApiError> {
    let pairs = parse_query(query, &["tenant"])?;
    let tenant = tenancy::acting(caller, param(&pairs, "tenant"), "tenant")?;
    validate_id(id)?;
    Ok(internal_id(&tenant, id))
}

pub(super) async fn get_job(
    State(state): State<AppState>,
    caller: CallerExt,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let id = job_of(&caller, query.as_deref(), &id)?;
    match state.store.get(&id).await? {
        Some(record) => Ok(Json(record.view()).into_response()),
        None => Err(not_found(&id)),
    }
}

/// The fields `PATCH /v1/jobs/{id}` may change.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobPatch {
    run_at: Option<RunAt>,
    delay: Option<String>,
    body: Option<Box<RawValue>>,
    body_text: Option<String>,
    content_type: Option<String>,
    url: Option<String>,
    headers: Option<BTreeMap<String, String>>,
    retry: Option<Vec<String>>,
    /// Accepted only unchanged: an ordering key is fixed at creation.
    ordering_key: Option<String>,
}

impl JobPatch {
    /// Refuses a patch at odds with itself (`body` with `body_text`,
    /// `run_at` with `delay`) or with a malformed `ordering_key`, before
    /// the job is read.
    fn check(&self) -> Result<(), ApiError> {
        if self.body.is_some() && self.body_text.is_some() {
            return Err(FieldError::new(
                "conflicting_fields",
                "body_text",
                "give either body or body_text, not both",
            )
            .into());
        }
        if self.run_at.is_some() && self.delay.is_some() {
            return Err(FieldError::new(
                "conflicting_fields",
                "delay",
                "give either run_at or delay, not both",
            )
            .into());
        }
        if let Some(key) = &self.ordering_key {
            crate::job::validate_ordering_key(key)?;
        }
        Ok(())
    }

    /// Whether the patch gives a new due time.
    fn reschedules(&self) -> bool {
        self.run_at.is_some() || self.delay.is_some()
    }

    /// Job `id`'s (an internal id) content (`record`) as a client of its
    /// tenant would send it, with this patch applied.
    fn apply_to(self, id: &str, record: &JobRecord) -> JobInput {
        let (tenant, own) = crate::tenant::split_id(id);
        let mut input = record.spec.to_input(Some(own.to_string()));
        input.tenant = Some(tenant.to_string());
        if self.reschedules() {
            input.run_at = self.run_at;
            input.delay = self.delay;
        }
        if let Some(body) = self.body {
            input.body = Some(body);
            input.body_text = None;
            input.content_type = None;
        }
        if let Some(text) = self.body_text {
            input.body = None;
            input.body_text = Some(text);
            input.content_type = self.content_type;
        } else if self.content_type.is_some() {
            input.content_type = self.content_type;
        }
        if let Some(url) = self.url {
            // Headers may hold the old receiver's credentials: they do not
            // follow the job to another origin unless given again.
            if !crate::job::same_origin(&record.spec.url, &url) {
                input.headers = None;
            }
            input.url = Some(url);
        }
        if let Some(headers) = self.headers {
            input.headers = Some(headers);
        }
        if let Some(retry) = self.retry {
            input.retry = Some(retry);
        }
        input
    }
}

/// `PATCH /v1/jobs/{id}`: only while scheduled; applied atomically against
/// the very spec it was computed from, so it never half-applies or races the
/// carrier (a job promoted or changed meanwhile answers 409).
pub(super) async fn patch_job(
    State(state): State<AppState>,
    caller: CallerExt,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let id = job_of(&caller, query.as_deref(), &id)?;
    let patch: JobPatch = parse_json(&body?)?;
    patch.check()?;
    let Some(record) = state.store.get(&id).await? else {
        return Err(not_found(&id));
    };
    check_changeable(&id, &record, patch.ordering_key.as_deref())?;
    let reschedules = patch.reschedules();
    let mut job = patch.apply_to(&id, &record).validate(&state.config)?;
    // The trace context is not content: a change keeps the creator's.
    job.spec.trace = record.spec.trace.clone();
    store_change(&state, &id, &record, &job, reschedules).await
}

/// Refuses to change job `id` (read as `record`) when the patch gives
/// another `ordering_key` than its own, or when it is no longer waiting.
fn check_changeable(
    id: &str,
    record: &JobRecord,
    ordering_key: Option<&str>,
) -> Result<(), ApiError> {
    if ordering_key.is_some() && ordering_key != record.spec.ordering_key.as_deref() {
        return Err(ApiError {
            field: Some("ordering_key".into()),
            ..ApiError::new(
                StatusCode::CONFLICT,
                "ordering_key_fixed",
                format!(
                    "job `{}`'s ordering_key cannot change; create a new job instead",
                    quote(external_id(id))
                ),
            )
        });
    }
    // A job held behind earlier jobs of its ordering key waits, whatever
    // its due time: it can change.
    if record.state != JobState::Scheduled && !record.held {
        return Err(not_scheduled(id, record.state));
    }
    Ok(())
}

/// Stores `job` as job `id`'s new content, atomically against the spec
/// `record` was read with (with its new due time only if `reschedules`):
/// the changed job's view, or why it did not change.
async fn store_change(
    state: &AppState,
    id: &str,
    record: &JobRecord,
    job: &ValidJob,
    reschedules: bool,
) -> Result<Response, ApiError> {
    let new_job = job.new_job(&state.config);
    let change = Reschedule {
        id,
        old_spec_json: &record.spec_json,
        new_spec_json: &new_job.spec_json,
        due: reschedules.then_some(job.due),
        max_attempts: new_job.max_attempts,
        lease_ms: new_job.lease_ms,
        given: new_job.given,
    };
    match state.store.reschedule(&change).await? {
        RescheduleOutcome::Changed { .. } => match state.store.get(id).await? {
            Some(record) => Ok(Json(record.view()).into_response()),
            None => Err(not_found(id)),
        },
        RescheduleOutcome::NotFound => Err(not_found(id)),
        RescheduleOutcome::NotScheduled(s) => Err(not_scheduled(id, s)),
        RescheduleOutcome::Modified => Err(ApiError::new(
            StatusCode::CONFLICT,
            "modified",
            format!(
                "job `{}` changed while this change was prepared; read it again and retry",
                quote(external_id(id))
            ),
        )),
    }
}

/// 409 for a change of job `id`, which is `state` (not scheduled): `in_flight`
/// when a worker has it (claimed: held in a daemon or in flight), else
/// `not_scheduled`.
fn not_scheduled(id: &str, state: JobState) -> ApiError {
    if state == JobState::Inflight {
        return ApiError::new(
            StatusCode::CONFLICT,
            "in_flight",
            format!(
                "job `{}` is already handed to a worker (in flight); it cannot be changed",
                quote(external_id(id))
            ),
        );
    }
    ApiError::new(
        StatusCode::CONFLICT,
        "not_scheduled",
        format!(
            "job `{}` is {}; only a scheduled job can be changed",
            quote(external_id(id)),
            state.as_str()
        ),
    )
}

/// `DELETE /v1/jobs/{id}`: cancel. 204 when no attempt of the job will
/// ever be sent; 202 `{"state": "cancelled", "in_flight": true}` when a
/// worker had it already (the attempt under way may still arrive, none
/// after it), also on a repeated cancel of such a job.
pub(super) async fn cancel_job(
    State(state): State<AppState>,
    caller: CallerExt,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let id = job_of(&caller, query.as_deref(), &id)?;
    match state.store.cancel(&id).await? {
        CancelOutcome::Cancelled | CancelOutcome::AlreadyCancelled => {
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        CancelOutcome::CancelledInFlight | CancelOutcome::AlreadyCancelledInFlight => {
            let (tenant, external) = crate::tenant::split_id(&id);
            let body = serde_json::json!({
                "id": external,
                "tenant": tenant,
                "state": "cancelled",
                "in_flight": true,
            });
            Ok((StatusCode::ACCEPTED, Json(body)).into_response())
        }
        CancelOutcome::NotFound => Err(not_found(&id)),
        CancelOutcome::Finished => Err(ApiError::new(
            StatusCode::CONFLICT,
            "finished",
            format!(
                "job `{}` is already delivered or dead",
                quote(external_id(&id))
            ),
        )),
    }
}

/// `GET /v1/jobs?tenant=&state=&topic=&limit=&cursor=`: without `tenant`,
/// every tenant's jobs (a bound key's own alone).
pub(super) async fn list_jobs(
    State(state): State<AppState>,
    caller: CallerExt,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pairs = parse_query(
        query.as_deref(),
        &["tenant", "state", "topic", "limit", "cursor"],
    )?;
    let tenant = tenancy::filter(&caller, param(&pairs, "tenant"), "tenant")?;
    let get = |name: &str| {
        pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let job_state = get("state")
        .map(|s| {
            JobState::parse(s).ok_or_else(|| {
                FieldError::new(
                    "invalid_state",
                    "state",
                    "state must be scheduled, ready, inflight, delivered, dead or cancelled",
                )
            })
        })
        .transpose()?;
    let topic = get("topic");
    if let Some(t) = topic {
        crate::job::validate_topic(t)?;
    }
    let limit = parse_limit(get("limit"))?;
    let cursor = get("cursor")
        .map(|c| {
            Cursor::parse(
                c,
                state.store.keys().partitions(),
                CursorKind::Jobs,
                "cursor",
            )
        })
        .transpose()?;
    let page = state
        .store
        .list_jobs(tenant.as_deref(), job_state, topic, limit, cursor)
        .await?;
    let jobs: Vec<JobView> = page.items.into_iter().map(JobRecord::view).collect();
    Ok(Json(serde_json::json!({"jobs": jobs, "next_cursor": page.next_cursor})).into_response())
}

/// `GET /v1/stats`: every partition's counts; with `?tenant=` (or a key
/// bound to a tenant) that tenant's ledger instead.
pub(super) async fn stats(
    State(state): State<AppState>,
    caller: Option<axum::Extension<super::auth::Caller>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    if let Some(tenant) = super::tenants::stats_tenant(caller.as_ref(), query.as_deref())? {
        return super::tenants::tenant_stats(&state, &tenant).await;
    }
    let stats = state.store.stats().await?;
    Ok(Json(stats).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// The record a just-created job would be read back as.
    fn record_of(
        job: ValidJob,
        state: JobState,
        due: i64,
        now: i64,
        waiting_for: Option<String>,
        config: &Config,
    ) -> JobRecord {
        JobRecord {
            held: waiting_for.is_some(),
            waiting_for,
            holder: None,
            max_attempts: job.spec.max_attempts(config),
            spec_json: String::new(),
            id: job.id,
            spec: job.spec,
            state,
            attempts: 0,
            due,
            created: now,
            updated: now,
            history: Vec::new(),
            summarized: false,
        }
    }

    #[test]
    fn a_created_view_is_the_view_of_its_record() {
        let config = Config::default();
        for json in [
            r#"{"id":"a","url":"https://example.com/h","headers":{"x-k":"v"},"body":{"n":1},"retry":["1s","5m"],"timeout":"3s","ordering_key":"k","topic":"t"}"#,
            r#"{"url":"https://example.com/h","method":"PUT","body_text":"hi","content_type":"text/plain","delay":"1h"}"#,
        ] {
            let job = serde_json::from_str::<JobInput>(json)
                .expect("input")
                .validate(&config)
                .expect("valid");
            for state in [JobState::Scheduled, JobState::Ready] {
                for waiting_for in [None, Some("b".to_string())] {
                    let max_attempts = job.spec.max_attempts(&config);
                    let new = JobView::created(
                        job.clone(),
                        state,
                        1_800_000_000_000,
                        1_700_000_000_000,
                        max_attempts,
                        waiting_for.clone(),
                    );
                    let old = record_of(
                        job.clone(),
                        state,
                        1_800_000_000_000,
                        1_700_000_000_000,
                        waiting_for,
                        &config,
                    )
                    .view();
                    assert_eq!(
                        serde_json::to_string(&new).expect("json"),
                        serde_json::to_string(&old).expect("json")
                    );
                }
            }
        }
    }
}
