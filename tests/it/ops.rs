//! Operating hookq: the CLI against a real Redis, crash-safe replay, graceful
//! shutdown of the real binary, Redis outages under load, metrics, systemd.

use std::collections::HashSet;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hookq::job::JobInput;
use hookq::store::Store;
use redis::AsyncCommands;
use serde_json::{json, Value};

use crate::support::process::OwnedProcess;
use crate::support::receiver::{Receiver, Recorded, Reply};
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{job_view, metric_sum, post_created, post_json, start_daemon, test_config};

const BIN: &str = env!("CARGO_BIN_EXE_hookq");

/// Runs `hookq <args>` against `redis` with namespace `ns` (and the 4
/// partitions of `test_config`).
pub(crate) fn hookq(redis: &RedisServer, ns: &str, args: &[&str]) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env("HOOKQ_REDIS__URL", redis.url())
        .env("HOOKQ_REDIS__NAMESPACE", ns)
        .env("HOOKQ_REDIS__PARTITIONS", "4")
        .env("HOOKQ_DELIVERY__ALLOW_PRIVATE", "true")
        .env_remove("HOOKQ_CONFIG");
    crate::output_within(command, CLI_DEADLINE)
}

/// How long one CLI run may take before the test fails.
const CLI_DEADLINE: Duration = Duration::from_secs(60);

fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

pub(crate) use crate::support::free_port;

/// Starts `hookq serve` as a real process, owned by the returned guard (its
/// log is shown only if the test fails).
pub(crate) fn spawn_serve(
    redis: &RedisServer,
    port: u16,
    extra_env: &[(&str, &str)],
) -> OwnedProcess {
    let mut command = serve_command(Command::new(BIN), redis, port);
    for (k, v) in extra_env {
        command.env(k, v);
    }
    OwnedProcess::spawn(command, &format!("hookq serve on port {port}"))
}

