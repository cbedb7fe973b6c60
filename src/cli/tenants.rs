//! Tenants: `hookq tenants` (every tenant's ledger, as `GET /v1/tenants`
//! answers) and `hookq stats --tenant NAME` (one tenant's), read straight
//! from Redis.

use std::process::ExitCode;

use super::table::{print_json, print_table};
use super::{connect, CliError};
use crate::config::Config;
use crate::store::listing::{tenant_views, TenantView};

/// The columns of a tenant's row.
const COLUMNS: [&str; 10] = [
    "tenant",
    "weight",
    "max_live_jobs",
    "create_rate",
    "created",
    "replayed",
    "delivered",
    "dead_lettered",
    "cancelled",
    "live",
];

/// A tenant's row of cells, in [`COLUMNS`] order.
fn row(view: &TenantView) -> Result<Vec<String>, CliError> {
    let value = serde_json::to_value(view)?;
    Ok(COLUMNS
        .iter()
        .map(|c| match &value[*c] {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect())
}

/// `hookq tenants`: a row per tenant (those that have had a job,
/// `default` and every `[[tenants]]` entry).
pub(super) async fn tenants(config: &Config, json: bool) -> Result<ExitCode, CliError> {
    let store = connect(config).await?;
    let views = tenant_views(config, store.ledger().await?);
    if json {
        print_json(&serde_json::json!({ "tenants": views }))?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows = views.iter().map(row).collect::<Result<Vec<_>, _>>()?;
    print_table(&COLUMNS, &rows);
    Ok(ExitCode::SUCCESS)
}

/// `hookq stats --tenant NAME`: the tenant's settings and ledger.
pub(super) async fn tenant_stats(
    config: &Config,
    name: &str,
    json: bool,
) -> Result<ExitCode, CliError> {
    let store = connect(config).await?;
    let view = TenantView::new(
        name,
        config.tenant_settings(name),
        store.tenant_ledger(name).await?,
    );
    if json {
        print_json(&view)?;
        return Ok(ExitCode::SUCCESS);
    }
    let cells = row(&view)?;
    let rows: Vec<Vec<String>> = COLUMNS
        .iter()
        .zip(cells)
        .map(|(c, v)| vec![c.to_string(), v])
        .collect();
    print_table(&["counter", "value"], &rows);
    Ok(ExitCode::SUCCESS)
}
