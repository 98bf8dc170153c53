//! A web dashboard for a durq store: an [axum](https://docs.rs/axum) router rendered on
//! the server (HTML and inline SVG, no JavaScript), to serve on its own with [`serve`]
//! or to mount in an application of yours with [`Router::nest`](axum::Router::nest).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = durq::connect("sqlite://jobs.db").await?;
//! let dashboard = durq_dashboard::Dashboard::new(store.clone());
//!
//! // On its own, on localhost, until ctrl-c:
//! durq_dashboard::serve(dashboard, "127.0.0.1:8080".parse()?).await?;
//!
//! // Or inside your own axum application, under /admin/jobs:
//! let app: axum::Router = axum::Router::new()
//!     .nest("/admin/jobs", durq_dashboard::Dashboard::new(store).token(Some("s3cret".into())).router());
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! What it shows: every queue with its jobs per state, its lag and its throughput over
//! the last 15 minutes (drawn as charts from samples the dashboard takes every 5 s),
//! the live workers, the schedules, jobs with paging (across every queue or one, by
//! queue prefix, states, tenant and tags), and each job with its tags, trace context,
//! attempts (who ran each, when, for how long, how it ended, with what error),
//! payload, result, last error, parent and children. What it does: retry,
//! cancel, pause and resume a queue, set a queue's limits (on a store with flow
//! control, whose queue page also shows what the limits hold back), and retry every
//! dead job of a queue after a confirmation. `/metrics` answers the queues' depth and lag in the Prometheus text
//! format, read from the store at each scrape.
//!
//! Safe by default:
//! - [`serve`] binds where it is told, and refuses an address other than loopback
//!   unless a [token](Dashboard::token) is set; on loopback it answers only requests
//!   whose `Host` is a loopback name, so a web page cannot reach it by DNS rebinding.
//! - With a token, every action needs it: a browser logs in once at `/login` (an
//!   `HttpOnly`, `SameSite=Strict` cookie), a script sends `Authorization: Bearer`.
//! - [Read-only](Dashboard::read_only) dashboards show no buttons and answer 403 to
//!   every action.
//! - Actions are `POST` forms carrying a per-dashboard random CSRF token, and a request
//!   whose `Origin` or `Sec-Fetch-Site` says it came from another site is refused.
//! - Every input (job id, queue name and prefix, states, tenant, tag filters, page
//!   size, cursor) is parsed and checked, as the store checks it, before the store is
//!   called: a bad request answers 400 and writes nothing.
//! - Pages carry a `Content-Security-Policy` that allows no script at all, and may not
//!   be framed.
//!
//! Routes, relative to where the router is mounted, are listed in
//! `docs/operations.md` of the repository.

#![deny(missing_docs)]

mod actions;
mod app;
mod charts;
pub mod format;
mod history;
mod input;
mod layout;
mod metrics;
mod pages;
mod problem;
mod security;
mod serve;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use serve::{serve, serve_on};

/// How often the dashboard samples the queues for its charts, unless told otherwise.
pub const DEFAULT_SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// How far back the charts reach, unless told otherwise.
pub const DEFAULT_CHART_WINDOW: Duration = Duration::from_secs(15 * 60);

/// A dashboard over one store: build it, then take its [`router`](Dashboard::router)
/// or [`serve`] it.
///
/// ```
/// # async fn demo() -> durq::Result<()> {
/// let store = durq::connect("memory://").await?;
/// let router: axum::Router = durq_dashboard::Dashboard::new(store)
///     .read_only(true)
///     .router();
/// # let _ = router;
/// # Ok(())
/// # }
/// ```
pub struct Dashboard {
    store: durq::Store,
    read_only: bool,
    token: Option<String>,
    sample_interval: Duration,
    chart_window: Duration,
    secure_cookie: bool,
}

impl fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dashboard")
            .field("store", &self.store)
            .field("read_only", &self.read_only)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("sample_interval", &self.sample_interval)
            .field("chart_window", &self.chart_window)
            .field("secure_cookie", &self.secure_cookie)
            .finish()
    }
}

impl Dashboard {
    /// A dashboard over `store`: actions allowed, no token, charts of the last 15
    /// minutes sampled every 5 s.
    pub fn new(store: durq::Store) -> Self {
        Dashboard {
            store,
            read_only: false,
            token: None,
            sample_interval: DEFAULT_SAMPLE_INTERVAL,
            chart_window: DEFAULT_CHART_WINDOW,
            secure_cookie: false,
        }
    }

    /// Marks the login cookie `Secure`, so a browser sends it over HTTPS only: set it
    /// when the dashboard is reached over TLS (behind a proxy that ends TLS, say).
    pub fn secure_cookie(mut self, secure: bool) -> Self {
        self.secure_cookie = secure;
        self
    }

    /// A read-only dashboard shows no action and answers 403 to every one.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// The token every action needs (`None`: actions need none, for a dashboard on
    /// localhost). A browser gives it once at `/login`; a script sends it as
    /// `Authorization: Bearer <token>`. An empty token is no token.
    pub fn token(mut self, token: Option<String>) -> Self {
        self.token = token.filter(|token| !token.is_empty());
        self
    }

    /// How often the queues are sampled for the charts (at least 100 ms).
    pub fn sample_interval(mut self, interval: Duration) -> Self {
        self.sample_interval = interval.max(Duration::from_millis(100));
        self
    }

    /// How far back the charts reach (10 s to 6 h); the dashboard keeps the samples of
    /// that long, in memory.
    pub fn chart_window(mut self, window: Duration) -> Self {
        self.chart_window = window.clamp(Duration::from_secs(10), Duration::from_secs(6 * 3600));
        self
    }

    /// Whether this dashboard answers 403 to every action.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Whether actions need a token.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// The dashboard as an axum router, to serve or to mount with
    /// [`Router::nest`](axum::Router::nest): its links and cookies follow the path it
    /// is mounted at. Sampling for the charts starts with its first request.
    pub fn router(self) -> axum::Router {
        let app = self.into_app();
        app::router(app)
    }

    fn into_app(self) -> Arc<app::App> {
        Arc::new(app::App::new(
            self.store,
            self.read_only,
            self.token,
            self.sample_interval,
            self.chart_window,
            self.secure_cookie,
        ))
    }
}
