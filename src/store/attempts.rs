//! The delivery path's calls, partition by partition: promoting due jobs,
//! claiming ready ones under a lease, recording each attempt's outcome
//! (complete, fail: next rung or dead letter, defer), taking back expired
//! leases, and a host's shared request budget.

use std::sync::Arc;
use std::time::Duration;

use super::reply;
use super::scripts::{self, Code};
use super::{arg, summary, Delivery, Kept, Store, StoreError, StoreResult};
use crate::job::JobSpec;
use crate::retry::FailAction;

/// A job claimed for an attempt.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// Partition the job lives in.
    pub partition: u16,
    /// Job id.
    pub id: String,
    /// Attempt number, also the lease's fencing token.
    pub attempt: u32,
    /// When this attempt was due (epoch ms).
    pub due: i64,
    /// Spec JSON.
    pub spec_json: String,
    /// Redis time of the claim (epoch ms).
    pub claimed_at: i64,
    /// The lease, as the attempt's outcome names it.
    pub lease: Lease,
}

/// An attempt's lease as its outcome names it to Redis
/// (`complete_jobs.lua`): its fencing token, as the claim answered it (the
/// lease's deadline, which the in-flight set holds as the job's score
/// while this attempt has the lease, a later claim's lease ending later;
/// or the token of the round lease the job shares with the jobs claimed
/// with it: see "Round leases" in `lua/prelude.lua`), and the record's
/// counters the job's summary takes from its claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The fencing token (shared by the jobs of a round).
    pub token: Arc<str>,
    /// Whether this outcome was sent before (a retry after a call whose
    /// answer was lost): Redis then checks that its job is still live.
    pub again: bool,
    /// Attempts allowed.
    pub max_attempts: u16,
    /// When the job was created, epoch ms.
    pub created: i64,
}

/// One 2xx attempt to record: the job's id, its attempt number, its lease
/// and what its delivery keeps ([`Store::complete_many`]).
pub type Outcome<'a> = (&'a str, u32, &'a Lease, &'a Delivery);

/// Result of one claim call on a partition.
#[derive(Debug, Clone)]
pub struct ClaimBatch {
    /// The jobs now leased to this daemon.
    pub jobs: Vec<Claimed>,
    /// Whether the ready list may hold more.
    pub more: bool,
    /// Redis time (epoch ms).
    pub now: i64,
    /// What the promotion before the claim did, when one was asked for.
    pub promotion: Option<Promotion>,
}

/// Result of one promotion call on a partition.
#[derive(Debug, Clone)]
pub struct Promotion {
    /// Jobs moved to the ready list.
    pub moved: usize,
    /// Earliest due time left (epoch ms), if any.
    pub next_due: Option<i64>,
    /// Redis time (epoch ms).
    pub now: i64,
    /// A ready list was empty before: a tenant's jobs its partition's claim
    /// loop has not seen yet (always false for a promotion made by a
    /// claim, which claims right after).
    pub started: bool,
    /// Redis time plus the claim ahead: jobs due by it counted as due.
    pub horizon: i64,
    /// With shared timers (a single Redis), the partitions whose ready list
    /// the promotion started, its own included (each id goes to its own
    /// partition's list): their claim loops, here or in another daemon,
    /// must be woken.
    pub started_in: Vec<u16>,
}

impl Promotion {
    /// Whether jobs were left due by the horizon (or a wheel bucket still
    /// opening): the next promotion should follow at once.
    pub fn more_due(&self) -> bool {
        self.next_due.is_some_and(|due| due <= self.horizon)
    }
}

/// Result of one reclaim call on a partition.
#[derive(Debug, Clone)]
pub struct Reclaim {
    /// Jobs put back on the ready list.
    pub requeued: usize,
    /// Jobs dead-lettered because the lost attempt was their last.
    pub dead: usize,
    /// Earliest lease deadline left (epoch ms), if any.
    pub next_deadline: Option<i64>,
    /// Redis time (epoch ms).
    pub now: i64,
    /// Other partitions whose jobs of expired round leases now hold
    /// expired leases of their own, to take back there.
    pub materialized_in: Vec<u16>,
}

/// What `fail` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailOutcome {
    /// The next attempt is due at this epoch ms.
    Scheduled(i64),
    /// Dead-lettered under this stream entry id.
    DeadLettered(String),
    /// The lease was taken over or the job cancelled; nothing changed.
    Stale,
}

