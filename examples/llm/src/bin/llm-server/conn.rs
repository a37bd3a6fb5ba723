//! The connections: accepting them, `TCP_NODELAY`, HTTP/1 through hyper with a bound on how
//! long a client may take to send a request's head (`--header-timeout`), and graceful shutdown.
//!
//! axum's own `serve` offers no such bound (it builds hyper's connections without a timer), so
//! a client sending its headers a byte at a time held a connection, and its task, for as long
//! as it liked (slowloris). Here each connection is hyper's HTTP/1 connection with
//! `header_read_timeout`: the head (request line and headers) must arrive whole within the
//! bound, counted from the moment the server waits for it (a new connection, or the end of the
//! previous answer on a kept-alive one); past it hyper closes the connection without an answer.
//! The body is bounded separately, by `--timeout` (408).

use std::future::Future;
use std::time::Duration;

use axum::Router;
use axum::serve::Listener;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// Serves `app` on `listener` until `stop` completes; then takes no more connections, lets
/// each open one finish the answer it is writing (an idle one closes at once), and returns
/// when all are closed.
pub async fn serve(
    mut listener: TcpListener,
    app: Router,
    header_timeout: Duration,
    stop: impl Future<Output = ()>,
) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        // axum's `Listener::accept` retries failed accepts (after a pause when the process is
        // out of descriptors) rather than returning them.
        let (tcp, _) = tokio::select! {
            accepted = Listener::accept(&mut listener) => accepted,
            () = &mut stop => break,
        };
        // Streamed tokens are small writes: send each at once.
        let _ = tcp.set_nodelay(true);
        let conn = http.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // An error here is the connection's own (a client gone, a head too slow or
            // malformed): nothing to do but close it.
            let _ = conn.await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
