//! A real HTTP receiver (axum on `127.0.0.1:0`) that records every request —
//! any method, any path — and answers each with the `Reply` its responder
//! chooses, optionally after a delay (a slow or hanging endpoint).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use tokio::sync::Notify;

/// One received request.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// HTTP method.
    pub method: Method,
    /// Request path, without the query string.
    pub path: String,
    /// Query string, if any (without the `?`).
    pub query: Option<String>,
    /// Request headers.
    pub headers: HeaderMap,
    /// Request body.
    pub body: Vec<u8>,
    /// When it arrived (wall clock).
    pub received_at: SystemTime,
}

impl Recorded {
    /// A header's value as text, if present and valid UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// When it arrived, in milliseconds since the Unix epoch (wall clock).
    pub fn received_ms(&self) -> i64 {
        self.received_at
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis() as i64
    }

    /// The body parsed as JSON; panics with the body if it is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "request body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// How the receiver answers one request.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status code (100–999).
    pub status: u16,
    /// Response headers (appended, so a name may repeat).
    pub headers: Vec<(String, String)>,
    /// Response body.
    pub body: Vec<u8>,
    /// Sleep this long before answering (a slow or hanging endpoint).
    pub delay: Option<Duration>,
}

impl Reply {
    /// A bare status: no headers, empty body, no delay.
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: Vec::new(),
            delay: None,
        }
    }

    /// This reply with a header added.
    pub fn with_header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// This reply with `body`.
    pub fn with_body(mut self, body: impl Into<Vec<u8>>) -> Reply {
        self.body = body.into();
        self
    }

    /// This reply, sent only after `delay`.
    pub fn with_delay(mut self, delay: Duration) -> Reply {
        self.delay = Some(delay);
        self
    }
}

/// Chooses the reply to each recorded request.
pub type Responder = Arc<dyn Fn(&Recorded) -> Reply + Send + Sync>;

struct Shared {
    requests: Mutex<Vec<Recorded>>,
    arrived: Notify,
    responder: Responder,
}

impl Shared {
    fn requests(&self) -> MutexGuard<'_, Vec<Recorded>> {
        // A panicking responder cannot leave the list half-written.
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running receiver; the server stops accepting when this is dropped.
pub struct Receiver {
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

async fn record(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let recorded = Recorded {
        method,
        path: uri.path().to_string(),
        query: uri.query().map(str::to_string),
        headers,
        body: body.to_vec(),
        received_at: SystemTime::now(),
    };
    let reply = (shared.responder)(&recorded);
    shared.requests().push(recorded);
    shared.arrived.notify_waiters();
    if let Some(delay) = reply.delay {
        tokio::time::sleep(delay).await;
    }
    let status = StatusCode::from_u16(reply.status)
        .unwrap_or_else(|_| panic!("test responder chose an invalid status {}", reply.status));
    let mut response = (status, reply.body).into_response();
    for (name, value) in reply.headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .unwrap_or_else(|_| panic!("test responder chose an invalid header name {name:?}"));
        let value = HeaderValue::from_str(&value)
            .unwrap_or_else(|_| panic!("test responder chose an invalid header value {value:?}"));
        response.headers_mut().append(name, value);
    }
    response
}

impl Receiver {
    /// Starts a receiver on `127.0.0.1:0` answering with `responder`.
    pub async fn start(responder: Responder) -> Receiver {
        Receiver::start_on("127.0.0.1:0", responder).await
    }

    /// Starts a receiver on loopback address `addr` answering with
    /// `responder` (a fixed one for data that names it, e.g. a fixture).
    pub async fn start_on(addr: &str, responder: Responder) -> Receiver {
        let shared = Arc::new(Shared {
            requests: Mutex::new(Vec::new()),
            arrived: Notify::new(),
            responder,
        });
        let app = axum::Router::new()
            .fallback(record)
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("bind the test receiver to {addr}: {e}"));
        let addr = listener.local_addr().expect("test receiver's local addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { addr, shared, task }
    }

    /// A receiver that answers 200 to everything.
    pub async fn ok() -> Receiver {
        Receiver::with_status(200).await
    }

    /// A receiver that answers `status` to everything.
    pub async fn with_status(status: u16) -> Receiver {
        Receiver::start(Arc::new(move |_: &Recorded| Reply::status(status))).await
    }

    /// A receiver that answers `status` to everything, each only after
    /// `delay` (a slow or hanging endpoint).
    pub async fn slow(status: u16, delay: Duration) -> Receiver {
        Receiver::start(Arc::new(move |_: &Recorded| {
            Reply::status(status).with_delay(delay)
        }))
        .await
    }

    /// `http://127.0.0.1:PORT{path}` (`path` should start with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The address the receiver listens on.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Everything received so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests().clone()
    }

    /// How many requests arrived so far.
    pub fn count(&self) -> usize {
        self.shared.requests().len()
    }

    /// How many distinct values of header `name` arrived so far (e.g. job ids
    /// in `webhook-id`), counted without copying the requests.
    pub fn count_distinct(&self, name: &str) -> usize {
        self.shared
            .requests()
            .iter()
            .filter_map(|r| r.header(name))
            .collect::<std::collections::HashSet<_>>()
            .len()
    }

    /// Waits until at least `n` requests arrived and returns all of them;
    /// panics, saying how many arrived, once `deadline` has passed.
    pub async fn wait_for_count(&self, n: usize, deadline: Duration) -> Vec<Recorded> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            // Register for the next arrival before looking, so none is missed.
            let notified = self.shared.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = self.requests();
            if got.len() >= n {
                return got;
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                let got = self.requests();
                let paths: Vec<&str> = got.iter().map(|r| r.path.as_str()).collect();
                panic!(
                    "receiver got {} of {n} expected requests within {deadline:?} (paths: {paths:?})",
                    got.len()
                );
            }
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
