//! A real HTTP receiver on loopback that records every request and answers
//! with a configurable reply.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use tokio::sync::Notify;

/// One received request.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// HTTP method.
    pub method: Method,
    /// Request path.
    pub path: String,
    /// Request headers.
    pub headers: HeaderMap,
    /// Request body.
    pub body: Vec<u8>,
    /// When it arrived (wall clock).
    pub received_at: SystemTime,
}

/// How the receiver answers.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Extra response headers.
    pub headers: Vec<(String, String)>,
    /// Response body.
    pub body: Vec<u8>,
    /// Sleep before answering (a slow or hanging endpoint).
    pub delay: Option<Duration>,
}

impl Reply {
    /// A bare status.
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: Vec::new(),
            delay: None,
        }
    }
}

type Responder = Arc<dyn Fn(&Recorded) -> Reply + Send + Sync>;

struct Shared {
    requests: Mutex<Vec<Recorded>>,
    arrived: Notify,
    responder: Responder,
}

/// A running receiver; the server stops when this is dropped.
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
        headers,
        body: body.to_vec(),
        received_at: SystemTime::now(),
    };
    let reply = (shared.responder)(&recorded);
    shared
        .requests
        .lock()
        .expect("receiver lock")
        .push(recorded);
    shared.arrived.notify_waiters();
    if let Some(delay) = reply.delay {
        tokio::time::sleep(delay).await;
    }
    let mut response = (
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK),
        reply.body,
    )
        .into_response();
    for (name, value) in reply.headers {
        if let (Ok(n), Ok(v)) = (
            axum::http::HeaderName::from_bytes(name.as_bytes()),
            axum::http::HeaderValue::from_str(&value),
        ) {
            response.headers_mut().insert(n, v);
        }
    }
    response
}

impl Receiver {
    /// Starts a receiver answering with `responder`.
    pub async fn start(responder: Responder) -> Receiver {
        let shared = Arc::new(Shared {
            requests: Mutex::new(Vec::new()),
            arrived: Notify::new(),
            responder,
        });
        let app = axum::Router::new()
            .fallback(record)
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind receiver");
        let addr = listener.local_addr().expect("receiver addr");
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
        Receiver::start(Arc::new(move |_| Reply::status(status))).await
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Everything received so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().expect("receiver lock").clone()
    }

    /// How many requests arrived.
    pub fn count(&self) -> usize {
        self.shared.requests.lock().expect("receiver lock").len()
    }

    /// Waits until at least `n` requests arrived; panics after `deadline`.
    pub async fn wait_for_count(&self, n: usize, deadline: Duration) -> Vec<Recorded> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let notified = self.shared.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = self.requests();
            if got.len() >= n {
                return got;
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                panic!(
                    "receiver got {} of {n} requests within {deadline:?}",
                    self.count()
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
