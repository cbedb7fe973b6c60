//! A job's changes after its creation, as the API and the CLI ask for
//! them: cancelling it, rescheduling it (`PATCH /v1/jobs/{id}`) and
//! replaying its dead letter. Each is one script call on the partition
//! the job lives in.

use super::listing;
use super::scripts::{self, Code};
use super::{arg, Store, StoreError, StoreResult};
use crate::job::{Due, JobSpec, State};

/// What `cancel` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Cancelled now, before any worker had it: no attempt of it will ever
    /// be sent.
    Cancelled,
    /// Cancelled now, but it was already claimed (held in a daemon for its
    /// host, or in flight): the attempt under way may still be sent, its
    /// outcome is discarded and no attempt follows it.
    CancelledInFlight,
    /// Already cancelled earlier, before any worker had it.
    AlreadyCancelled,
    /// Already cancelled earlier, while a worker had it: the attempt that
    /// was under way then may still arrive (none after it).
    AlreadyCancelledInFlight,
    /// No such job.
    NotFound,
    /// Already delivered or dead.
    Finished,
}

/// A change to a scheduled job (`PATCH /v1/jobs/{id}`).
#[derive(Debug, Clone)]
pub struct Reschedule<'a> {
    /// Job id.
    pub id: &'a str,
    /// The spec the change was computed from.
    pub old_spec_json: &'a str,
    /// The new spec.
    pub new_spec_json: &'a str,
    /// A new due time, or None to keep the current one.
    pub due: Option<Due>,
    /// Attempts allowed by the new spec.
    pub max_attempts: u32,
    /// The new spec's own lease, if it has its own timeout.
    pub lease_ms: Option<u64>,
    /// The new spec's due time as given ([`JobSpec::given_due`]).
    pub given: u64,
}

/// What `reschedule` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RescheduleOutcome {
    /// Changed; the job is now `state`, due at `due`.
    Changed {
        /// `scheduled`, or `ready` when the new due time has passed.
        state: State,
        /// Due time, epoch ms.
        due: i64,
        /// Redis time, epoch ms.
        now: i64,
    },
    /// No such job.
    NotFound,
    /// The job is no longer scheduled; nothing changed.
    NotScheduled(State),
    /// The job changed since it was read; nothing changed.
    Modified,
}

/// What `replay` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// The job is live again and its dead letter is gone.
    Revived,
    /// The job was live already; its stale dead letter was deleted.
    AlreadyLive,
    /// No such dead-letter entry.
    Gone,
}

impl Store {
    /// Cancels a job that has not finished.
    pub async fn cancel(&self, id: &str) -> StoreResult<CancelOutcome> {
        let p = self.home_of(id).await?;
        // A summary keeps the content's digest, computed here from the spec
        // as read; the script checks the spec is still that one. A record
        // kept whole needs neither.
        let ids = [id.to_string()];
        for _ in 0..5 {
            let read = if self.settings.keep_bodies {
                None
            } else {
                self.records(p, &ids).await?.pop().flatten()
            };
            let (digest, spec_sha1) = match read {
                Some(record) => {
                    use sha1::Digest;
                    let sha1 = sha1::Sha1::digest(record.spec_json.as_bytes());
                    let hex: String = sha1.iter().map(|b| format!("{b:02x}")).collect();
                    (record.spec.content_digest().to_vec(), hex)
                }
                None => (Vec::new(), String::new()),
            };
            let code: Code = self
                .invoke_acked(
                    &scripts::CANCEL_JOB,
                    &[
                        &self.keys.live_records(p, id),
                        &self.keys.due(p),
                        &self.keys.inflight(p),
                        &self.keys.history(p, id),
                    ],
                    &[
                        arg(&id),
                        arg(&self.settings.retention_ms),
                        arg(&*self.channel),
                        arg(&self.finish_mode()),
                        digest,
                        arg(&spec_sha1),
                        arg(&p),
                    ],
                )
                .await?;
            return match code {
                Code::Done => Ok(CancelOutcome::Cancelled),
                Code::InFlight => Ok(CancelOutcome::CancelledInFlight),
                Code::Unchanged => self.already_cancelled(id).await,
                Code::NotFound => Ok(CancelOutcome::NotFound),
                Code::WrongState => Ok(CancelOutcome::Finished),
                Code::Changed => continue,
                other => Err(StoreError::reply("cancel_job", format!("code {other:?}"))),
            };
        }
        Err(StoreError::reply(
            "cancel_job",
            "the job kept changing while it was being cancelled",
        ))
    }

