//! Schedules (SPEC §12) end to end: fire times exactly an interval apart,
//! one job per fire time across two daemon processes and a kill -9, the
//! catch-up rules after every daemon was down, `overlap = "skip"` against
//! a receiver that hangs, pause and resume, PATCH, and bad input.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{json, Value};

use crate::api::send;
use crate::ops::{base_url, free_port, spawn_ready, spawn_serve, wait_ready};
use crate::support::receiver::Receiver;
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{get_json, job_view, post_json, start_daemon, test_config};

/// The fire times of schedule `id` among the receiver's deliveries (job
/// ids `<id>:<fire time>`), each with the number of its deliveries: a fire
/// time fired twice counts 2 (a set would show it once).
fn fired_times(receiver: &Receiver, id: &str) -> BTreeMap<i64, usize> {
    fired_with(receiver, id, |_| true)
}

/// As [`fired_times`], counting first attempts only (`hookq-attempt: 1`):
/// where a daemon is killed mid-attempt, the attempt is repeated (at least
/// once) as attempt 2, while a fire time fired twice would make a second
/// job whose first attempt is attempt 1 again.
fn fired_first_attempts(receiver: &Receiver, id: &str) -> BTreeMap<i64, usize> {
    fired_with(receiver, id, |r| r.header("hookq-attempt") == Some("1"))
}

fn fired_with(
    receiver: &Receiver,
    id: &str,
    keep: impl Fn(&crate::support::receiver::Recorded) -> bool,
) -> BTreeMap<i64, usize> {
    let prefix = format!("{id}:");
    let mut counts = BTreeMap::new();
    for r in receiver.requests().iter().filter(|r| keep(r)) {
        if let Some(at) = r
            .header("webhook-id")
            .and_then(|h| h.strip_prefix(&prefix))
            .and_then(|t| t.parse::<i64>().ok())
        {
            *counts.entry(at).or_insert(0) += 1;
        }
    }
    counts
}

/// Asserts that each fire time of schedule `id` in `counts` was delivered
/// exactly once.
fn assert_each_once(id: &str, counts: &BTreeMap<i64, usize>) {
    let doubled: Vec<(&i64, &usize)> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        doubled.is_empty(),
        "{id}: fire times delivered more than once: {doubled:?}"
    );
}

/// Asserts that each fire time of `id` was delivered once and consecutive
/// ones are `every_ms` apart: none doubled, none skipped.
fn assert_each_once_gapless(id: &str, counts: &BTreeMap<i64, usize>, every_ms: i64) {
    assert_each_once(id, counts);
    let times: Vec<i64> = counts.keys().copied().collect();
    for pair in times.windows(2) {
        assert_eq!(pair[1] - pair[0], every_ms, "{id}: a gap in {times:?}");
    }
}

