//! Authentication: the configured bearer tokens and keys ([`Credentials`]),
//! the scope each `/v1` route needs, the middleware that answers 401/403,
//! and `GET /v1/whoami`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::ApiError;
use crate::config::Scope;

/// The digests of the configured bearer tokens, each with its scopes:
/// `api.tokens` have every scope, `[[api.keys]]` their own.
pub(crate) struct Credentials {
    known: Vec<Known>,
}

/// One configured token: its digest, the name it is known by (`api.tokens`
/// for those) and its scopes.
struct Known {
    digest: [u8; 32],
    name: String,
    scopes: Vec<Scope>,
    tenant: Option<String>,
}

/// Who sent a `/v1` request (a request extension set by the scope check;
/// absent when the API is open).
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// The key's name (`api.tokens` for a token of that list).
    pub name: String,
    /// What the key may do.
    pub scopes: Vec<Scope>,
    /// The tenant the key is bound to (`[[api.keys]] tenant`); None: any.
    pub tenant: Option<String>,
}

impl Credentials {
    /// The credentials `api` configures (none: the API is open).
    pub(crate) fn new(api: &crate::config::ApiConfig) -> Credentials {
        use sha2::Digest;
        let tokens = api.tokens.iter().map(|t| Known {
            digest: sha2::Sha256::digest(t.as_bytes()).into(),
            name: "api.tokens".into(),
            scopes: Scope::ALL.to_vec(),
            tenant: None,
        });
        let keys = api.keys.iter().filter_map(|k| {
            Some(Known {
                digest: k.digest()?,
                name: k.name.clone(),
                scopes: k.scopes.clone(),
                tenant: k.tenant.clone(),
            })
        });
        Credentials {
            known: tokens.chain(keys).collect(),
        }
    }

    /// Who `presented` is, or None when no configured token matches. Its
    /// SHA-256 digest is compared with every known digest in constant time
    /// and without an early exit, so neither the bytes nor the length of a
    /// token leak through timing.
    pub(crate) fn caller(&self, presented: &str) -> Option<Caller> {
        use sha2::Digest;
        use subtle::ConstantTimeEq;
        let presented = sha2::Sha256::digest(presented.as_bytes());
        let mut found = None;
        for known in &self.known {
            let matches = bool::from(presented.as_slice().ct_eq(&known.digest));
            if matches && found.is_none() {
                found = Some(Caller {
                    name: known.name.clone(),
                    scopes: known.scopes.clone(),
                    tenant: known.tenant.clone(),
                });
            }
        }
        found
    }
}

/// The scope a `/v1` request needs: none for `/v1/whoami` (any known key
/// may ask what it may do), `read` for GET (and HEAD), `admin` for
/// replaying or deleting dead letters and pausing or resuming hosts,
/// `write` for every other change (create, patch, cancel).
pub(crate) fn required_scope(method: &axum::http::Method, path: &str) -> Option<Scope> {
    use axum::http::Method;
    if path == "/v1/whoami" {
        None
    } else if path == "/v1/signing-secret" {
        // A receiver's secret lets its holder sign as hookq to it.
        Some(Scope::Admin)
    } else if method == Method::GET || method == Method::HEAD {
        Some(Scope::Read)
    } else if path.starts_with("/v1/dead-letters") || path.starts_with("/v1/hosts") {
        Some(Scope::Admin)
    } else {
        Some(Scope::Write)
    }
}

