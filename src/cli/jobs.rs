//! Jobs: `hookq enqueue`, `show`, `cancel`, `jobs` (alias `list`) and
//! `stats`, with the tables they print.

use std::process::ExitCode;

use super::table::{print_json, print_table, wrap};
use super::{connect, fail, field_error, CliError, EnqueueArgs};
use crate::config::Config;
use crate::job::{format_ms, JobInput, JobView, RunAt};
use crate::store::{CancelOutcome, EnqueueOutcome};
use crate::tenant::internal_id;

/// `hookq cancel ID [--tenant T]`: exit 0 once cancelled, saying so when an
/// attempt was already under way (it may still arrive; none after it).
pub(super) async fn cancel(
    config: &Config,
    tenant: &str,
    id: &str,
    json: bool,
) -> Result<ExitCode, CliError> {
    crate::job::validate_id(id).map_err(field_error)?;
    let store = connect(config).await?;
    match store.cancel(&internal_id(tenant, id)).await? {
        CancelOutcome::Cancelled | CancelOutcome::AlreadyCancelled => {
            if json {
                print_json(&serde_json::json!({"id": id, "tenant": tenant, "state": "cancelled"}))?;
            } else {
                println!("cancelled {id}");
            }
            Ok(ExitCode::SUCCESS)
        }
        CancelOutcome::CancelledInFlight | CancelOutcome::AlreadyCancelledInFlight => {
            if json {
                print_json(&serde_json::json!({
                    "id": id,
                    "tenant": tenant,
                    "state": "cancelled",
                    "in_flight": true,
                }))?;
            } else {
                println!("cancelled {id}; an attempt already under way may still arrive");
            }
            Ok(ExitCode::SUCCESS)
        }
        CancelOutcome::NotFound => Err(fail(3, format!("no job with id `{id}`"))),
        CancelOutcome::Finished => Err(fail(4, format!("job `{id}` is already delivered or dead"))),
    }
}

/// `hookq stats`: the counters, then a row per partition.
pub(super) async fn stats(config: &Config, json: bool) -> Result<ExitCode, CliError> {
    let store = connect(config).await?;
    let stats = store.stats().await?;
    if json {
        print_json(&stats)?;
        return Ok(ExitCode::SUCCESS);
    }
    let value = serde_json::to_value(&stats)?;
    let rows: Vec<Vec<String>> = value
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| *k != "partitions")
                .map(|(k, v)| vec![k.clone(), v.to_string()])
                .collect()
        })
        .unwrap_or_default();
    print_table(&["counter", "value"], &rows);
    println!();
    let partitions: Vec<Vec<String>> = stats
        .partitions
        .iter()
        .map(|p| {
            [
                p.partition as u64,
                p.scheduled,
                p.ready,
                p.inflight,
                p.dead,
                p.delivered,
            ]
            .iter()
            .map(u64::to_string)
            .collect()
        })
        .collect();
    print_table(
        &[
            "partition",
            "scheduled",
            "ready",
            "inflight",
            "dead",
            "delivered",
        ],
        &partitions,
    );
    Ok(ExitCode::SUCCESS)
}

/// Most jobs `hookq jobs` lists in one run.
const MAX_JOBS_LISTED: usize = 10_000;

