//! Creating jobs: [`Store::enqueue`] and [`Store::enqueue_many`], which
//! place a job with an ordering key in its key's partition (`place_jobs`,
//! a pointer left in its id's partition) and create or compare each job
//! where it lives (`enqueue_jobs`), one script call per partition touched.

use std::sync::Arc;

use super::reply::{self, EnqueuedJob};
use super::{arg, scripts, Store, StoreError, StoreResult};
use crate::job::{Due, JobSpec, NewJob, State};

/// What `enqueue` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnqueueOutcome {
    /// A new job was stored in `state`, due at `due` (epoch ms).
    Created {
        /// `scheduled` or `ready`.
        state: State,
        /// Due time, epoch ms.
        due: i64,
        /// Redis time of the creation, epoch ms.
        now: i64,
        /// Held behind earlier jobs of its ordering key: the id just ahead.
        waiting_for: Option<String>,
    },
    /// A job with this id and identical content exists; nothing changed.
    Identical,
    /// A job with this id exists with different content; nothing changed.
    Conflict,
    /// The id is `<schedule id>:<13 digits>` of an existing schedule: its
    /// fire ids are the schedule's own (SPEC §14); nothing changed.
    Reserved,
}

/// Where a create stands after one round (see [`Store::enqueue_many`]).
enum EnqueueStep {
    /// To be placed in its id's partition, replacing a stale pointer to
    /// the partition given.
    Place(Option<u16>),
    /// To be created in the partition (or, when true, only compared with
    /// the job there).
    Create(u16, bool),
    /// Finished.
    Done(StoreResult<EnqueueOutcome>),
}

/// Marks the jobs `items` of a failed call as failed with `err` (each as
/// [`StoreError::Shared`]), keeping the batch's first error.
fn fail_group<T>(
    steps: &mut [EnqueueStep],
    items: &[(usize, T)],
    err: StoreError,
    first_error: &mut Option<StoreError>,
) {
    let err = Arc::new(err);
    first_error.get_or_insert_with(|| StoreError::Shared(err.clone()));
    for &(i, _) in items {
        steps[i] = EnqueueStep::Done(Err(StoreError::Shared(err.clone())));
    }
}

/// What one `enqueue_jobs` call found for a job.
enum Placed {
    /// The outcome, here.
    Here(EnqueueOutcome),
    /// The id points to this other partition.
    Elsewhere(u16),
    /// Compare only: no such job here.
    Absent,
}

impl Store {
    /// Creates a job (idempotently by id).
    pub async fn enqueue(&self, job: &NewJob) -> StoreResult<EnqueueOutcome> {
        self.enqueue_many(std::slice::from_ref(job))
            .await?
            .pop()
            .unwrap_or_else(|| Err(StoreError::reply("enqueue_jobs", "no outcome for the job")))
    }

