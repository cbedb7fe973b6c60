//! Ordered delivery (SPEC §11.5): jobs sharing an ordering key within a
//! topic are attempted one at a time, in creation order, through failures,
//! cancels, dead letters, replays, `kill -9`, the breaker and a Redis
//! Cluster; and a job placed in another partition than its id's is still
//! found, created and re-created by id alone.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use serde_json::{json, Value};

use crate::ops::{base_url, free_port, spawn_ready, spawn_serve, wait_ready};
use crate::support::cluster::RedisCluster;
use crate::support::receiver::{Receiver, Recorded, Reply};
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{get_json, job_view, post_json, start_daemon, test_config};

/// The delivery settings of the ordering runs that kill a daemon: 64
/// workers, 1 s attempts and short leases, and a dozen 20 ms retries, so a
/// key's line moves on quickly through failures and kills.
const ORDERED_RUN_ENV: [(&str, &str); 5] = [
    ("HOOKQ_DELIVERY__WORKERS", "64"),
    ("HOOKQ_DELIVERY__TIMEOUT", "1s"),
    // A probe lost with a killed daemon is taken again after this.
    ("HOOKQ_DELIVERY__MAX_TIMEOUT", "2s"),
    ("HOOKQ_DELIVERY__LEASE_MARGIN", "300ms"),
    (
        "HOOKQ_DELIVERY__RETRY",
        r#"["20ms","20ms","20ms","20ms","20ms","20ms","20ms","20ms","20ms","20ms","20ms","20ms"]"#,
    ),
];

/// What an ordering receiver saw: every attempt's (key, n) in arrival
/// order, and the (key, n) it answered 2xx.
#[derive(Default)]
struct OrderLog {
    arrivals: Vec<(u64, u64)>,
    delivered: HashSet<(u64, u64)>,
}

/// A receiver of jobs whose body is `{"k": key, "n": n}` that fails a
/// `fail_rate` share of attempts with a 500, logging each attempt.
async fn ordering_receiver(fail_rate: f64) -> (Receiver, Arc<Mutex<OrderLog>>) {
    let log = Arc::new(Mutex::new(OrderLog::default()));
    let seen = log.clone();
    let receiver = Receiver::start(Arc::new(move |r: &Recorded| {
        let body = r.json();
        let (k, n) = (
            body["k"].as_u64().unwrap_or(u64::MAX),
            body["n"].as_u64().unwrap_or(u64::MAX),
        );
        let fail = rand::rng().random_bool(fail_rate);
        let mut log = seen.lock().unwrap_or_else(|e| e.into_inner());
        log.arrivals.push((k, n));
        if fail {
            return Reply::status(500);
        }
        log.delivered.insert((k, n));
        Reply::status(200)
    }))
    .await;
    (receiver, log)
}

/// Creates `per_key` jobs for each of `keys` ordering keys, job n of every
/// key in one round of batches, rounds one after another (so each key's
/// jobs are created in order), alternating between `bases`. An item
/// answered 503 (a cluster slot on the move) is sent again before the next
/// round.
async fn create_ordered(bases: &[String], keys: u64, per_key: u64, url: &str) {
    let mut request = 0;
    for n in 0..per_key {
        let mut items: Vec<Value> = (0..keys)
            .map(|k| {
                json!({"id": format!("o-{k}-{n}"), "url": url, "ordering_key": format!("key-{k}"),
                    "body": {"k": k, "n": n}})
            })
            .collect();
        let until = tokio::time::Instant::now() + Duration::from_secs(30);
        while !items.is_empty() {
            assert!(
                tokio::time::Instant::now() < until,
                "round {n} not created in 30 s"
            );
            let mut again = Vec::new();
            for chunk in items.chunks(1000) {
                let base = &bases[request % bases.len()];
                request += 1;
                let (status, answer) =
                    post_json(&format!("{base}/v1/jobs/batch"), json!({"jobs": chunk})).await;
                if status == 503 {
                    again.extend_from_slice(chunk);
                    continue;
                }
                assert_eq!(status, 200, "{answer}");
                let results = answer["results"].as_array().expect("results");
                for (item, r) in chunk.iter().zip(results) {
                    match r["status"].as_u64() {
                        Some(200 | 201) => {}
                        Some(503) => again.push(item.clone()),
                        _ => panic!("{r}"),
                    }
                }
            }
            if !again.is_empty() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            items = again;
        }
    }
}

