//! hookq on a real Redis Cluster (three masters, three replicas on loopback):
//! partitions spread over every master, three daemons deliver each job once,
//! and (ignored: a known gap) a master killed mid-run loses no job. Set
//! `HOOKQ_CLUSTER_JOBS=20000` for the long run (default 3,000).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::cluster::RedisCluster;
use crate::support::receiver::Receiver;
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{post_json, start_daemon, test_config};

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
    for daemon in daemons {
        daemon.stop().await.expect("clean stop");
    }
}

/// Known gap (issue 8 stays open): after the master is killed and its replica
/// promoted, redis-rs 0.32's async cluster connection keeps retrying the dead
/// node for the slots it served, so jobs of those partitions stall; the run
/// does not finish. Run with `--ignored` to reproduce.
#[tokio::test]
#[ignore = "known gap: the cluster client does not follow a failover yet (issue 8)"]
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
    wait_until("the replica took over", Duration::from_secs(30), || async {
        cluster.is_ok(victim_port)
    })
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
