//! Endpoint chaos: a receiver written on raw TCP that, per connection, answers
//! 200, answers 500, resets the connection, stalls forever, sends bytes that
//! are not HTTP, or trickles a valid response a byte at a time. Every job must
//! end delivered or dead per the ladder, none stuck in flight, and a healthy
//! host next to it must get all its jobs. Set `HOOKQ_CHAOS_JOBS` for a longer
//! run (default 300 jobs per host).

use std::collections::HashMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::process::OwnedProcess;
use crate::support::receiver::Receiver;
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{get_json, job_view, post_json, start_daemon, test_config};

/// What the chaos receiver does with one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Behaviour {
    Ok,
    ServerError,
    Reset,
    Stall,
    Garbage,
    Trickle,
}

const BEHAVIOURS: [Behaviour; 6] = [
    Behaviour::Ok,
    Behaviour::ServerError,
    Behaviour::Reset,
    Behaviour::Stall,
    Behaviour::Garbage,
    Behaviour::Trickle,
];

/// Reads until the end of the request head (the bodies hookq sends here are
/// small and arrive with it).
async fn read_head(stream: &mut TcpStream) {
    let mut buf = vec![0u8; 8192];
    let mut seen = Vec::new();
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf)).await
    {
        if n == 0 {
            return;
        }
        seen.extend_from_slice(&buf[..n]);
        if seen.windows(4).any(|w| w == b"\r\n\r\n") {
            return;
        }
    }
}

async fn serve_connection(mut stream: TcpStream, behaviour: Behaviour) {
    read_head(&mut stream).await;
    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";
    match behaviour {
        Behaviour::Ok => {
            let _ = stream.write_all(OK).await;
        }
        Behaviour::ServerError => {
            let _ = stream
                .write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\nconnection: close\r\n\r\noops")
                .await;
        }
        Behaviour::Reset => {
            // SO_LINGER 0: closing sends RST instead of FIN.
            let _ = stream.set_zero_linger();
            drop(stream);
        }
        Behaviour::Stall => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Behaviour::Garbage => {
            let _ = stream
                .write_all(b"\x00\xffTHIS IS NOT HTTP\r\n\r\n\x07")
                .await;
        }
        Behaviour::Trickle => {
            for byte in OK {
                if stream.write_all(&[*byte]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        }
    }
}

/// Starts the chaos receiver; returns its URL and a count of connections per
/// behaviour.
async fn chaos_receiver(
    seed: u64,
) -> (
    String,
    std::sync::Arc<std::sync::Mutex<HashMap<Behaviour, usize>>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(HashMap::new()));
    let counts = seen.clone();
    tokio::spawn(async move {
        let mut rng = StdRng::seed_from_u64(seed);
        while let Ok((stream, _)) = listener.accept().await {
            let behaviour = BEHAVIOURS[rng.random_range(0..BEHAVIOURS.len())];
            if let Ok(mut c) = counts.lock() {
                *c.entry(behaviour).or_insert(0) += 1;
            }
            tokio::spawn(serve_connection(stream, behaviour));
        }
    });
    (url, seen)
}

#[tokio::test]
async fn a_chaotic_endpoint_ends_every_job_delivered_or_dead() {
    let jobs = crate::env_count("HOOKQ_CHAOS_JOBS", 300);
    let seed: u64 = rand::rng().random();
    eprintln!("endpoint chaos seed {seed}");
    let (chaos_url, behaviours) = chaos_receiver(seed).await;
    let healthy = Receiver::ok().await;
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.delivery.workers = 16;
    config.delivery.per_host_concurrency = 4;
    config.delivery.timeout = Duration::from_millis(300);
    config.delivery.retry = vec![Duration::from_millis(20), Duration::from_millis(40)];
    // The ladder is what this test exercises; the breaker (which would hold
    // the chaotic host's jobs for a probe) has tests of its own in hosts.rs.
    config.breaker.failures = 0;
    let daemon = start_daemon(&config).await;
    let base = daemon.url();

    let all: Vec<Value> = (0..jobs)
        .flat_map(|i| {
            [
                json!({"id": format!("chaos-{i}"), "url": chaos_url, "delay": format!("{}ms", i % 500)}),
                json!({"id": format!("fine-{i}"), "url": healthy.url("/"), "delay": format!("{}ms", i % 500)}),
            ]
        })
        .collect();
    for chunk in all.chunks(1000) {
        let (status, answer) =
            post_json(&format!("{base}/v1/jobs/batch"), json!({"jobs": chunk})).await;
        assert_eq!(status, 200, "{answer}");
    }

    // The healthy host gets everything, whatever the other one does.
    wait_until(
        "the healthy host got every job",
        Duration::from_secs(60),
        || async { healthy.count_distinct("webhook-id") >= jobs },
    )
    .await;
    // Every job ends: nothing scheduled, ready or in flight any more.
    let stats_url = format!("{base}/v1/stats");
    wait_until(
        "every job is delivered or dead",
        Duration::from_secs(60),
        || async {
            let (_, s) = get_json(&stats_url).await;
            s["scheduled"] == 0 && s["ready"] == 0 && s["inflight"] == 0
        },
    )
    .await;

    let mut outcomes: HashMap<String, usize> = HashMap::new();
    for i in 0..jobs {
        let (status, view) = get_json(&format!("{base}/v1/jobs/chaos-{i}")).await;
        assert_eq!(status, 200);
        let state = view["state"].as_str().unwrap_or_default().to_string();
        let attempts = view["attempts"].as_u64().unwrap_or(0);
        match state.as_str() {
            "delivered" => assert!((1..=3).contains(&attempts), "{view}"),
            "dead" => assert_eq!(attempts, 3, "dead only after the whole ladder: {view}"),
            other => panic!("chaos-{i} ended {other}: {view}"),
        }
        *outcomes.entry(state).or_default() += 1;
    }
    for i in (0..jobs).step_by(37) {
        let view = job_view(&base, &format!("fine-{i}")).await;
        assert_eq!(view["state"], "delivered", "{view}");
    }
    eprintln!(
        "endpoint chaos: {jobs} chaotic jobs → {outcomes:?}; connections by behaviour {:?}; {jobs} healthy jobs all delivered",
        behaviours.lock().map(|b| b.clone()).unwrap_or_default()
    );
    daemon.stop().await.expect("clean stop");
}

/// libfaketime's preload library, where Debian and Ubuntu put it.
fn libfaketime() -> std::path::PathBuf {
    let candidates = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("faketime/libfaketime.so.1"))
        .chain([std::path::PathBuf::from(
            "/usr/lib/faketime/libfaketime.so.1",
        )]);
    for path in candidates {
        if path.exists() {
            return path;
        }
    }
    panic!("libfaketime.so.1 is missing: scripts/test.sh installs it (apt-get install faketime)");
}

