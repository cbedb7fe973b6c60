//! hookq's integration tests: one binary, a module per area. Every test owns a
//! real `redis-server` on a private port and real HTTP receivers on loopback,
//! and runs the daemon in-process on `127.0.0.1:0`.

mod support;

mod abuse;
mod ahead;
mod api;
mod chaos;
mod cluster;
mod console;
mod crash;
mod delivery;
mod docs;
mod engine;
mod fairness;
mod fleet;
mod footprint;
mod functions;
mod guards;
mod hardening;
mod history;
mod hosts;
mod image;
mod inflight;
mod inputs;
mod ledger;
mod listings;
mod metrics;
mod migrate;
mod ops;
mod ordering;
mod rounds;
mod run_script;
mod schedules;
mod security;
mod telemetry;
mod tenants;
mod timers;

use std::time::Duration;

use hookq::config::Config;
use hookq::daemon::Daemon;
use hookq::job::JobInput;
use support::redis::RedisServer;

/// A config for tests: the given Redis, private targets allowed, an API on a
/// free port, and short timeouts and ladders.
pub fn test_config(redis: &RedisServer) -> Config {
    let mut config = Config::default();
    config.redis.url = redis.url();
    config.redis.partitions = 4;
    config.api.listen = "127.0.0.1:0".into();
    config.delivery.allow_private = true;
    config.delivery.timeout = Duration::from_secs(2);
    config.delivery.max_timeout = Duration::from_secs(5);
    config.delivery.lease_margin = Duration::from_millis(300);
    config.delivery.retry = vec![Duration::from_millis(50), Duration::from_millis(100)];
    config.delivery.shutdown_grace = Duration::from_secs(2);
    config.validate().expect("test config is valid");
    config
}

/// The test config with `partitions` partitions, and a store on it with
/// its scripts loaded.
pub async fn partitioned_store(
    redis: &RedisServer,
    partitions: u16,
) -> (Config, hookq::store::Store) {
    let mut config = test_config(redis);
    config.redis.partitions = partitions;
    config.validate().expect("valid config");
    let store = hookq::store::Store::connect(&config).await.expect("store");
    store.load_scripts().await.expect("scripts");
    (config, store)
}

/// A size knob for the long variant of a test: the number in environment
/// variable `name`, or `default` (the short run of the normal suite).
pub fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Starts a daemon with `config`.
pub async fn start_daemon(config: &Config) -> Daemon {
    support::init_tracing();
    Daemon::start(config.clone()).await.expect("daemon starts")
}

/// POSTs `body` to `url` and returns the status and the JSON answer.
pub async fn post_json(url: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let response = reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .expect("request is sent");
    let status = response.status().as_u16();
    let json = response.json().await.unwrap_or(serde_json::Value::Null);
    (status, json)
}

/// GETs `url` and returns the status and the JSON answer.
pub async fn get_json(url: &str) -> (u16, serde_json::Value) {
    let response = reqwest::get(url).await.expect("request is sent");
    let status = response.status().as_u16();
    let json = response.json().await.unwrap_or(serde_json::Value::Null);
    (status, json)
}

/// The view of job `id` (`GET /v1/jobs/{id}`) on the daemon at `base`;
/// `Null` when the answer is not JSON.
pub async fn job_view(base: &str, id: &str) -> serde_json::Value {
    get_json(&format!("{base}/v1/jobs/{id}")).await.1
}

/// The `/metrics` text of the daemon at `base`.
pub async fn metrics_text(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text")
}

/// Every key of the Redis with its DUMP, to prove a request changed nothing;
/// the fleet's membership (`hookq:fleet`, which the daemons' heartbeats
/// rewrite every second) is left out.
pub async fn redis_snapshot(redis: &RedisServer) -> std::collections::BTreeMap<String, Vec<u8>> {
    use redis::AsyncCommands;
    let mut conn = redis.conn().await;
    let keys: Vec<String> = conn.keys("*").await.expect("KEYS");
    let mut out = std::collections::BTreeMap::new();
    for key in keys.into_iter().filter(|k| k != "hookq:fleet") {
        let dump: Vec<u8> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("DUMP");
        out.insert(key, dump);
    }
    out
}

/// GETs `url` with bearer `token` and returns the status and the JSON answer.
pub async fn get_json_with(url: &str, token: &str) -> (u16, serde_json::Value) {
    let response = reqwest::Client::new()
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .expect("request is sent");
    let status = response.status().as_u16();
    let json = response.json().await.unwrap_or(serde_json::Value::Null);
    (status, json)
}

/// POSTs a create to `url` with bearer `token`, asserts it answered 201.
pub async fn post_created_with(url: &str, token: &str, body: serde_json::Value) {
    let response = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("request is sent");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    assert_eq!(status, 201, "create {body} answered {status}: {text}");
}

