//! The metrics the README promises, each moved by what it counts and read
//! from a daemon process of its own (the `metrics` facade is process-wide,
//! so in-process daemons of other tests would add to the counts): the host
//! series (blocked, opened, parked), the alert series (sent,
//! dropped), and `/metrics` reading Redis at most once every 2 s however
//! often it is scraped.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::ops::serve_ready;
use crate::support::receiver::{Receiver, Recorded, Reply};
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{metrics_text, post_created, post_json};

/// The value of the unlabelled series `name` in a `/metrics` text; None
/// when the series is absent (so a test tells "0" from "missing").
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Waits until the series `name` of the daemon at `base` reads `want`.
async fn wait_series(base: &str, name: &str, want: f64) {
    wait_until(
        &format!("{name} reads {want}"),
        Duration::from_secs(30),
        || async { series(&metrics_text(base).await, name) == Some(want) },
    )
    .await;
}

/// `scheme://host:port` of `receiver`, percent-encoded for a path.
fn host_path(receiver: &Receiver) -> String {
    let host = format!("http://{}", receiver.addr());
    url::form_urlencoded::byte_serialize(host.as_bytes()).collect()
}

/// Creates `n` jobs `<prefix>-<i>` to `receiver` through the daemon at `base`.
async fn create_jobs(base: &str, prefix: &str, n: usize, receiver: &Receiver) {
    let jobs: Vec<Value> = (0..n)
        .map(|i| json!({"id": format!("{prefix}-{i}"), "url": receiver.url("/m")}))
        .collect();
    let (status, answer) = post_json(&format!("{base}/v1/jobs/batch"), json!({"jobs": jobs})).await;
    assert_eq!(status, 200, "{answer}");
}

/// The host series move with what they count: a paused host is blocked
/// (`hookq_hosts_blocked` 1, back to 0 once resumed and drained) and its
/// jobs are parked (`hookq_parked_total` by exactly their number); a host
/// failing `breaker.failures` times opens once (`hookq_hosts_opened_total`
/// 1, and still 1 after its probe closed it). (`hookq_host_rate_limited_total`
/// moves in `hosts::two_daemons_share_one_rate_limit`, where two daemons
/// want more than the rate.)
#[tokio::test]
async fn host_series_move_with_blocks_opens_and_parkings() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let redis = RedisServer::start();
    let paused = Receiver::ok().await;
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    // Fails twice (opening the host), then answers.
    let failing = Receiver::start(Arc::new(move |_: &Recorded| {
        if counter.fetch_add(1, Ordering::SeqCst) < 2 {
            Reply::status(500)
        } else {
            Reply::status(204)
        }
    }))
    .await;
    let env = [
        ("HOOKQ_BREAKER__FAILURES", "2"),
        ("HOOKQ_BREAKER__OPEN_FOR", "300ms"),
        (
            "HOOKQ_DELIVERY__RETRY",
            "[\"50ms\",\"50ms\",\"50ms\",\"50ms\"]",
        ),
        ("HOOKQ_DELIVERY__TIMEOUT", "2s"),
        ("HOOKQ_DELIVERY__LEASE_MARGIN", "5s"),
    ];
    let (_serve, base) = serve_ready(&redis, &env).await;

    // A paused host: blocked, its jobs parked; resumed: drained, unblocked.
    let (status, answer) = post_json(
        &format!("{base}/v1/hosts/{}/pause", host_path(&paused)),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    wait_series(&base, "hookq_hosts_blocked", 1.0).await;
    create_jobs(&base, "held", 5, &paused).await;
    wait_series(&base, "hookq_parked_total", 5.0).await;
    assert_eq!(paused.count(), 0, "a paused host was called");
    let (status, answer) = post_json(
        &format!("{base}/v1/hosts/{}/resume", host_path(&paused)),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    paused.wait_for_count(5, Duration::from_secs(30)).await;
    wait_series(&base, "hookq_hosts_blocked", 0.0).await;

    // A failing host opens once; its probe succeeds and closes it.
    create_jobs(&base, "open", 2, &failing).await;
    wait_series(&base, "hookq_hosts_opened_total", 1.0).await;
    wait_until(
        "the failing host's jobs are delivered",
        Duration::from_secs(30),
        || async {
            let mut all = true;
            for i in 0..2 {
                all &= crate::job_view(&base, &format!("open-{i}")).await["state"] == "delivered";
            }
            all
        },
    )
    .await;
    let text = metrics_text(&base).await;
    assert_eq!(
        series(&text, "hookq_hosts_opened_total"),
        Some(1.0),
        "opened once"
    );
}

/// Alerts count what became of them: a batch the endpoint refuses on all
/// four tries (at once, then 1 s, 5 s and 30 s later) is dropped
/// (`hookq_alerts_dropped_total` 1, its one event), and the next batch,
/// answered, is sent (`hookq_alerts_sent_total` 1).
#[tokio::test]
async fn alert_series_count_sent_and_dropped_events() {
    let redis = RedisServer::start();
    let host = Receiver::ok().await;
    // The first batch (by its webhook-id, the same on every retry) fails.
    let first: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let refused = first.clone();
    let alerts = Receiver::start(Arc::new(move |r: &Recorded| {
        let id = r.header("webhook-id").unwrap_or_default().to_string();
        let mut first = refused.lock().unwrap_or_else(|e| e.into_inner());
        if first.get_or_insert_with(|| id.clone()) == &id {
            Reply::status(500)
        } else {
            Reply::status(204)
        }
    }))
    .await;
    let alerts_url = alerts.url("/alerts");
    let env = [("HOOKQ_ALERTS__URL", alerts_url.as_str())];
    let (_serve, base) = serve_ready(&redis, &env).await;
    let pause = |action: &'static str| {
        let url = format!("{base}/v1/hosts/{}/{action}", host_path(&host));
        async move {
            let (status, answer) = post_json(&url, json!({})).await;
            assert_eq!(status, 200, "{action}: {answer}");
        }
    };
    // host.paused: the first batch, alone once its first try went out.
    pause("pause").await;
    alerts.wait_for_count(1, Duration::from_secs(10)).await;
    // host.closed: waits behind the first batch's retries.
    pause("resume").await;
    let text = metrics_text(&base).await;
    assert_eq!(
        series(&text, "hookq_alerts_sent_total"),
        None,
        "nothing sent yet"
    );
    // 1 + 5 + 30 s of retries, then the next batch.
    wait_until(
        "the first batch is dropped and the second sent",
        Duration::from_secs(60),
        || async {
            let text = metrics_text(&base).await;
            series(&text, "hookq_alerts_dropped_total") == Some(1.0)
                && series(&text, "hookq_alerts_sent_total") == Some(1.0)
        },
    )
    .await;
    let requests = alerts.requests();
    let first = first.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let tries = requests
        .iter()
        .filter(|r| r.header("webhook-id") == first.as_deref())
        .count();
    assert_eq!(
        tries, 4,
        "the refused batch was tried once and retried 3 times"
    );
    let last = requests.last().expect("the sent batch").json();
    assert_eq!(last[0]["type"], "host.closed", "{last}");
}

