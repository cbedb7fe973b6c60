//! Tenants, identity and isolation (SPEC §15): two tenants may use one id
//! and each gets its own job, view and `webhook-id`; a key bound to a
//! tenant sees and changes nothing of another's (404 as for an unknown id,
//! 403 naming `tenant` when it names another); ordering keys are lines per
//! tenant; the CLI's `--tenant`.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::support::receiver::{Receiver, Reply};
use crate::support::redis::RedisServer;
use crate::{get_json, post_created, post_json, start_daemon, test_config, wait_state};

/// Sends `method` to `url` with bearer `token` (none: no header) and
/// `body`; the status and the JSON answer (Null when there is none).
async fn call(method: Method, url: &str, token: Option<&str>, body: Option<Value>) -> (u16, Value) {
    let (status, answer, _) = crate::security::call(method, url, token, body).await;
    (status, answer)
}

/// A receiver answering 410 (dead at once) on `/gone` and 200 elsewhere.
async fn gone_or_ok() -> Receiver {
    Receiver::start(std::sync::Arc::new(
        |r: &crate::support::receiver::Recorded| {
            if r.path == "/gone" {
                Reply::status(410)
            } else {
                Reply::status(200)
            }
        },
    ))
    .await
}

/// Two tenants create the same id: both 201, each its own job, delivered
/// with its own body; `webhook-id` is the id in `default` and
/// `<tenant>/<id>` in `billing`; each tenant reads its own job back
/// (`?tenant=`), re-creates are idempotent and conflicts are per tenant,
/// and the listing filters by tenant.
#[tokio::test]
async fn two_tenants_share_an_id_each_with_its_own_job() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let jobs = format!("{base}/v1/jobs");
    let job = |tenant: Option<&str>, who: &str| {
        let mut job = json!({"id": "order-42", "url": receiver.url("/hook"), "body": {"who": who}});
        if let Some(tenant) = tenant {
            job["tenant"] = json!(tenant);
        }
        job
    };
    let default = post_created(&jobs, job(None, "default")).await;
    assert_eq!(
        (&default["id"], &default["tenant"]),
        (&json!("order-42"), &json!("default"))
    );
    let billing = post_created(&jobs, job(Some("billing"), "billing")).await;
    assert_eq!(
        (&billing["id"], &billing["tenant"]),
        (&json!("order-42"), &json!("billing"))
    );

    let requests = receiver.wait_for_count(2, Duration::from_secs(15)).await;
    let mut seen: Vec<(String, Value)> = requests
        .iter()
        .map(|r| {
            (
                r.header("webhook-id").expect("webhook-id").to_string(),
                r.json(),
            )
        })
        .collect();
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        seen,
        vec![
            ("billing/order-42".to_string(), json!({"who": "billing"})),
            ("order-42".to_string(), json!({"who": "default"})),
        ]
    );

    for (query, who) in [
        ("", "default"),
        ("?tenant=default", "default"),
        ("?tenant=billing", "billing"),
    ] {
        let view = wait_state(&base, &format!("order-42{query}"), "delivered").await;
        assert_eq!(view["id"], "order-42", "{query}: {view}");
        assert_eq!(view["tenant"], who, "{query}: {view}");
        let (_, delivered) = get_json(&format!("{jobs}/order-42{query}")).await;
        assert_eq!(
            delivered["history"][0]["status"], 200,
            "{query}: {delivered}"
        );
    }
    let (status, _) = get_json(&format!("{jobs}/order-42?tenant=orders")).await;
    assert_eq!(status, 404, "a third tenant has no such job");

    // Identity is per tenant: an identical re-create is 200 in its tenant,
    // another body 409 there, whatever the other tenant holds.
    let (status, again) = post_json(&jobs, job(Some("billing"), "billing")).await;
    assert_eq!(
        (status, &again["tenant"]),
        (200, &json!("billing")),
        "{again}"
    );
    let (status, conflict) = post_json(&jobs, job(Some("billing"), "default")).await;
    assert_eq!(status, 409, "{conflict}");
    assert!(
        !conflict["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains('/'),
        "errors name the id as the tenant knows it: {conflict}"
    );

    // A batch item names its tenant too.
    let (status, batch) = post_json(
        &format!("{jobs}/batch"),
        json!({"jobs": [{"id": "b-1", "tenant": "orders", "url": receiver.url("/hook"), "delay": "1h"}]}),
    )
    .await;
    assert_eq!(status, 200, "{batch}");
    assert_eq!(batch["results"][0]["status"], 201, "{batch}");
    assert_eq!(batch["results"][0]["id"], "b-1", "{batch}");
    assert_eq!(batch["results"][0]["job"]["tenant"], "orders", "{batch}");

    // Lists: every tenant without `tenant`, one tenant's with it.
    let listed = |query: &'static str| {
        let jobs = jobs.clone();
        async move {
            let (status, page) = get_json(&format!("{jobs}{query}")).await;
            assert_eq!(status, 200, "{query}: {page}");
            let mut items: Vec<(String, String)> = page["jobs"]
                .as_array()
                .expect("jobs")
                .iter()
                .map(|j| {
                    (
                        j["tenant"].as_str().expect("tenant").into(),
                        j["id"].as_str().expect("id").into(),
                    )
                })
                .collect();
            items.sort();
            items
        }
    };
    let pair = |t: &str, id: &str| (t.to_string(), id.to_string());
    assert_eq!(
        listed("").await,
        vec![
            pair("billing", "order-42"),
            pair("default", "order-42"),
            pair("orders", "b-1")
        ]
    );
    assert_eq!(
        listed("?tenant=billing").await,
        vec![pair("billing", "order-42")]
    );
    assert_eq!(
        listed("?tenant=default&state=delivered").await,
        vec![pair("default", "order-42")]
    );
    let (status, bad) = get_json(&format!("{jobs}?tenant=Not_A_Tenant")).await;
    assert_eq!(status, 400, "{bad}");
    assert_eq!(
        (&bad["error"]["code"], &bad["error"]["field"]),
        (&json!("invalid_tenant"), &json!("tenant"))
    );
    let (status, bad) = post_json(&jobs, job(Some("-bad"), "x")).await;
    assert_eq!(status, 400, "{bad}");
    assert_eq!(
        (&bad["error"]["code"], &bad["error"]["field"]),
        (&json!("invalid_tenant"), &json!("tenant"))
    );
}

