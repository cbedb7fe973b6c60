//! The Lua library as Redis Functions (issue 37, SPEC §16): loaded once per
//! Redis under a name that carries its digest, reloaded on a Redis that
//! lost it, scripts run by `FCALL`; and `EVALSHA` on a Redis without
//! Functions.

use std::time::Duration;

use hookq::store::Store;
use serde_json::json;

use crate::support::receiver::Receiver;
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{post_created, start_daemon, test_config};

/// Starts a daemon, failing the test if it has not started within 60 s
/// (it cannot while its scripts cannot run: its start-up retries them).
async fn start(config: &hookq::config::Config) -> hookq::daemon::Daemon {
    tokio::time::timeout(Duration::from_secs(60), start_daemon(config))
        .await
        .expect("the daemon starts within 60 s")
}

/// The libraries on `redis` (`FUNCTION LIST`): (name, number of functions).
async fn libraries(redis: &RedisServer) -> Vec<(String, usize)> {
    let mut conn = redis.conn().await;
    let list: Vec<redis::Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .expect("FUNCTION LIST");
    list.iter()
        .map(|library| {
            let fields: Vec<(String, redis::Value)> =
                redis::from_redis_value(library).expect("a library is a map");
            let field = |name: &str| {
                fields
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_else(|| panic!("a library without {name}"))
            };
            let name: String = redis::from_redis_value(&field("library_name")).expect("name");
            let functions: Vec<redis::Value> =
                redis::from_redis_value(&field("functions")).expect("functions");
            (name, functions.len())
        })
        .collect()
}

/// `calls=` of one command in `INFO commandstats` (0 if never called).
async fn calls(redis: &RedisServer, command: &str) -> i64 {
    let prefix = format!("cmdstat_{command}:");
    redis
        .calls_of(|l| l.starts_with(&prefix))
        .await
        .expect("INFO commandstats")
}

/// Creates a job due now to `receiver` through the daemon at `api` and
/// waits until it arrives.
async fn deliver_one(api: &str, receiver: &Receiver, id: &str, count: usize) {
    post_created(
        &format!("{api}/v1/jobs"),
        json!({"id": id, "url": receiver.url("/fn"), "body": {"n": count}}),
    )
    .await;
    receiver
        .wait_for_count(count, Duration::from_secs(30))
        .await;
}

/// A daemon and another store on one Redis load one library (the same one:
/// its name is its digest), holding every script; the daemon's scripts run
/// by `FCALL`, never `EVALSHA`. After `FUNCTION FLUSH` (as a Redis restarted
/// without persistence), the next call finds its function missing, loads
/// the library again on that Redis and succeeds.
#[tokio::test]
async fn the_library_is_loaded_once_and_again_after_a_flush() {
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let receiver = Receiver::ok().await;
    let other = Store::connect(&config).await.expect("connect");
    other.load_scripts().await.expect("load");
    let daemon = start(&config).await;
    other.load_scripts().await.expect("load again");

    let loaded = libraries(&redis).await;
    assert_eq!(loaded.len(), 1, "one library: {loaded:?}");
    let (name, functions) = &loaded[0];
    assert!(name.starts_with("hookq_"), "{name}");
    assert_eq!(
        *functions,
        hookq_script_count(),
        "every script is a function"
    );

    deliver_one(&daemon.url(), &receiver, "f-1", 1).await;
    assert!(calls(&redis, "fcall").await > 0, "scripts run by FCALL");
    assert_eq!(calls(&redis, "evalsha").await, 0, "no EVALSHA");
    assert_eq!(calls(&redis, "eval").await, 0, "no EVAL");

    let mut conn = redis.conn().await;
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("FUNCTION FLUSH");
    assert!(libraries(&redis).await.is_empty());
    deliver_one(&daemon.url(), &receiver, "f-2", 2).await;
    assert_eq!(libraries(&redis).await, loaded, "the same library again");
    daemon.stop().await.expect("stop");
}

