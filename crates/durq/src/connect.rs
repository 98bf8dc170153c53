//! Choosing a backend at run time from a URL.

use durq_core::{Error, Result, Store, StoreSettings};

use crate::telemetry::MetricsLayer;

/// Opens the store a URL names, with default settings. See [`connect_with`].
pub async fn connect(url: &str) -> Result<Store> {
    connect_with(url, StoreSettings::default()).await
}

/// Opens the store a URL names, chosen by its scheme:
///
/// | URL | backend | feature |
/// |---|---|---|
/// | `memory://` | a new, private in-memory store | `memory` |
/// | `sqlite://path/to/file.db`, `sqlite:///abs/path.db` | an SQLite file (created if missing) | `sqlite` |
/// | `redis://host:port/db`, `rediss://…` (TLS) | Redis | `redis` (`redis-tls` for `rediss://`) |
/// | `postgres://user@host/db`, `postgresql://…` | PostgreSQL | `postgres` (`postgres-tls` for `sslmode=require`) |
///
/// The store carries the [`MetricsLayer`], so enqueued jobs are counted, and with the
/// `opentelemetry` feature the `TraceContextLayer` of [`layers`](crate::layers), so each
/// job carries the trace context of the span that enqueued it.
///
/// A scheme that is unknown, or whose feature is not enabled, is refused with
/// [`Error::InvalidInput`] naming the field `url`. Error messages never repeat the URL,
/// which may hold a password.
pub async fn connect_with(url: &str, settings: StoreSettings) -> Result<Store> {
    let scheme = scheme_of(url)?;
    let store = match scheme.as_str() {
        "memory" => open_memory(settings),
        "sqlite" => open_sqlite(sqlite_path(url)?, settings).await,
        "redis" | "rediss" => open_redis(url, settings).await,
        "postgres" | "postgresql" => open_postgres(url, settings).await,
        other => Err(Error::invalid(
            "url",
            format!(
                "unknown scheme {other:?}; expected memory://, sqlite://, redis:// or postgres://"
            ),
        )),
    }?;
    let store = store.layer(MetricsLayer);
    #[cfg(feature = "opentelemetry")]
    let store = store.layer(crate::trace_context::TraceContextLayer);
    Ok(store)
}

/// The lower-cased scheme of `url`.
fn scheme_of(url: &str) -> Result<String> {
    let Some((scheme, _)) = url.split_once(':') else {
        return Err(Error::invalid(
            "url",
            "has no scheme; expected memory://, sqlite://, redis:// or postgres://",
        ));
    };
    let valid = !scheme.is_empty()
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid {
        return Err(Error::invalid("url", "has no valid scheme"));
    }
    Ok(scheme.to_ascii_lowercase())
}

/// The file path of an `sqlite:` URL: `sqlite://jobs.db` is relative, `sqlite:///var/jobs.db`
/// absolute, `sqlite:jobs.db` also accepted. A query string is not supported.
fn sqlite_path(url: &str) -> Result<String> {
    let rest = &url["sqlite:".len()..];
    let path = rest.strip_prefix("//").unwrap_or(rest);
    if path.is_empty() {
        return Err(Error::invalid("url", "an sqlite:// URL needs a file path"));
    }
    if path.contains('?') {
        return Err(Error::invalid(
            "url",
            "sqlite:// URLs take no query parameters; configure the store in code",
        ));
    }
    Ok(path.to_owned())
}

#[cfg(not(all(
    feature = "memory",
    feature = "sqlite",
    feature = "redis",
    feature = "postgres"
)))]
fn feature_off(feature: &str) -> Error {
    Error::invalid(
        "url",
        format!("the {feature}:// scheme needs the `{feature}` feature of the `durq` crate"),
    )
}

#[cfg(feature = "memory")]
fn open_memory(settings: StoreSettings) -> Result<Store> {
    Ok(Store::new(durq_memory::MemoryBackend::new(settings)?))
}

#[cfg(not(feature = "memory"))]
fn open_memory(_settings: StoreSettings) -> Result<Store> {
    Err(feature_off("memory"))
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(path: String, settings: StoreSettings) -> Result<Store> {
    Ok(Store::new(
        durq_sqlite::SqliteBackend::open(path, settings).await?,
    ))
}

#[cfg(not(feature = "sqlite"))]
async fn open_sqlite(_path: String, _settings: StoreSettings) -> Result<Store> {
    Err(feature_off("sqlite"))
}

#[cfg(feature = "redis")]
async fn open_redis(url: &str, settings: StoreSettings) -> Result<Store> {
    Ok(Store::new(
        durq_redis::RedisBackend::connect(url, settings).await?,
    ))
}

#[cfg(not(feature = "redis"))]
async fn open_redis(_url: &str, _settings: StoreSettings) -> Result<Store> {
    Err(feature_off("redis"))
}

#[cfg(feature = "postgres")]
async fn open_postgres(url: &str, settings: StoreSettings) -> Result<Store> {
    Ok(Store::new(
        durq_postgres::PostgresBackend::connect(url, settings).await?,
    ))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(_url: &str, _settings: StoreSettings) -> Result<Store> {
    Err(feature_off("postgres"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_are_parsed_case_insensitively() {
        assert_eq!(scheme_of("Redis://x").ok().as_deref(), Some("redis"));
        assert_eq!(scheme_of("memory://").ok().as_deref(), Some("memory"));
        assert_eq!(
            scheme_of("no-scheme").err().and_then(|e| e.invalid_field()),
            Some("url")
        );
        assert!(scheme_of("://x").is_err());
        assert!(scheme_of("1abc://x").is_err());
    }

    #[test]
    fn sqlite_paths() {
        assert_eq!(
            sqlite_path("sqlite://jobs.db").ok().as_deref(),
            Some("jobs.db")
        );
        assert_eq!(
            sqlite_path("sqlite:///var/lib/jobs.db").ok().as_deref(),
            Some("/var/lib/jobs.db")
        );
        assert_eq!(
            sqlite_path("sqlite:jobs.db").ok().as_deref(),
            Some("jobs.db")
        );
        assert!(sqlite_path("sqlite://").is_err());
        assert!(sqlite_path("sqlite://x.db?mode=ro").is_err());
    }

    #[tokio::test]
    async fn unknown_schemes_name_the_url_field_and_hide_the_url() {
        let err = match connect("mysql://root:hunter2@db/jobs").await {
            Err(err) => err,
            Ok(store) => panic!("mysql:// opened a store: {store:?}"),
        };
        assert_eq!(err.invalid_field(), Some("url"));
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[cfg(not(feature = "redis"))]
    #[tokio::test]
    async fn a_disabled_feature_is_named() {
        let err = match connect("redis://127.0.0.1:6379").await {
            Err(err) => err,
            Ok(store) => panic!("redis:// opened a store without the feature: {store:?}"),
        };
        assert_eq!(err.invalid_field(), Some("url"));
        assert!(err.to_string().contains("`redis` feature"), "{err}");
    }

    #[cfg(feature = "memory")]
    #[tokio::test]
    async fn memory_urls_open_private_stores() {
        use durq_core::NewJob;
        let a = connect("memory://").await.expect("memory store");
        let b = connect("memory://").await.expect("memory store");
        let id = a.enqueue(NewJob::new("q")).await.expect("enqueue").id;
        assert!(a.get(id).await.is_ok());
        assert!(b.get(id).await.is_err_and(|e| e.is_not_found()));
    }
}
