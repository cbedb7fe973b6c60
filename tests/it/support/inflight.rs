//! A receiver that measures concurrency: it holds every request for a
//! delay, counts the requests open at once, and keeps the highest count
//! (and each request's `webhook-id`). Per-host limits are checked with it
//! where they show: at the receiving end.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};

#[derive(Default)]
struct Shared {
    open: AtomicUsize,
    max: AtomicUsize,
    ids: Mutex<Vec<String>>,
}

/// Closes one open request when dropped: also when the client gave up and
/// the server dropped the handler mid-delay.
struct Open(Arc<Shared>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A running receiver on `127.0.0.1:0` answering 204 after a delay; the
/// server stops when this is dropped.
pub struct InFlightReceiver {
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl InFlightReceiver {
    /// Starts a receiver that answers every request 204 after `delay`.
    pub async fn start(delay: Duration) -> InFlightReceiver {
        let shared = Arc::new(Shared::default());
        let app = axum::Router::new()
            .fallback(
                move |State(shared): State<Arc<Shared>>, headers: HeaderMap| async move {
                    let now = shared.open.fetch_add(1, Ordering::SeqCst) + 1;
                    let open = Open(shared.clone());
                    shared.max.fetch_max(now, Ordering::SeqCst);
                    let id = headers
                        .get("webhook-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    shared
                        .ids
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(id);
                    tokio::time::sleep(delay).await;
                    drop(open);
                    StatusCode::NO_CONTENT
                },
            )
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the in-flight receiver to 127.0.0.1:0");
        let addr = listener.local_addr().expect("its local addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        InFlightReceiver { addr, shared, task }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The address it listens on.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// The most requests that were open at once so far.
    pub fn max_in_flight(&self) -> usize {
        self.shared.max.load(Ordering::SeqCst)
    }

    /// Requests open now.
    pub fn in_flight(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// The `webhook-id` of every request so far, in arrival order.
    pub fn ids(&self) -> Vec<String> {
        self.shared
            .ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Requests per `webhook-id` so far.
    pub fn per_id(&self) -> std::collections::BTreeMap<String, usize> {
        let mut per_id = std::collections::BTreeMap::new();
        for id in self.ids() {
            *per_id.entry(id).or_insert(0) += 1;
        }
        per_id
    }
}

impl Drop for InFlightReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
