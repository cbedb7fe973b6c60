//! The fair share between tenants (SPEC §15): each tenant's due jobs wait
//! in a ready list of its own, and a claim shares its batch between the
//! tenants with ready jobs by weight, so one tenant's backlog never queues
//! another's due jobs behind it.

use std::time::Duration;

use hookq::config::Config;
use hookq::job::{JobInput, RunAt};
use hookq::store::Store;
use hookq::tenant::{internal_id, TenantEntry};

use crate::support::receiver::Receiver;
use crate::support::redis::RedisServer;
use crate::{start_daemon, test_config};

/// Creates, through `store`, `n` jobs of `tenant` to `url`, due at
/// `due_ms` (ids `<prefix>-<i>`), as the API would for that tenant.
async fn enqueue_for(
    store: &Store,
    config: &Config,
    tenant: &str,
    prefix: &str,
    n: usize,
    url: &str,
    due_ms: i64,
) {
    let jobs: Vec<_> = (0..n)
        .map(|i| {
            let input = JobInput {
                id: Some(format!("{prefix}-{i:05}")),
                url: Some(url.to_string()),
                run_at: Some(RunAt::Millis(due_ms)),
                ..JobInput::default()
            };
            let mut job = input.validate(config).expect("valid job").new_job(config);
            job.id = internal_id(tenant, &job.id);
            job
        })
        .collect();
    for chunk in jobs.chunks(500) {
        for outcome in store.enqueue_many(chunk).await.expect("enqueue") {
            outcome.expect("created");
        }
    }
}

fn weighted(name: &str, weight: u32) -> TenantEntry {
    TenantEntry {
        name: name.into(),
        weight: Some(weight),
        max_live_jobs: None,
        create_rate: None,
    }
}

/// How many of `ids` belong to `tenant`.
fn count_of(ids: &[String], tenant: &str) -> usize {
    ids.iter()
        .filter(|id| hookq::tenant::tenant_of(id) == tenant)
        .count()
}

#[tokio::test]
async fn a_claim_shares_its_batch_between_tenants_by_weight() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.redis.partitions = 1;
    config.tenants = vec![weighted("billing", 2)];
    config.validate().expect("valid");
    let store = Store::connect(&config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    let url = "http://127.0.0.1:9/none";
    let due = 0; // long past: ready at once
    enqueue_for(&store, &config, "default", "d", 20, url, due).await;
    enqueue_for(&store, &config, "billing", "b", 20, url, due).await;
    enqueue_for(&store, &config, "marketing", "m", 3, url, due).await;

    // 8 shared 2:2:1 between billing (weight 2), default and marketing.
    let ids = |c: &hookq::store::ClaimBatch| -> Vec<String> {
        c.jobs.iter().map(|j| j.id.clone()).collect()
    };
    let first = ids(&store.claim(0, 8).await.expect("claim"));
    assert_eq!(first.len(), 8, "{first:?}");
    let (b, d, m) = (
        count_of(&first, "billing"),
        count_of(&first, "default"),
        count_of(&first, "marketing"),
    );
    assert_eq!(b, 4, "billing's share of 8 at weight 2 of 4: {first:?}");
    assert!(
        (1..=3).contains(&d) && (1..=3).contains(&m) && d + m == 4,
        "{first:?}"
    );
    // Inside a tenant, jobs keep their order.
    let billing: Vec<&String> = first
        .iter()
        .filter(|id| id.starts_with("billing/"))
        .collect();
    assert_eq!(
        billing,
        [
            "billing/b-00000",
            "billing/b-00001",
            "billing/b-00002",
            "billing/b-00003"
        ]
    );

    // Marketing runs dry: what it cannot take goes to the others, and it
    // leaves the set of tenants with ready jobs.
    let second = ids(&store.claim(0, 20).await.expect("claim"));
    assert_eq!(second.len(), 20);
    assert_eq!(
        count_of(&first, "marketing") + count_of(&second, "marketing"),
        3
    );
    let rest = ids(&store.claim(0, 100).await.expect("claim"));
    assert_eq!(
        first.len() + second.len() + rest.len(),
        43,
        "every job claimed once"
    );
    let tenants: Vec<String> = redis::cmd("SMEMBERS")
        .arg(store.keys().tenants(0))
        .query_async(&mut redis.conn().await)
        .await
        .expect("smembers");
    assert!(tenants.is_empty(), "dry tenants leave the set: {tenants:?}");
}

