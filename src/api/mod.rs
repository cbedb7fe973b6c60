//! The HTTP ingest API (axum). This file holds the router, the request
//! guards (Host, cross-site and JSON checks, security headers) and the
//! OpenAPI document; authentication lives in `auth`, the error shape in
//! `error`, body and query parsing in `input`, health and metrics in
//! `health`. Job routes live in [`jobs`] (their quotas in [`quota`]),
//! dead-letter routes in [`dead_letters`], the ledger's in [`tenants`]. Handlers validate with [`crate::job`] and change state
//! only through [`Store`]; every error leaves as `{"error": {"code",
//! "message", "field"}}`.

mod auth;
mod console;
mod dead_letters;
mod error;
mod health;
mod hosts;
mod input;
mod jobs;
pub(crate) mod quota;
mod schedules;
mod server;
mod tenancy;
mod tenants;

pub use error::ApiError;
pub use input::parse_json;
pub(crate) use input::{parse_limit, parse_query};
pub(crate) use server::serve;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};

use crate::config::Config;
use crate::job::FieldError;
use crate::store::Store;
use auth::{require_scope, whoami, Credentials};
use health::{healthz, metrics_text, readyz};

/// State shared by the handlers.
#[derive(Clone)]
pub(crate) struct AppState {
    /// The job store.
    pub store: Store,
    /// The configuration.
    pub config: Arc<Config>,
    /// Set once the scripts are loaded.
    pub scripts_loaded: Arc<AtomicBool>,
    /// Renders `/metrics`, when a recorder is installed.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// This daemon's host lanes (for the in-flight and waiting figures of
    /// `/v1/hosts`).
    pub lanes: Arc<crate::hosts::lanes::Lanes>,
    /// This daemon's view of the breaker (a pause or resume made here
    /// applies here at once).
    pub breaker: Arc<crate::hosts::breaker::Breaker>,
    /// Span export (the ingest span of each job created).
    pub telemetry: Arc<crate::telemetry::Telemetry>,
    /// The tenants' live-job estimates and locks (see [`quota`]).
    pub quotas: Arc<quota::Quotas>,
}

/// The router of the whole API.
pub(crate) fn router(state: AppState) -> Router {
    let max_body = state.config.api.max_body as usize;
    let max_batch_body = state.config.api.max_batch_body as usize;
    let credentials = Arc::new(Credentials::new(&state.config.api));
    let batch = Router::new()
        .route("/v1/jobs/batch", post(jobs::create_batch))
        .layer(DefaultBodyLimit::max(max_batch_body));
    let v1 = Router::new()
        .route("/v1/jobs", post(jobs::create_job).get(jobs::list_jobs))
        .route(
            "/v1/jobs/{id}",
            get(jobs::get_job)
                .patch(jobs::patch_job)
                .delete(jobs::cancel_job),
        )
        .route("/v1/stats", get(jobs::stats))
        .route("/v1/tenants", get(tenants::list))
        .route("/v1/tenants/{name}", get(tenants::show))
        .route("/v1/whoami", get(whoami))
        .route("/v1/signing-secret", get(signing_secret))
        .route("/v1/dead-letters", get(dead_letters::list))
        .route("/v1/dead-letters/replay", post(dead_letters::replay))
        .route(
            "/v1/dead-letters/{id}",
            get(dead_letters::show).delete(dead_letters::drop),
        )
        .route(
            "/v1/schedules",
            post(schedules::create).get(schedules::list),
        )
        .route(
            "/v1/schedules/{id}",
            get(schedules::show)
                .patch(schedules::patch)
                .delete(schedules::delete),
        )
        .route("/v1/schedules/{id}/pause", post(schedules::pause))
        .route("/v1/schedules/{id}/resume", post(schedules::resume))
        .route("/v1/hosts", get(hosts::list))
        .route("/v1/hosts/{*host}", any(hosts::one))
        .layer(DefaultBodyLimit::max(max_body))
        .merge(batch)
        .route_layer(middleware::from_fn(require_json))
        .route_layer(middleware::from_fn_with_state(
            credentials.clone(),
            require_scope,
        ));
    // With tokens or keys, `/metrics` needs the read scope too (unless
    // `api.metrics_public`): it names hosts and shows the traffic.
    let scrape = Router::new().route("/metrics", get(metrics_text));
    let scrape = if state.config.api.metrics_public {
        scrape
    } else {
        scrape.route_layer(middleware::from_fn_with_state(credentials, require_scope))
    };
    let open = state.config.api.is_open();
    let router = Router::new()
        .merge(v1)
        .merge(scrape)
        .route("/openapi.json", get(openapi))
        // A person who opens the daemon's address finds the console.
        .route(
            "/",
            get(|| async { axum::response::Redirect::temporary("/ui") }),
        )
        .route("/ui", get(console::page))
        .route("/ui/", get(console::page))
        .route("/ui/app.js", get(console::script))
        .route("/ui/app.css", get(console::style))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take this method (see /openapi.json)",
            )
        })
        .layer(middleware::map_response(security_headers));
    let router = if open {
        router
            .layer(middleware::from_fn(refuse_cross_site))
            .layer(middleware::from_fn(require_ip_host))
    } else {
        router
    };
    router.with_state(state)
}

