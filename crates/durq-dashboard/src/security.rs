//! Who may act, and whether a request came from the dashboard's own pages: the token
//! (a login cookie or a bearer header), the CSRF token of the forms, the `Origin` and
//! `Sec-Fetch-Site` checks, the response headers every page carries, and the `Host`
//! check of a dashboard served on loopback.

use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::input::Params;
use crate::problem::Problem;

/// The cookie a browser keeps after logging in.
pub(crate) const LOGIN_COOKIE: &str = "jobs_dashboard_token";

/// The name of the hidden form field carrying the CSRF token.
pub(crate) const CSRF_FIELD: &str = "csrf";

/// How a request is allowed to act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Auth {
    /// The dashboard has no token: anyone who reaches it may act.
    Open,
    /// The browser sent the login cookie holding the token.
    Cookie,
    /// The request carried `Authorization: Bearer <token>`: not a browser form, so no
    /// CSRF field is asked for.
    Bearer,
    /// A token is needed and the request has none.
    Anonymous,
    /// A token is needed and the request's bearer header holds a wrong one: a failed
    /// attempt, which [`Throttle`] counts.
    WrongBearer,
}

impl Auth {
    /// Whether the request may act (a read-only dashboard still refuses).
    pub fn allowed(self) -> bool {
        !matches!(self, Auth::Anonymous | Auth::WrongBearer)
    }
}

