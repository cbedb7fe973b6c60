//! The command line: `hookq serve` and the operator subcommands, which talk to
//! Redis directly with the same configuration as the daemon. Output is a
//! human table by default and JSON with `--json`.
//!
//! Exit codes: 0 success, 1 runtime failure (Redis unreachable, ...), 2 bad
//! usage, input or config (the message names the flag or key), 3 not found,
//! 4 conflict, 5 `doctor` found a problem that must be fixed.
//!
//! This file holds the flags, the errors, `serve`, `migrate` and `doctor`;
//! the other commands live in a module per group (`jobs`, `dead_letters`,
//! `schedules`, `hosts`, `keys`) and print through `table`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::config::Config;
use crate::doctor;
use crate::job::FieldError;
use crate::store::{Store, StoreError};

mod dead_letters;
mod hosts;
mod jobs;
mod keys;
mod schedules;
mod table;
mod tenants;

use dead_letters::{dead_letters, replay};
use hosts::hosts;
use jobs::{cancel, enqueue, list_jobs, show, stats};
use keys::{new_key, new_secret, signing_secret};
use schedules::schedules;
use table::print_json;

/// hookq: HTTP callback jobs held in Redis, delivered at their due time.
#[derive(Debug, Parser)]
#[command(name = "hookq", version, about)]
pub struct Cli {
    /// TOML config file (defaults and HOOKQ_<SECTION>__<KEY> variables apply without one).
    #[arg(long, global = true, env = "HOOKQ_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print JSON instead of tables (for scripts).
    #[arg(long, global = true)]
    pub json: bool,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: ingest API, carrier and worker pool.
    Serve {
        /// Overrides `api.listen`.
        #[arg(long)]
        listen: Option<String>,
        /// Overrides `redis.url`.
        #[arg(long)]
        redis_url: Option<String>,
        /// Overrides `delivery.workers`.
        #[arg(long)]
        workers: Option<usize>,
    },
    /// Create a job directly in Redis.
    Enqueue(EnqueueArgs),
    /// Show a job with its attempt history.
    Show {
        /// Job id.
        id: String,
        /// The tenant it belongs to (SPEC §15).
        #[arg(long, default_value = crate::tenant::DEFAULT_TENANT, value_parser = tenant_arg)]
        tenant: String,
    },
    /// Cancel a job.
    Cancel {
        /// Job id.
        id: String,
        /// The tenant it belongs to (SPEC §15).
        #[arg(long, default_value = crate::tenant::DEFAULT_TENANT, value_parser = tenant_arg)]
        tenant: String,
    },
    /// List jobs (partition by partition, as `GET /v1/jobs` pages them),
    /// optionally of one state and one topic.
    #[command(alias = "list")]
    Jobs {
        /// Only this tenant's jobs.
        #[arg(long, default_value = crate::tenant::DEFAULT_TENANT, value_parser = tenant_arg)]
        tenant: String,
        /// Only jobs in this state: scheduled, ready, inflight, delivered,
        /// dead or cancelled.
        #[arg(long)]
        state: Option<String>,
        /// Only this topic.
        #[arg(long)]
        topic: Option<String>,
        /// At most this many (1-10000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Counts per state and delivery counters; with `--tenant`, that
    /// tenant's ledger.
    Stats {
        /// Only this tenant's ledger (created, replayed, delivered,
        /// dead-lettered, cancelled, live) and settings.
        #[arg(long, value_parser = tenant_arg)]
        tenant: Option<String>,
    },
    /// Every tenant's ledger and settings.
    Tenants,
    /// List dead letters.
    DeadLetters {
        /// Only this tenant's dead letters.
        #[arg(long, default_value = crate::tenant::DEFAULT_TENANT, value_parser = tenant_arg)]
        tenant: String,
        /// Only this topic.
        #[arg(long)]
        topic: Option<String>,
        /// At most this many (1-1000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Replay dead letters: each job is live again, due now, with a fresh ladder.
    Replay(ReplayArgs),
    /// Hosts with their breaker state; `pause HOST` / `resume HOST` hold
    /// and release a host's deliveries.
    Hosts {
        /// Only hosts in this state: closed, open, half_open, paused.
        #[arg(long)]
        state: Option<String>,
        /// pause or resume.
        #[command(subcommand)]
        action: Option<HostAction>,
    },
    /// Schedules (recurring jobs): `list` (the default), `show ID`,
    /// `pause ID`, `resume ID`, `delete ID`.
    Schedules {
        /// The tenant of the schedules (SPEC §15).
        #[arg(long, global = true, default_value = crate::tenant::DEFAULT_TENANT, value_parser = tenant_arg)]
        tenant: String,
        /// What to do.
        #[command(subcommand)]
        action: Option<ScheduleAction>,
    },
    /// Check Redis (version, persistence, eviction policy, partitions, scripts).
    Doctor,
    /// Convert the namespace's data in Redis to this hookq's layout (stop
    /// every daemon first). Safe to interrupt and run again.
    Migrate,
    /// Print a fresh Standard Webhooks signing secret (`whsec_...`) for
    /// `delivery.signing_secrets`; give the same secret to the receiver.
    NewSecret,
    /// Print the `whsec_` secrets a receiver at URL verifies with
    /// (`delivery.signing_mode = "per_origin"`), one per configured secret,
    /// the newest first.
    SigningSecret {
        /// The receiver's URL (only its origin matters).
        url: String,
    },
    /// Print a fresh API key: the bearer token to hand out, and the
    /// `[[api.keys]]` entry (its SHA-256, never the token) for the config.
    NewKey {
        /// Who will hold it (the entry's `name`).
        #[arg(long)]
        name: String,
        /// Its scopes, comma-separated: read, write, admin.
        #[arg(long, value_delimiter = ',', default_value = "read")]
        scopes: Vec<String>,
    },
}

/// `hookq schedules` actions.
#[derive(Debug, Subcommand)]
pub enum ScheduleAction {
    /// Every schedule with its state and next fire time.
    List,
    /// A schedule with its next and last runs.
    Show {
        /// Schedule id.
        id: String,
    },
    /// No fire time until resumed (those in between are skipped).
    Pause {
        /// Schedule id.
        id: String,
    },
    /// Fire again from the next fire time after now.
    Resume {
        /// Schedule id.
        id: String,
    },
    /// Delete a schedule (the jobs it fired stay).
    Delete {
        /// Schedule id.
        id: String,
    },
}

/// `hookq hosts` actions.
#[derive(Debug, Subcommand)]
pub enum HostAction {
    /// Hold every delivery to HOST (its jobs wait, keeping their attempts)
    /// until resumed.
    Pause {
        /// `https://api.example.com:443`, or `api.example.com` for https.
        host: String,
    },
    /// Release a paused or open HOST; its waiting jobs drain at its limits.
    Resume {
        /// `https://api.example.com:443`, or `api.example.com` for https.
        host: String,
    },
}

/// `hookq enqueue` flags.
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// Target URL.
    #[arg(long)]
    url: String,
    /// JSON body.
    #[arg(long, conflicts_with = "body_text")]
    body: Option<String>,
    /// Verbatim text body.
    #[arg(long)]
    body_text: Option<String>,
    /// Content type of --body-text.
    #[arg(long, requires = "body_text")]
    content_type: Option<String>,
    /// Relative due time (humantime, e.g. 30m).
    #[arg(long, conflicts_with = "at")]
    delay: Option<String>,
    /// Absolute due time (RFC 3339 or epoch ms).
    #[arg(long)]
    at: Option<String>,
    /// Job id (a ULID is generated when absent).
    #[arg(long)]
    id: Option<String>,
    /// The tenant it belongs to (SPEC §15).
    #[arg(long, default_value = crate::tenant::DEFAULT_TENANT, value_parser = tenant_arg)]
    tenant: String,
    /// Topic.
    #[arg(long)]
    topic: Option<String>,
    /// POST, PUT or PATCH.
    #[arg(long)]
    method: Option<String>,
    /// Ordering key: jobs of the topic sharing it are attempted one at a
    /// time, in order of creation.
    #[arg(long)]
    ordering_key: Option<String>,
}

/// `hookq replay` flags.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Replay dead letters (the only kind of replay there is; required for clarity).
    #[arg(long, required = true)]
    dead_letters: bool,
    /// The tenant of the dead letters (SPEC §15).
    #[arg(long, default_value = crate::tenant::DEFAULT_TENANT, value_parser = tenant_arg)]
    tenant: String,
    /// These jobs (repeatable).
    #[arg(long = "id")]
    ids: Vec<String>,
    /// Every dead letter of this topic (with --all).
    #[arg(long)]
    topic: Option<String>,
    /// Dead-lettered at or after this time: RFC 3339, epoch ms, or a duration ago (2h).
    #[arg(long)]
    since: Option<String>,
    /// Every dead letter (narrowed by --topic and --since).
    #[arg(long)]
    all: bool,
    /// Send the replayed jobs to this URL instead (to another origin, their
    /// headers stay behind unless given again with --header).
    #[arg(long)]
    url: Option<String>,
    /// Send this header instead of the jobs' own, as `Name: value`
    /// (repeatable; any --header replaces all of a job's headers).
    #[arg(long = "header")]
    headers: Vec<String>,
    /// Print what would be replayed; change nothing.
    #[arg(long)]
    dry_run: bool,
}

