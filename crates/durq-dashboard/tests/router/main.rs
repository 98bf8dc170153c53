//! The dashboard's router over a real store (memory, and SQLite where the store's own
//! behaviour matters), request by request with `oneshot`: what the pages show, what the
//! actions do, and every refusal, each checked to have written nothing.

mod actions;
mod pages;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use common::{dead_job, get, listed, next_page, post, send, SAME_ORIGIN};
use durq::layers::{Backend, LayeredBackend};
use durq::worker_calls::{ClaimRequest, Retry};
use durq::{JobState, ListPage, ListQuery, NewJob, Store, WorkerInfo};
use durq_dashboard::Dashboard;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../common/mod.rs"]
mod common;

async fn memory() -> Store {
    durq::connect("memory://").await.expect("a memory store")
}

fn router(store: &Store) -> Router {
    Dashboard::new(store.clone()).router()
}

/// `headers` plus a browser's same-origin headers.
fn browser<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut headers = SAME_ORIGIN.to_vec();
    headers.extend_from_slice(extra);
    headers
}

/// A layer over a store's backend that counts `list` calls and caps each page at
/// `cap` jobs, as a backend that bounds the work of one call ends a page early with
/// `next` set (CONTRACT A4).
#[derive(Debug)]
struct ShortPages {
    inner: Arc<dyn Backend>,
    cap: usize,
    reads: Arc<AtomicUsize>,
}

#[durq::layers::async_trait]
impl LayeredBackend for ShortPages {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn list(&self, mut query: ListQuery) -> durq::Result<ListPage> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        query.limit = query.limit.min(self.cap);
        self.inner.require_inspect()?.list(query).await
    }
}

/// `store` seen through [`ShortPages`], and its count of `list` calls.
fn short_pages(store: Store, cap: usize) -> (Store, Arc<AtomicUsize>) {
    let reads = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&reads);
    let store = store.layer(move |inner: Arc<dyn Backend>| -> Arc<dyn Backend> {
        Arc::new(ShortPages {
            inner,
            cap,
            reads: Arc::clone(&counted),
        })
    });
    (store, reads)
}
