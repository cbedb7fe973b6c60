//! The command line: `hookq serve` and the operator subcommands, which talk to
//! Redis directly with the same configuration as the daemon.
//!
//! Exit codes: 0 success, 1 a runtime failure (Redis unreachable, ...), 2 bad
//! usage or bad input (clap's own code for usage errors), 3 not found, 4
//! conflict.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config::Config;
use crate::job::{FieldError, JobInput, RunAt};
use crate::store::{CancelOutcome, EnqueueOutcome, Store};

/// hookq: HTTP callback jobs held in Redis, delivered at their due time.
#[derive(Debug, Parser)]
#[command(name = "hookq", version, about)]
pub struct Cli {
    /// TOML config file (defaults and HOOKQ_<SECTION>__<KEY> variables apply without one).
    #[arg(long, global = true, env = "HOOKQ_CONFIG")]
    pub config: Option<PathBuf>,
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
    Enqueue {
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
        /// Topic.
        #[arg(long)]
        topic: Option<String>,
        /// POST, PUT or PATCH.
        #[arg(long)]
        method: Option<String>,
    },
    /// Show a job with its attempt history (JSON).
    Show {
        /// Job id.
        id: String,
    },
    /// Cancel a job.
    Cancel {
        /// Job id.
        id: String,
    },
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

fn usage(message: String) -> CliError {
    CliError {
        code: 2,
        error: anyhow::anyhow!(message),
    }
}

/// Names the CLI flag that carries a job field.
fn flag_for(field: &str) -> &str {
    match field {
        "run_at" => "--at",
        "body_text" => "--body-text",
        "content_type" => "--content-type",
        "url" => "--url",
        "body" => "--body",
        "delay" => "--delay",
        "id" => "--id",
        "topic" => "--topic",
        "method" => "--method",
        other => other,
    }
}

fn field_error(e: FieldError) -> CliError {
    let flag = e.field.as_deref().map(flag_for).unwrap_or("input");
    usage(format!("{flag}: {}", e.message))
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

/// Runs the parsed command.
pub async fn run(cli: Cli, config: Config) -> Result<ExitCode, CliError> {
    match cli.command {
        Command::Serve { .. } => {
            crate::daemon::serve(config).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Enqueue {
            url,
            body,
            body_text,
            content_type,
            delay,
            at,
            id,
            topic,
            method,
        } => {
            let body = body
                .map(serde_json::value::RawValue::from_string)
                .transpose()
                .map_err(|e| usage(format!("--body: not valid JSON: {e}")))?;
            let run_at = at.map(|a| match a.parse::<i64>() {
                Ok(ms) => RunAt::Millis(ms),
                Err(_) => RunAt::Text(a),
            });
            let input = JobInput {
                id,
                topic,
                url: Some(url),
                method,
                body,
                body_text,
                content_type,
                run_at,
                delay,
                ..JobInput::default()
            };
            let job = input.validate(&config).map_err(field_error)?;
            let store = Store::connect(&config)
                .await
                .context("cannot connect to Redis")?;
            match store.enqueue(&job.new_job(&config)).await? {
                EnqueueOutcome::Created { state, due, .. } => {
                    println!(
                        "{}",
                        serde_json::json!({"id": job.id, "state": state, "next_attempt_at": crate::job::format_ms(due)})
                    );
                    Ok(ExitCode::SUCCESS)
                }
                EnqueueOutcome::Identical => {
                    println!("{}", serde_json::json!({"id": job.id, "status": "exists"}));
                    Ok(ExitCode::SUCCESS)
                }
                EnqueueOutcome::Conflict => Err(CliError {
                    code: 4,
                    error: anyhow::anyhow!("--id: job `{}` exists with different content", job.id),
                }),
            }
        }
        Command::Show { id } => {
            crate::job::validate_id(&id).map_err(field_error)?;
            let store = Store::connect(&config)
                .await
                .context("cannot connect to Redis")?;
            match store.get(&id).await? {
                Some(record) => {
                    println!("{}", serde_json::to_string_pretty(&record.view())?);
                    Ok(ExitCode::SUCCESS)
                }
                None => Err(CliError {
                    code: 3,
                    error: anyhow::anyhow!("no job with id `{id}`"),
                }),
            }
        }
        Command::Cancel { id } => {
            crate::job::validate_id(&id).map_err(field_error)?;
            let store = Store::connect(&config)
                .await
                .context("cannot connect to Redis")?;
            match store.cancel(&id).await? {
                CancelOutcome::Cancelled | CancelOutcome::AlreadyCancelled => {
                    println!("cancelled {id}");
                    Ok(ExitCode::SUCCESS)
                }
                CancelOutcome::NotFound => Err(CliError {
                    code: 3,
                    error: anyhow::anyhow!("no job with id `{id}`"),
                }),
                CancelOutcome::Finished => Err(CliError {
                    code: 4,
                    error: anyhow::anyhow!("job `{id}` is already delivered or dead"),
                }),
            }
        }
    }
}