/// Tenant `bulk`'s 1,000 jobs fall due a millisecond before tenant
/// `pay`'s one job: the first promotion (a batch of 256) already moves
/// `pay`'s job, since each tenant's due set gives a share of the batch (one
/// due set in due order would move it after all 1,000). Cancelling a
/// tenant's only due job leaves its index entry early; the next promotion
/// drops it, and the stats count every tenant's due set.
#[tokio::test]
async fn a_tenants_due_backlog_does_not_hold_another_tenants_due_job() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.redis.partitions = 1;
    config.validate().expect("valid");
    let store = Store::connect(&config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    let url = "http://127.0.0.1:9/never";
    let due = store.redis_time_ms().await.expect("time") + 500;
    enqueue_for(&store, &config, "bulk", "b", 1000, url, due).await;
    enqueue_for(&store, &config, "pay", "p", 1, url, due + 1).await;
    enqueue_for(&store, &config, "later", "l", 1, url, due + 60_000).await;
    assert_eq!(store.stats().await.expect("stats").scheduled, 1002);
    crate::support::wait_until("both due", Duration::from_secs(10), || async {
        store.redis_time_ms().await.expect("time") > due + 1
    })
    .await;

    let promotion = store.promote(0, 256).await.expect("promote");
    assert!(promotion.started, "the ready lists started");
    assert!(promotion.more_due(), "bulk has jobs left due");
    let mut conn = redis.conn().await;
    let paid: u64 = redis::cmd("LLEN")
        .arg(store.keys().tenant_ready(0, "pay"))
        .query_async(&mut conn)
        .await
        .expect("llen");
    assert_eq!(paid, 1, "pay's due job waited behind bulk's backlog");

    // `later`'s only job is cancelled: its index entry stays until a
    // promotion finds its set empty (scored 0 here, so the next looks).
    let id = internal_id("later", "l-00000");
    store.cancel(&id).await.expect("cancel");
    let index = store.keys().due_tenants(0);
    let listed = || async {
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(&index)
            .arg(0)
            .arg(-1)
            .query_async(&mut redis.conn().await)
            .await
            .expect("zrange");
        members
    };
    let before = listed().await;
    assert!(before.contains(&"later".to_string()), "{before:?}");
    redis::cmd("ZADD")
        .arg(&index)
        .arg(0)
        .arg("later")
        .query_async::<i64>(&mut conn)
        .await
        .expect("zadd");
    for _ in 0..10 {
        if !store.promote(0, 256).await.expect("promote").more_due() {
            break;
        }
    }
    let after = listed().await;
    assert!(
        after.is_empty(),
        "emptied due sets leave the index: {after:?}"
    );
    let stats = store.stats().await.expect("stats");
    assert_eq!((stats.scheduled, stats.ready), (0, 1001));
}

