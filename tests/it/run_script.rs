//! `scripts/run.sh`, the README's first command, driven as a person does:
//! started in the foreground of its own process group (a terminal's
//! foreground job) and stopped with one Ctrl-C (SIGINT to that group).

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::{self, redis::RedisServer};

/// The output so far of the script, whose stdout and stderr go to `path`.
fn output(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(path) {
        let _ = file.read_to_string(&mut text);
    }
    text
}

#[tokio::test]
async fn one_ctrl_c_on_run_sh_drains_hookq_gracefully() {
    let redis = RedisServer::start();
    let port = support::free_port();
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("run.log");
    let mut script = start_run_sh(
        &["--listen", &format!("127.0.0.1:{port}")],
        &[("REDIS_URL", redis.url())],
        &log,
    );
    let group = script.id();
    let serving = format!("serve --listen 127.0.0.1:{port}");
    let cleanup = Cleanup {
        group,
        serving: serving.clone(),
    };
    let hookq_pid = || hookq_pids(&serving);

    wait_until_ready(&log).await;
    assert_eq!(hookq_pid().len(), 1, "one hookq runs: {}", output(&log));

    // A terminal's Ctrl-C: SIGINT to every process of the foreground group.
    let sent = Command::new("kill")
        .args(["-INT", "--", &format!("-{group}")])
        .status()
        .expect("kill -INT");
    assert!(sent.success());
    // run.sh's trap has hookq drain: well within hookq's shutdown grace.
    let status = tokio::task::spawn_blocking(move || {
        let until = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = script.try_wait().expect("wait for run.sh") {
                return Some(status);
            }
            if std::time::Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .expect("join")
    .unwrap_or_else(|| {
        panic!(
            "run.sh did not end within 60 s of a Ctrl-C: {}",
            output(&log)
        )
    });
    let text = output(&log);
    assert!(
        text.contains("stopping: no new work is claimed"),
        "hookq did not begin a graceful stop: {text}"
    );
    assert!(
        !text.contains("second signal"),
        "one Ctrl-C reached hookq as two signals, so it skipped its drain: {text}"
    );
    assert_eq!(status.code(), Some(0), "run.sh's exit: {text}");
    support::wait_until("hookq has exited", Duration::from_secs(10), || {
        let left = hookq_pid();
        async move { left.is_empty() }
    })
    .await;
    drop(cleanup);
}

/// Waits until the script logging to `log` says hookq is ready.
async fn wait_until_ready(log: &Path) {
    support::wait_until(
        "run.sh says hookq is ready",
        Duration::from_secs(60),
        || {
            let text = output(log);
            async move { text.contains("hookq is ready at") }
        },
    )
    .await;
}

/// Starts `scripts/run.sh args` as a terminal starts a foreground job: in a
/// process group of its own, with SIGINT's default disposition (a test run
/// started in the background of a shell without job control inherits SIGINT
/// ignored, and a script cannot trap a signal ignored on entry). It runs the
/// test build of hookq, with `envs` and without the caller's Redis URL
/// variables; its stdout and stderr go to `log`.
fn start_run_sh(args: &[&str], envs: &[(&str, String)], log: &Path) -> Child {
    let out = std::fs::File::create(log).expect("log file");
    Command::new("env")
        .args(["--default-signal=INT", "bash", "scripts/run.sh"])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("REDIS_URL")
        .env_remove("HOOKQ_REDIS__URL")
        .env("HOOKQ_BIN", env!("CARGO_BIN_EXE_hookq"))
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::from(out.try_clone().expect("log file")))
        .stderr(Stdio::from(out))
        .process_group(0)
        .spawn()
        .expect("start scripts/run.sh")
}

/// The configuration docs' environment values parse as TOML, so a quoted
/// string is one too: run.sh reads `HOOKQ_API__LISTEN` and
/// `HOOKQ_REDIS__URL` given so, waits for hookq at that address and uses
/// that Redis (it does not start one of its own).
#[tokio::test]
async fn run_sh_takes_toml_quoted_environment_values() {
    let redis = RedisServer::start();
    let port = support::free_port();
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("run.log");
    // (An empty config file whose path names this test's hookq.)
    let config = dir.path().join("quoted.toml");
    std::fs::write(&config, "").expect("config file");
    let config = config.to_str().expect("a UTF-8 path").to_string();
    let mut script = start_run_sh(
        &["--config", &config],
        &[
            ("HOOKQ_API__LISTEN", format!("\"127.0.0.1:{port}\"")),
            ("HOOKQ_REDIS__URL", format!("'{}'", redis.url())),
        ],
        &log,
    );
    let cleanup = Cleanup {
        group: script.id(),
        serving: format!("serve --config {config}"),
    };
    wait_until_ready(&log).await;
    let text = output(&log);
    assert!(
        text.contains(&format!("hookq is ready at http://127.0.0.1:{port}\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!("using the Redis at {}\n", redis.url())),
        "{text}"
    );
    drop(cleanup);
    script.wait().expect("run.sh ends once its group is killed");
}

/// The pids of the hookq whose command line contains `serving` (it runs in
/// a session of its own, outside the script's process group: that is the
/// fix).
fn hookq_pids(serving: &str) -> Vec<u32> {
    let pids = Command::new("pgrep")
        .args(["-f", serving])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&pids.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .collect()
}

/// Kills the script's group and its hookq, however the test ends.
struct Cleanup {
    group: u32,
    /// What the hookq's command line contains (see [`hookq_pids`]).
    serving: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        support::kill_process_group(self.group);
        for pid in hookq_pids(&self.serving) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}
