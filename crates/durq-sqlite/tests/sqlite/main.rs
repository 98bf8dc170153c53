//! Behaviour specific to the SQLite backend, beyond the shared conformance suite:
//! migrations, group commit with savepoints, in-process wake-ups, the priority-band
//! claim scan, corrupt rows, emptying a namespace, a backend that takes its instant
//! and its input from the `Store` handle, fitted claims (CONTRACT F1–F6) against
//! the durq-core reference, durable steps in the file (D1–D4), and the event stream
//! (V1–V4).

mod claims_and_reads;
mod events;
mod files_and_writers;
mod steps;

use durq_core::{
    Backend, Budget, ClaimRequest, Clock, Error, JobId, JobState, LeaseToken, ListQuery,
    ManualClock, Needs, NewJob, ReadyOrder, Retry, Store, StoreSettings, Timestamp, WorkerInfo,
};
use durq_sqlite::{SqliteBackend, SqliteConfig, Synchronous, SCHEMA_VERSION};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn temp_db() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(err) => panic!("no temp dir: {err}"),
    };
    let path = dir.path().join("jobs.db");
    (dir, path)
}

fn settings(clock: &ManualClock) -> StoreSettings {
    StoreSettings::default()
        .namespace("sqlite-tests")
        .clock(Arc::new(clock.clone()))
}

async fn open_backend(path: &Path, settings: StoreSettings, config: SqliteConfig) -> SqliteBackend {
    match config.open(path, settings).await {
        Ok(backend) => backend,
        Err(err) => panic!("open failed: {err}"),
    }
}

async fn open(path: &Path, settings: StoreSettings, config: SqliteConfig) -> Store {
    Store::new(open_backend(path, settings, config).await)
}

fn raw(path: &Path) -> rusqlite::Connection {
    match rusqlite::Connection::open(path) {
        Ok(conn) => conn,
        Err(err) => panic!("cannot open {}: {err}", path.display()),
    }
}

fn meta(path: &Path, name: &str) -> Vec<i64> {
    let conn = raw(path);
    let mut stmt = match conn.prepare("SELECT value FROM jobq_meta WHERE name = ?1") {
        Ok(stmt) => stmt,
        Err(err) => panic!("{err}"),
    };
    let rows = stmt.query_map([name], |row| row.get(0));
    match rows.and_then(|rows| rows.collect()) {
        Ok(values) => values,
        Err(err) => panic!("{err}"),
    }
}

fn count(path: &Path, sql: &str) -> i64 {
    match raw(path).query_row(sql, [], |row| row.get(0)) {
        Ok(n) => n,
        Err(err) => panic!("{sql}: {err}"),
    }
}

/// A small deterministic generator, so the test needs no dependency and fails the same
/// way every run.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// Every page of `query`, `page` jobs at most each, joined; checks no page overflows.
async fn list_every_page(store: &Store, query: ListQuery, page: usize) -> (Vec<JobId>, usize) {
    let mut ids = Vec::new();
    let mut pages = 0;
    let mut cursor = None;
    loop {
        let mut query = query.clone().limit(page);
        query.cursor = cursor;
        let got = match store.list(query).await {
            Ok(got) => got,
            Err(err) => panic!("list failed: {err}"),
        };
        assert!(got.jobs.len() <= page);
        pages += 1;
        ids.extend(got.jobs.iter().map(|job| job.id));
        match got.next {
            Some(next) => cursor = Some(next),
            None => return (ids, pages),
        }
    }
}