/// The environment entry that marks this test process's skewed daemons.
fn skew_mark() -> String {
    format!("clock-skew-{}", std::process::id())
}

/// Starts `hookq serve` with its clock shifted by `shift` (e.g. `+5m`):
/// libfaketime is preloaded into hookq itself (no `faketime` wrapper, whose
/// death would orphan hookq). libfaketime creates two `/dev/shm` files named
/// after the process and leaves them when it is killed: the guard removes them.
fn spawn_skewed(redis: &RedisServer, port: u16, shift: &str) -> OwnedProcess {
    let mut command = crate::ops::serve_command(
        std::process::Command::new(env!("CARGO_BIN_EXE_hookq")),
        redis,
        port,
    );
    command
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME", shift)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("HOOKQ_LOG__LEVEL", "info")
        .env("HOOKQ_TEST_MARK", skew_mark());
    let mut daemon = OwnedProcess::spawn(command, &format!("hookq serve, clock {shift}"));
    daemon.removes_on_drop(faketime_shm_files(daemon.pid()));
    daemon
}

/// The shared-memory files libfaketime creates for process `pid`.
fn faketime_shm_files(pid: u32) -> [std::path::PathBuf; 2] {
    [
        format!("/dev/shm/faketime_shm_{pid}").into(),
        format!("/dev/shm/sem.faketime_sem_{pid}").into(),
    ]
}

