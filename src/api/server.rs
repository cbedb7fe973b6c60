//! The API's HTTP server: hyper serving the router on each accepted
//! connection, with the `[api]` limits every production server needs
//! against slow or idle clients. A connection past a limit is closed; the
//! others go on.
//!
//! - `header_timeout`: the request's headers must arrive within it (hyper's
//!   header read timeout);
//! - `body_timeout`: its body within this (`tower_http`'s request body
//!   timeout: the handler's read fails, the answer is 408 and the
//!   connection closes);
//! - `idle_timeout`: a connection with no bytes in or out for this long is
//!   closed (between keep-alive requests too);
//! - `max_connections`: a connection beyond it is closed as soon as it is
//!   accepted.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
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

/// Serves `app` on `listener` with `limits` until `stop` is cancelled,
/// then lets the requests in progress finish (for at most 10 s).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: &ApiConfig,
    stop: CancellationToken,
) -> io::Result<()> {
    let app = app.layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
        limits.body_timeout,
    ));
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
        let io = TokioIo::new(Idle::new(stream, limits.idle_timeout));
        let service = TowerToHyperService::new(app.clone());
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

/// A TCP stream that fails with `TimedOut` once no byte has moved either
/// way for `limit` (the idle timeout).
struct Idle {
    stream: TcpStream,
    limit: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl Idle {
    fn new(stream: TcpStream, limit: Duration) -> Idle {
        Idle {
            stream,
            limit,
            deadline: Box::pin(tokio::time::sleep(limit)),
        }
    }

    /// Traffic moved: the idle clock starts again.
    fn touch(&mut self) {
        self.deadline.as_mut().reset(Instant::now() + self.limit);
    }

    /// What a write to the stream gave: bytes written restart the idle
    /// clock, `Pending` is checked against it.
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match polled {
            Poll::Ready(Ok(n)) => {
                self.touch();
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(err)) => Poll::Ready(Err(err)),
            Poll::Pending => self.idle_or_pending(cx),
        }
    }

    /// `Pending` from the stream: an error if the connection has been idle
    /// too long (the deadline's waker is registered otherwise).
    fn idle_or_pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
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
                    this.touch();
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
