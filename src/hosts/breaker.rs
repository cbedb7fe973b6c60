//! The circuit breaker every daemon shares (SPEC §11.1), and pauses.
//!
//! State lives in Redis (one record per host, see
//! [`crate::store::Keys::host`]); each daemon keeps a copy of the hosts that
//! are not closed, refreshed twice a second and at once when a script
//! announces a change (`h<host>` on the wake channel). Only failures cost
//! Redis work: a success is reported only when this daemon knows the host
//! has failures to forget, so healthy hosts cost nothing.
//!
//! The refresher also acts on what is due: an open host whose probe time
//! came turns half-open and one parked job is moved back to be the probe; a
//! timed pause that ran out closes its host; a closed host with parked jobs
//! is drained in rounds a quarter second apart, oldest due first, a round's
//! size set by the host's limits (its rate, or a slow start from ten times
//! its slots, doubling per round), one daemon per round, by turns kept in
//! Redis.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{HostRules, Limits};
use crate::alerts::Alerts;
use crate::clock::RedisClock;
use crate::config::Config;
use crate::delivery::{ErrorKind, Outcome};
use crate::retry::FailureKind;
use crate::store::hosts::HostState;
use crate::store::Store;
use crate::wake::Signals;

/// Longest the refresher waits without a signal: a safety net only (state
/// changes are announced on the wake channel, and it wakes at the earliest
/// time a blocked host needs acting on).
pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(5);
/// Most blocked hosts read per refresh.
const BLOCKED_READ: usize = 1000;
/// A drain round's turn; also the pace of rounds while a drain goes on.
const DRAIN_TURN: Duration = Duration::from_millis(250);
/// Most jobs moved back in one drain round.
const DRAIN_ROUND_MAX: usize = 20_000;

/// What a refresh found: whether this daemon is draining a host (the next
/// pass comes a drain turn later), and the earliest time (Redis ms) a
/// blocked host needs acting on next.
struct Refresh {
    draining: bool,
    next_when: Option<i64>,
}

/// What an attempt says about its host.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// The host answered (a 2xx, or a status that is the job's problem).
    Answered,
    /// The host failed (connection error, timeout, 5xx, 429): the reason.
    Failed(String),
}

impl Verdict {
    /// Classifies an attempt's outcome, error kind and status.
    pub(crate) fn of(outcome: &Outcome, error: Option<ErrorKind>, status: Option<u16>) -> Verdict {
        if matches!(outcome, Outcome::Delivered) {
            return Verdict::Answered;
        }
        match (error, status) {
            (Some(ErrorKind::Timeout | ErrorKind::Connect | ErrorKind::Request), _) => {
                Verdict::Failed(error.map_or("request", |e| e.as_str()).to_string())
            }
            (_, Some(s)) if s >= 500 || s == 429 => Verdict::Failed(format!("http_{s}")),
            _ => Verdict::Answered,
        }
    }
}

/// This daemon's view of the shared breaker.
pub(crate) struct Breaker {
    store: Store,
    clock: RedisClock,
    config: Arc<Config>,
    rules: HostRules,
    signals: Arc<Signals>,
    /// Hosts that are not closed.
    blocked: RwLock<HashMap<String, HostState>>,
    /// Hosts this daemon saw fail, with the failure count Redis reported.
    failing: RwLock<HashMap<String, u64>>,
    /// Hosts this daemon is draining, with the size of its next round.
    draining: std::sync::Mutex<HashMap<String, usize>>,
    alerts: Alerts,
}