/// Seconds between the first log line's timestamp and the real clock: proves
/// the skew reached the daemon.
async fn log_skew_seconds(daemon: &OwnedProcess) -> i64 {
    let mut log = String::new();
    wait_until("the daemon logs a line", Duration::from_secs(30), || {
        log = daemon.log();
        let found = log.lines().any(|l| l.contains("20") && l.contains('Z'));
        async move { found }
    })
    .await;
    let line = log
        .lines()
        .find(|l| l.contains("20") && l.contains('Z'))
        .expect("a log line");
    let start = line.find("20").expect("a timestamp");
    let rest = &line[start..];
    let stamp = &rest[..rest.find('Z').map(|z| z + 1).unwrap_or(rest.len())];
    let logged = time::OffsetDateTime::parse(stamp, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("log timestamp {stamp:?}: {e}"));
    (logged - time::OffsetDateTime::now_utc()).whole_seconds()
}

/// Every process on the machine whose environment holds `mark` (the
/// `HOOKQ_TEST_MARK=...` entry a test gives the processes it starts).
fn processes_marked(mark: &str) -> Vec<String> {
    let mark = mark.as_bytes();
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read(e.path().join("environ"))
                .map(|env| env.split(|b| *b == 0).any(|kv| kv == mark))
                .unwrap_or(false)
        })
        .map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            format!(
                "{}: {}",
                e.file_name().to_string_lossy(),
                String::from_utf8_lossy(&cmdline).replace('\0', " ")
            )
        })
        .collect()
}

/// Two daemons whose local clocks are 5 minutes ahead and 5 minutes behind
/// share one Redis: no job is delivered before its due time or twice, since
/// Redis `TIME` is the only clock that decides.
#[tokio::test]
async fn daemons_with_skewed_clocks_are_never_early_nor_double() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let ports = [crate::ops::free_port(), crate::ops::free_port()];
    let ahead = spawn_skewed(&redis, ports[0], "+5m");
    let behind = spawn_skewed(&redis, ports[1], "-5m");
    let skews = [
        log_skew_seconds(&ahead).await,
        log_skew_seconds(&behind).await,
    ];
    assert!(
        (290..=310).contains(&skews[0]),
        "clock ahead by {}s",
        skews[0]
    );
    assert!(
        (-310..=-290).contains(&skews[1]),
        "clock behind by {}s",
        skews[1]
    );
    for port in ports {
        crate::ops::wait_ready(port).await;
    }

    let jobs = 300;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let due: Vec<i64> = (0..jobs)
        .map(|i| now + 1000 + (i as i64 * 13) % 2000)
        .collect();
    for (half, port) in ports.iter().enumerate() {
        let items: Vec<Value> = (0..jobs)
            .filter(|i| i % 2 == half)
            .map(|i| json!({"id": format!("skew-{i}"), "url": receiver.url("/"), "run_at": due[i]}))
            .collect();
        let (status, answer) = post_json(
            &format!("http://127.0.0.1:{port}/v1/jobs/batch"),
            json!({"jobs": items}),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
    }
    receiver.wait_for_count(jobs, Duration::from_secs(30)).await;
    // Every job finished in Redis, then both daemons gone: no attempt can
    // arrive after the count below, so a late duplicate cannot slip past.
    crate::wait_until_idle(&crate::ops::base_url(ports[0]), Duration::from_secs(30)).await;
    drop((ahead, behind));
    let survivors = processes_marked(&format!("HOOKQ_TEST_MARK={}", skew_mark()));
    assert!(
        survivors.is_empty(),
        "processes of this test survived it: {survivors:?}"
    );
    let got = receiver.requests();
    let settle = got.len();
    let mut early = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for r in &got {
        let id = r.header("webhook-id").unwrap_or_default().to_string();
        let i: usize = id.trim_start_matches("skew-").parse().expect("id");
        let at = r.received_ms();
        if at < due[i] {
            early.push((id.clone(), due[i] - at));
        }
        assert!(seen.insert(id.clone()), "{id} delivered twice");
    }
    eprintln!(
        "clock skew: daemons at {:+}s and {:+}s, {jobs} jobs, {} deliveries, early {early:?}",
        skews[0], skews[1], settle
    );
    assert!(
        early.is_empty(),
        "delivered before due (id, ms early): {early:?}"
    );
    assert_eq!(seen.len(), jobs);
}
