//! The accept loop: each connection served by hyper's HTTP/1 with a header-read timeout,
//! at most `max_connections` open at once, and all of them closed gracefully at the end.
//!
//! The header timeout runs whenever a connection waits for a request's head, so it bounds
//! both a client that trickles its headers (slowloris) and an idle keep-alive connection.
//! Past the connection cap the loop stops accepting; further clients wait in the kernel's
//! backlog instead of taking file descriptors. Each connection's writes pass through
//! `JsonRejections`, so hyper's own answers to unparsable requests carry JSON errors too.

use super::rejections::JsonRejections;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// Bounds on connections.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Longest wait for a complete request head (and for the next request on an idle
    /// keep-alive connection).
    pub header_timeout: Duration,
    pub max_connections: usize,
}

/// Accepts connections until `stop` turns true; returns the watcher of those still open,
/// whose `shutdown` closes each once its current response is done.
pub async fn accept(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    mut stop: watch::Receiver<bool>,
) -> GracefulShutdown {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = stopped(&mut stop) => break,
        };
        let tcp = tokio::select! {
            a = listener.accept() => match a {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors or a connection reset before accept: wait a
                    // moment rather than spin.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(&mut stop) => break,
        };
        // Per-token SSE writes are small: send each at once.
        let _ = tcp.set_nodelay(true);
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .serve_connection(
                TokioIo::new(JsonRejections::new(tcp)),
                TowerToHyperService::new(router.clone()),
            );
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("connection ended: {e}");
            }
            drop(permit);
        });
    }
    graceful
}

/// Resolves once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|&s| s).await;
}
