//! The tenants' quotas on creates (SPEC §15): `max_live_jobs` (429
//! `quota_exceeded`) and `create_rate` (429 `rate_limited` with
//! `Retry-After`), checked by [`check_quota`] before a create or a batch's
//! items are written.
//!
//! `max_live_jobs` is exact for one daemon and cheap far from the limit.
//! Each tenant with a limit has an estimate of its live jobs: the ledger
//! (summed over the partitions) read at most every [`ESTIMATE_TTL`], plus
//! every create this daemon admitted since (those in flight at the read
//! included, so the estimate never falls below the truth for one daemon:
//! deliveries only lower it). A create that fits the estimate goes ahead
//! without a Redis read, beside other such creates (a shared lock); one
//! that does not takes the tenant's lock alone (waiting for the creates in
//! flight), reads the ledger afresh and decides on the true count, holding
//! the lock until its jobs are written. Several daemons do not see each
//! other's admissions until their next read: together they may overshoot
//! the limit by the creates the other daemons admitted within one
//! [`ESTIMATE_TTL`] (and by creates decided at the same moment near it).
//!
//! `create_rate` is shared by every daemon through `take_rate.lua` (the
//! host rate's window budget, see [`crate::hosts::rate`]), one call per
//! create request of a tenant that has a rate. Tenants without quotas pay
//! nothing: no lock, no read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

use super::{ApiError, AppState};

/// How old the live estimate of a tenant may be before a create far from
/// the limit reads the ledger again.
pub(crate) const ESTIMATE_TTL: Duration = Duration::from_millis(500);

/// The quota state of every tenant with a live-job limit, in one daemon.
#[derive(Default)]
pub(crate) struct Quotas {
    tenants: Mutex<HashMap<String, Arc<TenantQuota>>>,
}

/// One tenant's live-job estimate and its lock.
#[derive(Default)]
struct TenantQuota {
    /// Shared by creates that fit the estimate, taken alone by one that
    /// decides on a fresh read.
    lock: Arc<RwLock<()>>,
    estimate: Mutex<Estimate>,
}

/// A tenant's live jobs as last read, and what this daemon admitted since.
#[derive(Default)]
struct Estimate {
    /// Live jobs at the last read, and when it was (None: never).
    read: Option<(u64, Instant)>,
    /// Jobs admitted since the read (with those in flight at the read).
    admitted: u64,
    /// Jobs admitted whose create has not finished yet.
    in_flight: u64,
}

impl Quotas {
    fn tenant(&self, name: &str) -> Arc<TenantQuota> {
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        tenants.entry(name.to_string()).or_default().clone()
    }
}

/// What [`check_quota`] let through: the first `admitted` of the jobs
/// asked for may be written, while this is held (drop it once they are).
pub(crate) struct Grant {
    /// How many of the jobs may be written (the first ones, in order).
    pub admitted: usize,
    /// Why the others may not (when `admitted` is less than asked).
    pub refusal: Option<Refusal>,
    _held: Held,
}

/// The lock a grant holds, and the estimate it counts in.
enum Held {
    None,
    Shared {
        _lock: OwnedRwLockReadGuard<()>,
        quota: Arc<TenantQuota>,
        n: u64,
    },
    Alone {
        _lock: OwnedRwLockWriteGuard<()>,
        quota: Arc<TenantQuota>,
        n: u64,
    },
}

impl Drop for Held {
    fn drop(&mut self) {
        let (quota, n) = match self {
            Held::None => return,
            Held::Shared { quota, n, .. } | Held::Alone { quota, n, .. } => (quota, *n),
        };
        let mut e = quota.estimate.lock().unwrap_or_else(|e| e.into_inner());
        e.in_flight = e.in_flight.saturating_sub(n);
    }
}

/// A create refused by a quota: 429 `quota_exceeded` or `rate_limited`
/// (with `Retry-After`, whole seconds rounded up), naming `tenant`.
#[derive(Debug)]
pub(crate) struct Refusal {
    /// The error (status 429).
    pub error: ApiError,
    /// Seconds until the rate allows creates again (`rate_limited`).
    pub retry_after: Option<u64>,
}

impl Refusal {
    fn quota(tenant: &str, limit: u64) -> Refusal {
        Refusal {
            error: ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                code: "quota_exceeded",
                message: format!("tenant `{tenant}` has its max_live_jobs ({limit}) live jobs"),
                field: Some("tenant".into()),
            },
            retry_after: None,
        }
    }

    fn rate(tenant: &str, rate: f64, retry_after: u64) -> Refusal {
        Refusal {
            error: ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                code: "rate_limited",
                message: format!(
                    "tenant `{tenant}` creates at most {rate} jobs per second; retry after {retry_after} s"
                ),
                field: Some("tenant".into()),
            },
            retry_after: Some(retry_after),
        }
    }

    /// A copy for another item of the same batch.
    pub(crate) fn again(&self) -> Refusal {
        Refusal {
            error: ApiError {
                status: self.error.status,
                code: self.error.code,
                message: self.error.message.clone(),
                field: self.error.field.clone(),
            },
            retry_after: self.retry_after,
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response = self.error.into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
        }
        response
    }
}

