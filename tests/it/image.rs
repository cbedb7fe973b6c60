//! The container image (`scripts/image.sh`, issue 38), built from this test
//! run's own `hookq` (`--binary`, so no release build) and run as an
//! operator runs it: read-only root filesystem, as the image's non-root user,
//! host network, against a `redis-server` this test starts on a loopback
//! port. It must answer `/readyz`, deliver a job to a receiver on the host,
//! run `hookq doctor` inside the container, and stop cleanly on SIGTERM; and
//! with nothing but a Redis URL it must refuse to serve its open API on
//! 0.0.0.0. `deploy/compose.yaml` is checked to run this version's image.
//!
//! Nothing is pulled from a registry (the image is `FROM scratch`). With
//! podman the test uses a storage and state of its own in a temp dir
//! (`CONTAINERS_STORAGE_CONF`, `CONTAINERS_CONF`), so it never touches the
//! machine's images, and the settings these machines need: runtime `runc`,
//! cgroup manager `cgroupfs`, storage driver `vfs`, `default_ulimits = []`
//! (crun refuses the host's cgroup setup, and raising rlimits is not
//! permitted). With no engine that works the test fails, naming the fix
//! (`scripts/test.sh` installs podman).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::support::{self, receiver::Receiver, redis::RedisServer};
use crate::{get_json, job_view, post_created};

/// The uid and gid the image runs as (`scripts/image.sh`'s `USER`).
const IMAGE_UID: &str = "10001";

/// A container engine that works here, with the environment its every
/// command gets.
struct Engine {
    /// `podman` or `docker`.
    program: &'static str,
    /// `CONTAINERS_CONF` and `CONTAINERS_STORAGE_CONF` for podman.
    env: Vec<(String, String)>,
}

impl Engine {
    /// Finds an engine whose `info` succeeds: podman with this test's own
    /// storage and settings (under `dir`), else docker. Panics naming the
    /// fix when neither works.
    fn find(dir: &Path) -> Engine {
        let podman = Engine {
            program: "podman",
            env: podman_config(dir),
        };
        if podman.works() {
            return podman;
        }
        let docker = Engine {
            program: "docker",
            env: Vec::new(),
        };
        if docker.works() {
            return docker;
        }
        panic!(
            "no container engine works here: neither `podman info` nor `docker info` succeeds \
             (a docker CLI without its daemon does not count); scripts/test.sh installs podman \
             and runc (apt-get install podman runc)"
        );
    }