/// Redis calls of the job gauges' read: `XLEN` of each partition's dead
/// letters (4 partitions), a command the daemon sends for nothing else.
async fn gauge_reads(redis: &RedisServer) -> i64 {
    redis
        .calls_of(|l| l.starts_with("cmdstat_xlen:"))
        .await
        .expect("INFO commandstats")
        / 4
}

/// `/metrics` reads Redis at most once every 2 s however often it is
/// scraped: 50 scrapes in a burst read it once; a scrape 2 s after that
/// read reads it again (and shows a job created meanwhile).
#[tokio::test]
async fn metrics_read_redis_at_most_once_every_two_seconds() {
    let redis = RedisServer::start();
    let (_serve, base) = serve_ready(&redis, &[]).await;
    let before = gauge_reads(&redis).await;
    let started = Instant::now();
    for _ in 0..50 {
        let text = metrics_text(&base).await;
        assert!(text.contains("hookq_jobs{state=\"scheduled\"}"), "{text}");
    }
    let took = started.elapsed();
    let reads = gauge_reads(&redis).await - before;
    // A burst slower than 2 s (a loaded machine) may read once per 2 s.
    let allowed = 1 + (took.as_millis() / 2000) as i64;
    assert!(
        (1..=allowed).contains(&reads),
        "50 scrapes in {took:?} read Redis {reads} times (at most {allowed})"
    );
    post_created(
        &format!("{base}/v1/jobs"),
        json!({"id": "later", "url": "http://127.0.0.1:9/", "delay": "1h"}),
    )
    .await;
    // A wait for time itself: the next read is due 2 s after the burst's.
    wait_until("2 s pass", Duration::from_secs(5), || async {
        started.elapsed() > Duration::from_millis(2100) + took
    })
    .await;
    let before = gauge_reads(&redis).await;
    let text = metrics_text(&base).await;
    assert_eq!(
        gauge_reads(&redis).await - before,
        1,
        "a scrape after 2 s reads Redis"
    );
    assert_eq!(
        crate::metric_sum(&text, "hookq_jobs{state=\"scheduled\"}"),
        1.0,
        "{text}"
    );
}
