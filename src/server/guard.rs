//! What every request passes before routing: protection from web pages the user has open
//! (a server on the user's own machine is reachable from their browser) and bounds on how
//! a client may send its body.
//!
//! - **Host**: a server bound to a loopback address answers only requests whose `Host` is
//!   a loopback name (`localhost`, `*.localhost`, `127.0.0.1`, `[::1]`, any port) or one of
//!   `--allowed-hosts`. A page that rebinds its own DNS name to 127.0.0.1 (DNS rebinding)
//!   sends its own name as `Host` and is refused. Bound elsewhere, any `Host` is served
//!   unless `--allowed-hosts` is given.
//! - **Origin**: browsers send `Origin` on every cross-origin POST and on cross-origin
//!   fetches. A request carrying an `Origin` that is not a loopback page
//!   (`http://localhost:3000`, ...) or one of `--allowed-origins` is refused, and CORS
//!   headers (preflight answers included) are sent only to the allowed ones.
//! - **Content type**: `POST /v1/*` needs `Content-Type: application/json`, so a page cannot
//!   send a JSON body as `text/plain`, which browsers send cross-site without a preflight.
//! - **Body**: a `Content-Length` above `--max-body-bytes` is refused before any of the
//!   body is read (so no `100 Continue` is sent), and so is the body of a `/v1/*` request
//!   without the API key (401); otherwise the body is read here, within three bounds, each
//!   cut answering 408 and closing the connection: nothing may arrive for
//!   `--body-timeout-secs` (a stall), the whole body must arrive within
//!   `--body-deadline-secs`, and after the first [`BODY_RATE_GRACE`] it must keep up
//!   `--min-body-rate` bytes a second on average. The last two stop the "slow POST", a
//!   client that sends a byte now and then, short of every pause limit, to hold its
//!   connection forever.
//!
//! Every refusal is an OpenAI-shaped JSON error.

use super::error::ApiError;
use super::metrics::{cut, Metrics};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower_http::cors::{AllowOrigin, CorsLayer};

/// How long a body may take after its first [`BODY_RATE_GRACE`] is bounded by
/// [`BodyLimits::min_rate`]; before, any pace is fine (a connection's slow start).
pub const BODY_RATE_GRACE: Duration = Duration::from_secs(5);

/// The bounds on a request body's arrival (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    /// Longest wait for the next piece.
    pub idle: Duration,
    /// Longest time for the whole body.
    pub deadline: Duration,
    /// Fewest bytes a second, on average since the body began, once [`BODY_RATE_GRACE`]
    /// has passed; 0: no minimum.
    pub min_rate: u64,
}

impl BodyLimits {
    /// Why a body that began at `start`, last sent something at `last` and has `received`
    /// bytes is cut at `now`, if it is: the kind of cut (as `/metrics` counts it) and the
    /// client's message.
    fn cut(
        &self,
        start: Instant,
        last: Instant,
        now: Instant,
        received: usize,
    ) -> Option<(&'static str, String)> {
        let (idle, total) = (now - last, now - start);
        if idle >= self.idle {
            return Some((
                cut::BODY_STALL,
                format!(
                    "the request body stalled: nothing arrived for {} s",
                    self.idle.as_secs_f64()
                ),
            ));
        }
        if total >= self.deadline {
            return Some((
                cut::BODY_DEADLINE,
                format!(
                    "the request body took longer than {} s in all",
                    self.deadline.as_secs_f64()
                ),
            ));
        }
        let rate = received as f64 / total.as_secs_f64();
        if self.min_rate > 0 && total >= BODY_RATE_GRACE && rate < self.min_rate as f64 {
            return Some((
                cut::BODY_RATE,
                format!(
                    "the request body arrived at {rate:.0} bytes/s; after the first {} s the \
                     minimum is {} bytes/s",
                    BODY_RATE_GRACE.as_secs(),
                    self.min_rate
                ),
            ));
        }
        None
    }

    /// How long to wait for the next piece before looking again: until the stall or the
    /// deadline would cut, and every second once the rate counts.
    fn next_look(&self, start: Instant, last: Instant, now: Instant) -> Duration {
        let mut wait = (last + self.idle)
            .min(start + self.deadline)
            .saturating_duration_since(now);
        if self.min_rate > 0 {
            let rate_from = (start + BODY_RATE_GRACE).saturating_duration_since(now);
            wait = wait.min(rate_from.max(Duration::from_secs(1)));
        }
        wait.max(Duration::from_millis(1))
    }
}

