//! The lateness scenarios' receiver: this same binary re-executed with
//! `--sink PORT` ([`run_sink`], a separate process), which counts requests
//! and records each body's receive − due; [`Sink`] starts it, reads it and
//! kills it on drop.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::support::free_port;
use crate::Res;

/// The wall clock in µs since the Unix epoch (0 before it), for the sink's
/// lateness samples; [`now_ms`](hookq::job::now_ms) is the crate's, in ms.
fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// What the sink has seen since its last reset.
#[derive(Default)]
struct SinkState {
    count: u64,
    first_ms: i64,
    last_ms: i64,
    /// receive − due (ms), for jobs whose body carries `due`.
    lateness: Vec<i64>,
}

/// The sink process's server (`--sink PORT`): counts every request and, for
/// bodies with a `due` field (ms), records receive − due in µs.
pub async fn run_sink(port: u16) -> Res<()> {
    use axum::body::Bytes;
    use axum::extract::State;
    use axum::routing::{get, post};
    let state = Arc::new(Mutex::new(SinkState::default()));
    let app = axum::Router::new()
        .route(
            "/count",
            get(|State(s): State<Arc<Mutex<SinkState>>>| async move {
                s.lock().map(|g| g.count).unwrap_or_default().to_string()
            }),
        )
        .route(
            "/stats",
            get(|State(s): State<Arc<Mutex<SinkState>>>| async move {
                let s = s.lock().map(|g| json!({"count": g.count, "first_ms": g.first_ms, "last_ms": g.last_ms, "lateness": g.lateness})).unwrap_or_default();
                axum::Json(s)
            }),
        )
        .route(
            "/reset",
            post(|State(s): State<Arc<Mutex<SinkState>>>| async move {
                if let Ok(mut g) = s.lock() {
                    *g = SinkState::default();
                }
                "ok"
            }),
        )
        .fallback(|State(s): State<Arc<Mutex<SinkState>>>, body: Bytes| async move {
            let received_us = now_us();
            let received = received_us / 1000;
            let due = serde_json::from_slice::<Value>(&body).ok().and_then(|v| v["due"].as_i64());
            if let Ok(mut g) = s.lock() {
                g.count += 1;
                if g.first_ms == 0 {
                    g.first_ms = received;
                }
                g.last_ms = received;
                if let Some(due) = due {
                    // Microseconds: the lateness bars are a few ms.
                    g.lateness.push(received_us - due * 1000);
                }
            }
            "ok"
        })
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    axum::serve(listener, app).await?;
    Ok(())
}

/// The sink process, for the lateness scenarios (the delivery-rate ones use
/// [`Nginx`](crate::nginx::Nginx)); killed on drop.
pub struct Sink {
    child: Child,
    base: String,
    client: reqwest::Client,
}

impl Sink {
    /// Starts the sink process on a free port and waits until it answers.
    pub async fn start() -> Res<Sink> {
        let port = free_port();
        let child = Command::new(std::env::current_exe()?)
            .arg("--sink")
            .arg(port.to_string())
            .stdout(Stdio::null())
            .spawn()?;
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        for _ in 0..200 {
            if client.post(format!("{base}/reset")).send().await.is_ok() {
                return Ok(Sink {
                    child,
                    base,
                    client,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err("sink did not start".into())
    }

    /// `http://127.0.0.1:<port>{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Forgets what the sink has seen.
    pub async fn reset(&self) -> Res<()> {
        self.client.post(self.url("/reset")).send().await?;
        Ok(())
    }

    /// The count, first and last receive times and lateness list (µs).
    pub async fn stats(&self) -> Res<Value> {
        Ok(self
            .client
            .get(self.url("/stats"))
            .send()
            .await?
            .json()
            .await?)
    }

    /// Waits until the sink has seen `n` requests, then returns its stats.
    pub async fn wait_for(&self, n: u64, deadline: Duration) -> Res<Value> {
        let until = Instant::now() + deadline;
        loop {
            // Poll the bare count: the full stats carry every lateness sample
            // and would cost the sink and this process more than hookq does.
            let count: u64 = self
                .client
                .get(self.url("/count"))
                .send()
                .await?
                .text()
                .await?
                .trim()
                .parse()
                .unwrap_or(0);
            if count >= n {
                return self.stats().await;
            }
            if Instant::now() > until {
                return Err(format!("sink got {count} of {n} within {deadline:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