/// Waits until every (key, n) was answered 2xx, then checks that each
/// key's attempts arrived in creation order (a repeat of the same job, as
/// after a kill, is allowed; an overtaking job is not).
async fn assert_delivered_in_order(log: &Arc<Mutex<OrderLog>>, keys: u64, per_key: u64) {
    let total = (keys * per_key) as usize;
    let deadline = Duration::from_secs(60 + total as u64 / 100);
    wait_until("every ordered job is delivered", deadline, || async {
        log.lock()
            .unwrap_or_else(|e| e.into_inner())
            .delivered
            .len()
            >= total
    })
    .await;
    let log = log.lock().unwrap_or_else(|e| e.into_inner());
    let mut last: HashMap<u64, u64> = HashMap::new();
    let mut out_of_order = Vec::new();
    for &(k, n) in &log.arrivals {
        let before = last.entry(k).or_insert(0);
        if n < *before {
            out_of_order.push((k, *before, n));
        }
        *before = n;
    }
    assert!(
        out_of_order.is_empty(),
        "{} attempts overtook an earlier job of their key (key, latest, attempted): {:?}",
        out_of_order.len(),
        &out_of_order[..out_of_order.len().min(10)]
    );
    for k in 0..keys {
        for n in 0..per_key {
            assert!(log.delivered.contains(&(k, n)), "job o-{k}-{n} delivered");
        }
    }
    eprintln!(
        "ordered: {keys} keys x {per_key} jobs, {} attempts for {total} jobs",
        log.arrivals.len()
    );
}

/// SPEC §11.5 under stress: 1,000 keys x 20 jobs, a receiver failing 15% of
/// attempts at random (enough for the breaker to open now and then), two
/// daemon processes, one of them killed with SIGKILL three times: per key
/// the receiver's log is sorted, and no job is lost.
#[tokio::test]
async fn keys_deliver_in_creation_order_through_failures_and_kill_9() {
    let keys = crate::env_count("HOOKQ_ORDER_KEYS", 1000) as u64;
    let per_key = 20;
    let redis = RedisServer::start();
    let (receiver, log) = ordering_receiver(0.15).await;
    let env = [
        ORDERED_RUN_ENV.as_slice(),
        &[
            ("HOOKQ_BREAKER__FAILURES", "6"),
            ("HOOKQ_BREAKER__OPEN_FOR", "50ms"),
            ("HOOKQ_BREAKER__MAX_OPEN", "200ms"),
        ],
    ]
    .concat();
    let (mut daemons, mut ports) = spawn_ready(&redis, 2, &env).await;
    let bases: Vec<String> = ports.iter().map(|&p| base_url(p)).collect();
    create_ordered(&bases, keys, per_key, &receiver.url("/")).await;

    let t = std::time::Instant::now();
    for k in 0..3 {
        let pause = rand::rng().random_range(200..600);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let victim = k % 2;
        daemons[victim].kill_9().await;
        ports[victim] = free_port();
        daemons[victim] = spawn_serve(&redis, ports[victim], &env);
    }
    eprintln!("kills done at {:?}", t.elapsed());
    assert_delivered_in_order(&log, keys, per_key).await;
    eprintln!("delivered at {:?}", t.elapsed());
    let base = base_url(ports[0]);
    wait_ready(ports[0]).await;
    crate::wait_until_idle(&base, Duration::from_secs(30)).await;
    let (_, stats) = get_json(&format!("{base}/v1/stats")).await;
    assert_eq!(stats["held_in_order"], 0, "{stats}");
    for daemon in &mut daemons {
        daemon.kill_9().await;
    }
    // Every ordering list is gone with its last job.
    let mut conn = redis.conn().await;
    let lists: Vec<String> = redis::cmd("KEYS")
        .arg("hookq:*:order:*")
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    assert!(lists.is_empty(), "ordering lists left: {lists:?}");
}

/// A receiver answering by path: `/fail` 500, `/gone` 410, `/slow` 200
/// after 1.5 s, anything else 200.
async fn path_receiver() -> Receiver {
    Receiver::start(Arc::new(|r: &Recorded| match r.path.as_str() {
        "/fail" => Reply::status(500),
        "/gone" => Reply::status(410),
        "/slow" => Reply::status(200).with_delay(Duration::from_millis(1500)),
        _ => Reply::status(200),
    }))
    .await
}

