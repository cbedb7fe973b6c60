//! The `hookq` binary: parses the command line, loads the config, starts
//! logging and hands over to [`hookq::cli::run`].
#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use hookq::cli::{self, Cli};

/// mimalloc instead of the system allocator: the delivery hot path allocates
/// per request (hyper, reqwest, redis), and the profile showed glibc malloc's
/// bookkeeping (`_int_malloc`, `malloc_consolidate`, `unlink_chunk`) as the
/// largest user-space cost.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_tracing(config: &hookq::config::Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&config.log.level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal: a log file, a pipe or the
    // journal gets plain text (and `NO_COLOR` turns them off anywhere).
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    if config.log.format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match cli::load_config(&cli) {
        Ok(c) => c,
        Err(err) => {
            eprintln!("hookq: bad configuration: {err:#}");
            return ExitCode::from(2);
        }
    };
    init_tracing(&config);
    match cli::run(cli, config).await {
        Ok(code) => code,
        Err(err) => {
            eprintln!("hookq: {:#}", err.error);
            ExitCode::from(err.code)
        }
    }
}