/// The number of scripts in `lua/` besides the prelude: one function each.
fn hookq_script_count() -> usize {
    std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/lua"))
        .expect("lua/")
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.ends_with(".lua") && name != "prelude.lua"
        })
        .count()
}

/// The names of the libraries on `redis`, sorted.
async fn library_names(redis: &RedisServer) -> Vec<String> {
    let mut names: Vec<String> = libraries(redis).await.into_iter().map(|(n, _)| n).collect();
    names.sort();
    names
}

/// Waits (up to 30 s) until the libraries on `redis` are `want` (sorted).
async fn wait_for_libraries(redis: &RedisServer, want: &[String]) {
    let what = format!("the libraries are {want:?}");
    wait_until(&what, Duration::from_secs(30), || async {
        library_names(redis).await == want
    })
    .await;
}

/// Daemons whose scripts differ (here by `redis.wheel_bucket`, compiled into
/// them: as two versions in a rolling upgrade) on one Redis load one
/// library each, neither replacing nor deleting the other while both run,
/// and both work. Once no daemon of the first runs, the next daemon to
/// start deletes its library.
#[tokio::test]
async fn daemons_of_other_configs_keep_their_own_libraries() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let first = test_config(&redis);
    let mut second = test_config(&redis);
    second.redis.wheel_bucket = first.redis.wheel_bucket * 2;
    let old = start(&first).await;
    let loaded_first = library_names(&redis).await;
    let new = start(&second).await;
    let loaded = library_names(&redis).await;
    assert_eq!(loaded.len(), 2, "two libraries: {loaded:?}");
    deliver_one(&new.url(), &receiver, "w-1", 1).await;
    deliver_one(&old.url(), &receiver, "w-2", 2).await;
    new.stop().await.expect("stop");
    let new = start(&second).await;
    deliver_one(&new.url(), &receiver, "w-3", 3).await;
    assert_eq!(
        library_names(&redis).await,
        loaded,
        "nothing replaced or deleted while a daemon of each runs"
    );

    old.stop().await.expect("stop");
    new.stop().await.expect("stop");
    // (A stopped daemon's connection closes a moment after its last user.)
    wait_until(
        "the stopped daemons' connections close",
        Duration::from_secs(10),
        || async {
            let mut conn = redis.conn().await;
            let clients: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(&mut conn)
                .await
                .expect("CLIENT LIST");
            !loaded_first
                .iter()
                .any(|n| clients.contains(&format!("name={n} ")))
        },
    )
    .await;
    let new = start(&second).await;
    let second_only: Vec<String> = loaded
        .iter()
        .filter(|n| !loaded_first.contains(n))
        .cloned()
        .collect();
    wait_for_libraries(&redis, &second_only).await;
    deliver_one(&new.url(), &receiver, "w-4", 4).await;
    new.stop().await.expect("stop");
}

/// A daemon deletes, at its start, the hookq libraries that no client
/// connected to Redis is named after (those of versions no daemon runs any
/// more), keeping its own, a hookq library a connected client is named
/// after (a running daemon of another version), and libraries that are not
/// hookq's. Its own connection carries its library's name.
#[tokio::test]
async fn a_daemon_deletes_the_libraries_no_connected_daemon_uses() {
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let mut conn = redis.conn().await;
    for name in [
        "hookq_00000000000000a1",
        "hookq_00000000000000b2",
        "reports",
    ] {
        let code = format!(
            "#!lua name={name}\nredis.register_function('{name}_f', function() return 1 end)"
        );
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg(code)
            .query_async::<()>(&mut conn)
            .await
            .expect("FUNCTION LOAD");
    }
    // A client of the second one, still connected.
    let mut running = redis.conn().await;
    redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg("hookq_00000000000000b2")
        .query_async::<()>(&mut running)
        .await
        .expect("CLIENT SETNAME");

    // `hookq doctor` tells them apart.
    let libraries_check = || async {
        let report = hookq::doctor::run(&config).await;
        let check = report.checks.into_iter().find(|c| c.name == "libraries");
        check.expect("doctor has a libraries check").detail
    };
    let detail = libraries_check().await;
    assert!(
        detail.contains("in use by a connected client: hookq_00000000000000b2;")
            && detail
                .contains("stale (the next daemon start deletes them): hookq_00000000000000a1"),
        "{detail}"
    );

    let daemon = start(&config).await;
    let own_name = library_names(&redis)
        .await
        .into_iter()
        .find(|n| {
            ![
                "hookq_00000000000000a1",
                "hookq_00000000000000b2",
                "reports",
            ]
            .contains(&n.as_str())
        })
        .expect("the daemon's library");
    let mut want = vec![
        "hookq_00000000000000b2".to_string(),
        "reports".to_string(),
        own_name.clone(),
    ];
    want.sort();
    wait_for_libraries(&redis, &want).await;
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .expect("CLIENT LIST");
    assert!(
        clients.contains(&format!("name={own_name} ")),
        "the daemon's connection is named after its library: {clients}"
    );
    let detail = libraries_check().await;
    assert!(detail.ends_with("deletes them): none"), "{detail}");
    let receiver = Receiver::ok().await;
    deliver_one(&daemon.url(), &receiver, "d-1", 1).await;
    daemon.stop().await.expect("stop");
    drop(running);
}

