//! Hosts (SPEC §11.1): jobs wait in memory for their host instead of going
//! back and forth to Redis; per-host rate limits hold across daemons.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::inflight::InFlightReceiver;
use crate::support::receiver::{Receiver, Recorded, Reply};
use crate::support::redis::RedisServer;
use crate::{post_json, start_daemon, test_config, wait_until_idle};

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

/// `delivery.per_host_concurrency` = 2: the receiver never has more than
/// two of the host's attempts open at once, and has two (the limit is
/// reached, not just kept); the jobs waiting for a slot wait in memory,
/// not in Redis, and each is delivered once.
#[tokio::test]
async fn jobs_for_a_busy_host_wait_in_memory_not_in_redis() {
    let redis = RedisServer::start();
    let slow = InFlightReceiver::start(Duration::from_millis(20)).await;
    let mut config = test_config(&redis);
    config.delivery.per_host_concurrency = 2;
    // Leases long enough that no job has to be given back while it waits
    // (a job is given back after waiting half the margin; 60 jobs two at a
    // time take about 0.6 s).
    config.delivery.lease_margin = Duration::from_secs(5);
    let daemon = start_daemon(&config).await;
    let sequence_before = sequence_total(&redis, config.redis.partitions).await;
    let jobs: Vec<Value> = (0..60)
        .map(|i| json!({"id": format!("busy-{i}"), "url": slow.url("/busy")}))
        .collect();
    create_batch(&daemon.url(), jobs).await;
    wait_until_idle(&daemon.url(), Duration::from_secs(60)).await;
    // Stragglers (a repeat after a lease expired) arrive within a lease
    // (timeout + margin) of the last attempt's start: wait that long, and
    // a second more, before counting.
    tokio::time::sleep(
        config.delivery.timeout + config.delivery.lease_margin + Duration::from_secs(1),
    )
    .await;
    let per_job = slow.per_id();
    assert_eq!(per_job.len(), 60, "every job arrived: {per_job:?}");
    assert!(
        per_job.values().all(|n| *n == 1),
        "a job was delivered twice: {per_job:?}"
    );
    assert_eq!(
        slow.max_in_flight(),
        2,
        "attempts open at once at the host (limit 2)"
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

/// `delivery.per_host_rate` holds across daemons: two daemon processes
/// (16 partitions, so the fleet deals each some) share a rate of 20 a
/// second to one host. Both attempt jobs (each daemon's own
/// `hookq_attempts_total`), wanting more than the rate together they are
/// refused tokens (`hookq_host_rate_limited_total`), and the host never
/// gets more than the rate in any second, so the 70 requests span at least
/// four seconds.
#[tokio::test]
async fn two_daemons_share_one_rate_limit() {
    const RATE: usize = 20;
    const JOBS: usize = 70;
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let rate = RATE.to_string();
    let env = [
        ("HOOKQ_DELIVERY__PER_HOST_RATE", rate.as_str()),
        // Few workers each, so both daemons claim part of the jobs.
        ("HOOKQ_DELIVERY__WORKERS", "4"),
        ("HOOKQ_DELIVERY__CLAIM_BATCH", "2"),
        ("HOOKQ_DELIVERY__LEASE_MARGIN", "20s"),
        ("HOOKQ_REDIS__PARTITIONS", "16"),
    ];
    let (_daemons, ports) = crate::ops::spawn_ready(&redis, 2, &env).await;
    let bases: Vec<String> = ports.iter().map(|p| crate::ops::base_url(*p)).collect();
    // Both are members; each deals the partitions anew at its next beat.
    let conn = redis.conn().await;
    crate::support::wait_until("both daemons joined", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move {
            redis::cmd("ZCARD")
                .arg("hookq:fleet")
                .query_async::<i64>(&mut conn)
                .await
                .is_ok_and(|n| n == 2)
        }
    })
    .await;
    tokio::time::sleep(hookq::fleet::BEAT + Duration::from_millis(500)).await;
    let jobs: Vec<Value> = (0..JOBS)
        .map(|i| json!({"id": format!("rate-{i}"), "url": receiver.url("/r")}))
        .collect();
    // The budget's windows are whole seconds of Redis's clock (this
    // machine's). Created as a second begins, the jobs use each window's
    // budget up long before its end (the two daemons together want twice
    // the rate), so no request granted in one window is still on its way
    // when the next begins, and the bound holds for arrivals as counted.
    crate::support::wait_until("a second begins", Duration::from_secs(5), || async {
        hookq::job::now_ms() % 1000 < 20
    })
    .await;
    create_batch(&bases[0], jobs).await;
    // (~4 s of jobs: a deadline of 30 s, so that a broken budget fails in
    // half a minute; scripts/lua-guards.sh waits for it.)
    let requests = receiver.wait_for_count(JOBS, Duration::from_secs(30)).await;
    let windows = per_second(&requests);
    eprintln!("{JOBS} jobs at {RATE}/s over two daemons: per second {windows:?}");
    for (second, n) in &windows {
        assert!(
            *n <= RATE,
            "{n} requests in second {second} (limit {RATE}/s): {windows:?}"
        );
    }
    let span = requests
        .last()
        .expect("requests")
        .received_at
        .duration_since(requests[0].received_at)
        .unwrap_or_default();
    // At most RATE per window: JOBS requests fill at least JOBS / RATE
    // windows, so the first and the last are at least two windows apart.
    let windows_needed = JOBS.div_ceil(RATE) as u64;
    assert!(
        span >= Duration::from_secs(windows_needed - 2),
        "{JOBS} requests at {RATE}/s spanned only {span:?}"
    );
    let (mut attempts, mut refused) = (Vec::new(), 0.0);
    for base in &bases {
        let text = crate::metrics_text(base).await;
        attempts.push(crate::metric_sum(&text, "hookq_attempts_total"));
        refused += crate::metric_sum(&text, "hookq_host_rate_limited_total");
    }
    // Together they want twice the rate: a take finds the window's budget
    // spent by the other.
    assert!(refused >= 1.0, "hookq_host_rate_limited_total: {refused}");
    assert!(
        attempts.iter().all(|n| *n > 0.0),
        "both daemons attempt jobs: {attempts:?}"
    );
    assert_eq!(attempts.iter().sum::<f64>(), JOBS as f64, "{attempts:?}");
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
/// delivered with as many attempts as requests it made (besides attempts
/// the kill lost, counted as `lease_expired`).
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
        let attempts = v["attempts"].as_u64().expect("attempts");
        let requests = per_job.get(&id).copied().unwrap_or_default();
        // An attempt the kill -9 lost (claimed, perhaps never sent) counts
        // as `lease_expired` when its lease runs out: the only attempt
        // that may come without a request. One the open host deferred
        // must not count.
        let lost = v["history"]
            .as_array()
            .expect("history")
            .iter()
            .filter(|a| a["error"] == "lease_expired")
            .count() as u64;
        assert!(
            (requests..=requests + lost).contains(&attempts),
            "{id}: {attempts} attempts for {requests} requests and {lost} lost to the kill: \
             attempts counted without a request while its host was open: {v}"
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
    use crate::delivery::{assert_all_verify, SECRET};
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
    assert_all_verify(SECRET, &requests);
    daemon.stop().await.expect("clean stop");
}

/// Each open period of `host` seen at the daemon at `base`, polled until
/// `n` were seen: (opened_at, next_probe_at - opened_at), in ms of Redis's
/// clock as the host's view shows them.
async fn open_periods(base: &str, receiver: &Receiver, n: usize) -> Vec<(i64, i64)> {
    let seen = std::sync::Mutex::new(BTreeMap::new());
    crate::support::wait_until(
        &format!("{n} open periods"),
        Duration::from_secs(60),
        || async {
            let view = host_view(base, receiver).await;
            if view["state"] == "open" {
                if let (Some(at), Some(probe)) =
                    (view["opened_at"].as_str(), view["next_probe_at"].as_str())
                {
                    let at = crate::support::rfc3339_ms(at);
                    let probe = crate::support::rfc3339_ms(probe);
                    seen.lock().expect("lock").insert(at, probe - at);
                }
            }
            seen.lock().expect("lock").len() >= n
        },
    )
    .await;
    seen.into_inner().expect("lock").into_iter().collect()
}

/// The breaker's open time doubles: a host opens for `breaker.open_for`;
/// each failed probe reopens it for twice the last period, up to
/// `breaker.max_open`. Read from the host's own times (`opened_at` and
/// `next_probe_at`), not from how fast the test runs.
#[tokio::test]
async fn a_failed_probe_reopens_the_host_for_twice_as_long() {
    let redis = RedisServer::start();
    let receiver = Receiver::with_status(500).await;
    let mut config = test_config(&redis);
    config.breaker.failures = 2;
    config.breaker.open_for = Duration::from_millis(300);
    config.breaker.max_open = Duration::from_secs(1);
    config.delivery.retry = vec![Duration::from_millis(50); 8];
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let jobs: Vec<Value> = (0..4)
        .map(|i| json!({"id": format!("dbl-{i}"), "url": receiver.url("/d")}))
        .collect();
    create_batch(&base, jobs).await;
    let periods = open_periods(&base, &receiver, 4).await;
    let lengths: Vec<i64> = periods.iter().map(|(_, len)| *len).collect();
    assert_eq!(
        lengths,
        vec![300, 600, 1000, 1000],
        "open periods (opened_at, length): {periods:?}"
    );
    daemon.stop().await.expect("clean stop");
}

/// A resumed host's parked jobs are drained in rounds, oldest due first:
/// the first round ten times the host's concurrency, each next one twice
/// the last (a slow start, no thundering herd), a drain turn (250 ms)
/// apart. Seen in the host's parking in Redis as the rounds take from it.
#[tokio::test]
async fn a_resumed_hosts_parked_jobs_drain_in_growing_rounds_oldest_first() {
    const JOBS: usize = 300;
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let mut config = test_config(&redis);
    // One partition: every parked job in one parking, rounds whole.
    config.redis.partitions = 1;
    config.delivery.per_host_concurrency = 2;
    config.delivery.lease_margin = Duration::from_secs(5);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let host = format!("http://{}", receiver.addr());
    let (status, answer) = post_json(
        &format!("{base}/v1/hosts/{}/pause", host_path(&receiver)),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    // Due 1 ms apart, in id order, a moment from now: parked as they come due.
    let now = hookq::job::now_ms();
    let jobs: Vec<Value> = (0..JOBS)
        .map(|i| {
            json!({"id": format!("dr-{i:03}"), "url": receiver.url("/dr"),
                "run_at": now + 1000 + i as i64})
        })
        .collect();
    create_batch(&base, jobs).await;
    let keys = hookq::store::Keys::new(&config.redis.namespace, config.redis.partitions);
    let parking = keys.park(0, &host);
    let conn = redis.conn().await;
    let parked = || {
        let parking = parking.clone();
        let mut conn = conn.clone();
        async move {
            let members: Vec<String> = redis::cmd("ZRANGE")
                .arg(&parking)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .expect("ZRANGE");
            // A member is a 12-digit hex sequence, then the id.
            members
                .into_iter()
                .map(|m| m[12..].to_string())
                .collect::<Vec<String>>()
        }
    };
    crate::support::wait_until("every job is parked", Duration::from_secs(30), || async {
        parked().await.len() == JOBS
    })
    .await;
    let ids: Vec<String> = (0..JOBS).map(|i| format!("dr-{i:03}")).collect();
    // Each change of the parking: when, and what it still holds.
    let mut steps: Vec<(Instant, Vec<String>)> = vec![(Instant::now(), parked().await)];
    assert_eq!(steps[0].1, ids, "parked in due order");
    let (status, answer) = post_json(
        &format!("{base}/v1/hosts/{}/resume", host_path(&receiver)),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let until = Instant::now() + Duration::from_secs(30);
    while !steps.last().expect("a step").1.is_empty() {
        assert!(
            Instant::now() < until,
            "the parking did not drain: {}",
            steps.len()
        );
        let now = parked().await;
        if now != steps.last().expect("a step").1 {
            steps.push((Instant::now(), now));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let rounds: Vec<usize> = steps
        .windows(2)
        .map(|w| w[0].1.len() - w[1].1.len())
        .collect();
    assert_eq!(rounds, vec![20, 40, 80, 160], "round sizes");
    for w in steps.windows(2) {
        // Oldest due first: what a round left is the newest of what it found.
        let (found, left) = (&w[0].1, &w[1].1);
        let newest = &found[found.len() - left.len()..];
        assert!(
            left.as_slice() == newest,
            "a round of {} drained other than the oldest: left from {:?}, expected from {:?}",
            found.len() - left.len(),
            left.first(),
            newest.first()
        );
    }
    for w in steps[1..].windows(2) {
        let gap = w[1].0 - w[0].0;
        assert!(gap >= Duration::from_millis(200), "rounds {gap:?} apart");
    }
    receiver.wait_for_count(JOBS, Duration::from_secs(60)).await;
    daemon.stop().await.expect("clean stop");
}
