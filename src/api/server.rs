//! Serves the router over HTTP/1.1 and HTTP/2 (hyper-util's auto connection builder), with a
//! graceful stop: once `shutdown` completes no connection is accepted, and open connections
//! finish their requests and close.
//!
//! Unlike `axum::serve`, this bounds each HTTP/1 connection's read buffer
//! ([`http1_read_buffer_bytes`]). hyper grows a connection's buffer up to about 400 KiB while it
//! reads a large body and keeps it for the connection's life: a thousand extractors on
//! keep-alive connections each posting a 1 MiB body held 400 MiB of idle buffers.

use std::future::Future;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// The smallest read buffer given to a connection: reads of this size keep the loopback and
/// the network busy (the benchmark's K=8 figures stayed within 5% of those with 400 KiB).
const MIN_HTTP1_READ_BUFFER_BYTES: usize = 64 * 1024;

/// The read buffer of an HTTP/1 connection: room for a request head at the configured URI and
/// header limits (so those limits answer with a problem document, not hyper's bare 431), and
/// never below [`MIN_HTTP1_READ_BUFFER_BYTES`].
pub(crate) fn http1_read_buffer_bytes(max_uri_bytes: usize, max_header_bytes: usize) -> usize {
    (max_uri_bytes + max_header_bytes).saturating_mul(2).max(MIN_HTTP1_READ_BUFFER_BYTES)
}

/// Serves `router` on `listener` until `shutdown` completes, then waits for open connections.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    read_buffer_bytes: usize,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().max_buf_size(read_buffer_bytes);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(error) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    tracing::warn!(%error, "http.accept_failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "http.nodelay_failed");
        }
        let service = TowerToHyperService::new(router.clone());
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "http.connection_closed_with_error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_buffer_fits_the_request_head_limits() {
        assert_eq!(http1_read_buffer_bytes(4096, 16 * 1024), MIN_HTTP1_READ_BUFFER_BYTES);
        assert_eq!(http1_read_buffer_bytes(4096, 60 * 1024), 2 * (4096 + 60 * 1024));
    }
}