/// Headers on every answer: the browser may not sniff a type, run or load
/// anything from an answer, or frame it (the API serves JSON and text only;
/// the console's pages set their own policy, which is kept).
async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    headers
        .entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(header::HeaderValue::from_static(
            "default-src 'none'; frame-ancestors 'none'",
        ));
    headers.insert(
        header::X_FRAME_OPTIONS,
        header::HeaderValue::from_static("DENY"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        header::HeaderValue::from_static("no-referrer"),
    );
    response
}

/// `GET /v1/signing-secret?url=`: with `delivery.signing_mode =
/// "per_origin"`, the `whsec_` secrets a receiver at `url` verifies with
/// (one per configured secret, the newest first) and its origin; 400 naming
/// `url` for an invalid URL, 409 `signing_mode_shared` in shared mode
/// (every receiver then verifies with `delivery.signing_secrets`).
async fn signing_secret(
    State(state): State<AppState>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Result<Response, ApiError> {
    let pairs = parse_query(query.as_deref(), &["url"])?;
    let url = pairs
        .iter()
        .find(|(n, _)| n == "url")
        .map(|(_, v)| v.as_str())
        .ok_or_else(|| FieldError::new("missing_field", "url", "give the receiver's url"))?;
    let url = crate::job::validate_url(url, "url")?;
    use crate::delivery::signing::{receiver_secrets_for, NoReceiverSecrets};
    match receiver_secrets_for(&state.config.delivery, &url) {
        Ok(answer) => Ok(Json(answer).into_response()),
        Err(why) => {
            let (status, code) = match why {
                NoReceiverSecrets::Config(_) => (StatusCode::INTERNAL_SERVER_ERROR, "config"),
                NoReceiverSecrets::Unsigned => (StatusCode::CONFLICT, "unsigned"),
                NoReceiverSecrets::Shared => (StatusCode::CONFLICT, "signing_mode_shared"),
            };
            Err(ApiError::new(status, code, why.to_string()))
        }
    }
}

/// Without tokens, serves only requests whose `Host` is an IP address or
/// `localhost` (with any port), else 421 `misdirected_request` naming
/// `host`: a page that rebinds its own DNS name to this address (DNS
/// rebinding) sends that name, so it cannot read or drive the API.
async fn require_ip_host(request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| request.uri().host())
        .unwrap_or("");
    if host_is_ip_or_localhost(host) {
        return next.run(request).await;
    }
    ApiError {
        status: StatusCode::MISDIRECTED_REQUEST,
        code: "misdirected_request",
        message: "without api.tokens this API answers only requests to an IP address or localhost"
            .into(),
        field: Some("host".into()),
    }
    .into_response()
}

/// Without tokens, refuses a request that changes state (any method but
/// GET, HEAD and OPTIONS) sent by a web page of another origin, body or no
/// body: 403 `forbidden` naming `origin` when its `Origin` is present and
/// not this daemon's own ([`is_own_origin`]), or its `Sec-Fetch-Site` is
/// `cross-site` or `same-site` (a page of another port of the same host is
/// same-site, yet another origin). A browser sends `Origin` with every
/// such request; curl and other programs send neither header and are
/// served. With tokens, a page cannot attach one (no CORS is allowed).
async fn refuse_cross_site(request: Request, next: Next) -> Response {
    use axum::http::Method;
    let safe = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    if safe || !from_another_origin(&request) {
        return next.run(request).await;
    }
    ApiError {
        status: StatusCode::FORBIDDEN,
        code: "forbidden",
        message: "without api.tokens this API refuses changes sent by a web page of another \
                  origin (`Origin` or `Sec-Fetch-Site`)"
            .into(),
        field: Some("origin".into()),
    }
    .into_response()
}