/// A failed attempt, as recorded on the job.
#[derive(Debug, Clone)]
pub struct Failure<'a> {
    /// Attempt record JSON for the history.
    pub record: &'a str,
    /// `kind: message` of the failure.
    pub last_error: &'a str,
    /// HTTP status, when a response came.
    pub last_status: Option<u16>,
    /// The job's topic.
    pub topic: &'a str,
    /// Next rung or dead letter.
    pub action: FailAction,
}

impl Store {
    /// Moves up to `batch` due jobs of partition `p` to its ready list.
    pub async fn promote(&self, p: u16, batch: usize) -> StoreResult<Promotion> {
        self.invoke_batched(
            &scripts::PROMOTE_DUE,
            &[&self.keys.due(p), &self.keys.ready(p), &self.keys.wheel(p)],
            vec![arg(&batch), arg(&self.settings.claim_ahead_ms)],
            None,
        )
        .await
    }

    /// Tells the daemons carrying partitions `started` that a promotion from
    /// shared timers started their ready lists (`r<q>` on each one's wake
    /// channel, as a script does). Best effort, logged: a claim loop looks
    /// at its list every [`crate::worker::IDLE_RECHECK`] anyway.
    pub(crate) async fn announce_started(&self, started: &[u16]) {
        if started.is_empty() {
            return;
        }
        let mut pipe = redis::pipe();
        for &q in started {
            pipe.publish(self.keys.partition_wake_channel(q), format!("r{q}"))
                .ignore();
        }
        let mut conn = self.conn.clone();
        if let Err(err) = pipe.query_async::<()>(&mut conn).await {
            tracing::warn!(cause = %err, partitions = ?started, "cannot announce started ready lists");
        }
    }

    /// Claims up to `max` ready jobs of partition `p`, each under a lease.
    pub async fn claim(&self, p: u16, max: usize) -> StoreResult<ClaimBatch> {
        self.claim_promoting(p, max, 0).await
    }

    /// Promotes up to `promote` due jobs of partition `p` (none when 0), then
    /// claims up to `max` ready jobs, in one call.
    pub async fn claim_promoting(
        &self,
        p: u16,
        max: usize,
        promote: usize,
    ) -> StoreResult<ClaimBatch> {
        let reply: reply::ClaimReply = self
            .invoke_batched(
                &scripts::CLAIM_READY,
                &[
                    &self.keys.ready(p),
                    &self.keys.inflight(p),
                    &self.keys.due(p),
                    &self.keys.wheel(p),
                    &self.keys.tenants(p),
                    &self.keys.turn(p),
                ],
                [
                    arg(&max),
                    arg(&self.keys.job_prefix(p)),
                    arg(&self.settings.default_lease_ms),
                    arg(&promote),
                    arg(&self.settings.claim_ahead_ms),
                ]
                .into_iter()
                .chain(self.tenant_weights.iter().map(arg))
                .collect::<Vec<_>>(),
                None,
            )
            .await?;
        let now = reply.now;
        // (The jobs of a round share its token.)
        let mut last: Option<Arc<str>> = None;
        let jobs = reply
            .jobs
            .into_iter()
            .map(|job| Claimed {
                partition: job.partition.unwrap_or(p),
                lease: Lease {
                    token: match &last {
                        Some(token) if **token == *job.token => token.clone(),
                        _ => {
                            let token: Arc<str> = job.token.into();
                            last = Some(token.clone());
                            token
                        }
                    },
                    again: false,
                    max_attempts: job.max_attempts,
                    created: job.created,
                },
                id: job.id,
                attempt: job.attempt,
                due: job.due,
                spec_json: job.spec_json,
                claimed_at: now,
            })
            .collect();
        Ok(ClaimBatch {
            jobs,
            more: reply.more,
            now,
            promotion: reply.promotion,
        })
    }

    /// Records a 2xx; false when the lease was stale (nothing changed).
    pub async fn complete(&self, job: &Claimed, delivery: &Delivery) -> StoreResult<bool> {
        let done = self
            .complete_many(
                job.partition,
                &[(&job.id, job.attempt, &job.lease, delivery)],
                None,
            )
            .await?;
        Ok(done.first().copied().unwrap_or(false))
    }