    /// The answer to a repeated cancel of job `id`: whether the first one
    /// found an attempt under way, so that only a job no worker ever had
    /// answers as cancelled outright. It did when the job counts more
    /// attempts than its newest recorded one (a claim counts its attempt
    /// at once, its outcome records it; a claim given back unattempted
    /// counts it back down), which the summary keeps as well.
    async fn already_cancelled(&self, id: &str) -> StoreResult<CancelOutcome> {
        let Some(record) = self.get(id).await? else {
            return Ok(CancelOutcome::AlreadyCancelled);
        };
        let newest = record
            .history
            .first()
            .and_then(|h| serde_json::from_str::<serde_json::Value>(h).ok())
            .and_then(|h| h["attempt"].as_u64())
            .unwrap_or(0);
        Ok(if u64::from(record.attempts) > newest {
            CancelOutcome::AlreadyCancelledInFlight
        } else {
            CancelOutcome::AlreadyCancelled
        })
    }

    /// Replaces a scheduled job's content and/or due time, provided it is
    /// still `scheduled` and its stored spec is still `old_spec_json`.
    pub async fn reschedule(&self, change: &Reschedule<'_>) -> StoreResult<RescheduleOutcome> {
        let id = change.id;
        let p = self.home_of(id).await?;
        let (at, delay) = match change.due {
            Some(Due::At(ms)) => (ms.to_string(), 0u64),
            Some(Due::After(ms)) => (String::new(), ms),
            None => ("keep".to_string(), 0),
        };
        let lease = change.lease_ms.map(|l| l.to_string()).unwrap_or_default();
        self.invoke_acked(
            &scripts::RESCHEDULE_JOB,
            &[
                &self.keys.live_records(p, id),
                &self.keys.due(p),
                &self.keys.ready(p),
                &self.keys.seq(p),
            ],
            &[
                arg(&id),
                arg(&change.new_spec_json),
                arg(&at),
                arg(&delay),
                arg(&change.max_attempts),
                arg(&lease),
                arg(&*self.channel),
                arg(&p),
                arg(&change.old_spec_json),
                arg(&change.given),
            ],
        )
        .await
    }

    /// Revives dead letter `dead` with `spec_json` (its job, maybe with a
    /// new url): in the partition of its stream, at the tail of its
    /// ordering list if it has an ordering key.
    pub async fn replay(
        &self,
        dead: &listing::DeadLetter,
        spec_json: &str,
        max_attempts: u32,
    ) -> StoreResult<ReplayOutcome> {
        let (p, id) = (dead.partition, dead.id.as_str());
        let order = serde_json::from_str::<JobSpec>(spec_json)
            .ok()
            .and_then(|spec| spec.ordering_list());
        self.invoke_acked(
            &scripts::REPLAY_DEAD,
            &[
                &self.keys.job(p, id),
                &self.keys.ready(p),
                &self.keys.dead(p),
                &self.keys.history(p, id),
                &self.keys.dead_index(p),
            ],
            &[
                arg(&id),
                arg(&dead.entry_id),
                arg(&spec_json),
                arg(&max_attempts),
                arg(&*self.channel),
                arg(&p),
                arg(&order.unwrap_or_default()),
            ],
        )
        .await
    }
}