/// How `headers` authenticate against `token`.
pub(crate) fn authenticate(token: Option<&str>, headers: &HeaderMap) -> Auth {
    let Some(token) = token else {
        return Auth::Open;
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    if let Some(given) = bearer {
        if constant_time_eq(given.trim().as_bytes(), token.as_bytes()) {
            return Auth::Bearer;
        }
        return Auth::WrongBearer;
    }
    match cookie(headers, LOGIN_COOKIE) {
        Some(value) if constant_time_eq(value.as_bytes(), cookie_value(token).as_bytes()) => {
            Auth::Cookie
        }
        _ => Auth::Anonymous,
    }
}

/// Failed attempts at the dashboard's token (a wrong login, a wrong bearer header), so
/// that guessing it online takes forever: [`Throttle::BURST`] failures are allowed at
/// once, then one more every [`Throttle::EVERY`]. While none is allowed, attempts are
/// refused with 429 before the token is compared, even a right one; a browser already
/// logged in (its cookie) is never refused. One count for the whole dashboard: behind a
/// proxy every client has the proxy's address, so counting per address would count
/// nothing.
#[derive(Debug)]
pub(crate) struct Throttle {
    /// Failures still allowed now; refills with time up to [`Throttle::BURST`].
    allowance: f64,
    /// When `allowance` was last brought up to date.
    at: Instant,
}

impl Throttle {
    /// Failures allowed in a row.
    pub(crate) const BURST: f64 = 5.0;
    /// How often one more failure is allowed.
    pub(crate) const EVERY: Duration = Duration::from_secs(12);

    pub(crate) fn new(now: Instant) -> Self {
        Throttle {
            allowance: Self::BURST,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let gained =
            now.saturating_duration_since(self.at).as_secs_f64() / Self::EVERY.as_secs_f64();
        self.allowance = (self.allowance + gained).min(Self::BURST);
        self.at = now;
    }

    /// Whether a token may be tried at `now`; the wait until one may, if not.
    pub(crate) fn check(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.allowance >= 1.0 {
            return Ok(());
        }
        Err(Self::EVERY.mul_f64(1.0 - self.allowance))
    }

    /// Counts a failed attempt at `now`.
    pub(crate) fn failed(&mut self, now: Instant) {
        self.refill(now);
        self.allowance = (self.allowance - 1.0).max(0.0);
    }
}

/// The login cookie's value for `token`: its bytes in hex, so any token is a valid
/// cookie value.
pub(crate) fn cookie_value(token: &str) -> String {
    hex(token.as_bytes())
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// Refuses a request a browser says came from another site: `Sec-Fetch-Site` other
/// than `same-origin`, or an `Origin` whose host and port are not the request's
/// `Host`. A request with neither header (a script, an old browser) passes here; the
/// CSRF field or the bearer token still has to be right.
pub(crate) fn check_same_origin(headers: &HeaderMap) -> Result<(), Problem> {
    if let Some(site) = headers.get("sec-fetch-site") {
        if site.as_bytes() != b"same-origin" {
            return Err(Problem::forbidden(
                "refused: the browser says this request came from another site \
                 (Sec-Fetch-Site)",
            ));
        }
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let host = headers
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .map(str::to_ascii_lowercase);
    let origin = origin.to_str().ok().map(str::to_ascii_lowercase);
    match (origin, host) {
        (Some(origin), Some(host)) if origin_matches_host(&origin, &host) => Ok(()),
        _ => Err(Problem::forbidden(
            "refused: this request's Origin is not the dashboard's own",
        )),
    }
}

/// Whether `origin` (`scheme://host[:port]`) names `host` (`host[:port]`).
fn origin_matches_host(origin: &str, host: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    if authority == host {
        return true;
    }
    // An origin leaves out its scheme's default port, which a Host may name.
    let default_port = match scheme {
        "http" => ":80",
        "https" => ":443",
        _ => return false,
    };
    host.strip_suffix(default_port) == Some(authority)
}

/// Refuses a form whose CSRF field is not `expected`.
pub(crate) fn check_csrf(form: &Params, expected: &str) -> Result<(), Problem> {
    match form.get(CSRF_FIELD) {
        Some(given) if constant_time_eq(given.as_bytes(), expected.as_bytes()) => Ok(()),
        _ => Err(Problem::forbidden(
            "refused: the form's CSRF token is missing or stale; reload the page and try again",
        )),
    }
}

/// Whether `a` and `b` are equal, in a time that depends only on their lengths.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 32 random bytes in hex: a CSRF token.
pub(crate) fn random_token() -> String {
    hex(&rand::random::<[u8; 32]>())
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, byte| {
            let _ = write!(out, "{byte:02x}");
            out
        })
}

/// What every answer carries: no script may run, no other page may frame it, nothing
/// is cached, no referrer leaves for another site.
pub(crate) async fn response_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self' data:; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Not `no-referrer`: under it a browser sends `Origin: null` with the dashboard's
    // own form posts, which the origin check then cannot tell from another site's.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// The guard of a dashboard served on loopback: a request whose `Host` is not a
/// loopback name or address is refused, so a page on another site whose name was
/// pointed at 127.0.0.1 (DNS rebinding) cannot read the dashboard or post to it.
pub(crate) async fn loopback_host_only(request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|value| value.to_str().ok());
    if host.is_some_and(is_loopback_host) {
        next.run(request).await
    } else {
        Problem::new(
            axum::http::StatusCode::MISDIRECTED_REQUEST,
            "this dashboard listens on loopback and answers only requests addressed to \
             localhost, 127.0.0.1 or [::1]",
        )
        .into_response()
    }
}

/// Whether `host` (`name[:port]`) is `localhost`, a name under `.localhost`, an
/// address in 127.0.0.0/8, or `[::1]`.
pub(crate) fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((inside, port)) if port.is_empty() || port.starts_with(':') => inside,
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            Some(_) => return false,
            None => host,
        }
    };
    let name = name.to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    name.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).expect("a header value"));
        }
        map
    }

    #[test]
    fn tokens_are_read_from_a_bearer_header_or_the_login_cookie() {
        let token = Some("s3cret; x");
        assert_eq!(authenticate(None, &headers(&[])), Auth::Open);
        assert_eq!(authenticate(token, &headers(&[])), Auth::Anonymous);
        assert_eq!(
            authenticate(token, &headers(&[("authorization", "Bearer s3cret; x")])),
            Auth::Bearer
        );
        assert_eq!(
            authenticate(token, &headers(&[("authorization", "Bearer wrong")])),
            Auth::WrongBearer
        );
        let cookie = format!("a=b; {LOGIN_COOKIE}={}", cookie_value("s3cret; x"));
        assert_eq!(
            authenticate(token, &headers(&[("cookie", &cookie)])),
            Auth::Cookie
        );
        let wrong = format!("{LOGIN_COOKIE}={}", cookie_value("s3cret"));
        assert_eq!(
            authenticate(token, &headers(&[("cookie", &wrong)])),
            Auth::Anonymous
        );
    }

    #[test]
    fn failed_attempts_are_throttled_and_allowed_again_with_time() {
        let start = Instant::now();
        let mut throttle = Throttle::new(start);
        for _ in 0..5 {
            assert!(throttle.check(start).is_ok());
            throttle.failed(start);
        }
        let wait = throttle.check(start).expect_err("the sixth attempt waits");
        assert_eq!(wait, Throttle::EVERY, "one more is allowed after EVERY");
        assert!(throttle.check(start + Throttle::EVERY / 2).is_err());
        assert!(throttle.check(start + Throttle::EVERY).is_ok());
        throttle.failed(start + Throttle::EVERY);
        assert!(throttle.check(start + Throttle::EVERY).is_err());
        // A long quiet spell allows a burst again, never more.
        let later = start + Throttle::EVERY * 100;
        for _ in 0..5 {
            assert!(throttle.check(later).is_ok());
            throttle.failed(later);
        }
        assert!(throttle.check(later).is_err());
    }

    #[test]
    fn origins_must_be_the_dashboards_own() {
        assert!(check_same_origin(&headers(&[])).is_ok());
        assert!(check_same_origin(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080"),
            ("sec-fetch-site", "same-origin"),
        ]))
        .is_ok());
        assert!(check_same_origin(&headers(&[
            ("host", "jobs.example.com"),
            ("origin", "https://Jobs.Example.com"),
        ]))
        .is_ok());
        assert!(check_same_origin(&headers(&[
            ("host", "jobs.example.com:443"),
            ("origin", "https://jobs.example.com"),
        ]))
        .is_ok());
        for bad in [
            vec![("host", "127.0.0.1:8080"), ("origin", "http://evil.test")],
            vec![("host", "127.0.0.1:8080"), ("origin", "null")],
            vec![("origin", "http://127.0.0.1:8080")],
            vec![("sec-fetch-site", "cross-site")],
            vec![("sec-fetch-site", "same-site")],
            vec![
                ("host", "127.0.0.1:8080"),
                ("origin", "http://127.0.0.1:8081"),
            ],
        ] {
            assert!(check_same_origin(&headers(&bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn loopback_hosts() {
        for good in [
            "localhost",
            "localhost:8080",
            "dash.localhost:1",
            "127.0.0.1",
            "127.1.2.3:80",
            "[::1]:8080",
            "[::1]",
            "LOCALHOST",
        ] {
            assert!(is_loopback_host(good), "{good}");
        }
        for bad in [
            "evil.test",
            "evil.test:8080",
            "localhost.evil.test",
            "10.0.0.1:80",
            "[::2]:80",
            "127.0.0.1:x",
            "[::1]x",
            "",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn csrf_tokens_compare_whole() {
        let token = random_token();
        assert_eq!(token.len(), 64);
        assert_ne!(token, random_token());
        let form = |v: &str| Params::parse(format!("csrf={v}").as_bytes(), &["csrf"]);
        assert!(check_csrf(&form(&token).expect("form"), &token).is_ok());
        assert!(check_csrf(&form(&token[..63]).expect("form"), &token).is_err());
        assert!(check_csrf(&Params::default(), &token).is_err());
        assert!(constant_time_eq(b"", b""));
        assert!(!constant_time_eq(b"a", b"b"));
    }
}