/// The job ids the receiver got, in arrival order.
fn arrival_ids(receiver: &Receiver) -> Vec<String> {
    receiver
        .requests()
        .iter()
        .filter_map(|r| r.header("webhook-id").map(str::to_string))
        .collect()
}

/// The head's fate releases the next job: a cancelled head lets the next
/// go, a dead-lettered one too; held jobs show `waiting_for`, can be
/// changed but not given another ordering key; a replayed dead letter
/// joins the tail of its key.
#[tokio::test]
async fn cancel_and_dead_letter_of_the_head_release_the_next() {
    let redis = RedisServer::start();
    let receiver = path_receiver().await;
    let mut config = test_config(&redis);
    config.delivery.retry = vec![Duration::from_millis(300); 8];
    config.breaker.failures = 0;
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let job = |id: &str, path: &str| json!({"id": id, "url": receiver.url(path), "ordering_key": "acct-1", "body": {"id": id}});
    let (status, answer) = post_json(
        &format!("{base}/v1/jobs/batch"),
        json!({"jobs": [job("a", "/fail"), job("x", "/ok"), job("b", "/gone"), job("c", "/ok"),
            job("d", "/ok")]}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().expect("results");
    assert!(results[0]["job"].get("waiting_for").is_none(), "{answer}");
    assert_eq!(results[1]["job"]["waiting_for"], "a", "{answer}");
    assert_eq!(results[2]["job"]["waiting_for"], "x", "{answer}");
    assert_eq!(results[4]["job"]["waiting_for"], "c", "{answer}");

    receiver.wait_for_count(2, Duration::from_secs(10)).await;
    // A waiting job that is cancelled leaves the line, and releases nothing.
    let client = reqwest::Client::new();
    let cancelled = client
        .delete(format!("{base}/v1/jobs/x"))
        .send()
        .await
        .expect("delete");
    assert_eq!(cancelled.status(), 204);
    let b = job_view(&base, "b").await;
    assert_eq!(b["ordering_key"], "acct-1", "{b}");
    assert_eq!(b["waiting_for"], "a", "{b}");
    assert_eq!(b["state"], "ready", "held past its due time: {b}");
    let c = job_view(&base, "c").await;
    assert_eq!(c["waiting_for"], "b", "{c}");
    let (_, stats) = get_json(&format!("{base}/v1/stats")).await;
    assert_eq!(stats["held_in_order"], 3, "{stats}");
    assert!(
        arrival_ids(&receiver).iter().all(|id| id == "a"),
        "only the head is attempted"
    );

    // A held job can change, but not its ordering key.
    let patch = |id: &str, body: Value| {
        client
            .patch(format!("{base}/v1/jobs/{id}"))
            .json(&body)
            .send()
    };
    let refused = patch("c", json!({"ordering_key": "acct-2"}))
        .await
        .expect("patch");
    assert_eq!(refused.status(), 409);
    let refused: Value = refused.json().await.expect("json");
    assert_eq!(refused["error"]["field"], "ordering_key", "{refused}");
    let changed = patch(
        "c",
        json!({"ordering_key": "acct-1", "body": {"id": "c", "v": 2}}),
    )
    .await
    .expect("patch");
    assert_eq!(changed.status(), 200);
    let changed: Value = changed.json().await.expect("json");
    assert_eq!(changed["waiting_for"], "b", "still held: {changed}");

    // Cancelling the head releases b, which dies at once (410), which
    // releases c, then d.
    // (a fails and retries every 300 ms: the cancel finds it waiting for
    // its next rung, 204, or with an attempt under way, 202.)
    let cancelled = client
        .delete(format!("{base}/v1/jobs/a"))
        .send()
        .await
        .expect("delete");
    assert!(
        matches!(cancelled.status().as_u16(), 202 | 204),
        "{}",
        cancelled.status()
    );
    wait_until("d is delivered", Duration::from_secs(10), || async {
        arrival_ids(&receiver).iter().any(|id| id == "d")
    })
    .await;
    let order: Vec<String> = arrival_ids(&receiver)
        .into_iter()
        .filter(|id| id != "a")
        .collect();
    assert_eq!(order, ["b", "c", "d"], "x was cancelled while it waited");
    let c_body = receiver
        .requests()
        .into_iter()
        .find(|r| r.header("webhook-id") == Some("c"))
        .expect("c arrived")
        .json();
    assert_eq!(c_body["v"], 2, "the change reached c");
    let b = job_view(&base, "b").await;
    assert_eq!(b["state"], "dead", "{b}");

    // A replayed dead letter joins the tail: behind a slow head.
    let (status, e) = post_json(&format!("{base}/v1/jobs"), job("e", "/slow")).await;
    assert_eq!(status, 201, "{e}");
    wait_until("e is attempted", Duration::from_secs(10), || async {
        arrival_ids(&receiver).iter().any(|id| id == "e")
    })
    .await;
    let (status, replay) = post_json(
        &format!("{base}/v1/dead-letters/replay"),
        json!({"ids": ["b"], "url": receiver.url("/ok")}),
    )
    .await;
    assert_eq!(status, 200, "{replay}");
    let b = job_view(&base, "b").await;
    assert_eq!(b["waiting_for"], "e", "replayed behind the head: {b}");
    wait_until("b is delivered again", Duration::from_secs(10), || async {
        arrival_ids(&receiver)
            .iter()
            .filter(|id| *id == "b")
            .count()
            == 2
    })
    .await;
    let order = arrival_ids(&receiver);
    let tail: Vec<&str> = order[order.len() - 2..]
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(tail, ["e", "b"]);
    // (Outcomes are recorded a batch window after the answer.)
    wait_until(
        "b is recorded delivered",
        Duration::from_secs(10),
        || async { job_view(&base, "b").await["state"] == "delivered" },
    )
    .await;
    daemon.stop().await.expect("clean stop");
}

/// Bad ordering keys answer 400 naming the field, and change nothing.
#[tokio::test]
async fn a_bad_ordering_key_is_refused() {
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    for key in [
        json!("has space"),
        json!(""),
        json!("k".repeat(129)),
        json!(7),
    ] {
        let (status, answer) = post_json(
            &format!("{base}/v1/jobs"),
            json!({"id": "bad", "url": "http://127.0.0.1:9/", "ordering_key": key}),
        )
        .await;
        assert_eq!(status, 400, "{key}: {answer}");
        assert_eq!(answer["error"]["field"], "ordering_key", "{answer}");
    }
    let (status, _) = get_json(&format!("{base}/v1/jobs/bad")).await;
    assert_eq!(status, 404);
    daemon.stop().await.expect("clean stop");
}

/// An id in one partition, an ordering key hashing to another, and the
/// id of a key that hashes to yet another, for `partitions`.
fn split_placement(keys: &hookq::store::Keys, prefix: &str) -> (String, String) {
    for i in 0.. {
        let id = format!("{prefix}-{i}");
        let order = format!("default:{prefix}-key-{i}");
        if keys.partition_of(&id) != keys.order_partition(&order) {
            return (id, format!("{prefix}-key-{i}"));
        }
    }
    unreachable!()
}

/// A job living in its ordering key's partition is found by id, conflicts
/// with an unordered create of the same id, and leaves a pointer that the
/// daemon's sweep drops once the job's summary expired; stale pointers
/// (here made by hand) never stand in the way of a create.
#[tokio::test]
async fn jobs_placed_by_their_key_are_found_by_id_and_pointers_are_swept() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let mut config = test_config(&redis);
    config.retention.finished = Duration::from_secs(2);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let keys = hookq::store::Keys::new(&config.redis.namespace, config.redis.partitions);
    let (id, key) = split_placement(&keys, "placed");
    let (own, home) = (
        keys.partition_of(&id),
        keys.order_partition(&format!("default:{key}")),
    );
    let job = json!({"id": id, "url": receiver.url("/"), "ordering_key": key, "delay": "1s"});
    let (status, created) = post_json(&format!("{base}/v1/jobs"), job.clone()).await;
    assert_eq!(status, 201, "{created}");
    let mut conn = redis.conn().await;
    let pointer: Option<String> = redis::cmd("HGET")
        .arg(keys.live_records(own, &id))
        .arg(&id)
        .query_async(&mut conn)
        .await
        .expect("HGET");
    assert_eq!(pointer.as_deref(), Some(format!("@{home}").as_str()));
    let (status, shown) = get_json(&format!("{base}/v1/jobs/{id}")).await;
    assert_eq!(
        (status, &shown["ordering_key"]),
        (200, &json!(key)),
        "{shown}"
    );
    let (status, again) = post_json(&format!("{base}/v1/jobs"), job.clone()).await;
    assert_eq!(status, 200, "an identical re-create: {again}");
    let unordered = json!({"id": id, "url": receiver.url("/"), "delay": "1s"});
    let (status, conflict) = post_json(&format!("{base}/v1/jobs"), unordered.clone()).await;
    assert_eq!(status, 409, "{conflict}");
    // The other way round: an unordered job keeps its id against an
    // ordered create, whose key lives elsewhere.
    let (plain, plain_key) = split_placement(&keys, "plain");
    let (status, _) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": plain, "url": receiver.url("/"), "delay": "1h"}),
    )
    .await;
    assert_eq!(status, 201);
    let (status, conflict) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": plain, "url": receiver.url("/"), "delay": "1h", "ordering_key": plain_key}),
    )
    .await;
    assert_eq!(status, 409, "{conflict}");
    let (status, shown) = get_json(&format!("{base}/v1/jobs/{plain}")).await;
    assert_eq!(status, 200, "{shown}");
    assert!(shown.get("ordering_key").is_none(), "{shown}");
    // A job that lives on keeps its pointer through the sweeps.
    let (long, long_key) = split_placement(&keys, "long");
    let (status, _) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": long, "url": receiver.url("/"), "delay": "1h", "ordering_key": long_key}),
    )
    .await;
    assert_eq!(status, 201);
    let long_own = keys.partition_of(&long);
    let placed_at: f64 = redis::cmd("ZSCORE")
        .arg(keys.placed(long_own))
        .arg(&long)
        .query_async(&mut conn)
        .await
        .expect("ZSCORE");

    receiver.wait_for_count(1, Duration::from_secs(10)).await;
    wait_until(
        "the view shows delivered",
        Duration::from_secs(5),
        || async { job_view(&base, &id).await["state"] == "delivered" },
    )
    .await;
    // The summary expires (retention 2 s, up to 1.25 x), then the sweep
    // drops the pointer; the id is free again, in its own partition.
    wait_until("the pointer is swept", Duration::from_secs(15), || async {
        let mut conn = redis.conn().await;
        let (value, score): (Option<String>, Option<f64>) = redis::pipe()
            .hget(keys.live_records(own, &id), &id)
            .zscore(keys.placed(own), &id)
            .query_async(&mut conn)
            .await
            .expect("pipe");
        value.is_none() && score.is_none()
    })
    .await;
    let (status, _) = get_json(&format!("{base}/v1/jobs/{id}")).await;
    assert_eq!(status, 404);
    let rechecked: f64 = redis::cmd("ZSCORE")
        .arg(keys.placed(long_own))
        .arg(&long)
        .query_async(&mut conn)
        .await
        .expect("the live job's pointer is kept");
    assert!(rechecked > placed_at, "checked again later");
    let (status, shown) = get_json(&format!("{base}/v1/jobs/{long}")).await;
    assert_eq!(status, 200, "{shown}");
    let (status, recreated) = post_json(&format!("{base}/v1/jobs"), unordered).await;
    assert_eq!(status, 201, "{recreated}");

    // Stale pointers, left by hand: to a partition where the job is not.
    let (stale_plain, _) = split_placement(&keys, "stale-plain");
    let (stale_ordered, stale_key) = split_placement(&keys, "stale-ordered");
    for stale in [&stale_plain, &stale_ordered] {
        let own = keys.partition_of(stale);
        let elsewhere = (own + 1) % keys.partitions();
        let _: () = redis::pipe()
            .hset(
                keys.live_records(own, stale),
                stale,
                format!("@{elsewhere}"),
            )
            .zadd(keys.placed(own), stale, 1)
            .query_async(&mut conn)
            .await
            .expect("plant a stale pointer");
    }
    let (status, plain) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": stale_plain, "url": receiver.url("/"), "delay": "1h"}),
    )
    .await;
    assert_eq!(status, 201, "{plain}");
    let (status, ordered) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": stale_ordered, "url": receiver.url("/"), "delay": "1h", "ordering_key": stale_key}),
    )
    .await;
    assert_eq!(status, 201, "{ordered}");
    for (stale, key) in [(&stale_plain, None), (&stale_ordered, Some(&stale_key))] {
        let (status, shown) = get_json(&format!("{base}/v1/jobs/{stale}")).await;
        assert_eq!(status, 200, "{shown}");
        assert_eq!(shown["ordering_key"].as_str(), key.map(String::as_str));
    }
    let pointer: Option<String> = redis::cmd("HGET")
        .arg(keys.live_records(keys.partition_of(&stale_ordered), &stale_ordered))
        .arg(&stale_ordered)
        .query_async(&mut conn)
        .await
        .expect("HGET");
    let home = keys.order_partition(&format!("default:{stale_key}"));
    assert_eq!(
        pointer,
        Some(format!("@{home}")),
        "the stale pointer was replaced"
    );
    daemon.stop().await.expect("clean stop");
}