/// `every = "1s"`: the fired jobs' fire times are exactly 1,000 ms apart,
/// each job shows its schedule, and the schedule shows its runs.
#[tokio::test]
async fn every_second_fires_jobs_exactly_a_second_apart() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let (status, created) = post_json(
        &format!("{base}/v1/schedules"),
        json!({"id": "tick", "every": "1s", "job": {"url": receiver.url("/tick"), "body": {"n": 1}}}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["state"], "active");
    let next: Vec<&str> = created["next_runs"]
        .as_array()
        .expect("next_runs")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(next.len(), 5, "{created}");
    // The same again: 200; other content: 409.
    let (status, _) = post_json(
        &format!("{base}/v1/schedules"),
        json!({"id": "tick", "every": "1s", "job": {"url": receiver.url("/tick"), "body": {"n": 1}}}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = post_json(
        &format!("{base}/v1/schedules"),
        json!({"id": "tick", "every": "2s", "job": {"url": receiver.url("/tick")}}),
    )
    .await;
    assert_eq!(status, 409);

    wait_until(
        "four firings are delivered",
        Duration::from_secs(10),
        || async { fired_times(&receiver, "tick").len() >= 4 },
    )
    .await;
    let fired = fired_times(&receiver, "tick");
    assert_each_once_gapless("tick", &fired, 1000);
    let times: Vec<i64> = fired.keys().copied().collect();
    let job = format!("tick:{}", times[0]);
    let (status, shown) = get_json(&format!("{base}/v1/jobs/{job}")).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["schedule_id"], "tick", "{shown}");
    let (_, schedule) = get_json(&format!("{base}/v1/schedules/tick")).await;
    let runs = schedule["last_runs"].as_array().expect("last_runs");
    assert!(runs.len() >= 4, "{schedule}");
    assert!(runs
        .iter()
        .all(|r| r["outcome"] == "fired"
            && r["job_id"].as_str().is_some_and(|j| j.starts_with("tick:"))));
    // Firings are counted and their lateness measured.
    let metrics = crate::metrics_text(&base).await;
    assert!(
        metrics.contains("hookq_schedule_firings_total{outcome=\"fired\"}")
            && metrics.contains("hookq_schedule_firing_lateness_seconds"),
        "{metrics}"
    );
    let (status, page) = get_json(&format!("{base}/v1/schedules?limit=10")).await;
    assert_eq!(status, 200);
    assert_eq!(page["schedules"][0]["id"], "tick", "{page}");

    // Deleted: no more firings; the jobs stay.
    let (status, _) = send(
        reqwest::Method::DELETE,
        &format!("{base}/v1/schedules/tick"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, _) = get_json(&format!("{base}/v1/schedules/tick")).await;
    assert_eq!(status, 404);
    let (status, _) = get_json(&format!("{base}/v1/jobs/{job}")).await;
    assert_eq!(status, 200);
    daemon.stop().await.expect("clean stop");
}

/// Two daemon processes share a schedule firing every second; one is
/// killed with SIGKILL mid-run (its partitions pass to the other): the
/// fire times delivered form a gapless sequence, each once.
#[tokio::test]
async fn two_daemons_and_a_kill_9_neither_skip_nor_double_a_firing() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let env = [
        ("HOOKQ_DELIVERY__TIMEOUT", "1s"),
        ("HOOKQ_DELIVERY__LEASE_MARGIN", "300ms"),
    ];
    let (mut daemons, mut ports) = spawn_ready(&redis, 2, &env).await;
    let base = base_url(ports[0]);
    // Several schedules, so some live in partitions of each daemon.
    let ids: Vec<String> = (0..6).map(|i| format!("s{i}")).collect();
    for id in &ids {
        let (status, created) = post_json(
            &format!("{base}/v1/schedules"),
            json!({"id": id, "every": "1s", "job": {"url": receiver.url("/")}}),
        )
        .await;
        assert_eq!(status, 201, "{created}");
    }
    wait_until("firings begin", Duration::from_secs(10), || async {
        ids.iter().all(|id| fired_times(&receiver, id).len() >= 2)
    })
    .await;
    daemons[1].kill_9().await;
    let before_each: Vec<usize> = ids
        .iter()
        .map(|id| fired_times(&receiver, id).len())
        .collect();
    let before: usize = before_each.iter().sum();
    // The survivor takes the dead one's partitions over once its
    // membership runs out (7 s at most), and fires what came due meanwhile
    // and what comes due after: every schedule, the dead one's included,
    // goes on firing before the dead daemon is replaced (a later daemon's
    // catch-up would otherwise fill the gap and hide a takeover that
    // never fired).
    wait_until(
        "every schedule fires past the takeover",
        Duration::from_secs(30),
        || async {
            ids.iter()
                .zip(&before_each)
                .all(|(id, before)| fired_times(&receiver, id).len() >= before + 8)
        },
    )
    .await;
    ports[1] = free_port();
    daemons[1] = spawn_serve(&redis, ports[1], &env);
    wait_ready(ports[1]).await;
    wait_until(
        "firings go on with both",
        Duration::from_secs(15),
        || async {
            ids.iter()
                .map(|id| fired_times(&receiver, id).len())
                .sum::<usize>()
                >= before + 6 * 12
        },
    )
    .await;
    for daemon in &mut daemons {
        daemon.kill_9().await;
    }
    for id in &ids {
        assert_each_once_gapless(id, &fired_first_attempts(&receiver, id), 1000);
    }
}

/// Two daemon processes forced onto one partition, both firing it: with
/// `redis.partitions = 1` and the fleet's membership key unreadable (a
/// string where the fleet keeps a sorted set), every heartbeat fails and
/// each daemon keeps the deal it starts with, which is every partition
/// ("a daemon that cannot reach Redis keeps its deal"). Both firers then
/// wake at each fire time and race for it. Each fire time of 8 schedules
/// firing every second is delivered once with no gap; both daemons fired
/// some (the race is real); their fired counts add up to the jobs (the
/// loser of a race counts nothing, as it changes nothing); and no
/// schedule's `last_runs` lists a time twice.
#[tokio::test]
async fn two_firers_on_one_partition_neither_skip_nor_double_a_firing() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("SET")
        .arg("hookq:fleet")
        .arg("not a sorted set")
        .query_async(&mut conn)
        .await
        .expect("SET");
    let env = [
        ("HOOKQ_REDIS__PARTITIONS", "1"),
        ("HOOKQ_DELIVERY__TIMEOUT", "1s"),
        ("HOOKQ_DELIVERY__LEASE_MARGIN", "300ms"),
    ];
    let (_daemons, ports) = spawn_ready(&redis, 2, &env).await;
    let bases: Vec<String> = ports.iter().map(|p| base_url(*p)).collect();
    let ids: Vec<String> = (0..8).map(|i| format!("race{i}")).collect();
    for id in &ids {
        let (status, created) = post_json(
            &format!("{}/v1/schedules", bases[0]),
            json!({"id": id, "every": "1s", "job": {"url": receiver.url("/")}}),
        )
        .await;
        assert_eq!(status, 201, "{created}");
    }
    wait_until(
        "every schedule fired 8 times",
        Duration::from_secs(30),
        || async { ids.iter().all(|id| fired_times(&receiver, id).len() >= 8) },
    )
    .await;
    for id in &ids {
        let (_, view) = get_json(&format!("{}/v1/schedules/{id}", bases[1])).await;
        let runs: Vec<&str> = view["last_runs"]
            .as_array()
            .expect("last_runs")
            .iter()
            .filter_map(|r| r["at"].as_str())
            .collect();
        let distinct: BTreeSet<&str> = runs.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            runs.len(),
            "{id}: a run listed twice: {runs:?}"
        );
        let (status, _) = send(
            reqwest::Method::DELETE,
            &format!("{}/v1/schedules/{id}", bases[0]),
            None,
        )
        .await;
        assert_eq!(status, 204);
    }
    // Deleted: nothing fires any more. Every fired job is delivered once
    // nothing is left to run, and a repeat could come only within a lease
    // (timeout 1 s + margin 300 ms): wait that, and a second more.
    crate::wait_until_idle(&bases[0], Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let mut jobs = 0;
    for id in &ids {
        let fired = fired_times(&receiver, id);
        assert_each_once_gapless(id, &fired, 1000);
        jobs += fired.len();
    }
    let mut counted = Vec::new();
    for base in &bases {
        let text = crate::metrics_text(base).await;
        counted.push(crate::metric_sum(
            &text,
            "hookq_schedule_firings_total{outcome=\"fired\"}",
        ));
    }
    assert!(
        counted.iter().all(|n| *n > 0.0),
        "both daemons fired: {counted:?}"
    );
    assert_eq!(
        counted.iter().sum::<f64>(),
        jobs as f64,
        "firings counted by the two daemons vs jobs delivered: {counted:?}"
    );
}