/// Tenant `marketing`'s 400 jobs due now to a receiver answering in 20 ms,
/// then, once 20 of them are delivered, tenant `billing`'s `payments` jobs
/// to another receiver, with `daemons` daemons on `config`: the payments
/// arrive before half the bulk has (one ready list, first in first out,
/// would deliver them after the whole bulk).
async fn payments_beside_a_bulk(config: &Config, daemons: usize, payments: usize) {
    let bulk = Receiver::slow(204, Duration::from_millis(20)).await;
    let paid = Receiver::ok().await;
    let store = Store::connect(config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    enqueue_for(
        &store,
        config,
        "marketing",
        "bulk",
        400,
        &bulk.url("/bulk"),
        0,
    )
    .await;
    let mut running = Vec::new();
    for _ in 0..daemons {
        running.push(start_daemon(config).await);
    }
    bulk.wait_for_count(20, Duration::from_secs(20)).await;
    enqueue_for(
        &store,
        config,
        "billing",
        "pay",
        payments,
        &paid.url("/pay"),
        0,
    )
    .await;
    paid.wait_for_count(payments, Duration::from_secs(20)).await;
    let bulk_done = bulk.count();
    assert!(
        bulk_done < 200,
        "with {daemons} daemon(s) the payments waited for {bulk_done} of the 400 bulk jobs"
    );
    bulk.wait_for_count(400, Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_tenants_backlog_does_not_hold_another_tenants_due_jobs() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    // 400 bulk jobs take 400 × 20 ms / 4 workers = 2 s to drain.
    config.delivery.workers = 4;
    payments_beside_a_bulk(&config, 1, 5).await;
}

#[tokio::test]
async fn weights_share_delivery_between_saturated_tenants() {
    let redis = RedisServer::start();
    let heavy = Receiver::slow(204, Duration::from_millis(10)).await;
    let light = Receiver::slow(204, Duration::from_millis(10)).await;
    let mut config = test_config(&redis);
    config.delivery.workers = 4;
    config.tenants = vec![weighted("heavy", 3)];
    config.validate().expect("valid");
    let store = Store::connect(&config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    enqueue_for(&store, &config, "heavy", "h", 600, &heavy.url("/h"), 0).await;
    enqueue_for(&store, &config, "light", "l", 600, &light.url("/l"), 0).await;
    let _daemon = start_daemon(&config).await;
    // While both have a backlog, deliveries follow the weights 3:1.
    crate::support::wait_until("400 deliveries", Duration::from_secs(60), || async {
        heavy.count() + light.count() >= 400
    })
    .await;
    let (h, l) = (heavy.count() as f64, light.count() as f64);
    let share = h / (h + l);
    assert!(
        (0.65..=0.85).contains(&share),
        "heavy (weight 3) got {h} of {} deliveries: {share:.2}, not about 0.75",
        h + l
    );
}

#[tokio::test]
async fn the_fair_share_holds_with_two_daemons() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.delivery.workers = 2;
    payments_beside_a_bulk(&config, 2, 8).await;
}

#[tokio::test]
async fn the_fair_share_holds_on_a_cluster() {
    let cluster = crate::support::cluster::RedisCluster::start();
    let mut config = test_config(&cluster.nodes[0]);
    config.redis.partitions = 16;
    config.redis.cluster_nodes = cluster.seeds();
    config.delivery.workers = 4;
    config.validate().expect("valid cluster config");
    payments_beside_a_bulk(&config, 1, 8).await;
}

/// Old data: `tests/fixtures/pre-tenants.rdb` was written by the last
/// commit before tenants (`tests/fixtures/make-pre-tenants.sh`): jobs ready,
/// scheduled, in the timing wheel and in an ordering key's line, and a dead
/// letter. The new binary reads them as the `default` tenant's, with no
/// step of the operator's but the layout's `hookq migrate` (layout 3 to 4,
/// the version alone), delivers them (the line in order) and replays the
/// dead letter.
#[tokio::test]
async fn data_written_before_tenants_is_the_default_tenants() {
    let fixture = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/pre-tenants.rdb"
        ),
        fixture.path().join("pre-tenants.rdb"),
    )
    .expect("copy the fixture");
    let dir = fixture.path().to_str().expect("utf-8 path");
    let redis = RedisServer::start_with(&["--dir", dir, "--dbfilename", "pre-tenants.rdb"]);
    // The fixture's jobs target this address (see its script).
    let receiver = Receiver::start_on(
        "127.77.0.1:18080",
        std::sync::Arc::new(|_: &crate::support::receiver::Recorded| {
            crate::support::receiver::Reply::status(204)
        }),
    )
    .await;
    let mut config = test_config(&redis);
    config.redis.partitions = 16; // the fixture's (the default)
    let migrated = crate::migrate::hookq(&redis, 16, &["migrate"]);
    assert!(
        migrated.status.success(),
        "hookq migrate: {}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let got = receiver.wait_for_count(9, Duration::from_secs(30)).await;
    let mut ids: Vec<&str> = got.iter().filter_map(|r| r.header("webhook-id")).collect();
    let ordered: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| id.starts_with("old-ord-"))
        .collect();
    assert_eq!(
        ordered,
        ["old-ord-1", "old-ord-2"],
        "the line keeps its order"
    );
    ids.sort_unstable();
    assert_eq!(
        ids,
        [
            "old-ord-1",
            "old-ord-2",
            "old-ready-1",
            "old-ready-2",
            "old-ready-3",
            "old-sched-1",
            "old-sched-2",
            "old-sched-3",
            "old-wheel-1"
        ]
    );
    let view = crate::job_view(&base, "old-ready-1").await;
    assert_eq!(view["id"], "old-ready-1");
    // The dead letter is listed and replays (to its closed port: dead again).
    let (status, page) = crate::get_json(&format!("{base}/v1/dead-letters")).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.to_string().contains("old-dead-1"), "{page}");
    let (status, answer) = crate::post_json(
        &format!("{base}/v1/dead-letters/replay"),
        serde_json::json!({"ids": ["old-dead-1"]}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["replayed"],
        serde_json::json!(["old-dead-1"]),
        "{answer}"
    );

    // The ledger counted the live jobs it found (seeded once, at start) and
    // adds up once the replayed job is dead again and every delivery is
    // recorded (outcomes are recorded in batches, a window after the answer).
    let ledger = format!("{base}/v1/tenants/default");
    let expected = [
        ("created", 9),
        ("replayed", 1),
        ("delivered", 9),
        ("dead_lettered", 1),
        ("cancelled", 0),
        ("live", 0),
    ];
    crate::support::wait_until(
        "the replayed job is dead again, every delivery recorded",
        Duration::from_secs(20),
        || async {
            let counts = crate::get_json(&ledger).await.1;
            expected.iter().all(|(name, value)| counts[*name] == *value)
        },
    )
    .await;
    let (_, counts) = crate::get_json(&ledger).await;
    for (name, value) in expected {
        assert_eq!(counts[name], value, "{name}: {counts}");
    }
}

