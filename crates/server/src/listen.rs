//! The listener: HTTP/1.1 connections (hyper) up to `--max-connections` (past it, a 503 and
//! the connection closed), each under a header timeout that is also the idle timeout of a
//! kept-alive connection, and closed when its client stops taking what it is sent for
//! `--stall-timeout` (a write pending that long), which frees a stream's sequence too. On
//! shutdown, connections get a grace period to finish.

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::Sleep;
use tower_service::Service;

/// Connection limits and timeouts (`strata serve` flags).
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_connections: usize,
    /// A request's header must arrive within this, and an idle kept-alive connection closes
    /// after it.
    pub header_timeout: Duration,
    /// A request's body must arrive within this.
    pub body_timeout: Duration,
    /// A connection whose client takes nothing for this long is closed.
    pub stall_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            stall_timeout: Duration::from_secs(30),
        }
    }
}

/// How long open connections may take to finish once the server stops.
const GRACE: Duration = Duration::from_secs(10);

/// The answer past the connection limit, in OpenAI's error shape.
fn busy() -> Vec<u8> {
    let body = r#"{"error":{"message":"Too many open connections; retry shortly.","type":"server_error","param":null,"code":"too_many_connections"}}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Serves `app` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (closing_tx, closing) = watch::channel(false);
    let mut shutdown = pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of descriptors and the like: wait, do not spin.
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tokio::spawn(refuse(stream));
            continue;
        };
        let app = app.clone();
        let mut closing = closing.clone();
        let limits = limits.clone();
        tokio::spawn(async move {
            let io = TokioIo::new(StallIo::new(stream, limits.stall_timeout));
            let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                app.clone().call(request)
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(1 << 20);
            let conn = builder.serve_connection(io, service);
            let mut conn = pin!(conn);
            let closed = tokio::select! {
                _ = conn.as_mut() => false,
                _ = closing.wait_for(|c| *c) => true,
            };
            if closed {
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(GRACE, conn).await;
            }
            drop(permit);
        });
    }
    closing_tx.send_replace(true);
    let all = limits.max_connections.max(1) as u32;
    let _ = tokio::time::timeout(GRACE, permits.acquire_many(all)).await;
    Ok(())
}

/// Past the connection limit: a 503 (best effort) and close.
async fn refuse(stream: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.writable().await;
        let _ = stream.try_write(&busy());
    })
    .await;
}

/// A connection whose writes fail once one has been pending for `stall`.
struct StallIo {
    inner: TcpStream,
    stall: Duration,
    waiting: Option<Pin<Box<Sleep>>>,
}

impl StallIo {
    fn new(inner: TcpStream, stall: Duration) -> StallIo {
        StallIo {
            inner,
            stall,
            waiting: None,
        }
    }

    /// Passes a write's outcome on; a pending one starts (or checks) the stall clock.
    fn watch<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match poll {
            Poll::Pending => {
                let stall = self.stall;
                let timer = self
                    .waiting
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
                if timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client stopped reading",
                    )));
                }
                Poll::Pending
            }
            ready => {
                self.waiting = None;
                ready
            }
        }
    }
}

impl AsyncRead for StallIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for StallIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch(cx, poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_flush(cx);
        this.watch(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
