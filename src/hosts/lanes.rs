//! Lanes: the jobs this daemon has claimed, waiting in memory for a slot of
//! their host.
//!
//! Each host with work has a lane: a queue (oldest claim first), a semaphore
//! of `concurrency` slots and one runner task that hands the next job a slot,
//! a rate token (when the host has a rate) and one of the daemon's worker
//! permits, in that order. A job waiting here keeps its lease; it never goes
//! back to Redis merely because its host is busy.
//!
//! What bounds the memory: every claimed job holds one permit of the claim
//! budget (twice `delivery.workers`), and a lane holds at most what its host
//! can start within [`WAIT_TARGET`] at its observed pace (slots over the
//! attempt latency, or its rate). A fast host may use the whole budget; a
//! host that stops answering is throttled to a few jobs within a second, so it
//! cannot take the budget from the others. Jobs beyond a lane's share (or
//! waiting past their deadline) are given back to Redis, each booked for a
//! later turn of its host, so a backlog is not re-claimed in a loop.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::breaker::Breaker;
use super::rate::RateLimiter;
use super::{HostRules, Limits};
use crate::clock::RedisClock;
use crate::job::JobSpec;
use crate::store::hosts::HostState;
use crate::store::{Claimed, Store};

/// How much work, in time at the host's pace, a lane keeps waiting in memory.
pub(crate) const WAIT_TARGET: Duration = Duration::from_secs(1);
/// The same for a host with a rate limit (within the claim budget, and
/// within half the lease margin, after which a waiting job is given back).
pub(crate) const RATE_HORIZON: Duration = Duration::from_secs(5);
/// An idle runner stops after this long; an idle lane is forgotten after
/// [`LANE_FORGET`].
const RUNNER_IDLE: Duration = Duration::from_secs(5);
const LANE_FORGET: Duration = Duration::from_secs(60);
/// Shortest and longest delay of a job given back for a later turn.
const BOOK_MIN: Duration = Duration::from_millis(100);
const BOOK_MAX: Duration = Duration::from_secs(60);

/// A claimed job waiting for its host.
pub(crate) struct Entry {
    /// The claim (lease, fencing token).
    pub job: Claimed,
    /// Its parsed spec.
    pub spec: JobSpec,
    /// The host key (`scheme://host:port`).
    pub host: String,
    /// Its permit of the claim budget, released when the job leaves memory.
    pub held: OwnedSemaphorePermit,
    /// After this, waiting longer would leave too little of the lease for
    /// the attempt: the job is given back instead.
    pub deadline: Instant,
    /// Whether this is the half-open probe of its host.
    pub probe: bool,
}

/// The clearance of one attempt: it holds a host slot and a worker permit
/// until dropped, and the drop records the attempt's duration.
pub(crate) struct Ticket {
    lane: Arc<Lane>,
    started: Instant,
    _slot: OwnedSemaphorePermit,
    _worker: OwnedSemaphorePermit,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.lane.finished(self.started.elapsed());
    }
}

/// Where a pushed job went.
pub(crate) enum Push {
    /// Queued; the lane's runner is running.
    Queued,
    /// Queued; the caller must start the lane's runner ([`Lane::next`] in a loop).
    StartRunner(Arc<Lane>),
    /// Over the lane's share: give it back to Redis, due after this delay.
    GiveBack(Box<Entry>, Duration),
}

/// One host's lane.
pub(crate) struct Lane {
    key: String,
    limits: Limits,
    slots: Arc<Semaphore>,
    state: Mutex<LaneState>,
    notify: Notify,
    in_flight: AtomicUsize,
}

struct LaneState {
    queue: VecDeque<Entry>,
    runner: bool,
    /// Moving average of attempt durations, seconds (0 until one finishes).
    latency: f64,
    /// Last time an attempt finished, or one started on an idle host.
    progress_at: Instant,
    /// Last time the lane had anything to do.
    active_at: Instant,
    /// Jobs given back are booked for turns up to this time.
    booked_until: Instant,
}

