//! Hosts (SPEC §11.1): jobs wait in memory for their host instead of going
//! back and forth to Redis; per-host rate limits hold across daemons.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::receiver::{Receiver, Recorded, Reply};
use crate::support::redis::RedisServer;
use crate::{post_json, start_daemon, test_config};

async fn sequence_total(redis: &RedisServer, partitions: u16) -> i64 {
    redis
        .due_sequence_total(partitions)
        .await
        .expect("read the due-set sequences")
}

async fn create_batch(base: &str, jobs: Vec<Value>) {
    let n = jobs.len();
    let (status, answer) = post_json(&format!("{base}/v1/jobs/batch"), json!({"jobs": jobs})).await;
    assert_eq!(status, 200, "{answer}");
    let created = answer["results"]
        .as_array()
        .map_or(0, |r| r.iter().filter(|x| x["status"] == 201).count());
    assert_eq!(created, n, "{answer}");
}

#[tokio::test]
async fn jobs_for_a_busy_host_wait_in_memory_not_in_redis() {
    let redis = RedisServer::start();
    let slow = Receiver::slow(204, Duration::from_millis(20)).await;
    let mut config = test_config(&redis);
    config.delivery.per_host_concurrency = 2;
    // Leases long enough that no job has to be given back while it waits.
    config.delivery.lease_margin = Duration::from_secs(20);
    let daemon = start_daemon(&config).await;
    let sequence_before = sequence_total(&redis, config.redis.partitions).await;
    let jobs: Vec<Value> = (0..60)
        .map(|i| json!({"id": format!("busy-{i}"), "url": slow.url("/busy")}))
        .collect();
    create_batch(&daemon.url(), jobs).await;
    slow.wait_for_count(60, Duration::from_secs(60)).await;
    assert_eq!(
        slow.count_distinct("webhook-id"),
        60,
        "a job was delivered twice"
    );
    // Due now, the jobs went straight to the ready lists; none went back to
    // a due set.
    assert_eq!(
        sequence_total(&redis, config.redis.partitions).await,
        sequence_before,
        "jobs waiting for a slot were given back to Redis"
    );
    daemon.stop().await.expect("clean stop");
}

/// Requests per whole second of the receiver's clock (which is Redis's: one machine).
fn per_second(requests: &[Recorded]) -> BTreeMap<u64, usize> {
    let mut windows = BTreeMap::new();
    for r in requests {
        *windows.entry(r.received_ms() as u64 / 1000).or_insert(0) += 1;
    }
    windows
}

#[tokio::test]
async fn two_daemons_share_one_rate_limit() {
    const RATE: usize = 20;
    const JOBS: usize = 70;
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let mut config = test_config(&redis);
    config.delivery.per_host_rate = RATE as f64;
    // Few workers each, so both daemons claim part of the jobs.
    config.delivery.workers = 4;
    config.delivery.claim_batch = 2;
    config.delivery.lease_margin = Duration::from_secs(20);
    let first = start_daemon(&config).await;
    let second = start_daemon(&config).await;
    let started = Instant::now();
    let jobs: Vec<Value> = (0..JOBS)
        .map(|i| json!({"id": format!("rate-{i}"), "url": receiver.url("/r")}))
        .collect();
    create_batch(&first.url(), jobs).await;
    let requests = receiver.wait_for_count(JOBS, Duration::from_secs(60)).await;
    let took = started.elapsed();
    let windows = per_second(&requests);
    eprintln!("{JOBS} jobs at {RATE}/s over two daemons took {took:?}: per second {windows:?}");
    // A request granted at the very end of a window may arrive in the next.
    for (second, n) in &windows {
        assert!(
            *n <= RATE + 3,
            "{n} requests in second {second} (limit {RATE}/s): {windows:?}"
        );
    }
    // Together never faster than the rate: JOBS requests span at least
    // (JOBS - RATE) / RATE seconds (the first window may be used in full).
    let span = Duration::from_secs_f64((JOBS - RATE - 3) as f64 / RATE as f64);
    assert!(
        took >= span,
        "{JOBS} requests at {RATE}/s took only {took:?}"
    );
    first.stop().await.expect("clean stop");
    second.stop().await.expect("clean stop");
}

