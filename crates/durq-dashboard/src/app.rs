//! The state every request shares, the context of one request, and the routes.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, FromRequestParts, NestedPath, Request, State};
use axum::http::request::Parts;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;

use crate::history::{History, Sample};
use crate::security::{self, Auth};
use crate::{actions, metrics, pages};

/// The largest form body an action takes.
const MAX_FORM_BYTES: usize = 16 * 1024;

/// What every request of one dashboard shares.
#[derive(Debug)]
pub(crate) struct App {
    pub store: durq::Store,
    pub read_only: bool,
    pub token: Option<String>,
    /// The CSRF token of this dashboard's forms: random, made when it was built.
    pub csrf: String,
    /// Failed attempts at the token.
    pub throttle: std::sync::Mutex<security::Throttle>,
    /// Whether the login cookie is marked `Secure` (the dashboard is served over TLS).
    pub secure_cookie: bool,
    pub history: History,
    sampling: AtomicBool,
}

impl App {
    pub fn new(
        store: durq::Store,
        read_only: bool,
        token: Option<String>,
        sample_interval: Duration,
        chart_window: Duration,
        secure_cookie: bool,
    ) -> Self {
        App {
            store,
            read_only,
            token,
            csrf: security::random_token(),
            throttle: std::sync::Mutex::new(security::Throttle::new(std::time::Instant::now())),
            secure_cookie,
            history: History::new(sample_interval, chart_window),
            sampling: AtomicBool::new(false),
        }
    }

    /// Starts the sampling task once, on the runtime of the caller. It holds the
    /// dashboard weakly, so it ends once every router over it is dropped.
    pub fn start_sampling(self: &Arc<Self>) {
        if self.sampling.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.sampling.store(false, Ordering::Release);
            return;
        };
        let app = Arc::downgrade(self);
        let every = self.history.interval;
        runtime.spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(app) = app.upgrade() else { break };
                app.sample().await;
            }
        });
    }

    /// Takes one sample of the queues for the charts.
    pub async fn sample(&self) {
        match self.store.queues().await {
            Ok(queues) => self.history.record(Sample::of(Instant::now(), &queues)),
            Err(err) => tracing::warn!(error = %err, "the dashboard could not sample the queues"),
        }
    }
}

/// One request: the dashboard, where it is mounted, and whether the request may act.
pub(crate) struct Ctx {
    pub app: Arc<App>,
    /// The path the router is nested at (`""` when it is not).
    pub base: String,
    pub auth: Auth,
}

impl Ctx {
    /// The link to `path` (starting with `/`) under the dashboard.
    pub fn href(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The link to `path` with query `params`, encoded.
    pub fn href_query(&self, path: &str, params: &[(&str, &str)]) -> String {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        for (key, value) in params {
            query.append_pair(key, value);
        }
        let query = query.finish();
        if query.is_empty() {
            self.href(path)
        } else {
            format!("{}{path}?{query}", self.base)
        }
    }

    /// The overview's link.
    pub fn home(&self) -> String {
        if self.base.is_empty() {
            "/".to_owned()
        } else {
            self.base.clone()
        }
    }

    /// Whether the pages show actions to this request.
    pub fn can_act(&self) -> bool {
        !self.app.read_only && self.auth.allowed()
    }

    /// Whether a token guards actions and this request has not given it.
    pub fn needs_login(&self) -> bool {
        !self.app.read_only && !self.auth.allowed()
    }

    /// Refuses an attempt at the token while failures are throttled (429, with how long
    /// to wait), before the token is compared.
    pub fn check_throttle(&self) -> Result<(), crate::problem::Problem> {
        let mut throttle = self
            .app
            .throttle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        throttle
            .check(std::time::Instant::now())
            .map_err(crate::problem::Problem::throttled)
    }

    /// Counts a failed attempt at the token.
    pub fn count_failure(&self) {
        self.app
            .throttle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .failed(std::time::Instant::now());
    }
}

impl FromRequestParts<Arc<App>> for Ctx {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Infallible> {
        let base = parts
            .extensions
            .get::<NestedPath>()
            .map(|nested| nested.as_str().trim_end_matches('/').to_owned())
            .unwrap_or_default();
        Ok(Ctx {
            app: Arc::clone(app),
            base,
            auth: security::authenticate(app.token.as_deref(), &parts.headers),
        })
    }
}

/// Starts sampling on the first request.
async fn start_sampling(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    app.start_sampling();
    next.run(request).await
}

/// The routes of the dashboard over `app`.
pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(pages::overview::page))
        .route("/queue", get(pages::queue::page))
        .route("/jobs", get(pages::list::page))
        .route("/jobs/{id}", get(pages::job::page))
        .route("/workers", get(pages::workers::page))
        .route("/schedules", get(pages::schedules::page))
        .route("/events", get(pages::events::page))
        .route("/metrics", get(metrics::scrape))
        .route("/assets/dashboard.css", get(crate::layout::stylesheet))
        .route("/login", get(actions::login_page).post(actions::login))
        .route("/logout", post(actions::logout))
        .route("/jobs/{id}/retry", post(actions::retry))
        .route("/jobs/{id}/retry-from", post(actions::retry_from))
        .route("/jobs/{id}/cancel", post(actions::cancel))
        .route("/queue/pause", post(actions::pause))
        .route("/queue/resume", post(actions::resume))
        .route("/queue/limits", post(actions::set_limits))
        .route(
            "/queue/retry-dead",
            get(actions::confirm_retry_dead).post(actions::retry_dead),
        )
        .fallback(pages::not_found)
        .layer(DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&app),
            start_sampling,
        ))
        .layer(middleware::from_fn(security::response_headers))
        .with_state(app)
}
