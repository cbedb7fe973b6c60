//! `hookq hosts`: the hosts' breaker states, and an operator's pause or
//! resume of one host.

use std::process::ExitCode;

use super::table::{print_json, print_table};
use super::{connect, fail, CliError, HostAction};
use crate::config::Config;

/// `hookq hosts [--state S] [pause|resume HOST]`: the hosts' breaker
/// states, or an operator's pause or resume.
pub(super) async fn hosts(
    config: &Config,
    state: Option<String>,
    action: Option<HostAction>,
    json: bool,
) -> Result<ExitCode, CliError> {
    use crate::hosts::{view, HostRules};
    use crate::store::hosts::HostState;
    let rules = HostRules::new(config);
    if let Some(action) = action {
        return host_action(config, &rules, action, json).await;
    }
    let filter = match state.as_deref() {
        None => None,
        Some(name) => Some(HostState::named(name).ok_or_else(|| {
            fail(
                2,
                format!("--state: `{name}` is not closed, open, half_open or paused"),
            )
        })?),
    };
    let store = connect(config).await?;
    let (hosts, _) = view::list(&store, &rules, None, filter, 1000, None).await?;
    if json {
        print_json(&hosts)?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = hosts
        .iter()
        .map(|h| {
            vec![
                h.host.clone(),
                h.state.as_str().to_string(),
                h.waiting.to_string(),
                h.consecutive_failures.to_string(),
                h.next_probe_at.clone().unwrap_or_else(|| "-".into()),
                h.reason.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    print_table(
        &[
            "host",
            "state",
            "waiting",
            "failures",
            "next_probe_at",
            "reason",
        ],
        &rows,
    );
    Ok(ExitCode::SUCCESS)
}

/// `hookq hosts pause|resume HOST`: changes the host's state as an
/// operator and prints what it is now.
async fn host_action(
    config: &Config,
    rules: &crate::hosts::HostRules,
    action: HostAction,
    json: bool,
) -> Result<ExitCode, CliError> {
    let (text, pause) = match &action {
        HostAction::Pause { host } => (host, true),
        HostAction::Resume { host } => (host, false),
    };
    let host = crate::hosts::parse_host(text).map_err(|e| fail(2, format!("HOST: {e}")))?;
    let store = connect(config).await?;
    if pause {
        store.host_pause(&host, 0, "operator").await?;
    } else {
        store.host_resume(&host, "operator").await?;
    }
    let v = crate::hosts::view::view(&store, rules, None, &host).await?;
    if json {
        print_json(&v)?;
    } else {
        println!("{} is {}", v.host, v.state.as_str());
    }
    Ok(ExitCode::SUCCESS)
}
