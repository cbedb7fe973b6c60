//! The operator console (`/ui`) in a real headless Chromium over WebDriver,
//! against a real daemon, Redis and receivers: logging in (a wrong key says
//! so), a read key seeing everything and changing nothing (the page offers
//! no replay, and the server refuses one sent anyway), an admin key
//! replaying a dead letter from the page (the job is live again and is
//! delivered) and pausing a host, hostile bodies shown as text, the
//! overview chart moving while jobs are delivered, and Redis down shown as
//! such. Each page's screenshot goes to `target/screenshots/console-*.png`;
//! with `HOOKQ_SCREENSHOTS=docs` to `docs/console-*.png`, the pictures the
//! docs show (refreshed on purpose only, so a test run leaves the checkout
//! clean).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::security::new_key;
use crate::support::browser::Browser;
use crate::support::receiver::{Receiver, Recorded, Reply};
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{get_json_with, post_created_with, start_daemon, test_config};

/// What a job's body may try: run a script or an event handler.
const XSS_BODY: &str =
    r#"<script>window.__xss = 1</script>"><img src=x onerror="window.__xss = 2">"#;

fn screenshot_path(name: &str) -> PathBuf {
    let under = match std::env::var("HOOKQ_SCREENSHOTS").as_deref() {
        Ok("docs") => "docs",
        _ => "target/screenshots",
    };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(under);
    std::fs::create_dir_all(&dir).expect("the screenshot directory");
    dir.join(format!("console-{name}.png"))
}

/// Logs `browser` in to the console at `base` with `key`.
async fn log_in(browser: &Browser, base: &str, key: &str) {
    browser.goto(&format!("{base}/ui")).await;
    browser.type_into("#key", key).await;
    browser.click("#login button[type=submit]").await;
}