    /// Creates many jobs: one script call per partition touched (the calls
    /// go out together), each job atomic on its own; outcomes come back in
    /// the order of `jobs`. A failed call fails the jobs it carried (each gets
    /// the error as [`StoreError::Shared`]) and no others; if every call
    /// failed, the whole batch answers the error.
    ///
    /// A job lives in its id's partition, or, with an ordering key, in its
    /// ordering list's: such a job is first placed (`place_jobs` leaves a
    /// pointer in its id's partition). A create that meets a pointer, or a
    /// stale one, takes another round, so the common case is one call.
    pub async fn enqueue_many(
        &self,
        jobs: &[NewJob],
    ) -> StoreResult<Vec<StoreResult<EnqueueOutcome>>> {
        // Where the schedule lives whose firing gives a job's id, for the
        // rare ids of that shape (a read each, two with an ordering key;
        // none for other ids).
        // An existing schedule's fire id is the schedule's: the script
        // refuses it, atomically, in the schedule's partition, where every
        // create of such an id without an ordering key is made or compared
        // first. One with an ordering key is placed with its key instead:
        // it is refused here (a schedule created between this read and the
        // create does not see it, as for a job made before its schedule).
        let mut fired = vec![None; jobs.len()];
        let mut reserved = vec![false; jobs.len()];
        for ((home, taken), job) in fired.iter_mut().zip(&mut reserved).zip(jobs) {
            *home = self.fired_home(&job.id).await?;
            if let (Some(p), Some(_), Some((schedule, _))) =
                (*home, &job.order, crate::schedule::fired_by(&job.id))
            {
                *taken = self.schedule_exists(p, schedule).await?;
            }
        }
        let mut steps: Vec<EnqueueStep> = jobs
            .iter()
            .zip(&fired)
            .zip(&reserved)
            .map(|((job, &fired), &taken)| match taken {
                true => EnqueueStep::Done(Ok(EnqueueOutcome::Reserved)),
                false => self.first_step(job, fired),
            })
            .collect();
        let mut first_error: Option<StoreError> = None;
        for _ in 0..4 {
            self.place_round(jobs, &mut steps, &mut first_error).await;
            if !self
                .create_round(jobs, &fired, &mut steps, &mut first_error)
                .await
            {
                break;
            }
        }
        let outcomes: Vec<StoreResult<EnqueueOutcome>> = steps
            .into_iter()
            .map(|step| match step {
                EnqueueStep::Done(result) => result,
                _ => Err(StoreError::reply(
                    "enqueue_jobs",
                    "the job's placement kept changing while it was being created",
                )),
            })
            .collect();
        if first_error.is_some() && outcomes.iter().all(Result::is_err) {
            // Every call failed: the whole batch answers the first error.
            if let Some(err) = first_error {
                return Err(err);
            }
        }
        Ok(outcomes)
    }

    /// Where creating `job` starts: placing it (it lives outside its id's
    /// partition), comparing it where a schedule's firing puts jobs of its
    /// id (`fired`: that schedule's partition), or creating it in its id's
    /// partition.
    fn first_step(&self, job: &NewJob, fired: Option<u16>) -> EnqueueStep {
        let own = self.keys.partition_of(&job.id);
        if self.home_of_new(job) != own {
            EnqueueStep::Place(None)
        } else if let Some(p) = fired.filter(|&p| p != own) {
            // Its id is one a schedule's firing gives: a job of that id may
            // live there.
            EnqueueStep::Create(p, true)
        } else {
            EnqueueStep::Create(own, false)
        }
    }

    /// One `place_jobs` call per id partition for the jobs still to be
    /// placed; each then is to be created (or compared) where it lives.
    async fn place_round(
        &self,
        jobs: &[NewJob],
        steps: &mut [EnqueueStep],
        first_error: &mut Option<StoreError>,
    ) {
        let places = self.group(steps, |i, step| match step {
            EnqueueStep::Place(replace) => Some((self.keys.partition_of(&jobs[i].id), *replace)),
            _ => None,
        });
        let calls = places.iter().map(|(p, items)| {
            let items: Vec<(&NewJob, u16, Option<u16>)> = items
                .iter()
                .map(|&(i, replace)| (&jobs[i], self.home_of_new(&jobs[i]), replace))
                .collect();
            async move { self.place_partition(*p, &items).await }
        });
        let results = futures_util::future::join_all(calls).await;
        for ((_, items), result) in places.iter().zip(results) {
            match result {
                Ok(homes) => {
                    for (&(i, _), home) in items.iter().zip(homes) {
                        let create = home == self.home_of_new(&jobs[i]);
                        steps[i] = EnqueueStep::Create(home, !create);
                    }
                }
                Err(err) => fail_group(steps, items, err, first_error),
            }
        }
    }