/// The paths that take a JSON body and the API key: `/v1/*`, `/admin/*`, `/tokenize`,
/// `/detokenize`.
pub fn is_api(path: &str) -> bool {
    path.starts_with("/v1/")
        || path.starts_with("/admin/")
        || path == "/tokenize"
        || path == "/detokenize"
}

/// What the guard lets through.
#[derive(Clone, Debug)]
pub struct GuardConfig {
    /// Host names (without port, lower case) served; `None`: any. `*` in the list: any.
    pub allowed_hosts: Option<Vec<String>>,
    /// Origins (`scheme://host[:port]`) besides loopback pages; `*`: any.
    pub allowed_origins: Vec<String>,
    pub max_body_bytes: usize,
    /// How a body must arrive (see [`BodyLimits`]).
    pub body: BodyLimits,
    /// The server's API key: a `/v1/*` body is not read for a client without it.
    pub api_key: Option<String>,
    /// Where cut bodies are counted.
    pub metrics: Arc<Metrics>,
}

impl GuardConfig {
    /// The hosts a server bound to `bind` serves: loopback names only when it is bound to a
    /// loopback address and no list is given.
    pub fn hosts_for(bind: &str, allowed: &[String]) -> Option<Vec<String>> {
        if !allowed.is_empty() {
            return Some(allowed.iter().map(|h| h.to_ascii_lowercase()).collect());
        }
        let host = bind.trim_start_matches('[').trim_end_matches(']');
        let loopback = host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        loopback.then(Vec::new)
    }

    fn host_allowed(&self, host: &str) -> bool {
        let Some(list) = &self.allowed_hosts else {
            return true;
        };
        let name = host_name(host).to_ascii_lowercase();
        is_loopback_name(&name) || list.iter().any(|h| h == "*" || *h == name)
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        let loopback_page = ["http://", "https://"]
            .iter()
            .find_map(|s| origin.strip_prefix(s))
            .is_some_and(|rest| is_loopback_name(&host_name(rest).to_ascii_lowercase()));
        loopback_page
            || self
                .allowed_origins
                .iter()
                .any(|o| o == "*" || o.eq_ignore_ascii_case(origin.trim_end_matches('/')))
    }

    /// The CORS layer: preflights answered and `Access-Control-Allow-Origin` sent for
    /// allowed origins only.
    pub fn cors(self: &Arc<Self>) -> CorsLayer {
        let me = self.clone();
        CorsLayer::new()
            .allow_origin(AllowOrigin::predicate(move |origin: &HeaderValue, _| {
                origin.to_str().is_ok_and(|o| me.origin_allowed(o))
            }))
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
            .max_age(Duration::from_secs(600))
    }
}

/// `host[:port]` or `[v6]:port` without the port.
fn host_name(authority: &str) -> &str {
    let authority = authority.split('/').next().unwrap_or_default();
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    authority.rsplit_once(':').map_or(authority, |(h, _)| h)
}

fn is_loopback_name(name: &str) -> bool {
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn forbidden(message: String) -> Response {
    let mut e = ApiError::invalid(message);
    e.status = StatusCode::FORBIDDEN;
    e.into_response()
}

/// The checks above, then the body read into memory for the handler.
pub async fn check(State(g): State<Arc<GuardConfig>>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.to_string()));
    if let Some(host) = host.filter(|h| !g.host_allowed(h)) {
        return forbidden(format!(
            "requests for host {host:?} are not served; start the server with \
             --allowed-hosts to serve a name other than localhost"
        ));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("(not text)");
        if req.method() != Method::OPTIONS && !g.origin_allowed(origin) {
            return forbidden(format!(
                "cross-origin requests from {origin} are not served; start the server with \
                 --allowed-origins {origin} to allow them"
            ));
        }
    }
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let api = is_api(req.uri().path());
    if api && !is_json(req.headers()) {
        let mut e = ApiError::invalid("send the request body as Content-Type: application/json");
        e.status = StatusCode::UNSUPPORTED_MEDIA_TYPE;
        return e.into_response();
    }
    if api && !key_matches(g.api_key.as_deref(), req.headers()) {
        return close(ApiError::unauthorized().into_response());
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > g.max_body_bytes as u64) {
        return close(ApiError::too_large(g.max_body_bytes).into_response());
    }
    let (parts, body) = req.into_parts();
    match read_body(body, g.max_body_bytes, g.body, &g.metrics).await {
        Ok(bytes) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(e) => close(e.into_response()),
    }
}

