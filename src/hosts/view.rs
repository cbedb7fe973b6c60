//! What `GET /v1/hosts` and `hookq hosts` show about a host: its shared
//! breaker record, its limits, the jobs parked for it in Redis and, in the
//! daemon that answers, the jobs it holds in memory and its attempts in
//! flight.

use serde::Serialize;

use super::lanes::Lanes;
use super::HostRules;
use crate::job::format_ms;
use crate::store::hosts::HostState;
use crate::store::{Store, StoreResult};

/// One host as listed.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HostView {
    /// `scheme://host:port`.
    pub host: String,
    /// closed, open, half_open or paused.
    pub state: HostState,
    /// Attempts running in the daemon that answers.
    pub in_flight: usize,
    /// Jobs held for the host: parked in Redis, plus those waiting in the
    /// answering daemon's memory.
    pub waiting: u64,
    /// Concurrent attempts allowed per daemon.
    pub concurrency: usize,
    /// Requests per second across daemons (0 = unlimited).
    pub rate: f64,
    /// Consecutive failed attempts.
    pub consecutive_failures: u64,
    /// When it opened or was paused (RFC 3339), if it is not closed.
    pub opened_at: Option<String>,
    /// Next probe, or the end of a timed pause (RFC 3339), if any.
    pub next_probe_at: Option<String>,
    /// Last failure, or why it is paused.
    pub reason: Option<String>,
}

/// Builds the view of `host`.
pub(crate) async fn view(
    store: &Store,
    rules: &HostRules,
    lanes: Option<&Lanes>,
    host: &str,
) -> StoreResult<HostView> {
    let record = store.host_record(host).await?;
    let parked: u64 = store
        .parked_counts(host)
        .await?
        .iter()
        .map(|(_, n)| n)
        .sum();
    let (in_flight, held) = lanes.and_then(|l| l.figures(host)).unwrap_or((0, 0));
    let limits = rules.limits(host);
    Ok(HostView {
        host: host.to_string(),
        state: record.state,
        in_flight,
        waiting: parked + held as u64,
        concurrency: limits.concurrency,
        rate: limits.rate,
        consecutive_failures: record.consecutive_failures,
        opened_at: record.opened_at.map(format_ms),
        next_probe_at: record.next_probe_at.map(format_ms),
        reason: record.reason,
    })
}

/// One page of hosts (by name, after `cursor`): those with a breaker record
/// and those the answering daemon is delivering to; `state` filters.
pub(crate) async fn list(
    store: &Store,
    rules: &HostRules,
    lanes: Option<&Lanes>,
    state: Option<HostState>,
    limit: usize,
    cursor: Option<&str>,
) -> StoreResult<(Vec<HostView>, Option<String>)> {
    let mut hosts = store.known_hosts().await?;
    if let Some(lanes) = lanes {
        hosts.extend(lanes.hosts());
    }
    hosts.sort();
    hosts.dedup();
    let mut page = Vec::new();
    let mut last = None;
    for host in hosts
        .into_iter()
        .filter(|h| cursor.is_none_or(|c| h.as_str() > c))
    {
        let v = view(store, rules, lanes, &host).await?;
        if state.is_none_or(|s| s == v.state) {
            if page.len() == limit {
                return Ok((page, last));
            }
            last = Some(host);
            page.push(v);
        }
    }
    Ok((page, None))
}
