//! Listings, schedules and ordering: the holes of the second security
//! review that concern them (SPEC §14 "Second review", §12, §11.5). A
//! schedule listing leaves its templates' bodies out and stops at the page
//! byte cap, a schedule that can never fire is refused, and a job held
//! behind its ordering key shows which job holds the key and until when.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::api::send;
use crate::support::hanging::HangingHost;
use crate::support::receiver::Receiver;
use crate::support::redis::RedisServer;
use crate::{get_json, job_view, post_created, post_json, start_daemon, test_config};

/// The bytes of stored records one listing page reads before it ends early
/// with a cursor (`PAGE_READ_BYTES` in src/store/listing.rs, 8 MiB, the cap
/// the README documents).
const PAGE_READ_BYTES: usize = 8 << 20;

/// A large template body: with [`BIG_ITEMS`] of them, more than a page's
/// read cap is stored, and each still fits the 1 MiB `api.max_body`.
const BIG_BODY: usize = 800_000;

/// Schedules (or dead letters) with a [`BIG_BODY`] body: 9.6 MB, more than
/// [`PAGE_READ_BYTES`] (a bounded load: 12 creates of under 1 MB).
const BIG_ITEMS: usize = 12;

/// A listing page without bodies: about 1 KB per item shown, so a page of
/// [`BIG_ITEMS`] stays far under this; one body alone is 12 times it.
const SMALL_PAGE: usize = 64 * 1024;

/// `GET /v1/schedules` over templates with large bodies answers small pages
/// without the bodies, pages that end at the read cap and together list
/// every schedule once; the one schedule's view keeps its body.
#[tokio::test]
async fn a_schedule_listing_leaves_bodies_out_and_stops_at_the_byte_cap() {
    const { assert!(BIG_ITEMS * BIG_BODY > PAGE_READ_BYTES) };
    let redis = RedisServer::start();
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let blob = "x".repeat(BIG_BODY);
    for i in 0..BIG_ITEMS {
        let (status, answer) = post_json(
            &format!("{base}/v1/schedules"),
            json!({"id": format!("big-{i}"), "every": "1h", "paused": true,
                "job": {"url": "http://127.0.0.1:9/never", "body": {"blob": blob}}}),
        )
        .await;
        assert_eq!(status, 201, "create big-{i}: {answer}");
    }

    let mut seen = BTreeMap::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut url = format!("{base}/v1/schedules?limit=1000");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let response = reqwest::get(&url).await.expect("GET /v1/schedules");
        let status = response.status();
        let text = response.text().await.expect("page body");
        assert_eq!(status, 200, "{url}: {}", &text[..text.len().min(300)]);
        assert!(
            text.len() < SMALL_PAGE,
            "a page of the schedule listing holds {} bytes",
            text.len()
        );
        assert!(!text.contains("xxxx"), "a listed schedule shows its body");
        let page: Value = serde_json::from_str(&text).expect("JSON page");
        for schedule in page["schedules"].as_array().expect("schedules") {
            assert!(schedule["job"]["url"].is_string(), "{schedule}");
            let id = schedule["id"].as_str().expect("id").to_string();
            *seen.entry(id).or_insert(0) += 1;
        }
        pages += 1;
        assert!(pages <= 64, "the listing does not end");
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    assert_eq!(seen.len(), BIG_ITEMS, "the pages missed schedules");
    assert!(seen.values().all(|&n| n == 1), "listed twice: {seen:?}");
    // 9.6 MB of schedules cannot be read by one page of an 8 MiB cap.
    assert!(
        pages > BIG_ITEMS * BIG_BODY / PAGE_READ_BYTES,
        "{pages} pages: the listing read past its byte cap"
    );

    // The schedule itself still shows its template's body.
    let (status, one) = get_json(&format!("{base}/v1/schedules/big-0")).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(
        one["job"]["body"]["blob"].as_str().map(str::len),
        Some(BIG_BODY)
    );
    daemon.stop().await.expect("clean stop");
}

