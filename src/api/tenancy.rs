//! Which tenant a request acts in (SPEC §15): a key bound to a tenant
//! (`[[api.keys]] tenant`) acts in it alone; a key without one, `api.tokens`
//! and the open API name a tenant with the `tenant` field or `?tenant=`.
//! Handlers turn (tenant, id) into the internal id here
//! ([`crate::tenant::internal_id`]): a bound key's id always names a job of
//! its own tenant, so another tenant's job answers 404 like an unknown id.

use axum::http::StatusCode;
use axum::Extension;

use super::auth::Caller;
use super::ApiError;
use crate::job::validate_tenant;
use crate::tenant::DEFAULT_TENANT;

/// The calling key, as handlers take it (None when the API is open).
pub(crate) type CallerExt = Option<Extension<Caller>>;

/// The tenant the calling key is bound to, if any.
pub(crate) fn bound(caller: &CallerExt) -> Option<&str> {
    caller.as_ref().and_then(|c| c.tenant.as_deref())
}

/// 403 `forbidden` naming `field`: a bound key named another tenant.
fn other_tenant(caller: &CallerExt, field: &str) -> ApiError {
    let (name, own) = caller
        .as_ref()
        .map(|c| (c.name.as_str(), c.tenant.as_deref().unwrap_or_default()))
        .unwrap_or_default();
    ApiError {
        field: Some(field.into()),
        ..ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("key `{name}` acts in tenant `{own}` alone"),
        )
    }
}

/// The tenant a request naming `named` (in field or parameter `field`, or
/// nothing) acts in: `named` (400 `invalid_tenant` when it is no tenant
/// name), else the key's tenant, else `default`; a bound key naming another
/// tenant gets 403 `forbidden` naming `field`.
pub(crate) fn acting(
    caller: &CallerExt,
    named: Option<&str>,
    field: &str,
) -> Result<String, ApiError> {
    if let Some(named) = named {
        validate_tenant(named, field)?;
    }
    match (bound(caller), named) {
        (Some(own), Some(named)) if own != named => Err(other_tenant(caller, field)),
        (Some(own), _) => Ok(own.to_string()),
        (None, Some(named)) => Ok(named.to_string()),
        (None, None) => Ok(DEFAULT_TENANT.to_string()),
    }
}

/// The tenant a listing shows (`?tenant=` given as `named`): the one named
/// or the key's own (as [`acting`]), or None, every tenant, for a key
/// without a tenant that names none.
pub(crate) fn filter(
    caller: &CallerExt,
    named: Option<&str>,
    field: &str,
) -> Result<Option<String>, ApiError> {
    if named.is_none() && bound(caller).is_none() {
        return Ok(None);
    }
    acting(caller, named, field).map(Some)
}

/// The value of query parameter `name` among `pairs`.
pub(crate) fn param<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tenant: Option<&str>) -> CallerExt {
        Some(Extension(Caller {
            name: "k".into(),
            scopes: crate::config::Scope::ALL.to_vec(),
            tenant: tenant.map(str::to_string),
        }))
    }

    #[test]
    fn bound_keys_act_in_their_tenant_alone() {
        let billing = key(Some("billing"));
        assert_eq!(acting(&billing, None, "tenant").unwrap(), "billing");
        assert_eq!(
            acting(&billing, Some("billing"), "tenant").unwrap(),
            "billing"
        );
        let err = acting(&billing, Some("orders"), "tenant").unwrap_err();
        assert_eq!(
            (err.status, err.code, err.field.as_deref()),
            (StatusCode::FORBIDDEN, "forbidden", Some("tenant"))
        );
        assert_eq!(
            filter(&billing, None, "tenant").unwrap().as_deref(),
            Some("billing")
        );
        assert!(filter(&billing, Some("orders"), "tenant").is_err());
    }

    #[test]
    fn unbound_callers_name_any_tenant() {
        for caller in [None, key(None)] {
            assert_eq!(acting(&caller, None, "tenant").unwrap(), "default");
            assert_eq!(acting(&caller, Some("orders"), "tenant").unwrap(), "orders");
            assert_eq!(filter(&caller, None, "tenant").unwrap(), None);
            let err = acting(&caller, Some("Bad"), "tenant").unwrap_err();
            assert_eq!(
                (err.status, err.code, err.field.as_deref()),
                (StatusCode::BAD_REQUEST, "invalid_tenant", Some("tenant"))
            );
        }
    }
}