/// With tokens or keys configured, answers a `/v1/*` (or `/metrics`) request 401
/// `unauthorized` without a known bearer token, and 403 `forbidden` when
/// its key lacks the scope the request needs; otherwise passes it on with
/// its [`Caller`].
pub(super) async fn require_scope(
    State(credentials): State<Arc<Credentials>>,
    mut request: Request,
    next: Next,
) -> Response {
    if credentials.known.is_empty() {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let Some(caller) = credentials.caller(presented) else {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong `Authorization: Bearer <token>`",
        )
        .into_response();
    };
    if let Some(needed) = required_scope(request.method(), request.uri().path()) {
        if !caller.scopes.contains(&needed) {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "key `{}` lacks the `{}` scope this request needs",
                    caller.name,
                    needed.as_str()
                ),
            )
            .into_response();
        }
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// `GET /v1/whoami`: the calling key's name and scopes (every scope, and
/// `open`, when the API asks for no token), so that a client such as the
/// console offers only what the key may do.
pub(super) async fn whoami(caller: Option<axum::Extension<Caller>>) -> Json<serde_json::Value> {
    let scopes = |list: &[Scope]| list.iter().map(|s| s.as_str()).collect::<Vec<_>>();
    Json(match caller {
        Some(axum::Extension(caller)) => {
            json!({"key": caller.name, "scopes": scopes(&caller.scopes), "open": false})
        }
        None => json!({"key": null, "scopes": scopes(&Scope::ALL), "open": true}),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Credentials {
        /// The scopes of `presented` (none when unknown).
        fn scopes_of(&self, presented: &str) -> Vec<Scope> {
            self.caller(presented).map(|c| c.scopes).unwrap_or_default()
        }
    }

    #[test]
    fn tokens_and_keys_grant_their_scopes() {
        use sha2::Digest;
        let digest = |t: &str| {
            sha2::Sha256::digest(t.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        let key = |name: &str, token: &str, scopes: &[Scope]| crate::config::ApiKey {
            name: name.into(),
            token_sha256: digest(token),
            scopes: scopes.to_vec(),
            tenant: None,
        };
        let api = crate::config::ApiConfig {
            tokens: vec!["secret-token".into(), "other-token-2".into()],
            keys: vec![
                key("support", "look-only-token", &[Scope::Read]),
                key("ops", "ops-token-xyz", &[Scope::Read, Scope::Admin]),
            ],
            ..Default::default()
        };
        let credentials = Credentials::new(&api);
        assert_eq!(credentials.scopes_of("secret-token"), Scope::ALL);
        assert_eq!(credentials.scopes_of("other-token-2"), Scope::ALL);
        assert_eq!(credentials.scopes_of("look-only-token"), [Scope::Read]);
        assert_eq!(
            credentials.scopes_of("ops-token-xyz"),
            [Scope::Read, Scope::Admin]
        );
        for unknown in ["secret-tokem", "short", "", "LOOK-ONLY-TOKEN"] {
            assert!(credentials.scopes_of(unknown).is_empty(), "{unknown}");
        }
        assert!(Credentials::new(&Default::default())
            .scopes_of("secret-token")
            .is_empty());
    }

    #[test]
    fn each_route_needs_its_scope() {
        use axum::http::Method;
        for (method, path, scope) in [
            (Method::GET, "/v1/jobs", Scope::Read),
            (Method::GET, "/v1/dead-letters/x", Scope::Read),
            (Method::HEAD, "/v1/stats", Scope::Read),
            (Method::POST, "/v1/jobs", Scope::Write),
            (Method::POST, "/v1/jobs/batch", Scope::Write),
            (Method::PATCH, "/v1/jobs/x", Scope::Write),
            (Method::DELETE, "/v1/jobs/x", Scope::Write),
            (Method::POST, "/v1/dead-letters/replay", Scope::Admin),
            (Method::DELETE, "/v1/dead-letters/x", Scope::Admin),
            (Method::POST, "/v1/hosts/h/pause", Scope::Admin),
            (Method::POST, "/v1/hosts/h/resume", Scope::Admin),
            (Method::GET, "/v1/schedules", Scope::Read),
            (Method::GET, "/v1/schedules/s", Scope::Read),
            (Method::POST, "/v1/schedules", Scope::Write),
            (Method::PATCH, "/v1/schedules/s", Scope::Write),
            (Method::DELETE, "/v1/schedules/s", Scope::Write),
            (Method::POST, "/v1/schedules/s/pause", Scope::Write),
            (Method::POST, "/v1/schedules/s/resume", Scope::Write),
        ] {
            assert_eq!(
                required_scope(&method, path),
                Some(scope),
                "{method} {path}"
            );
        }
        assert_eq!(required_scope(&Method::GET, "/v1/whoami"), None);
        assert_eq!(
            required_scope(&Method::GET, "/v1/signing-secret"),
            Some(Scope::Admin)
        );
    }
}