impl Lane {
    /// An idle lane for host `key` under `limits`.
    fn new(key: &str, limits: Limits) -> Lane {
        let now = Instant::now();
        Lane {
            key: key.to_string(),
            limits,
            slots: Arc::new(Semaphore::new(limits.concurrency)),
            state: Mutex::new(LaneState {
                queue: VecDeque::new(),
                runner: false,
                latency: 0.0,
                progress_at: now,
                active_at: now,
                booked_until: now,
            }),
            notify: Notify::new(),
            in_flight: AtomicUsize::new(0),
        }
    }

    /// The lane's state, locked (a poisoned lock is taken as it is: the
    /// state stays consistent between statements).
    fn lock(&self) -> MutexGuard<'_, LaneState> {
        match self.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The host key.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The limits the lane runs under.
    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    /// Attempts running now.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Jobs waiting in memory.
    pub(crate) fn waiting(&self) -> usize {
        self.lock().queue.len()
    }

    /// Jobs per second the host is observed to take: slots over latency
    /// (latency is at least the time since the host last made progress
    /// while every slot is taken), capped by its rate.
    fn pace(&self, st: &LaneState, now: Instant) -> f64 {
        let slots = self.limits.concurrency as f64;
        let stalled = if self.in_flight() >= self.limits.concurrency {
            now.saturating_duration_since(st.progress_at).as_secs_f64()
        } else {
            0.0
        };
        let latency = st.latency.max(stalled);
        let mut pace = if latency > 0.0 {
            slots / latency
        } else {
            f64::INFINITY
        };
        if self.limits.rate > 0.0 {
            pace = pace.min(self.limits.rate);
        }
        pace
    }

    /// Most jobs the lane keeps waiting.
    fn share(&self, st: &LaneState, now: Instant, budget: usize) -> usize {
        // A rate-limited host's pace is known and steady: holding more of its
        // work saves giving jobs back (and claiming them again) while they
        // wait for their turn.
        let horizon = if self.limits.rate > 0.0 {
            RATE_HORIZON
        } else {
            WAIT_TARGET
        };
        let share = self.pace(st, now) * horizon.as_secs_f64();
        if share.is_finite() {
            (share as usize).clamp(1, budget)
        } else {
            budget
        }
    }

    /// Books a later turn for a job given back: after the work already
    /// waiting and the jobs booked before it.
    fn book(&self, st: &mut LaneState, now: Instant) -> Duration {
        let pace = self.pace(st, now).max(1.0 / BOOK_MAX.as_secs_f64());
        let turn = Duration::from_secs_f64((1.0 / pace).min(BOOK_MAX.as_secs_f64()));
        let queued =
            Duration::from_secs_f64((st.queue.len() as f64 / pace).min(BOOK_MAX.as_secs_f64()));
        st.booked_until = st.booked_until.max(now + queued) + turn;
        let delay = st.booked_until.saturating_duration_since(now);
        // Up to 20% more, so daemons booking the same turns spread out.
        (delay + delay.mul_f64(rand::random::<f64>() * 0.2)).clamp(BOOK_MIN, BOOK_MAX)
    }

