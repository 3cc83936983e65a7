//! What every request passes before a handler sees it: the Host and Origin checks that keep a
//! web page (cross-site posts, DNS rebinding) away from a server on loopback, CORS when asked
//! for, the API key (compared in constant time, never printed), and for POSTs a JSON content
//! type and a body read within its size and time limits.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::{ApiError, AppState};

/// An API key: compared in constant time, and never shown by `Debug`.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    /// None for an empty key (no key).
    pub fn new(key: String) -> Option<ApiKey> {
        (!key.is_empty()).then_some(ApiKey(key))
    }

    /// Equal bytes, in time that depends on the lengths only.
    pub fn matches(&self, given: &[u8]) -> bool {
        let key = self.0.as_bytes();
        let mut diff = (key.len() ^ given.len()) as u8 | u8::from(key.len() != given.len());
        for (i, &k) in key.iter().enumerate() {
            diff |= k ^ given.get(i).copied().unwrap_or(!k);
        }
        std::hint::black_box(diff) == 0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Which Host and Origin headers the server answers.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// Host names (without port) accepted besides loopback's and the bound address; `*`: any.
    pub hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`) allowed to call from a browser, with CORS; `*`: any.
    pub origins: Vec<String>,
}

const LOOPBACK_NAMES: &[&str] = &["localhost", "127.0.0.1", "::1", "[::1]"];

/// The host part of a Host header or an origin's authority (`[v6]:port`, `name:port`).
fn host_of(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !host.contains(':') => host,
        _ => authority,
    }
}

impl Access {
    /// Whether `host` (a Host header, port allowed) names this server.
    fn host_allowed(&self, host: &str, bound: std::net::IpAddr) -> bool {
        if bound.is_unspecified() || self.hosts.iter().any(|h| h == "*") {
            return true;
        }
        let name = host_of(host).trim_end_matches('.').to_ascii_lowercase();
        let name = name.as_str();
        LOOPBACK_NAMES.contains(&name)
            || name.ends_with(".localhost")
            || name
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip == bound || ip.is_loopback())
            || self.hosts.iter().any(|h| h.eq_ignore_ascii_case(name))
    }

    /// Whether a browser page at `origin` may call: one of `--allowed-origin`, or a page of
    /// this server itself (its authority is the request's Host). Any other page, on another
    /// site or another local port, is refused: a form or `fetch` there must not reach the API.
    fn origin_allowed(&self, origin: &str, host: &str) -> bool {
        if self
            .origins
            .iter()
            .any(|o| o == "*" || o.eq_ignore_ascii_case(origin))
        {
            return true;
        }
        match origin.split_once("://") {
            Some(("http" | "https", authority)) => !host.is_empty() && authority.eq_ignore_ascii_case(host),
            _ => false,
        }
    }

    fn cors_allowed(&self, origin: &str) -> bool {
        self.origins
            .iter()
            .any(|o| o == "*" || o.eq_ignore_ascii_case(origin))
    }
}

fn forbidden(message: String) -> Response {
    ApiError::new(StatusCode::FORBIDDEN, "invalid_request_error", message)
        .with_code("forbidden")
        .into_response()
}

fn header_text(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Host and Origin checks, and CORS (preflights answered, the allow header added) for the
/// origins `--allowed-origin` names.
pub async fn access(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let access = &state.options.access;
    let bound = state.options.addr.ip();
    let headers = request.headers();
    let host = header_text(headers, header::HOST).unwrap_or("");
    if !access.host_allowed(host, bound) {
        return forbidden(format!(
            "Host `{host}` is not this server's (start it with --allowed-host NAME to answer to that name)."
        ));
    }
    let origin = header_text(headers, header::ORIGIN).map(str::to_string);
    if let Some(origin) = &origin {
        if !access.origin_allowed(origin, host) {
            return forbidden(format!(
                "Requests from the web page at `{origin}` are not allowed (start the server with --allowed-origin {origin} to allow them)."
            ));
        }
    }
    let cors = origin.filter(|o| access.cors_allowed(o));
    if request.method() == Method::OPTIONS {
        let Some(origin) = cors else {
            return ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                "OPTIONS is answered only for origins given with --allowed-origin.",
            )
            .into_response();
        };
        let mut response = StatusCode::NO_CONTENT.into_response();
        let h = response.headers_mut();
        allow_origin(h, &origin);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("authorization, content-type"),
        );
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        return response;
    }
    let mut response = next.run(request).await;
    if let Some(origin) = cors {
        allow_origin(response.headers_mut(), &origin);
    }
    response
}

fn allow_origin(headers: &mut HeaderMap, origin: &str) {
    if let Ok(v) = HeaderValue::from_str(origin) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        headers.insert(header::VARY, HeaderValue::from_static("origin"));
    }
}

/// `Authorization: Bearer KEY` on the API routes, when the server has a key.
pub async fn auth(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.options.api_key {
        // `Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY` (Anthropic's).
        let headers = request.headers();
        let given = (headers.get(header::AUTHORIZATION))
            .map(|v| v.as_bytes())
            .and_then(|v| v.strip_prefix(b"Bearer "))
            .or_else(|| headers.get("x-api-key").map(|v| v.as_bytes()));
        if !given.is_some_and(|g| key.matches(g)) {
            return ApiError {
                code: Some("invalid_api_key"),
                ..ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "invalid_request_error",
                    "Incorrect or missing API key: send `Authorization: Bearer KEY` (or `x-api-key: KEY`).",
                )
            }
            .into_response();
        }
    }
    next.run(request).await
}

/// Whether a Content-Type names JSON (`application/json`, any parameters).
fn is_json(content_type: Option<&str>) -> bool {
    content_type
        .and_then(|t| t.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// A POST's body: JSON by its Content-Type (415), at most `--max-body` bytes (413, checked on
/// Content-Length before reading), all of it within `--body-timeout` (408). Handlers then get
/// it whole.
pub async fn body(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let headers = request.headers();
    if !is_json(header_text(headers, header::CONTENT_TYPE)) {
        let given = header_text(headers, header::CONTENT_TYPE).unwrap_or("none");
        return ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            format!("The request body must be JSON sent as `Content-Type: application/json` (got {given})."),
        )
        .with_code("unsupported_media_type")
        .into_response();
    }
    let limit = state.options.body_limit;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("The request body is larger than this server accepts ({limit} bytes, --max-body)."),
        )
        .with_code("request_too_large")
        .into_response()
    };
    let declared = header_text(headers, header::CONTENT_LENGTH).and_then(|l| l.parse::<u64>().ok());
    let timeout: Duration = state.options.limits.body_timeout;
    if declared.is_some_and(|l| l > limit as u64) {
        // Read (and drop) a body of reasonable size first, so the client sees the 413 rather
        // than a connection reset while it is still sending.
        if declared.is_some_and(|l| l <= DRAIN_LIMIT) {
            let _ = tokio::time::timeout(timeout, drain(request.into_body())).await;
        }
        return too_large();
    }
    let (parts, body) = request.into_parts();
    let bytes = match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            let length_limit =
                std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if length_limit {
                return too_large();
            }
            return ApiError::bad_request(format!("Could not read the request body: {e}"))
                .with_code("incomplete_body")
                .into_response();
        }
        Err(_) => {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "The request body did not arrive within {} s (--body-timeout).",
                    timeout.as_secs_f64()
                ),
            )
            .with_code("request_timeout")
            .into_response();
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// Bodies over the limit up to this size are read and dropped before the 413.
const DRAIN_LIMIT: u64 = 64 << 20;

async fn drain(mut body: Body) {
    use http_body_util::BodyExt;
    while let Some(Ok(_)) = body.frame().await {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn api_keys_compare_whole_and_never_print() {
        let key = ApiKey::new("s3cret".into()).unwrap();
        assert!(key.matches(b"s3cret"));
        for wrong in [&b"s3cre"[..], b"s3cret!", b"S3cret", b"", b"\0\0\0\0\0\0"] {
            assert!(!key.matches(wrong), "{wrong:?}");
        }
        assert!(ApiKey::new(String::new()).is_none());
        assert!(!format!("{key:?}").contains("s3cret"));
    }

    #[test]
    fn loopback_answers_its_own_names_only() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let a = Access::default();
        for ok in [
            "localhost:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "LOCALHOST",
            "app.localhost:1",
        ] {
            assert!(a.host_allowed(ok, lo), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
        ] {
            assert!(!a.host_allowed(bad, lo), "{bad}");
        }
        // Pages of this server itself; not another site, nor another local port.
        assert!(a.origin_allowed("http://localhost:8080", "localhost:8080"));
        assert!(!a.origin_allowed("http://localhost:3000", "localhost:8080"));
        assert!(!a.origin_allowed("https://evil.example", "localhost:8080"));
        assert!(!a.origin_allowed("null", "localhost:8080"));
        assert!(!a.origin_allowed("https://evil.example", ""));
        let open = Access {
            hosts: vec!["box.lan".into()],
            origins: vec!["https://chat.example".into()],
        };
        assert!(open.host_allowed("box.lan:8080", lo));
        assert!(open.origin_allowed("https://chat.example", "box.lan:8080"));
        assert!(open.cors_allowed("https://chat.example"));
        assert!(!open.cors_allowed("http://localhost:3000"));
        // Bound to every address: any name reaches it, but pages of other sites still do not.
        assert!(a.host_allowed("10.0.0.5:8080", "0.0.0.0".parse().unwrap()));
        assert!(!a.origin_allowed("https://evil.example", "10.0.0.5:8080"));
    }

    #[test]
    fn json_content_types() {
        assert!(is_json(Some("application/json")));
        assert!(is_json(Some("Application/JSON; charset=utf-8")));
        assert!(!is_json(Some("text/plain")));
        assert!(!is_json(Some("application/x-www-form-urlencoded")));
        assert!(!is_json(None));
    }
}