#[tokio::test]
async fn an_operator_looks_replays_and_pauses_from_the_console() {
    let mut redis = RedisServer::start();
    let (reader, read_key) = new_key(&redis, "support", "read");
    let (admin, admin_key) = new_key(&redis, "ops", "read,write,admin");
    let mut config = test_config(&redis);
    config.api.keys = vec![read_key, admin_key];
    config.breaker.failures = 0;
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    // The receiver fails the first request to /fails and takes the rest.
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let flaky = Receiver::start(Arc::new(move |r: &Recorded| {
        let failing = r.path.starts_with("/fails");
        if failing && counter.fetch_add(1, Ordering::SeqCst) == 0 {
            Reply::status(500)
        } else {
            Reply::status(204)
        }
    }))
    .await;
    let jobs = format!("{base}/v1/jobs");
    post_created_with(
        &jobs,
        &admin,
        json!({"id": "xss-1", "url": flaky.url("/fails"), "retry": [], "body_text": XSS_BODY,
            "content_type": "text/html", "headers": {"Authorization": "Bearer receiver-secret"}}),
    )
    .await;
    wait_until("xss-1 is dead", Duration::from_secs(15), || async {
        get_json_with(&format!("{jobs}/xss-1"), &admin).await.1["state"] == "dead"
    })
    .await;

    let browser = Browser::start().await;

    // A wrong key is told so.
    log_in(&browser, &base, "not-a-key-at-all").await;
    browser
        .wait_text("#login-error", |t| t.contains("not known"))
        .await;

    // A read key: the overview, the job with its hostile body as text.
    log_in(&browser, &base, &reader).await;
    browser.wait_for("#counts .card[data-count=dead]").await;
    browser
        .wait_text("#counts .card[data-count=dead] .figure", |t| t == "1")
        .await;
    browser.goto(&format!("{base}/ui#/job/xss-1")).await;
    let body = browser.wait_text("#body", |t| !t.is_empty()).await;
    assert_eq!(body, XSS_BODY, "the body shows as the text it is");
    assert_eq!(
        browser.eval("return window.__xss === undefined").await,
        json!(true)
    );
    assert_eq!(
        browser
            .eval("return document.querySelectorAll('#main img, #main script').length")
            .await,
        json!(0)
    );
    let page = browser.eval("return document.body.innerText").await;
    assert!(
        !page
            .as_str()
            .unwrap_or_default()
            .contains("receiver-secret"),
        "{page}"
    );
    browser.screenshot(&screenshot_path("job")).await;

    // A job held behind an earlier one of its ordering key links to it.
    for id in ["ord-1", "ord-2"] {
        post_created_with(
            &jobs,
            &admin,
            json!({"id": id, "url": flaky.url("/ok"), "delay": "1h", "ordering_key": "order-42"}),
        )
        .await;
    }
    browser.goto(&format!("{base}/ui#/job/ord-2")).await;
    browser.wait_for("#main a[href='#/job/ord-1']").await;
    let page = browser.eval("return document.body.innerText").await;
    let page = page.as_str().unwrap_or_default();
    assert!(
        page.contains("order-42") && page.contains("waiting for"),
        "{page}"
    );
    browser.screenshot(&screenshot_path("job-ordered")).await;

    // Dead letters offer a read key no replay; one sent anyway is refused.
    browser.goto(&format!("{base}/ui#/dead")).await;
    browser.wait_for("#dead a[href='#/job/xss-1']").await;
    assert!(!browser.exists("#replay-selected").await);
    assert!(!browser.exists("input.pick").await);
    let status = browser
        .eval_async(
            "const done = arguments[arguments.length - 1];
             fetch('/v1/dead-letters/replay', {method: 'POST', headers: {
               'Authorization': 'Bearer ' + sessionStorage.getItem('hookq.key'),
               'Content-Type': 'application/json'}, body: JSON.stringify({ids: ['xss-1']})})
               .then((r) => done(r.status));",
        )
        .await;
    assert_eq!(status, json!(403));
    assert_eq!(
        get_json_with(&format!("{jobs}/xss-1"), &admin).await.1["state"],
        "dead"
    );

    // An admin key replays it from the page: live again, then delivered.
    browser.click("#logout").await;
    log_in(&browser, &base, &admin).await;
    browser.wait_for("#counts .card").await;
    browser.goto(&format!("{base}/ui#/dead")).await;
    browser.click("input.pick[value='xss-1']").await;
    browser.click("#preview").await;
    browser
        .wait_text("#report", |t| t.contains("Would replay 1"))
        .await;
    browser.screenshot(&screenshot_path("dead-letters")).await;
    browser.click("#replay-selected").await;
    browser
        .wait_text("#report", |t| t.contains("Replayed 1"))
        .await;
    wait_until(
        "xss-1 is delivered after the replay",
        Duration::from_secs(15),
        || async {
            get_json_with(&format!("{jobs}/xss-1"), &admin).await.1["state"] == "delivered"
        },
    )
    .await;

    // The overview's chart moves while jobs are delivered.
    browser.goto(&format!("{base}/ui#/overview")).await;
    browser.wait_for("svg.chart").await;
    for i in 0..150 {
        post_created_with(
            &jobs,
            &admin,
            json!({"id": format!("flow-{i}"), "url": flaky.url("/ok"), "delay": format!("{}ms", i * 40)}),
        )
        .await;
    }
    // It moves: at least five seconds drawn, deliveries among them.
    wait_until("the chart shows deliveries", Duration::from_secs(20), || async {
        let drawn = browser
            .eval(
                "const svg = document.querySelector('svg.chart');
                 return svg ? [Number(svg.dataset.points), svg.querySelector('text').textContent] : [0, ''];",
            )
            .await;
        let points = drawn[0].as_u64().unwrap_or(0);
        let peak = drawn[1]
            .as_str()
            .and_then(|t| t.split("peak ").nth(1))
            .and_then(|t| t.split('/').next())
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0);
        points >= 5 && peak > 1.0
    })
    .await;
    browser.wait_text("#lag", |t| t.contains("p99 ≤")).await;
    browser.screenshot(&screenshot_path("overview")).await;

    // Schedules: listed with their next run, paused from the page; one
    // shows the jobs it fired.
    let schedules = format!("{base}/v1/schedules");
    post_created_with(
        &schedules,
        &admin,
        json!({"id": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin",
            "job": {"url": flaky.url("/ok")}}),
    )
    .await;
    post_created_with(
        &schedules,
        &admin,
        json!({"id": "tick", "every": "1s", "job": {"url": flaky.url("/ok")}}),
    )
    .await;
    browser.goto(&format!("{base}/ui#/schedules")).await;
    browser
        .wait_for("#schedules a[href='#/schedule/nightly']")
        .await;
    browser
        .click("#schedules button.pause[data-schedule='nightly']")
        .await;
    wait_until("nightly is paused", Duration::from_secs(10), || async {
        get_json_with(&format!("{schedules}/nightly"), &admin)
            .await
            .1["state"]
            == "paused"
    })
    .await;
    browser
        .wait_for("#schedules button.resume[data-schedule='nightly']")
        .await;
    browser.screenshot(&screenshot_path("schedules")).await;
    browser.goto(&format!("{base}/ui#/schedule/tick")).await;
    browser.wait_for("#main a[href^='#/job/tick']").await;
    let runs = browser
        .eval("return document.querySelectorAll('#next-runs li').length")
        .await;
    assert_eq!(runs, json!(5));
    browser.screenshot(&screenshot_path("schedule")).await;
    let _ = reqwest::Client::new()
        .delete(format!("{schedules}/tick"))
        .bearer_auth(&admin)
        .send()
        .await;

    // Jobs by state, then a host paused from the page.
    browser.goto(&format!("{base}/ui#/jobs")).await;
    browser.click("#main form button[type=submit]").await;
    browser.wait_for("#jobs a[href^='#/job/']").await;
    browser.screenshot(&screenshot_path("jobs")).await;
    browser.goto(&format!("{base}/ui#/hosts")).await;
    browser.click("#hosts button.pause").await;
    let host = format!("http://{}", flaky.addr());
    wait_until("the host is paused", Duration::from_secs(10), || async {
        let (_, hosts) = get_json_with(&format!("{base}/v1/hosts"), &admin).await;
        hosts["hosts"].as_array().is_some_and(|h| {
            h.iter()
                .any(|h| h["host"] == host.as_str() && h["state"] == "paused")
        })
    })
    .await;
    browser.wait_for("#hosts button.resume").await;
    browser.screenshot(&screenshot_path("hosts")).await;

    // Redis down: the console says so.
    browser.goto(&format!("{base}/ui#/overview")).await;
    browser.wait_for("#counts .card").await;
    redis.kill();
    browser
        .wait_text("#banner", |t| t.contains("Redis is down"))
        .await;
    browser.screenshot(&screenshot_path("redis-down")).await;
    assert!(seen.load(Ordering::SeqCst) >= 2);
    daemon.stop().await.expect("clean stop");
}