/// Checks `n_jobs` creates landing in `tenant` against its quotas: the
/// grant says how many of them (the first ones) may be written, and is
/// held until they are. An error is a Redis failure.
pub(crate) async fn check_quota(
    state: &AppState,
    tenant: &str,
    n_jobs: usize,
) -> Result<Grant, ApiError> {
    let settings = state.config.tenant_settings(tenant);
    let mut grant = Grant {
        admitted: n_jobs,
        refusal: None,
        _held: Held::None,
    };
    if settings.max_live_jobs > 0 && n_jobs > 0 {
        grant = live_quota(state, tenant, n_jobs, settings.max_live_jobs).await?;
    }
    if settings.create_rate > 0.0 && grant.admitted > 0 {
        let window = Window::for_rate(settings.create_rate);
        let (granted, window_end) = state
            .store
            .take_tenant_rate(tenant, window.ms, window.budget, grant.admitted as u64)
            .await?;
        let granted = usize::try_from(granted).unwrap_or(0).min(grant.admitted);
        if granted < grant.admitted {
            let now = state.store.redis_time_ms().await?;
            let wait_ms = u64::try_from(window_end - now).unwrap_or(0);
            let seconds = wait_ms.div_ceil(1000).max(1);
            grant.admitted = granted;
            grant.refusal = Some(Refusal::rate(tenant, settings.create_rate, seconds));
            metrics::counter!("hookq_tenant_rate_limited_total", "tenant" => crate::worker::tenant_label(tenant)).increment(1);
        }
    }
    Ok(grant)
}

/// The window of a create rate: 1 s holding the whole creates per second
/// from 1/s up; below, one create per `1/rate` seconds (rounded up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    ms: u64,
    budget: u64,
}

impl Window {
    fn for_rate(rate: f64) -> Window {
        if rate >= 1.0 {
            Window {
                ms: 1000,
                budget: rate.floor() as u64,
            }
        } else {
            Window {
                ms: ((1.0 / rate).ceil() * 1000.0).min(3_600_000.0) as u64,
                budget: 1,
            }
        }
    }
}

/// The `max_live_jobs` check (see the module doc).
async fn live_quota(
    state: &AppState,
    tenant: &str,
    n_jobs: usize,
    limit: u64,
) -> Result<Grant, ApiError> {
    let quota = state.quotas.tenant(tenant);
    let n = n_jobs as u64;
    // Far from the limit: the estimate, read again when stale, decides.
    let shared = quota.lock.clone().read_owned().await;
    let fresh = {
        let e = quota.estimate.lock().unwrap_or_else(|e| e.into_inner());
        e.read
            .filter(|(_, at)| at.elapsed() < ESTIMATE_TTL)
            .map(|(live, _)| live + e.admitted)
    };
    let estimate = match fresh {
        Some(estimate) => estimate,
        None => refresh(state, &quota, tenant).await?,
    };
    if estimate + n <= limit {
        admit(&quota, n);
        return Ok(Grant {
            admitted: n_jobs,
            refusal: None,
            _held: Held::Shared {
                _lock: shared,
                quota,
                n,
            },
        });
    }
    drop(shared);
    // Near it: alone, on a fresh read.
    let alone = quota.lock.clone().write_owned().await;
    let live = refresh(state, &quota, tenant).await?;
    let room = limit.saturating_sub(live).min(n);
    admit(&quota, room);
    Ok(Grant {
        admitted: room as usize,
        refusal: (room < n).then(|| Refusal::quota(tenant, limit)),
        _held: Held::Alone {
            _lock: alone,
            quota,
            n: room,
        },
    })
}

/// Reads the tenant's live jobs from the ledger into its estimate, and
/// answers them with the creates in flight (which the read may miss).
async fn refresh(state: &AppState, quota: &TenantQuota, tenant: &str) -> Result<u64, ApiError> {
    let live = state.store.tenant_ledger(tenant).await?.live();
    let mut e = quota.estimate.lock().unwrap_or_else(|e| e.into_inner());
    e.read = Some((live, Instant::now()));
    e.admitted = e.in_flight;
    Ok(live + e.admitted)
}

/// Counts `n` admitted jobs in the estimate.
fn admit(quota: &TenantQuota, n: u64) {
    let mut e = quota.estimate.lock().unwrap_or_else(|e| e.into_inner());
    e.admitted += n;
    e.in_flight += n;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_windows_hold_whole_budgets() {
        assert_eq!(
            Window::for_rate(2.0),
            Window {
                ms: 1000,
                budget: 2
            }
        );
        assert_eq!(
            Window::for_rate(2.5),
            Window {
                ms: 1000,
                budget: 2
            }
        );
        assert_eq!(
            Window::for_rate(0.5),
            Window {
                ms: 2000,
                budget: 1
            }
        );
        assert_eq!(
            Window::for_rate(0.3),
            Window {
                ms: 4000,
                budget: 1
            }
        );
    }
}
