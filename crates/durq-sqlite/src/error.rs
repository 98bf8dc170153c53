//! Maps SQLite's failures onto the kinds of [`durq_core::Error`] (CONTRACT §5).

use durq_core::Error;
use rusqlite::ErrorCode;

/// Turns a driver error into the error kind a caller can act on: a lock held too long or
/// an I/O failure is retryable (`Unavailable`), a damaged file is `Corrupt`, a value
/// that cannot be read back is `Corrupt`, anything else is `Backend`.
pub(crate) fn db_error(context: &str, err: rusqlite::Error) -> Error {
    match &err {
        rusqlite::Error::SqliteFailure(failure, _) => match failure.code {
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::SystemIoFailure
            | ErrorCode::CannotOpen
            | ErrorCode::DiskFull
            | ErrorCode::FileLockingProtocolFailed
            | ErrorCode::OutOfMemory => Error::unavailable(format!("sqlite: {context}"), err),
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => {
                Error::corrupt(context.to_owned(), err.to_string())
            }
            _ => Error::backend(format!("sqlite: {context}"), err),
        },
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::Utf8Error(..)
        | rusqlite::Error::InvalidColumnType(..) => {
            Error::corrupt(context.to_owned(), err.to_string())
        }
        _ => Error::backend(format!("sqlite: {context}"), err),
    }
}

/// Shorthand for `.map_err(|e| db_error(context, e))`.
pub(crate) trait DbResultExt<T> {
    fn db(self, context: &str) -> durq_core::Result<T>;
}

impl<T> DbResultExt<T> for rusqlite::Result<T> {
    fn db(self, context: &str) -> durq_core::Result<T> {
        self.map_err(|err| db_error(context, err))
    }
}

/// The error every caller gets once the store's threads are gone.
pub(crate) fn stopped() -> Error {
    Error::Unavailable {
        message: "the sqlite store's worker thread stopped".to_owned(),
        source: None,
    }
}
