//! One connection type over a single server and a cluster, and the mapping of driver
//! errors into the store's error kinds.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, ServerErrorKind, Value};

use durq_core::Error;

/// A multiplexed connection to one server (reconnecting on its own) or to a cluster.
/// Cloning is cheap and shares the connection.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
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
            Conn::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
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