/// The page and its assets carry a policy that forbids inline script.
#[tokio::test]
async fn the_console_is_served_with_a_strict_policy() {
    let redis = RedisServer::start();
    let daemon = start_daemon(&test_config(&redis)).await;
    for path in ["/ui", "/ui/app.js", "/ui/app.css"] {
        let response = reqwest::get(format!("{}{path}", daemon.url()))
            .await
            .expect("GET");
        assert_eq!(response.status(), 200, "{path}");
        let csp = response.headers()["content-security-policy"]
            .to_str()
            .expect("ascii")
            .to_string();
        assert!(
            csp.contains("script-src 'self'") && !csp.contains("unsafe"),
            "{csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert_eq!(response.headers()["x-content-type-options"], "nosniff");
        let text = response.text().await.expect("text");
        for writes_html in [
            ".innerHTML =",
            ".outerHTML =",
            "insertAdjacentHTML",
            "document.write(",
        ] {
            assert!(
                !text.contains(writes_html),
                "{path} writes HTML: {writes_html}"
            );
        }
    }
    daemon.stop().await.expect("clean stop");
}

/// The jobs page's filters live in the URL: a link with them opens the
/// filtered list (before, `#/jobs?state=…` opened the overview), a filter
/// chosen on the page goes into the URL, and a reload keeps it.
#[tokio::test]
async fn the_jobs_filters_live_in_the_url() {
    let redis = RedisServer::start();
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    for (id, topic) in [("filter-a", "alpha"), ("filter-b", "beta")] {
        let (status, body) = crate::post_json(
            &format!("{base}/v1/jobs"),
            json!({"id": id, "topic": topic, "url": "http://127.0.0.1:9/", "delay": "1h"}),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    let browser = Browser::start().await;
    let listed = |want: &'static str, not: &'static str| {
        move |text: &str| text.contains(want) && !text.contains(not)
    };

    browser
        .goto(&format!("{base}/ui#/jobs?state=scheduled&topic=alpha"))
        .await;
    browser
        .wait_text("#jobs", listed("filter-a", "filter-b"))
        .await;
    let chosen = browser
        .eval("return [document.querySelector('select[name=state]').value, document.querySelector('input[name=topic]').value]")
        .await;
    assert_eq!(chosen, json!(["scheduled", "alpha"]));

    browser
        .eval("const t = document.querySelector('input[name=topic]'); t.value = 'beta'; t.form.requestSubmit(); return null")
        .await;
    browser
        .wait_text("#jobs", listed("filter-b", "filter-a"))
        .await;
    wait_until("the filter is in the URL", Duration::from_secs(10), || {
        let browser = &browser;
        async move {
            browser.eval("return location.hash").await == json!("#/jobs?state=scheduled&topic=beta")
        }
    })
    .await;

    browser.eval("location.reload(); return null").await;
    browser
        .wait_text("#jobs", listed("filter-b", "filter-a"))
        .await;
    daemon.stop().await.expect("clean stop");
}