/// A tenant's jobs for a host that hangs hold neither that tenant's other
/// hosts nor another tenant: the host lanes keep working under the fair
/// share.
#[tokio::test]
async fn a_hanging_host_holds_neither_its_tenants_other_hosts_nor_other_tenants() {
    let redis = RedisServer::start();
    let hanging = crate::support::hanging::HangingHost::start().await;
    let own_other = Receiver::ok().await;
    let other_tenant = Receiver::ok().await;
    let mut config = test_config(&redis);
    config.delivery.workers = 8;
    config.delivery.per_host_concurrency = 2;
    config.delivery.timeout = Duration::from_secs(30);
    config.delivery.max_timeout = Duration::from_secs(30);
    config.validate().expect("valid");
    let store = Store::connect(&config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    enqueue_for(
        &store,
        &config,
        "orders",
        "hang",
        200,
        &hanging.url("/hang"),
        0,
    )
    .await;
    let _daemon = start_daemon(&config).await;
    // The hanging host's attempts take its two slots and its jobs fill the
    // lane; then the same tenant's other host and another tenant fall due.
    crate::support::wait_until(
        "the hanging host holds its slots",
        Duration::from_secs(10),
        || async { hanging.accepted() >= 2 },
    )
    .await;
    enqueue_for(
        &store,
        &config,
        "orders",
        "own",
        20,
        &own_other.url("/own"),
        0,
    )
    .await;
    enqueue_for(
        &store,
        &config,
        "billing",
        "pay",
        20,
        &other_tenant.url("/pay"),
        0,
    )
    .await;
    // Well inside the hanging attempts' 30 s timeout.
    own_other.wait_for_count(20, Duration::from_secs(10)).await;
    other_tenant
        .wait_for_count(20, Duration::from_secs(10))
        .await;
}

/// Tenant `orders` fills the daemon's claim budget (2 × 2 workers): two
/// attempts hang on two hosts, two jobs wait in memory for a worker. Tenant
/// `billing`'s job then falls due: its ready list starts, and the claim
/// loop, waiting for room, claims it at once from the reserve (the budget
/// would keep it in Redis until an attempt ends or the jobs in memory go
/// back: 30 s).
#[tokio::test]
async fn a_tenants_job_is_claimed_while_another_tenant_fills_the_claim_budget() {
    let redis = RedisServer::start();
    let hanging = [
        crate::support::hanging::HangingHost::start().await,
        crate::support::hanging::HangingHost::start().await,
    ];
    let ok = Receiver::ok().await;
    let mut config = test_config(&redis);
    config.redis.partitions = 1;
    config.delivery.workers = 2;
    config.delivery.timeout = Duration::from_secs(30);
    config.delivery.max_timeout = Duration::from_secs(30);
    // Jobs waiting in memory go back to Redis after half the lease margin:
    // not within this test.
    config.delivery.lease_margin = Duration::from_secs(60);
    config.validate().expect("valid");
    let store = Store::connect(&config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    let _daemon = start_daemon(&config).await;
    for (i, host) in hanging.iter().enumerate() {
        enqueue_for(
            &store,
            &config,
            "orders",
            &format!("hang{i}"),
            1,
            &host.url("/"),
            0,
        )
        .await;
    }
    crate::support::wait_until("both workers hang", Duration::from_secs(10), || async {
        hanging.iter().all(|h| h.accepted() == 1)
    })
    .await;
    enqueue_for(&store, &config, "orders", "wait", 2, &ok.url("/wait"), 0).await;
    let inflight = || async {
        let n: u64 = redis::cmd("ZCARD")
            .arg(store.keys().inflight(0))
            .query_async(&mut redis.conn().await)
            .await
            .expect("zcard");
        n
    };
    crate::support::wait_until("the budget is full", Duration::from_secs(10), || async {
        inflight().await == 4
    })
    .await;
    let due = store.redis_time_ms().await.expect("time") + 300;
    enqueue_for(&store, &config, "billing", "pay", 1, &ok.url("/pay"), due).await;
    let pay = internal_id("billing", "pay-00000");
    crate::support::wait_until(
        "billing's job is claimed",
        Duration::from_secs(10),
        || async {
            let job = store.get(&pay).await.expect("get").expect("the job");
            job.state == hookq::job::State::Inflight
        },
    )
    .await;
    assert_eq!(
        inflight().await,
        5,
        "claimed beyond the budget, from the reserve"
    );
    assert_eq!(ok.count(), 0, "no worker was free meanwhile");
}

/// A claim looks at 64 tenants' lists at most; with more tenants ready it
/// says there may be more, so the claim loop comes back for the others
/// at once instead of sleeping on them.
#[tokio::test]
async fn a_claim_with_more_than_64_tenants_ready_comes_back_for_the_rest() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.redis.partitions = 1;
    let store = Store::connect(&config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    for t in 0..70 {
        let tenant = format!("t{t}");
        enqueue_for(&store, &config, &tenant, "j", 1, "http://127.0.0.1:9/x", 0).await;
    }
    let first = store.claim(0, 100).await.expect("claim");
    assert_eq!(first.jobs.len(), 64, "one job of each of 64 tenants");
    assert!(first.more, "6 tenants were left out: there is more");
    let second = store.claim(0, 100).await.expect("claim");
    assert_eq!(second.jobs.len(), 6);
    assert!(!second.more);
}

/// A tenant's jobs due together are claimed in the round that promotes
/// them: the claim that promotes reads the tenants' ready lists the
/// promotion started, so the jobs do not wait for a claim loop's idle
/// recheck (5 s).
#[tokio::test]
async fn a_tenants_jobs_are_claimed_in_the_round_that_promotes_them() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    let daemon = start_daemon(&config).await;
    let due = store.redis_time_ms().await.expect("time") + 500;
    enqueue_for(&store, &config, "burst", "b", 20, &receiver.url("/b"), due).await;
    // Half the idle recheck after the due time: missed by the round, they
    // would arrive only at the recheck.
    receiver
        .wait_for_count(20, Duration::from_millis(500 + 2_500))
        .await;
    daemon.stop().await.expect("clean stop");
}