impl Breaker {
    /// A breaker view over `store`.
    pub(crate) fn new(
        store: Store,
        clock: RedisClock,
        config: Arc<Config>,
        signals: Arc<Signals>,
        alerts: Alerts,
    ) -> Self {
        Breaker {
            alerts,
            rules: HostRules::new(&config),
            store,
            clock,
            config,
            signals,
            blocked: RwLock::new(HashMap::new()),
            failing: RwLock::new(HashMap::new()),
            draining: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The state of `host` as last read.
    pub(crate) fn state(&self, host: &str) -> HostState {
        let blocked = match self.blocked.read() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        blocked.get(host).copied().unwrap_or(HostState::Closed)
    }

    /// Records `state` for `host` in this daemon's view at once (after a
    /// change this daemon made; the others learn it from the wake channel).
    pub(crate) fn set_state(&self, host: &str, state: HostState) {
        let mut blocked = match self.blocked.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if state == HostState::Closed {
            blocked.remove(host);
        } else {
            blocked.insert(host.to_string(), state);
        }
    }

    /// Whether this daemon saw `host` fail since it last answered.
    fn failing(&self, host: &str) -> bool {
        match self.failing.read() {
            Ok(g) => g.contains_key(host),
            Err(p) => p.into_inner().contains_key(host),
        }
    }

    /// Notes the failure count Redis reported for `host` (None: it
    /// answered, so none).
    fn set_failing(&self, host: &str, failures: Option<u64>) {
        let mut failing = match self.failing.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        match failures {
            Some(n) => {
                failing.insert(host.to_string(), n);
            }
            None => {
                failing.remove(host);
            }
        }
    }

    /// Where operational events go.
    pub(crate) fn alerts(&self) -> &Alerts {
        &self.alerts
    }

    /// An operator's pause (`until_ms` 0: until resumed), applied here at once.
    pub(crate) async fn pause(&self, host: &str) -> crate::store::StoreResult<()> {
        if self.store.host_pause(host, 0, "operator").await? {
            self.alerts.emit(
                "host.paused",
                json!({"host": host, "reason": "operator", "until": null}),
            );
        }
        self.set_state(host, HostState::Paused);
        Ok(())
    }

    /// An operator's resume, applied here at once.
    pub(crate) async fn resume(&self, host: &str) -> crate::store::StoreResult<()> {
        if self.store.host_resume(host, "operator").await? {
            self.alerts
                .emit("host.closed", json!({"host": host, "reason": "operator"}));
        }
        self.set_state(host, HostState::Closed);
        Ok(())
    }

    /// The lease of a probe attempt.
    fn probe_lease(&self) -> Duration {
        self.config.lease_for(self.config.delivery.max_timeout)
    }

    /// Asks to run a claimed job of a half-open host as its probe.
    pub(crate) async fn take_probe(&self, host: &str) -> bool {
        match self
            .store
            .host_probe(host, "take", self.probe_lease())
            .await
        {
            Ok(granted) => granted,
            Err(err) => {
                tracing::warn!(%host, cause = %err, "cannot take the probe");
                false
            }
        }
    }

    /// Records what an attempt said about its host: failures count towards
    /// opening it, a `Retry-After` on 429/503 pauses it, an answer ends a
    /// run of failures (and closes the host after a probe).
    pub(crate) async fn record(
        &self,
        host: &str,
        verdict: &Verdict,
        failure: Option<&FailureKind>,
        probe: bool,
    ) {
        let b = &self.config.breaker;
        if let Some(FailureKind::Retryable {
            retry_after: Some(wait),
        }) = failure
        {
            self.pause_for_retry_after(host, (*wait).min(b.max_open))
                .await;
        }
        match verdict {
            Verdict::Failed(reason) if b.failures > 0 || probe => {
                self.count_failure(host, reason, probe).await;
            }
            Verdict::Failed(_) => {}
            Verdict::Answered if probe || self.failing(host) => {
                self.count_answer(host, probe).await;
            }
            Verdict::Answered => {}
        }
    }

    /// Pauses `host` for `wait` (its `Retry-After`, capped at the longest
    /// open time); logs and alerts when the pause is taken.
    async fn pause_for_retry_after(&self, host: &str, wait: Duration) {
        let until = self.clock.now_ms() + wait.as_millis() as i64;
        match self
            .store
            .host_pause(host, until.max(1), "retry_after")
            .await
        {
            Ok(true) => {
                self.set_state(host, HostState::Paused);
                tracing::info!(%host, ?wait, "host paused for its Retry-After");
                self.alerts.emit(
                    "host.paused",
                    json!({"host": host, "reason": "retry_after", "until": crate::job::format_ms(until)}),
                );
            }
            Ok(false) => {}
            Err(err) => tracing::warn!(%host, cause = %err, "cannot pause the host"),
        }
    }

    /// Counts a failure of `host` in Redis, towards opening it (a failed
    /// probe included); logs, counts and alerts when it opens.
    async fn count_failure(&self, host: &str, reason: &str, probe: bool) {
        let b = &self.config.breaker;
        match self
            .store
            .host_failure(host, b.failures, b.open_for, b.max_open, reason, probe)
            .await
        {
            Ok(count) => {
                self.set_failing(host, Some(count.failures));
                if count.opened {
                    self.set_state(host, HostState::Open);
                    metrics::counter!("hookq_hosts_opened_total").increment(1);
                    tracing::warn!(%host, failures = count.failures, %reason, "host opened: its jobs wait for a probe");
                    self.alerts.emit(
                        "host.opened",
                        json!({"host": host, "consecutive_failures": count.failures, "reason": reason, "probe": probe}),
                    );
                }
            }
            Err(err) => tracing::warn!(%host, cause = %err, "cannot count the failure"),
        }
    }

    /// Records an answer from `host` in Redis, ending its run of failures;
    /// after a successful probe the host closes, which is logged, alerted
    /// and signalled to the refresher.
    async fn count_answer(&self, host: &str, probe: bool) {
        match self.store.host_success(host, probe).await {
            Ok(closed) => {
                self.set_failing(host, None);
                if closed {
                    self.set_state(host, HostState::Closed);
                    tracing::info!(%host, "host closed: its probe succeeded");
                    self.alerts.emit(
                        "host.closed",
                        json!({"host": host, "reason": "probe_succeeded"}),
                    );
                    self.signals.hosts.notify_one();
                }
            }
            Err(err) => tracing::warn!(%host, cause = %err, "cannot record the answer"),
        }
    }

    /// Refreshes the blocked hosts and acts on those due, until `token` is
    /// cancelled.
    pub(crate) async fn run(self: Arc<Self>, token: CancellationToken) {
        loop {
            let safety_net = tokio::time::Instant::now() + REFRESH_EVERY;
            let wake_at = match self.refresh().await {
                Ok(Refresh { draining: true, .. }) => tokio::time::Instant::now() + DRAIN_TURN,
                Ok(Refresh { next_when, .. }) => next_when
                    .map(|when| tokio::time::Instant::from_std(self.clock.instant_at(when)))
                    .map_or(safety_net, |at| at.min(safety_net)),
                Err(err) => {
                    tracing::warn!(cause = %err, "cannot read host states");
                    tokio::time::Instant::now() + Duration::from_millis(500)
                }
            };
            tokio::select! {
                _ = token.cancelled() => return,
                _ = self.signals.hosts.notified() => {}
                _ = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }

    /// One pass over the blocked hosts, acting on those due.
    async fn refresh(&self) -> crate::store::StoreResult<Refresh> {
        let blocked = self.store.blocked_hosts(BLOCKED_READ).await?;
        let now = self.clock.now_ms();
        let mut next_when = blocked
            .iter()
            .map(|(_, when)| *when)
            .filter(|w| *w > now)
            .min();
        let due = self.read_blocked_states(&blocked, now).await?;
        metrics::gauge!("hookq_hosts_blocked").set(blocked.len() as f64);
        if !due.is_empty() {
            // What another daemon holds (a drain turn, a probe) is looked at
            // again after a turn.
            let retry = now + DRAIN_TURN.as_millis() as i64;
            next_when = Some(next_when.map_or(retry, |w| w.min(retry)));
        }
        let mut draining = false;
        for (host, state) in due {
            draining |= self.act_on_due(&host, state).await?;
        }
        Ok(Refresh {
            draining,
            next_when,
        })
    }

    /// Reads the state of each blocked host, replaces this daemon's copy
    /// of the hosts that are not closed with them, and returns the hosts
    /// due by `now` with their states.
    async fn read_blocked_states(
        &self,
        blocked: &[(String, i64)],
        now: i64,
    ) -> crate::store::StoreResult<Vec<(String, HostState)>> {
        let mut states = HashMap::new();
        let mut due = Vec::new();
        for (host, when) in blocked {
            let record = self.store.host_record(host).await?;
            if record.state != HostState::Closed {
                states.insert(host.clone(), record.state);
            }
            if *when <= now {
                due.push((host.clone(), record.state));
            }
        }
        let mut map = match self.blocked.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        *map = states;
        Ok(due)
    }

    /// Acts on a blocked host whose time came: an open host begins its
    /// probe, an expired pause closes the host, and a closed host with
    /// parked jobs gets a drain round. Returns whether this daemon is still
    /// draining the host.
    async fn act_on_due(&self, host: &str, state: HostState) -> crate::store::StoreResult<bool> {
        match state {
            HostState::Open | HostState::HalfOpen => {
                if self
                    .store
                    .host_probe(host, "begin", self.probe_lease())
                    .await?
                {
                    self.set_state(host, HostState::HalfOpen);
                    let moved = self.unpark_round(host, 1).await?.0;
                    tracing::info!(%host, probe_job_released = moved > 0, "host half-open: one probe");
                }
                Ok(false)
            }
            HostState::Paused => {
                if self.store.host_resume(host, "expired").await? {
                    self.set_state(host, HostState::Closed);
                    tracing::info!(%host, "host's pause ran out");
                    self.alerts.emit(
                        "host.closed",
                        json!({"host": host, "reason": "pause_ended"}),
                    );
                }
                Ok(false)
            }
            HostState::Closed => self.drain_parked(host).await,
        }
    }

    /// Takes `host`'s drain turn, if no daemon holds it, and moves back a
    /// round of its parked jobs; gives the turn up when none are left.
    /// Returns whether jobs are left to drain.
    async fn drain_parked(&self, host: &str) -> crate::store::StoreResult<bool> {
        if !self.store.host_drain(host, "take", DRAIN_TURN).await? {
            return Ok(false);
        }
        let round = self.next_round(host);
        let (_, left) = self.unpark_round(host, round).await?;
        if left == 0 {
            self.store.host_drain(host, "done", DRAIN_TURN).await?;
            self.lock_draining().remove(host);
            Ok(false)
        } else {
            Ok(true)
        }
    }

    /// The hosts this daemon is draining, locked.
    fn lock_draining(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        match self.draining.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The size of this daemon's next drain round of `host`: a host with a
    /// rate gets what it takes in a round at that rate; any other starts at
    /// ten rounds' worth of its slots and doubles per round (a slow start:
    /// the lanes take what the host keeps up with, the rest waits in the
    /// ready list), up to [`DRAIN_ROUND_MAX`].
    fn next_round(&self, host: &str) -> usize {
        let limits = self.rules.limits(host);
        if limits.rate > 0.0 {
            return drain_round(&limits);
        }
        let mut draining = self.lock_draining();
        let size = draining.entry(host.to_string()).or_insert(0);
        *size = if *size == 0 {
            drain_round(&limits)
        } else {
            (*size * 2).min(DRAIN_ROUND_MAX)
        };
        *size
    }

    /// Moves up to `n` of `host`'s parked jobs back to the due sets, spread
    /// over the partitions holding some: (moved, left parked).
    async fn unpark_round(
        &self,
        host: &str,
        n: usize,
    ) -> crate::store::StoreResult<(usize, usize)> {
        let parked = self.store.parked_counts(host).await?;
        if parked.is_empty() {
            return Ok((0, 0));
        }
        let share = n.div_ceil(parked.len()).max(1);
        let (mut moved, mut left, mut budget) = (0, 0, n);
        for (p, _) in parked {
            if budget == 0 {
                left += 1;
                continue;
            }
            let (m, l) = self.store.unpark(p, host, share.min(budget)).await?;
            moved += m;
            left += l;
            budget = budget.saturating_sub(m.max(1));
        }
        Ok((moved, left))
    }
}

/// Jobs moved back in a first drain round: what the host takes in a turn at
/// its rate (twice, so it never idles), or ten times its slots.
fn drain_round(limits: &Limits) -> usize {
    if limits.rate > 0.0 {
        ((limits.rate * 2.0 * DRAIN_TURN.as_secs_f64()).ceil() as usize).max(1)
    } else {
        limits.concurrency * 10
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_count_only_the_host_s_failures() {
        let failed = Outcome::Failed(FailureKind::Retryable { retry_after: None });
        assert_eq!(
            Verdict::of(&Outcome::Delivered, None, Some(200)),
            Verdict::Answered
        );
        assert_eq!(
            Verdict::of(&failed, Some(ErrorKind::Timeout), None),
            Verdict::Failed("timeout".into())
        );
        assert_eq!(
            Verdict::of(&failed, Some(ErrorKind::HttpStatus), Some(503)),
            Verdict::Failed("http_503".into())
        );
        assert_eq!(
            Verdict::of(&failed, Some(ErrorKind::HttpStatus), Some(429)),
            Verdict::Failed("http_429".into())
        );
        assert_eq!(
            Verdict::of(&failed, Some(ErrorKind::HttpStatus), Some(404)),
            Verdict::Answered
        );
        assert_eq!(
            Verdict::of(&failed, Some(ErrorKind::SsrfBlocked), None),
            Verdict::Answered
        );
    }
}
