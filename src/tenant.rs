//! Tenants (SPEC §15): tenant names, the internal id that carries a
//! job's or schedule's tenant, and the `[[tenants]]` / `[tenant_defaults]`
//! settings (weight, quotas).
//!
//! Identity is (tenant, id). Inside hookq (Redis keys, scripts, dead
//! letters, `webhook-id`) a job of the `default` tenant is known by its id
//! alone, as before tenants existed, and a job of any other tenant by
//! `<tenant>/<id>`: ids never contain `/`, so the two never meet, data
//! written before tenants is the `default` tenant's without a migration,
//! and a script finds a job's tenant in its id.

use serde::Deserialize;

/// The tenant of everything that names none.
pub const DEFAULT_TENANT: &str = "default";

/// Longest tenant name.
pub const TENANT_MAX: usize = 32;

/// Most distinct tenants that get a metrics label of their own (per
/// process); later ones are counted as `other`.
pub const METRIC_TENANTS_MAX: usize = 100;

/// Whether `name` is a tenant name: `[a-z0-9][a-z0-9-]{0,31}`.
pub fn is_tenant_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=TENANT_MAX).contains(&bytes.len())
        && bytes[0] != b'-'
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// The internal id of `id` in `tenant`: `id` for the default tenant,
/// `<tenant>/<id>` for any other.
pub fn internal_id(tenant: &str, id: &str) -> String {
    if tenant == DEFAULT_TENANT {
        id.to_string()
    } else {
        format!("{tenant}/{id}")
    }
}

/// The tenant and the id of an internal id (see [`internal_id`]).
pub fn split_id(internal: &str) -> (&str, &str) {
    match internal.split_once('/') {
        Some((tenant, id)) => (tenant, id),
        None => (DEFAULT_TENANT, internal),
    }
}

/// The tenant of an internal id.
pub fn tenant_of(internal: &str) -> &str {
    split_id(internal).0
}

/// Whether the internal id `internal` belongs to `tenant`.
pub fn belongs_to(internal: &str, tenant: &str) -> bool {
    tenant_of(internal) == tenant
}

/// The ordering line of job (or schedule) `id`, an internal id, for its
/// ordering list `order` (`<topic>:<ordering key>`): the list itself in the
/// default tenant (so lines written before tenants stay theirs), else
/// `<tenant>/<topic>:<ordering key>`: each tenant's keys are lines of their
/// own. The scripts' `order_line` (lua/prelude.lua) is the same rule.
pub fn order_line<'a>(id: &str, order: &'a str) -> std::borrow::Cow<'a, str> {
    match id.split_once('/') {
        Some((tenant, _)) => std::borrow::Cow::Owned(format!("{tenant}/{order}")),
        None => std::borrow::Cow::Borrowed(order),
    }
}

/// The external form of internal id `internal` (its id within its tenant).
pub fn external_id(internal: &str) -> &str {
    split_id(internal).1
}

/// A tenant's settings: its share of delivery and its quotas.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantSettings {
    /// Its share of each daemon's delivery capacity, relative to the other
    /// tenants with ready jobs (1 to 1000).
    pub weight: u32,
    /// Most live jobs (scheduled, ready, in flight, held for order); 0: no
    /// limit.
    pub max_live_jobs: u64,
    /// Most creates per second across all daemons; 0: no limit.
    pub create_rate: f64,
}

impl Default for TenantSettings {
    fn default() -> Self {
        TenantSettings {
            weight: 1,
            max_live_jobs: 0,
            create_rate: 0.0,
        }
    }
}

/// One `[[tenants]]` entry: a named tenant's settings; a setting it leaves
/// out is `[tenant_defaults]`'s.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantEntry {
    /// The tenant's name.
    pub name: String,
    /// Its weight (default: `tenant_defaults.weight`).
    pub weight: Option<u32>,
    /// Its live-job quota (default: `tenant_defaults.max_live_jobs`).
    pub max_live_jobs: Option<u64>,
    /// Its create rate (default: `tenant_defaults.create_rate`).
    pub create_rate: Option<f64>,
}

/// Most weight a tenant may have.
pub const MAX_WEIGHT: u32 = 1000;

/// Checks one tenant's settings, naming the key `at` (`tenants[2]` or
/// `tenant_defaults`).
fn validate_settings(at: &str, s: &TenantSettings) -> anyhow::Result<()> {
    if !(1..=MAX_WEIGHT).contains(&s.weight) {
        anyhow::bail!("config key `{at}.weight`: must be between 1 and {MAX_WEIGHT}");
    }
    if !(s.create_rate.is_finite() && s.create_rate >= 0.0) {
        anyhow::bail!("config key `{at}.create_rate`: must be a number of creates per second, 0 (no limit) or more");
    }
    Ok(())
}