    /// One `enqueue_jobs` call per partition for the jobs to be created or
    /// compared there; false when there were none. A job found elsewhere, or
    /// behind a stale pointer, gets its next step.
    async fn create_round(
        &self,
        jobs: &[NewJob],
        fired: &[Option<u16>],
        steps: &mut [EnqueueStep],
        first_error: &mut Option<StoreError>,
    ) -> bool {
        let creates = self.group(steps, |_, step| match step {
            EnqueueStep::Create(p, compare_only) => Some((*p, *compare_only)),
            _ => None,
        });
        if creates.is_empty() {
            return false;
        }
        let calls = creates.iter().map(|(p, items)| {
            let group: Vec<(&NewJob, bool)> = items.iter().map(|&(i, c)| (&jobs[i], c)).collect();
            async move { self.enqueue_partition(*p, &group).await }
        });
        let results = futures_util::future::join_all(calls).await;
        for ((p, items), result) in creates.iter().zip(results) {
            match result {
                Ok(group) => {
                    for (&(i, _), outcome) in items.iter().zip(group) {
                        steps[i] = match outcome {
                            Placed::Here(outcome) => EnqueueStep::Done(Ok(outcome)),
                            Placed::Elsewhere(q) => EnqueueStep::Create(q, true),
                            Placed::Absent if jobs[i].order.is_none() && fired[i] == Some(*p) => {
                                EnqueueStep::Create(self.keys.partition_of(&jobs[i].id), false)
                            }
                            // The pointer that led here is stale.
                            Placed::Absent => EnqueueStep::Place(Some(*p)),
                        };
                    }
                }
                Err(err) => fail_group(steps, items, err, first_error),
            }
        }
        true
    }

