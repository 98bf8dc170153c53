//! Serving the dashboard on its own: [`serve`] until ctrl-c, [`serve_on`] on a
//! listener of yours until a future of yours resolves.

use std::future::Future;
use std::io;
use std::net::SocketAddr;

use axum::middleware;
use tokio::net::TcpListener;

use crate::{app, security, Dashboard};

/// Serves the dashboard on `listen` until ctrl-c; refuses a non-loopback address
/// without a token.
///
/// On a loopback address the dashboard answers only requests whose `Host` is a
/// loopback name or address (`localhost`, `127.0.0.1`, `[::1]`), so a web page cannot
/// reach it through a name of its own pointed at 127.0.0.1. Sampling for the charts
/// starts at once.
///
/// # Errors
///
/// [`io::ErrorKind::PermissionDenied`] for a non-loopback address without a token (the
/// address is not bound); the error of binding the address; an error of the server.
pub async fn serve(dashboard: Dashboard, listen: SocketAddr) -> io::Result<()> {
    refuse_unguarded(&dashboard, listen)?;
    let listener = TcpListener::bind(listen).await?;
    serve_on(dashboard, listener, async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %err, "cannot listen for ctrl-c; serving until killed");
            std::future::pending::<()>().await;
        }
    })
    .await
}

/// Serves the dashboard on `listener` until `shutdown` resolves, then finishes the
/// requests in flight: [`serve`] with a listener and a shutdown of your own (a test's
/// `127.0.0.1:0`, a service's own signal handling). The same rules hold: a listener on
/// a non-loopback address needs a token, one on loopback answers only loopback hosts.
///
/// # Errors
///
/// [`io::ErrorKind::PermissionDenied`] for a non-loopback listener without a token; an
/// error of the server.
pub async fn serve_on<F>(dashboard: Dashboard, listener: TcpListener, shutdown: F) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let local = listener.local_addr()?;
    refuse_unguarded(&dashboard, local)?;
    let app = dashboard.into_app();
    app.start_sampling();
    let mut router = app::router(app);
    if is_loopback(local) {
        router = router.layer(middleware::from_fn(security::loopback_host_only));
    }
    tracing::info!(address = %local, "serving the jobs dashboard at http://{local}/");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

fn is_loopback(addr: SocketAddr) -> bool {
    addr.ip().to_canonical().is_loopback()
}

/// Refuses to serve on an address other than loopback without a token.
fn refuse_unguarded(dashboard: &Dashboard, addr: SocketAddr) -> io::Result<()> {
    if is_loopback(addr) || dashboard.has_token() {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "refusing to serve the dashboard on {addr} without a token: anyone who can \
             reach that address could act on the jobs. Listen on 127.0.0.1, or set a token"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_public_address_needs_a_token() {
        let store = durq::connect("memory://").await.expect("a memory store");
        for addr in ["0.0.0.0:0", "192.0.2.1:8080", "[::]:0"] {
            let addr: SocketAddr = addr.parse().expect("an address");
            let err = serve(Dashboard::new(store.clone()), addr)
                .await
                .expect_err("refused");
            assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{addr}");
            assert!(err.to_string().contains("without a token"), "{err}");
            assert!(
                refuse_unguarded(&Dashboard::new(store.clone()).token(Some("t".into())), addr)
                    .is_ok()
            );
        }
        for addr in ["127.0.0.1:0", "[::1]:0", "[::ffff:127.0.0.1]:0"] {
            let addr: SocketAddr = addr.parse().expect("an address");
            assert!(refuse_unguarded(&Dashboard::new(store.clone()), addr).is_ok());
        }
        // An empty token is no token.
        let empty = Dashboard::new(store).token(Some(String::new()));
        assert!(refuse_unguarded(&empty, "0.0.0.0:0".parse().expect("addr")).is_err());
    }
}