/// On a Redis without Functions (`FUNCTION` and `FCALL` renamed away, as on
/// Redis 6), the daemon starts, its scripts run by `EVALSHA`, and jobs are
/// delivered; a store that never loaded the scripts finds out at its first
/// call and runs it by `EVALSHA` too.
#[tokio::test]
async fn a_redis_without_functions_runs_the_scripts_by_evalsha() {
    let redis = RedisServer::start_with(&[
        "--rename-command",
        "FUNCTION",
        "",
        "--rename-command",
        "FCALL",
        "",
    ]);
    let mut conn = redis.conn().await;
    let refused: redis::RedisResult<redis::Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .query_async(&mut conn)
        .await;
    assert!(refused.is_err(), "FUNCTION is gone");
    let config = test_config(&redis);
    let receiver = Receiver::ok().await;
    let daemon = start(&config).await;
    deliver_one(&daemon.url(), &receiver, "e-1", 1).await;
    assert!(calls(&redis, "evalsha").await > 0, "scripts run by EVALSHA");
    daemon.stop().await.expect("stop");

    let fresh = Store::connect(&config).await.expect("connect");
    let before = calls(&redis, "evalsha").await;
    fresh.promote(0, 100).await.expect("promote runs");
    assert!(calls(&redis, "evalsha").await > before, "by EVALSHA");
}