    /// True when `<engine> info` succeeds.
    fn works(&self) -> bool {
        self.command()
            .arg("info")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// A command of this engine, its environment set.
    fn command(&self) -> Command {
        let mut command = Command::new(self.program);
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command.stdin(Stdio::null());
        command
    }

    /// Runs `<engine> args...` to its end and returns what it printed.
    fn output(&self, args: &[&str]) -> Output {
        self.command()
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{} {args:?} does not run: {e}", self.program))
    }

    /// Runs `<engine> args...`, panics with its output unless it succeeds,
    /// and returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.output(args);
        assert!(
            out.status.success(),
            "{} {args:?} failed ({}): {}{}",
            self.program,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The container's log (stdout and stderr).
    fn logs(&self, container: &str) -> String {
        let out = self.output(&["logs", container]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

/// Writes a containers.conf and a storage.conf under `dir` that give podman
/// a storage, state and locks of its own, and the settings these machines
/// need; returns the variables that point podman at them.
fn podman_config(dir: &Path) -> Vec<(String, String)> {
    let at = |name: &str| dir.join(name).display().to_string();
    let containers = format!(
        "[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = \"runc\"\n\
         cgroup_manager = \"cgroupfs\"\nlock_type = \"file\"\ntmp_dir = \"{}\"\n",
        at("libpod")
    );
    let storage = format!(
        "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
        at("storage"),
        at("run")
    );
    std::fs::write(dir.join("containers.conf"), containers).expect("write containers.conf");
    std::fs::write(dir.join("storage.conf"), storage).expect("write storage.conf");
    vec![
        ("CONTAINERS_CONF".into(), at("containers.conf")),
        ("CONTAINERS_STORAGE_CONF".into(), at("storage.conf")),
    ]
}

/// Removes the containers and the image tag this test made, however it
/// ends (a panic included): `rm -f` kills a running container first.
struct Cleanup<'a> {
    engine: &'a Engine,
    containers: Vec<String>,
    tag: String,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for name in &self.containers {
            let _ = self
                .engine
                .command()
                .args(["rm", "-f", name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = self
            .engine
            .command()
            .args(["rmi", "-f", &self.tag])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Polls `cond` every 50 ms until it holds (true) or `deadline` passes
/// (false): unlike `support::wait_until` it lets the caller add the
/// container's log to the failure.
async fn poll<F, Fut>(deadline: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = tokio::time::Instant::now() + deadline;
    loop {
        if cond().await {
            return true;
        }
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The uid and gid lines of `/proc/<pid>/status`.
fn ids_of(pid: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .filter(|l| l.starts_with("Uid:") || l.starts_with("Gid:"))
        .collect::<Vec<_>>()
        .join("; ")
}

#[tokio::test]
async fn image_serves_delivers_runs_doctor_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("temp dir");
    let engine = Engine::find(dir.path());
    let version = env!("CARGO_PKG_VERSION");
    // podman's storage is this test's own, so the image's real tag is safe
    // to use (and remove); a docker daemon's is shared with its user.
    let tag = if engine.program == "podman" {
        format!("hookq:{version}")
    } else {
        format!("hookq-it-{}:{version}", std::process::id())
    };
    let container = format!("hookq-it-{}", std::process::id());
    let refused = format!("{container}-open");
    let _cleanup = Cleanup {
        engine: &engine,
        containers: vec![container.clone(), refused.clone()],
        tag: tag.clone(),
    };

    // 1. Build from this run's binary, with the engine found above.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let built = Command::new("bash")
        .arg(root.join("scripts/image.sh"))
        .args(["--binary", env!("CARGO_BIN_EXE_hookq")])
        .args(["--engine", engine.program, "--tag", &tag])
        .envs(engine.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/image.sh");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    assert!(built.status.success(), "scripts/image.sh failed: {said}");
    assert!(
        said.contains(&format!("built {tag} with {}", engine.program)) && said.contains(" MB "),
        "scripts/image.sh names the image and its size: {said}"
    );
    let config = engine.ok(&[
        "image",
        "inspect",
        "--format",
        "{{.Config.User}} {{json .Config.Entrypoint}} {{json .Config.Cmd}}",
        &tag,
    ]);
    assert_eq!(
        config,
        format!("{IMAGE_UID}:{IMAGE_UID} [\"/hookq\"] [\"serve\"]"),
        "the image's user, entry point and command"
    );

    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let port = support::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let redis_env = format!("HOOKQ_REDIS__URL={}", redis.url());

    // 2. The image's default listen is 0.0.0.0:8080 with no token: the
    // daemon must refuse that open API rather than serve it.
    engine.ok(&[
        "run",
        "--detach",
        "--name",
        &refused,
        "--read-only",
        "--network",
        "host",
        "-e",
        &redis_env,
        &tag,
    ]);
    // Bounded: an image that did serve would run until the cleanup.
    let stopped = poll(Duration::from_secs(30), || {
        let running = engine.ok(&["inspect", "--format", "{{.State.Running}}", &refused]);
        async move { running == "false" }
    })
    .await;
    let open_log = engine.logs(&refused);
    assert!(
        stopped,
        "the image served an open API on 0.0.0.0:8080: {open_log}"
    );
    let open_exit = engine.ok(&["inspect", "--format", "{{.State.ExitCode}}", &refused]);
    assert!(
        open_exit != "0" && open_log.contains("api.tokens") && open_log.contains("0.0.0.0:8080"),
        "the image with no token and its default listen refuses to serve (exit {open_exit}): \
         {open_log}"
    );

    // 3. Served as an operator runs it: read-only, the image's own user.
    engine.ok(&[
        "run",
        "--detach",
        "--name",
        &container,
        "--read-only",
        "--network",
        "host",
        "-e",
        &redis_env,
        "-e",
        &format!("HOOKQ_API__LISTEN=127.0.0.1:{port}"),
        "-e",
        "HOOKQ_DELIVERY__ALLOW_PRIVATE=true",
        "-e",
        "HOOKQ_DELIVERY__SHUTDOWN_GRACE=2s",
        &tag,
    ]);
    let ready_url = format!("{base}/readyz");
    let ready = poll(Duration::from_secs(60), || {
        let url = ready_url.clone();
        async move {
            reqwest::get(&url)
                .await
                .is_ok_and(|r| r.status().as_u16() == 200)
        }
    })
    .await;
    assert!(
        ready,
        "the container never answered /readyz: {}",
        engine.logs(&container)
    );
    let pid = engine.ok(&["inspect", "--format", "{{.State.Pid}}", &container]);
    let ids = ids_of(&pid);
    assert!(
        ids.starts_with(&format!("Uid:\t{IMAGE_UID}\t"))
            && ids.contains(&format!("Gid:\t{IMAGE_UID}\t")),
        "hookq in the container runs as {IMAGE_UID}:{IMAGE_UID}, not root: {ids}"
    );

    // 4. A job to a receiver on the host.
    let (status, health) = get_json(&format!("{base}/healthz")).await;
    assert_eq!(status, 200, "/healthz: {health}");
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "from-the-image", "url": receiver.url("/hook"), "body": {"n": 1}}),
    )
    .await;
    let got = receiver.wait_for_count(1, Duration::from_secs(30)).await;
    assert_eq!(got[0].path, "/hook");
    assert_eq!(got[0].json(), json!({"n": 1}));
    support::wait_until("the job is delivered", Duration::from_secs(30), || {
        let base = base.clone();
        async move { job_view(&base, "from-the-image").await["state"] == "delivered" }
    })
    .await;

    // 5. `hookq doctor` inside the container, with the container's config.
    let doctor = engine.output(&["exec", &container, "/hookq", "doctor"]);
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        doctor.status.success(),
        "hookq doctor in the container exits 0 ({}): {report}{}",
        doctor.status,
        String::from_utf8_lossy(&doctor.stderr)
    );
    for line in [
        format!("connected to {}", redis.url()),
        "redis version".to_string(),
        "scripts".to_string(),
    ] {
        assert!(
            report.contains(&line),
            "doctor's report names {line:?}: {report}"
        );
    }

    // 6. SIGTERM (what `stop` sends, as the image sets no other
    // STOPSIGNAL): a graceful stop, exit code 0.
    // `--time 30` is the SIGKILL fallback, far beyond the 2 s
    // shutdown_grace set above, so an exit code of 0 (not 137) means hookq
    // stopped by itself.
    engine.ok(&["stop", "--time", "30", &container]);
    let exit = engine.ok(&["inspect", "--format", "{{.State.ExitCode}}", &container]);
    let log = engine.logs(&container);
    assert!(
        log.contains("stopping: no new work is claimed"),
        "the log shows a graceful stop: {log}"
    );
    assert_eq!(exit, "0", "hookq's exit code after SIGTERM: {log}");
}

/// `deploy/compose.yaml` runs the image this version builds, read-only as
/// its user, with a token required, beside a Redis with AOF and noeviction.
#[test]
fn compose_file_runs_this_version_beside_a_durable_redis() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/compose.yaml");
    let compose = std::fs::read_to_string(&path).expect("read deploy/compose.yaml");
    let lines: Vec<&str> = compose
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let image = format!("image: hookq:{}", env!("CARGO_PKG_VERSION"));
    for wanted in [
        image.as_str(),
        "read_only: true",
        "user: \"10001:10001\"",
        "HOOKQ_REDIS__URL: redis://redis:6379",
        "- noeviction",
        "- everysec",
    ] {
        assert!(
            lines.contains(&wanted),
            "deploy/compose.yaml has a line {wanted:?} (outside comments)"
        );
    }
    let aof = lines
        .windows(2)
        .any(|w| w[0] == "- --appendonly" && w[1] == "- \"yes\"");
    assert!(
        aof,
        "deploy/compose.yaml starts Redis with --appendonly yes"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("HOOKQ_API__TOKENS:") && l.contains("${HOOKQ_TOKEN:?")),
        "deploy/compose.yaml requires a token (HOOKQ_TOKEN)"
    );
}
