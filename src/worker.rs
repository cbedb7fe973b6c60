//! The worker pool: claims ready jobs (`ready` list → `inflight` zset, one
//! script call per batch), queues each on its host's lane
//! ([`crate::hosts::lanes`]) and runs the attempts the lanes clear, then
//! records each outcome (`complete_jobs` / `fail_job`).
//!
//! Two budgets bound the work: `delivery.workers` attempts in flight, and
//! twice that many claimed jobs held in memory (in flight or waiting for
//! their host). A claim loop per partition claims only what the claim budget
//! allows, so a busy host's jobs wait here under their leases instead of
//! going back and forth to Redis. A claim loop waits for a chunk of room at
//! a time; when a ready list starts meanwhile (a tenant's jobs it has not
//! seen, SPEC §15), it claims a few jobs at once from a small reserve, so a
//! tenant new to a busy partition does not wait for every other
//! partition's chunk. In-flight attempts run on a
//! [`TaskTracker`] so a graceful stop can wait for them, bounded by
//! `delivery.shutdown_grace`; jobs still waiting for their host are given
//! back to Redis at once.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::carrier::PROMOTE_BATCH;
use crate::clock::RedisClock;
use crate::completions::Completions;
use crate::config::Config;
use crate::delivery::{AttemptRecord, Deliverer, ErrorKind, Outcome};
use crate::fleet::Fleet;
use crate::holding::{may_start, Holding};
use crate::hosts::breaker::{Breaker, Verdict};
use crate::hosts::lanes::{Entry, Lane, Lanes, Push};
use crate::hosts::rate::RateLimiter;
use crate::job::host_key;
use crate::job::JobSpec;
use crate::retry::FailAction;
use crate::retry::{next_delay, FailureKind};
use crate::store::hosts::HostState;
use crate::store::{Claimed, Promotion, Store, StoreError};
use crate::wake::Signals;

mod outcomes;

/// Claimed jobs held in memory per worker (in flight or waiting for a host).
pub(crate) const HELD_PER_WORKER: usize = 2;

/// Most jobs a claim for a started ready list takes from the reserve.
const STARTED_CLAIM: usize = 4;

/// How long an idle claim loop waits before looking at its ready list even
/// without a signal (a safety net for lost pub/sub messages).
pub(crate) const IDLE_RECHECK: Duration = Duration::from_secs(5);

/// Most distinct topics that get a metrics label of their own (per
/// process): a client chooses topics, and every label value is a series
/// Prometheus keeps. Topics seen after these are counted as `other`.
pub const METRIC_TOPICS_MAX: usize = 100;

/// The `topic` label for `topic`: itself while fewer than
/// [`METRIC_TOPICS_MAX`] topics have a label, else `other`.
pub(crate) fn topic_label(topic: &str) -> String {
    static LABELED: Labeled = std::sync::OnceLock::new();
    bounded_label(&LABELED, METRIC_TOPICS_MAX, topic)
}

/// The `tenant` label for `tenant`: itself while fewer than
/// [`crate::tenant::METRIC_TENANTS_MAX`] tenants have a label, else
/// `other`.
pub(crate) fn tenant_label(tenant: &str) -> String {
    static LABELED: Labeled = std::sync::OnceLock::new();
    bounded_label(&LABELED, crate::tenant::METRIC_TENANTS_MAX, tenant)
}

/// The values of one label that have a series of their own.
type Labeled = std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<String>>>;

/// `value` as a label bounded to `max` distinct values (`other` past them).
fn bounded_label(labeled: &Labeled, max: usize, value: &str) -> String {
    let labeled = labeled.get_or_init(Default::default);
    let mut labeled = match labeled.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    };
    if labeled.contains(value) {
        return value.to_string();
    }
    if labeled.len() < max {
        labeled.insert(value.to_string());
        return value.to_string();
    }
    "other".to_string()
}

/// Permits a claim waits for at least: room for a chunk of jobs at a time,
/// a sixteenth of the claim budget (at least 1, at most
/// `delivery.claim_batch`).
fn claim_chunk(config: &Config) -> u32 {
    let batch = config.delivery.claim_batch;
    let held = config.delivery.workers * HELD_PER_WORKER;
    (held / 16).clamp(1, batch) as u32
}

