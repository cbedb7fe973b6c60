//! The API's HTTP server: hyper serving the router on each accepted
//! connection, with the `[api]` limits every production server needs
//! against slow or idle clients. A connection past a limit is closed; the
//! others go on. Every limit is a total, not a gap between bytes, so a
//! client that trickles a byte at a time gains nothing:
//!
//! - `header_timeout`: a request's head must arrive within it, counted from
//!   when the server starts reading it (hyper's header read timeout);
//! - `body_timeout`: its body within this, counted from when its head
//!   arrived ([`Deadline`]: the handler's read fails, the answer is 408
//!   `body_timeout` and the connection closes);
//! - `idle_timeout`: a connection with no request in progress is closed
//!   this long after its last request ended (or it was accepted), whatever
//!   bytes it trickles; while a request is in progress, it is closed when no
//!   byte has moved either way for this long ([`Idle`]);
//! - `max_connections`: a connection beyond it is closed as soon as it is
//!   accepted.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use crate::config::ApiConfig;

/// How long a stop waits for the connections still serving a request.
const DRAIN: Duration = Duration::from_secs(10);

/// The local address a request came in on (a request extension): the
/// daemon's own origin, for the cross-site check.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalAddr(pub SocketAddr);

/// The error a request body gives once `api.body_timeout` has passed since
/// its head arrived (the API answers it 408 `body_timeout`).
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within api.body_timeout")]
pub(crate) struct BodyTimedOut;

/// Serves `app` on `listener` with `limits` until `stop` is cancelled,
/// then lets the requests in progress finish (for at most 10 s).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: &ApiConfig,
    stop: CancellationToken,
) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder.http2().timer(TokioTimer::new());
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors and the like: breathe, retry.
                    tracing::warn!(cause = %err, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics::counter!("hookq_api_connections_refused_total").increment(1);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let Ok(local) = stream.local_addr() else {
            continue;
        };
        let requests = Arc::new(Requests::default());
        let service = connection_service(
            app.clone(),
            requests.clone(),
            LocalAddr(local),
            limits.body_timeout,
        );
        let io = TokioIo::new(Idle::new(stream, limits.idle_timeout, requests));
        let connection = graceful.watch(
            builder
                .serve_connection_with_upgrades(io, service)
                .into_owned(),
        );
        tokio::spawn(async move {
            let _ = connection.await;
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("API connections still open after {DRAIN:?}; closing them");
    }
    Ok(())
}

/// The service of one connection: each request is counted in `requests`
/// from its head until its answer is written, carries `local` and has its
/// body cut `body_timeout` after its head arrived.
fn connection_service(
    app: Router,
    requests: Arc<Requests>,
    local: LocalAddr,
    body_timeout: Duration,
) -> impl hyper::service::Service<
    hyper::Request<Incoming>,
    Response = hyper::Response<Answer>,
    Error = Infallible,
    Future = impl Future<Output = Result<hyper::Response<Answer>, Infallible>> + Send,
> {
    let app = TowerToHyperService::new(app);
    hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let in_progress = InProgress::begin(&requests);
        let mut request = request.map(|body| Deadline::new(body, body_timeout));
        request.extensions_mut().insert(local);
        let answered = hyper::service::Service::call(&app, request);
        async move {
            let response = answered.await?;
            Ok(response.map(|body| Answer {
                body,
                _in_progress: in_progress,
            }))
        }
    })
}

/// The requests of one connection, shared by its service (which counts
/// them) and its stream (whose idle clock depends on them).
#[derive(Default)]
struct Requests {
    /// Requests whose head has arrived and whose answer is not yet
    /// written in full.
    open: AtomicUsize,
    /// Bumped whenever a request begins or ends.
    changes: AtomicU64,
}

/// One request in progress: counted in its connection's [`Requests`] until
/// dropped (with its answer's body, once written or abandoned).
struct InProgress(Arc<Requests>);

impl InProgress {
    fn begin(requests: &Arc<Requests>) -> InProgress {
        requests.open.fetch_add(1, Ordering::AcqRel);
        requests.changes.fetch_add(1, Ordering::AcqRel);
        InProgress(requests.clone())
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.changes.fetch_add(1, Ordering::AcqRel);
    }
}

/// An answer's body, holding its request [`InProgress`] until written.
struct Answer {
    body: axum::body::Body,
    _in_progress: InProgress,
}

impl hyper::body::Body for Answer {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body that fails with [`BodyTimedOut`] once its deadline has
/// passed, however its bytes trickle in (`tower_http`'s request body
/// timeout restarts after every chunk).
struct Deadline {
    body: Incoming,
    deadline: Pin<Box<Sleep>>,
}

impl Deadline {
    fn new(body: Incoming, limit: Duration) -> Deadline {
        Deadline {
            body,
            deadline: Box::pin(tokio::time::sleep(limit)),
        }
    }
}

impl hyper::body::Body for Deadline {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTimedOut))));
        }
        Pin::new(&mut this.body)
            .poll_frame(cx)
            .map_err(|err| Box::new(err) as Self::Error)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A TCP stream that fails with `TimedOut` once its connection has been
/// idle for `limit` (the idle timeout): with no request in progress, since
/// the last request began or ended (bytes trickled in do not count); with
/// one in progress, since a byte last moved either way.
struct Idle {
    stream: TcpStream,
    limit: Duration,
    deadline: Pin<Box<Sleep>>,
    requests: Arc<Requests>,
    /// `requests.changes` when last looked at.
    seen: u64,
}

impl Idle {
    fn new(stream: TcpStream, limit: Duration, requests: Arc<Requests>) -> Idle {
        Idle {
            stream,
            limit,
            deadline: Box::pin(tokio::time::sleep(limit)),
            requests,
            seen: 0,
        }
    }

    /// The idle clock starts again.
    fn touch(&mut self) {
        self.deadline.as_mut().reset(Instant::now() + self.limit);
    }

    /// Bytes moved: they restart the idle clock while a request is in
    /// progress (its head and body have deadlines of their own).
    fn moved(&mut self) {
        if self.requests.open.load(Ordering::Acquire) > 0 {
            self.touch();
        }
    }

    /// What a write to the stream gave: bytes written may restart the idle
    /// clock, `Pending` is checked against it.
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match polled {
            Poll::Ready(Ok(n)) => {
                self.moved();
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(err)) => Poll::Ready(Err(err)),
            Poll::Pending => self.idle_or_pending(cx),
        }
    }

    /// `Pending` from the stream: an error if the connection has been idle
    /// too long (the deadline's waker is registered otherwise). A request
    /// that began or ended since the last look restarts the clock first.
    fn idle_or_pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let changes = self.requests.changes.load(Ordering::Acquire);
        if changes != self.seen {
            self.seen = changes;
            self.touch();
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection idle for longer than api.idle_timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Idle {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(err)) => Poll::Ready(Err(err)),
            Poll::Pending => this.idle_or_pending(cx),
        }
    }
}

impl AsyncWrite for Idle {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, data);
        this.wrote(cx, polled)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.wrote(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
