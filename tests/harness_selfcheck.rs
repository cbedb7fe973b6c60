//! Smoke test of the integration-test harness in `tests/it/support`: a real
//! `redis-server` starts, answers and comes back after a restart with its AOF,
//! and the recording receiver sees real HTTP requests.

#[path = "it/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use support::receiver::{Receiver, Recorded, Reply};
use support::redis::RedisServer;

#[tokio::test]
async fn redis_server_starts_answers_and_recovers_from_aof() {
    support::init_tracing();
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    assert_ne!(redis.port(), 6379);
    assert!(redis.pid().is_some());
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{}/0", redis.port()));

    let mut conn = redis.conn().await;
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
    let () = conn.set("harness:key", "value").await.unwrap();
    let got: String = conn.get("harness:key").await.unwrap();
    assert_eq!(got, "value");

    let (port, pid) = (redis.port(), redis.pid());
    redis.restart();
    assert_eq!(redis.port(), port);
    assert_ne!(redis.pid(), pid);
    let mut conn = redis.conn().await;
    let got: Option<String> = conn.get("harness:key").await.unwrap();
    assert_eq!(got.as_deref(), Some("value"), "AOF was not replayed");

    redis.kill();
    assert!(redis.pid().is_none());
    assert!(!redis.log().is_empty(), "redis-server wrote no log");
}

#[tokio::test]
async fn default_redis_server_has_no_persistence() {
    let redis = RedisServer::start();
    let mut conn = redis.conn().await;
    let config: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendonly")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(config, ["appendonly", "no"]);
}

/// The counters the benchmark's steady lines read (`FleetCounters`) move
/// with the work they stand for: a script's time shows in `script_usec`
/// (not its call count), its CPU in the user part, and a request that finds
/// Redis asleep in `wakes`.
#[tokio::test]
async fn redis_counters_move_with_scripts_and_wakes() {
    let redis = RedisServer::start();
    let mut conn = redis.conn().await;
    let usec = redis.command_stats().await.unwrap().script_usec;
    let (user, _) = redis.cpu_user_system().await.unwrap();
    let wakes = redis.wakes();
    // A script that keeps Redis busy for milliseconds.
    let counted: i64 = redis::cmd("EVAL")
        .arg("local n = 0 for i = 1, 3000000 do n = n + 1 end return n")
        .arg(0)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(counted, 3_000_000);
    let spent = redis.command_stats().await.unwrap().script_usec - usec;
    assert!(spent >= 1_000, "script time {spent} us");
    let (user_after, _) = redis.cpu_user_system().await.unwrap();
    assert!(user_after > user, "user CPU {user} -> {user_after}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while redis.wakes() <= wakes {
        assert!(tokio::time::Instant::now() < deadline, "no wake counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    }
}

#[tokio::test]
async fn receiver_records_requests_and_replies() {
    let receiver = Receiver::start(Arc::new(|r: &Recorded| match r.path.as_str() {
        "/slow" => Reply::status(202).with_delay(Duration::from_millis(100)),
        _ => Reply::status(201)
            .with_header("x-test", "yes")
            .with_body("made"),
    }))
    .await;
    let client = reqwest::Client::new();

    let response = client
        .post(receiver.url("/hook?a=1"))
        .header("x-signature", "abc")
        .body("payload")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    assert_eq!(response.headers()["x-test"], "yes");
    assert_eq!(response.text().await.unwrap(), "made");

    let started = std::time::Instant::now();
    let response = client.put(receiver.url("/slow")).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 202);
    assert!(started.elapsed() >= Duration::from_millis(100));

    let got = receiver.wait_for_count(2, Duration::from_secs(5)).await;
    assert_eq!(receiver.count(), 2);
    assert_eq!(got[0].method, "POST");
    assert_eq!(got[0].path, "/hook");
    assert_eq!(got[0].query.as_deref(), Some("a=1"));
    assert_eq!(got[0].header("x-signature"), Some("abc"));
    assert_eq!(got[0].body, b"payload");
    assert!(got[0].received_at <= got[1].received_at);
    assert_eq!(got[1].method, "PUT");
}

#[tokio::test]
async fn wait_for_count_wakes_on_a_later_request() {
    let receiver = Receiver::ok().await;
    let url = receiver.url("/later");
    let sender = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        reqwest::get(url).await.unwrap().status().as_u16()
    });
    let got = receiver.wait_for_count(1, Duration::from_secs(5)).await;
    assert_eq!(got[0].path, "/later");
    assert_eq!(sender.await.unwrap(), 200);
}

#[tokio::test]
#[should_panic(expected = "receiver got 0 of 1 expected requests")]
async fn wait_for_count_panics_with_what_arrived() {
    let receiver = Receiver::with_status(500).await;
    receiver.wait_for_count(1, Duration::from_millis(50)).await;
}

#[tokio::test]
async fn wait_until_returns_once_the_condition_holds() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let start = tokio::time::Instant::now();
    let polls = AtomicUsize::new(0);
    let last = AtomicBool::new(false);
    support::wait_until("50 ms passed", Duration::from_secs(5), || async {
        polls.fetch_add(1, Ordering::SeqCst);
        let held = start.elapsed() >= Duration::from_millis(50);
        last.store(held, Ordering::SeqCst);
        held
    })
    .await;
    assert!(
        last.load(Ordering::SeqCst),
        "wait_until returned although its condition did not hold"
    );
    assert!(
        start.elapsed() >= Duration::from_millis(50),
        "wait_until returned after {:?}, before the condition could hold",
        start.elapsed()
    );
    assert!(
        polls.load(Ordering::SeqCst) >= 2,
        "the condition was polled again after it first failed"
    );
}

#[tokio::test]
#[should_panic(expected = "timed out after 50ms waiting until never")]
async fn wait_until_panics_at_its_deadline() {
    support::wait_until("never", Duration::from_millis(50), || async { false }).await;
}