    /// Records that an attempt finished after `took`: one in flight less,
    /// the lane's latency estimate and progress times updated.
    fn finished(&self, took: Duration) {
        let mut st = self.lock();
        let sample = took.as_secs_f64();
        st.latency = if st.latency == 0.0 {
            sample
        } else {
            st.latency * 0.9 + sample * 0.1
        };
        let now = Instant::now();
        st.progress_at = now;
        st.active_at = now;
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// The runner's step: waits for a queued job, its host slot, a rate
    /// token and a worker permit, and returns the job with its clearance. None when
    /// the lane has been idle for a while (the runner stops; a later push
    /// starts a new one) or `token` is cancelled.
    pub(crate) async fn next(
        self: &Arc<Self>,
        workers: &Arc<Semaphore>,
        rate: &mut Option<RateLimiter>,
        breaker: &Breaker,
        store: &Store,
        clock: &RedisClock,
        token: &CancellationToken,
    ) -> Option<(Entry, Ticket)> {
        loop {
            self.wait_for_queued(token).await?;
            let (slot, worker) = self.clearance(workers, rate, store, clock, token).await?;
            let Some(entry) = self.start_front(breaker) else {
                drop((slot, worker));
                tokio::select! {
                    _ = token.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
                continue;
            };
            let ticket = Ticket {
                lane: self.clone(),
                started: Instant::now(),
                _slot: slot,
                _worker: worker,
            };
            return Some((entry, ticket));
        }
    }

    /// Waits until a job is queued. None (and the runner marked stopped)
    /// when the lane has been idle for [`RUNNER_IDLE`] or `token` is
    /// cancelled.
    async fn wait_for_queued(&self, token: &CancellationToken) -> Option<()> {
        loop {
            {
                let mut st = self.lock();
                if !st.queue.is_empty() {
                    return Some(());
                }
                if st.active_at.elapsed() >= RUNNER_IDLE || token.is_cancelled() {
                    st.runner = false;
                    return None;
                }
            }
            tokio::select! {
                _ = token.cancelled() => {}
                _ = self.notify.notified() => {}
                _ = tokio::time::sleep(RUNNER_IDLE) => {}
            }
        }
    }

    /// Waits for a host slot, a rate token and a worker permit, in that
    /// order. None (and the runner marked stopped) when `token` is
    /// cancelled or a semaphore is closed.
    async fn clearance(
        &self,
        workers: &Arc<Semaphore>,
        rate: &mut Option<RateLimiter>,
        store: &Store,
        clock: &RedisClock,
        token: &CancellationToken,
    ) -> Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)> {
        let cleared = async {
            let slot = self.slots.clone().acquire_owned().await.ok()?;
            if let Some(limiter) = rate.as_mut() {
                limiter.acquire(store, clock).await;
            }
            let worker = workers.clone().acquire_owned().await.ok()?;
            Some((slot, worker))
        };
        tokio::select! {
            _ = token.cancelled() => None,
            cleared = cleared => cleared,
        }
        .or_else(|| {
            self.lock().runner = false;
            None
        })
    }

    /// Takes the oldest queued job and counts it in flight. None when the
    /// queue was given back meanwhile, or when the host is no longer
    /// closed and the job is not its probe (the job stays queued).
    fn start_front(&self, breaker: &Breaker) -> Option<Entry> {
        let mut st = self.lock();
        match st.queue.pop_front() {
            // Given back meanwhile; wait for the next.
            None => None,
            Some(entry) if !entry.probe && breaker.state(&self.key) != HostState::Closed => {
                // The host opened or was paused: the evictor parks
                // the queue; nothing starts meanwhile.
                st.queue.push_front(entry);
                None
            }
            Some(entry) => {
                let now = Instant::now();
                if self.in_flight.fetch_add(1, Ordering::AcqRel) == 0 {
                    st.progress_at = now;
                }
                st.active_at = now;
                Some(entry)
            }
        }
    }
}

/// What [`Lanes::evict`] took out.
#[derive(Default)]
pub(crate) struct Evicted {
    /// Jobs to give back to the due set, each after its delay.
    pub give_back: Vec<(Entry, Duration)>,
    /// Jobs of hosts that are open or paused, to park.
    pub park: Vec<Entry>,
}

/// Every lane of this daemon.
pub(crate) struct Lanes {
    rules: HostRules,
    budget: usize,
    lanes: Mutex<HashMap<String, Arc<Lane>>>,
}

impl Lanes {
    /// Lanes under `rules`, sharing a claim budget of `budget` jobs.
    pub(crate) fn new(rules: HostRules, budget: usize) -> Self {
        Lanes {
            rules,
            budget: budget.max(1),
            lanes: Mutex::new(HashMap::new()),
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Lane>>> {
        match self.lanes.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The lane of host `key`, created on first use.
    pub(crate) fn lane(&self, key: &str) -> Arc<Lane> {
        let mut map = self.map();
        if let Some(lane) = map.get(key) {
            return lane.clone();
        }
        let lane = Arc::new(Lane::new(key, self.rules.limits(key)));
        map.insert(key.to_string(), lane.clone());
        lane
    }

    /// Queues a claimed job on its host's lane, or tells the caller to give
    /// it back when the lane holds its share already.
    pub(crate) fn push(&self, entry: Entry) -> Push {
        let lane = self.lane(&entry.host);
        let start = {
            let mut st = lane.lock();
            let now = Instant::now();
            st.active_at = now;
            if st.queue.len() >= lane.share(&st, now, self.budget) {
                let delay = lane.book(&mut st, now);
                return Push::GiveBack(Box::new(entry), delay);
            }
            st.queue.push_back(entry);
            !std::mem::replace(&mut st.runner, true)
        };
        lane.notify.notify_one();
        if start {
            Push::StartRunner(lane)
        } else {
            Push::Queued
        }
    }

    /// Takes out the jobs that should not wait here any longer: those of a
    /// host that is not closed (to park, except its probe), and those past
    /// their deadline or beyond their lane's share (newest first), each with
    /// the delay it is booked for. Also forgets idle lanes.
    pub(crate) fn evict(&self, breaker: &Breaker) -> Evicted {
        let now = Instant::now();
        let mut out = Evicted::default();
        let mut map = self.map();
        map.retain(|_, lane| {
            let mut st = lane.lock();
            if breaker.state(&lane.key) != HostState::Closed {
                let (probe, park): (VecDeque<Entry>, VecDeque<Entry>) =
                    st.queue.drain(..).partition(|e| e.probe);
                st.queue = probe;
                out.park.extend(park);
            }
            let share = lane.share(&st, now, self.budget);
            while st.queue.len() > share {
                let Some(entry) = st.queue.pop_back() else {
                    break;
                };
                let delay = lane.book(&mut st, now);
                out.give_back.push((entry, delay));
            }
            while st.queue.front().is_some_and(|e| e.deadline <= now) {
                let Some(entry) = st.queue.pop_front() else {
                    break;
                };
                let delay = lane.book(&mut st, now);
                out.give_back.push((entry, delay));
            }
            let idle = !st.runner
                && st.queue.is_empty()
                && lane.in_flight() == 0
                && st.active_at.elapsed() >= LANE_FORGET;
            !idle || Arc::strong_count(lane) > 1
        });
        out
    }

    /// Drops the waiting jobs among `ids` (cancelled meanwhile: their leases
    /// are gone); the number dropped.
    pub(crate) fn remove(&self, ids: &std::collections::HashSet<String>) -> usize {
        let map = self.map();
        let mut dropped = 0;
        for lane in map.values() {
            let mut st = lane.lock();
            let before = st.queue.len();
            st.queue.retain(|e| !ids.contains(&e.job.id));
            dropped += before - st.queue.len();
        }
        dropped
    }

    /// The earliest due time (epoch ms) among the waiting jobs.
    pub(crate) fn oldest_due(&self) -> Option<i64> {
        self.map()
            .values()
            .filter_map(|lane| lane.lock().queue.iter().map(|e| e.job.due).min())
            .min()
    }

    /// Takes out every waiting job (at shutdown, to give them back at once).
    pub(crate) fn drain(&self) -> Vec<Entry> {
        let map = self.map();
        map.values()
            .flat_map(|lane| lane.lock().queue.drain(..).collect::<Vec<_>>())
            .collect()
    }

    /// The limits every lane runs under.
    pub(crate) fn rules(&self) -> &HostRules {
        &self.rules
    }

    /// The hosts with a lane now.
    pub(crate) fn hosts(&self) -> Vec<String> {
        self.map().keys().cloned().collect()
    }

    /// (in flight, waiting) of `host`'s lane, if it has one (none is made).
    pub(crate) fn figures(&self, host: &str) -> Option<(usize, usize)> {
        let lane = self.map().get(host).cloned()?;
        Some((lane.in_flight(), lane.waiting()))
    }
}