/// Whether `request` says it comes from a page of another origin.
fn from_another_origin(request: &Request) -> bool {
    let headers = request.headers();
    let site = headers.get("sec-fetch-site").map(|v| v.as_bytes());
    if site.is_some_and(|s| {
        s.eq_ignore_ascii_case(b"cross-site") || s.eq_ignore_ascii_case(b"same-site")
    }) {
        return true;
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    // HTTP/2 carries the host in the URI's authority.
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    let local = request
        .extensions()
        .get::<server::LocalAddr>()
        .map(|local| local.0);
    !origin
        .to_str()
        .is_ok_and(|origin| is_own_origin(origin, host, local))
}

/// Whether `origin` (an `Origin` value) is this daemon's own: scheme
/// http(s) and the host and port of the request's `Host`, of the local
/// address the request came in on, or `localhost` with that port (default
/// ports made explicit). `null` and anything else are not.
fn is_own_origin(origin: &str, host: Option<&str>, local: Option<std::net::SocketAddr>) -> bool {
    let Ok(origin) = url::Url::parse(origin) else {
        return false;
    };
    let scheme = origin.scheme();
    if !matches!(scheme, "http" | "https") {
        return false;
    }
    let same = |authority: &str| {
        url::Url::parse(&format!("{scheme}://{authority}")).is_ok_and(|own| {
            own.host() == origin.host()
                && own.port_or_known_default() == origin.port_or_known_default()
        })
    };
    host.is_some_and(same)
        || local.is_some_and(|local| {
            same(&local.to_string()) || same(&format!("localhost:{}", local.port()))
        })
}

/// Whether a `Host` value (with or without a port) is `localhost` or an IP
/// address literal.
fn host_is_ip_or_localhost(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => {
            return v6.split_once(']').is_some_and(|(ip, rest)| {
                ip.parse::<std::net::Ipv6Addr>().is_ok()
                    && rest.strip_prefix(':').map_or(rest.is_empty(), |port| {
                        port.bytes().all(|b| b.is_ascii_digit())
                    })
            })
        }
        None => host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                name
            } else {
                host
            }
        }),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

/// Refuses a request that sends a body in anything but JSON with 415
/// `unsupported_media_type` naming `content-type`: a `text/plain` or form
/// body is what a web page can send cross-site without asking (no CORS
/// preflight), so the API must not act on it. A request without a body
/// (`content-length: 0` or none) needs no content type.
async fn require_json(request: Request, next: Next) -> Response {
    let headers = request.headers();
    let sends_body = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .map_or_else(
            || headers.contains_key(header::TRANSFER_ENCODING),
            |n| n.trim() != "0",
        );
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"));
    if sends_body && !is_json {
        return ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code: "unsupported_media_type",
            message: "the body must be JSON, sent with `content-type: application/json`".into(),
            field: Some("content-type".into()),
        }
        .into_response();
    }
    next.run(request).await
}

/// The OpenAPI document of this API (also `openapi.json` in the repository).
pub(crate) const OPENAPI: &str = include_str!("../../openapi.json");

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_without_tokens_are_ip_literals_or_localhost() {
        for ok in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "localhost",
            "LOCALHOST:80",
            "[::1]:8080",
            "10.1.2.3:80",
        ] {
            assert!(host_is_ip_or_localhost(ok), "{ok}");
        }
        for bad in [
            "",
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "[::1",
            "127.0.0.1.nip.io",
            "0x7f.1",
        ] {
            assert!(!host_is_ip_or_localhost(bad), "{bad}");
        }
    }

    #[test]
    fn own_origins_are_the_host_the_local_address_or_localhost() {
        let local: Option<std::net::SocketAddr> = "127.0.0.1:8080".parse().ok();
        for (origin, host) in [
            ("http://127.0.0.1:8080", None),
            ("http://localhost:8080", None),
            ("http://LOCALHOST:8080", None),
            ("http://localhost:18080", Some("localhost:18080")),
            ("http://10.0.0.5", Some("10.0.0.5:80")),
            ("http://[::1]:9000", Some("[::1]:9000")),
        ] {
            assert!(is_own_origin(origin, host, local), "{origin} {host:?}");
        }
        for (origin, host) in [
            ("http://evil.example", Some("127.0.0.1:8080")),
            ("null", Some("127.0.0.1:8080")),
            ("http://localhost:8081", Some("127.0.0.1:8080")),
            ("http://127.0.0.2:8080", Some("127.0.0.1:8080")),
            ("file://", None),
            ("ftp://127.0.0.1:8080", None),
        ] {
            assert!(!is_own_origin(origin, host, local), "{origin} {host:?}");
        }
    }
}
