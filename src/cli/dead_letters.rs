//! Dead letters: `hookq dead-letters` lists them, `hookq replay
//! --dead-letters` makes them live again (its selection refused in the
//! CLI's words).

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;

use super::table::{print_json, print_table, wrap};
use super::{connect, fail, field_error, CliError, ReplayArgs};
use crate::config::Config;
use crate::deadletter::{self, parse_since, Revival, Selection};
use crate::job::FieldError;

/// Parses `--header 'Name: value'` flags into a header map.
fn parse_header_flags(flags: &[String]) -> Result<BTreeMap<String, String>, CliError> {
    flags
        .iter()
        .map(|flag| match flag.split_once(':') {
            Some((name, value)) if !name.trim().is_empty() => {
                Ok((name.trim().to_string(), value.trim().to_string()))
            }
            _ => Err(fail(
                2,
                format!("--header: `{}` is not `Name: value`", flag.escape_debug()),
            )),
        })
        .collect()
}

/// A replay's selection refused, in the CLI's words (the API's speak of
/// `ids` and `all: true`).
fn replay_selection_error(e: FieldError) -> CliError {
    let message = match (e.code, e.field.as_deref()) {
        ("missing_field", Some("all")) => {
            "give the jobs with --id ID (repeatable), or --all (optionally narrowed by --topic and --since)"
        }
        ("conflicting_fields", Some("all")) => "--all: give either --id or --all, not both",
        ("conflicting_fields", Some("ids")) => {
            "--topic and --since narrow --all; they do not combine with --id"
        }
        _ => return field_error(e),
    };
    fail(2, message.into())
}

/// `hookq dead-letters [--tenant T] [--topic T] [--limit N]`.
pub(super) async fn dead_letters(
    config: &Config,
    tenant: &str,
    topic: Option<String>,
    limit: usize,
    json: bool,
) -> Result<ExitCode, CliError> {
    if let Some(t) = &topic {
        crate::job::validate_topic(t).map_err(field_error)?;
    }
    if !(1..=1000).contains(&limit) {
        return Err(fail(2, "--limit: must be from 1 to 1000".into()));
    }
    let store = connect(config).await?;
    let page = store
        .list_dead(Some(tenant), topic.as_deref(), None, limit, None)
        .await?;
    if json {
        print_json(&page.items)?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = page
        .items
        .iter()
        .map(|d| {
            vec![
                d.tenant.clone(),
                d.job_id.clone(),
                d.topic.clone(),
                d.attempts.to_string(),
                d.last_status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "-".into()),
                d.dead_at.clone(),
                wrap(&d.last_error, 60),
            ]
        })
        .collect();
    print_table(
        &[
            "tenant",
            "id",
            "topic",
            "attempts",
            "status",
            "dead_at",
            "last_error",
        ],
        &rows,
    );
    if page.next_cursor.is_some() {
        println!("(more than {limit}; raise --limit or use GET /v1/dead-letters to page)");
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn replay(
    config: &Config,
    args: ReplayArgs,
    json: bool,
) -> Result<ExitCode, CliError> {
    let selection = Selection {
        tenant: Some(args.tenant),
        ids: args.ids,
        all: args.all,
        topic: args.topic,
        since_ms: args
            .since
            .as_deref()
            .map(|s| parse_since(s, "since"))
            .transpose()
            .map_err(field_error)?,
    };
    selection.validate().map_err(replay_selection_error)?;
    let headers = (!args.headers.is_empty())
        .then(|| parse_header_flags(&args.headers))
        .transpose()?;
    let change = Revival::new(args.url.as_deref(), headers).map_err(field_error)?;
    let store = connect(config).await?;
    let show_progress = !json;
    let report = deadletter::replay(&store, config, &selection, &change, args.dry_run, |n| {
        if show_progress && n % 1000 == 0 {
            eprint!("\r{n} dead letters handled");
            let _ = std::io::stderr().flush();
        }
    })
    .await?;
    if json {
        print_json(&report)?;
    } else {
        let verb = if report.dry_run {
            "would replay"
        } else {
            "replayed"
        };
        println!(
            "{verb} {}: {}",
            report.replayed.len(),
            report.replayed.join(" ")
        );
        if !report.already_live.is_empty() {
            println!(
                "already live (stale dead letter dropped) {}: {}",
                report.already_live.len(),
                report.already_live.join(" ")
            );
        }
        if !report.not_found.is_empty() {
            println!(
                "no dead letter {}: {}",
                report.not_found.len(),
                report.not_found.join(" ")
            );
        }
    }
    if !selection.ids.is_empty() && report.replayed.is_empty() && report.already_live.is_empty() {
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}