    /// Records 2xx attempts of partition `p` (id, attempt number, lease,
    /// delivery) in one script call; per job, false when its lease was
    /// stale (nothing changed for it). With `ride_until`, the call waits up
    /// to then for a batch that goes anyway (see [`Store::batches_calls`]).
    pub async fn complete_many(
        &self,
        p: u16,
        jobs: &[Outcome<'_>],
        ride_until: Option<tokio::time::Instant>,
    ) -> StoreResult<Vec<bool>> {
        self.complete_partitions(&[(p, jobs)], ride_until).await
    }

    /// Whether one `complete_jobs` call may record several partitions'
    /// attempts ([`Store::complete_partitions`]): on a single Redis, not
    /// in a cluster (a script stays on one slot).
    pub fn completes_partitions_together(&self) -> bool {
        self.keys.shared_timers()
    }

    /// [`Store::complete_many`] for the attempts of several partitions
    /// (each with its jobs) in one script call, when
    /// [`Store::completes_partitions_together`]; the answers in the order
    /// of the partitions and their jobs.
    pub async fn complete_partitions(
        &self,
        groups: &[(u16, &[Outcome<'_>])],
        ride_until: Option<tokio::time::Instant>,
    ) -> StoreResult<Vec<bool>> {
        let Some((first, _)) = groups.first() else {
            return Ok(Vec::new());
        };
        if groups.len() > 1 && !self.completes_partitions_together() {
            return Err(StoreError::reply(
                "complete_jobs",
                "several partitions in one call of a cluster",
            ));
        }
        let jobs: usize = groups.iter().map(|(_, jobs)| jobs.len()).sum();
        let mut args = Vec::with_capacity(6 * (groups.len() + jobs));
        args.push(arg(&self.keys.job_prefix(*first)));
        args.push(arg(&self.keys.history_prefix(*first)));
        args.push(arg(&self.settings.retention_ms));
        args.push(arg(&self.finish_mode()));
        args.push(arg(&*self.channel));
        args.push(arg(first));
        for (n, (p, outcomes)) in groups.iter().enumerate() {
            if n > 0 {
                // The unit that starts the next partition's jobs.
                args.push(Vec::new());
                args.push(arg(&self.keys.job_prefix(*p)));
                args.push(arg(&self.keys.history_prefix(*p)));
                args.push(arg(p));
                args.push(Vec::new());
                args.push(Vec::new());
            }
            for outcome in outcomes.iter() {
                self.push_outcome(&mut args, outcome)?;
            }
        }
        let keys = [&*self.keys.inflight(*first), &*self.keys.stats(*first)];
        let done: Vec<Code> = if self.acked.is_some() {
            self.invoke_acked(&scripts::COMPLETE_JOBS, &keys, &args)
                .await?
        } else {
            self.invoke_batched(&scripts::COMPLETE_JOBS, &keys, args, ride_until)
                .await?
        };
        if done.len() != jobs {
            return Err(StoreError::reply(
                "complete_jobs",
                format!("{} results for {jobs} jobs", done.len()),
            ));
        }
        Ok(done.into_iter().map(|code| code == Code::Done).collect())
    }

    /// The six `complete_jobs` arguments of one 2xx attempt.
    fn push_outcome(
        &self,
        args: &mut Vec<Vec<u8>>,
        (id, attempt, lease, delivery): &Outcome<'_>,
    ) -> StoreResult<()> {
        args.push(arg(id));
        args.push(if lease.again {
            [b"!", lease.token.as_bytes()].concat()
        } else {
            lease.token.as_bytes().to_vec()
        });
        args.push(if self.settings.keep_bodies {
            Vec::new()
        } else {
            summary::summary_counters(*attempt, lease.max_attempts, lease.created).to_vec()
        });
        args.push(match (&delivery.kept, self.settings.keep_bodies) {
            (Kept::Whole(record), true) => arg(record),
            (Kept::Summarized(tail), false) => tail.clone(),
            _ => {
                return Err(StoreError::reply(
                    "complete_jobs",
                    "a delivery prepared for the other retention mode",
                ))
            }
        });
        args.push(arg(&delivery.order.as_deref().unwrap_or_default()));
        // The summary's shard hash, which costs Lua ~4,900 instructions.
        args.push(if self.settings.keep_bodies {
            Vec::new()
        } else {
            summary::id_hash(id).to_be_bytes().to_vec()
        });
        Ok(())
    }

    /// Prepares a 2xx attempt of the job with `spec` for [`Store::complete`]:
    /// what this store's retention mode keeps, the attempt record JSON
    /// (`record`, built only then) or the summary tail.
    pub(crate) fn delivery(
        &self,
        spec: &JobSpec,
        record: impl FnOnce() -> String,
        last: &summary::LastAttempt<'_>,
    ) -> Delivery {
        Delivery::new(self.settings.keep_bodies, spec, record, last)
    }

    /// [`Store::delivery`] from a stored spec JSON and an attempt record
    /// JSON (for tools and tests that hold no parsed job).
    pub fn delivery_from_json(&self, spec_json: &str, record: &str) -> Delivery {
        Delivery::from_json(self.settings.keep_bodies, spec_json, record)
    }

    /// How the finishing scripts keep a finished job: `keep` (the whole
    /// record, `retention.keep_bodies`) or `summary`.
    pub(super) fn finish_mode(&self) -> &'static str {
        if self.settings.keep_bodies {
            "keep"
        } else {
            "summary"
        }
    }

    /// Records a failed attempt: next rung or dead letter.
    pub async fn fail(&self, job: &Claimed, failure: &Failure<'_>) -> StoreResult<FailOutcome> {
        let p = job.partition;
        let delay: i64 = match failure.action {
            FailAction::Retry(d) => d.as_millis() as i64,
            FailAction::DeadLetter => -1,
        };
        let status = failure
            .last_status
            .map(|s| s.to_string())
            .unwrap_or_default();
        self.invoke_acked(
            &scripts::FAIL_JOB,
            &[
                &self.keys.live_records(p, &job.id),
                &self.keys.inflight(p),
                &self.keys.history(p, &job.id),
                &self.keys.due(p),
                &self.keys.seq(p),
                &self.keys.dead(p),
                &self.keys.stats(p),
                &self.keys.dead_index(p),
            ],
            &[
                arg(&job.id),
                arg(&job.attempt),
                arg(&failure.record),
                arg(&delay),
                arg(&self.settings.retention_ms),
                arg(&failure.last_error),
                arg(&status),
                arg(&failure.topic),
                arg(&self.settings.dead_letters_max),
                arg(&*self.channel),
                arg(&p),
            ],
        )
        .await
    }

    /// Gives claimed jobs of partition `p` back unattempted, each due again
    /// after its delay; the number given back (stale leases are skipped).
    pub async fn defer_many(&self, p: u16, jobs: &[(&Claimed, Duration)]) -> StoreResult<usize> {
        if jobs.is_empty() {
            return Ok(0);
        }
        let mut args = vec![arg(&self.keys.job_prefix(p)), arg(&*self.channel), arg(&p)];
        for (job, delay) in jobs {
            args.push(arg(&job.id));
            args.push(arg(&job.attempt));
            args.push(arg(&(delay.as_millis() as u64)));
        }
        self.invoke(
            &scripts::DEFER_JOBS,
            &[&self.keys.inflight(p), &self.keys.due(p), &self.keys.seq(p)],
            &args,
        )
        .await
    }

    /// Takes up to `want` tokens of `host`'s shared request budget of the
    /// current window (`window_ms` long, `budget` requests in all): the
    /// tokens granted and the window's end (epoch ms, Redis clock).
    pub(crate) async fn take_rate(
        &self,
        host: &str,
        window_ms: u64,
        budget: u64,
        want: u64,
    ) -> StoreResult<(u64, i64)> {
        self.take_tokens(&self.keys.rate(host), window_ms, budget, want)
            .await
    }

    /// Takes up to `want` creates of tenant `tenant`'s shared budget
    /// (`budget` per window of `window_ms`): (granted, window end ms).
    pub(crate) async fn take_tenant_rate(
        &self,
        tenant: &str,
        window_ms: u64,
        budget: u64,
        want: u64,
    ) -> StoreResult<(u64, i64)> {
        self.take_tokens(&self.keys.tenant_rate(tenant), window_ms, budget, want)
            .await
    }

    /// `take_rate.lua` on the budget kept at `key`.
    async fn take_tokens(
        &self,
        key: &str,
        window_ms: u64,
        budget: u64,
        want: u64,
    ) -> StoreResult<(u64, i64)> {
        self.invoke(
            &scripts::TAKE_RATE,
            &[key],
            &[arg(&window_ms), arg(&budget), arg(&want)],
        )
        .await
    }

    /// Takes back up to `batch` expired leases of partition `p`.
    pub async fn reclaim(&self, p: u16, batch: usize) -> StoreResult<Reclaim> {
        self.invoke(
            &scripts::RECLAIM_EXPIRED,
            &[
                &self.keys.inflight(p),
                &self.keys.ready(p),
                &self.keys.dead(p),
                &self.keys.stats(p),
                &self.keys.dead_index(p),
            ],
            &[
                arg(&batch),
                arg(&self.keys.job_prefix(p)),
                arg(&self.keys.history_prefix(p)),
                arg(&self.settings.retention_ms),
                arg(&self.settings.dead_letters_max),
                arg(&*self.channel),
                arg(&p),
            ],
        )
        .await
    }
}
