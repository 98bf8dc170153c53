//! One connection type over a single server and a cluster, the mapping of driver
//! errors into the store's error kinds, and how fast a lost server is found again.

use std::future::Future;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{
    Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};

use durq_core::Error;

/// The reconnect back-off cap: while a call waits for a lost server, and while the
/// wake-up subscriber has none, a new connection attempt starts at most this long after
/// the previous one failed. A server that answers again is found within this (plus its
/// own connect time), whatever the length of the outage. A refused connect costs the
/// server nothing, so a short cap is cheap; docs/redis.md ("Reconnecting").
pub(crate) const RECONNECT_CAP: Duration = Duration::from_millis(200);

/// The first pause after a failed attempt; the pauses double up to [`RECONNECT_CAP`].
pub(crate) const RECONNECT_FIRST_DELAY: Duration = Duration::from_millis(50);

/// Attempts after the first before a call made while the server is down fails with
/// `Unavailable`: 1.2–2.3 s of attempts against a port that refuses (12 pauses: one of
/// 50–100 ms, then 100–200 ms, the driver's jitter adding up to as much again as the
/// pause). A server restart shorter than that costs the waiting calls a delay, not an
/// error; a longer outage reaches the caller, who decides (the worker backs off and
/// calls again). Attempts that never gave up would hang every call, a connect to a
/// wrong address and the worker's shutdown for as long as the server is down.
pub(crate) const RECONNECT_RETRIES: usize = 12;

/// How long one connection attempt may take: TCP connect, TLS and the handshake. A
/// loopback or LAN server takes milliseconds and a port without a server refuses at
/// once; this bounds only an attempt into silence (a host that is down, a frozen
/// server), which is then given up for a fresh one, and leaves room for a TLS
/// handshake with a managed service across a region.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a call may wait for its answer on an established connection (a long
/// script, a big batch); a server that dies closes the connection and fails its calls
/// at once, so this only ends calls on a connection that went silent.
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

/// A multiplexed connection to one server (reconnecting on its own) or to a cluster.
/// Cloning is cheap and shares the connection.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// How a single-server call ended: with its result, or with a refused connect that the
/// driver had stored before the call (see [`first_poll`]).
enum Outcome<T> {
    Done(RedisResult<T>),
    StaleRefusal,
}

/// Awaits a `ConnectionManager` call, telling apart a refusal it was handed on its very
/// first poll.
///
/// The driver's `ConnectionManager` keeps the outcome of its last series of reconnect
/// attempts. Once a series has failed with no call waiting on it (the server stayed
/// down longer than [`RECONNECT_RETRIES`] attempts while the callers were backing off),
/// the next call is handed that old refusal at once, without the server being tried, and
/// only then does a new series start. A worker whose server had come back meanwhile lost
/// one more back-off delay to it (issue #30: 6.8–7.5 s without a successful call). Such
/// a call is made once more, and waits for the series its failure started, which tries
/// the server at once. It was never sent: a refusal comes only from a connect, and a
/// call is answered on its first poll only by a connection outcome already stored (an
/// answer on a live connection comes on a later poll; a series in progress sleeps
/// between its attempts). Every other result, successes included, is returned as it
/// came, and the call costs what it did before: one boxed future, no round trip.
async fn first_poll<T>(call: impl Future<Output = RedisResult<T>>) -> Outcome<T> {
    let mut call = std::pin::pin!(call);
    let mut waited = false;
    let result = std::future::poll_fn(|cx| {
        let poll = call.as_mut().poll(cx);
        waited |= poll.is_pending();
        poll
    })
    .await;
    match result {
        Err(err) if !waited && err.is_connection_refusal() => Outcome::StaleRefusal,
        result => Outcome::Done(result),
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => Box::pin(async move {
                match first_poll(conn.send_packed_command(cmd)).await {
                    Outcome::StaleRefusal => conn.send_packed_command(cmd).await,
                    Outcome::Done(result) => result,
                }
            }),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(conn) => Box::pin(async move {
                match first_poll(conn.send_packed_commands(pipeline, offset, count)).await {
                    Outcome::StaleRefusal => {
                        conn.send_packed_commands(pipeline, offset, count).await
                    }
                    Outcome::Done(result) => result,
                }
            }),
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

/// The error code a script aborts with when a value it read cannot be used (see
/// `abort_corrupt` in `lua/lib.lua`); it aborts before its first write.
const CORRUPT_CODE: &str = "JOBSCORRUPT";

/// Maps a driver error: anything about reaching the server (I/O, timeouts, a cluster
/// that is moving or down, a server still loading) is `Unavailable`, which callers may
/// retry; a script's `JOBSCORRUPT` abort is `Corrupt`; anything else is `Backend`.
pub(crate) fn map_err(what: &str, err: RedisError) -> Error {
    if err.code() == Some(CORRUPT_CODE) {
        // The detail ends with the server's note of where the script failed.
        let detail = err.detail().unwrap_or("unreadable value");
        let reason = detail.split(" script: ").next().unwrap_or(detail);
        return Error::corrupt(format!("redis {what}"), reason.to_owned());
    }
    let unavailable = err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_cluster_error()
        || matches!(
            err.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(ServerErrorKind::BusyLoading)
                | ErrorKind::Server(ServerErrorKind::MasterDown)
                | ErrorKind::Server(ServerErrorKind::ReadOnly)
        );
    if unavailable {
        Error::unavailable(format!("redis {what}"), err)
    } else {
        Error::backend(format!("redis {what}"), err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io_error(kind: std::io::ErrorKind) -> RedisError {
        std::io::Error::from(kind).into()
    }

    /// Only a refusal handed over on the first poll is the driver's stored one, made
    /// again; a refusal after a wait (a series of attempts that failed), any other
    /// error and every success are the call's own.
    #[tokio::test]
    async fn only_a_refusal_handed_over_at_once_is_made_again() {
        let stored = async { Err::<(), _>(io_error(std::io::ErrorKind::ConnectionRefused)) };
        assert!(matches!(first_poll(stored).await, Outcome::StaleRefusal));
        let after_a_wait = async {
            tokio::task::yield_now().await;
            Err::<(), _>(io_error(std::io::ErrorKind::ConnectionRefused))
        };
        assert!(matches!(
            first_poll(after_a_wait).await,
            Outcome::Done(Err(_))
        ));
        // A call on a connection that was lost may have been sent: never made again.
        let dropped = async { Err::<(), _>(io_error(std::io::ErrorKind::BrokenPipe)) };
        assert!(matches!(first_poll(dropped).await, Outcome::Done(Err(_))));
        let timed_out = async { Err::<(), _>(io_error(std::io::ErrorKind::TimedOut)) };
        assert!(matches!(first_poll(timed_out).await, Outcome::Done(Err(_))));
        assert!(matches!(
            first_poll(async { Ok(7) }).await,
            Outcome::Done(Ok(7))
        ));
    }
}