/// The host key of a receiver, percent-encoded for a path.
fn host_path(receiver: &Receiver) -> String {
    let host = format!("http://{}", receiver.addr());
    url::form_urlencoded::byte_serialize(host.as_bytes()).collect()
}

async fn host_view(base: &str, receiver: &Receiver) -> Value {
    let (status, view) = crate::get_json(&format!("{base}/v1/hosts/{}", host_path(receiver))).await;
    assert_eq!(status, 200, "{view}");
    view
}

/// Requests per job (by `webhook-id`).
fn requests_per_job(receiver: &Receiver) -> BTreeMap<String, u64> {
    let mut per_job = BTreeMap::new();
    for r in receiver.requests() {
        let id = r.header("webhook-id").unwrap_or_default().to_string();
        *per_job.entry(id).or_insert(0) += 1;
    }
    per_job
}

/// A host failing every attempt opens after `breaker.failures`; its jobs
/// then wait without attempts (only probes reach it) and survive a kill -9
/// of the daemon; once it answers, a probe closes it and every job is
/// delivered with exactly as many attempts as requests it made.
#[tokio::test]
async fn the_breaker_opens_probes_closes_and_jobs_keep_their_attempts() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let redis = RedisServer::start();
    let failing = Arc::new(AtomicBool::new(true));
    let flag = failing.clone();
    let receiver = Receiver::start(Arc::new(move |_: &Recorded| {
        Reply::status(if flag.load(Ordering::SeqCst) {
            500
        } else {
            204
        })
    }))
    .await;
    let env = [
        ("HOOKQ_BREAKER__FAILURES", "3"),
        ("HOOKQ_BREAKER__OPEN_FOR", "300ms"),
        ("HOOKQ_BREAKER__MAX_OPEN", "1s"),
        (
            "HOOKQ_DELIVERY__RETRY",
            "[\"50ms\",\"50ms\",\"50ms\",\"50ms\",\"50ms\",\"50ms\",\"50ms\",\"50ms\"]",
        ),
        ("HOOKQ_DELIVERY__TIMEOUT", "2s"),
    ];
    let (serve, base) = crate::ops::serve_ready(&redis, &env).await;
    let jobs: Vec<Value> = (0..10)
        .map(|i| json!({"id": format!("brk-{i}"), "url": receiver.url("/b")}))
        .collect();
    create_batch(&base, jobs).await;
    crate::support::wait_until("the host opens", Duration::from_secs(30), || async {
        host_view(&base, &receiver).await["state"] == "open"
    })
    .await;
    let view = host_view(&base, &receiver).await;
    assert!(view["consecutive_failures"].as_u64() >= Some(3), "{view}");
    assert!(view["next_probe_at"].is_string(), "{view}");
    // Two probes (the first round is at most one request per job) fail.
    crate::support::wait_until(
        "two probes reach the host",
        Duration::from_secs(30),
        || async { receiver.count() >= 12 },
    )
    .await;
    let state = host_view(&base, &receiver).await["state"].clone();
    assert!(
        state == "open" || state == "half_open",
        "failed probes keep it open: {state}"
    );

    // kill -9 while open, a new daemon, and the host recovers.
    drop(serve);
    let (_serve, base) = crate::ops::serve_ready(&redis, &env).await;
    failing.store(false, Ordering::SeqCst);
    let view = |id: String| {
        let base = base.clone();
        async move { crate::job_view(&base, &id).await }
    };
    crate::support::wait_until(
        "every job is delivered",
        Duration::from_secs(60),
        || async {
            let mut all = true;
            for i in 0..10 {
                all &= view(format!("brk-{i}")).await["state"] == "delivered";
            }
            all
        },
    )
    .await;
    let per_job = requests_per_job(&receiver);
    for i in 0..10 {
        let id = format!("brk-{i}");
        let v = view(id.clone()).await;
        assert_eq!(
            v["attempts"].as_u64(),
            per_job.get(&id).copied(),
            "{id}: attempts counted without a request while its host was open: {v}"
        );
    }
    let host = host_view(&base, &receiver).await;
    assert_eq!(host["state"], "closed", "{host}");
    assert_eq!(host["waiting"], 0, "{host}");
}

