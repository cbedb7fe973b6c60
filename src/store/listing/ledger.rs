//! The tenants' ledger (SPEC §15): per partition the HASH
//! `<ns>:{p}:ledger` counts each tenant's jobs created, replayed,
//! delivered, dead-lettered and cancelled (fields `<tenant>:<counter>`),
//! kept by the scripts that make each change (see `lua/prelude.lua`). Read
//! here by summing the partitions (one HGETALL or HMGET per partition, sent
//! together); seeded once per partition with the jobs live before it
//! existed (`lua/seed_ledger.lua`).

use std::collections::{BTreeMap, HashMap};

use futures_util::future::try_join_all;
use serde::Serialize;

use crate::config::Config;
use crate::store::{arg, scripts, Store, StoreResult};
use crate::tenant::{TenantSettings, DEFAULT_TENANT};

/// The counter names of a ledger, in the order of its fields.
const COUNTERS: [&str; 5] = [
    "created",
    "replayed",
    "delivered",
    "dead_lettered",
    "cancelled",
];

/// One tenant's ledger, summed over the partitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Ledger {
    /// Jobs created (by the API, the CLI or a schedule firing).
    pub created: u64,
    /// Dead letters replayed (each makes a job live again).
    pub replayed: u64,
    /// Jobs delivered.
    pub delivered: u64,
    /// Jobs dead-lettered.
    pub dead_lettered: u64,
    /// Jobs cancelled.
    pub cancelled: u64,
}

impl Ledger {
    /// Live jobs: created + replayed − delivered − dead-lettered −
    /// cancelled (0 rather than below).
    pub fn live(&self) -> u64 {
        (self.created + self.replayed)
            .saturating_sub(self.delivered + self.dead_lettered + self.cancelled)
    }

    /// The counter named `name` (one of [`COUNTERS`]).
    fn counter(&mut self, name: &str) -> Option<&mut u64> {
        Some(match name {
            "created" => &mut self.created,
            "replayed" => &mut self.replayed,
            "delivered" => &mut self.delivered,
            "dead_lettered" => &mut self.dead_lettered,
            "cancelled" => &mut self.cancelled,
            _ => return None,
        })
    }
}

/// One tenant as `GET /v1/tenants` and `hookq tenants` show it: its
/// settings and its ledger.
#[derive(Debug, Clone, Serialize)]
pub struct TenantView {
    /// The tenant's name.
    pub tenant: String,
    /// Its weight.
    pub weight: u32,
    /// Its live-job quota (0: none).
    pub max_live_jobs: u64,
    /// Its create rate (0: none).
    pub create_rate: f64,
    /// See [`Ledger`].
    pub created: u64,
    /// See [`Ledger`].
    pub replayed: u64,
    /// See [`Ledger`].
    pub delivered: u64,
    /// See [`Ledger`].
    pub dead_lettered: u64,
    /// See [`Ledger`].
    pub cancelled: u64,
    /// [`Ledger::live`].
    pub live: u64,
}

impl TenantView {
    /// The view of tenant `tenant` with `settings` and `ledger`.
    pub fn new(tenant: &str, settings: TenantSettings, ledger: Ledger) -> TenantView {
        TenantView {
            tenant: tenant.to_string(),
            weight: settings.weight,
            max_live_jobs: settings.max_live_jobs,
            create_rate: settings.create_rate,
            created: ledger.created,
            replayed: ledger.replayed,
            delivered: ledger.delivered,
            dead_lettered: ledger.dead_lettered,
            cancelled: ledger.cancelled,
            live: ledger.live(),
        }
    }
}

/// The views of the tenants of `ledgers` (as [`Store::ledger`] reads
/// them), of `default` and of every `[[tenants]]` entry (zero counts for
/// those that never had a job), by name.
pub fn tenant_views(config: &Config, mut ledgers: BTreeMap<String, Ledger>) -> Vec<TenantView> {
    ledgers.entry(DEFAULT_TENANT.to_string()).or_default();
    for entry in &config.tenants {
        ledgers.entry(entry.name.clone()).or_default();
    }
    ledgers
        .iter()
        .map(|(name, ledger)| TenantView::new(name, config.tenant_settings(name), *ledger))
        .collect()
}

impl Store {
    /// Every tenant's ledger (tenants that have had a job), summed over
    /// the partitions, by name.
    pub async fn ledger(&self) -> StoreResult<BTreeMap<String, Ledger>> {
        let reads = (0..self.keys.partitions()).map(|p| {
            let mut conn = self.conn.clone();
            let key = self.keys.ledger(p);
            async move {
                redis::cmd("HGETALL")
                    .arg(key)
                    .query_async::<HashMap<String, String>>(&mut conn)
                    .await
            }
        });
        let mut out: BTreeMap<String, Ledger> = BTreeMap::new();
        for fields in try_join_all(reads).await? {
            for (field, value) in fields {
                // `~seeded` and anything else not `<tenant>:<counter>` is
                // no counter.
                let Some((tenant, name)) = field.rsplit_once(':') else {
                    continue;
                };
                if !crate::tenant::is_tenant_name(tenant) || !COUNTERS.contains(&name) {
                    continue;
                }
                let n: u64 = value.parse().unwrap_or_default();
                if let Some(c) = out.entry(tenant.to_string()).or_default().counter(name) {
                    *c += n;
                }
            }
        }
        Ok(out)
    }

    /// Tenant `tenant`'s ledger, summed over the partitions (zero counts
    /// for a tenant that never had a job).
    pub async fn tenant_ledger(&self, tenant: &str) -> StoreResult<Ledger> {
        let fields: Vec<String> = COUNTERS.iter().map(|c| format!("{tenant}:{c}")).collect();
        let reads = (0..self.keys.partitions()).map(|p| {
            let mut conn = self.conn.clone();
            let key = self.keys.ledger(p);
            let fields = fields.clone();
            async move {
                redis::cmd("HMGET")
                    .arg(key)
                    .arg(fields)
                    .query_async::<Vec<Option<u64>>>(&mut conn)
                    .await
            }
        });
        let mut ledger = Ledger::default();
        for values in try_join_all(reads).await? {
            for (name, value) in COUNTERS.iter().zip(values) {
                if let Some(c) = ledger.counter(name) {
                    *c += value.unwrap_or_default();
                }
            }
        }
        Ok(ledger)
    }

    /// Seeds each partition's ledger not seeded yet: the jobs live before
    /// the ledger existed count as `default`'s created (see
    /// `lua/seed_ledger.lua`). Answers the jobs counted. Run at daemon
    /// start, before the API serves; a seeded partition costs one call.
    pub(crate) async fn seed_ledgers(&self) -> StoreResult<u64> {
        let mut seeded = 0;
        for p in 0..self.keys.partitions() {
            let n: i64 = self
                .invoke(
                    &scripts::SEED_LEDGER,
                    &[&self.keys.ledger(p), &self.keys.placed(p)],
                    &[arg(&self.keys.job_prefix(p))],
                )
                .await?;
            seeded += u64::try_from(n).unwrap_or_default();
        }
        Ok(seeded)
    }
}
