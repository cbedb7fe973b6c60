//! hookq on a real Redis Cluster (three masters, three replicas on loopback):
//! partitions spread over every master, three daemons deliver each job once,
//! a master killed mid-run loses no job, and neither does moving every
//! partition of one master to another while jobs are created and delivered.
//! Set `HOOKQ_CLUSTER_JOBS=20000` for the long run (default 3,000).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::cluster::{
    begin_migration, finish_migration, keys_in_slot, keyslot, migrate_keys, slot_owner,
    slot_snapshot, start_moving_due_partitions, RedisCluster, SlotMove,
};
use crate::support::receiver::Receiver;
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{post_json, start_daemon, test_config};
use hookq::job::JobInput;
use hookq::store::Store;

fn cluster_jobs() -> usize {
    crate::env_count("HOOKQ_CLUSTER_JOBS", 3000)
}

fn cluster_config(cluster: &RedisCluster) -> hookq::config::Config {
    // test_config wants a RedisServer for its URL; the cluster seeds replace it.
    let mut config = test_config(&cluster.nodes[0]);
    config.redis.partitions = 16;
    config.redis.cluster_nodes = cluster.seeds();
    config.delivery.timeout = Duration::from_secs(5);
    config.validate().expect("valid cluster config");
    config
}

async fn enqueue(base: &str, ids: std::ops::Range<usize>, url: &str, spread_ms: usize) {
    let items: Vec<Value> = ids
        .map(|i| json!({"id": format!("c-{i}"), "url": url, "delay": format!("{}ms", (i * 7) % spread_ms)}))
        .collect();
    for chunk in items.chunks(1000) {
        let (status, answer) =
            post_json(&format!("{base}/v1/jobs/batch"), json!({"jobs": chunk})).await;
        assert_eq!(status, 200, "{answer}");
        for r in answer["results"].as_array().expect("results") {
            assert_eq!(r["status"], 201, "{r}");
        }
    }
}

async fn http_status(url: &str) -> u16 {
    match reqwest::get(url).await {
        Ok(response) => response.status().as_u16(),
        Err(_) => 0,
    }
}

async fn dbsize(node: &RedisServer) -> usize {
    let mut conn = node.conn().await;
    redis::cmd("DBSIZE")
        .query_async(&mut conn)
        .await
        .unwrap_or(0)
}

#[tokio::test]
async fn three_daemons_on_a_cluster_deliver_each_job_once() {
    let jobs = cluster_jobs();
    let cluster = RedisCluster::start();
    let receiver = Receiver::ok().await;
    let config = cluster_config(&cluster);
    let daemons = [
        start_daemon(&config).await,
        start_daemon(&config).await,
        start_daemon(&config).await,
    ];
    // Jobs due 2–4 s out, so the spread can be read before delivery starts.
    let per = jobs / 3;
    for (d, daemon) in daemons.iter().enumerate() {
        let end = if d == 2 { jobs } else { (d + 1) * per };
        let items: Vec<Value> = (d * per..end)
            .map(|i| json!({"id": format!("c-{i}"), "url": receiver.url("/"), "delay": format!("{}ms", 2000 + (i * 7) % 2000)}))
            .collect();
        for chunk in items.chunks(1000) {
            let (status, answer) = post_json(
                &format!("{}/v1/jobs/batch", daemon.url()),
                json!({"jobs": chunk}),
            )
            .await;
            assert_eq!(status, 200, "{answer}");
        }
    }
    let masters = cluster.master_ports();
    assert_eq!(masters.len(), 3);
    let mut per_master = Vec::new();
    for node in cluster.nodes.iter().filter(|n| masters.contains(&n.port())) {
        per_master.push(dbsize(node).await);
    }
    assert!(
        per_master.iter().all(|n| *n > 0),
        "every master holds jobs: {per_master:?}"
    );

    wait_until(
        "every job is delivered",
        Duration::from_secs(60 + jobs as u64 / 200),
        || async { receiver.count_distinct("webhook-id") >= jobs },
    )
    .await;
    // Count once no late duplicate can come: nothing scheduled, ready or in
    // flight, and the daemons stopped (their running attempts drained).
    crate::wait_until_idle(&daemons[0].url(), Duration::from_secs(60)).await;
    for daemon in daemons {
        daemon.stop().await.expect("clean stop");
    }
    let mut deliveries: HashMap<String, usize> = HashMap::new();
    for r in receiver.requests() {
        *deliveries
            .entry(r.header("webhook-id").unwrap_or_default().to_string())
            .or_default() += 1;
    }
    let doubles = deliveries.values().filter(|n| **n > 1).count();
    eprintln!(
        "cluster: {jobs} jobs, keys per master {per_master:?}, {} delivered, {doubles} delivered twice",
        deliveries.len()
    );
    assert_eq!(deliveries.len(), jobs);
    assert_eq!(doubles, 0, "no job promoted or claimed twice");

    // `hookq doctor` reads a cluster too (each master answers INFO on its
    // own): no check fails, and the memory check reports the summaries.
    let report = hookq::doctor::run(&config).await;
    let failed: Vec<_> = report
        .checks
        .iter()
        .filter(|c| c.status == hookq::doctor::Status::Fail)
        .collect();
    assert!(failed.is_empty(), "doctor on a cluster: {failed:?}");
}

