//! The tenants' ledger and quotas (SPEC §15): the counters add up through
//! deliveries, dead letters, replays, cancels and a kill -9; jobs live
//! before the ledger are seeded once; `max_live_jobs` and `create_rate`
//! refuse creates past them and write nothing; `/v1/tenants` with bound and
//! unbound keys.
//!
//! Jobs of a tenant other than `default` are created through the store
//! with their internal id (`<tenant>/<id>`), as the API does for them.

use std::sync::Arc;
use std::time::Duration;

use hookq::config::Config;
use hookq::store::Store;
use hookq::tenant::{internal_id, TenantEntry};
use serde_json::{json, Value};

use crate::ops::{base_url, spawn_ready};
use crate::support::receiver::{Receiver, Recorded, Reply};
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{get_json, post_json, redis_snapshot, start_daemon, test_config, wait_until_idle};

/// A receiver answering 500 on `/fail` and 200 elsewhere.
async fn receiver() -> Receiver {
    Receiver::start(Arc::new(|r: &Recorded| {
        if r.path.starts_with("/fail") {
            Reply::status(500)
        } else {
            Reply::status(200)
        }
    }))
    .await
}

/// Tenant `name`'s entry of `GET /v1/tenants` on `base`.
async fn tenant_in_list(base: &str, name: &str) -> Value {
    let (status, list) = get_json(&format!("{base}/v1/tenants")).await;
    assert_eq!(status, 200, "{list}");
    list["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .find(|t| t["tenant"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

/// The ledger counts of a tenant view, in a fixed order: created,
/// replayed, delivered, dead_lettered, cancelled, live.
fn counts(view: &Value) -> [u64; 6] {
    [
        "created",
        "replayed",
        "delivered",
        "dead_lettered",
        "cancelled",
        "live",
    ]
    .map(|k| view[k].as_u64().unwrap_or(u64::MAX))
}

/// Waits (60 s at most) until tenant `name`'s counts on `base` are `want`.
async fn wait_counts(base: &str, name: &str, want: [u64; 6]) {
    let what = format!("tenant {name} counts {want:?}");
    let deadline = Duration::from_secs(60);
    let until = tokio::time::Instant::now() + deadline;
    loop {
        let now = counts(&tenant_in_list(base, name).await);
        if now == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{what}: still {now:?} after {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates job `id` of tenant `tenant` straight through the store.
async fn enqueue_in(store: &Store, config: &Config, tenant: &str, input: Value) {
    let input: hookq::job::JobInput = serde_json::from_value(input).expect("job input");
    let job = input.validate(config).expect("valid job");
    let mut new_job = job.new_job(config);
    new_job.id = internal_id(tenant, &new_job.id);
    store.enqueue(&new_job).await.expect("enqueue");
}

async fn delete(url: &str) -> u16 {
    reqwest::Client::new()
        .delete(url)
        .send()
        .await
        .expect("DELETE")
        .status()
        .as_u16()
}

async fn patch_json(url: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .patch(url)
        .json(&body)
        .send()
        .await
        .expect("PATCH");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Two tenants' jobs go through every end a job can have: delivered,
/// dead-lettered (3 attempts on the short ladder), replayed and then
/// delivered, cancelled (once: a second cancel and an identical re-create
/// count nothing). Each tenant's counters add up, `live` ends at 0, and
/// `GET /v1/tenants/{name}` agrees with the list.
#[tokio::test]
async fn the_ledger_adds_up_through_deliveries_dead_letters_replays_and_cancels() {
    let redis = RedisServer::start();
    let rx = receiver().await;
    let config = test_config(&redis);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let store = Store::connect(&config).await.expect("store");

    // default: 5 delivered, 2 dead, 2 cancelled (scheduled an hour ahead);
    // `later-0` twice in one batch is one job.
    let mut jobs: Vec<Value> = (0..5)
        .map(|i| json!({"id": format!("ok-{i}"), "url": rx.url("/ok")}))
        .collect();
    jobs.extend((0..2).map(|i| json!({"id": format!("fail-{i}"), "url": rx.url("/fail")})));
    jobs.extend(
        (0..2).map(|i| json!({"id": format!("later-{i}"), "url": rx.url("/ok"), "delay": "1h"})),
    );
    jobs.push(json!({"id": "later-0", "url": rx.url("/ok"), "delay": "1h"}));
    let (status, answer) =
        post_json(&format!("{base}/v1/jobs/batch"), json!({ "jobs": jobs })).await;
    assert_eq!(status, 200, "{answer}");
    // billing: 3 delivered, 1 dead, 1 cancelled.
    for i in 0..3 {
        enqueue_in(
            &store,
            &config,
            "billing",
            json!({"id": format!("ok-{i}"), "url": rx.url("/ok")}),
        )
        .await;
    }
    enqueue_in(
        &store,
        &config,
        "billing",
        json!({"id": "fail-0", "url": rx.url("/fail")}),
    )
    .await;
    enqueue_in(
        &store,
        &config,
        "billing",
        json!({"id": "later-0", "url": rx.url("/ok"), "delay": "1h"}),
    )
    .await;
    // An identical re-create is no new job.
    let (status, _) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": "later-1", "url": rx.url("/ok"), "delay": "1h"}),
    )
    .await;
    assert_eq!(status, 200);

    wait_counts(&base, "default", [9, 0, 5, 2, 0, 2]).await;
    wait_counts(&base, "billing", [5, 0, 3, 1, 0, 1]).await;

    assert_eq!(delete(&format!("{base}/v1/jobs/later-0")).await, 204);
    assert_eq!(delete(&format!("{base}/v1/jobs/later-1")).await, 204);
    assert_eq!(delete(&format!("{base}/v1/jobs/later-0")).await, 204);
    store
        .cancel(&internal_id("billing", "later-0"))
        .await
        .expect("cancel");
    wait_counts(&base, "default", [9, 0, 5, 2, 2, 0]).await;
    wait_counts(&base, "billing", [5, 0, 3, 1, 1, 0]).await;

    // Every dead letter replayed to a receiver that takes it.
    let (status, answer) = post_json(
        &format!("{base}/v1/dead-letters/replay"),
        json!({"all": true, "url": rx.url("/ok")}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    wait_counts(&base, "default", [9, 2, 7, 2, 2, 0]).await;
    wait_counts(&base, "billing", [5, 1, 4, 1, 1, 0]).await;

    for name in ["default", "billing"] {
        let (status, one) = get_json(&format!("{base}/v1/tenants/{name}")).await;
        assert_eq!(status, 200, "{one}");
        assert_eq!(one, tenant_in_list(&base, name).await);
        assert_eq!(one["weight"], 1);
        assert_eq!(one["max_live_jobs"], 0);
    }
    let (status, stats) = get_json(&format!("{base}/v1/stats?tenant=billing")).await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(counts(&stats), [5, 1, 4, 1, 1, 0]);

    // Attempts and lateness carry the tenant (only this test delivers
    // billing's jobs in this binary).
    let text = crate::metrics_text(&base).await;
    let has = |prefix: &str, parts: &[&str]| {
        text.lines()
            .any(|l| l.starts_with(prefix) && parts.iter().all(|p| l.contains(p)))
    };
    assert!(has(
        "hookq_attempts_total{",
        &["tenant=\"billing\"", "outcome=\"delivered\""]
    ));
    assert!(has(
        "hookq_attempts_total{",
        &["tenant=\"billing\"", "outcome=\"retryable_failure\""]
    ));
    assert!(has(
        "hookq_lateness_seconds_count{",
        &["tenant=\"billing\""]
    ));
    daemon.stop().await.expect("stop");
}

/// A daemon process is killed with SIGKILL while its attempts hang at the
/// receiver; another daemon takes the jobs back after their lease and
/// delivers them. Each job counts once as delivered however many attempts
/// it took, so the ledger still adds up and `live` ends at 0.
#[tokio::test]
async fn the_ledger_adds_up_after_a_kill_9_mid_delivery() {
    let redis = RedisServer::start();
    // The first attempt of each job hangs (the killed daemon's), later
    // ones are answered at once.
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let rx = Receiver::start(Arc::new(move |r: &Recorded| {
        let id = r.header("webhook-id").unwrap_or("").to_string();
        let first = seen.lock().expect("seen").insert(id);
        if first {
            Reply::status(200).with_delay(Duration::from_secs(30))
        } else {
            Reply::status(200)
        }
    }))
    .await;
    let jobs = 20;
    let env = [
        ("HOOKQ_DELIVERY__TIMEOUT", "10s"),
        ("HOOKQ_DELIVERY__LEASE_MARGIN", "300ms"),
    ];
    let (mut victims, ports) = spawn_ready(&redis, 1, &env).await;
    let victim = base_url(ports[0]);
    let batch: Vec<Value> = (0..jobs)
        .map(|i| json!({"id": format!("k-{i}"), "url": rx.url("/")}))
        .collect();
    let (status, answer) =
        post_json(&format!("{victim}/v1/jobs/batch"), json!({ "jobs": batch })).await;
    assert_eq!(status, 200, "{answer}");
    rx.wait_for_count(jobs, Duration::from_secs(30)).await;
    wait_counts(&victim, "default", [jobs as u64, 0, 0, 0, 0, jobs as u64]).await;
    victims[0].kill_9().await;

    // The survivor takes the attempts back once their lease (10.3 s) runs
    // out and delivers them.
    let config = test_config(&redis);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    wait_counts(&base, "default", [jobs as u64, 0, jobs as u64, 0, 0, 0]).await;
    wait_until_idle(&base, Duration::from_secs(30)).await;
    assert_eq!(
        counts(&tenant_in_list(&base, "default").await)[2],
        jobs as u64
    );
    daemon.stop().await.expect("stop");
}

/// Jobs live before the ledger existed (its hash deleted by hand, as a
/// namespace written by an older hookq has none) are counted as
/// `default`'s created at the next start, placement pointers left out,
/// once: a second start counts nothing more. After they are delivered or
/// cancelled the ledger adds up.
#[tokio::test]
async fn jobs_from_before_the_ledger_are_seeded_once() {
    let redis = RedisServer::start();
    let rx = receiver().await;
    let config = test_config(&redis);
    let keys = hookq::store::Keys::new("hookq", config.redis.partitions);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    // Three ordered jobs whose ids live in another partition than their
    // ordering key's: each leaves a pointer in its id's partition.
    let home = keys.order_partition("default:k");
    let ordered: Vec<String> = (0..)
        .map(|i| format!("o-{i}"))
        .filter(|id| keys.partition_of(id) != home)
        .take(3)
        .collect();
    for id in &ordered {
        let (status, answer) = post_json(
            &format!("{base}/v1/jobs"),
            json!({"id": id, "url": rx.url("/ok"), "delay": "1h", "ordering_key": "k"}),
        )
        .await;
        assert_eq!(status, 201, "{answer}");
    }
    for i in 0..4 {
        let (status, answer) = post_json(
            &format!("{base}/v1/jobs"),
            json!({"id": format!("j-{i}"), "url": rx.url("/ok"), "delay": "1h"}),
        )
        .await;
        assert_eq!(status, 201, "{answer}");
    }
    daemon.stop().await.expect("stop");

    let mut conn = redis.conn().await;
    let mut pointers = 0;
    for p in 0..config.redis.partitions {
        let n: u64 = redis::cmd("ZCARD")
            .arg(keys.placed(p))
            .query_async(&mut conn)
            .await
            .expect("ZCARD");
        pointers += n;
        let _: () = redis::cmd("DEL")
            .arg(keys.ledger(p))
            .query_async(&mut conn)
            .await
            .expect("DEL");
    }
    assert_eq!(pointers, 3, "each ordered job left a pointer");

    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    assert_eq!(
        counts(&tenant_in_list(&base, "default").await),
        [7, 0, 0, 0, 0, 7]
    );
    daemon.stop().await.expect("stop");
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    assert_eq!(
        counts(&tenant_in_list(&base, "default").await),
        [7, 0, 0, 0, 0, 7]
    );

    for i in 0..4 {
        let (status, answer) =
            patch_json(&format!("{base}/v1/jobs/j-{i}"), json!({"delay": "0s"})).await;
        assert_eq!(status, 200, "{answer}");
    }
    for id in &ordered {
        assert_eq!(delete(&format!("{base}/v1/jobs/{id}")).await, 204);
    }
    wait_counts(&base, "default", [7, 0, 4, 0, 3, 0]).await;
    daemon.stop().await.expect("stop");
}

/// A config whose `default` tenant has `max_live_jobs` (and `create_rate`).
fn quota_config(redis: &RedisServer, max_live_jobs: u64, create_rate: f64) -> Config {
    let mut config = test_config(redis);
    config.tenants = vec![TenantEntry {
        name: "default".into(),
        weight: None,
        max_live_jobs: Some(max_live_jobs),
        create_rate: Some(create_rate),
    }];
    config.validate().expect("valid config");
    config
}

/// With `max_live_jobs = 5`, the 6th live job is refused 429
/// `quota_exceeded` naming `tenant` and writes nothing; a batch is decided
/// item-wise (the items that fit are created, the others refused); once
/// jobs are delivered there is room again.
#[tokio::test]
async fn max_live_jobs_refuses_past_the_quota_and_writes_nothing() {
    let redis = RedisServer::start();
    let rx = receiver().await;
    let config = quota_config(&redis, 5, 0.0);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let job = |id: &str| json!({"id": id, "url": rx.url("/ok"), "delay": "1h"});
    for i in 0..5 {
        let (status, answer) = post_json(&format!("{base}/v1/jobs"), job(&format!("q-{i}"))).await;
        assert_eq!(status, 201, "{answer}");
    }
    let before = redis_snapshot(&redis).await;
    let (status, answer) = post_json(&format!("{base}/v1/jobs"), job("q-5")).await;
    assert_eq!(status, 429, "{answer}");
    assert_eq!(answer["error"]["code"], "quota_exceeded");
    assert_eq!(answer["error"]["field"], "tenant");
    assert_eq!(
        redis_snapshot(&redis).await,
        before,
        "a refused create wrote nothing"
    );
    assert_eq!(get_json(&format!("{base}/v1/jobs/q-5")).await.0, 404);
    // At the limit, a create of a job that exists writes nothing new: it
    // answers as always (200 identical, 409 other content), alone or in a
    // batch.
    let (status, answer) = post_json(&format!("{base}/v1/jobs"), job("q-4")).await;
    assert_eq!(status, 200, "an identical re-create at the quota: {answer}");
    let other = json!({"id": "q-4", "url": rx.url("/other"), "delay": "1h"});
    let (status, answer) = post_json(&format!("{base}/v1/jobs"), other).await;
    assert_eq!(status, 409, "{answer}");
    let (status, answer) = post_json(
        &format!("{base}/v1/jobs/batch"),
        json!({"jobs": [job("q-3"), job("q-6")]}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["results"][0]["status"], 200, "{answer}");
    assert_eq!(answer["results"][1]["status"], 429, "{answer}");
    assert_eq!(answer["results"][1]["id"], "q-6", "{answer}");
    assert_eq!(
        redis_snapshot(&redis).await,
        before,
        "re-creates at the quota wrote nothing"
    );

    // Two delivered: room for two of a batch of three.
    for i in 0..2 {
        let (status, answer) =
            patch_json(&format!("{base}/v1/jobs/q-{i}"), json!({"delay": "0s"})).await;
        assert_eq!(status, 200, "{answer}");
    }
    wait_counts(&base, "default", [5, 0, 2, 0, 0, 3]).await;
    let batch = json!({"jobs": [job("b-0"), job("b-1"), job("b-2")]});
    let (status, answer) = post_json(&format!("{base}/v1/jobs/batch"), batch).await;
    assert_eq!(status, 200, "{answer}");
    let statuses: Vec<u64> = answer["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["status"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(statuses, [201, 201, 429], "{answer}");
    assert_eq!(answer["results"][2]["error"]["code"], "quota_exceeded");
    assert_eq!(get_json(&format!("{base}/v1/jobs/b-2")).await.0, 404);
    assert_eq!(
        counts(&tenant_in_list(&base, "default").await),
        [7, 0, 2, 0, 0, 5]
    );
    daemon.stop().await.expect("stop");
}

/// Redis's clock in whole seconds: the window of a create rate of 1/s or
/// more (see `src/api/quota.rs`).
async fn redis_second(redis: &RedisServer) -> i64 {
    let (seconds, _): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut redis.conn().await)
        .await
        .expect("TIME");
    seconds
}

/// Waits for the next rate window to begin (a whole budget, untouched by
/// earlier creates) and answers it.
async fn fresh_window(redis: &RedisServer) -> i64 {
    let start = redis_second(redis).await;
    wait_until("the next rate window", Duration::from_secs(10), || async {
        redis_second(redis).await > start
    })
    .await;
    redis_second(redis).await
}

/// With `create_rate = 2` (a budget of 2 creates per 1 s window, shared by
/// every daemon), a burst within one window gets 2 creates through and
/// the others 429 `rate_limited` with `Retry-After: 1` (the window's rest,
/// rounded up), writing nothing; a second daemon in the same window is
/// refused too; a batch is decided item-wise and its answer carries
/// `Retry-After`. A round whose requests straddled two windows (Redis's
/// clock read before and after) proves nothing and is run again.
#[tokio::test]
async fn create_rate_is_shared_by_every_daemon() {
    let redis = RedisServer::start();
    let rx = receiver().await;
    let config = quota_config(&redis, 0, 2.0);
    let a = start_daemon(&config).await;
    let b = start_daemon(&config).await;
    let job = |id: String| json!({"id": id, "url": rx.url("/ok"), "delay": "1h"});
    let client = reqwest::Client::new();
    let create = |base: String, id: String| {
        let request = client.post(format!("{base}/v1/jobs")).json(&job(id));
        async move { request.send().await.expect("POST") }
    };

    let mut proved = false;
    for round in 0..20 {
        let window = fresh_window(&redis).await;
        let mut answers = Vec::new();
        for i in 0..5 {
            let id = format!("r-{round}-{i}");
            answers.push((id.clone(), create(a.url(), id).await));
        }
        let on_b = create(b.url(), format!("r-{round}-b"))
            .await
            .status()
            .as_u16();
        if redis_second(&redis).await != window {
            continue;
        }
        let mut created = 0;
        for (id, response) in answers {
            if response.status().as_u16() == 201 {
                created += 1;
                continue;
            }
            assert_eq!(response.status().as_u16(), 429);
            let retry = response.headers().get("retry-after").cloned();
            assert_eq!(retry.as_ref().and_then(|v| v.to_str().ok()), Some("1"));
            let body: Value = response.json().await.expect("json");
            assert_eq!(body["error"]["code"], "rate_limited", "{body}");
            assert_eq!(body["error"]["field"], "tenant");
            assert_eq!(get_json(&format!("{}/v1/jobs/{id}", a.url())).await.0, 404);
        }
        assert_eq!(created, 2, "round {round}: the window's budget, no more");
        assert_eq!(
            on_b, 429,
            "round {round}: the other daemon shares the budget"
        );
        proved = true;
        break;
    }
    assert!(proved, "no round fell within one rate window in 20");

    let mut proved = false;
    for round in 0..20 {
        let window = fresh_window(&redis).await;
        let batch: Vec<Value> = (0..5).map(|i| job(format!("batch-{round}-{i}"))).collect();
        let response = client
            .post(format!("{}/v1/jobs/batch", b.url()))
            .json(&json!({ "jobs": batch }))
            .send()
            .await
            .expect("POST");
        if redis_second(&redis).await != window {
            continue;
        }
        assert_eq!(response.status().as_u16(), 200);
        let retry = response.headers().get("retry-after").cloned();
        let answer: Value = response.json().await.expect("json");
        let statuses: Vec<u64> = answer["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(|r| r["status"].as_u64().unwrap_or(0))
            .collect();
        assert_eq!(statuses, [201, 201, 429, 429, 429], "{answer}");
        assert_eq!(answer["results"][4]["error"]["code"], "rate_limited");
        assert!(
            retry.is_some(),
            "a batch with rate-limited items says Retry-After"
        );
        proved = true;
        break;
    }
    assert!(proved, "no batch fell within one rate window in 20 rounds");
    a.stop().await.expect("stop");
    b.stop().await.expect("stop");
}

/// The SHA-256 of `token` in hex, as `[[api.keys]] token_sha256` holds it.
fn sha256_hex(token: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `GET /v1/tenants` and `/v1/tenants/{name}` with keys: a key bound to a
/// tenant sees only its own (another name is 404, as an unknown one; its
/// list holds only itself); an unbound key sees every tenant, those of
/// `[[tenants]]` with zero counts included; a bad name is 400
/// `invalid_tenant`.
#[tokio::test]
async fn tenants_routes_show_a_bound_key_only_its_own() {
    let redis = RedisServer::start();
    let rx = receiver().await;
    let mut config = test_config(&redis);
    let key = |name: &str, token: &str, tenant: Option<&str>| hookq::config::ApiKey {
        name: name.into(),
        token_sha256: sha256_hex(token),
        scopes: vec![hookq::config::Scope::Read, hookq::config::Scope::Write],
        tenant: tenant.map(str::to_string),
    };
    config.api.keys = vec![
        key("billing-key", "billing-token-123456", Some("billing")),
        key("ops", "ops-token-1234567890", None),
    ];
    config.tenants = vec![TenantEntry {
        name: "orders".into(),
        weight: Some(3),
        max_live_jobs: None,
        create_rate: None,
    }];
    config.validate().expect("valid config");
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let store = Store::connect(&config).await.expect("store");
    enqueue_in(
        &store,
        &config,
        "billing",
        json!({"id": "a", "url": rx.url("/ok"), "delay": "1h"}),
    )
    .await;
    enqueue_in(
        &store,
        &config,
        "default",
        json!({"id": "a", "url": rx.url("/ok"), "delay": "1h"}),
    )
    .await;

    let get = |path: &str, token: &str| {
        let url = format!("{base}{path}");
        let token = token.to_string();
        async move { crate::get_json_with(&url, &token).await }
    };
    let (status, list) = get("/v1/tenants", "ops-token-1234567890").await;
    assert_eq!(status, 200, "{list}");
    let names: Vec<&str> = list["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .filter_map(|t| t["tenant"].as_str())
        .collect();
    assert_eq!(names, ["billing", "default", "orders"]);
    let (status, orders) = get("/v1/tenants/orders", "ops-token-1234567890").await;
    assert_eq!(status, 200, "{orders}");
    assert_eq!(
        (orders["weight"].as_u64(), counts(&orders)),
        (Some(3), [0; 6])
    );
    assert_eq!(
        get("/v1/tenants/nobody", "ops-token-1234567890").await.0,
        404
    );
    let (status, bad) = get("/v1/tenants/Bad_Name", "ops-token-1234567890").await;
    assert_eq!(
        (status, &bad["error"]["code"]),
        (400, &json!("invalid_tenant"))
    );

    let (status, list) = get("/v1/tenants", "billing-token-123456").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["tenants"].as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(counts(&list["tenants"][0]), [1, 0, 0, 0, 0, 1]);
    assert_eq!(list["tenants"][0]["tenant"], "billing");
    let (status, own) = get("/v1/tenants/billing", "billing-token-123456").await;
    assert_eq!((status, counts(&own)), (200, [1, 0, 0, 0, 0, 1]));
    let (status, other) = get("/v1/tenants/default", "billing-token-123456").await;
    assert_eq!(
        (status, &other["error"]["code"]),
        (404, &json!("not_found"))
    );
    assert_eq!(
        get("/v1/tenants/nobody", "billing-token-123456").await.0,
        404
    );
    // Stats: a bound key gets its own tenant's ledger, another's is 404.
    let (status, stats) = get("/v1/stats", "billing-token-123456").await;
    assert_eq!((status, stats["tenant"].as_str()), (200, Some("billing")));
    assert_eq!(
        get("/v1/stats?tenant=default", "billing-token-123456")
            .await
            .0,
        404
    );
    daemon.stop().await.expect("stop");
}

/// A schedule's fired jobs count as created in the ledger (once each,
/// counted by `fire_schedules`), and as delivered: after the schedule is
/// deleted and its jobs are delivered, created = delivered = the fires the
/// receiver saw, and `live` is 0.
#[tokio::test]
async fn fired_jobs_count_as_created() {
    let redis = RedisServer::start();
    let rx = receiver().await;
    let config = test_config(&redis);
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let (status, answer) = post_json(
        &format!("{base}/v1/schedules"),
        json!({"id": "tick", "every": "1s", "job": {"url": rx.url("/tick")}}),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    rx.wait_for_count(2, Duration::from_secs(30)).await;
    assert_eq!(delete(&format!("{base}/v1/schedules/tick")).await, 204);
    wait_until_idle(&base, Duration::from_secs(30)).await;
    let fired = rx.count() as u64;
    wait_counts(&base, "default", [fired, 0, fired, 0, 0, 0]).await;
    daemon.stop().await.expect("stop");
}

/// `hookq tenants` and `hookq stats --tenant NAME` read the ledger from
/// Redis: jobs created and cancelled with the CLI are counted, in JSON and
/// in the table; jobs from before the ledger (its hashes deleted) are
/// seeded by the CLI before it changes any, as a daemon does at start; a
/// bad name is refused naming `--tenant`.
#[tokio::test]
async fn cli_shows_the_ledger() {
    use crate::ops::hookq;
    let redis = RedisServer::start();
    let ns = "cli-ledger";
    for id in ["c-1", "c-2", "c-3"] {
        let out = hookq(
            &redis,
            ns,
            &[
                "enqueue",
                "--url",
                "http://127.0.0.1:9/x",
                "--id",
                id,
                "--delay",
                "1h",
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut conn = redis.conn().await;
    for p in 0..4 {
        let _: () = redis::cmd("DEL")
            .arg(hookq::store::Keys::new(ns, 4).ledger(p))
            .query_async(&mut conn)
            .await
            .expect("DEL");
    }
    assert!(hookq(&redis, ns, &["cancel", "c-1"]).status.success());
    let out = hookq(
        &redis,
        ns,
        &[
            "enqueue",
            "--url",
            "http://127.0.0.1:9/x",
            "--id",
            "c-4",
            "--delay",
            "1h",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = |args: &[&str]| {
        let out = hookq(&redis, ns, args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).expect("JSON")
    };
    let list = json(&["--json", "tenants"]);
    assert_eq!(list["tenants"].as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(counts(&list["tenants"][0]), [4, 0, 0, 0, 1, 3]);
    let one = json(&["--json", "stats", "--tenant", "default"]);
    assert_eq!(
        (one["tenant"].as_str(), counts(&one)),
        (Some("default"), [4, 0, 0, 0, 1, 3])
    );
    let out = hookq(&redis, ns, &["tenants"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let row: Vec<&str> = text
        .lines()
        .find(|l| l.starts_with("default"))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    assert_eq!(
        row,
        ["default", "1", "0", "0.0", "4", "0", "0", "0", "1", "3"],
        "{text}"
    );
    let out = hookq(&redis, ns, &["stats", "--tenant", "Bad"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tenant"));
}

/// On a Redis Cluster the ledger's partitions live on different masters:
/// two tenants' jobs spread over 16 partitions are counted where they
/// change and summed on read, and add up once delivered.
#[tokio::test]
async fn the_ledger_adds_up_on_a_cluster() {
    let cluster = crate::support::cluster::RedisCluster::start();
    let rx = receiver().await;
    let mut config = test_config(&cluster.nodes[0]);
    config.redis.partitions = 16;
    config.redis.cluster_nodes = cluster.seeds();
    config.validate().expect("valid cluster config");
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let store = Store::connect(&config).await.expect("store");
    let jobs: Vec<Value> = (0..40)
        .map(|i| json!({"id": format!("c-{i}"), "url": rx.url("/ok")}))
        .collect();
    let (status, answer) =
        post_json(&format!("{base}/v1/jobs/batch"), json!({ "jobs": jobs })).await;
    assert_eq!(status, 200, "{answer}");
    for i in 0..20 {
        enqueue_in(
            &store,
            &config,
            "billing",
            json!({"id": format!("c-{i}"), "url": rx.url("/ok")}),
        )
        .await;
    }
    wait_counts(&base, "default", [40, 0, 40, 0, 0, 0]).await;
    wait_counts(&base, "billing", [20, 0, 20, 0, 0, 0]).await;
    daemon.stop().await.expect("stop");
}
