//! Listings and the holes of the second security review that concern them
//! (SPEC §14 "Second review", §12, §11.5): a schedule listing leaves its
//! templates' bodies out and stops at the page byte cap, a schedule that
//! can never fire is refused, and a job held behind its ordering key shows
//! which job holds the key and until when.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::support::redis::RedisServer;
use crate::{get_json, post_json, start_daemon, test_config};

/// The bytes of stored records one listing page reads before it ends early
/// with a cursor (`PAGE_READ_BYTES` in src/store/listing.rs, 8 MiB, the cap
/// the README documents).
const PAGE_READ_BYTES: usize = 8 << 20;

/// A large template body: with [`BIG_SCHEDULES`] of them, more than a page's
/// read cap is stored, and each still fits the 1 MiB `api.max_body`.
const BIG_BODY: usize = 800_000;

/// Schedules with a [`BIG_BODY`] template: 9.6 MB, more than
/// [`PAGE_READ_BYTES`] (a bounded load: 12 creates of under 1 MB).
const BIG_SCHEDULES: usize = 12;

/// A listing page without bodies: about 1 KB per schedule shown, so a page
/// of [`BIG_SCHEDULES`] stays far under this; one body alone is 12 times it.
const SMALL_PAGE: usize = 64 * 1024;

/// `GET /v1/schedules` over templates with large bodies answers small pages
/// without the bodies, pages that end at the read cap and together list
/// every schedule once; the one schedule's view keeps its body.
#[tokio::test]
async fn a_schedule_listing_leaves_bodies_out_and_stops_at_the_byte_cap() {
    const { assert!(BIG_SCHEDULES * BIG_BODY > PAGE_READ_BYTES) };
    let redis = RedisServer::start();
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let blob = "x".repeat(BIG_BODY);
    for i in 0..BIG_SCHEDULES {
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
    assert_eq!(seen.len(), BIG_SCHEDULES, "the pages missed schedules");
    assert!(seen.values().all(|&n| n == 1), "listed twice: {seen:?}");
    // 9.6 MB of schedules cannot be read by one page of an 8 MiB cap.
    assert!(
        pages > BIG_SCHEDULES * BIG_BODY / PAGE_READ_BYTES,
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