/// The same on a real 3-master Redis Cluster: two daemon processes, one
/// killed with SIGKILL, and the partitions of the first master migrated to
/// the second mid-run: every key's jobs arrive in creation order, none is
/// lost.
#[tokio::test]
async fn keys_deliver_in_order_on_a_cluster_through_kill_9_and_a_slot_migration() {
    use crate::support::cluster::{slot_owner, start_moving_due_partitions, SlotMove};
    let keys = crate::env_count("HOOKQ_CLUSTER_ORDER_KEYS", 200) as u64;
    let per_key = 10;
    let cluster = RedisCluster::start();
    let (receiver, log) = ordering_receiver(0.15).await;
    let seeds = serde_json::to_string(&cluster.seeds()).expect("seeds as JSON");
    let env = [
        &[
            ("HOOKQ_REDIS__CLUSTER_NODES", seeds.as_str()),
            ("HOOKQ_REDIS__PARTITIONS", "16"),
        ],
        ORDERED_RUN_ENV.as_slice(),
        &[("HOOKQ_BREAKER__FAILURES", "0")],
    ]
    .concat();
    let (mut daemons, mut ports) = spawn_ready(&cluster.nodes[0], 2, &env).await;
    let bases: Vec<String> = ports.iter().map(|&p| base_url(p)).collect();

    let SlotMove {
        from,
        to,
        slots,
        task: migration,
    } = start_moving_due_partitions(&cluster, 16);
    create_ordered(&bases, keys, per_key, &receiver.url("/")).await;
    daemons[1].kill_9().await;
    ports[1] = free_port();
    daemons[1] = spawn_serve(&cluster.nodes[0], ports[1], &env);
    let moved = migration.await.expect("the migration completes");
    assert_delivered_in_order(&log, keys, per_key).await;
    for slot in &slots {
        assert_eq!(slot_owner(from, *slot), to, "slot {slot} moved");
    }
    eprintln!("cluster ordering: {moved} keys migrated");
    for daemon in &mut daemons {
        daemon.kill_9().await;
    }
}