    /// Whether schedule `schedule`, living (if it exists) in partition
    /// `home` ([`Store::fired_home`]), exists.
    async fn schedule_exists(&self, home: u16, schedule: &str) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("HEXISTS")
            .arg(self.keys.schedule(home, schedule))
            .arg("spec")
            .query_async(&mut conn)
            .await?)
    }

    /// The partition a new job is to live in: its ordering list's, or its id's.
    fn home_of_new(&self, job: &NewJob) -> u16 {
        match &job.order {
            Some(order) => self.keys.order_partition(order),
            None => self.keys.partition_of(&job.id),
        }
    }

    /// The indexes of `steps` that `pick` selects, grouped by the partition
    /// it names, each with the detail it gives.
    fn group<T: Copy>(
        &self,
        steps: &[EnqueueStep],
        pick: impl Fn(usize, &EnqueueStep) -> Option<(u16, T)>,
    ) -> std::collections::BTreeMap<u16, Vec<(usize, T)>> {
        let mut groups: std::collections::BTreeMap<u16, Vec<(usize, T)>> = Default::default();
        for (i, step) in steps.iter().enumerate() {
            if let Some((p, detail)) = pick(i, step) {
                groups.entry(p).or_default().push((i, detail));
            }
        }
        groups
    }

    /// One `place_jobs` call in partition `p` (the jobs' id partition):
    /// for each (job, partition it should live in, stale pointer to
    /// replace), the partition where it lives or is to be created.
    async fn place_partition(
        &self,
        p: u16,
        jobs: &[(&NewJob, u16, Option<u16>)],
    ) -> StoreResult<Vec<u16>> {
        let mut args = vec![
            arg(&self.keys.job_prefix(p)),
            arg(&p),
            arg(&self.pointer_check_ms()),
        ];
        for (job, target, replace) in jobs {
            args.push(arg(&job.id));
            args.push(arg(target));
            args.push(arg(&replace.map(|r| r.to_string()).unwrap_or_default()));
        }
        let homes: Vec<u16> = self
            .invoke_acked(&scripts::PLACE_JOBS, &[&self.keys.placed(p)], &args)
            .await?;
        if homes.len() != jobs.len() || homes.iter().any(|&h| h >= self.keys.partitions()) {
            return Err(StoreError::reply(
                "place_jobs",
                format!("partitions {homes:?} for {} jobs", jobs.len()),
            ));
        }
        Ok(homes)
    }

    /// How long a placement pointer waits before the daemon checks that its
    /// job still exists: a quarter of the retention, between a second and
    /// six hours.
    pub(super) fn pointer_check_ms(&self) -> u64 {
        (self.settings.retention_ms / 4).clamp(1_000, 6 * 3_600_000)
    }

    /// One `enqueue_jobs` call for jobs that all live in partition `p` (or,
    /// compare only, may: see `enqueue_jobs.lua`).
    async fn enqueue_partition(
        &self,
        p: u16,
        jobs: &[(&NewJob, bool)],
    ) -> StoreResult<Vec<Placed>> {
        let args = self.enqueue_args(p, jobs);
        let reply: reply::EnqueueReply = self
            .invoke_acked(
                &scripts::ENQUEUE_JOBS,
                &[&self.keys.due(p), &self.keys.ready(p), &self.keys.seq(p)],
                &args,
            )
            .await?;
        let bad = |d: String| StoreError::reply("enqueue_jobs", d);
        if reply.jobs.len() != jobs.len() {
            return Err(bad(format!(
                "{} outcomes for {} jobs",
                reply.jobs.len(),
                jobs.len()
            )));
        }
        let now = reply.now;
        let mut outcomes = reply
            .jobs
            .into_iter()
            .zip(jobs)
            .map(|(answer, (job, _))| {
                Ok(Placed::Here(match answer {
                    EnqueuedJob::Created { state, due, ahead } => EnqueueOutcome::Created {
                        state,
                        due,
                        now,
                        waiting_for: (!ahead.is_empty()).then_some(ahead),
                    },
                    EnqueuedJob::Identical => EnqueueOutcome::Identical,
                    EnqueuedJob::Conflict => EnqueueOutcome::Conflict,
                    EnqueuedJob::Reserved => EnqueueOutcome::Reserved,
                    EnqueuedJob::Summarized(stored) => {
                        // A finished job's summary: compare content digests.
                        let spec: Option<JobSpec> = serde_json::from_str(&job.spec_json).ok();
                        let same = spec.is_some_and(|s| s.content_digest()[..] == stored[..]);
                        if same {
                            EnqueueOutcome::Identical
                        } else {
                            EnqueueOutcome::Conflict
                        }
                    }
                    EnqueuedJob::Elsewhere(q) => {
                        if q >= self.keys.partitions() || q == p {
                            return Err(bad(format!("a pointer to partition {q}")));
                        }
                        return Ok(Placed::Elsewhere(q));
                    }
                    EnqueuedJob::Absent => return Ok(Placed::Absent),
                }))
            })
            .collect::<StoreResult<Vec<Placed>>>()?;
        for (outcome, (job, _)) in outcomes.iter_mut().zip(jobs) {
            if matches!(outcome, Placed::Here(EnqueueOutcome::Conflict))
                && self.same_as_stored(job).await?
            {
                *outcome = Placed::Here(EnqueueOutcome::Identical);
            }
        }
        Ok(outcomes)
    }

    /// The arguments of one `enqueue_jobs` call in partition `p`: the
    /// partition's, then ten per job (see the script's header).
    fn enqueue_args(&self, p: u16, jobs: &[(&NewJob, bool)]) -> Vec<Vec<u8>> {
        let mut args = Vec::with_capacity(3 + 10 * jobs.len());
        args.push(arg(&self.keys.job_prefix(p)));
        args.push(arg(&*self.channel));
        args.push(arg(&p));
        for (job, compare_only) in jobs {
            let (at, delay) = match job.due {
                Due::At(ms) => (ms.to_string(), 0u64),
                Due::After(ms) => (String::new(), ms),
            };
            args.push(arg(&job.id));
            args.push(arg(&job.spec_json));
            args.push(arg(&at));
            args.push(arg(&delay));
            args.push(arg(&job.max_attempts));
            args.push(arg(&job
                .lease_ms
                .map(|l| l.to_string())
                .unwrap_or_default()));
            args.push(arg(&job.given));
            args.push(arg(&job.order.as_deref().unwrap_or_default()));
            args.push(arg(&if *compare_only { "c" } else { "" }));
            // The hash its schedule would have here, for a fire id.
            let schedule = crate::schedule::fired_by(&job.id)
                .map(|(schedule, _)| self.keys.schedule(p, schedule));
            args.push(arg(&schedule.unwrap_or_default()));
        }
        args
    }

    /// Whether `job` means the same as the stored job of its id, though its
    /// JSON is spelled differently (the script compares bytes; a client that
    /// re-serializes its body on a retry must still get 200). Read only on
    /// the conflict path, so a normal create pays nothing for it.
    async fn same_as_stored(&self, job: &NewJob) -> StoreResult<bool> {
        let Ok(mut spec) = serde_json::from_str::<JobSpec>(&job.spec_json) else {
            return Ok(false);
        };
        spec.restore_given(job.given);
        Ok(self
            .get(&job.id)
            .await?
            .is_some_and(|stored| !stored.summarized && stored.spec.same_content(&spec)))
    }
}