/// The views of tenant `beta`'s job, schedule and dead letter, read with
/// the unbound `token`: what a bound key of another tenant must not change.
async fn beta_views(base: &str, token: &str) -> (Value, Value, Value) {
    let read = |path: String| async move {
        let (status, view) = call(Method::GET, &format!("{base}{path}"), Some(token), None).await;
        assert_eq!(status, 200, "{path}: {view}");
        view
    };
    let job = read("/v1/jobs/b-job?tenant=beta".into()).await;
    let mut schedule = read("/v1/schedules/b-sched?tenant=beta".into()).await;
    // Computed from the clock at each read.
    schedule["next_runs"] = Value::Null;
    let dead = read("/v1/dead-letters/b-dead?tenant=beta".into()).await;
    (job, schedule, dead)
}

/// A key bound to tenant `alpha` against tenant `beta`'s job, schedule and
/// dead letter, on every route: reads, changes and deletes answer 404 (its
/// ids name `alpha`'s), lists and replays of `all` leave them out, naming
/// `beta` answers 403 naming `tenant`, and afterwards an unbound key reads
/// all three unchanged. `whoami` shows the key's tenant; hosts, shared by
/// every tenant, are not the bound key's to pause.
#[tokio::test]
async fn a_bound_key_sees_and_changes_only_its_own_tenant() {
    let redis = RedisServer::start();
    let receiver = gone_or_ok().await;
    let (alpha, mut alpha_key) = crate::security::new_key(&redis, "alpha-app", "read,write,admin");
    alpha_key.tenant = Some("alpha".into());
    let (ops, ops_key) = crate::security::new_key(&redis, "ops", "read,write,admin");
    let mut config = test_config(&redis);
    config.api.keys = vec![alpha_key, ops_key];
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let url = |path: &str| format!("{base}{path}");
    let (a, o) = (Some(alpha.as_str()), Some(ops.as_str()));

    // Beta's job (waiting), schedule (paused) and dead letter, by the
    // unbound key; alpha's own job of the same id as beta's.
    let later = json!({"id": "b-job", "tenant": "beta", "url": receiver.url("/ok"), "delay": "1h"});
    assert_eq!(
        call(Method::POST, &url("/v1/jobs"), o, Some(later)).await.0,
        201
    );
    let schedule = json!({"id": "b-sched", "tenant": "beta", "every": "1h", "paused": true,
        "job": {"url": receiver.url("/ok")}});
    let (status, made) = call(Method::POST, &url("/v1/schedules"), o, Some(schedule)).await;
    assert_eq!(
        (status, &made["tenant"], &made["id"]),
        (201, &json!("beta"), &json!("b-sched")),
        "{made}"
    );
    let dying = json!({"id": "b-dead", "tenant": "beta", "url": receiver.url("/gone")});
    assert_eq!(
        call(Method::POST, &url("/v1/jobs"), o, Some(dying)).await.0,
        201
    );
    crate::support::wait_until(
        "beta's dead letter is listed",
        Duration::from_secs(15),
        || async {
            let (_, page) = call(Method::GET, &url("/v1/dead-letters?tenant=beta"), o, None).await;
            page["dead_letters"]
                .as_array()
                .is_some_and(|d| d.len() == 1)
        },
    )
    .await;
    let mine = json!({"id": "a-job", "url": receiver.url("/ok"), "delay": "1h"});
    let (status, own) = call(Method::POST, &url("/v1/jobs"), a, Some(mine)).await;
    assert_eq!((status, &own["tenant"]), (201, &json!("alpha")), "{own}");
    let before = beta_views(&base, &ops).await;
    assert_eq!(before.2["tenant"], "beta", "{}", before.2);
    assert_eq!(before.2["id"], "b-dead", "{}", before.2);

    let not_found = |status: u16, answer: &Value, what: &str| {
        assert_eq!(status, 404, "{what}: {answer}");
        assert_eq!(answer["error"]["code"], "not_found", "{what}");
    };
    let forbidden = |status: u16, answer: &Value, what: &str| {
        assert_eq!(status, 403, "{what}: {answer}");
        assert_eq!(answer["error"]["code"], "forbidden", "{what}");
        assert_eq!(answer["error"]["field"], "tenant", "{what}");
    };
    // By id: beta's ids are unknown ids to alpha's key.
    for (method, path, body) in [
        (Method::GET, "/v1/jobs/b-job", None),
        (
            Method::PATCH,
            "/v1/jobs/b-job",
            Some(json!({"delay": "2h"})),
        ),
        (Method::DELETE, "/v1/jobs/b-job", None),
        (Method::GET, "/v1/schedules/b-sched", None),
        (
            Method::PATCH,
            "/v1/schedules/b-sched",
            Some(json!({"every": "2h"})),
        ),
        (Method::POST, "/v1/schedules/b-sched/pause", None),
        (Method::POST, "/v1/schedules/b-sched/resume", None),
        (Method::DELETE, "/v1/schedules/b-sched", None),
        (Method::GET, "/v1/dead-letters/b-dead", None),
        (Method::DELETE, "/v1/dead-letters/b-dead", None),
    ] {
        let (status, answer) = call(method.clone(), &url(path), a, body.clone()).await;
        not_found(status, &answer, &format!("{method} {path}"));
        let named = format!("{path}?tenant=beta");
        let (status, answer) = call(method.clone(), &url(&named), a, body).await;
        forbidden(status, &answer, &format!("{method} {named}"));
    }
    // Naming beta in a body or a listing's parameter.
    let (status, answer) = call(
        Method::POST,
        &url("/v1/jobs"),
        a,
        Some(json!({"tenant": "beta", "url": receiver.url("/ok")})),
    )
    .await;
    forbidden(status, &answer, "create in beta");
    let (status, answer) = call(
        Method::POST,
        &url("/v1/jobs/batch"),
        a,
        Some(json!({"jobs": [{"tenant": "beta", "url": receiver.url("/ok")}]})),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["results"][0]["status"], 403, "{answer}");
    assert_eq!(answer["results"][0]["error"]["field"], "tenant", "{answer}");
    let (status, answer) = call(
        Method::POST,
        &url("/v1/schedules"),
        a,
        Some(json!({"tenant": "beta", "every": "1h", "job": {"url": receiver.url("/ok")}})),
    )
    .await;
    forbidden(status, &answer, "schedule in beta");
    for path in [
        "/v1/jobs?tenant=beta",
        "/v1/schedules?tenant=beta",
        "/v1/dead-letters?tenant=beta",
    ] {
        let (status, answer) = call(Method::GET, &url(path), a, None).await;
        forbidden(status, &answer, path);
    }
    let (status, answer) = call(
        Method::POST,
        &url("/v1/dead-letters/replay"),
        a,
        Some(json!({"tenant": "beta", "all": true})),
    )
    .await;
    forbidden(status, &answer, "replay beta's");
    // Lists and replays show and touch alpha's alone.
    for (path, field) in [
        ("/v1/jobs", "jobs"),
        ("/v1/schedules", "schedules"),
        ("/v1/dead-letters", "dead_letters"),
    ] {
        let (status, page) = call(Method::GET, &url(path), a, None).await;
        assert_eq!(status, 200, "{path}: {page}");
        let items = page[field].as_array().expect("items");
        assert!(
            items.iter().all(|i| i["tenant"] == "alpha"),
            "{path}: {page}"
        );
        if field == "jobs" {
            assert_eq!(items.len(), 1, "alpha's own job is listed: {page}");
        }
    }
    for replay in [json!({"ids": ["b-dead"]}), json!({"all": true})] {
        let (status, report) = call(
            Method::POST,
            &url("/v1/dead-letters/replay"),
            a,
            Some(replay.clone()),
        )
        .await;
        assert_eq!(status, 200, "{replay}: {report}");
        assert_eq!(report["replayed"], json!([]), "{replay}: {report}");
    }
    // Who the key is; hosts are shared.
    let (_, me) = call(Method::GET, &url("/v1/whoami"), a, None).await;
    assert_eq!(me["tenant"], "alpha", "{me}");
    let (_, them) = call(Method::GET, &url("/v1/whoami"), o, None).await;
    assert_eq!(them["tenant"], Value::Null, "{them}");
    assert_eq!(call(Method::GET, &url("/v1/hosts"), a, None).await.0, 200);
    let (status, answer) = call(Method::POST, &url("/v1/hosts/example.com/pause"), a, None).await;
    forbidden(status, &answer, "pause a host");

    assert_eq!(beta_views(&base, &ops).await, before, "beta's data changed");
    // The unbound key replays beta's dead letter by its id within beta.
    let (status, report) = call(
        Method::POST,
        &url("/v1/dead-letters/replay"),
        o,
        Some(json!({"tenant": "beta", "ids": ["b-dead"], "dry_run": true})),
    )
    .await;
    assert_eq!(
        (status, &report["replayed"]),
        (200, &json!(["b-dead"])),
        "{report}"
    );
    // The unbound key lists every tenant's.
    let (_, page) = call(Method::GET, &url("/v1/jobs"), o, None).await;
    let mut tenants: Vec<&str> = page["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["tenant"].as_str().expect("tenant"))
        .collect();
    tenants.sort();
    tenants.dedup();
    assert_eq!(tenants, ["alpha", "beta"], "{page}");
    // And changes beta's, naming it.
    let (status, changed) = call(
        Method::PATCH,
        &url("/v1/jobs/b-job?tenant=beta"),
        o,
        Some(json!({"delay": "2h"})),
    )
    .await;
    assert_eq!(
        (status, &changed["tenant"], &changed["id"]),
        (200, &json!("beta"), &json!("b-job")),
        "{changed}"
    );
    let (status, changed) = call(
        Method::PATCH,
        &url("/v1/schedules/b-sched?tenant=beta"),
        o,
        Some(json!({"every": "2h"})),
    )
    .await;
    assert_eq!(
        (status, &changed["tenant"], &changed["every"]),
        (200, &json!("beta"), &json!("2h")),
        "{changed}"
    );
    for path in [
        "/v1/jobs/b-job?tenant=beta",
        "/v1/schedules/b-sched?tenant=beta",
        "/v1/dead-letters/b-dead?tenant=beta",
    ] {
        let (status, answer) = call(Method::DELETE, &url(path), o, None).await;
        assert_eq!(status, 204, "{path}: {answer}");
    }
}

/// The prelude's `spec_order` (with `order_line`) and the store's
/// `tenant::order_line` name the same line for the same job: the Rust side
/// reads (and places) what the scripts write.
#[tokio::test]
async fn the_scripts_and_the_store_name_one_line() {
    let redis = RedisServer::start();
    let mut conn = redis.conn().await;
    let source = format!(
        "local IN_CLUSTER = false\nlocal WHEEL_BUCKET = 65536\n{}\nreturn spec_order(ARGV[2], ARGV[1]) or ''",
        include_str!("../../lua/prelude.lua")
    );
    for (id, spec, topic) in [
        (
            "order-42",
            r#"{"url":"http://a/","ordering_key":"k-1"}"#,
            "default",
        ),
        (
            "billing/order-42",
            r#"{"url":"http://a/","ordering_key":"k-1"}"#,
            "default",
        ),
        (
            "billing/s:1767225600000",
            r#"{"topic":"pay","url":"http://a/","ordering_key":"a:b"}"#,
            "pay",
        ),
    ] {
        let line: String = redis::Script::new(&source)
            .arg(id)
            .arg(spec)
            .invoke_async(&mut conn)
            .await
            .expect("spec_order");
        let key = serde_json::from_str::<Value>(spec).expect("spec")["ordering_key"]
            .as_str()
            .expect("key")
            .to_string();
        let order = format!("{topic}:{key}");
        assert_eq!(line, hookq::tenant::order_line(id, &order), "{id}");
    }
}

/// Ordering keys are per tenant: the same topic and key in `alpha`,
/// `beta` and `default` are three lines. Alpha's head waits an hour and
/// holds alpha's line alone; beta's jobs go in their own order (the second
/// released when the first is delivered, a third when the one ahead of it
/// dies); cancelling alpha's head releases alpha's next.
#[tokio::test]
async fn ordering_keys_are_lines_per_tenant() {
    let redis = RedisServer::start();
    let receiver = gone_or_ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let jobs = format!("{base}/v1/jobs");
    let job = |tenant: &str, id: &str, path: &str| json!({"id": id, "tenant": tenant, "topic": "pay", "ordering_key": "cust-7", "url": receiver.url(path)});
    let mut head = job("alpha", "a-1", "/ok");
    head["delay"] = json!("1h");
    post_created(&jobs, head).await;
    let held = post_created(&jobs, job("alpha", "a-2", "/ok")).await;
    assert_eq!(held["waiting_for"], "a-1", "{held}");
    for (tenant, id, path) in [
        ("beta", "b-1", "/ok"),
        ("beta", "b-2", "/gone"),
        ("beta", "b-3", "/ok"),
        ("default", "d-1", "/ok"),
    ] {
        let made = post_created(&jobs, job(tenant, id, path)).await;
        if id == "b-1" || id == "d-1" {
            assert_eq!(
                made["waiting_for"],
                Value::Null,
                "{tenant} {id} heads its own line: {made}"
            );
        }
    }
    for (query, state) in [
        ("b-1?tenant=beta", "delivered"),
        ("b-2?tenant=beta", "dead"),
        ("b-3?tenant=beta", "delivered"),
        ("d-1", "delivered"),
    ] {
        wait_state(&base, query, state).await;
    }
    let (_, a2) = get_json(&format!("{jobs}/a-2?tenant=alpha")).await;
    assert_eq!(
        (&a2["waiting_for"], &a2["held_by"]),
        (&json!("a-1"), &json!("a-1")),
        "{a2}"
    );
    let response = reqwest::Client::new()
        .delete(format!("{jobs}/a-1?tenant=alpha"))
        .send()
        .await
        .expect("cancel");
    assert_eq!(response.status().as_u16(), 204);
    wait_state(&base, "a-2?tenant=alpha", "delivered").await;
    // A replayed dead letter rejoins its own tenant's line and leaves it
    // when delivered: default's next job of the key is not held behind it.
    let (status, report) = post_json(
        &format!("{base}/v1/dead-letters/replay"),
        json!({"tenant": "beta", "ids": ["b-2"], "url": receiver.url("/ok")}),
    )
    .await;
    assert_eq!(
        (status, &report["replayed"]),
        (200, &json!(["b-2"])),
        "{report}"
    );
    wait_state(&base, "b-2?tenant=beta", "delivered").await;
    post_created(&jobs, job("default", "d-2", "/ok")).await;
    wait_state(&base, "d-2", "delivered").await;
    // Each delivery of the line said which tenant's job it was.
    let ids: Vec<String> = receiver
        .requests()
        .iter()
        .map(|r| r.header("webhook-id").unwrap_or_default().to_string())
        .collect();
    for id in ["beta/b-1", "beta/b-3", "d-1", "alpha/a-2"] {
        assert!(ids.iter().any(|seen| seen == id), "{id} in {ids:?}");
    }
}

/// `hookq --tenant`: `enqueue`, `show`, `jobs` and `cancel` act in the
/// tenant named (default `default`), tables show the tenant, and a bad
/// name exits 2 naming `--tenant`, writing nothing.
#[tokio::test]
async fn the_cli_acts_in_the_tenant_named() {
    let redis = RedisServer::start();
    let cli = |args: &[&str]| crate::ops::hookq(&redis, "hookq", args);
    for tenant in ["default", "billing"] {
        let out = cli(&[
            "enqueue",
            "--tenant",
            tenant,
            "--id",
            "inv-1",
            "--url",
            "http://127.0.0.1:9/",
            "--delay",
            "1h",
            "--body",
            &format!(r#"{{"t":"{tenant}"}}"#),
        ]);
        assert!(out.status.success(), "{out:?}");
    }
    let shown = |args: &[&str]| {
        let out = cli(args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        serde_json::from_slice::<Value>(&out.stdout).expect("JSON")
    };
    let billing = shown(&["--json", "show", "--tenant", "billing", "inv-1"]);
    assert_eq!(
        (&billing["tenant"], &billing["body"]),
        (&json!("billing"), &json!({"t": "billing"})),
        "{billing}"
    );
    let default = shown(&["--json", "show", "inv-1"]);
    assert_eq!(
        (&default["tenant"], &default["body"]),
        (&json!("default"), &json!({"t": "default"})),
        "{default}"
    );
    let listed = shown(&["--json", "jobs", "--tenant", "billing"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed[0]["tenant"], "billing", "{listed}");
    let table = cli(&["jobs", "--tenant", "billing"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("tenant") && text.contains("billing"),
        "{text}"
    );

    let out = cli(&["cancel", "--tenant", "billing", "inv-1"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        shown(&["--json", "show", "--tenant", "billing", "inv-1"])["state"],
        "cancelled"
    );
    assert_eq!(
        shown(&["--json", "show", "inv-1"])["state"],
        "scheduled",
        "default's job untouched"
    );

    for args in [
        &["show", "--tenant", "Billing", "inv-1"][..],
        &[
            "enqueue",
            "--tenant",
            "a/b",
            "--id",
            "inv-2",
            "--url",
            "http://127.0.0.1:9/",
        ][..],
        &["jobs", "--tenant", ""][..],
        &["schedules", "list", "--tenant=-x"][..],
        &["dead-letters", "--tenant", "UP"][..],
    ] {
        let out = cli(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--tenant"),
            "{args:?}: {out:?}"
        );
    }
    let out = cli(&["show", "inv-2"]);
    assert_eq!(out.status.code(), Some(3), "nothing written: {out:?}");
}

/// A schedule of tenant `beta` fires jobs of `beta`: their `webhook-id`
/// is `beta/<schedule id>:<time>`, they are found (in the schedule's
/// partition) by their id within `beta` and name their schedule by its id
/// there; the schedule's fire ids are reserved in `beta` alone.
#[tokio::test]
async fn a_tenants_schedule_fires_jobs_of_that_tenant() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    // With an ordering key: each fire joins beta's line, and leaves it.
    let schedule = json!({"id": "tick", "tenant": "beta", "every": "1s",
        "job": {"url": receiver.url("/tick"), "ordering_key": "k"}});
    let made = post_created(&format!("{base}/v1/schedules"), schedule).await;
    assert_eq!(
        (&made["tenant"], &made["id"]),
        (&json!("beta"), &json!("tick")),
        "{made}"
    );
    let first = receiver.wait_for_count(1, Duration::from_secs(15)).await;
    let webhook_id = first[0]
        .header("webhook-id")
        .expect("webhook-id")
        .to_string();
    let job_id = webhook_id
        .strip_prefix("beta/")
        .unwrap_or_else(|| panic!("a beta job: {webhook_id}"))
        .to_string();
    let (schedule_part, at) = job_id.rsplit_once(':').expect("<schedule>:<time>");
    assert_eq!(schedule_part, "tick");
    let view = wait_state(&base, &format!("{job_id}?tenant=beta"), "delivered").await;
    assert_eq!(
        (&view["tenant"], &view["id"], &view["schedule_id"]),
        (&json!("beta"), &json!(job_id), &json!("tick")),
        "{view}"
    );
    let (status, _) = get_json(&format!("{base}/v1/jobs/{job_id}")).await;
    assert_eq!(status, 404, "not default's job");
    let (_, shown) = get_json(&format!("{base}/v1/schedules/tick?tenant=beta")).await;
    let runs = shown["last_runs"].as_array().expect("last_runs");
    assert!(runs.iter().any(|r| r["job_id"] == json!(job_id)), "{shown}");

    // A later fire id of the schedule is reserved in beta, free elsewhere.
    let later = format!("tick:{}", at.parse::<i64>().expect("ms") + 3_600_000);
    let job = |tenant: &str| json!({"id": later, "tenant": tenant, "url": receiver.url("/x"), "delay": "2h"});
    let (status, refused) = post_json(&format!("{base}/v1/jobs"), job("beta")).await;
    assert_eq!(
        (status, &refused["error"]["code"]),
        (409, &json!("reserved_id")),
        "{refused}"
    );
    post_created(&format!("{base}/v1/jobs"), job("default")).await;
    // The next fire is not held behind the first (its line is beta's).
    receiver.wait_for_count(2, Duration::from_secs(15)).await;
}

/// The last attempt of an ordered job of tenant `beta` loses its lease
/// (its daemon gone): the reclaim dead-letters it and releases the next
/// job of beta's line.
#[tokio::test]
async fn a_lost_last_lease_releases_the_tenants_line() {
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = hookq::store::Store::connect(&config).await.expect("store");
    for id in ["r-1", "r-2"] {
        let input = hookq::job::JobInput {
            id: Some(id.into()),
            tenant: Some("beta".into()),
            url: Some("http://127.0.0.1:9/never".into()),
            ordering_key: Some("k".into()),
            retry: Some(vec![]),
            ..hookq::job::JobInput::default()
        };
        crate::enqueue_direct(&store, &config, input).await;
    }
    let p = store.keys().order_partition("default:k");
    crate::claim_in(&store, p, "beta/r-1").await;
    // The lease is timeout + margin (2.3 s here); 15 s is ample.
    crate::support::wait_until(
        "r-1's lease expires and it dies",
        Duration::from_secs(15),
        || {
            let store = store.clone();
            async move { store.reclaim(p, 100).await.expect("reclaim").dead == 1 }
        },
    )
    .await;
    let next = store.get("beta/r-2").await.expect("get").expect("r-2");
    assert!(
        !next.held && next.state == hookq::job::State::Ready,
        "r-2 is released: {:?} held={}",
        next.state,
        next.held
    );
}