/// Most jobs one claim of partition `p` takes: `claim_batch`, or, for the
/// partition whose shared timers hold every partition's jobs (a single
/// Redis), that for each partition up to a promotion's batch, so that a
/// round's due jobs are claimed in one call.
fn claim_max(claim_batch: usize, keys: &crate::store::Keys, p: u16) -> usize {
    if keys.shared_timers() && keys.timer_partitions().contains(&p) {
        (claim_batch * usize::from(keys.partitions())).min(PROMOTE_BATCH.max(claim_batch))
    } else {
        claim_batch
    }
}

/// `room` as one permit per job.
fn split_permits(mut room: OwnedSemaphorePermit) -> Vec<OwnedSemaphorePermit> {
    let n = room.num_permits();
    std::iter::from_fn(|| room.split(1)).take(n).collect()
}

/// Waits for `notify` (forever when there is none).
async fn notified(notify: Option<&Notify>) {
    match notify {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

/// How often lanes are checked for jobs that should go back to Redis.
const EVICT_EVERY: Duration = Duration::from_millis(100);

/// When and where a pool claims: the wake signals, and the partitions the
/// fleet dealt to this daemon.
pub(crate) struct Cues {
    /// Wake signals of this daemon.
    pub signals: Arc<Signals>,
    /// The partitions this daemon claims from.
    pub fleet: Arc<Fleet>,
}

/// The attempt runners of one daemon.
pub(crate) struct WorkerPool {
    store: Store,
    deliverer: Deliverer,
    config: Arc<Config>,
    signals: Arc<Signals>,
    clock: RedisClock,
    /// Claimed jobs in memory.
    budget: Arc<Semaphore>,
    /// Room beyond `budget` for claims made when a ready list starts, a
    /// chunk's worth.
    reserve: Arc<Semaphore>,
    /// Attempts in flight.
    workers: Arc<Semaphore>,
    lanes: Arc<Lanes>,
    breaker: Arc<Breaker>,
    /// Attempts (and outcome recordings).
    tracker: TaskTracker,
    /// Lane runners.
    runners: TaskTracker,
    completions: Completions,
    /// The partitions this daemon claims from.
    fleet: Arc<Fleet>,
    /// Jobs claimed ahead of their due time.
    holding: Holding,
}

impl WorkerPool {
    /// A pool with `delivery.workers` permits (call within a Tokio runtime:
    /// it starts the completion flusher).
    pub(crate) fn new(
        store: Store,
        deliverer: Deliverer,
        config: Arc<Config>,
        cues: Cues,
        clock: RedisClock,
        lanes: Arc<Lanes>,
        breaker: Arc<Breaker>,
    ) -> Self {
        let Cues { signals, fleet } = cues;
        let workers = config.delivery.workers;
        let held = workers * HELD_PER_WORKER;
        let window = crate::completions::window_for(
            config.delivery.claim_ahead,
            config.delivery.lease_margin,
        );
        let completions = Completions::start(store.clone(), window, signals.clone());
        let reserve = claim_chunk(&config) as usize;
        WorkerPool {
            reserve: Arc::new(Semaphore::new(reserve)),
            completions,
            fleet,
            lanes,
            breaker,
            budget: Arc::new(Semaphore::new(held)),
            workers: Arc::new(Semaphore::new(workers)),
            store,
            deliverer,
            config,
            signals,
            clock,
            tracker: TaskTracker::new(),
            runners: TaskTracker::new(),
            holding: Holding::default(),
        }
    }

    /// Claims and runs attempts until `token` is cancelled, then gives back
    /// the jobs still waiting for their host and waits up to
    /// `delivery.shutdown_grace` for the attempts in flight.
    pub(crate) async fn run(self, token: CancellationToken) {
        metrics::gauge!("hookq_workers").set(self.config.delivery.workers as f64);
        let pool = Arc::new(self);
        let loops = TaskTracker::new();
        for p in 0..pool.store.keys().partitions() {
            let pool = pool.clone();
            let token = token.clone();
            loops.spawn(async move { pool.claim_loop(p, token).await });
        }
        {
            let pool = pool.clone();
            let token = token.clone();
            loops.spawn(async move { pool.evict_loop(token).await });
        }
        {
            let pool = pool.clone();
            let token = token.clone();
            loops.spawn(async move { pool.hold_loop(token).await });
        }
        loops.close();
        loops.wait().await;
        pool.runners.close();
        pool.runners.wait().await;
        // Held jobs go back still due at their time.
        let now = pool.clock.now_ms();
        let mut waiting: Vec<(Entry, Duration)> = pool
            .holding
            .drain()
            .into_iter()
            .map(|e| {
                let wait = u64::try_from(e.job.due - now).unwrap_or(0);
                (e, Duration::from_millis(wait))
            })
            .collect();
        waiting.extend(pool.lanes.drain().into_iter().map(|e| (e, Duration::ZERO)));
        if !waiting.is_empty() {
            tracing::info!(
                jobs = waiting.len(),
                "giving back jobs that were waiting for their host"
            );
            pool.give_back(waiting).await;
        }
        pool.tracker.close();
        let in_flight = pool.tracker.len();
        if in_flight > 0 {
            tracing::info!(in_flight, "waiting for attempts in flight");
        }
        if tokio::time::timeout(pool.config.delivery.shutdown_grace, pool.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                unfinished = pool.tracker.len(),
                "shutdown grace elapsed; unfinished attempts are left to their leases"
            );
        }
    }

    /// Claims from partition `p` until `token` is cancelled: whenever woken
    /// (or after [`IDLE_RECHECK`]) and this daemon carries `p`, drains its
    /// ready list as far as the claim budget allows.
    async fn claim_loop(self: Arc<Self>, p: u16, token: CancellationToken) {
        let Some(notify) = self.signals.ready_notify(p) else {
            return;
        };
        let chunk = claim_chunk(&self.config);
        loop {
            // A partition another daemon has is left alone (gaining it
            // signals).
            if self.fleet.owns(p) && self.drain(p, chunk, &token).await.is_break() {
                return;
            }
            if self
                .wait_for_work(p, chunk, notify, &token)
                .await
                .is_break()
            {
                return;
            }
        }
    }

    /// Waits for a ready signal on `notify` or [`IDLE_RECHECK`], telling the
    /// carrier meanwhile whether it may hand this loop a promotion; breaks
    /// when `token` is cancelled.
    async fn wait_for_work(
        &self,
        p: u16,
        chunk: u32,
        notify: &Notify,
        token: &CancellationToken,
    ) -> ControlFlow<()> {
        // While it waits with room, the carrier may hand it a due
        // promotion (one call then promotes and claims).
        let room = self.budget.available_permits() >= chunk as usize;
        self.signals.set_claim_idle(p, room && self.fleet.owns(p));
        tokio::select! {
            biased;
            _ = token.cancelled() => return ControlFlow::Break(()),
            _ = notify.notified() => {}
            _ = tokio::time::sleep(IDLE_RECHECK) => {}
        }
        self.signals.set_claim_idle(p, false);
        ControlFlow::Continue(())
    }

    /// Drains partition `p`: claims (promoting first when the carrier handed
    /// a promotion over) while there is work and room in memory, and sends
    /// each job on. Continues when the ready list is empty or a claim failed;
    /// breaks when `token` is cancelled or the budget is closed.
    async fn drain(
        self: &Arc<Self>,
        p: u16,
        chunk: u32,
        token: &CancellationToken,
    ) -> ControlFlow<()> {
        loop {
            let Some(permits) = self.reserve_room(p, chunk, token).await else {
                return ControlFlow::Break(());
            };
            let promote = if self.signals.take_promotion(p) {
                PROMOTE_BATCH
            } else {
                0
            };
            let claimed = match self.store.claim_promoting(p, permits.len(), promote).await {
                Ok(c) => c,
                Err(err) => return self.claim_failed(p, promote, err, permits, token).await,
            };
            self.clock.observe(claimed.now);
            if let Some(promotion) = claimed.promotion {
                self.report_promotion(p, promotion).await;
            }
            let more = claimed.more;
            self.dispatch(claimed.jobs, permits, token);
            if !more {
                return ControlFlow::Continue(());
            }
        }
    }

    /// Takes room in the claim budget for at least `chunk` jobs and at most
    /// `delivery.claim_batch`, a permit per job; or, when a ready list of
    /// partition `p` starts meanwhile, up to [`STARTED_CLAIM`] permits of the
    /// reserve. None when `token` is cancelled or the budget is closed.
    async fn reserve_room(
        &self,
        p: u16,
        chunk: u32,
        token: &CancellationToken,
    ) -> Option<Vec<OwnedSemaphorePermit>> {
        let batch = self.claim_max(p);
        // Room for a chunk of jobs at a time: claiming for every
        // single permit freed would cost a script call per job
        // whenever the budget is full (a slow or rate-limited host).
        let mut room = loop {
            // The carrier may hand a due promotion to a loop waiting here
            // while the reserve is free (one call then promotes and claims).
            let waiting = self.reserve.available_permits() > 0 && self.fleet.owns(p);
            self.signals.set_claim_waiting(p, waiting);
            let budget = tokio::select! {
                biased;
                _ = token.cancelled() => return None,
                permit = self.budget.clone().acquire_many_owned(chunk) => Some(permit),
                _ = notified(self.signals.started_notify(p)) => None,
            };
            self.signals.set_claim_waiting(p, false);
            match budget {
                Some(permit) => break permit.ok()?,
                // A ready list started, or a promotion was handed over.
                None => {
                    let n = self.reserve.available_permits().min(STARTED_CLAIM) as u32;
                    if n > 0 {
                        if let Ok(room) = self.reserve.clone().try_acquire_many_owned(n) {
                            return Some(split_permits(room));
                        }
                    }
                    // The reserve is in use: a promotion handed over goes
                    // back to the carrier, and the loop waits for the budget.
                    if self.signals.take_promotion(p) {
                        self.signals.due(p, 0);
                    }
                }
            }
        };
        while room.num_permits() < batch {
            match self.budget.clone().try_acquire_owned() {
                Ok(p) => room.merge(p),
                Err(_) => break,
            }
        }
        Some(split_permits(room))
    }

    /// Most jobs one claim of partition `p` takes (see [`claim_max`]).
    fn claim_max(&self, p: u16) -> usize {
        claim_max(self.config.delivery.claim_batch, self.store.keys(), p)
    }

    /// After a failed claim: counts and logs it, has the carrier read the due
    /// set again if the claim was to promote, frees the room and waits a
    /// moment; breaks when `token` is cancelled meanwhile.
    async fn claim_failed(
        &self,
        p: u16,
        promote: usize,
        err: StoreError,
        permits: Vec<OwnedSemaphorePermit>,
        token: &CancellationToken,
    ) -> ControlFlow<()> {
        metrics::counter!("hookq_redis_errors_total", "component" => "worker").increment(1);
        tracing::warn!(partition = p, cause = %err, "claim failed");
        if promote > 0 {
            // The carrier reads the due set again.
            self.signals.due(p, 0);
        }
        drop(permits);
        tokio::select! {
            biased;
            _ = token.cancelled() => return ControlFlow::Break(()),
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        ControlFlow::Continue(())
    }

    /// Sends each claimed job, holding its permit, on ([`Self::route`]) once
    /// it is due; a job claimed ahead is held until then, unless its host is
    /// open or paused (it is parked at once).
    fn dispatch(
        self: &Arc<Self>,
        jobs: Vec<Claimed>,
        permits: Vec<OwnedSemaphorePermit>,
        token: &CancellationToken,
    ) {
        let now = self.clock.now_ms();
        let mut due = Vec::new();
        for (job, held) in jobs.into_iter().zip(permits) {
            let Some(entry) = self.admit(job, held) else {
                continue;
            };
            // A job of an open or paused host is parked at once, due or
            // not (it keeps its due time there).
            let parks = matches!(
                self.breaker.state(&entry.host),
                HostState::Open | HostState::Paused
            );
            if parks || may_start(entry.job.due, now) {
                due.push(entry);
            } else {
                self.holding.hold(entry);
            }
        }
        self.route(due, token);
    }

    /// Holds each job claimed ahead until its due time, then sends it on
    /// ([`Self::route`]); returns when `token` is cancelled.
    async fn hold_loop(self: Arc<Self>, token: CancellationToken) {
        loop {
            let wake = match self.holding.earliest() {
                // At the due time (see `may_start`).
                Some(due) => tokio::time::Instant::from_std(self.clock.instant_at(due)),
                None => tokio::time::Instant::now() + IDLE_RECHECK,
            };
            tokio::select! {
                biased;
                _ = token.cancelled() => return,
                _ = self.holding.changed.notified() => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
            let due = self.holding.take_due(self.clock.now_ms());
            if !due.is_empty() {
                self.route(due, &token);
            }
        }
    }

    /// Sends each job on by its host's state: queued on its lane (closed),
    /// offered as the probe (half-open), or parked (open, paused); the jobs
    /// a lane gives back and the parked ones go back to Redis in a task of
    /// their own.
    fn route(self: &Arc<Self>, entries: Vec<Entry>, token: &CancellationToken) {
        let mut given_back = Vec::new();
        let mut parked = Vec::new();
        for entry in entries {
            match self.breaker.state(&entry.host) {
                HostState::Closed => {
                    if let Some(back) = self.queue(entry, token) {
                        given_back.push(back);
                    }
                }
                HostState::HalfOpen => {
                    let pool = self.clone();
                    let token = token.clone();
                    tokio::spawn(async move { pool.offer_probe(entry, token).await });
                }
                HostState::Open | HostState::Paused => parked.push(entry),
            }
        }
        if !given_back.is_empty() || !parked.is_empty() {
            let pool = self.clone();
            tokio::spawn(async move {
                pool.give_back(given_back).await;
                pool.park(parked).await;
            });
        }
    }

    /// Tells the carrier what a promotion this loop made left: the next due
    /// time (now, after a full batch), and whether it came before it; and
    /// wakes the claim loops of the other partitions whose ready list it
    /// started (shared timers), here or in the daemon carrying them.
    async fn report_promotion(&self, p: u16, promotion: Promotion) {
        if promotion.moved > 0 {
            metrics::counter!("hookq_promoted_total").increment(promotion.moved as u64);
        }
        let (next, early) = crate::carrier::after_promotion(&promotion);
        self.signals.set_backlog(p, promotion.more_due());
        self.signals.promoted(p, next, early);
        crate::carrier::wake_started(
            &self.store,
            &self.signals,
            &self.fleet,
            p,
            &promotion.started_in,
        )
        .await;
    }

    /// Queues a job on its host's lane, starting the lane's runner when it
    /// has none; a job over the lane's share comes back, to give back.
    fn queue(
        self: &Arc<Self>,
        entry: Entry,
        token: &CancellationToken,
    ) -> Option<(Entry, Duration)> {
        match self.lanes.push(entry) {
            Push::StartRunner(lane) => {
                let pool = self.clone();
                let token = token.clone();
                self.runners
                    .spawn(async move { pool.run_lane(lane, token).await });
                None
            }
            Push::GiveBack(entry, delay) => Some((*entry, delay)),
            Push::Queued => None,
        }
    }

    /// A job of a half-open host: the host's probe if no other daemon runs
    /// one, else parked like the rest.
    async fn offer_probe(self: Arc<Self>, mut entry: Entry, token: CancellationToken) {
        if self.breaker.take_probe(&entry.host).await {
            entry.probe = true;
            tracing::info!(host = %entry.host, job_id = %entry.job.id, "probing the host");
            if let Some(back) = self.queue(entry, &token) {
                self.give_back(vec![back]).await;
            }
        } else {
            self.park(vec![entry]).await;
        }
    }

    /// Parks jobs of open or paused hosts in Redis (one script call per
    /// partition and host), where they wait without cost until the host closes.
    async fn park(&self, entries: Vec<Entry>) {
        let mut groups: BTreeMap<(u16, &str), Vec<&Claimed>> = BTreeMap::new();
        for entry in &entries {
            groups
                .entry((entry.job.partition, entry.host.as_str()))
                .or_default()
                .push(&entry.job);
        }
        let mut hosts = std::collections::BTreeSet::new();
        for ((p, host), jobs) in groups {
            match self.store.park(p, host, &jobs).await {
                Ok(n) => {
                    metrics::counter!("hookq_parked_total").increment(n as u64);
                    hosts.insert(host);
                }
                Err(err) => {
                    metrics::counter!("hookq_redis_errors_total", "component" => "worker")
                        .increment(1);
                    tracing::warn!(partition = p, %host, cause = %err, "cannot park jobs; their leases will return them");
                }
            }
        }
        // A host that closed (and was drained) meanwhile is drained again.
        for host in hosts {
            if let Err(err) = self.store.host_drain(host, "note", Duration::ZERO).await {
                tracing::warn!(%host, cause = %err, "cannot note parked jobs");
            }
        }
    }

    /// Reads a claimed job's spec. A job whose stored spec cannot be read is
    /// dead-lettered at once (None).
    fn admit(self: &Arc<Self>, job: Claimed, held: OwnedSemaphorePermit) -> Option<Entry> {
        let spec: JobSpec = match serde_json::from_str(&job.spec_json) {
            Ok(spec) => spec,
            Err(err) => {
                let record = AttemptRecord {
                    attempt: job.attempt,
                    at: self.clock.now_ms(),
                    duration_ms: 0,
                    status: None,
                    error: Some(ErrorKind::InvalidJob),
                    message: Some(format!("stored job cannot be read: {err}")),
                    location: None,
                    response: String::new(),
                };
                let pool = self.clone();
                self.tracker.spawn(async move {
                    pool.record_failure(&job, "default", &record, FailAction::DeadLetter)
                        .await;
                    drop(held);
                });
                return None;
            }
        };
        let margin = i64::try_from(self.config.delivery.lease_margin.as_millis() / 2).unwrap_or(0);
        let deadline =
            tokio::time::Instant::from_std(self.clock.instant_at(job.claimed_at + margin));
        Some(Entry {
            host: host_key(&spec.url),
            job,
            spec,
            held,
            deadline,
            probe: false,
        })
    }

    /// A lane's runner: starts the attempts its lane clears, until the lane
    /// idles or `token` is cancelled.
    async fn run_lane(self: Arc<Self>, lane: Arc<Lane>, token: CancellationToken) {
        let limits = lane.limits();
        let mut rate = (limits.rate > 0.0).then(|| RateLimiter::new(lane.key(), limits.rate));
        while let Some((entry, ticket)) = lane
            .next(
                &self.workers,
                &mut rate,
                &self.breaker,
                &self.store,
                &self.clock,
                &token,
            )
            .await
        {
            let pool = self.clone();
            self.tracker.spawn(async move {
                let Entry {
                    job,
                    spec,
                    held,
                    host,
                    probe,
                    ..
                } = entry;
                pool.run_attempt(job, spec, &host, probe, (ticket, held))
                    .await;
            });
        }
    }

    /// Gives back, every [`EVICT_EVERY`], the jobs that should not wait in
    /// memory any longer; drops at once those cancelled meanwhile; reports
    /// how late the oldest waiting job is.
    async fn evict_loop(self: Arc<Self>, token: CancellationToken) {
        let lag = metrics::gauge!("hookq_oldest_waiting_lag_seconds");
        loop {
            tokio::select! {
                _ = token.cancelled() => return,
                _ = self.signals.cancellations.notified() => {}
                _ = tokio::time::sleep(EVICT_EVERY) => {}
            }
            let cancelled: std::collections::HashSet<String> =
                self.signals.take_cancelled().into_iter().collect();
            if !cancelled.is_empty() {
                let dropped = self.lanes.remove(&cancelled) + self.holding.remove(&cancelled);
                if dropped > 0 {
                    tracing::debug!(dropped, "dropped cancelled jobs waiting for their host");
                }
            }
            let oldest = self.lanes.oldest_due();
            lag.set(oldest.map_or(0.0, |due| {
                (self.clock.now_ms() - due).max(0) as f64 / 1000.0
            }));
            let evicted = self.lanes.evict(&self.breaker);
            self.give_back(evicted.give_back).await;
            self.park(evicted.park).await;
        }
    }

    /// Gives jobs back to Redis unattempted, each due after its delay (one
    /// script call per partition).
    async fn give_back(&self, jobs: Vec<(Entry, Duration)>) {
        let mut by_partition: BTreeMap<u16, Vec<(&Claimed, Duration)>> = BTreeMap::new();
        for (entry, delay) in &jobs {
            by_partition
                .entry(entry.job.partition)
                .or_default()
                .push((&entry.job, *delay));
        }
        for (p, group) in by_partition {
            metrics::counter!("hookq_deferred_total").increment(group.len() as u64);
            if let Err(err) = self.store.defer_many(p, &group).await {
                metrics::counter!("hookq_redis_errors_total", "component" => "worker").increment(1);
                tracing::warn!(partition = p, cause = %err, "cannot give jobs back; their leases will return them");
            }
        }
    }

    #[tracing::instrument(skip_all, fields(job_id = %job.id, attempt = job.attempt))]
    async fn run_attempt(
        &self,
        job: Claimed,
        spec: JobSpec,
        host: &str,
        probe: bool,
        (ticket, held): (crate::hosts::lanes::Ticket, OwnedSemaphorePermit),
    ) {
        let timeout = spec.timeout(&self.config);
        let started_at = self.clock.now_ms();
        let lateness = (started_at - job.due).max(0) as f64 / 1000.0;
        let tenant = tenant_label(crate::tenant::tenant_of(&job.id));
        metrics::histogram!("hookq_lateness_seconds", "tenant" => tenant.clone()).record(lateness);
        let busy = metrics::gauge!("hookq_workers_busy");
        busy.increment(1.0);
        let report = self
            .deliverer
            .attempt(&job.id, job.attempt, &spec, timeout, started_at)
            .await;
        drop(ticket);
        // The job leaves memory: its outcome waits for its batch under its
        // lease, and room in the claim budget is free again.
        drop(held);
        let verdict = Verdict::of(&report.outcome, report.record.error, report.record.status);
        let failure = match &report.outcome {
            Outcome::Failed(kind) => Some(kind),
            Outcome::Delivered => None,
        };
        self.breaker.record(host, &verdict, failure, probe).await;
        let outcome_label = match report.outcome {
            Outcome::Delivered => "delivered",
            Outcome::Failed(FailureKind::Permanent) => "permanent_failure",
            Outcome::Failed(FailureKind::Retryable { .. }) => "retryable_failure",
        };
        metrics::counter!(
            "hookq_attempts_total",
            "outcome" => outcome_label,
            "topic" => topic_label(&spec.topic),
            "tenant" => tenant
        )
        .increment(1);
        metrics::histogram!("hookq_attempt_duration_seconds")
            .record(report.record.duration_ms as f64 / 1000.0);
        busy.decrement(1.0);
        match report.outcome {
            Outcome::Delivered => self.record_success(&job, &spec, &report.record).await,
            Outcome::Failed(kind) => {
                let ladder = spec.ladder(&self.config);
                let action = next_delay(
                    &ladder,
                    job.attempt,
                    kind,
                    self.config.delivery.jitter,
                    rand::random::<f64>(),
                );
                self.record_failure(&job, &spec.topic, &report.record, action)
                    .await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loop of the partition whose shared timers serve every partition
    /// claims a promotion's batch (a round's due jobs in one call); the
    /// others, and every loop in a cluster, `claim_batch`.
    #[test]
    fn the_shared_timers_loop_claims_a_rounds_batch() {
        use crate::store::Keys;
        let single = Keys::new("hq", 16);
        assert_eq!(claim_max(64, &single, 0), PROMOTE_BATCH);
        assert_eq!(claim_max(64, &single, 3), 64);
        assert_eq!(claim_max(500, &single, 0), 500);
        assert_eq!(claim_max(8, &Keys::new("hq", 4), 0), 32);
        assert_eq!(claim_max(64, &Keys::in_cluster("hq", 16), 0), 64);
    }

    /// A label keeps its first `max` values and counts the rest as `other`.
    #[test]
    fn labels_are_bounded() {
        static LABELED: Labeled = std::sync::OnceLock::new();
        assert_eq!(bounded_label(&LABELED, 2, "a"), "a");
        assert_eq!(bounded_label(&LABELED, 2, "b"), "b");
        assert_eq!(bounded_label(&LABELED, 2, "c"), "other");
        assert_eq!(bounded_label(&LABELED, 2, "a"), "a");
    }
}