/// A 503 with `Retry-After` pauses the host for every daemon: nothing
/// reaches it before the pause ends, then its waiting jobs are delivered.
#[tokio::test]
async fn retry_after_pauses_the_host_for_every_daemon() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let redis = RedisServer::start();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let receiver = Receiver::start(Arc::new(move |_: &Recorded| {
        if counter.fetch_add(1, Ordering::SeqCst) == 0 {
            Reply::status(503).with_header("retry-after", "2")
        } else {
            Reply::status(204)
        }
    }))
    .await;
    let mut config = test_config(&redis);
    config.delivery.lease_margin = Duration::from_secs(5);
    let first = start_daemon(&config).await;
    let second = start_daemon(&config).await;
    crate::post_created(
        &format!("{}/v1/jobs", first.url()),
        json!({"id": "ra-0", "url": receiver.url("/ra")}),
    )
    .await;
    receiver.wait_for_count(1, Duration::from_secs(10)).await;
    crate::support::wait_until("the host is paused", Duration::from_secs(10), || async {
        host_view(&second.url(), &receiver).await["state"] == "paused"
    })
    .await;
    let view = host_view(&second.url(), &receiver).await;
    assert_eq!(view["reason"], "retry_after", "{view}");
    let jobs: Vec<Value> = (1..6)
        .map(|i| json!({"id": format!("ra-{i}"), "url": receiver.url("/ra")}))
        .collect();
    create_batch(&second.url(), jobs).await;
    let requests = receiver.wait_for_count(7, Duration::from_secs(30)).await;
    let paused_at = requests[0].received_at;
    for r in &requests[1..] {
        let after = r.received_at.duration_since(paused_at).unwrap_or_default();
        assert!(
            after >= Duration::from_millis(1950),
            "a request reached the paused host {after:?} after its Retry-After: 2"
        );
    }
    assert_eq!(requests_per_job(&receiver).len(), 6, "every job arrived");
    first.stop().await.expect("clean stop");
    second.stop().await.expect("clean stop");
}

/// An operator's pause holds a host's jobs (without attempts) until resume,
/// through the API and the CLI; a malformed host is a 400 naming `host`.
#[tokio::test]
async fn pause_and_resume_hold_and_release_a_host() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let mut config = test_config(&redis);
    config.delivery.lease_margin = Duration::from_secs(5);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let (status, answer) =
        post_json(&format!("{base}/v1/hosts/ftp%3A%2F%2Fx/pause"), json!({})).await;
    assert_eq!(
        (status, &answer["error"]["field"]),
        (400, &json!("host")),
        "{answer}"
    );
    let (status, answer) = post_json(
        &format!("{base}/v1/hosts/{}/pause", host_path(&receiver)),
        json!({}),
    )
    .await;
    assert_eq!(
        (status, &answer["state"]),
        (200, &json!("paused")),
        "{answer}"
    );
    let jobs: Vec<Value> = (0..5)
        .map(|i| json!({"id": format!("held-{i}"), "url": receiver.url("/p")}))
        .collect();
    create_batch(&base, jobs).await;
    crate::support::wait_until(
        "the jobs wait for the host",
        Duration::from_secs(20),
        || async { host_view(&base, &receiver).await["waiting"] == 5 },
    )
    .await;
    assert_eq!(receiver.count(), 0, "a paused host was called");
    let (_, stats) = crate::get_json(&format!("{base}/v1/stats")).await;
    assert_eq!(
        (&stats["held_for_host"], &stats["scheduled"]),
        (&json!(5), &json!(5)),
        "held jobs count as scheduled: {stats}"
    );
    let (status, listed) = crate::get_json(&format!("{base}/v1/hosts?state=paused")).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(
        listed["hosts"][0]["host"],
        format!("http://{}", receiver.addr()),
        "{listed}"
    );

    // Resumed from the CLI.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookq"))
        .args(["hosts", "resume", &format!("http://{}", receiver.addr())])
        .env("HOOKQ_REDIS__URL", redis.url())
        .env(
            "HOOKQ_REDIS__PARTITIONS",
            config.redis.partitions.to_string(),
        )
        .output()
        .expect("hookq hosts resume");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("closed"));
    receiver.wait_for_count(5, Duration::from_secs(20)).await;
    for i in 0..5 {
        let v = crate::job_view(&base, &format!("held-{i}")).await;
        crate::support::wait_until("delivered", Duration::from_secs(10), || async {
            crate::job_view(&base, &format!("held-{i}")).await["state"] == "delivered"
        })
        .await;
        assert!(v["attempts"].as_u64() <= Some(1), "{v}");
    }
    daemon.stop().await.expect("clean stop");
}