/// Writes schedule `id` (every second, anchored `behind_ms` ago, next
/// fire time its first) straight to Redis, as if every daemon had been
/// down since then.
async fn missed_schedule(
    config: &hookq::config::Config,
    id: &str,
    catch_up: &str,
    behind_ms: i64,
    url: &str,
) {
    let store = hookq::store::Store::connect(config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    let input: hookq::schedule::ScheduleInput = serde_json::from_value(
        json!({"id": id, "every": "1s", "catch_up": catch_up, "job": {"url": url}}),
    )
    .expect("input");
    let valid = input.validate(config).expect("valid");
    let now = store.redis_time_ms().await.expect("time");
    let anchor = now - behind_ms;
    let write = hookq::store::schedules::ScheduleWrite::new(
        config,
        id,
        &valid.spec,
        false,
        Some(anchor + 1000),
        anchor,
        None,
    );
    assert!(matches!(
        store.put_schedule(&write).await.expect("put"),
        hookq::store::schedules::PutOutcome::Written(_)
    ));
}

/// After every daemon was down for 30 s: `all` fires every missed time,
/// `latest` the newest missed one, `none` none; each fires what is less
/// than 10 s late (late, not missed).
#[tokio::test]
async fn catch_up_rules_after_every_daemon_was_down() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let config = test_config(&redis);
    for rule in ["all", "latest", "none"] {
        missed_schedule(&config, rule, rule, 30_000, &receiver.url("/")).await;
    }
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    wait_until(
        "each schedule caught up",
        Duration::from_secs(10),
        || async {
            // `all` fires its ~30 missed times at once: wait for all of them.
            fired_times(&receiver, "all").len() >= 29
                && ["latest", "none"]
                    .iter()
                    .all(|id| fired_times(&receiver, id).len() >= 5)
        },
    )
    .await;
    // How late a fired job was created after its fire time.
    let lateness = |id: &str, at: i64| {
        let base = base.clone();
        let job = format!("{id}:{at}");
        async move {
            let view = job_view(&base, &job).await;
            let created = view["created_at"].as_str().expect("created_at").to_string();
            chrono::DateTime::parse_from_rfc3339(&created)
                .expect("RFC 3339")
                .timestamp_millis()
                - at
        }
    };
    let all = fired_times(&receiver, "all");
    assert!(all.len() >= 29, "every missed time: {all:?}");
    assert_each_once_gapless("all", &all, 1000);
    let first = *all.keys().next().expect("fired");
    assert!(
        lateness("all", first).await >= 28_000,
        "from the first missed time"
    );
    // latest: from the newest time at least 10 s late; none: from the
    // oldest less than 10 s late.
    let latest = fired_times(&receiver, "latest");
    assert_each_once_gapless("latest", &latest, 1000);
    let first = *latest.keys().next().expect("fired");
    let late = lateness("latest", first).await;
    assert!(
        (10_000..11_000).contains(&late),
        "latest: {late} ms late: {latest:?}"
    );
    let none = fired_times(&receiver, "none");
    assert_each_once_gapless("none", &none, 1000);
    let first = *none.keys().next().expect("fired");
    let late = lateness("none", first).await;
    assert!(
        (9_000..10_000).contains(&late),
        "none: {late} ms late: {none:?}"
    );
    daemon.stop().await.expect("clean stop");
}