/// `hookq enqueue --ordering-key`: the job joins its key's line and
/// `hookq show` says what it waits for; a bad key exits 2 naming the flag
/// and writes nothing.
#[tokio::test]
async fn the_cli_enqueues_in_line_and_shows_what_a_job_waits_for() {
    let redis = RedisServer::start();
    let cli = |args: &[&str]| crate::ops::hookq(&redis, "hookq", args);
    for id in ["cli-1", "cli-2"] {
        let out = cli(&[
            "enqueue",
            "--url",
            "http://127.0.0.1:9/",
            "--id",
            id,
            "--delay",
            "1h",
            "--ordering-key",
            "order-9",
        ]);
        assert!(out.status.success(), "{out:?}");
    }
    let out = cli(&["--json", "show", "cli-2"]);
    let shown: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(shown["ordering_key"], "order-9", "{shown}");
    assert_eq!(shown["waiting_for"], "cli-1", "{shown}");
    let out = cli(&["show", "cli-2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("waiting_for") && text.contains("cli-1"),
        "{text}"
    );
    let out = cli(&[
        "enqueue",
        "--url",
        "http://127.0.0.1:9/",
        "--id",
        "cli-3",
        "--ordering-key",
        "a b",
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--ordering-key"),
        "{out:?}"
    );
    let out = cli(&["show", "cli-3"]);
    assert_eq!(out.status.code(), Some(3), "nothing written: {out:?}");
}
