//! The operator console (`/ui`) in a real headless Chromium over WebDriver,
//! against a real daemon, Redis and receivers: logging in (a wrong key says
//! so), a read key seeing everything and changing nothing (the page offers
//! no replay, and the server refuses one sent anyway), an admin key
//! replaying a dead letter from the page (the job is live again and is
//! delivered) and pausing a host, hostile bodies shown as text, the
//! overview chart moving while jobs are delivered, and Redis down shown as
//! such; tenants: a key bound to one sees it alone, the tenant filter lives
//! in the URL and every link and action names the item's tenant, and one
//! tenant's overview counts its own deliveries and attempts. Each page's screenshot goes to `target/screenshots/console-*.png`;
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
pub(crate) async fn log_in(browser: &Browser, base: &str, key: &str) {
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
    browser
        .wait_for("#main a[href='#/job/ord-1?tenant=default']")
        .await;
    let page = browser.eval("return document.body.innerText").await;
    let page = page.as_str().unwrap_or_default();
    assert!(
        page.contains("order-42") && page.contains("waiting for"),
        "{page}"
    );
    browser.screenshot(&screenshot_path("job-ordered")).await;

    // Dead letters offer a read key no replay; one sent anyway is refused.
    browser.goto(&format!("{base}/ui#/dead")).await;
    browser
        .wait_for("#dead a[href='#/job/xss-1?tenant=default']")
        .await;
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
        .wait_for("#schedules a[href='#/schedule/nightly?tenant=default']")
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

/// The text of the console's page (the header with the key, and the page).
async fn page_text(browser: &Browser) -> String {
    let text = browser.eval("return document.body.innerText").await;
    text.as_str().unwrap_or_default().to_string()
}

/// A key bound to `billing` sees only billing in the console: two tenants
/// have a job `same`, a dead letter and a schedule each (orders' ids and
/// URLs all say `orders`); the key's pages list billing's alone, the
/// tenant filter is fixed to billing, the overview has billing's row and
/// ledger only, and orders' job and schedule opened by URL (even naming
/// orders) show as not found.
#[tokio::test]
async fn a_key_bound_to_a_tenant_sees_only_its_tenant_in_the_console() {
    let redis = RedisServer::start();
    let (admin, admin_key) = new_key(&redis, "ops", "read,write,admin");
    let (bound, mut bound_key) = new_key(&redis, "billing-ops", "read,write,admin");
    bound_key.tenant = Some("billing".into());
    let mut config = test_config(&redis);
    config.api.keys = vec![admin_key, bound_key];
    config.breaker.failures = 0;
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let failing = Receiver::start(Arc::new(|_: &Recorded| Reply::status(500))).await;
    let jobs = format!("{base}/v1/jobs");
    for tenant in ["billing", "orders"] {
        let hook = failing.url(&format!("/{tenant}-hook"));
        post_created_with(
            &jobs,
            &admin,
            json!({"tenant": tenant, "id": "same", "url": hook, "delay": "1h",
                "body": {"who": format!("{tenant}-body")}}),
        )
        .await;
        post_created_with(
            &jobs,
            &admin,
            json!({"tenant": tenant, "id": format!("{tenant}-dead"), "url": hook, "retry": []}),
        )
        .await;
        post_created_with(
            &format!("{base}/v1/schedules"),
            &admin,
            json!({"tenant": tenant, "id": format!("{tenant}-nightly"), "cron": "0 3 * * *",
                "job": {"url": hook}}),
        )
        .await;
    }
    post_created_with(
        &jobs,
        &admin,
        json!({"tenant": "orders", "id": "orders-only", "url": failing.url("/orders-hook"), "delay": "1h"}),
    )
    .await;
    for tenant in ["billing", "orders"] {
        let dead = format!("{jobs}/{tenant}-dead?tenant={tenant}");
        wait_until(
            "the dead letters exist",
            Duration::from_secs(15),
            || async { get_json_with(&dead, &admin).await.1["state"] == "dead" },
        )
        .await;
    }

    let browser = Browser::start().await;
    log_in(&browser, &base, &bound).await;
    // The overview: billing's row and ledger (billing has one live job and
    // one dead letter; orders has two live).
    browser
        .wait_for("#tenants a[data-tenant=billing][href='#/jobs']")
        .await;
    browser
        .wait_text("#counts .card[data-count=live] .figure", |t| t == "1")
        .await;
    browser
        .wait_text("#counts .card[data-count=dead_lettered] .figure", |t| {
            t == "1"
        })
        .await;
    assert_eq!(
        browser
            .eval("return document.querySelectorAll('#tenants tbody tr').length")
            .await,
        json!(1)
    );
    let filter = browser
        .eval("const t = document.querySelector('select[name=tenant]'); return [t.disabled, t.value, t.options.length]")
        .await;
    assert_eq!(filter, json!([true, "billing", 1]), "the filter is fixed");
    let text = page_text(&browser).await;
    assert!(
        text.contains("tenant billing only") && !text.contains("orders"),
        "{text}"
    );
    browser.screenshot(&screenshot_path("tenant-bound")).await;
    // Naming orders in the URL changes nothing.
    browser
        .goto(&format!("{base}/ui#/overview?tenant=orders"))
        .await;
    browser
        .wait_text("#counts .card[data-count=live] .figure", |t| t == "1")
        .await;
    browser.wait_for("#tenants a[data-tenant=billing]").await;
    let text = page_text(&browser).await;
    assert!(!text.contains("orders"), "{text}");

    // Jobs, dead letters and schedules: billing's alone.
    // (page, its list, a link to billing's item, billing's rows).
    let pages = [
        ("jobs", "#jobs", "#/job/same?tenant=billing", 2),
        ("dead", "#dead", "#/job/billing-dead?tenant=billing", 1),
        (
            "schedules",
            "#schedules",
            "#/schedule/billing-nightly?tenant=billing",
            1,
        ),
    ];
    for (page, list, link, rows) in pages {
        for hash in [format!("#/{page}"), format!("#/{page}?tenant=orders")] {
            browser.goto(&format!("{base}/ui{hash}")).await;
            browser.wait_for(&format!("{list} a[href='{link}']")).await;
            let text = page_text(&browser).await;
            assert!(!text.contains("orders"), "{hash}: {text}");
            assert_eq!(
                browser
                    .eval(&format!(
                        "return document.querySelectorAll('{list} tbody tr').length"
                    ))
                    .await,
                json!(rows),
                "{hash}: {text}"
            );
        }
    }

    // Orders' job and schedule opened by URL are not found; `same` opened
    // naming orders is billing's.
    for hash in [
        "#/job/orders-only",
        "#/job/orders-only?tenant=orders",
        "#/schedule/orders-nightly?tenant=orders",
    ] {
        browser.goto(&format!("{base}/ui{hash}")).await;
        browser
            .wait_text("#not-found", |t| t.contains("tenant billing"))
            .await;
        let text = page_text(&browser).await;
        assert!(!text.contains("Refused"), "{hash}: {text}");
    }
    browser
        .goto(&format!("{base}/ui#/job/same?tenant=orders"))
        .await;
    let body = browser.wait_text("#body", |t| !t.is_empty()).await;
    assert!(body.contains("billing-body"), "{body}");
    let text = page_text(&browser).await;
    assert!(!text.contains("orders"), "{text}");

    // Hosts are shared: listed, but pausing one (an admin key without a
    // tenant) is not offered to this admin key.
    browser.goto(&format!("{base}/ui#/hosts")).await;
    let host = format!("http://{}", failing.addr());
    browser
        .wait_text("#hosts", |t| t.contains(host.as_str()))
        .await;
    assert!(!browser.exists("#hosts button").await);
    daemon.stop().await.expect("clean stop");
}

/// With a key bound to no tenant (here the open API) the tenant filter
/// narrows the jobs list, lives in the URL (a reload keeps it), and every
/// link and action names the item's tenant: billing and orders have a job
/// `same` (so has `default`), a dead letter `lost` and a schedule `nightly`
/// each; the console opens (with its body) and cancels orders' job, replays orders' dead letter, deletes billing's and
/// pauses orders' schedule, and billing's (or orders') twin is untouched
/// each time; a replay of dead letters of both tenants picked together
/// revives each. The overview lists every tenant's ledger, each name linking
/// to its jobs.
#[tokio::test]
async fn the_tenant_filter_narrows_the_console_and_acts_on_the_right_tenant() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.breaker.failures = 0;
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    // The receiver fails the first request to each path, then takes them.
    let failed = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let seen = failed.clone();
    let receiver = Receiver::start(Arc::new(move |r: &Recorded| {
        if seen.lock().expect("lock").insert(r.path.clone()) {
            Reply::status(500)
        } else {
            Reply::status(204)
        }
    }))
    .await;
    let jobs = format!("{base}/v1/jobs");
    let created = |body: serde_json::Value| {
        let url = if body.get("cron").is_some() {
            format!("{base}/v1/schedules")
        } else {
            jobs.clone()
        };
        async move {
            let (status, answer) = crate::post_json(&url, body).await;
            assert_eq!(status, 201, "{answer}");
        }
    };
    for tenant in ["billing", "orders"] {
        let hook = receiver.url(&format!("/{tenant}"));
        created(
            json!({"tenant": tenant, "id": "same", "url": hook, "delay": "1h",
            "body": {"who": format!("{tenant}-body")}}),
        )
        .await;
        created(
            json!({"tenant": tenant, "id": "lost", "url": format!("{hook}/lost"), "retry": []}),
        )
        .await;
        created(
            json!({"tenant": tenant, "id": "nightly", "cron": "0 3 * * *", "job": {"url": hook}}),
        )
        .await;
    }
    created(json!({"tenant": "orders", "id": "orders-2", "url": receiver.url("/orders"), "delay": "1h"}))
        .await;
    // The default tenant has a `same` too: a link that loses its tenant
    // opens this one.
    created(
        json!({"id": "same", "url": receiver.url("/default"), "delay": "1h",
        "body": {"who": "default-body"}}),
    )
    .await;
    created(json!({"id": "plain", "url": receiver.url("/default"), "delay": "1h"})).await;
    let state = |tenant: &'static str, path: &'static str| {
        let url = format!("{base}/v1/{path}?tenant={tenant}");
        async move { crate::get_json(&url).await }
    };
    for tenant in ["billing", "orders"] {
        wait_until(
            "the dead letters exist",
            Duration::from_secs(15),
            || async { state(tenant, "jobs/lost").await.1["state"] == "dead" },
        )
        .await;
    }

    let browser = Browser::start().await;
    let listed = |want: &'static [&'static str], not: &'static [&'static str]| {
        move |text: &str| {
            want.iter().all(|w| text.contains(w)) && !not.iter().any(|n| text.contains(n))
        }
    };
    // Every tenant's jobs, then orders' alone, chosen on the page.
    browser.goto(&format!("{base}/ui#/jobs")).await;
    browser
        .wait_text("#jobs", listed(&["plain", "orders-2", "billing"], &[]))
        .await;
    browser
        .wait_for("select[name=tenant] option[value=orders]")
        .await;
    browser
        .eval("const t = document.querySelector('select[name=tenant]'); t.value = 'orders'; t.dispatchEvent(new Event('change')); return null")
        .await;
    browser
        .wait_text(
            "#jobs",
            listed(&["orders-2", "same"], &["plain", "billing"]),
        )
        .await;
    wait_until("the tenant is in the URL", Duration::from_secs(10), || {
        let browser = &browser;
        async move { browser.eval("return location.hash").await == json!("#/jobs?tenant=orders") }
    })
    .await;
    browser.eval("location.reload(); return null").await;
    browser
        .wait_text(
            "#jobs",
            listed(&["orders-2", "same"], &["plain", "billing"]),
        )
        .await;
    browser
        .wait_text("select[name=tenant] option:checked", |t| t == "orders")
        .await;
    browser.screenshot(&screenshot_path("jobs-tenant")).await;
    // The filter follows to the other list pages (hosts are every tenant's).
    let nav = browser
        .eval("return [...document.querySelectorAll('#nav a')].map((a) => a.getAttribute('href'))")
        .await;
    assert_eq!(
        nav,
        json!([
            "#/overview?tenant=orders",
            "#/jobs?tenant=orders",
            "#/dead?tenant=orders",
            "#/hosts",
            "#/schedules?tenant=orders"
        ])
    );

    // Orders' `same` from the list: its body; cancelled from its page,
    // billing's `same` stays scheduled.
    browser
        .click("#jobs a[href='#/job/same?tenant=orders']")
        .await;
    let body = browser.wait_text("#body", |t| !t.is_empty()).await;
    assert!(body.contains("orders-body"), "{body}");
    browser.click("#cancel").await;
    wait_until(
        "orders' same is cancelled",
        Duration::from_secs(10),
        || async { state("orders", "jobs/same").await.1["state"] == "cancelled" },
    )
    .await;
    assert_eq!(state("billing", "jobs/same").await.1["state"], "scheduled");
    // The page shows it cancelled (before the test moves on).
    browser
        .wait_text("#main table", |t| t.contains("cancelled"))
        .await;

    // The overview: every tenant's ledger; billing's name opens its jobs.
    browser.goto(&format!("{base}/ui#/overview")).await;
    for tenant in ["billing", "default", "orders"] {
        browser
            .wait_for(&format!(
                "#tenants a[data-tenant={tenant}][href='#/jobs?tenant={tenant}']"
            ))
            .await;
    }
    browser.screenshot(&screenshot_path("tenants")).await;
    browser.click("#tenants a[data-tenant=billing]").await;
    browser
        .wait_text("#jobs", listed(&["same", "billing"], &["orders", "plain"]))
        .await;
    browser
        .click("#jobs a[href='#/job/same?tenant=billing']")
        .await;
    let body = browser.wait_text("#body", |t| !t.is_empty()).await;
    assert!(body.contains("billing-body"), "{body}");
    // One tenant's overview: its ledger (orders: created 3, one cancelled).
    browser
        .goto(&format!("{base}/ui#/overview?tenant=orders"))
        .await;
    browser
        .wait_text("#counts .card[data-count=cancelled] .figure", |t| t == "1")
        .await;
    browser
        .wait_text("#counts .card[data-count=created] .figure", |t| t == "3")
        .await;

    // Dead letters: orders' `lost` replayed (then delivered: its path
    // failed once already), billing's deleted; each twin untouched.
    browser
        .goto(&format!("{base}/ui#/dead?tenant=orders"))
        .await;
    browser
        .wait_for("#dead a[href='#/job/lost?tenant=orders']")
        .await;
    assert!(
        !browser
            .exists("#dead a[href='#/job/lost?tenant=billing']")
            .await
    );
    browser
        .click("input.pick[value=lost][data-tenant=orders]")
        .await;
    browser.click("#replay-selected").await;
    browser
        .wait_text("#report", |t| t.contains("Replayed 1"))
        .await;
    wait_until(
        "orders' lost is delivered",
        Duration::from_secs(15),
        || async { state("orders", "jobs/lost").await.1["state"] == "delivered" },
    )
    .await;
    assert_eq!(state("billing", "jobs/lost").await.1["state"], "dead");
    browser.goto(&format!("{base}/ui#/dead")).await;
    browser
        .click("#dead button.drop[data-tenant=billing]")
        .await;
    wait_until(
        "billing's dead letter is gone",
        Duration::from_secs(10),
        || async { state("billing", "dead-letters/lost").await.0 == 404 },
    )
    .await;

    // Schedules: orders' `nightly` paused; billing's stays active.
    browser
        .goto(&format!("{base}/ui#/schedules?tenant=orders"))
        .await;
    browser
        .wait_for("#schedules a[href='#/schedule/nightly?tenant=orders']")
        .await;
    assert!(
        !browser
            .exists("#schedules a[href='#/schedule/nightly?tenant=billing']")
            .await
    );
    browser
        .click("#schedules button.pause[data-tenant=orders]")
        .await;
    wait_until(
        "orders' nightly is paused",
        Duration::from_secs(10),
        || async { state("orders", "schedules/nightly").await.1["state"] == "paused" },
    )
    .await;
    assert_eq!(
        state("billing", "schedules/nightly").await.1["state"],
        "active"
    );
    browser
        .goto(&format!("{base}/ui#/schedule/nightly?tenant=orders"))
        .await;
    browser
        .wait_text("#main table", |t| {
            t.contains("orders") && t.contains("paused")
        })
        .await;

    // A selection spanning tenants (no filter) replays each tenant's own
    // (one request per tenant), the report naming them `<tenant>/<id>`.
    for tenant in ["billing", "orders"] {
        let hook = receiver.url(&format!("/{tenant}/twice"));
        created(json!({"tenant": tenant, "id": "twice", "url": hook, "retry": []})).await;
        wait_until("twice is dead", Duration::from_secs(15), || async {
            state(tenant, "jobs/twice").await.1["state"] == "dead"
        })
        .await;
    }
    browser.goto(&format!("{base}/ui#/dead")).await;
    for tenant in ["billing", "orders"] {
        browser
            .click(&format!("input.pick[value=twice][data-tenant={tenant}]"))
            .await;
    }
    browser.click("#replay-selected").await;
    let report = browser
        .wait_text("#report", |t| t.contains("Replayed 2"))
        .await;
    assert!(
        report.contains("billing/twice") && report.contains("orders/twice"),
        "{report}"
    );
    for tenant in ["billing", "orders"] {
        wait_until("twice is delivered", Duration::from_secs(15), || async {
            state(tenant, "jobs/twice").await.1["state"] == "delivered"
        })
        .await;
    }
    daemon.stop().await.expect("clean stop");
}