/// An error with the exit code it maps to.
#[derive(Debug)]
pub struct CliError {
    /// Process exit code.
    pub code: u8,
    /// What went wrong.
    pub error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for CliError {
    fn from(e: E) -> Self {
        CliError {
            code: 1,
            error: e.into(),
        }
    }
}

/// A CLI failure exiting with `code` and `message`.
fn fail(code: u8, message: String) -> CliError {
    CliError {
        code,
        error: anyhow::anyhow!(message),
    }
}

/// Names the CLI flag that carries a job field.
fn flag_for(field: &str) -> String {
    match field {
        "run_at" => "--at".into(),
        "ids" => "--id".into(),
        f if f.starts_with("ids[") => "--id".into(),
        f if f.starts_with("headers") => "--header".into(),
        f => format!("--{}", f.replace('_', "-")),
    }
}

/// A refused input, exiting 2 with the message naming the flag.
fn field_error(e: FieldError) -> CliError {
    let flag = e
        .field
        .as_deref()
        .map(flag_for)
        .unwrap_or_else(|| "input".into());
    fail(2, format!("{flag}: {}", e.message))
}

/// Parses a `--tenant` flag: clap exits 2 naming `--tenant` when it is no
/// tenant name, before anything is read or written.
fn tenant_arg(text: &str) -> Result<String, String> {
    crate::job::validate_tenant(text, "tenant")
        .map(|()| text.to_string())
        .map_err(|e| e.message)
}

/// Loads the config for `cli`, applying `serve`'s flag overrides.
pub fn load_config(cli: &Cli) -> anyhow::Result<Config> {
    let mut config = Config::from_process(cli.config.as_deref())?;
    if let Command::Serve {
        listen,
        redis_url,
        workers,
    } = &cli.command
    {
        if let Some(l) = listen {
            config.api.listen = l.clone();
        }
        if let Some(u) = redis_url {
            config.redis.url = u.clone();
        }
        if let Some(w) = workers {
            config.delivery.workers = *w;
        }
        config.validate().context("after command-line flags")?;
    }
    Ok(config)
}

/// Connects to Redis without looking at the data's layout.
async fn connect_any(config: &Config) -> Result<Store, CliError> {
    Store::connect_unchecked(config).await.map_err(|e| {
        fail(
            1,
            format!(
                "cannot connect to Redis ({}): {e}",
                crate::config::redact_url(&config.redis.url)
            ),
        )
    })
}

/// Connects to Redis holding data of this hookq's layout.
async fn connect(config: &Config) -> Result<Store, CliError> {
    let store = connect_any(config).await?;
    store.check_schema().await.map_err(|e| match e {
        // A config error (it names `redis.partitions`).
        StoreError::Partitions { .. } => fail(2, e.to_string()),
        e => fail(1, e.to_string()),
    })?;
    // As a daemon does at start: the jobs live before the ledger are
    // counted before this command changes any (one call per partition
    // once seeded).
    store.seed_ledgers().await?;
    Ok(store)
}

/// `hookq migrate`: converts the data to this hookq's layout.
async fn migrate(config: &Config, json: bool) -> Result<ExitCode, CliError> {
    let store = connect_any(config).await?;
    store.load_scripts().await?;
    let partitions = config.redis.partitions;
    let report = store
        .migrate(|p, so_far| {
            eprintln!(
                "partition {}/{partitions} done ({} records converted so far)",
                p + 1,
                so_far.converted
            )
        })
        .await
        .map_err(|e| fail(1, format!("migrate: {e}")))?;
    if json {
        print_json(&serde_json::json!({
            "schema": crate::store::schema::SCHEMA_VERSION,
            "converted": report.converted,
            "already_converted": report.skipped,
            "timers_moved": report.timers_moved,
        }))?;
    } else {
        println!(
            "layout {}: {} records converted, {} were already; {} scheduled jobs moved to the shared timers",
            crate::store::schema::SCHEMA_VERSION,
            report.converted,
            report.skipped,
            report.timers_moved
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs the parsed command.
pub async fn run(cli: Cli, config: Config) -> Result<ExitCode, CliError> {
    let json = cli.json;
    match cli.command {
        Command::Serve { .. } => {
            crate::daemon::serve(config).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Enqueue(args) => enqueue(&config, args, json).await,
        Command::Show { id, tenant } => show(&config, &tenant, &id, json).await,
        Command::Cancel { id, tenant } => cancel(&config, &tenant, &id, json).await,
        Command::Jobs {
            tenant,
            state,
            topic,
            limit,
        } => list_jobs(&config, &tenant, state.as_deref(), topic, limit, json).await,
        Command::Stats { tenant: None } => stats(&config, json).await,
        Command::Stats { tenant: Some(name) } => tenants::tenant_stats(&config, &name, json).await,
        Command::Tenants => tenants::tenants(&config, json).await,
        Command::DeadLetters {
            tenant,
            topic,
            limit,
        } => dead_letters(&config, &tenant, topic, limit, json).await,
        Command::Replay(args) => replay(&config, args, json).await,
        Command::Hosts { state, action } => hosts(&config, state, action, json).await,
        Command::Schedules { tenant, action } => schedules(&config, &tenant, action, json).await,
        Command::NewSecret => new_secret(json),
        Command::NewKey { name, scopes } => new_key(&name, &scopes, json),
        Command::SigningSecret { url } => signing_secret(&config, &url, json),
        Command::Migrate => migrate(&config, json).await,
        Command::Doctor => run_doctor(&config, json).await,
    }
}

/// `hookq doctor`: every check with its fix; exit code 5 when one failed.
async fn run_doctor(config: &Config, json: bool) -> Result<ExitCode, CliError> {
    let report = doctor::run(config).await;
    if json {
        print_json(&report)?;
    } else {
        for check in &report.checks {
            println!(
                "{:<5} {:<18} {}",
                check.status.label(),
                check.name,
                check.detail
            );
            if let Some(fix) = &check.fix {
                println!("{:<5} {:<18} fix: {fix}", "", "");
            }
        }
    }
    if report.ok() {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::from(5))
    }
}