/// Operational events reach `alerts.url` in signed batches that the official
/// Standard Webhooks library verifies: a host opening, a dead letter, an
/// operator's pause and resume.
#[tokio::test]
async fn alerts_are_signed_batches_of_operational_events() {
    use crate::delivery::{headers_of, verify_with_standardwebhooks, SECRET};
    let redis = RedisServer::start();
    let alerts = Receiver::ok().await;
    let failing = Receiver::with_status(500).await;
    let gone = Receiver::with_status(410).await;
    let mut config = test_config(&redis);
    config.alerts.url = alerts.url("/alerts");
    config.alerts.signing_secret = SECRET.into();
    config.breaker.failures = 2;
    config.breaker.open_for = Duration::from_secs(30);
    config.delivery.retry = vec![Duration::from_millis(50); 4];
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    create_batch(
        &base,
        vec![
            json!({"id": "al-1", "url": failing.url("/f")}),
            json!({"id": "al-2", "url": failing.url("/f")}),
            json!({"id": "al-dead", "url": gone.url("/g")}),
        ],
    )
    .await;
    let types = || {
        let mut seen = std::collections::BTreeSet::new();
        for r in alerts.requests() {
            for event in r.json().as_array().into_iter().flatten() {
                seen.insert(event["type"].as_str().unwrap_or_default().to_string());
            }
        }
        seen
    };
    crate::support::wait_until(
        "host.opened and job.dead_lettered",
        Duration::from_secs(30),
        || async {
            let seen = types();
            seen.contains("host.opened") && seen.contains("job.dead_lettered")
        },
    )
    .await;
    let gone_path = host_path(&gone);
    for action in ["pause", "resume"] {
        let (status, answer) =
            post_json(&format!("{base}/v1/hosts/{gone_path}/{action}"), json!({})).await;
        assert_eq!(status, 200, "{answer}");
    }
    crate::support::wait_until(
        "host.paused and host.closed",
        Duration::from_secs(30),
        || async {
            let seen = types();
            seen.contains("host.paused") && seen.contains("host.closed")
        },
    )
    .await;
    let requests = alerts.requests();
    for r in &requests {
        for event in r.json().as_array().expect("a batch is a JSON array") {
            assert!(
                event["at"].is_string() && event["data"].is_object(),
                "{event}"
            );
        }
    }
    let dead = requests
        .iter()
        .flat_map(|r| r.json().as_array().cloned().unwrap_or_default())
        .find(|e| e["type"] == "job.dead_lettered")
        .expect("a dead-letter event");
    assert_eq!(dead["data"]["id"], "al-dead", "{dead}");
    let signed: Vec<_> = requests
        .iter()
        .map(|r| (headers_of(r), r.body.clone()))
        .collect();
    let verdicts = verify_with_standardwebhooks(SECRET, &signed);
    assert!(
        !verdicts.is_empty() && verdicts.iter().all(|v| v == "ok"),
        "{verdicts:?}"
    );
    daemon.stop().await.expect("clean stop");
}
