//! Recording an attempt's outcome: a success through the batched
//! [`Completions`](crate::completions::Completions), a failure with one
//! `fail_job` call (the next rung, or a dead letter and its alert); each
//! retried while Redis fails, until the job's lease would have expired
//! anyway (lease recovery then takes over).

use std::time::Duration;

use crate::backoff::Backoff;
use crate::delivery::AttemptRecord;
use crate::job::JobSpec;
use crate::retry::FailAction;
use crate::store::summary::LastAttempt;
use crate::store::{Claimed, Failure};

use super::WorkerPool;

impl WorkerPool {
    /// Retries recording an outcome while Redis is failing, until the lease
    /// would have expired anyway (then lease recovery takes over).
    fn recording_deadline(&self, job: &Claimed, spec_timeout: Duration) -> tokio::time::Instant {
        let lease = self.config.lease_for(spec_timeout);
        tokio::time::Instant::from_std(
            self.clock
                .instant_at(job.claimed_at + lease.as_millis() as i64),
        )
    }

    pub(super) async fn record_success(
        &self,
        job: &Claimed,
        spec: &JobSpec,
        record: &AttemptRecord,
    ) {
        let error = record.last_error();
        let delivery = self.store.delivery(
            spec,
            || record.to_json(),
            &LastAttempt {
                at: record.at,
                duration_ms: record.duration_ms,
                status: record.status,
                error: &error,
            },
        );
        // (A retry may follow a call that was applied but whose answer was
        // lost: it says so, see `Lease::again`.)
        let sent = std::sync::atomic::AtomicBool::new(false);
        let recorded = self
            .until_recorded(job, "delivery", || {
                self.completions.complete(
                    job,
                    delivery.clone(),
                    sent.swap(true, std::sync::atomic::Ordering::Relaxed),
                )
            })
            .await;
        if recorded == Some(false) {
            tracing::info!(
                "delivered, but the lease was taken over or the job cancelled; outcome discarded"
            );
        }
    }

    pub(super) async fn record_failure(
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
        let failed = self
            .until_recorded(job, "failure", || self.store.fail(job, &failure))
            .await;
        if let Some(outcome) = failed {
            tracing::debug!(?outcome, error = %last_error, "attempt failed");
            if let crate::store::FailOutcome::DeadLettered(entry) = &outcome {
                self.breaker.alerts().emit(
                    "job.dead_lettered",
                    serde_json::json!({
                        "id": job.id,
                        "topic": topic,
                        "attempts": job.attempt,
                        "last_error": last_error,
                        "last_status": record.status,
                        "dead_letter_entry": entry,
                    }),
                );
            }
        }
    }

    /// Runs `record` (an outcome's write) until it succeeds, retrying while
    /// Redis fails and the job's lease would still hold; None when it gave
    /// up (the lease will return the job). `what` names it in the logs.
    async fn until_recorded<T, Fut>(
        &self,
        job: &Claimed,
        what: &str,
        mut record: impl FnMut() -> Fut,
    ) -> Option<T>
    where
        Fut: std::future::Future<Output = crate::store::StoreResult<T>>,
    {
        let deadline = self.recording_deadline(job, self.config.delivery.max_timeout);
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        loop {
            match record().await {
                Ok(value) => return Some(value),
                Err(err) if tokio::time::Instant::now() + backoff.current() < deadline => {
                    metrics::counter!("hookq_redis_errors_total", "component" => "worker")
                        .increment(1);
                    tracing::warn!(cause = %err, "cannot record {what} yet; retrying");
                    tokio::time::sleep(backoff.step()).await;
                }
                Err(err) => {
                    tracing::error!(cause = %err, "cannot record {what}; the lease will return the job");
                    return None;
                }
            }
        }
    }
}
