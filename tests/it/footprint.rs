//! What hookq keeps in Redis, and how little: jobs due far ahead wait in the
//! timing wheel's compact buckets and reach the due set only near their time,
//! with cancel and change handled as tombstones.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::AsyncCommands;
use serde_json::json;

use crate::support::receiver::{Receiver, Recorded, Reply};
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{get_json, post_created, start_daemon, test_config};

fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

async fn send(method: reqwest::Method, url: &str, body: Option<serde_json::Value>) -> u16 {
    let mut request = reqwest::Client::new().request(method, url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.expect("request").status().as_u16()
}

/// With 50 ms wheel buckets (levels of 50 ms, 3.2 s and 204.8 s), jobs a few
/// seconds away wait in a level-2 bucket, move to level 1 and then to the
/// due set, and are delivered once, not before their due time. A cancelled
/// job's and a changed job's old entries are skipped when their bucket
/// opens; a retry far enough ahead waits in the wheel too; at the end the
/// wheel is empty and counts nothing.
#[tokio::test]
async fn far_jobs_cascade_through_the_wheel_and_arrive_once_on_time() {
    let redis = RedisServer::start();
    let failed_once = Arc::new(AtomicBool::new(false));
    let receiver = {
        let failed_once = failed_once.clone();
        Receiver::start(Arc::new(move |r: &Recorded| {
            if r.path == "/retry" && !failed_once.swap(true, Ordering::SeqCst) {
                Reply::status(500)
            } else {
                Reply::status(204)
            }
        }))
        .await
    };
    let mut config = test_config(&redis);
    config.redis.wheel_bucket = Duration::from_millis(50);
    config.delivery.retry = vec![Duration::from_millis(600)];
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let keys = hookq::store::Keys::new(&config.redis.namespace, config.redis.partitions);
    let mut conn = redis.conn().await;

    let create = |id: &str, delay: &str| json!({"id": id, "url": receiver.url(&format!("/{id}")), "delay": delay});
    let mut due_at = std::collections::HashMap::new();
    for (id, delay) in [
        ("near", "20ms"),
        ("level-1", "700ms"),
        ("level-2", "3500ms"),
        ("cancelled", "3500ms"),
        ("sooner", "3500ms"),
        ("later", "3400ms"),
    ] {
        let view = post_created(&format!("{base}/v1/jobs"), create(id, delay)).await;
        let due = view["next_attempt_at"].as_str().expect("due").to_string();
        due_at.insert(id.to_string(), due);
    }
    let retry = json!({"id": "retry", "url": receiver.url("/retry")});
    post_created(&format!("{base}/v1/jobs"), retry).await;

    // Where each waits: level-2 jobs in a level-2 bucket, not the due set.
    let p = keys.partition_of("level-2");
    let start = {
        let due = time::OffsetDateTime::parse(
            &due_at["level-2"],
            &time::format_description::well_known::Rfc3339,
        )
        .expect("RFC 3339");
        let ms = (due.unix_timestamp_nanos() / 1_000_000) as i64;
        ms - ms % 3200
    };
    let bucket: Vec<String> = conn
        .lrange(format!("{}:2:{start}", keys.wheel(p)), 0, -1)
        .await
        .expect("LRANGE");
    assert!(bucket.contains(&"level-2".to_string()), "{bucket:?}");
    let (_, stats) = get_json(&format!("{base}/v1/stats")).await;
    assert!(stats["scheduled"].as_u64() >= Some(5), "{stats}");

    // Tombstones: cancel one, bring one forward, push one back.
    let status = send(
        reqwest::Method::DELETE,
        &format!("{base}/v1/jobs/cancelled"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    for (id, delay) in [("sooner", "300ms"), ("later", "3700ms")] {
        let status = send(
            reqwest::Method::PATCH,
            &format!("{base}/v1/jobs/{id}"),
            Some(json!({"delay": delay})),
        )
        .await;
        assert_eq!(status, 200, "PATCH {id}");
        let (_, view) = get_json(&format!("{base}/v1/jobs/{id}")).await;
        due_at.insert(
            id.to_string(),
            view["next_attempt_at"].as_str().expect("due").into(),
        );
    }

    // near, level-1, level-2, sooner, later, and retry twice.
    let got = receiver.wait_for_count(7, Duration::from_secs(20)).await;
    wait_until("every job finished", Duration::from_secs(10), || {
        let base = base.clone();
        async move {
            let (_, stats) = get_json(&format!("{base}/v1/stats")).await;
            stats["scheduled"] == 0 && stats["ready"] == 0 && stats["inflight"] == 0
        }
    })
    .await;
    let mut paths: Vec<&str> = got.iter().map(|r| r.path.as_str()).collect();
    paths.sort();
    assert_eq!(
        paths,
        ["/later", "/level-1", "/level-2", "/near", "/retry", "/retry", "/sooner"],
        "each once (the retry twice), the cancelled one never"
    );
    for r in &got {
        let id = &r.path[1..];
        if let Some(due) = due_at.get(id) {
            let due =
                time::OffsetDateTime::parse(due, &time::format_description::well_known::Rfc3339)
                    .expect("RFC 3339");
            let due_ms = (due.unix_timestamp_nanos() / 1_000_000) as i64;
            let late = epoch_ms(r.received_at) - due_ms;
            assert!(late >= 0, "{id} delivered {}ms early", -late);
        }
    }
    let (_, retried) = get_json(&format!("{base}/v1/jobs/retry")).await;
    assert_eq!(
        (retried["state"].as_str(), retried["attempts"].as_u64()),
        (Some("delivered"), Some(2))
    );
    for p in 0..config.redis.partitions {
        let buckets: usize = conn.zcard(keys.wheel(p)).await.expect("ZCARD");
        let counted: Option<i64> = conn.hget(keys.stats(p), "wheel").await.expect("HGET");
        assert_eq!(
            (buckets, counted.unwrap_or(0)),
            (0, 0),
            "partition {p}: the wheel is empty"
        );
    }
    daemon.stop().await.expect("clean stop");
}
