//! Operating hookq: the CLI against a real Redis, crash-safe replay, graceful
//! shutdown of the real binary, Redis outages under load, metrics, systemd.

use std::collections::HashSet;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hookq::job::JobInput;
use hookq::store::Store;
use redis::AsyncCommands;
use serde_json::{json, Value};

use crate::support::receiver::{Receiver, Recorded, Reply};
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{get_json, post_json, start_daemon, test_config};

const BIN: &str = env!("CARGO_BIN_EXE_hookq");

/// Runs `hookq <args>` against `redis` with namespace `ns`.
fn hookq(redis: &RedisServer, ns: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("HOOKQ_REDIS__URL", redis.url())
        .env("HOOKQ_REDIS__NAMESPACE", ns)
        .env("HOOKQ_REDIS__PARTITIONS", "4")
        .env("HOOKQ_DELIVERY__ALLOW_PRIVATE", "true")
        .env_remove("HOOKQ_CONFIG")
        .output()
        .expect("hookq runs")
}

fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Starts `hookq serve` as a real process.
pub(crate) fn spawn_serve(redis: &RedisServer, port: u16, extra_env: &[(&str, &str)]) -> Child {
    let mut command = serve_command(Command::new(BIN), redis, port);
    command.stderr(Stdio::inherit());
    for (k, v) in extra_env {
        command.env(k, v);
    }
    command.spawn().expect("hookq serve starts")
}

/// `command` (`hookq` itself, or a wrapper such as `faketime ... hookq`)
/// completed with `serve` and the test environment: `redis`, 4 partitions,
/// the API on `port`, private targets allowed, warnings only.
pub(crate) fn serve_command(mut command: Command, redis: &RedisServer, port: u16) -> Command {
    command
        .arg("serve")
        .env("HOOKQ_REDIS__URL", redis.url())
        .env("HOOKQ_REDIS__PARTITIONS", "4")
        .env("HOOKQ_API__LISTEN", format!("127.0.0.1:{port}"))
        .env("HOOKQ_DELIVERY__ALLOW_PRIVATE", "true")
        .env("HOOKQ_LOG__LEVEL", "warn")
        .env_remove("HOOKQ_CONFIG")
        .stdout(Stdio::null());
    command
}

pub(crate) async fn wait_ready(port: u16) {
    wait_until(
        "hookq serve is ready",
        Duration::from_secs(30),
        || async move {
            reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
                .await
                .map(|r| r.status() == 200)
                .unwrap_or(false)
        },
    )
    .await;
}

pub(crate) fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .expect("kill runs");
    assert!(status.success());
}