/// A schedule that can never fire is refused naming the field to blame,
/// on create and on PATCH, and nothing is written: `cron` when its
/// expression matches no date from now on, `end_at` when its window closes
/// before its first fire time. A rare date that does come (29 February), a
/// window that holds exactly one fire time, and the re-create of a
/// schedule that has since ended are accepted.
#[tokio::test]
async fn a_schedule_that_can_never_fire_is_refused() {
    let redis = RedisServer::start();
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let job = json!({"url": "http://127.0.0.1:9/never"});
    let now = chrono::Utc::now().timestamp_millis();
    let hour = 3_600_000i64;
    let refused = [
        (json!({"cron": "0 0 30 2 *"}), "cron"),
        (json!({"cron": "0 0 31 4 *"}), "cron"),
        // Seconds, the five fields, and a year gone by.
        (json!({"cron": "0 0 0 1 1 * 2020"}), "cron"),
        (
            json!({"cron": "0 0 30 2 *", "end_at": now + 10 * hour}),
            "cron",
        ),
        (
            json!({"cron": "@daily", "end_at": 1_600_000_000_000i64}),
            "end_at",
        ),
        (
            json!({"every": "1h", "start_at": now + hour, "end_at": now + hour + 30 * 60_000}),
            "end_at",
        ),
        (json!({"every": "1h", "end_at": now + 60_000}), "end_at"),
    ];
    for (timing, field) in &refused {
        let mut body = timing.clone();
        body["id"] = json!("never");
        body["job"] = job.clone();
        let (status, answer) = post_json(&format!("{base}/v1/schedules"), body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["field"], *field, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "never_fires", "{body}: {answer}");
    }
    let (status, _) = get_json(&format!("{base}/v1/schedules/never")).await;
    assert_eq!(status, 404, "a refused schedule was written");

    // Fires on the next 29 February; and once, at the window's end.
    for (id, timing) in [
        ("leap", json!({"cron": "0 0 29 2 *"})),
        (
            "once",
            json!({"every": "1h", "start_at": now + hour, "end_at": now + 2 * hour}),
        ),
    ] {
        let mut body = timing;
        body["id"] = json!(id);
        body["job"] = job.clone();
        let (status, answer) = post_json(&format!("{base}/v1/schedules"), body.clone()).await;
        assert_eq!(status, 201, "{body}: {answer}");
        assert_eq!(answer["state"], "active", "{answer}");
    }
    let (_, once) = get_json(&format!("{base}/v1/schedules/once")).await;
    assert_eq!(
        once["next_runs"].as_array().map(Vec::len),
        Some(1),
        "{once}"
    );

    // PATCH: new timing that can never fire is refused, the rest kept.
    let (_, before) = get_json(&format!("{base}/v1/schedules/leap")).await;
    for (patch, field) in &refused {
        let (status, answer) = send(
            reqwest::Method::PATCH,
            &format!("{base}/v1/schedules/leap"),
            Some(patch.clone()),
        )
        .await;
        assert_eq!(status, 400, "{patch}: {answer}");
        assert_eq!(answer["error"]["field"], *field, "{patch}: {answer}");
    }
    let (_, after) = get_json(&format!("{base}/v1/schedules/leap")).await;
    assert_eq!(after, before, "a refused PATCH changed the schedule");

    // A schedule that ends after a few fire times: once it has ended, its
    // re-create (a client's retry) is still the identical schedule. Its
    // window is wide enough for a create slowed by a loaded machine (the
    // create is refused if it takes 7 s).
    let now = chrono::Utc::now().timestamp_millis();
    let short = json!({"id": "short", "every": "1s", "end_at": now + 8_000, "job": job});
    let (status, answer) = post_json(&format!("{base}/v1/schedules"), short.clone()).await;
    assert_eq!(status, 201, "{answer}");
    crate::support::wait_until("`short` ends", Duration::from_secs(30), || async {
        get_json(&format!("{base}/v1/schedules/short")).await.1["state"] == "ended"
    })
    .await;
    let (status, answer) = post_json(&format!("{base}/v1/schedules"), short).await;
    assert_eq!(status, 200, "the re-create of an ended schedule: {answer}");
    assert_eq!(answer["state"], "ended", "{answer}");
    // And its template may still change (its timing stays as it was).
    let (status, answer) = send(
        reqwest::Method::PATCH,
        &format!("{base}/v1/schedules/short"),
        Some(json!({"overlap": "skip"})),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    daemon.stop().await.expect("clean stop");
}

/// A job held behind its ordering key shows which job holds the key
/// (`held_by`, the first of the key's unfinished jobs, whoever is just
/// ahead) and until when (`waiting_until`, the holder's due time), null
/// once the holder is due and in flight; the holder's own view has neither.
#[tokio::test]
async fn a_held_job_shows_which_job_holds_its_key_and_until_when() {
    let redis = RedisServer::start();
    let hanging = HangingHost::start().await;
    let receiver = Receiver::with_status(200).await;
    let mut config = test_config(&redis);
    // The holder's attempt hangs for this long: long enough to read the
    // views while it is in flight.
    config.delivery.timeout = Duration::from_secs(30);
    config.delivery.max_timeout = Duration::from_secs(30);
    config.validate().expect("valid config");
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let jobs = format!("{base}/v1/jobs");
    let a = post_created(
        &jobs,
        json!({"id": "a", "url": hanging.url("/a"), "ordering_key": "k", "delay": "1h"}),
    )
    .await;
    let run_at = a["next_attempt_at"]
        .as_str()
        .expect("a's due time")
        .to_string();
    for id in ["b", "c"] {
        post_created(
            &jobs,
            json!({"id": id, "url": receiver.url("/"), "ordering_key": "k"}),
        )
        .await;
    }

    let b = job_view(&base, "b").await;
    assert_eq!(b["waiting_for"], "a", "{b}");
    assert_eq!(b["held_by"], "a", "{b}");
    assert_eq!(b["waiting_until"], run_at.as_str(), "{b}");
    let c = job_view(&base, "c").await;
    assert_eq!(c["waiting_for"], "b", "{c}");
    assert_eq!(c["held_by"], "a", "{c}");
    assert_eq!(c["waiting_until"], run_at.as_str(), "{c}");
    let a = job_view(&base, "a").await;
    assert!(
        a.get("held_by").is_none() && a.get("waiting_until").is_none(),
        "{a}"
    );

    // The holder made due now: in flight (its host hangs), it holds the
    // key with no due time to wait for.
    let (status, answer) = send(
        reqwest::Method::PATCH,
        &format!("{base}/v1/jobs/a"),
        Some(json!({"delay": "0s"})),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    crate::wait_state(&base, "a", "inflight").await;
    let b = job_view(&base, "b").await;
    assert_eq!(b["held_by"], "a", "{b}");
    assert_eq!(b.get("waiting_until"), Some(&Value::Null), "{b}");
    assert_eq!(receiver.count(), 0, "a held job was delivered");
    daemon.stop().await.expect("clean stop");
}

/// `GET /v1/dead-letters` over jobs with large bodies answers small pages
/// without the bodies, pages that end at the read cap and together list
/// every dead letter once; the one dead letter keeps its body. (Hosts, the
/// other listing, hold no body.)
#[tokio::test]
async fn a_dead_letter_listing_leaves_bodies_out_and_stops_at_the_byte_cap() {
    let redis = RedisServer::start();
    let failing = Receiver::with_status(500).await;
    let mut config = test_config(&redis);
    // Every job fails once and is dead: no breaker in the way.
    config.breaker.failures = 0;
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let blob = "x".repeat(BIG_BODY);
    for i in 0..BIG_ITEMS {
        post_created(
            &format!("{base}/v1/jobs"),
            json!({"id": format!("dead-{i}"), "url": failing.url("/x"), "retry": [],
                "body": {"blob": blob}}),
        )
        .await;
    }
    crate::wait_until_idle(&base, Duration::from_secs(60)).await;

    let mut seen = BTreeMap::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut url = format!("{base}/v1/dead-letters?limit=1000");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let response = reqwest::get(&url).await.expect("GET /v1/dead-letters");
        let status = response.status();
        let text = response.text().await.expect("page body");
        assert_eq!(status, 200, "{url}: {}", &text[..text.len().min(300)]);
        assert!(
            text.len() < SMALL_PAGE,
            "a page of the dead-letter listing holds {} bytes",
            text.len()
        );
        assert!(
            !text.contains("xxxx"),
            "a listed dead letter shows its body"
        );
        let page: Value = serde_json::from_str(&text).expect("JSON page");
        for dead in page["dead_letters"].as_array().expect("dead_letters") {
            let id = dead["id"].as_str().expect("id").to_string();
            *seen.entry(id).or_insert(0) += 1;
        }
        pages += 1;
        assert!(pages <= 64, "the listing does not end");
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    assert_eq!(seen.len(), BIG_ITEMS, "the pages missed dead letters");
    assert!(seen.values().all(|&n| n == 1), "listed twice: {seen:?}");
    assert!(
        pages > BIG_ITEMS * BIG_BODY / PAGE_READ_BYTES,
        "{pages} pages: the listing read past its byte cap"
    );
    let (status, one) = get_json(&format!("{base}/v1/dead-letters/dead-0")).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(
        one["job"]["body"]["blob"].as_str().map(str::len),
        Some(BIG_BODY)
    );
    daemon.stop().await.expect("clean stop");
}

/// Pages of ready and of in-flight jobs (read from the ready lists and the
/// lease set by position) follow each other: paged two at a time, every
/// job is listed once, of every tenant's ready list too.
#[tokio::test]
async fn pages_of_ready_and_inflight_jobs_list_each_job_once() {
    use hookq::job::State;
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.redis.partitions = 1;
    let store = hookq::store::Store::connect(&config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    // No daemon runs: due now, the jobs wait in their ready lists.
    for (i, tenant) in ["default", "default", "default", "billing", "billing"]
        .iter()
        .enumerate()
    {
        let input = hookq::job::JobInput {
            id: Some(format!("r-{i}")),
            url: Some("http://127.0.0.1:9/x".into()),
            ..hookq::job::JobInput::default()
        };
        let mut job = input.validate(&config).expect("valid").new_job(&config);
        job.id = hookq::tenant::internal_id(tenant, &job.id);
        store.enqueue(&job).await.expect("enqueue");
    }
    let pages = |state: State| {
        let store = store.clone();
        async move {
            let listed = crate::list_every_page(&store, state, 2).await;
            listed.into_iter().map(|r| r.id).collect::<Vec<_>>()
        }
    };
    let mut ready = pages(State::Ready).await;
    ready.sort();
    assert_eq!(ready, ["billing/r-3", "billing/r-4", "r-0", "r-1", "r-2"]);
    // The counts read every tenant's ready list too.
    assert_eq!(store.stats().await.expect("stats").ready, 5);
    assert_eq!(store.claim(0, 3).await.expect("claim").jobs.len(), 3);
    let mut inflight = pages(State::Inflight).await;
    inflight.sort();
    let listed = inflight.len();
    inflight.dedup();
    assert_eq!((listed, inflight.len()), (3, 3), "each once: {inflight:?}");
}
