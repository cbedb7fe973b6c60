//! Tenant routes (SPEC §15): `GET /v1/tenants` (every tenant's ledger, for
//! a key bound to no tenant; `default` and the `[[tenants]]` always) and `GET /v1/tenants/{name}` (one; a bound key
//! only its own), each with the tenant's settings; and the per-tenant
//! answer of `GET /v1/stats?tenant=` (or with a bound key).

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::auth::Caller;
use super::{parse_query, ApiError, AppState};
use crate::job::validate_tenant;
use crate::store::listing::{tenant_views, Ledger, TenantView};
use crate::tenant::DEFAULT_TENANT;

/// The tenant a bound caller is limited to (None: any).
pub(crate) fn bound_tenant(caller: Option<&Extension<Caller>>) -> Option<&str> {
    caller.and_then(|c| c.tenant.as_deref())
}

/// 404 `not_found` for tenant `name` (unknown, or another's for a bound key).
fn no_tenant(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no tenant `{}`", crate::job::quote(name)),
    )
}

/// `GET /v1/tenants`: every tenant that has had a job, and every tenant
/// of `[[tenants]]` (with zero counts when it has had none), by name. A
/// key bound to a tenant sees only its own.
pub(super) async fn list(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    parse_query(query.as_deref(), &[])?;
    let mut tenants = tenant_views(&state.config, state.store.ledger().await?);
    if let Some(own) = bound_tenant(caller.as_ref()) {
        tenants.retain(|t| t.tenant == own);
        if tenants.is_empty() {
            let ledger = state.store.tenant_ledger(own).await?;
            tenants.push(TenantView::new(
                own,
                state.config.tenant_settings(own),
                ledger,
            ));
        }
    }
    Ok(Json(serde_json::json!({ "tenants": tenants })).into_response())
}

/// `GET /v1/tenants/{name}`: one tenant's settings and ledger (zero
/// counts for a tenant that never had a job). 400 `invalid_tenant` for a
/// bad name; a bound key asking for another tenant gets 404, as for an
/// unknown one.
pub(super) async fn show(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    validate_tenant(&name, "name")?;
    if bound_tenant(caller.as_ref()).is_some_and(|own| own != name) {
        return Err(no_tenant(&name));
    }
    let ledger = state.store.tenant_ledger(&name).await?;
    let known = name == DEFAULT_TENANT || state.config.tenants.iter().any(|e| e.name == name);
    if ledger == Ledger::default() && !known && bound_tenant(caller.as_ref()).is_none() {
        return Err(no_tenant(&name));
    }
    let view = TenantView::new(&name, state.config.tenant_settings(&name), ledger);
    Ok(Json(view).into_response())
}

/// The tenant `GET /v1/stats` is asked about: a bound key's own (a
/// `?tenant=` naming another is 404), or `?tenant=`; None: every tenant.
pub(crate) fn stats_tenant(
    caller: Option<&Extension<Caller>>,
    query: Option<&str>,
) -> Result<Option<String>, ApiError> {
    let pairs = parse_query(query, &["tenant"])?;
    let asked = pairs
        .into_iter()
        .find(|(n, _)| n == "tenant")
        .map(|(_, v)| v);
    if let Some(name) = &asked {
        validate_tenant(name, "tenant")?;
    }
    match (bound_tenant(caller), asked) {
        (Some(own), Some(asked)) if asked != own => Err(no_tenant(&asked)),
        (Some(own), _) => Ok(Some(own.to_string())),
        (None, asked) => Ok(asked),
    }
}

/// `GET /v1/stats` for one tenant: its ledger (the partitions' sets and
/// delivery counters are shared by every tenant and are not split).
pub(crate) async fn tenant_stats(state: &AppState, tenant: &str) -> Result<Response, ApiError> {
    let ledger = state.store.tenant_ledger(tenant).await?;
    let view = TenantView::new(tenant, state.config.tenant_settings(tenant), ledger);
    Ok(Json(view).into_response())
}