/// `hookq jobs [--tenant T] [--state S] [--topic T] [--limit N]`: the
/// API's listing of one tenant's jobs, paged through until `limit` jobs or
/// the end.
pub(super) async fn list_jobs(
    config: &Config,
    tenant: &str,
    state: Option<&str>,
    topic: Option<String>,
    limit: usize,
    json: bool,
) -> Result<ExitCode, CliError> {
    let state = state
        .map(|s| {
            crate::job::State::parse(s).ok_or_else(|| {
                fail(
                    2,
                    format!(
                        "--state: `{}` is not scheduled, ready, inflight, delivered, dead or cancelled",
                        crate::job::quote(s)
                    ),
                )
            })
        })
        .transpose()?;
    if let Some(t) = &topic {
        crate::job::validate_topic(t).map_err(field_error)?;
    }
    if !(1..=MAX_JOBS_LISTED).contains(&limit) {
        return Err(fail(
            2,
            format!("--limit: must be from 1 to {MAX_JOBS_LISTED}"),
        ));
    }
    let store = connect(config).await?;
    let mut views: Vec<JobView> = Vec::new();
    let mut cursor = None;
    let more = loop {
        let want = (limit - views.len()).min(1000);
        let page = store
            .list_jobs(Some(tenant), state, topic.as_deref(), want, cursor.take())
            .await?;
        views.extend(page.items.into_iter().map(crate::store::JobRecord::view));
        match page.next_cursor {
            Some(next) if views.len() < limit => {
                cursor = Some(
                    crate::store::listing::Cursor::parse(
                        &next,
                        store.keys().partitions(),
                        crate::store::listing::CursorKind::Jobs,
                        "cursor",
                    )
                    .map_err(|_| fail(1, "the listing's own cursor did not parse".into()))?,
                )
            }
            next => break next.is_some(),
        }
    };
    if json {
        print_json(&views)?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|j| {
            vec![
                j.tenant.clone(),
                j.id.clone(),
                j.state.as_str().to_string(),
                j.topic.clone(),
                format!("{}/{}", j.attempts, j.max_attempts),
                j.next_attempt_at.clone().unwrap_or_else(|| "-".into()),
                j.url.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    print_table(
        &[
            "tenant",
            "id",
            "state",
            "topic",
            "attempts",
            "next_attempt",
            "url",
        ],
        &rows,
    );
    if more {
        println!("(more than {limit}; raise --limit, narrow with --state/--topic, or page with GET /v1/jobs)");
    }
    Ok(ExitCode::SUCCESS)
}

/// `hookq enqueue`: creates one job from the flags.
pub(super) async fn enqueue(
    config: &Config,
    args: EnqueueArgs,
    json: bool,
) -> Result<ExitCode, CliError> {
    let body = args
        .body
        .map(serde_json::value::RawValue::from_string)
        .transpose()
        .map_err(|e| fail(2, format!("--body: not valid JSON: {e}")))?;
    let run_at = args.at.map(|a| match a.parse::<i64>() {
        Ok(ms) => RunAt::Millis(ms),
        Err(_) => RunAt::Text(a),
    });
    let input = JobInput {
        id: args.id,
        tenant: Some(args.tenant),
        topic: args.topic,
        url: Some(args.url),
        method: args.method,
        body,
        body_text: args.body_text,
        content_type: args.content_type,
        run_at,
        delay: args.delay,
        ordering_key: args.ordering_key,
        ..JobInput::default()
    };
    let job = input.validate(config).map_err(field_error)?;
    // Shown as the tenant's clients know it.
    let (tenant, id) = crate::tenant::split_id(&job.id);
    let (tenant, id) = (tenant.to_string(), id.to_string());
    let store = connect(config).await?;
    match store.enqueue(&job.new_job(config)).await? {
        EnqueueOutcome::Created { state, due, .. } => {
            if json {
                print_json(
                    &serde_json::json!({"id": id, "tenant": tenant, "state": state, "next_attempt_at": format_ms(due)}),
                )?;
            } else {
                println!("{id} {} (due {})", state.as_str(), format_ms(due));
            }
            Ok(ExitCode::SUCCESS)
        }
        EnqueueOutcome::Identical => {
            if json {
                print_json(&serde_json::json!({"id": id, "tenant": tenant, "status": "exists"}))?;
            } else {
                println!("{id} exists with identical content; nothing changed");
            }
            Ok(ExitCode::SUCCESS)
        }
        EnqueueOutcome::Conflict => Err(fail(
            4,
            format!("--id: job `{id}` exists with different content"),
        )),
        EnqueueOutcome::Reserved => Err(fail(
            4,
            format!(
                "--id: `{id}` is a fire id of an existing schedule; only its firing creates that job"
            ),
        )),
    }
}

/// `hookq show ID [--tenant T]`: a job with its attempt history.
pub(super) async fn show(
    config: &Config,
    tenant: &str,
    id: &str,
    json: bool,
) -> Result<ExitCode, CliError> {
    crate::job::validate_id(id).map_err(field_error)?;
    let store = connect(config).await?;
    let Some(record) = store.get(&internal_id(tenant, id)).await? else {
        return Err(fail(3, format!("no job with id `{id}`")));
    };
    let view = record.view();
    if json {
        print_json(&view)?;
        return Ok(ExitCode::SUCCESS);
    }
    print_table(&["field", "value"], &job_rows(&view));
    if !view.history.is_empty() {
        println!();
        print_history(&view.history);
    }
    Ok(ExitCode::SUCCESS)
}

/// The field/value rows `hookq show` prints for a job (header names, never
/// their values).
fn job_rows(view: &JobView) -> Vec<Vec<String>> {
    let mut rows = vec![
        vec!["id".into(), view.id.clone()],
        vec!["tenant".into(), view.tenant.clone()],
        vec!["state".into(), view.state.as_str().into()],
        vec!["topic".into(), view.topic.clone()],
        vec![
            "url".into(),
            match (&view.method, &view.url) {
                (Some(method), Some(url)) => format!("{} {url}", method.as_str()),
                _ => "- (finished; only its summary is kept)".into(),
            },
        ],
        vec![
            "headers".into(),
            if view.headers.is_empty() {
                "-".into()
            } else {
                let names: Vec<&str> = view.headers.keys().map(String::as_str).collect();
                format!("{} (values redacted)", names.join(", "))
            },
        ],
        vec![
            "attempts".into(),
            format!("{} of {}", view.attempts, view.max_attempts),
        ],
        vec![
            "next_attempt_at".into(),
            view.next_attempt_at.clone().unwrap_or_else(|| "-".into()),
        ],
        vec!["created_at".into(), view.created_at.clone()],
        vec!["updated_at".into(), view.updated_at.clone()],
    ];
    if let Some(key) = &view.ordering_key {
        rows.push(vec!["ordering_key".into(), key.clone()]);
    }
    if let Some(ahead) = &view.waiting_for {
        rows.push(vec!["waiting_for".into(), ahead.clone()]);
    }
    if let Some(holder) = &view.held_by {
        rows.push(vec!["held_by".into(), holder.clone()]);
        let until = view.waiting_until.clone().flatten();
        rows.push(vec![
            "waiting_until".into(),
            until.unwrap_or_else(|| "-".into()),
        ]);
    }
    rows
}

/// Prints a job's attempt history as a table, an attempt a row (messages
/// cut to 60 characters).
fn print_history(history: &[serde_json::Value]) {
    let rows: Vec<Vec<String>> = history
        .iter()
        .map(|h| {
            let text = |k: &str| {
                h.get(k)
                    .map(|v| v.to_string().trim_matches('"').to_string())
            };
            vec![
                text("attempt").unwrap_or_default(),
                text("at").unwrap_or_default(),
                text("duration_ms")
                    .map(|d| format!("{d}ms"))
                    .unwrap_or_default(),
                text("status").unwrap_or_else(|| "-".into()),
                text("error").unwrap_or_default(),
                wrap(&text("message").unwrap_or_default(), 60),
            ]
        })
        .collect();
    print_table(
        &["attempt", "at", "took", "status", "error", "message"],
        &rows,
    );
}
