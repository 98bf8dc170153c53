//! `serve_on` over real sockets: what a dashboard on loopback answers, and what it
//! refuses to serve at all.

use std::io;

use durq_dashboard::{serve_on, Dashboard};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The status line of a `GET /` sent with `host`.
async fn status_with_host(addr: std::net::SocketAddr, host: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("write the request");
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .expect("read the answer");
    let text = String::from_utf8_lossy(&answer);
    text.lines().next().unwrap_or("").to_owned()
}

#[tokio::test]
async fn on_loopback_only_loopback_hosts_are_answered() {
    let store = durq::connect("memory://").await.expect("a memory store");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("the address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_on(Dashboard::new(store), listener, async {
        let _ = stopped.await;
    }));

    let port = addr.port();
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "localhost".to_owned(),
    ] {
        let status = status_with_host(addr, &host).await;
        assert_eq!(status, "HTTP/1.1 200 OK", "Host: {host}");
    }
    // A name of another site pointed at 127.0.0.1 (DNS rebinding) gets nothing.
    for host in [format!("evil.test:{port}"), "192.0.2.1".to_owned()] {
        let status = status_with_host(addr, &host).await;
        assert_eq!(status, "HTTP/1.1 421 Misdirected Request", "Host: {host}");
    }

    let _ = stop.send(());
    let served = server.await.expect("the server task");
    assert!(served.is_ok(), "{served:?}");
}

#[tokio::test]
async fn a_listener_beyond_loopback_needs_a_token() {
    let store = durq::connect("memory://").await.expect("a memory store");
    let listener = TcpListener::bind("0.0.0.0:0").await.expect("bind");
    let refused = serve_on(Dashboard::new(store.clone()), listener, async {}).await;
    let err = refused.expect_err("no token, no dashboard");
    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);

    // With a token it serves (and stops at once: the shutdown is already there).
    let listener = TcpListener::bind("0.0.0.0:0").await.expect("bind");
    let served = serve_on(
        Dashboard::new(store).token(Some("t0ken".into())),
        listener,
        async {},
    )
    .await;
    assert!(served.is_ok(), "{served:?}");
}
