//! Opening the store a URL names, through `durq::connect_with`.

use std::path::Path;

use durq::{Store, StoreSettings};

use crate::error::{CliError, Result};

/// Opens the store at `url` with `settings`. An SQLite file that does not exist is
/// refused unless `create`: opening one creates it, and a mistyped path would show
/// an empty store instead of an error.
pub async fn open(url: &str, settings: StoreSettings, create: bool) -> Result<Store> {
    if let Some(path) = sqlite_path(url) {
        if !create && !path.is_empty() && !Path::new(path).exists() {
            return Err(CliError::new(format!(
                "no SQLite store at {path}: the file does not exist (`durq enqueue` creates it)"
            )));
        }
    }
    durq::connect_with(url, settings).await.map_err(|err| {
        let err = CliError::from(err);
        CliError::new(format!("cannot open the store: {}", err.message()))
    })
}

/// Whether `url` names a memory store, private to the process that opens it.
pub fn is_memory(url: &str) -> bool {
    scheme(url).is_some_and(|scheme| scheme.eq_ignore_ascii_case("memory"))
}

fn scheme(url: &str) -> Option<&str> {
    url.split_once(':').map(|(scheme, _)| scheme)
}

/// The file of an `sqlite:` URL, read as `durq::connect` reads it.
fn sqlite_path(url: &str) -> Option<&str> {
    let (scheme, rest) = url.split_once(':')?;
    if !scheme.eq_ignore_ascii_case("sqlite") {
        return None;
    }
    Some(rest.strip_prefix("//").unwrap_or(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_paths_and_memory_urls() {
        assert_eq!(sqlite_path("sqlite://jobs.db"), Some("jobs.db"));
        assert_eq!(sqlite_path("sqlite:///var/jobs.db"), Some("/var/jobs.db"));
        assert_eq!(sqlite_path("SQLite:jobs.db"), Some("jobs.db"));
        assert_eq!(sqlite_path("redis://h"), None);
        assert!(is_memory("memory://"));
        assert!(is_memory("MEMORY://"));
        assert!(!is_memory("sqlite://memory.db"));
    }

    #[tokio::test]
    async fn a_missing_sqlite_file_is_refused_unless_created() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("jobs.db");
        let url = format!("sqlite://{}", path.display());
        let err = open(&url, StoreSettings::default(), false)
            .await
            .expect_err("no such file");
        assert!(err.message().contains("does not exist"), "{err}");
        assert!(!path.exists(), "nothing was created");
        open(&url, StoreSettings::default(), true)
            .await
            .expect("created");
        assert!(path.exists());
        open(&url, StoreSettings::default(), false)
            .await
            .expect("opened");
    }
}