/// The overview of one tenant shows that tenant's deliveries and the
/// lateness of its attempts alone (the `tenant` label of this daemon's
/// `hookq_lateness_seconds`): an attempt of `console-loud` moves loud's
/// overview and leaves `console-quiet`'s saying no attempt started. (The
/// names are unique to this test: the metrics recorder, and with it the
/// histogram, is shared by every daemon of the test process.)
#[tokio::test]
async fn one_tenants_overview_shows_its_own_attempts_alone() {
    let redis = RedisServer::start();
    let daemon = start_daemon(&test_config(&redis)).await;
    let base = daemon.url();
    let receiver = Receiver::ok().await;
    let browser = Browser::start().await;
    let loud_job = |id: &'static str| {
        let jobs = format!("{base}/v1/jobs");
        let url = receiver.url("/loud");
        async move {
            let (status, body) = crate::post_json(
                &jobs,
                json!({"tenant": "console-loud", "id": id, "url": url}),
            )
            .await;
            assert_eq!(status, 201, "{body}");
            let job = format!("{jobs}/{id}?tenant=console-loud");
            wait_until(
                "the loud job is delivered",
                Duration::from_secs(15),
                || async { crate::get_json(&job).await.1["state"] == "delivered" },
            )
            .await;
        }
    };
    let points = || async {
        browser
            .eval("const svg = document.querySelector('svg.chart'); return svg ? Number(svg.dataset.points) : 0")
            .await
            .as_u64()
            .unwrap_or(0)
    };

    // Quiet's overview, open before loud's attempt and read twice after
    // it: each reading compares /metrics with one from up to 5 s before,
    // which predates the attempt (it started within the second before it
    // was seen delivered), so loud's attempt would show here if the page
    // counted every tenant's.
    browser
        .goto(&format!("{base}/ui#/overview?tenant=console-quiet"))
        .await;
    browser.wait_for("svg.chart").await;
    loud_job("loud-1").await;
    let seen = points().await;
    wait_until("two more readings", Duration::from_secs(10), || async {
        points().await >= seen + 2
    })
    .await;
    let lag = browser.text("#lag").await.unwrap_or_default();
    assert!(lag.contains("no attempt started"), "{lag}");
    browser
        .wait_text("#tenants", |t| {
            t.contains("console-quiet has had no job yet")
        })
        .await;
    assert_eq!(
        browser
            .text("#counts .card[data-count=delivered] .figure")
            .await,
        Some("0".to_string())
    );

    // Loud's overview shows its next attempt and both deliveries.
    browser
        .goto(&format!("{base}/ui#/overview?tenant=console-loud"))
        .await;
    browser.wait_for("svg.chart").await;
    loud_job("loud-2").await;
    browser.wait_text("#lag", |t| t.contains("p99 ≤")).await;
    browser
        .wait_text("#counts .card[data-count=delivered] .figure", |t| t == "2")
        .await;
    daemon.stop().await.expect("clean stop");
}
