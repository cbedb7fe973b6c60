//! `hookq schedules`: list, show, pause, resume and delete recurring jobs.

use std::process::ExitCode;

use super::table::{print_json, print_table};
use super::{connect, fail, CliError, ScheduleAction};
use crate::config::Config;
use crate::store::schedules::{Paused, ScheduleView};
use crate::store::Store;

/// `hookq schedules [list]`, `hookq schedules show|pause|resume|delete ID`,
/// each of one tenant (`--tenant`, default `default`).
pub(super) async fn schedules(
    config: &Config,
    tenant: &str,
    action: Option<ScheduleAction>,
    json: bool,
) -> Result<ExitCode, CliError> {
    let action = action.unwrap_or(ScheduleAction::List);
    if let Some(id) = schedule_id(&action) {
        crate::schedule::validate_schedule_id(id).map_err(|e| fail(2, format!("ID: {e}")))?;
    }
    let store = connect(config).await?;
    // The internal id; messages name the id given.
    let internal = schedule_id(&action).map(|id| crate::tenant::internal_id(tenant, id));
    let internal = internal.as_deref().unwrap_or_default();
    let record = match &action {
        ScheduleAction::List => return list_schedules(&store, tenant, json).await,
        ScheduleAction::Show { id } => store
            .get_schedule(internal)
            .await?
            .ok_or_else(|| no_schedule(id))?,
        ScheduleAction::Pause { id } | ScheduleAction::Resume { id } => {
            let pause = matches!(action, ScheduleAction::Pause { .. });
            match store.set_schedule_paused(config, internal, pause).await? {
                Paused::Now(record) => *record,
                Paused::NotFound => return Err(no_schedule(id)),
                Paused::KeptChanging => {
                    return Err(fail(4, format!("schedule `{id}` kept changing; try again")))
                }
            }
        }
        ScheduleAction::Delete { id } => return delete_schedule(&store, internal, id, json).await,
    };
    print_schedule(&record.view(), json)
}

/// The schedule id a `hookq schedules` action names, if any.
fn schedule_id(action: &ScheduleAction) -> Option<&str> {
    match action {
        ScheduleAction::List => None,
        ScheduleAction::Show { id }
        | ScheduleAction::Pause { id }
        | ScheduleAction::Resume { id }
        | ScheduleAction::Delete { id } => Some(id),
    }
}

/// The not-found error for schedule `id`.
fn no_schedule(id: &str) -> CliError {
    fail(3, format!("no schedule with id `{id}`"))
}

/// `hookq schedules list`: every schedule of `tenant`, read 1000 at a time.
async fn list_schedules(store: &Store, tenant: &str, json: bool) -> Result<ExitCode, CliError> {
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let (page, next) = store.list_schedules(Some(tenant), 1000, after).await?;
        all.extend(page.into_iter().map(|r| r.view()));
        match next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    if json {
        print_json(&all)?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|s| {
            vec![
                s.tenant.clone(),
                s.id.clone(),
                s.state.to_string(),
                s.when(),
                s.next_runs.first().cloned().unwrap_or_else(|| "-".into()),
                s.last_runs
                    .first()
                    .map(|r| format!("{} {}", r.at, r.outcome))
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    print_table(
        &["tenant", "id", "state", "when", "next_run", "last_run"],
        &rows,
    );
    Ok(ExitCode::SUCCESS)
}

/// `hookq schedules delete ID` (`internal`: its internal id).
async fn delete_schedule(
    store: &Store,
    internal: &str,
    id: &str,
    json: bool,
) -> Result<ExitCode, CliError> {
    if !store.drop_schedule(internal).await? {
        return Err(no_schedule(id));
    }
    if json {
        print_json(&serde_json::json!({"id": id, "deleted": true}))?;
    } else {
        println!("{id} deleted (the jobs it fired stay)");
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints one schedule: as JSON, or a field/value table with a row per
/// last run.
fn print_schedule(view: &ScheduleView, json: bool) -> Result<ExitCode, CliError> {
    if json {
        print_json(view)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut rows = vec![
        vec!["id".into(), view.id.clone()],
        vec!["tenant".into(), view.tenant.clone()],
        vec!["state".into(), view.state.to_string()],
        vec!["when".into(), view.when()],
        vec!["next_runs".into(), view.next_runs.join(", ")],
    ];
    for run in &view.last_runs {
        rows.push(vec![
            "last_run".into(),
            format!("{} {} ({})", run.at, run.outcome, run.job_id),
        ]);
    }
    print_table(&["field", "value"], &rows);
    Ok(ExitCode::SUCCESS)
}
