//! How driver failures become the contract's error kinds (CONTRACT §5).

use durq_core::Error;

/// SQLSTATEs after which the same call may succeed if tried again: the connection
/// broke or was refused (class 08, server shutdown or a terminated session 57P01–57P05,
/// an idle-in-transaction timeout 25P03, too many connections),
/// the statement was cancelled or timed out, or it lost a serialization or deadlock
/// race and was rolled back.
fn is_transient(code: &str) -> bool {
    code.starts_with("08")
        || matches!(
            code,
            "57P01"
                | "57P02"
                | "57P03"
                | "57P04"
                | "57P05"
                | "53300"
                | "57014"
                | "40001"
                | "40P01"
                | "55P03"
                | "25P03"
        )
}

/// Whether `err` says the connection itself is gone, so it must not be used again:
/// the socket failed or the stream is out of step (I/O, TLS, protocol), or the server
/// ended the session (class 08; `57P01` admin shutdown or `pg_terminate_backend`,
/// `57P02` crash shutdown, `57P03` cannot connect now, `57P04` database dropped,
/// `57P05` idle session timeout, `25P03` idle-in-transaction timeout: each a FATAL
/// after which the server closes the connection).
pub(crate) fn is_connection_lost(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || matches!(
                    &*code,
                    "57P01" | "57P02" | "57P03" | "57P04" | "57P05" | "25P03"
                )
        }),
        _ => false,
    }
}

/// Whether the server aborted the statement to break a deadlock (SQLSTATE 40P01): it
/// wrote nothing, and the statement it deadlocked with goes on.
pub(crate) fn is_deadlock(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().as_deref() == Some("40P01"))
}

/// Maps a sqlx error: connection trouble is `Unavailable` (retryable), an undecodable
/// value is `Corrupt`, anything else is `Backend` with the driver's error as source.
pub(crate) fn map(what: &str, err: sqlx::Error) -> Error {
    match &err {
        sqlx::Error::Database(db) => {
            let transient = db.code().is_some_and(|code| is_transient(&code));
            if transient {
                Error::unavailable(format!("{what}: {}", db.message()), err)
            } else {
                Error::backend(format!("{what}: {}", db.message()), err)
            }
        }
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Error::unavailable(format!("{what}: {err}"), err),
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
            Error::corrupt(what.to_owned(), err.to_string())
        }
        _ => Error::backend(format!("{what}: {err}"), err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_failures_are_retryable_and_decoding_failures_corrupt() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(map("claim", sqlx::Error::Io(io)).is_retryable());
        assert!(map("claim", sqlx::Error::PoolTimedOut).is_retryable());
        assert!(map("claim", sqlx::Error::PoolClosed).is_retryable());
        assert!(matches!(
            map("get", sqlx::Error::Decode("bad".into())),
            Error::Corrupt { .. }
        ));
        assert!(matches!(
            map("get", sqlx::Error::RowNotFound),
            Error::Backend { .. }
        ));
    }

    #[test]
    fn lost_connections_are_told_from_failed_statements() {
        let io = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "eof");
        assert!(is_connection_lost(&sqlx::Error::Io(io)));
        assert!(is_connection_lost(&sqlx::Error::Protocol(
            "out of step".into()
        )));
        // Not the connection's fault: the pool, or the row.
        assert!(!is_connection_lost(&sqlx::Error::PoolTimedOut));
        assert!(!is_connection_lost(&sqlx::Error::RowNotFound));
    }

    #[test]
    fn sqlstates_split_into_transient_and_not() {
        for code in [
            "08006", "08003", "57P01", "57P05", "25P03", "53300", "40001", "40P01", "57014",
        ] {
            assert!(is_transient(code), "{code}");
        }
        for code in ["23505", "42P01", "22P02", "XX000"] {
            assert!(!is_transient(code), "{code}");
        }
    }
}
