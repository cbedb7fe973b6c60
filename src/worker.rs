//! The worker pool: claims ready jobs (`ready` list → `inflight` zset, one
//! script call per batch) and runs their attempts, then records each outcome
//! (`complete_job` / `fail_job`).
//!
//! Concurrency is bounded by a semaphore of `delivery.workers` permits. A
//! claim loop per partition first acquires permits, then claims at most that
//! many jobs, so claimed work never waits in memory for a worker; each attempt
//! task owns its permit. In-flight attempts run on a [`TaskTracker`] so a
//! graceful stop can wait for them, bounded by `delivery.shutdown_grace`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::RedisClock;
use crate::completions::Completions;
use crate::config::Config;
use crate::delivery::hosts::HostLimits;
use crate::delivery::{AttemptRecord, Deliverer, ErrorKind, Outcome};
use crate::job::JobSpec;
use crate::retry::{next_delay, FailureKind};
use crate::store::{Claimed, FailAction, Failure, Store};
use crate::wake::Signals;

/// Longest wait for a slot of a host at its concurrency limit before the job
/// is given back to Redis (also at most half the lease margin).
pub const HOST_WAIT: Duration = Duration::from_secs(1);

/// How long an idle claim loop waits before looking at its ready list even
/// without a signal (a safety net for lost pub/sub messages).
pub const IDLE_RECHECK: Duration = Duration::from_secs(1);

/// The attempt runners of one daemon.
pub struct WorkerPool {
    store: Store,
    deliverer: Deliverer,
    config: Arc<Config>,
    signals: Arc<Signals>,
    clock: RedisClock,
    permits: Arc<Semaphore>,
    hosts: HostLimits,
    tracker: TaskTracker,
    completions: Completions,
}

impl WorkerPool {
    /// A pool with `delivery.workers` permits (call within a Tokio runtime:
    /// it starts the completion flusher).
    pub fn new(
        store: Store,
        deliverer: Deliverer,
        config: Arc<Config>,
        signals: Arc<Signals>,
        clock: RedisClock,
    ) -> Self {
        let permits = Arc::new(Semaphore::new(config.delivery.workers));
        let hosts = HostLimits::new(config.delivery.per_host_concurrency);
        let completions = Completions::start(store.clone());
        WorkerPool {
            completions,
            store,
            deliverer,
            config,
            signals,
            clock,
            permits,
            hosts,
            tracker: TaskTracker::new(),
        }
    }