/// `hookq serve` with the test environment: `redis`, 4 partitions, the API
/// on `port`, private targets allowed, warnings only.
pub(crate) fn serve_command(mut command: Command, redis: &RedisServer, port: u16) -> Command {
    command
        .arg("serve")
        .env("HOOKQ_REDIS__URL", redis.url())
        .env("HOOKQ_REDIS__PARTITIONS", "4")
        .env("HOOKQ_API__LISTEN", format!("127.0.0.1:{port}"))
        .env("HOOKQ_DELIVERY__ALLOW_PRIVATE", "true")
        .env("HOOKQ_LOG__LEVEL", "warn")
        .env_remove("HOOKQ_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    command
}

/// `n` daemon processes (`hookq serve` with `extra_env`) on `redis`, each
/// on a free port, once all of them are ready: the processes and ports.
pub(crate) async fn spawn_ready(
    redis: &RedisServer,
    n: usize,
    extra_env: &[(&str, &str)],
) -> (Vec<OwnedProcess>, Vec<u16>) {
    let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let daemons = ports
        .iter()
        .map(|&p| spawn_serve(redis, p, extra_env))
        .collect();
    for &p in &ports {
        wait_ready(p).await;
    }
    (daemons, ports)
}

/// `hookq serve` (as [`spawn_serve`], with `extra_env`) on `redis` and a
/// free port, once it is ready: the process and its API's base URL.
pub(crate) async fn serve_ready(
    redis: &RedisServer,
    extra_env: &[(&str, &str)],
) -> (OwnedProcess, String) {
    let port = free_port();
    let process = spawn_serve(redis, port, extra_env);
    wait_ready(port).await;
    (process, base_url(port))
}

/// The base URL of the API of a daemon listening on loopback `port`.
pub(crate) fn base_url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// Waits (30 s at most) until `hookq serve` on `port` answers `/readyz` 200.
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
    assert_eq!(
        out.status.code(),
        Some(2),
        "a bad --url is a usage error: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("--url"));
    // Bad config names the key (exit 2).
    let mut command = Command::new(BIN);
    command.args(["stats"]).env("HOOKQ_DELIVERY__JITTER", "7");
    let out = crate::output_within(command, CLI_DEADLINE);
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

    // `hookq jobs` (alias `list`) lists, filtered by state and topic.
    for (id, topic) in [("j-1", "alpha"), ("j-2", "beta")] {
        let out = hookq(
            &redis,
            ns,
            &[
                "enqueue",
                "--url",
                "http://127.0.0.1:9/x",
                "--id",
                id,
                "--topic",
                topic,
                "--delay",
                "1h",
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = hookq(&redis, ns, &["--json", "jobs", "--state", "scheduled"]);
    let mut listed: Vec<String> = stdout_json(&out)
        .as_array()
        .expect("an array")
        .iter()
        .map(|j| j["id"].as_str().expect("id").to_string())
        .collect();
    listed.sort();
    assert_eq!(listed, ["c-1", "j-1", "j-2"]);
    let out = hookq(&redis, ns, &["list", "--topic", "beta"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("tenant   id") && text.contains("j-2") && !text.contains("j-1"),
        "{text}"
    );
    let out = hookq(&redis, ns, &["--json", "jobs", "--limit", "2"]);
    assert_eq!(stdout_json(&out).as_array().map(Vec::len), Some(2));
    for (args, flag) in [
        (&["jobs", "--state", "asleep"][..], "--state"),
        (&["jobs", "--limit", "0"][..], "--limit"),
        (&["jobs", "--topic", "a b"][..], "--topic"),
    ] {
        let out = hookq(&redis, ns, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
    }
    for id in ["j-1", "j-2"] {
        assert!(hookq(&redis, ns, &["cancel", id]).status.success());
    }

    let out = hookq(&redis, ns, &["cancel", "c-1"]);
    assert!(out.status.success());
    let out = hookq(&redis, ns, &["--json", "stats"]);
    assert_eq!(stdout_json(&out)["scheduled"], 0);
    // Three cancels (j-1, j-2, c-1); a second cancel of one counts nothing.
    assert!(hookq(&redis, ns, &["cancel", "c-1"]).status.success());
    let out = hookq(&redis, ns, &["--json", "stats"]);
    assert_eq!(stdout_json(&out)["cancelled"], 3);
    let out = hookq(&redis, ns, &["stats"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("cancelled") && l.trim_end().ends_with(" 3")),
        "{text}"
    );

    // Dead letters: make one with a 410, list it, dry-run, replay.
    let receiver = Receiver::with_status(410).await;
    let mut config = test_config(&redis);
    config.redis.namespace = ns.into();
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "dl-1", "topic": "pay", "url": receiver.url("/")}),
    )
    .await;
    wait_until("dl-1 dead", Duration::from_secs(10), || async {
        job_view(&base, "dl-1").await["state"] == "dead"
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
    // A selection refused in the CLI's words, not the API's (`ids`, `all: true`).
    for (args, flag) in [
        (&["replay", "--dead-letters"][..], "--id ID"),
        (
            &["replay", "--dead-letters", "--id", "a", "--all"][..],
            "--all",
        ),
        (
            &["replay", "--dead-letters", "--id", "a", "--topic", "t"][..],
            "--topic",
        ),
    ] {
        let out = hookq(&redis, ns, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(flag) && !err.contains("all: true") && !err.contains("ids"),
            "{args:?} answered in API words: {err}"
        );
    }
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
    assert_eq!(status("memory"), "warn", "the test Redis has no maxmemory");
    assert!(
        doctor_check(&report, "memory")["detail"]
            .as_str()
            .is_some_and(|d| d.contains("no maxmemory set") && d.contains("no jobs")),
        "{report}"
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

/// A Redis user that may not load scripts gets a scripts check that fails
/// and names what to allow: hookq loads a Functions library (`FUNCTION
/// LOAD`, run by `FCALL`), so the fix names those, not `EVALSHA`.
#[tokio::test]
async fn doctor_names_the_function_commands_a_user_without_scripting_lacks() {
    let redis = RedisServer::start();
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "noscripts",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-@scripting",
        ])
        .query_async(&mut conn)
        .await
        .expect("ACL SETUSER");
    let mut command = Command::new(BIN);
    command
        .args(["--json", "doctor"])
        .env(
            "HOOKQ_REDIS__URL",
            format!("redis://noscripts:pw@127.0.0.1:{}", redis.port()),
        )
        .env("HOOKQ_REDIS__PARTITIONS", "4")
        .env_remove("HOOKQ_CONFIG");
    let out = crate::output_within(command, CLI_DEADLINE);
    let report = stdout_json(&out);
    let scripts = doctor_check(&report, "scripts");
    assert_eq!(scripts["status"], "fail", "{report}");
    let fix = scripts["fix"].as_str().unwrap_or_default();
    assert!(
        fix.contains("FUNCTION LOAD") && fix.contains("FCALL") && fix.contains("+@scripting"),
        "{report}"
    );
}

/// The check called `name` of a `doctor --json` report (Null if absent).
fn doctor_check(report: &Value, name: &str) -> Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

/// A daemon delivers a steady 100 jobs a second to a loopback receiver;
/// kept for a day (the default `retention.finished`), their summaries would
/// take about 860 MB, far past a 32 MB `maxmemory`. (Multi-threaded: the
/// doctor runs as a blocking child process while the daemon delivers.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_warns_when_the_finish_rate_would_reach_maxmemory() {
    let redis = RedisServer::start_with(&["--maxmemory", "32mb"]);
    let receiver = Receiver::ok().await;
    let config = test_config(&redis);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    // 3,000 jobs due 10 ms apart: deliveries last about 30 s.
    for chunk in 0..3 {
        let jobs: Vec<Value> = (chunk * 1000..(chunk + 1) * 1000)
            .map(|i| json!({"id": format!("rate-{i}"), "url": receiver.url("/"), "delay": format!("{}ms", i * 10)}))
            .collect();
        let (status, _) = post_json(&format!("{base}/v1/jobs/batch"), json!({"jobs": jobs})).await;
        assert_eq!(status, 200);
    }
    receiver.wait_for_count(50, Duration::from_secs(15)).await;

    let out = hookq(&redis, "hookq", &["--json", "doctor"]);
    let report = stdout_json(&out);
    assert!(out.status.success(), "a warning is not a failure: {report}");
    let memory = doctor_check(&report, "memory");
    assert_eq!(memory["status"], "warn", "{memory}");
    let detail = memory["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("of maxmemory 32.0 MiB") && !detail.contains("finishing 0.0 jobs/s"),
        "{memory}"
    );
    let fix = memory["fix"].as_str().unwrap_or_default();
    assert!(
        fix.contains("CONFIG SET maxmemory") && fix.contains("retention.finished"),
        "{memory}"
    );
    assert!(
        receiver.count() < 3000,
        "the doctor ran while jobs were still being delivered"
    );
    daemon.stop().await.expect("clean stop");
}

/// Jobs held but none finishing, and room to spare: ok, with bytes per job.
#[tokio::test]
async fn doctor_memory_is_ok_without_a_finish_rate() {
    let redis = RedisServer::start_with(&["--maxmemory", "1gb"]);
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    // 1,000: the fewest the doctor computes bytes per job from.
    for i in 0..1000 {
        let input = JobInput {
            id: Some(format!("idle-{i}")),
            url: Some("http://127.0.0.1:9/".into()),
            delay: Some("1h".into()),
            ..JobInput::default()
        };
        crate::enqueue_direct(&store, &config, input).await;
    }
    let out = hookq(&redis, "hookq", &["doctor"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains(" memory "))
        .unwrap_or_else(|| panic!("no memory line in:\n{text}"));
    assert!(line.starts_with("ok "), "{line}");
    assert!(
        line.contains("1000 jobs held") && line.contains(" B per job"),
        "{line}"
    );
    assert!(
        line.contains("finishing 0.0 jobs/s") && line.contains("of maxmemory 1.0 GiB"),
        "{line}"
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
    let input = JobInput {
        id: Some("twice".into()),
        url: Some("http://127.0.0.1:9/".into()),
        retry: Some(Vec::new()),
        ..JobInput::default()
    };
    crate::enqueue_direct(&store, &config, input).await;
    let p = store.keys().partition_of("twice");
    let claimed = store.claim(p, 1).await.expect("claim").jobs.remove(0);
    let failure = hookq::store::Failure {
        record: "{}",
        last_error: "http_status: 500",
        last_status: Some(500),
        topic: "default",
        action: hookq::retry::FailAction::DeadLetter,
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
        .replay(&dead, &dead.job_json, 1)
        .await
        .expect("replay");
    assert_eq!(outcome, hookq::store::ReplayOutcome::Revived);
    let mut conn = redis.conn().await;
    let stale: String = conn
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
    let _: () = conn
        .hset(store.keys().dead_index(p), "twice", &stale)
        .await
        .expect("HSET");

    // Replaying again drops the stale entry and revives nothing.
    let report = hookq::deadletter::replay(
        &store,
        &config,
        &hookq::deadletter::Selection {
            ids: vec!["twice".into()],
            ..Default::default()
        },
        &hookq::deadletter::Revival::default(),
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
    let slow = Receiver::slow(200, Duration::from_millis(1500)).await;
    let (mut child, base) = serve_ready(&redis, &[("HOOKQ_DELIVERY__SHUTDOWN_GRACE", "10s")]).await;
    for i in 0..10 {
        let (status, _) = post_json(
            &format!("{base}/v1/jobs"),
            json!({"id": format!("slow-{i}"), "url": slow.url("/")}),
        )
        .await;
        assert_eq!(status, 201);
    }
    slow.wait_for_count(10, Duration::from_secs(10)).await;
    child.signal("TERM");
    let status = child.wait_exit(Duration::from_secs(15)).await;
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
        delay: (r.headers["hookq-attempt"] == "1").then_some(Duration::from_secs(5)),
        ..Reply::status(200)
    }))
    .await;
    let env = [
        ("HOOKQ_DELIVERY__SHUTDOWN_GRACE", "200ms"),
        ("HOOKQ_DELIVERY__TIMEOUT", "6s"),
        ("HOOKQ_DELIVERY__LEASE_MARGIN", "300ms"),
    ];
    let (mut child, base) = serve_ready(&redis, &env).await;
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "cut", "url": slow.url("/")}),
    )
    .await;
    slow.wait_for_count(1, Duration::from_secs(10)).await;
    child.signal("TERM");
    let status = child.wait_exit(Duration::from_secs(5)).await;
    assert!(status.success(), "exit status {status:?}");

    // A new daemon takes the job back when the lease (6.3 s) expires.
    let port = free_port();
    let mut child = spawn_serve(&redis, port, &env);
    let got = slow.wait_for_count(2, Duration::from_secs(20)).await;
    assert_eq!(got[1].headers["hookq-attempt"], "2");
    child.kill_9().await;
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
    post_created(
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

/// `/metrics` of the daemon at `base`, or "" while it does not answer.
async fn scrape(base: &str) -> String {
    match reqwest::get(format!("{base}/metrics")).await {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// The samples of series `name` in a `/metrics` text, each as (labels,
/// value) exactly as written (`""` for a series without labels).
fn series_samples<'a>(text: &'a str, name: &str) -> Vec<(&'a str, &'a str)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (series, value) = rest.rsplit_once(' ')?;
            (series.is_empty() || series.starts_with('{')).then_some((series, value))
        })
        .collect()
}

/// Waits up to 15 s until the series `name` (summed over its labels) is
/// above `above`; on a timeout, returns what it read last.
async fn series_moves(base: &str, name: &str, above: f64) -> Result<(), String> {
    let until = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let value = metric_sum(&scrape(base).await, name);
        if value > above {
            return Ok(());
        }
        if tokio::time::Instant::now() >= until {
            return Err(format!("{name} stayed at {value} (not above {above})"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Six series no other test moves, each caused on purpose in a real
/// `hookq serve` (the metrics recorder is process-wide, so an in-process
/// daemon would also count what the tests running beside it do): a delayed
/// job promoted, jobs waiting (in memory and in Redis) while both workers are
/// busy, a lease left to expire, a deferral behind a per-host limit of 1,
/// and Redis killed.
#[tokio::test]
async fn metrics_move_when_their_events_happen() {
    const SERIES: [&str; 6] = [
        "hookq_promoted_total",
        "hookq_oldest_ready_lag_seconds",
        "hookq_leases_expired_total",
        "hookq_deferred_total",
        "hookq_redis_errors_total",
        "hookq_oldest_waiting_lag_seconds",
    ];
    let mut redis = RedisServer::start();
    let ok = Receiver::ok().await;
    // Held long enough that the ready lag is seen although the job gauges
    // are read from Redis only every `STATS_EVERY` (2 s).
    let hold = Duration::from_millis(4500);
    let (slow_a, slow_b) = (
        Receiver::slow(200, hold).await,
        Receiver::slow(200, hold).await,
    );
    let env = [
        ("HOOKQ_DELIVERY__WORKERS", "2"),
        ("HOOKQ_DELIVERY__PER_HOST_CONCURRENCY", "1"),
        ("HOOKQ_DELIVERY__TIMEOUT", "5s"),
        // Long enough that jobs held in memory for a worker stay there (the
        // daemon's claim budget stays full while this test claims a job).
        ("HOOKQ_DELIVERY__LEASE_MARGIN", "10s"),
        ("HOOKQ_DELIVERY__RETRY", "[\"50ms\"]"),
    ];
    let (_serve, base) = serve_ready(&redis, &env).await;
    let jobs = format!("{base}/v1/jobs");
    // Each series is on /metrics from the start, at 0 (a missing series
    // would also sum to 0, and would hide its first event from increase()).
    let before = scrape(&base).await;
    for name in SERIES {
        let samples = series_samples(&before, name);
        assert!(
            !samples.is_empty() && samples.iter().all(|(_, v)| *v == "0"),
            "{name} is not on /metrics at 0 at start: {samples:?}\n{before}"
        );
    }
    let mut unmoved = Vec::new();

    // Promoted: a delayed job comes due.
    post_created(
        &jobs,
        json!({"id": "p-1", "url": ok.url("/"), "delay": "100ms"}),
    )
    .await;
    unmoved.extend(series_moves(&base, SERIES[0], 0.0).await.err());

    // Waiting and ready lag: both workers held by slow hosts; the daemon
    // holds two more jobs in memory (its claim budget is twice its workers)
    // and one more from its reserve (claimed at once when a ready list
    // starts while the budget is full), and the next waits in Redis's
    // ready list.
    post_created(&jobs, json!({"id": "hold-a", "url": slow_a.url("/")})).await;
    post_created(&jobs, json!({"id": "hold-b", "url": slow_b.url("/")})).await;
    wait_until("both workers are busy", Duration::from_secs(10), || async {
        slow_a.count() == 1 && slow_b.count() == 1
    })
    .await;
    for id in ["waits-1", "waits-2", "waits-3", "waits-4"] {
        post_created(&jobs, json!({"id": id, "url": ok.url("/")})).await;
    }
    unmoved.extend(series_moves(&base, SERIES[5], 0.2).await.err());
    unmoved.extend(series_moves(&base, SERIES[1], 0.2).await.err());

    // Lease expired: a "daemon" (this test) claims a job and never answers.
    let mut config = test_config(&redis);
    config.delivery.timeout = Duration::from_millis(200);
    config.delivery.lease_margin = Duration::from_millis(100);
    config.validate().expect("valid config");
    let store = Store::connect(&config).await.expect("store");
    let input = JobInput {
        id: Some("abandoned".into()),
        url: Some(ok.url("/")),
        ..JobInput::default()
    };
    crate::enqueue_direct(&store, &config, input).await;
    let claimed = store
        .claim(store.keys().partition_of("abandoned"), 10)
        .await
        .expect("claim");
    assert!(
        claimed.jobs.iter().any(|j| j.id == "abandoned"),
        "the test claimed the job while both workers were busy"
    );
    unmoved.extend(series_moves(&base, SERIES[2], 0.0).await.err());

    // Deferred: three jobs for one slow host with one slot: one runs, one
    // waits in memory (all the host can start within a second), one goes
    // back to Redis for a later turn.
    for id in ["d-1", "d-2", "d-3"] {
        post_created(&jobs, json!({"id": id, "url": slow_a.url("/d")})).await;
    }
    unmoved.extend(series_moves(&base, SERIES[3], 0.0).await.err());

    // Redis errors: the daemon's Redis is killed.
    redis.kill();
    unmoved.extend(series_moves(&base, SERIES[4], 0.0).await.err());

    assert!(unmoved.is_empty(), "series that did not move: {unmoved:#?}");
}

/// `systemd-analyze verify` accepts the unit (it runs without systemd
/// running: it only reads the file), and the unit sets the sandboxing the
/// README promises. `systemd-analyze` missing is a failure, not a skip:
/// `scripts/test.sh` installs it (Debian package `systemd`).
#[test]
fn systemd_unit_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/hookq.service");
    let unit = std::fs::read_to_string(path).expect("unit file");
    let child = Command::new("systemd-analyze")
        .arg("verify")
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "systemd-analyze cannot run ({e}): install it (`apt-get install systemd`; \
                 scripts/test.sh does) so that the unit file is verified"
            )
        });
    let out = crate::wait_output_within(child, CLI_DEADLINE, "systemd-analyze verify");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code().is_some(),
        "systemd-analyze verify was killed ({}): {stderr}",
        out.status
    );
    // The binary is not installed on the test machine; only complain about the unit itself.
    let real: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.contains("/usr/local/bin/hookq") && !l.trim().is_empty())
        .collect();
    assert!(real.is_empty(), "systemd-analyze verify: {stderr}");
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

#[tokio::test]
async fn logs_to_a_file_are_plain_text() {
    let redis = RedisServer::start();
    let port = free_port();
    let daemon = spawn_serve(&redis, port, &[("HOOKQ_LOG__LEVEL", "info")]);
    wait_ready(port).await;
    let log = daemon.log();
    assert!(log.contains("hookq serving"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "ANSI escape codes in a log file: {log:?}"
    );
}

#[tokio::test]
async fn show_spells_the_method_as_the_api_does_and_new_secret_makes_a_usable_secret() {
    let redis = RedisServer::start();
    let ns = "spell";
    let out = hookq(
        &redis,
        ns,
        &[
            "enqueue",
            "--id",
            "put-1",
            "--url",
            "http://127.0.0.1:9/x",
            "--method",
            "PUT",
            "--delay",
            "1h",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let out = hookq(&redis, ns, &["show", "put-1"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("PUT http://127.0.0.1:9/x"), "{text}");

    let secrets: Vec<String> = (0..2)
        .map(|_| {
            let out = hookq(&redis, ns, &["new-secret"]);
            assert!(out.status.success(), "{out:?}");
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        })
        .collect();
    assert_ne!(secrets[0], secrets[1]);
    for secret in &secrets {
        assert!(secret.starts_with("whsec_"), "{secret}");
        // The daemon accepts it as a signing secret.
        let config = format!("[delivery]\nsigning_secrets = [\"{secret}\"]\n");
        let mut config_file = tempfile::NamedTempFile::new().expect("temp file");
        std::io::Write::write_all(&mut config_file, config.as_bytes()).expect("write");
        let path = config_file.path().to_string_lossy().to_string();
        let out = hookq(&redis, ns, &["--config", &path, "stats"]);
        assert!(out.status.success(), "{secret} refused: {out:?}");
    }
}

/// Lateness and attempt duration are exported in seconds: a job due 1.5 s
/// ago whose receiver takes 1.5 s shows about 1.5 s in both sums (a real
/// `hookq serve` process, so no other test's observations are counted).
#[tokio::test]
async fn lateness_and_duration_are_measured_in_seconds() {
    let redis = RedisServer::start();
    let slow = Receiver::slow(200, Duration::from_millis(1500)).await;
    let (_daemon, base) = serve_ready(&redis, &[]).await;
    let run_at = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000 - 1500;
    crate::post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "late-1", "url": slow.url("/"), "run_at": run_at as i64}),
    )
    .await;
    crate::wait_state(&base, "late-1", "delivered").await;
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("get /metrics")
        .text()
        .await
        .expect("text");
    for series in [
        "hookq_lateness_seconds_sum",
        "hookq_attempt_duration_seconds_sum",
    ] {
        let seconds = crate::metric_sum(&text, series);
        assert!(
            (1.4..10.0).contains(&seconds),
            "{series} = {seconds}, expected about 1.5 s:\n{text}"
        );
    }
}

/// A password in `redis.url` never appears in what `doctor` or the CLI
/// print, whether Redis accepts it or not; the URL itself still shows, with
/// `***` for its credentials.
#[tokio::test]
async fn printed_redis_urls_hide_the_password() {
    let redis = RedisServer::start();
    let secret = "hunter2-do-not-print";
    redis
        .config_set("requirepass", secret)
        .await
        .expect("CONFIG SET requirepass");
    let good = format!("redis://:{secret}@127.0.0.1:{}", redis.port());
    let wrong = format!("redis://:wrong-{secret}@127.0.0.1:{}", redis.port());
    let runs: [(&str, &[&str]); 4] = [
        (&good, &["doctor"]),
        (&good, &["--json", "doctor"]),
        (&wrong, &["doctor"]),
        (&wrong, &["show", "some-job"]),
    ];
    for (url, args) in runs {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .env("HOOKQ_REDIS__URL", url)
            .env("HOOKQ_REDIS__PARTITIONS", "4")
            .env_remove("HOOKQ_CONFIG");
        let out = crate::output_within(command, CLI_DEADLINE);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !text.contains(secret),
            "hookq {args:?} printed the password:\n{text}"
        );
        assert!(
            text.contains("redis://***@127.0.0.1"),
            "hookq {args:?}:\n{text}"
        );
    }
}

/// 2,000 topics leave `/metrics` bounded: each of the first 100 topics gets
/// a label, the rest are counted as `other`. (A `hookq serve` of its own:
/// the metrics recorder is process-wide.)
#[tokio::test]
async fn metrics_topic_labels_are_bounded() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let (mut serve, base) = serve_ready(&redis, &[]).await;
    let jobs: Vec<Value> = (0..2000)
        .map(|i| json!({"id": format!("t-{i}"), "topic": format!("topic-{i}"), "url": receiver.url("/")}))
        .collect();
    for chunk in jobs.chunks(1000) {
        let (status, answer) =
            crate::post_json(&format!("{base}/v1/jobs/batch"), json!({"jobs": chunk})).await;
        assert_eq!(status, 200, "{answer}");
    }
    receiver.wait_for_count(2000, Duration::from_secs(60)).await;
    // The worker counts an attempt once its answer is read, which may be
    // just after the receiver counted the request: wait for the metric.
    let metrics_url = format!("{base}/metrics");
    let read_metrics = || async {
        reqwest::get(&metrics_url)
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics text")
    };
    crate::support::wait_until(
        "every attempt counted in hookq_attempts_total",
        Duration::from_secs(10),
        || async { crate::metric_sum(&read_metrics().await, "hookq_attempts_total") >= 2000.0 },
    )
    .await;
    let text = read_metrics().await;
    let topics: std::collections::HashSet<&str> = text
        .lines()
        .filter(|l| l.starts_with("hookq_attempts_total{"))
        .filter_map(|l| l.split("topic=\"").nth(1)?.split('"').next())
        .collect();
    assert!(topics.contains("other"), "{topics:?}");
    assert!(
        topics.len() <= hookq::worker::METRIC_TOPICS_MAX + 1,
        "{} topic labels",
        topics.len()
    );
    assert_eq!(
        crate::metric_sum(&text, "hookq_attempts_total"),
        2000.0,
        "every attempt is still counted"
    );
    serve.signal("TERM");
    let _ = serve.wait_exit(Duration::from_secs(10)).await;
}