/// POSTs a create to `url`, asserts it answered 201 Created, and returns the
/// job view.
pub async fn post_created(url: &str, body: serde_json::Value) -> serde_json::Value {
    let (status, answer) = post_json(url, body.clone()).await;
    assert_eq!(status, 201, "create {body} answered {status}: {answer}");
    answer
}

/// The sum of every sample of the Prometheus series `name` (all label sets)
/// in a `/metrics` text; 0 when the series is absent.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |sum, v| sum + v)
}

/// Waits until `GET /v1/stats` shows no job scheduled, ready or in flight:
/// no attempt can start any more, and no lease is left to expire.
pub async fn wait_until_idle(base: &str, deadline: Duration) {
    support::wait_until(
        "no job is scheduled, ready or in flight",
        deadline,
        || async {
            let (status, stats) = get_json(&format!("{base}/v1/stats")).await;
            status == 200
                && stats["scheduled"] == 0
                && stats["ready"] == 0
                && stats["inflight"] == 0
        },
    )
    .await;
}

/// Runs `command` (stdin closed, stdout and stderr captured) and returns its
/// output; panics, killing it, if it has not exited within `deadline`.
pub fn output_within(
    mut command: std::process::Command,
    deadline: Duration,
) -> std::process::Output {
    use std::process::Stdio;
    let what = format!("{:?}", command.get_program());
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what} does not start: {e}"));
    wait_output_within(child, deadline, &what)
}

/// Waits for `child` and collects its output; panics, killing it, if it has
/// not exited within `deadline` (`what` names it in the message).
pub fn wait_output_within(
    child: std::process::Child,
    deadline: Duration,
    what: &str,
) -> std::process::Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(deadline) {
        Ok(output) => output.unwrap_or_else(|e| panic!("waiting for {what}: {e}")),
        Err(_) => {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("{what} did not exit within {deadline:?}");
        }
    }
}

/// Creates a job straight through `store`, as another daemon or the CLI
/// would; panics if it is invalid or Redis refuses it.
pub async fn enqueue_direct(store: &hookq::store::Store, config: &Config, input: JobInput) {
    let job = input.validate(config).expect("valid job");
    store.enqueue(&job.new_job(config)).await.expect("enqueue");
}

/// Creates job `id`, due at `due_ms` (Redis epoch ms), to a URL that is
/// never reached, straight through `store` (see [`enqueue_direct`]).
pub async fn enqueue_at(store: &hookq::store::Store, config: &Config, id: &str, due_ms: i64) {
    let input = JobInput {
        id: Some(id.into()),
        url: Some("http://127.0.0.1:9/never".into()),
        run_at: Some(hookq::job::RunAt::Millis(due_ms)),
        ..JobInput::default()
    };
    enqueue_direct(store, config, input).await;
}

/// Claims job `id` (due now) through `store`, as a daemon would, and
/// returns its claim; panics if the job is not claimed.
pub async fn claim_direct(store: &hookq::store::Store, id: &str) -> hookq::store::Claimed {
    claim_in(store, store.keys().partition_of(id), id).await
}

/// Claims job `id` of partition `p` (a fired job lives in its schedule's
/// partition, not its id's); panics if it is not claimed.
pub async fn claim_in(store: &hookq::store::Store, p: u16, id: &str) -> hookq::store::Claimed {
    store
        .claim(p, 100)
        .await
        .expect("claim")
        .jobs
        .into_iter()
        .find(|j| j.id == id)
        .expect("the job is claimed")
}

/// Waits (15 s at most) until job `id` on the daemon at `base` is in
/// `state`, and returns its view.
pub async fn wait_state(base: &str, id: &str, state: &str) -> serde_json::Value {
    support::wait_until(
        &format!("{id} is {state}"),
        Duration::from_secs(15),
        || async { job_view(base, id).await["state"] == state },
    )
    .await;
    job_view(base, id).await
}

/// Every job in `state` that `store` lists, page after page of `limit`
/// (following each `next_cursor`), in the order listed; panics if paging
/// has not ended after 10,000 pages.
pub async fn list_every_page(
    store: &hookq::store::Store,
    state: hookq::job::State,
    limit: usize,
) -> Vec<hookq::store::record::JobRecord> {
    let mut listed = Vec::new();
    let mut cursor = None;
    for _ in 0..10_000 {
        let page = store
            .list_jobs(None, Some(state), None, limit, cursor)
            .await
            .expect("a page");
        listed.extend(page.items);
        let Some(next) = page.next_cursor else {
            return listed;
        };
        cursor = Some(
            hookq::store::listing::Cursor::parse(
                &next,
                store.keys().partitions(),
                hookq::store::listing::CursorKind::Jobs,
                "cursor",
            )
            .expect("a cursor the store made"),
        );
    }
    let ids: Vec<&str> = listed.iter().map(|r| r.id.as_str()).collect();
    panic!("paging did not end: {ids:?}");
}