    /// Claims and runs attempts until `token` is cancelled, then waits up to
    /// `delivery.shutdown_grace` for the attempts in flight.
    pub async fn run(self, token: CancellationToken) {
        metrics::gauge!("hookq_workers").set(self.config.delivery.workers as f64);
        let pool = Arc::new(self);
        let loops = TaskTracker::new();
        for p in 0..pool.store.keys().partitions() {
            let pool = pool.clone();
            let token = token.clone();
            loops.spawn(async move { pool.claim_loop(p, token).await });
        }
        loops.close();
        loops.wait().await;
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

    async fn claim_loop(self: Arc<Self>, p: u16, token: CancellationToken) {
        let Some(notify) = self.signals.ready_notify(p) else {
            return;
        };
        let batch = self.config.delivery.claim_batch;
        let mut first = true;
        loop {
            if !first {
                tokio::select! {
                    biased;
                    _ = token.cancelled() => return,
                    _ = notify.notified() => {}
                    _ = tokio::time::sleep(IDLE_RECHECK) => {}
                }
            }
            first = false;
            // Drain: claim while there is work and free workers.
            loop {
                let permit = tokio::select! {
                    biased;
                    _ = token.cancelled() => return,
                    permit = self.permits.clone().acquire_owned() => match permit {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                };
                let mut permits = vec![permit];
                while permits.len() < batch {
                    match self.permits.clone().try_acquire_owned() {
                        Ok(p) => permits.push(p),
                        Err(_) => break,
                    }
                }
                let claimed = match self.store.claim(p, permits.len()).await {
                    Ok(c) => c,
                    Err(err) => {
                        metrics::counter!("hookq_redis_errors_total", "component" => "worker")
                            .increment(1);
                        tracing::warn!(partition = p, cause = %err, "claim failed");
                        drop(permits);
                        tokio::select! {
                            biased;
                            _ = token.cancelled() => return,
                            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                        }
                        break;
                    }
                };
                self.clock.observe(claimed.now);
                let more = claimed.more;
                for (job, permit) in claimed.jobs.into_iter().zip(permits) {
                    let pool = self.clone();
                    self.tracker
                        .spawn(async move { pool.run_attempt(job, permit).await });
                }
                if !more {
                    break;
                }
            }
        }
    }

    #[tracing::instrument(skip_all, fields(job_id = %job.id, attempt = job.attempt))]
    async fn run_attempt(self: Arc<Self>, job: Claimed, permit: OwnedSemaphorePermit) {
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
                self.record_failure(&job, "default", &record, FailAction::DeadLetter)
                    .await;
                return;
            }
        };
        let timeout = spec.timeout(&self.config);
        let host = HostLimits::key(&spec.url);
        let (_permit, _slot) = match self.hosts.try_acquire(&host) {
            Some(slot) => (permit, slot),
            None => {
                // The host is full. A few jobs (as many as the host has slots)
                // may wait briefly for one; the rest, and those whose wait runs
                // out, go back to Redis, so one slow host can hold at most
                // twice its slots in workers.
                let wait = (self.config.delivery.lease_margin / 2).min(HOST_WAIT);
                match self.hosts.acquire_within(&host, wait).await {
                    Some(slot) => (permit, slot),
                    None => {
                        drop(permit);
                        self.defer(&job, timeout).await;
                        return;
                    }
                }
            }
        };
        let started_at = self.clock.now_ms();
        let lateness = (started_at - job.due).max(0) as f64 / 1000.0;
        metrics::histogram!("hookq_lateness_seconds").record(lateness);
        let busy = metrics::gauge!("hookq_workers_busy");
        busy.increment(1.0);
        let report = self
            .deliverer
            .attempt(&job.id, job.attempt, &spec, timeout, started_at)
            .await;
        let outcome_label = match report.outcome {
            Outcome::Delivered => "delivered",
            Outcome::Failed(FailureKind::Permanent) => "permanent_failure",
            Outcome::Failed(FailureKind::Retryable { .. }) => "retryable_failure",
        };
        metrics::counter!("hookq_attempts_total", "outcome" => outcome_label, "topic" => spec.topic.clone())
            .increment(1);
        metrics::histogram!("hookq_attempt_duration_seconds")
            .record(report.record.duration_ms as f64 / 1000.0);
        busy.decrement(1.0);
        match report.outcome {
            Outcome::Delivered => self.record_success(&job, &report.record).await,
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

    /// Retries recording an outcome while Redis is failing, until the lease
    /// would have expired anyway (then lease recovery takes over).
    fn recording_deadline(&self, job: &Claimed, spec_timeout: Duration) -> tokio::time::Instant {
        let lease = self.config.lease_for(spec_timeout);
        tokio::time::Instant::from_std(
            self.clock
                .instant_at(job.claimed_at + lease.as_millis() as i64),
        )
    }

    /// Gives a job back to Redis unattempted because its host is full. The
    /// delay is a quarter of the attempt timeout (the longest a slot can stay
    /// taken), between 100 ms and 5 s, plus up to 50% jitter.
    async fn defer(&self, job: &Claimed, timeout: Duration) {
        let base = (timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
        let delay = base + base.mul_f64(rand::random::<f64>() * 0.5);
        metrics::counter!("hookq_deferred_total").increment(1);
        if let Err(err) = self.store.defer(job, delay).await {
            tracing::warn!(cause = %err, "cannot give the job back; its lease will return it");
        }
    }

    async fn record_success(&self, job: &Claimed, record: &AttemptRecord) {
        let json = record.to_json();
        let deadline = self.recording_deadline(job, self.config.delivery.max_timeout);
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.completions.complete(job, json.clone()).await {
                Ok(true) => return,
                Ok(false) => {
                    tracing::info!("delivered, but the lease was taken over or the job cancelled; outcome discarded");
                    return;
                }
                Err(err) if tokio::time::Instant::now() + backoff < deadline => {
                    metrics::counter!("hookq_redis_errors_total", "component" => "worker")
                        .increment(1);
                    tracing::warn!(cause = %err, "cannot record delivery yet; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(err) => {
                    tracing::error!(cause = %err, "cannot record delivery; the lease will return the job");
                    return;
                }
            }
        }
    }

    async fn record_failure(
        &self,
        job: &Claimed,
        topic: &str,
        record: &AttemptRecord,
        action: FailAction,
    ) {
        let json = record.to_json();
        let last_error = record.last_error();
        let failure = Failure {
            record: &json,
            last_error: &last_error,
            last_status: record.status,
            topic,
            action,
        };
        let deadline = self.recording_deadline(job, self.config.delivery.max_timeout);
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.store.fail(job, &failure).await {
                Ok(outcome) => {
                    tracing::debug!(?outcome, error = %last_error, "attempt failed");
                    return;
                }
                Err(err) if tokio::time::Instant::now() + backoff < deadline => {
                    metrics::counter!("hookq_redis_errors_total", "component" => "worker")
                        .increment(1);
                    tracing::warn!(cause = %err, "cannot record failure yet; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(err) => {
                    tracing::error!(cause = %err, "cannot record failure; the lease will return the job");
                    return;
                }
            }
        }
    }
}