pub(crate) async fn wait_exit(child: &mut Child, deadline: Duration) -> std::process::ExitStatus {
    let until = std::time::Instant::now() + deadline;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        assert!(
            std::time::Instant::now() < until,
            "hookq did not exit within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn cli_subcommands_work_against_real_redis() {
    let redis = RedisServer::start();
    let ns = "cli";

    let out = hookq(
        &redis,
        ns,
        &[
            "--json",
            "enqueue",
            "--url",
            "http://127.0.0.1:9/x",
            "--id",
            "c-1",
            "--delay",
            "1h",
            "--body",
            r#"{"a":1}"#,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout_json(&out)["state"], "scheduled");
    // Identical re-create is fine; a different one is a conflict (exit 4).
    let out = hookq(
        &redis,
        ns,
        &[
            "enqueue",
            "--url",
            "http://127.0.0.1:9/x",
            "--id",
            "c-1",
            "--delay",
            "1h",
            "--body",
            r#"{"a":1}"#,
        ],
    );
    assert!(out.status.success());
    let out = hookq(
        &redis,
        ns,
        &["enqueue", "--url", "http://127.0.0.1:9/y", "--id", "c-1"],
    );
    assert_eq!(out.status.code(), Some(4));
    // Bad input names the flag (exit 2).
    let out = hookq(
        &redis,
        ns,
        &[
            "enqueue",
            "--url",
            "http://127.0.0.1:9/x",
            "--delay",
            "soon",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--delay"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = hookq(&redis, ns, &["enqueue", "--url", "ftp://x"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--url"));
    // Bad config names the key (exit 2).
    let out = Command::new(BIN)
        .args(["stats"])
        .env("HOOKQ_DELIVERY__JITTER", "7")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("delivery.jitter"));

    let out = hookq(&redis, ns, &["--json", "show", "c-1"]);
    assert_eq!(stdout_json(&out)["body"], json!({"a": 1}));
    let out = hookq(&redis, ns, &["show", "c-1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("state") && text.contains("scheduled"),
        "{text}"
    );
    assert_eq!(hookq(&redis, ns, &["show", "nope"]).status.code(), Some(3));

    let out = hookq(&redis, ns, &["--json", "stats"]);
    assert_eq!(stdout_json(&out)["scheduled"], 1);
    let out = hookq(&redis, ns, &["cancel", "c-1"]);
    assert!(out.status.success());
    let out = hookq(&redis, ns, &["--json", "stats"]);
    assert_eq!(stdout_json(&out)["scheduled"], 0);

    // Dead letters: make one with a 410, list it, dry-run, replay.
    let receiver = Receiver::with_status(410).await;
    let mut config = test_config(&redis);
    config.redis.namespace = ns.into();
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": "dl-1", "topic": "pay", "url": receiver.url("/")}),
    )
    .await;
    wait_until("dl-1 dead", Duration::from_secs(10), || async {
        get_json(&format!("{base}/v1/jobs/dl-1")).await.1["state"] == "dead"
    })
    .await;
    daemon.stop().await.expect("clean stop");

    let out = hookq(&redis, ns, &["--json", "dead-letters", "--topic", "pay"]);
    let list = stdout_json(&out);
    assert_eq!(list[0]["id"], "dl-1");
    assert_eq!(list[0]["last_status"], 410);
    let out = hookq(&redis, ns, &["dead-letters"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("dl-1"));

    let before = crate::redis_snapshot(&redis).await;
    let out = hookq(
        &redis,
        ns,
        &["--json", "replay", "--dead-letters", "--all", "--dry-run"],
    );
    assert_eq!(stdout_json(&out)["replayed"], json!(["dl-1"]));
    assert_eq!(
        crate::redis_snapshot(&redis).await,
        before,
        "--dry-run changed Redis"
    );

    let out = hookq(&redis, ns, &["replay", "--all"]);
    assert_eq!(out.status.code(), Some(2), "--dead-letters is required");
    let out = hookq(
        &redis,
        ns,
        &[
            "--json",
            "replay",
            "--dead-letters",
            "--id",
            "dl-1",
            "--url",
            "http://127.0.0.1:9/new",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout_json(&out)["replayed"], json!(["dl-1"]));
    let out = hookq(&redis, ns, &["--json", "show", "dl-1"]);
    let view = stdout_json(&out);
    assert_eq!(view["state"], "ready");
    assert_eq!(view["url"], "http://127.0.0.1:9/new");
    assert_eq!(view["attempts"], 0, "a fresh ladder");
    let out = hookq(&redis, ns, &["replay", "--dead-letters", "--id", "dl-1"]);
    assert_eq!(out.status.code(), Some(3), "nothing left to replay");
}

#[tokio::test]
async fn doctor_reports_and_names_the_fix() {
    let redis = RedisServer::start();
    let out = hookq(&redis, "doc", &["--json", "doctor"]);
    let report = stdout_json(&out);
    assert!(out.status.success(), "{report}");
    let status = |name: &str| -> String {
        report["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| c["status"].as_str().unwrap_or_default().to_string())
            .unwrap_or_default()
    };
    assert_eq!(status("maxmemory-policy"), "ok");
    assert_eq!(
        status("appendonly"),
        "warn",
        "the test Redis runs without AOF"
    );
    assert_eq!(status("scripts"), "ok");
    assert_eq!(status("partitions"), "ok");
    assert_eq!(
        status("hash-max-listpack-value"),
        "warn",
        "the test Redis keeps Redis's default of 64"
    );

    let mut conn = redis.conn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET");
    let out = hookq(&redis, "doc", &["doctor"]);
    assert_eq!(out.status.code(), Some(5));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("FAIL") && text.contains("CONFIG SET maxmemory-policy noeviction"),
        "{text}"
    );
}

#[tokio::test]
async fn an_interrupted_replay_never_makes_two_live_jobs() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.delivery.retry = Vec::new();
    let store = Store::connect(&config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    // A job dies (no daemon: claim and fail it by hand).
    let job = JobInput {
        id: Some("twice".into()),
        url: Some("http://127.0.0.1:9/".into()),
        retry: Some(Vec::new()),
        ..JobInput::default()
    }
    .validate(&config)
    .expect("valid");
    store.enqueue(&job.new_job(&config)).await.expect("enqueue");
    let p = store.keys().partition_of("twice");
    let claimed = store.claim(p, 1).await.expect("claim").jobs.remove(0);
    let failure = hookq::store::Failure {
        record: "{}",
        last_error: "http_status: 500",
        last_status: Some(500),
        topic: "default",
        action: hookq::store::FailAction::DeadLetter,
    };
    store.fail(&claimed, &failure).await.expect("fail");
    let dead = store
        .find_dead("twice")
        .await
        .expect("find")
        .expect("dead letter");

    // The state an interrupted replay would leave: the job live again while
    // its dead letter is still in the stream.
    let outcome = store
        .replay("twice", &dead.entry_id, &dead.job_json, 1)
        .await
        .expect("replay");
    assert_eq!(outcome, hookq::store::ReplayOutcome::Revived);
    let mut conn = redis.conn().await;
    let _: String = conn
        .xadd(
            store.keys().dead(p),
            "*",
            &[
                ("id", "twice"),
                ("topic", "default"),
                ("attempts", "1"),
                ("last_error", "x"),
                ("last_status", "500"),
                ("job", dead.job_json.as_str()),
                ("dead_at", "1"),
            ],
        )
        .await
        .expect("XADD");

    // Replaying again drops the stale entry and revives nothing.
    let report = hookq::deadletter::replay(
        &store,
        &config,
        &hookq::deadletter::Selection {
            ids: vec!["twice".into()],
            ..Default::default()
        },
        None,
        false,
        |_| {},
    )
    .await
    .expect("replay");
    assert_eq!(report.already_live, ["twice"]);
    assert!(report.replayed.is_empty());
    let ready: Vec<String> = conn
        .lrange(store.keys().ready(p), 0, -1)
        .await
        .expect("LRANGE");
    assert_eq!(ready, ["twice"], "exactly one live copy");
    let dead_left: usize = conn.xlen(store.keys().dead(p)).await.expect("XLEN");
    assert_eq!(dead_left, 0);
}

#[tokio::test]
async fn sigterm_lets_slow_attempts_finish_and_exits_zero() {
    let redis = RedisServer::start();
    let slow = Receiver::start(Arc::new(|_: &Recorded| Reply {
        status: 200,
        headers: Vec::new(),
        body: Vec::new(),
        delay: Some(Duration::from_millis(1500)),
    }))
    .await;
    let port = free_port();
    let mut child = spawn_serve(&redis, port, &[("HOOKQ_DELIVERY__SHUTDOWN_GRACE", "10s")]);
    wait_ready(port).await;
    let base = format!("http://127.0.0.1:{port}");
    for i in 0..10 {
        let (status, _) = post_json(
            &format!("{base}/v1/jobs"),
            json!({"id": format!("slow-{i}"), "url": slow.url("/")}),
        )
        .await;
        assert_eq!(status, 201);
    }
    slow.wait_for_count(10, Duration::from_secs(10)).await;
    signal(&child, "TERM");
    let status = wait_exit(&mut child, Duration::from_secs(15)).await;
    assert!(status.success(), "exit status {status:?}");

    let mut config = test_config(&redis);
    config.redis.partitions = 4;
    let store = Store::connect(&config).await.expect("store");
    for i in 0..10 {
        let record = store
            .get(&format!("slow-{i}"))
            .await
            .expect("get")
            .expect("exists");
        assert_eq!(record.state, hookq::job::State::Delivered, "slow-{i}");
    }
    assert_eq!(slow.count(), 10, "no attempt was repeated");
}

#[tokio::test]
async fn attempts_cut_off_by_the_grace_are_recovered_by_their_leases() {
    let redis = RedisServer::start();
    let slow = Receiver::start(Arc::new(|r: &Recorded| Reply {
        status: 200,
        headers: Vec::new(),
        body: Vec::new(),
        delay: (r.headers["hookq-attempt"] == "1").then_some(Duration::from_secs(5)),
    }))
    .await;
    let port = free_port();
    let env = [
        ("HOOKQ_DELIVERY__SHUTDOWN_GRACE", "200ms"),
        ("HOOKQ_DELIVERY__TIMEOUT", "6s"),
        ("HOOKQ_DELIVERY__LEASE_MARGIN", "300ms"),
    ];
    let mut child = spawn_serve(&redis, port, &env);
    wait_ready(port).await;
    let base = format!("http://127.0.0.1:{port}");
    post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": "cut", "url": slow.url("/")}),
    )
    .await;
    slow.wait_for_count(1, Duration::from_secs(10)).await;
    signal(&child, "TERM");
    let status = wait_exit(&mut child, Duration::from_secs(5)).await;
    assert!(status.success(), "exit status {status:?}");

    // A new daemon takes the job back when the lease (6.3 s) expires.
    let port = free_port();
    let mut child = spawn_serve(&redis, port, &env);
    let got = slow.wait_for_count(2, Duration::from_secs(20)).await;
    assert_eq!(got[1].headers["hookq-attempt"], "2");
    signal(&child, "KILL");
    let _ = wait_exit(&mut child, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn redis_restart_under_load_loses_no_job() {
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let receiver = Receiver::ok().await;
    let config = test_config(&redis);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let jobs: Vec<Value> = (0..500)
        .map(|i| json!({"id": format!("load-{i}"), "url": receiver.url("/"), "delay": format!("{}ms", (i * 7) % 3000)}))
        .collect();
    let (status, _) = post_json(&format!("{base}/v1/jobs/batch"), json!({"jobs": jobs})).await;
    assert_eq!(status, 200);
    receiver.wait_for_count(50, Duration::from_secs(10)).await;
    redis.restart();
    let got = receiver.wait_for_count(500, Duration::from_secs(60)).await;
    let ids: HashSet<String> = got
        .iter()
        .map(|r| r.headers["webhook-id"].to_str().expect("ascii").to_string())
        .collect();
    assert_eq!(ids.len(), 500, "every acknowledged job was delivered");
    eprintln!(
        "redis restart under load: 500 jobs, {} deliveries ({} repeated)",
        got.len(),
        got.len() - 500
    );
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn metrics_expose_the_named_series() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": "m-1", "topic": "metered", "url": receiver.url("/")}),
    )
    .await;
    receiver.wait_for_count(1, Duration::from_secs(10)).await;
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("get")
        .text()
        .await
        .expect("text");
    for series in [
        "hookq_jobs{state=\"scheduled\"}",
        "hookq_attempts_total{",
        "topic=\"metered\"",
        "hookq_lateness_seconds_bucket",
        "hookq_attempt_duration_seconds_bucket",
        "hookq_workers ",
        "hookq_workers_busy",
    ] {
        assert!(
            text.contains(series),
            "{series} missing from /metrics:\n{text}"
        );
    }
    daemon.stop().await.expect("clean stop");
}

#[test]
fn systemd_unit_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/hookq.service");
    let unit = std::fs::read_to_string(path).expect("unit file");
    let verified = Command::new("systemd-analyze")
        .arg("verify")
        .arg(path)
        .output()
        .ok()
        .filter(|o| o.status.code().is_some());
    if let Some(out) = verified {
        let stderr = String::from_utf8_lossy(&out.stderr);
        // The binary is not installed on the test machine; only complain about the unit itself.
        let real: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.contains("/usr/local/bin/hookq") && !l.trim().is_empty())
            .collect();
        assert!(real.is_empty(), "systemd-analyze verify: {stderr}");
    }
    // Parse check: sections, and the sandboxing the issue asks for.
    let mut section = String::new();
    let mut keys = HashSet::new();
    for line in unit
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        if line.starts_with('[') {
            assert!(line.ends_with(']'), "bad section line {line}");
            section = line.to_string();
            continue;
        }
        let (key, _) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not key=value: {line}"));
        keys.insert(format!("{section}{key}"));
    }
    for key in [
        "[Unit]After",
        "[Service]ExecStart",
        "[Service]DynamicUser",
        "[Service]ProtectSystem",
        "[Service]NoNewPrivileges",
        "[Service]PrivateTmp",
        "[Service]RestrictAddressFamilies",
        "[Service]KillSignal",
        "[Install]WantedBy",
    ] {
        assert!(keys.contains(key), "{key} missing from the unit");
    }
    assert!(unit.contains("redis-server.service"));
}