/// Whether `headers` carry `Authorization: Bearer KEY` for `key` (compared in constant
/// time); true when the server has no key.
pub fn key_matches(key: Option<&str>, headers: &HeaderMap) -> bool {
    use subtle::ConstantTimeEq;
    let Some(key) = key else {
        return true;
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, key) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(key.trim())
        })
        .unwrap_or("");
    bool::from(given.as_bytes().ct_eq(key.as_bytes()))
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|t| t.trim().to_ascii_lowercase())
        .is_some_and(|t| t == "application/json" || t.ends_with("+json"))
}

/// A response after which the connection is closed (the rest of the body is not read).
fn close(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// The whole body, at most `limit` bytes, arriving within `limits`.
async fn read_body(
    mut body: Body,
    limit: usize,
    limits: BodyLimits,
    metrics: &Metrics,
) -> Result<Bytes, ApiError> {
    let mut buf = Vec::new();
    let start = Instant::now();
    let mut last = start;
    loop {
        let now = Instant::now();
        if let Some((kind, why)) = limits.cut(start, last, now, buf.len()) {
            metrics.cut(kind);
            let mut e = ApiError::invalid(why);
            e.status = StatusCode::REQUEST_TIMEOUT;
            return Err(e);
        }
        let frame =
            match tokio::time::timeout(limits.next_look(start, last, now), body.frame()).await {
                Err(_) => continue, // time to look at the bounds again
                Ok(None) => return Ok(Bytes::from(buf)),
                Ok(Some(Err(e))) => {
                    return Err(ApiError::invalid(format!("reading the request body: {e}")))
                }
                Ok(Some(Ok(frame))) => frame,
            };
        if let Ok(data) = frame.into_data() {
            last = Instant::now();
            if buf.len() + data.len() > limit {
                return Err(ApiError::too_large(limit));
            }
            buf.extend_from_slice(&data);
        }
    }
}

#[cfg(test)]
mod body_tests {
    use super::*;

    const LIMITS: BodyLimits = BodyLimits {
        idle: Duration::from_secs(30),
        deadline: Duration::from_secs(120),
        min_rate: 1024,
    };

    #[test]
    fn each_bound_cuts_a_body_and_names_itself() {
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        // A byte every few seconds: under every pause limit, cut by the rate after 5 s.
        let (kind, why) = LIMITS.cut(t0, at(4.0), at(5.0), 3).unwrap();
        assert_eq!(kind, cut::BODY_RATE);
        assert!(why.contains("bytes/s") && why.contains("1024"), "{why}");
        assert!(
            LIMITS.cut(t0, at(4.0), at(4.9), 3).is_none(),
            "within the grace"
        );
        // Fast enough, but past the deadline.
        let (kind, why) = LIMITS.cut(t0, at(119.0), at(120.0), 10 << 20).unwrap();
        assert_eq!(kind, cut::BODY_DEADLINE);
        assert!(why.contains("120 s in all"), "{why}");
        // A stall.
        let (kind, why) = LIMITS.cut(t0, at(1.0), at(31.0), 1 << 20).unwrap();
        assert_eq!(kind, cut::BODY_STALL);
        assert!(why.contains("stalled"), "{why}");
        // A body at 2 KiB/s for a minute passes.
        assert!(LIMITS.cut(t0, at(59.5), at(60.0), 120 << 10).is_none());
        // No minimum: only the stall and the deadline count.
        let none = BodyLimits {
            min_rate: 0,
            ..LIMITS
        };
        assert!(none.cut(t0, at(9.0), at(10.0), 1).is_none());
    }

    #[test]
    fn the_next_look_comes_before_any_bound_cuts() {
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let wait = LIMITS.next_look(t0, t0, t0);
        assert_eq!(
            wait, BODY_RATE_GRACE,
            "the rate counts from the grace's end"
        );
        assert_eq!(
            LIMITS.next_look(t0, at(6.0), at(6.5)),
            Duration::from_secs(1)
        );
        let near_end = LIMITS.next_look(t0, at(119.7), at(119.8));
        assert!(near_end <= Duration::from_millis(200), "{near_end:?}");
        let none = BodyLimits {
            min_rate: 0,
            ..LIMITS
        };
        assert_eq!(none.next_look(t0, t0, t0), Duration::from_secs(30));
    }
}