/// `overlap = "skip"`: while the previous firing's job hangs at the
/// receiver, fire times are skipped; the receiver never has two at once.
#[tokio::test]
async fn overlap_skip_fires_nothing_while_the_last_job_is_unfinished() {
    let redis = RedisServer::start();
    let receiver = Receiver::slow(200, Duration::from_millis(2500)).await;
    let mut config = test_config(&redis);
    config.delivery.timeout = Duration::from_secs(5);
    config.validate().expect("config");
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let (status, created) = post_json(
        &format!("{base}/v1/schedules"),
        json!({"id": "slow", "every": "1s", "overlap": "skip", "job": {"url": receiver.url("/")}}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    wait_until(
        "fired twice, skipped between",
        Duration::from_secs(15),
        || async {
            let (_, view) = get_json(&format!("{base}/v1/schedules/slow")).await;
            let runs = view["last_runs"].as_array().cloned().unwrap_or_default();
            runs.iter().filter(|r| r["outcome"] == "fired").count() >= 2
                && runs.iter().any(|r| r["outcome"] == "skipped")
        },
    )
    .await;
    // Arrivals are at least the receiver's delay apart: one at a time.
    let arrivals: Vec<std::time::SystemTime> =
        receiver.requests().iter().map(|r| r.received_at).collect();
    for pair in arrivals.windows(2) {
        let gap = pair[1].duration_since(pair[0]).unwrap_or_default();
        assert!(
            gap >= Duration::from_millis(2400),
            "overlapping jobs: {gap:?}"
        );
    }
    daemon.stop().await.expect("clean stop");
}

/// Pause: no fire time while paused (never caught up); resume: firing
/// again. PATCH: the new interval applies from the next fire time.
#[tokio::test]
async fn pause_resume_and_patch() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let (status, _) = post_json(
        &format!("{base}/v1/schedules"),
        json!({"id": "p", "every": "1s", "job": {"url": receiver.url("/"), "body": {"v": 1}}}),
    )
    .await;
    assert_eq!(status, 201);
    wait_until("it fires", Duration::from_secs(10), || async {
        !fired_times(&receiver, "p").is_empty()
    })
    .await;
    let (status, paused) = post_json(&format!("{base}/v1/schedules/p/pause"), json!({})).await;
    assert_eq!(
        (status, &paused["state"]),
        (200, &json!("paused")),
        "{paused}"
    );
    let paused_at = hookq::job::now_ms();
    let fired_before = fired_times(&receiver, "p");
    // Three fire times pass while paused (a wait for time itself).
    wait_until("three seconds pass", Duration::from_secs(5), || async {
        hookq::job::now_ms() > paused_at + 3000
    })
    .await;
    let (status, resumed) = post_json(&format!("{base}/v1/schedules/p/resume"), json!({})).await;
    assert_eq!(
        (status, &resumed["state"]),
        (200, &json!("active")),
        "{resumed}"
    );
    let resumed_at = hookq::job::now_ms();
    wait_until("it fires again", Duration::from_secs(10), || async {
        fired_times(&receiver, "p").len() > fired_before.len() + 1
    })
    .await;
    let paused_window: Vec<i64> = fired_times(&receiver, "p")
        .into_keys()
        .filter(|t| *t > paused_at + 200 && *t < resumed_at - 200)
        .collect();
    assert!(
        paused_window.is_empty(),
        "fired while paused: {paused_window:?}"
    );

    // Every 2 s from the next fire time on, with a new body.
    let (status, patched) = send(
        reqwest::Method::PATCH,
        &format!("{base}/v1/schedules/p"),
        Some(json!({"every": "2s", "job": {"url": receiver.url("/"), "body": {"v": 2}}})),
    )
    .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(patched["every"], "2s", "{patched}");
    let patched_at = hookq::job::now_ms();
    wait_until(
        "two firings after the change",
        Duration::from_secs(10),
        || async {
            fired_times(&receiver, "p")
                .keys()
                .filter(|t| **t > patched_at)
                .count()
                >= 2
        },
    )
    .await;
    assert_each_once("p", &fired_times(&receiver, "p"));
    let after: Vec<i64> = fired_times(&receiver, "p")
        .into_keys()
        .filter(|t| *t > patched_at)
        .collect();
    assert_eq!(after[1] - after[0], 2000, "{after:?}");
    let body = receiver
        .requests()
        .into_iter()
        .find(|r| r.header("webhook-id") == Some(format!("p:{}", after[0]).as_str()))
        .expect("arrived")
        .json();
    assert_eq!(body["v"], 2);
    daemon.stop().await.expect("clean stop");
}

/// Bad schedules answer 400 naming the field, with the parser's reason,
/// and write nothing.
#[tokio::test]
async fn bad_schedules_are_refused_naming_the_field() {
    let redis = RedisServer::start();
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let job = json!({"url": "http://127.0.0.1:9/"});
    let cases = [
        (json!({"id": "b", "job": job}), "cron"),
        (
            json!({"id": "b", "cron": "* * * * *", "every": "1m", "job": job}),
            "cron",
        ),
        (json!({"id": "b", "cron": "99 * * * *", "job": job}), "cron"),
        (
            json!({"id": "b", "cron": "@daily", "timezone": "Nowhere/Land", "job": job}),
            "timezone",
        ),
        (json!({"id": "b", "every": "10ms", "job": job}), "every"),
        (
            json!({"id": "b", "every": "300000000y", "job": job}),
            "every",
        ),
        (
            json!({"id": "b", "every": "1m", "start_at": 2_000_000_000_000i64, "end_at": 1_900_000_000_000i64, "job": job}),
            "end_at",
        ),
        (
            json!({"id": "b", "every": "1m", "job": {"url": "not a url"}}),
            "job.url",
        ),
        (
            json!({"id": "b", "every": "1m", "job": {"url": "http://127.0.0.1:9/", "ordering_key": "a b"}}),
            "job.ordering_key",
        ),
        (json!({"id": "b:c", "every": "1m", "job": job}), "id"),
    ];
    for (body, field) in cases {
        let (status, answer) = post_json(&format!("{base}/v1/schedules"), body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{body}: {answer}");
    }
    let (_, answer) = post_json(
        &format!("{base}/v1/schedules"),
        json!({"id": "b", "cron": "99 * * * *", "job": job}),
    )
    .await;
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("99")),
        "the parser's reason: {answer}"
    );
    let (status, _) = get_json(&format!("{base}/v1/schedules/b")).await;
    assert_eq!(status, 404, "nothing written");

    // A PATCH with a bad field is refused naming it and changes nothing.
    let (status, created) = post_json(
        &format!("{base}/v1/schedules"),
        json!({"id": "kept", "every": "1h", "paused": true, "job": job}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let (_, before) = get_json(&format!("{base}/v1/schedules/kept")).await;
    for (patch, field) in [
        (json!({"every": "10ms"}), "every"),
        (json!({"every": "300000000y"}), "every"),
        (json!({"cron": "99 * * * *"}), "cron"),
        (
            json!({"cron": "@daily", "timezone": "Nowhere/Land"}),
            "timezone",
        ),
        (json!({"job": {"url": "not a url"}}), "job.url"),
    ] {
        let (status, answer) = send(
            reqwest::Method::PATCH,
            &format!("{base}/v1/schedules/kept"),
            Some(patch.clone()),
        )
        .await;
        assert_eq!(status, 400, "{patch}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{patch}: {answer}");
    }
    let (_, after) = get_json(&format!("{base}/v1/schedules/kept")).await;
    // The whole view, its update time and next runs (anchored at its
    // creation, every hour) included.
    assert_eq!(after, before, "a refused PATCH changed the schedule");
    // A schedule that does not exist: 404 for every change.
    for (method, path, body) in [
        (
            reqwest::Method::PATCH,
            "/v1/schedules/absent",
            Some(json!({"every": "1m"})),
        ),
        (reqwest::Method::POST, "/v1/schedules/absent/pause", None),
        (reqwest::Method::POST, "/v1/schedules/absent/resume", None),
        (reqwest::Method::DELETE, "/v1/schedules/absent", None),
    ] {
        let (status, answer) = send(method.clone(), &format!("{base}{path}"), body).await;
        assert_eq!(status, 404, "{method} {path}: {answer}");
    }
    let (status, _) = get_json(&format!("{base}/v1/schedules/absent")).await;
    assert_eq!(status, 404, "nothing written");
    daemon.stop().await.expect("clean stop");
}

/// `hookq schedules`: list, show, pause, resume and delete against the
/// same Redis; a missing id exits 3, a malformed one 2 naming ID.
#[tokio::test]
async fn the_cli_lists_shows_pauses_resumes_and_deletes_schedules() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let daemon = start_daemon(&test_config(&redis)).await;
    let (status, _) = post_json(
        &format!("{}/v1/schedules", daemon.url()),
        json!({"id": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin",
            "job": {"url": receiver.url("/")}}),
    )
    .await;
    assert_eq!(status, 201);
    let cli = |args: &[&str]| crate::ops::hookq(&redis, "hookq", args);
    let text = |out: &std::process::Output| String::from_utf8_lossy(&out.stdout).to_string();

    let out = cli(&["schedules"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text(&out).contains("nightly") && text(&out).contains("cron 0 3 * * * (Europe/Berlin)"),
        "{}",
        text(&out)
    );
    let out = cli(&["--json", "schedules", "show", "nightly"]);
    let shown: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(shown["state"], "active", "{shown}");
    assert_eq!(shown["next_runs"].as_array().map(Vec::len), Some(5));
    let out = cli(&["--json", "schedules", "pause", "nightly"]);
    let paused: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(paused["state"], "paused", "{paused}");
    let (_, api) = get_json(&format!("{}/v1/schedules/nightly", daemon.url())).await;
    assert_eq!(api["state"], "paused", "the API sees it: {api}");
    let out = cli(&["--json", "schedules", "resume", "nightly"]);
    let resumed: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(resumed["state"], "active", "{resumed}");
    let out = cli(&["schedules", "delete", "nightly"]);
    assert!(out.status.success(), "{out:?}");
    let out = cli(&["schedules", "show", "nightly"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let out = cli(&["schedules", "show", "a:b"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ID"),
        "{out:?}"
    );
    daemon.stop().await.expect("clean stop");
}

/// On a real 3-master Redis Cluster, two daemons: schedules spread over
/// partitions on every master each fire once per fire time, also while
/// the first master's partitions migrate to the second a few keys at a
/// time.
#[tokio::test]
async fn schedules_on_a_cluster_fire_each_time_once() {
    use crate::support::cluster::{
        keyslot, migrate_slots_in_background, slot_owner, slots_served_by, RedisCluster,
    };
    let cluster = RedisCluster::start();
    let receiver = Receiver::ok().await;
    let mut config = test_config(&cluster.nodes[0]);
    config.redis.partitions = 16;
    config.redis.cluster_nodes = cluster.seeds();
    config.validate().expect("valid cluster config");
    let daemons = [start_daemon(&config).await, start_daemon(&config).await];
    let keys = hookq::store::Keys::new(&config.redis.namespace, config.redis.partitions);
    let ids: Vec<String> = (0..24).map(|i| format!("c{i}")).collect();
    let first = cluster.master_ports()[0];
    let masters: BTreeSet<u16> = ids
        .iter()
        .map(|id| {
            let slot = keyslot(first, &keys.fires(keys.partition_of(id)));
            slot_owner(first, slot)
        })
        .collect();
    assert_eq!(masters.len(), 3, "the schedules live on every master");
    for (i, id) in ids.iter().enumerate() {
        let (status, created) = post_json(
            &format!("{}/v1/schedules", daemons[i % 2].url()),
            json!({"id": id, "every": "1s", "job": {"url": receiver.url("/")}}),
        )
        .await;
        assert_eq!(status, 201, "{created}");
    }
    wait_until(
        "every schedule fired four times",
        Duration::from_secs(20),
        || async { ids.iter().all(|id| fired_times(&receiver, id).len() >= 4) },
    )
    .await;
    let all_masters = cluster.master_ports();
    let (from, to) = (all_masters[0], all_masters[1]);
    let slots = slots_served_by(from, (0..config.redis.partitions).map(|p| keys.fires(p)));
    let migration = migrate_slots_in_background(
        all_masters,
        slots.clone(),
        from,
        to,
        5,
        Duration::from_millis(20),
    );
    let moved = migration.await.expect("the migration completes");
    assert!(moved > 0);
    for slot in &slots {
        assert_eq!(slot_owner(from, *slot), to, "slot {slot} moved");
    }
    let fired_then: usize = ids.iter().map(|id| fired_times(&receiver, id).len()).sum();
    wait_until(
        "firings go on after the migration",
        Duration::from_secs(20),
        || async {
            ids.iter()
                .map(|id| fired_times(&receiver, id).len())
                .sum::<usize>()
                >= fired_then + 3 * ids.len()
        },
    )
    .await;
    for daemon in daemons {
        daemon.stop().await.expect("clean stop");
    }
    // First attempts per job: a fire time fired twice would make its job a
    // second time, first attempt again; an attempt repeated because its
    // outcome could not be recorded while its slot moved (at least once)
    // comes as attempt 2 and is no second firing.
    let mut firsts = std::collections::HashMap::new();
    for r in receiver.requests() {
        if let (Some(id), Some("1")) = (r.header("webhook-id"), r.header("hookq-attempt")) {
            *firsts.entry(id.to_string()).or_insert(0) += 1;
        }
    }
    assert!(
        firsts.values().all(|n| *n == 1),
        "a job made twice: {firsts:?}"
    );
    for id in &ids {
        assert_each_once_gapless(id, &fired_times(&receiver, id), 1000);
    }
}

/// A schedule whose job has an ordering key: it lives in its key's
/// partition (found by id through a stub in its own), its jobs join the
/// key's line (held behind a slow head, then delivered one at a time in
/// fire-time order); the key cannot change; deleted, its stub goes too.
#[tokio::test]
async fn an_ordered_schedules_jobs_wait_in_line() {
    let redis = RedisServer::start();
    let receiver = Receiver::slow(200, Duration::from_millis(1500)).await;
    let mut config = test_config(&redis);
    config.delivery.timeout = Duration::from_secs(5);
    config.validate().expect("config");
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let keys = hookq::store::Keys::new(&config.redis.namespace, config.redis.partitions);
    // An id whose partition differs from its key's.
    let id = (0..)
        .map(|i| format!("line-{i}"))
        .find(|id| keys.partition_of(id) != keys.order_partition("default:acct-7"))
        .expect("an id");
    let body = json!({"id": id, "every": "1s", "job": {"url": receiver.url("/"), "ordering_key": "acct-7"}});
    let (status, created) = post_json(&format!("{base}/v1/schedules"), body.clone()).await;
    assert_eq!(status, 201, "{created}");
    let (status, again) = post_json(&format!("{base}/v1/schedules"), body).await;
    assert_eq!(status, 200, "{again}");
    wait_until(
        "a fired job waits in line",
        Duration::from_secs(10),
        || async {
            let (_, schedule) = get_json(&format!("{base}/v1/schedules/{id}")).await;
            let runs = schedule["last_runs"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for run in runs {
                let job_id = run["job_id"].as_str().unwrap_or_default().to_string();
                let job = job_view(&base, &job_id).await;
                if job["waiting_for"].is_string() {
                    return job["ordering_key"] == "acct-7" && job["schedule_id"] == json!(id);
                }
            }
            false
        },
    )
    .await;
    wait_until("three delivered", Duration::from_secs(15), || async {
        fired_times(&receiver, &id).len() >= 3
    })
    .await;
    // One at a time, in fire-time order: arrivals at least the receiver's
    // delay apart, each fire time after the one before.
    let arrivals: Vec<(std::time::SystemTime, i64)> = receiver
        .requests()
        .iter()
        .filter_map(|r| {
            let at = r.header("webhook-id")?.rsplit_once(':')?.1.parse().ok()?;
            Some((r.received_at, at))
        })
        .collect();
    assert_each_once(&id, &fired_times(&receiver, &id));
    for pair in arrivals.windows(2) {
        assert!(pair[1].1 > pair[0].1, "in order: {arrivals:?}");
        let gap = pair[1].0.duration_since(pair[0].0).unwrap_or_default();
        assert!(gap >= Duration::from_millis(1400), "one at a time: {gap:?}");
    }
    // A job of a fired id made by hand is compared with the fired one where
    // it lives (the key's partition), not created beside it.
    let home = keys.order_partition("default:acct-7");
    let outside = || async {
        let (_, schedule) = get_json(&format!("{base}/v1/schedules/{id}")).await;
        schedule["last_runs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|run| run["job_id"].as_str().map(str::to_string))
            .find(|job_id| keys.partition_of(job_id) != home)
    };
    wait_until(
        "a fired job whose id hashes outside the key's partition",
        Duration::from_secs(20),
        || async { outside().await.is_some() },
    )
    .await;
    let fired_id = outside()
        .await
        .expect("a fired job outside the key's partition");
    let (status, conflict) = post_json(
        &format!("{base}/v1/jobs"),
        json!({"id": fired_id, "url": receiver.url("/by-hand")}),
    )
    .await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(job_view(&base, &fired_id).await["schedule_id"], json!(id));
    let (status, refused) = send(
        reqwest::Method::PATCH,
        &format!("{base}/v1/schedules/{id}"),
        Some(json!({"job": {"url": receiver.url("/"), "ordering_key": "acct-8"}})),
    )
    .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["field"], "job.ordering_key");
    let (_, page) = get_json(&format!("{base}/v1/schedules?limit=100")).await;
    let listed = page["schedules"]
        .as_array()
        .expect("schedules")
        .iter()
        .filter(|s| s["id"] == json!(id))
        .count();
    assert_eq!(listed, 1, "{page}");
    let (status, _) = send(
        reqwest::Method::DELETE,
        &format!("{base}/v1/schedules/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let mut conn = redis.conn().await;
    let stub: bool = redis::cmd("EXISTS")
        .arg(keys.schedule(keys.partition_of(&id), &id))
        .query_async(&mut conn)
        .await
        .expect("EXISTS");
    assert!(!stub, "the stub is gone with its schedule");
    let (status, _) = get_json(&format!("{base}/v1/schedules/{id}")).await;
    assert_eq!(status, 404);
    daemon.stop().await.expect("clean stop");
}

/// A fire time ahead of Redis's clock (a firer whose clock runs ahead):
/// its job is created scheduled, in the due set at the fire time, and the
/// schedule advances, all in the one script call. (The script once failed
/// there after its writes, on a record without its spec: the job existed
/// in no due set and the schedule had moved on, so the fire time was lost.)
#[tokio::test]
async fn a_fire_time_ahead_of_redis_waits_in_the_due_set() {
    use hookq::job::State;
    use hookq::store::schedules::{PutOutcome, ScheduleWrite};
    use hookq::store::Store;
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    let id = "ahead";
    let input: hookq::schedule::ScheduleInput = serde_json::from_value(
        json!({"id": id, "every": "1h", "job": {"url": "http://127.0.0.1:9/ahead"}}),
    )
    .expect("input");
    let spec = input.validate(&config).expect("valid").spec;
    let hour = 3_600_000;
    let t = store.redis_time_ms().await.expect("time") + hour;
    let create = ScheduleWrite::new(&config, id, &spec, false, Some(t), t - hour, None);
    assert_eq!(
        store.put_schedule(&create).await.expect("create"),
        PutOutcome::Written(1)
    );

    assert_eq!(
        crate::guards::fire_as_read(&redis, &store, id, t, 1, t, t + hour).await,
        1,
        "the fire time was not recorded"
    );
    let job = format!("{id}:{t}");
    let record = store.get(&job).await.expect("get").expect("the fired job");
    assert_eq!(record.state, State::Scheduled);
    assert_eq!(record.due, t);
    let p = store.keys().partition_of(id);
    let mut conn = redis.conn().await;
    let due: Vec<(String, i64)> = redis::cmd("ZRANGE")
        .arg(store.keys().due(p))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await
        .expect("ZRANGE");
    assert!(
        due.iter()
            .any(|(member, at)| member.ends_with(&job) && *at == t),
        "{job} is not in the due set at {t}: {due:?}"
    );
    let next: String = redis::AsyncCommands::hget(&mut conn, store.keys().schedule(p, id), "next")
        .await
        .expect("HGET");
    assert_eq!(next, (t + hour).to_string(), "the schedule did not advance");
}
