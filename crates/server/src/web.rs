//! The chat page at `/`: one HTML file compiled into the binary (no CDN, nothing fetched from
//! elsewhere: its policy allows requests to this server only). Conversations live in the
//! browser's storage; answers stream from `/v1/chat/completions` with the key set in the page.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const PAGE: &str = include_str!("web/index.html");

pub async fn index() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; form-action 'none'",
            ),
        ],
        PAGE,
    )
        .into_response()
}