/// A master is killed and its replica promoted while jobs are delivered.
/// redis-rs's cluster client alone would keep calling the dead node;
/// `store::ClusterConn` rebuilds the connection from the seeds and follows.
#[tokio::test]
async fn a_master_killed_mid_run_loses_no_job() {
    let jobs = cluster_jobs();
    let mut cluster = RedisCluster::start();
    let receiver = Receiver::ok().await;
    let config = cluster_config(&cluster);
    let daemons = [start_daemon(&config).await, start_daemon(&config).await];
    enqueue(&daemons[0].url(), 0..jobs, &receiver.url("/"), 4000).await;
    receiver
        .wait_for_count(jobs / 10, Duration::from_secs(30))
        .await;

    // Kill a master that is not the first seed; its replica takes over.
    let masters = cluster.master_ports();
    let victim_port = *masters
        .iter()
        .find(|p| **p != cluster.nodes[0].port())
        .expect("a second master");
    let victim = cluster
        .nodes
        .iter_mut()
        .find(|n| n.port() == victim_port)
        .expect("victim node");
    victim.kill();
    // SPEC §8: not ready while a master is gone, ready again by itself.
    let readyz = format!("{}/readyz", daemons[1].url());
    wait_until(
        "the daemon reports not ready",
        Duration::from_secs(10),
        || async { http_status(&readyz).await != 200 },
    )
    .await;
    wait_until("the replica took over", Duration::from_secs(30), || async {
        cluster.failed_over_from(victim_port)
    })
    .await;
    wait_until(
        "the daemon is ready again",
        Duration::from_secs(30),
        || async { http_status(&readyz).await == 200 },
    )
    .await;

    wait_until(
        "every job is delivered",
        Duration::from_secs(90 + jobs as u64 / 100),
        || async { receiver.count_distinct("webhook-id") >= jobs },
    )
    .await;
    eprintln!(
        "cluster failover: {jobs} jobs, master on port {victim_port} killed, {} deliveries, all {jobs} delivered",
        receiver.count()
    );
    for daemon in daemons {
        daemon.stop().await.expect("clean stop");
    }
}

/// How long one create may keep answering 503 (a slot half-moved) before
/// the test fails.
const CREATE_DEADLINE: Duration = Duration::from_secs(30);