/// A store over `redis` with 4 partitions and one job due now in each of
/// partitions 0, 1 and 2 (ids `<prefix>-<n>` picked by partition),
/// promoted; returns the store and the three ids.
async fn store_with_a_due_job_in_three_partitions(
    redis: &RedisServer,
    prefix: &str,
) -> (Store, Vec<String>) {
    let mut config = test_config(redis);
    config.redis.partitions = 4;
    config.validate().expect("valid config");
    let store = Store::connect(&config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    let mut ids = Vec::new();
    for p in 0..3u16 {
        let id = (0..)
            .map(|i| format!("{prefix}-{i}"))
            .find(|id| store.keys().partition_of(id) == p)
            .expect("an id of partition p");
        let input = hookq::job::JobInput {
            id: Some(id.clone()),
            url: Some("http://127.0.0.1:9/never".into()),
            ..hookq::job::JobInput::default()
        };
        crate::enqueue_direct(&store, &config, input).await;
        store.promote(p, 10).await.expect("promote");
        ids.push(id);
    }
    (store, ids)
}

/// A batching store's claims made at one moment go to Redis as one `FCALL`
/// of the batch function, each answered with its own jobs; a call that
/// fails (a partition whose ready list is not a list) fails alone.
#[tokio::test]
async fn claims_made_together_go_as_one_call_and_fail_alone() {
    let redis = RedisServer::start();
    // One job due now in each of partitions 0, 1 and 2, promoted.
    let (store, ids) = store_with_a_due_job_in_three_partitions(&redis, "b").await;
    // Partition 3's ready list is a string: its claim fails.
    let mut conn = redis.conn().await;
    redis::cmd("SET")
        .arg(store.keys().ready(3))
        .arg("not a list")
        .query_async::<()>(&mut conn)
        .await
        .expect("SET");

    let batching = store.clone().batching();
    let before = calls(&redis, "fcall").await;
    let claims = futures_util::future::join_all((0..4u16).map(|p| batching.claim(p, 10))).await;
    assert_eq!(
        calls(&redis, "fcall").await - before,
        1,
        "four claims made together, one FCALL"
    );
    for (p, claim) in claims.iter().take(3).enumerate() {
        let jobs = &claim.as_ref().expect("claimed").jobs;
        let got: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
        assert_eq!(got, [ids[p].as_str()], "partition {p}'s own job");
    }
    let failed = claims[3]
        .as_ref()
        .expect_err("a string is not a ready list");
    assert!(failed.to_string().contains("WRONGTYPE"), "{failed}");
}

/// An outcome recorded with a time to ride (as the daemon's outcomes are)
/// does not wake Redis alone: it goes in the same `FCALL` as the next
/// batch of calls, and alone only once its time is up.
#[tokio::test]
async fn an_outcome_rides_with_the_next_call_and_alone_only_at_its_time() {
    let redis = RedisServer::start();
    let (store, _) = store_with_a_due_job_in_three_partitions(&redis, "r").await;
    let batching = store.clone().batching();
    let first = batching.claim(0, 10).await.expect("claim").jobs;
    let job = first.first().expect("partition 0's job").clone();

    let before = calls(&redis, "fcall").await;
    let rider = {
        let store = batching.clone();
        let delivery = store.delivery_from_json(&job.spec_json, "{}");
        let until = tokio::time::Instant::now() + Duration::from_secs(20);
        tokio::spawn(async move {
            store
                .complete_many(
                    0,
                    &[(&job.id, job.attempt, &job.lease, &delivery)],
                    Some(until),
                )
                .await
        })
    };
    // (The test's runtime has one thread: the rider queues its call here.)
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let second = batching.claim(1, 10).await.expect("claim").jobs;
    assert_eq!(second.len(), 1, "partition 1's job");
    let recorded = tokio::time::timeout(Duration::from_secs(5), rider)
        .await
        .expect("the outcome went with the claim, long before its time")
        .expect("the rider's task")
        .expect("recorded");
    assert_eq!(recorded, [true]);
    assert_eq!(
        calls(&redis, "fcall").await - before,
        1,
        "the outcome and the claim: one FCALL"
    );

    // Alone, an outcome goes once its time to ride is up.
    let job = &second[0];
    let delivery = batching.delivery_from_json(&job.spec_json, "{}");
    let until = tokio::time::Instant::now() + Duration::from_millis(50);
    let recorded = tokio::time::timeout(
        Duration::from_secs(5),
        batching.complete_many(
            1,
            &[(&job.id, job.attempt, &job.lease, &delivery)],
            Some(until),
        ),
    )
    .await
    .expect("a lone rider goes at its time")
    .expect("recorded");
    assert_eq!(recorded, [true]);
}

/// A batch waits for the calls a carrier round announced
/// (`Store::expect_calls`) instead of leaving with the first: two claims
/// announced, the second made after the batcher has taken the first, go
/// as one `FCALL`.
#[tokio::test]
async fn a_batch_waits_for_the_calls_a_round_announced() {
    let redis = RedisServer::start();
    let (store, ids) = store_with_a_due_job_in_three_partitions(&redis, "e").await;
    let batching = store.clone().batching();
    let before = calls(&redis, "fcall").await;
    batching.expect_calls(2);
    let first = {
        let store = batching.clone();
        tokio::spawn(async move { store.claim(0, 10).await })
    };
    // (The test's runtime has one thread: the first claim is queued and
    // the batcher has let the other tasks run before this one goes on.)
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let second = batching.claim(1, 10).await.expect("claim").jobs;
    let first = first
        .await
        .expect("the first claim's task")
        .expect("claim")
        .jobs;
    assert_eq!(first[0].id, ids[0]);
    assert_eq!(second[0].id, ids[1]);
    assert_eq!(
        calls(&redis, "fcall").await - before,
        1,
        "the two announced claims: one FCALL"
    );
}

/// The commands `redis` runs from now on, as `MONITOR` prints them, one
/// line each (the monitor is on when this returns).
async fn monitor(redis: &RedisServer) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", redis.port()))
        .await
        .expect("connect for MONITOR");
    stream.write_all(b"MONITOR\r\n").await.expect("MONITOR");
    let mut lines = BufReader::new(stream).lines();
    let ok = lines.next_line().await.expect("MONITOR's answer");
    assert_eq!(ok.as_deref(), Some("+OK"));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// A claim made at the moment a bulk's outcomes are queued does not wait
/// behind them: it goes in the first `FCALL`, before outcomes queued ahead
/// of it, and the batches stop at their size (the outcomes take several).
#[tokio::test]
async fn a_claim_goes_before_the_outcomes_queued_ahead_of_it() {
    let redis = RedisServer::start();
    let (store, ids) = store_with_a_due_job_in_three_partitions(&redis, "o").await;
    let batching = store.clone().batching();
    let first = batching.claim(0, 10).await.expect("claim").jobs;
    let spec_json = &first.first().expect("partition 0's job").spec_json;
    let delivery = batching.delivery_from_json(spec_json, "{}");
    // Eight calls of 16 outcomes (jobs that are not there: each answers
    // stale), 5 arguments each: several batches' worth.
    let ghosts: Vec<String> = (0..16).map(|i| format!("ghost-{i}")).collect();
    let ghost_lease = hookq::store::Lease {
        token: "1".into(),
        again: false,
        max_attempts: 1,
        created: 0,
    };
    let outcomes: Vec<(&str, u32, &hookq::store::Lease, &hookq::store::Delivery)> = ghosts
        .iter()
        .map(|id| (id.as_str(), 1, &ghost_lease, &delivery))
        .collect();
    let mut commands = monitor(&redis).await;

    let recorded = (0..8u16).map(|_| batching.complete_many(2, &outcomes, None));
    let (recorded, claim) = tokio::join!(
        futures_util::future::join_all(recorded),
        batching.claim(1, 10)
    );
    for stale in recorded {
        assert_eq!(stale.expect("recorded"), [false; 16]);
    }
    let claimed: Vec<String> = claim
        .expect("claim")
        .jobs
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(claimed, [ids[1].clone()]);

    let mut fcalls = Vec::new();
    while fcalls.len() < 2 {
        let line = tokio::time::timeout(Duration::from_secs(5), commands.recv())
            .await
            .expect("the batches show in MONITOR")
            .expect("MONITOR's connection");
        if line.contains("\"FCALL\"") {
            fcalls.push(line);
        }
    }
    assert!(
        fcalls[0].contains("\"claim_ready\""),
        "the claim goes in the first batch: {}…",
        fcalls[0].chars().take(300).collect::<String>()
    );
    assert!(
        !fcalls[1].contains("\"claim_ready\""),
        "the outcomes fill more than one batch: {}…",
        fcalls[1].chars().take(300).collect::<String>()
    );
}

/// One batch is in flight at a time: the calls made while it runs wait
/// and go together as the next one (here Redis is paused, so the first
/// batch runs until the pause ends; the two claims made meanwhile, 30 ms
/// apart, go as one `FCALL`, not one each).
#[tokio::test]
async fn calls_made_while_a_batch_runs_go_together_as_the_next() {
    let redis = RedisServer::start();
    let (store, ids) = store_with_a_due_job_in_three_partitions(&redis, "f").await;
    let batching = store.clone().batching();
    let before = calls(&redis, "fcall").await;
    let mut admin = redis.conn().await;
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(500)
        .arg("ALL")
        .query_async::<()>(&mut admin)
        .await
        .expect("CLIENT PAUSE");
    let claim = |p: u16| {
        let store = batching.clone();
        tokio::spawn(async move { store.claim(p, 10).await })
    };
    let first = claim(0);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let second = claim(1);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let third = claim(2);
    for (p, task) in [first, second, third].into_iter().enumerate() {
        let jobs = task.await.expect("claim task").expect("claim").jobs;
        let got: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
        assert_eq!(got, [ids[p].as_str()], "partition {p}'s own job");
    }
    assert_eq!(
        calls(&redis, "fcall").await - before,
        2,
        "the first claim's batch, then the two made while it ran"
    );
}

/// On a single Redis one `complete_jobs` call records several partitions'
/// successes, each in its own partition: its record becomes a summary
/// there, its lease leaves that partition's in-flight set and its
/// partition counts it; a stale lease among them changes nothing for its
/// job alone. The ledger, summed over the partitions, counts each once.
#[tokio::test]
async fn one_outcome_call_records_several_partitions_each_in_its_own() {
    let redis = RedisServer::start();
    let (store, ids) = store_with_a_due_job_in_three_partitions(&redis, "o").await;
    assert!(store.completes_partitions_together(), "a single Redis");
    let mut claimed = Vec::new();
    for p in 0..3u16 {
        let jobs = store.claim(p, 10).await.expect("claim").jobs;
        assert_eq!(jobs.len(), 1, "partition {p}'s job");
        assert_eq!(jobs[0].partition, p);
        claimed.push(jobs[0].clone());
    }
    let deliveries: Vec<_> = claimed
        .iter()
        .map(|job| store.delivery_from_json(&job.spec_json, r#"{"status":200}"#))
        .collect();
    // Partition 1's outcome carries a lease that is not its job's (a
    // reclaimed attempt's): stale.
    let leases: Vec<hookq::store::Lease> = claimed
        .iter()
        .map(|job| {
            let mut lease = job.lease.clone();
            if job.partition == 1 {
                lease.token = format!("{}0", lease.token).into();
            }
            lease
        })
        .collect();
    let outcomes: Vec<Vec<hookq::store::Outcome<'_>>> = claimed
        .iter()
        .zip(&deliveries)
        .zip(&leases)
        .map(|((job, delivery), lease)| vec![(job.id.as_str(), job.attempt, lease, delivery)])
        .collect();
    let groups: Vec<(u16, &[hookq::store::Outcome<'_>])> = claimed
        .iter()
        .zip(&outcomes)
        .map(|(job, o)| (job.partition, o.as_slice()))
        .collect();
    let before = calls(&redis, "fcall").await;
    let recorded = store
        .complete_partitions(&groups, None)
        .await
        .expect("recorded");
    assert_eq!(recorded, [true, false, true]);
    assert_eq!(calls(&redis, "fcall").await - before, 1, "one call");

    let mut conn = redis.conn().await;
    for (p, id) in ids.iter().enumerate() {
        let p = p as u16;
        let record = store.get(id).await.expect("read").expect("known");
        let leased: Option<f64> = redis::cmd("ZSCORE")
            .arg(store.keys().inflight(p))
            .arg(id)
            .query_async(&mut conn)
            .await
            .expect("ZSCORE");
        if p == 1 {
            assert_eq!(
                record.state,
                hookq::job::State::Inflight,
                "stale: unchanged"
            );
            assert!(leased.is_some(), "its lease stays");
        } else {
            assert_eq!(record.state, hookq::job::State::Delivered, "{id}");
            assert_eq!(record.attempts, 1);
            assert!(leased.is_none(), "{id}'s lease left partition {p}'s set");
            let buckets = store.summary_buckets(p).await.expect("buckets");
            assert!(!buckets.is_empty(), "{id}'s summary is in partition {p}");
        }
    }
    let stats = store.stats().await.expect("stats");
    let delivered: Vec<u64> = stats.partitions.iter().map(|s| s.delivered).collect();
    assert_eq!(delivered, [1, 0, 1, 0], "each partition counts its own");
    let ledger = store.tenant_ledger("default").await.expect("ledger");
    assert_eq!(ledger.delivered, 2, "the ledger counts each once");
}
