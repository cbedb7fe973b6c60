//! The operator console at `/ui`: one HTML page, its script and its style
//! sheet, compiled into the binary (no build step, no third-party code).
//! The page talks to the same `/v1` API as any client, with the key the
//! operator enters (kept in the tab's `sessionStorage`, sent as a bearer
//! header, never as a cookie, so a foreign page's request carries no
//! credentials), and renders every value as text, never as HTML.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The page.
const INDEX_HTML: &str = include_str!("console/index.html");
/// Its script.
const APP_JS: &str = include_str!("console/app.js");
/// Its style sheet.
const APP_CSS: &str = include_str!("console/app.css");

/// The console's Content-Security-Policy: its own script, style and API
/// only; no inline script or style, no frames, no forms posted elsewhere.
pub(crate) const CONSOLE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// One asset with its type and the console's policy; never cached, so a
/// new daemon's console is what the browser shows.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CONSOLE_CSP),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response()
}

/// `GET /ui`: the page.
pub(super) async fn page() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// `GET /ui/app.js`.
pub(super) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

/// `GET /ui/app.css`.
pub(super) async fn style() -> Response {
    asset("text/css; charset=utf-8", APP_CSS)
}