/// Creates jobs one request at a time, as a client would: a 503 (the
/// partition's slot is being migrated, say) is retried after a short pause,
/// for at most [`CREATE_DEADLINE`]. Returns how many requests had to be
/// retried.
async fn enqueue_one_by_one(base: &str, ids: std::ops::Range<usize>, url: &str) -> usize {
    let mut retried = 0;
    for i in ids {
        let job =
            json!({"id": format!("c-{i}"), "url": url, "delay": format!("{}ms", (i * 7) % 1000)});
        let until = tokio::time::Instant::now() + CREATE_DEADLINE;
        loop {
            let (status, answer) = post_json(&format!("{base}/v1/jobs"), job.clone()).await;
            match status {
                200 | 201 => break,
                503 if tokio::time::Instant::now() < until => {
                    retried += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                503 => {
                    panic!("create c-{i} still answered 503 after {CREATE_DEADLINE:?}: {answer}")
                }
                _ => panic!("create c-{i}: {status} {answer}"),
            }
        }
    }
    retried
}

#[tokio::test]
async fn a_slot_migrated_mid_run_loses_no_job() {
    let jobs = cluster_jobs();
    let cluster = RedisCluster::start();
    let receiver = Receiver::ok().await;
    let config = cluster_config(&cluster);
    let daemons = [start_daemon(&config).await, start_daemon(&config).await];
    enqueue(&daemons[0].url(), 0..jobs / 2, &receiver.url("/"), 4000).await;

    // Every partition served by the first master moves to the second, a few
    // keys at a time, while the first half is delivered and the second half
    // is created.
    let SlotMove {
        from,
        to,
        slots,
        task: migration,
    } = start_moving_due_partitions(&cluster, config.redis.partitions);
    let retried = enqueue_one_by_one(&daemons[1].url(), jobs / 2..jobs, &receiver.url("/")).await;
    let keys_moved = migration.await.expect("the migration completes");

    wait_until(
        "every job is delivered",
        Duration::from_secs(60 + jobs as u64 / 100),
        || async { receiver.count_distinct("webhook-id") >= jobs },
    )
    .await;
    for slot in &slots {
        assert_eq!(slot_owner(from, *slot), to, "slot {slot} moved");
    }
    // A duplicate could still come from a lease yet to expire or an attempt
    // still running: count only once nothing is scheduled, ready or in
    // flight and both daemons have stopped (draining their attempts).
    crate::wait_until_idle(&daemons[0].url(), Duration::from_secs(60)).await;
    for daemon in daemons {
        daemon.stop().await.expect("clean stop");
    }
    let mut deliveries: HashMap<String, usize> = HashMap::new();
    for r in receiver.requests() {
        let id = r.header("webhook-id").expect("webhook-id").to_string();
        *deliveries.entry(id).or_default() += 1;
    }
    let mut twice: Vec<(&String, &usize)> = deliveries.iter().filter(|(_, n)| **n > 1).collect();
    twice.sort();
    eprintln!(
        "cluster migration: {jobs} jobs, {} slots ({keys_moved} keys) moved from {from} to {to}, \
         {retried} creates retried after 503, {} deliveries, {} jobs repeated",
        slots.len(),
        receiver.count(),
        twice.len()
    );
    assert!(
        keys_moved > 0,
        "the migration moved keys while jobs were live"
    );
    assert_eq!(deliveries.len(), jobs, "every job delivered");
    assert!(twice.is_empty(), "jobs delivered more than once: {twice:?}");
}

/// Every script that builds per-job keys, called while its partition's slot
/// is half-moved, either works or fails having changed nothing: first with
/// some job records already on the target (the source refuses them), then
/// with the partition's own keys on the target and some job records still on
/// the source (the target must not take them for absent). Afterwards every
/// job is still there to be claimed.
#[tokio::test]
async fn scripts_change_nothing_while_their_slot_is_half_moved() {
    let cluster = RedisCluster::start();
    let mut config = cluster_config(&cluster);
    config.redis.partitions = 1;
    config.delivery.timeout = Duration::from_millis(100);
    config.delivery.lease_margin = Duration::from_millis(100);
    let store = Store::connect(&config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    let new_job = |id: &str, delay: &str| {
        JobInput {
            id: Some(id.into()),
            url: Some("http://127.0.0.1:9/".into()),
            delay: Some(delay.into()),
            ..JobInput::default()
        }
        .validate(&config)
        .expect("valid job")
        .new_job(&config)
    };
    // f-1 in flight (its lease expires at once), r-1 and r-2 ready, d-1 and
    // d-2 past due in the due set; s-1 delivered and x-1 dead, so the stats
    // hash and the dead-letter stream exist too.
    for id in ["f-1", "s-1", "x-1"] {
        store.enqueue(&new_job(id, "0s")).await.expect("enqueue");
    }
    let claimed = store.claim(0, 10).await.expect("claim").jobs;
    assert_eq!(claimed.len(), 3);
    assert!(store
        .complete(
            &claimed[1],
            &store.delivery_from_json(&claimed[1].spec_json, "{}")
        )
        .await
        .expect("complete"));
    let failure = hookq::store::Failure {
        record: "{}",
        last_error: "gone",
        last_status: Some(410),
        topic: "default",
        action: hookq::retry::FailAction::DeadLetter,
    };
    store
        .fail(&claimed[2], &failure)
        .await
        .expect("dead letter");
    for (id, delay) in [
        ("r-1", "0s"),
        ("r-2", "0s"),
        ("d-1", "100ms"),
        ("d-2", "100ms"),
    ] {
        store.enqueue(&new_job(id, delay)).await.expect("enqueue");
    }
    // Until Redis's clock has passed f-1's lease deadline (claimed + timeout
    // + lease margin) and d-1's and d-2's due times (100 ms after their
    // enqueue, which was before `enqueued`).
    let enqueued = store.redis_time_ms().await.expect("TIME");
    let lease = (config.delivery.timeout + config.delivery.lease_margin).as_millis() as i64;
    let ripe = (claimed[0].claimed_at + lease).max(enqueued + 100);
    wait_until(
        "f-1's lease is over and d-1, d-2 are due",
        Duration::from_secs(10),
        || {
            let store = store.clone();
            async move { store.redis_time_ms().await.expect("TIME") > ripe }
        },
    )
    .await;

    let keys = store.keys().clone();
    let masters = cluster.master_ports();
    let slot = keyslot(masters[0], &keys.due(0));
    let from = slot_owner(masters[0], slot);
    let to = *masters
        .iter()
        .find(|p| **p != from)
        .expect("another master");
    begin_migration(slot, from, to);

    let all_fail_unchanged = |phase: &'static str| {
        let store = store.clone();
        let claimed = claimed[0].clone();
        let new = new_job("n-1", "0s");
        async move {
            let before = slot_snapshot(&[from, to], slot).await;
            let results = [
                ("promote", store.promote(0, 100).await.err()),
                ("claim", store.claim(0, 10).await.err()),
                (
                    "complete",
                    store
                        .complete(
                            &claimed,
                            &store.delivery_from_json(&claimed.spec_json, "{}"),
                        )
                        .await
                        .err(),
                ),
                ("reclaim", store.reclaim(0, 100).await.err()),
                ("enqueue", store.enqueue(&new).await.err()),
            ];
            for (script, error) in results {
                assert!(
                    error.is_some(),
                    "{phase}: {script} ran on a half-moved slot"
                );
                eprintln!("{phase}: {script}: {}", error.expect("an error"));
            }
            assert_eq!(
                before,
                slot_snapshot(&[from, to], slot).await,
                "{phase}: the slot changed"
            );
        }
    };

    // Phase 1: the job records of f-1, r-1 and d-1 have left the source.
    let moved_jobs = [
        keys.live_records(0, "f-1"),
        keys.live_records(0, "r-1"),
        keys.live_records(0, "d-1"),
    ];
    migrate_keys(
        from,
        to,
        &moved_jobs.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    all_fail_unchanged("job records on the target").await;

    // Phase 2: everything but the records of r-2 and d-2 is on the target.
    let stay = [keys.live_records(0, "r-2"), keys.live_records(0, "d-2")];
    let rest: Vec<String> = keys_in_slot(from, slot, 1000)
        .into_iter()
        .filter(|k| !stay.contains(k))
        .collect();
    migrate_keys(
        from,
        to,
        &rest.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    all_fail_unchanged("partition keys on the target").await;

    // The migration ends; every job is there to be worked on.
    migrate_keys(
        from,
        to,
        &stay.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    finish_migration(&masters, slot, from, to);
    let reclaim = store.reclaim(0, 100).await.expect("reclaim after the move");
    assert_eq!(reclaim.requeued, 1, "f-1's expired lease is taken back");
    let promotion = store.promote(0, 100).await.expect("promote after the move");
    assert_eq!(promotion.moved, 2, "d-1 and d-2 are promoted");
    let mut ids: Vec<String> = store
        .claim(0, 10)
        .await
        .expect("claim after the move")
        .jobs
        .into_iter()
        .map(|j| j.id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["d-1", "d-2", "f-1", "r-1", "r-2"]);
}