/// Checks `[tenant_defaults]` and each `[[tenants]]` entry in order: a
/// valid, unique name and valid settings.
pub(crate) fn validate(defaults: &TenantSettings, entries: &[TenantEntry]) -> anyhow::Result<()> {
    validate_settings("tenant_defaults", defaults)?;
    let mut names = std::collections::HashSet::new();
    for (i, entry) in entries.iter().enumerate() {
        if !is_tenant_name(&entry.name) {
            anyhow::bail!(
                "config key `tenants[{i}].name`: `{}` is not a tenant name (1-{TENANT_MAX} characters of a-z 0-9 -, starting with a letter or digit)",
                entry.name.chars().take(64).collect::<String>()
            );
        }
        if !names.insert(entry.name.as_str()) {
            anyhow::bail!(
                "config key `tenants[{i}].name`: `{}` names two tenants",
                entry.name
            );
        }
        validate_settings(&format!("tenants[{i}]"), &settings_of(defaults, entry))?;
    }
    Ok(())
}

/// `entry`'s settings, with `defaults` for what it leaves out.
fn settings_of(defaults: &TenantSettings, entry: &TenantEntry) -> TenantSettings {
    TenantSettings {
        weight: entry.weight.unwrap_or(defaults.weight),
        max_live_jobs: entry.max_live_jobs.unwrap_or(defaults.max_live_jobs),
        create_rate: entry.create_rate.unwrap_or(defaults.create_rate),
    }
}

/// The settings of tenant `name`: its `[[tenants]]` entry over
/// `[tenant_defaults]`, or the defaults alone.
pub(crate) fn settings_for(
    defaults: &TenantSettings,
    entries: &[TenantEntry],
    name: &str,
) -> TenantSettings {
    entries
        .iter()
        .find(|e| e.name == name)
        .map_or(*defaults, |e| settings_of(defaults, e))
}

/// The claim script's weight arguments: the default weight, then a name
/// and a weight for each listed tenant whose weight differs from it.
pub(crate) fn weight_args(defaults: &TenantSettings, entries: &[TenantEntry]) -> Vec<String> {
    let mut args = vec![defaults.weight.to_string()];
    for entry in entries {
        let weight = settings_of(defaults, entry).weight;
        if weight != defaults.weight {
            args.push(entry.name.clone());
            args.push(weight.to_string());
        }
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rule() {
        for ok in ["default", "a", "billing-eu", "0", &"x".repeat(32)] {
            assert!(is_tenant_name(ok), "{ok}");
        }
        for bad in ["", "-a", "A", "a_b", "a/b", "a.b", &"x".repeat(33), "é"] {
            assert!(!is_tenant_name(bad), "{bad}");
        }
    }

    #[test]
    fn internal_ids_carry_their_tenant() {
        assert_eq!(internal_id("default", "order-42"), "order-42");
        assert_eq!(internal_id("billing", "order-42"), "billing/order-42");
        assert_eq!(split_id("billing/order-42"), ("billing", "order-42"));
        assert_eq!(split_id("order-42"), ("default", "order-42"));
        assert!(belongs_to("order-42", "default"));
        assert!(!belongs_to("billing/order-42", "default"));
        assert_eq!(tenant_of("billing/a:b"), "billing");
        assert_eq!(external_id("billing/a:b"), "a:b");
        assert_eq!(order_line("order-42", "t:k"), "t:k");
        assert_eq!(order_line("billing/order-42", "t:k"), "billing/t:k");
    }

    #[test]
    fn entries_inherit_the_defaults_and_bad_ones_are_named() {
        let defaults = TenantSettings {
            weight: 2,
            max_live_jobs: 10,
            create_rate: 0.0,
        };
        let entry = |name: &str, weight: Option<u32>| TenantEntry {
            name: name.into(),
            weight,
            max_live_jobs: None,
            create_rate: None,
        };
        let entries = vec![entry("billing", Some(6)), entry("orders", None)];
        assert!(validate(&defaults, &entries).is_ok());
        assert_eq!(settings_for(&defaults, &entries, "billing").weight, 6);
        assert_eq!(
            settings_for(&defaults, &entries, "billing").max_live_jobs,
            10
        );
        assert_eq!(settings_for(&defaults, &entries, "other"), defaults);
        assert_eq!(weight_args(&defaults, &entries), ["2", "billing", "6"]);

        let err =
            |entries: Vec<TenantEntry>| validate(&defaults, &entries).unwrap_err().to_string();
        assert!(err(vec![entry("Bad", None)]).contains("`tenants[0].name`"));
        assert!(err(vec![entry("a", None), entry("a", None)]).contains("`tenants[1].name`"));
        assert!(err(vec![entry("a", Some(0))]).contains("`tenants[0].weight`"));
        let nan = TenantEntry {
            create_rate: Some(f64::NAN),
            ..entry("a", None)
        };
        assert!(err(vec![nan]).contains("`tenants[0].create_rate`"));
    }
}
