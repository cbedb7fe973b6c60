//! Schedules in Redis (SPEC §12): each schedule is a hash in the partition
//! of its id (`lua/put_schedule.lua` lays it out), indexed for listing and,
//! while active, by its next fire time. This module owns their reads, their
//! changes, and the firing round a daemon runs for a partition it carries:
//! read the due schedules, compute their fire times (src/schedule.rs), and
//! let `lua/fire_schedules.lua` create the jobs and advance each schedule
//! in one step.

use std::time::Duration;

use super::listing::ReadBudget;
use super::{arg, scripts, Code, Store, StoreError, StoreResult};
use crate::config::Config;
use crate::job::JobSpec;
use crate::schedule::{self, ScheduleSpec};

mod view;
pub(crate) use view::ScheduleView;

/// Due schedules fired per script call.
const FIRE_BATCH: usize = 200;

/// A schedule as read from Redis.
#[derive(Debug, Clone)]
pub(crate) struct ScheduleRecord {
    /// Its id.
    pub id: String,
    /// Its content.
    pub spec: ScheduleSpec,
    /// Paused.
    pub paused: bool,
    /// Next fire time (ms); None once it has ended.
    pub next: Option<i64>,
    /// The creation time (ms), the anchor of `every`.
    pub anchor: i64,
    /// Bumped by every change.
    pub version: u64,
    /// Created (ms).
    pub created: i64,
    /// Last changed (ms).
    pub updated: i64,
    /// The last runs, newest first (at most 10).
    pub last_runs: Vec<LastRun>,
}

/// One recorded fire time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LastRun {
    /// The fire time (ms).
    pub at: i64,
    /// A job was created (else the time was skipped).
    pub fired: bool,
}

/// A schedule to write.
#[derive(Debug, Clone)]
pub struct ScheduleWrite<'a> {
    /// Its id.
    pub id: &'a str,
    /// Its content.
    pub spec: &'a ScheduleSpec,
    /// The spec JSON of the jobs it fires.
    pub template_json: String,
    /// Attempts allowed to a fired job.
    pub max_attempts: u32,
    /// A fired job's own lease, when its timeout differs from the default.
    pub lease_ms: Option<u64>,
    /// Paused.
    pub paused: bool,
    /// Its next fire time (None: it has ended).
    pub next: Option<i64>,
    /// Creation time (create only).
    pub anchor: i64,
    /// A change: the version it was computed from; None: a create.
    pub expected_version: Option<u64>,
    /// Its jobs' ordering list ([`JobSpec::ordering_list`]), if any: the
    /// schedule then lives in that list's partition.
    pub order: Option<String>,
}

impl<'a> ScheduleWrite<'a> {
    /// What to write for schedule `id` with `spec` (its fired jobs' spec,
    /// attempts and lease from `config`).
    pub fn new(
        config: &Config,
        id: &'a str,
        spec: &'a ScheduleSpec,
        paused: bool,
        next: Option<i64>,
        anchor: i64,
        expected_version: Option<u64>,
    ) -> ScheduleWrite<'a> {
        let template = JobSpec {
            schedule_id: Some(id.to_string()),
            ..spec.job.clone()
        };
        ScheduleWrite {
            id,
            spec,
            template_json: template.stored_json(),
            max_attempts: spec.job.max_attempts(config),
            lease_ms: spec
                .job
                .timeout_ms
                .map(|t| config.lease_for(Duration::from_millis(t)).as_millis() as u64),
            paused,
            next,
            anchor,
            expected_version,
            order: spec.job.ordering_list(),
        }
    }
}

/// What a schedule write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// Written; its version now.
    Written(u64),
    /// (create) an identical schedule exists.
    Identical,
    /// (create) the id exists with other content; (change) the schedule
    /// changed since it was read.
    Conflict,
    /// (change) no such schedule.
    NotFound,
}

/// What one `put_schedule` call found.
enum Put {
    /// The outcome, in that partition.
    Done(PutOutcome),
    /// (create) a stub names this other partition.
    Elsewhere(u16),
    /// (create, compare only) no such schedule there.
    Absent,
}

/// What pausing or resuming a schedule did.
#[derive(Debug)]
pub(crate) enum Paused {
    /// Done (or already so): the schedule as it is now.
    Now(Box<ScheduleRecord>),
    /// No such schedule.
    NotFound,
    /// It changed under each of five tries; nothing was written.
    KeptChanging,
}

/// What one firing round of a partition did.
#[derive(Debug, Clone, Default)]
pub(crate) struct FireRound {
    /// Per job created, its lateness (ms: created − fire time).
    pub fired: Vec<i64>,
    /// Fire times passed over (overlap, or missed and not caught up).
    pub skipped: usize,
    /// The partition's earliest next fire time, if any.
    pub next: Option<i64>,
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

impl ScheduleRecord {
    /// Decodes a schedule hash (HGETALL); None when there is none.
    fn decode(id: &str, fields: &[(String, String)]) -> StoreResult<Option<ScheduleRecord>> {
        let (Some(rule_json), Some(template), Some(meta)) = (
            field(fields, "spec"),
            field(fields, "tmpl"),
            field(fields, "meta"),
        ) else {
            return Ok(None);
        };
        let bad = |d: String| StoreError::reply("schedule", format!("{id}: {d}"));
        let spec = spec_of(rule_json, template).map_err(|e| bad(format!("spec: {e}")))?;
        // `<ver> <max> <lease> <overlap> <paused> <anchor> <ct> <ut> <order>`
        let meta: Vec<&str> = meta.splitn(9, ' ').collect();
        let int = |i: usize| meta.get(i).and_then(|v| v.parse::<i64>().ok());
        let last_runs = field(fields, "last")
            .unwrap_or_default()
            .split(',')
            .filter_map(|run| {
                let (at, outcome) = run.split_at(run.len().checked_sub(1)?);
                Some(LastRun {
                    at: at.parse().ok()?,
                    fired: outcome == "f",
                })
            })
            .collect();
        Ok(Some(ScheduleRecord {
            id: id.to_string(),
            spec,
            paused: meta.get(4) == Some(&"1"),
            next: field(fields, "next").and_then(|v| v.parse().ok()),
            anchor: int(5).unwrap_or_default(),
            version: int(0).unwrap_or_default() as u64,
            created: int(6).unwrap_or_default(),
            updated: int(7).unwrap_or_default(),
            last_runs,
        }))
    }
}

/// A schedule's rule as its hash stores it: its spec's JSON without the
/// job, which the template (`tmpl`) holds once.
fn rule_json(spec: &ScheduleSpec) -> StoreResult<String> {
    let mut value =
        serde_json::to_value(spec).map_err(|e| StoreError::reply("put_schedule", e.to_string()))?;
    if let Some(object) = value.as_object_mut() {
        object.remove("job");
    }
    Ok(value.to_string())
}

/// The spec of a schedule from its stored rule and template.
fn spec_of(rule_json: &str, template: &str) -> Result<ScheduleSpec, serde_json::Error> {
    let mut rule: serde_json::Value = serde_json::from_str(rule_json)?;
    let mut job: JobSpec = serde_json::from_str(template)?;
    job.schedule_id = None;
    if let Some(object) = rule.as_object_mut() {
        object.insert("job".into(), serde_json::to_value(job)?);
    }
    serde_json::from_value(rule)
}

impl Store {
    /// Pauses or resumes schedule `id` (resumed, it fires from its next
    /// fire time after now: times while paused are skipped, never caught
    /// up); None if there is no such schedule.
    pub(crate) async fn set_schedule_paused(
        &self,
        config: &Config,
        id: &str,
        paused: bool,
    ) -> StoreResult<Paused> {
        for _ in 0..5 {
            let Some(record) = self.get_schedule(id).await? else {
                return Ok(Paused::NotFound);
            };
            let next = if paused {
                record.next
            } else {
                let now = self.redis_time_ms().await?;
                let rule = record
                    .spec
                    .timing
                    .rule(record.anchor)
                    .map_err(|e| StoreError::reply("schedule", e.message))?;
                record.spec.timing.next_after(&rule, now)
            };
            let write = ScheduleWrite::new(
                config,
                id,
                &record.spec,
                paused,
                next,
                record.anchor,
                Some(record.version),
            );
            match self.put_schedule(&write).await? {
                PutOutcome::Written(_) | PutOutcome::Identical => {
                    return Ok(match self.get_schedule(id).await? {
                        Some(record) => Paused::Now(Box::new(record)),
                        None => Paused::NotFound,
                    });
                }
                PutOutcome::NotFound => return Ok(Paused::NotFound),
                PutOutcome::Conflict => continue,
            }
        }
        Ok(Paused::KeptChanging)
    }

    /// The partition schedule `id` lives in: its id's, unless a stub
    /// there names its ordering key's (see `lua/place_schedule.lua`).
    pub(crate) async fn schedule_home(&self, id: &str) -> StoreResult<u16> {
        let own = self.keys.partition_of(id);
        let mut conn = self.conn.clone();
        let at: Option<u16> = redis::cmd("HGET")
            .arg(self.keys.schedule(own, id))
            .arg("at")
            .query_async(&mut conn)
            .await?;
        Ok(at.filter(|&p| p < self.keys.partitions()).unwrap_or(own))
    }

    /// Creates (idempotently by id) or changes a schedule. A schedule whose
    /// jobs have an ordering key lives in its key's partition (with a stub
    /// in its id's, placed first); a create that meets a stub compares
    /// with the schedule it names, or replaces it when that one is gone.
    pub async fn put_schedule(&self, write: &ScheduleWrite<'_>) -> StoreResult<PutOutcome> {
        let own = self.keys.partition_of(write.id);
        let target = write
            .order
            .as_deref()
            .map_or(own, |order| self.keys.order_partition(order));
        if write.expected_version.is_some() {
            let home = self.schedule_home(write.id).await?;
            return match self.put_schedule_in(home, write, false).await? {
                Put::Done(outcome) => Ok(outcome),
                _ => Ok(PutOutcome::NotFound),
            };
        }
        let mut p = if target == own {
            own
        } else {
            self.place_schedule(own, write.id, target, None).await?
        };
        for _ in 0..4 {
            match self.put_schedule_in(p, write, p != target).await? {
                Put::Done(outcome) => return Ok(outcome),
                Put::Elsewhere(q) if q < self.keys.partitions() && q != p => p = q,
                Put::Elsewhere(_) => break,
                // The stub that led here names a schedule gone.
                Put::Absent => p = self.place_schedule(own, write.id, target, Some(p)).await?,
            }
        }
        Err(StoreError::reply(
            "put_schedule",
            "the schedule's place kept changing while it was being created",
        ))
    }

    /// One `place_schedule` call in partition `own` (the id's): the
    /// partition where schedule `id` lives or is to be created.
    async fn place_schedule(
        &self,
        own: u16,
        id: &str,
        target: u16,
        replace: Option<u16>,
    ) -> StoreResult<u16> {
        let home: u16 = self
            .invoke_acked(
                &scripts::PLACE_SCHEDULE,
                &[&self.keys.schedule(own, id)],
                &[
                    arg(&own),
                    arg(&target),
                    arg(&replace.map(|r| r.to_string()).unwrap_or_default()),
                ],
            )
            .await?;
        if home >= self.keys.partitions() {
            return Err(StoreError::reply(
                "place_schedule",
                format!("partition {home}"),
            ));
        }
        Ok(home)
    }

    /// One `put_schedule` call in partition `p`.
    async fn put_schedule_in(
        &self,
        p: u16,
        write: &ScheduleWrite<'_>,
        compare_only: bool,
    ) -> StoreResult<Put> {
        let spec_json = rule_json(write.spec)?;
        let overlap = match write.spec.overlap {
            schedule::Overlap::Allow => "allow",
            schedule::Overlap::Skip => "skip",
        };
        let (code, version): (Code, u64) = self
            .invoke_acked(
                &scripts::PUT_SCHEDULE,
                &[&self.keys.fires(p), &self.keys.schedules(p)],
                &[
                    arg(&self.keys.partition_prefix(p)),
                    arg(&write.id),
                    arg(&if write.expected_version.is_some() {
                        "replace"
                    } else {
                        "create"
                    }),
                    arg(&spec_json),
                    arg(&write.template_json),
                    arg(&write.max_attempts),
                    arg(&write.lease_ms.map(|l| l.to_string()).unwrap_or_default()),
                    arg(&if write.paused { "1" } else { "0" }),
                    arg(&write.next.map(|n| n.to_string()).unwrap_or_default()),
                    arg(&write.anchor),
                    arg(&write.expected_version.unwrap_or_default()),
                    arg(&*self.channel),
                    arg(&p),
                    arg(&overlap),
                    arg(&write.order.as_deref().unwrap_or_default()),
                    arg(&if compare_only { "c" } else { "" }),
                ],
            )
            .await?;
        Ok(match code {
            Code::Done => Put::Done(PutOutcome::Written(version)),
            Code::Unchanged => Put::Done(PutOutcome::Identical),
            Code::Changed => Put::Done(PutOutcome::Conflict),
            Code::NotFound if compare_only => Put::Absent,
            Code::NotFound => Put::Done(PutOutcome::NotFound),
            Code::Elsewhere => Put::Elsewhere(version as u16),
            other => return Err(StoreError::reply("put_schedule", format!("code {other:?}"))),
        })
    }

    /// Reads schedule `id`; None if there is none.
    pub(crate) async fn get_schedule(&self, id: &str) -> StoreResult<Option<ScheduleRecord>> {
        let own = self.keys.partition_of(id);
        let mut conn = self.conn.clone();
        let fields: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(self.keys.schedule(own, id))
            .query_async(&mut conn)
            .await?;
        let stub = field(&fields, "spec")
            .is_none()
            .then(|| field(&fields, "at").and_then(|at| at.parse::<u16>().ok()))
            .flatten()
            .filter(|&p| p < self.keys.partitions() && p != own);
        let Some(home) = stub else {
            return ScheduleRecord::decode(id, &fields);
        };
        let fields: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(self.keys.schedule(home, id))
            .query_async(&mut conn)
            .await?;
        ScheduleRecord::decode(id, &fields)
    }

    /// Deletes schedule `id` (the jobs it fired stay), and its stub if it
    /// has one; false if there was none.
    pub(crate) async fn drop_schedule(&self, id: &str) -> StoreResult<bool> {
        let own = self.keys.partition_of(id);
        let home = self.schedule_home(id).await?;
        let code: Code = self
            .invoke_acked(
                &scripts::DROP_SCHEDULE,
                &[
                    &self.keys.fires(home),
                    &self.keys.schedules(home),
                    &self.keys.schedule(home, id),
                ],
                &[arg(&id)],
            )
            .await?;
        let dropped = code == Code::Done;
        if home != own {
            let mut conn = self.conn.clone();
            let _: i64 = redis::cmd("DEL")
                .arg(self.keys.schedule(own, id))
                .query_async(&mut conn)
                .await?;
        }
        Ok(dropped)
    }

    /// A page of schedules in id order per partition, from `after`
    /// (partition, last id shown), and where the next page starts. Each is
    /// listed without its template's `body` and `body_text` (reading the one
    /// schedule shows them), and a page ends early, once it holds one, when
    /// it has read [`PAGE_READ_BYTES`](super::listing::PAGE_READ_BYTES) of
    /// stored schedules: a page over large templates stays small in time
    /// and memory however high its `limit`.
    ///
    /// With a `tenant`, only its schedules are listed, and the cursor names
    /// only a schedule of that tenant (the last one listed of the
    /// partition, or none: that partition again from its start), so that a
    /// page never shows another tenant's id, not even in its cursor.
    pub(crate) async fn list_schedules(
        &self,
        tenant: Option<&str>,
        limit: usize,
        after: Option<(u16, String)>,
    ) -> StoreResult<(Vec<ScheduleRecord>, Option<(u16, String)>)> {
        let mut items = Vec::new();
        let mut budget = ReadBudget::new();
        let (mut p, mut last) = match after {
            // An empty id: from the partition's first schedule.
            Some((p, id)) => (p, (!id.is_empty()).then_some(id)),
            None => (0, None),
        };
        // The last schedule of partition `p` this page listed (or the
        // cursor's), where the next page resumes.
        let mut resume = last.clone();
        let wanted = |id: &str| tenant.is_none_or(|t| crate::tenant::belongs_to(id, t));
        while p < self.keys.partitions() && items.len() < limit {
            if budget.exhausted(items.len()) {
                return Ok((items, Some((p, resume.unwrap_or_default()))));
            }
            let want = budget.batch(limit - items.len());
            let read = self.read_schedules(p, last.as_deref(), want).await?;
            for (id, fields) in &read {
                budget.spend(fields.iter().map(|(k, v)| k.len() + v.len()).sum());
                if !wanted(id) {
                    continue;
                }
                resume = Some(id.clone());
                if let Some(record) = ScheduleRecord::decode(id, fields)? {
                    items.push(record.listed());
                }
            }
            if read.len() == want {
                last = read.last().map(|(id, _)| id.clone());
                continue;
            }
            p += 1;
            last = None;
            resume = None;
        }
        let more = p < self.keys.partitions();
        Ok((items, more.then(|| (p, resume.unwrap_or_default()))))
    }

    /// Up to `want` schedule hashes of partition `p` in id order, after id
    /// `after` (from the first when None): each id with its fields.
    async fn read_schedules(
        &self,
        p: u16,
        after: Option<&str>,
        want: usize,
    ) -> StoreResult<Vec<(String, Vec<(String, String)>)>> {
        let from = after.map_or_else(|| "-".to_string(), |id| format!("({id}"));
        let mut conn = self.conn.clone();
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.keys.schedules(p))
            .arg(&from)
            .arg("+")
            .arg("BYLEX")
            .arg("LIMIT")
            .arg(0)
            .arg(want)
            .query_async(&mut conn)
            .await?;
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.hgetall(self.keys.schedule(p, id));
        }
        let all: Vec<Vec<(String, String)>> = pipe.query_async(&mut conn).await?;
        Ok(ids.into_iter().zip(all).collect())
    }

    /// Fires the due schedules of partition `p`, a batch at a time until
    /// none is due, and answers the partition's next fire time.
    pub(crate) async fn fire_due(&self, p: u16) -> StoreResult<FireRound> {
        let mut round = FireRound::default();
        let mut conn = self.conn.clone();
        // The fire index's head as the last script call left it, if the
        // round ended with one.
        let head = loop {
            let now = self.redis_time_ms().await?;
            let due: Vec<(String, f64)> = redis::cmd("ZRANGE")
                .arg(self.keys.fires(p))
                .arg("-inf")
                .arg(now)
                .arg("BYSCORE")
                .arg("LIMIT")
                .arg(0)
                .arg(FIRE_BATCH)
                .arg("WITHSCORES")
                .query_async(&mut conn)
                .await?;
            let head = if due.is_empty() {
                None
            } else {
                Some(self.fire_batch(p, &due, now, &mut round).await?)
            };
            if due.len() < FIRE_BATCH {
                break head;
            }
        };
        round.next = match head {
            Some(next) => next,
            None => {
                let first: Vec<(String, f64)> = redis::cmd("ZRANGE")
                    .arg(self.keys.fires(p))
                    .arg(0)
                    .arg(0)
                    .arg("WITHSCORES")
                    .query_async(&mut conn)
                    .await?;
                first.first().map(|(_, at)| *at as i64)
            }
        };
        Ok(round)
    }

    /// One `fire_schedules` call for the due schedules `due` (id, fire
    /// time); the fire index's earliest time left after it.
    async fn fire_batch(
        &self,
        p: u16,
        due: &[(String, f64)],
        now: i64,
        round: &mut FireRound,
    ) -> StoreResult<Option<i64>> {
        let mut args = vec![
            arg(&self.keys.partition_prefix(p)),
            arg(&*self.channel),
            arg(&p),
        ];
        args.extend(self.fire_plans(p, due, now).await?);
        let reply: super::reply::FireReply = self
            .invoke(
                &scripts::FIRE_SCHEDULES,
                &[
                    &self.keys.fires(p),
                    &self.keys.due(p),
                    &self.keys.ready(p),
                    &self.keys.seq(p),
                ],
                &args,
            )
            .await?;
        if reply.schedules.len() != due.len() {
            return Err(StoreError::reply(
                "fire_schedules",
                format!(
                    "{} answers for {} schedules",
                    reply.schedules.len(),
                    due.len()
                ),
            ));
        }
        for times in reply.schedules {
            for (time, fired) in times {
                if fired {
                    round.fired.push(reply.created - time);
                } else {
                    round.skipped += 1;
                }
            }
        }
        Ok(reply.head)
    }

    /// Reads the timing of each due schedule `due` (id, fire time) of
    /// partition `p` and plans its firing at `now`: per schedule, the six
    /// arguments `fire_schedules.lua` takes (id, fire time, version, the
    /// times to fire, the times skipped, the next fire time).
    async fn fire_plans(
        &self,
        p: u16,
        due: &[(String, f64)],
        now: i64,
    ) -> StoreResult<Vec<Vec<u8>>> {
        let mut pipe = redis::pipe();
        for (id, _) in due {
            pipe.cmd("HMGET")
                .arg(self.keys.schedule(p, id))
                .arg("spec")
                .arg("meta");
        }
        let mut conn = self.conn.clone();
        let read: Vec<(Option<String>, Option<String>)> = pipe.query_async(&mut conn).await?;
        let join = |times: &[i64]| {
            times
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut args = Vec::with_capacity(6 * due.len());
        for ((id, at), (rule, meta)) in due.iter().zip(read) {
            let at = *at as i64;
            // The firing needs the timing alone, not the job template.
            let timing = rule.and_then(|rule| serde_json::from_str::<schedule::Timing>(&rule).ok());
            // `<ver> <max> <lease> <overlap> <paused> <anchor> ...`
            let meta = meta.unwrap_or_default();
            let meta: Vec<&str> = meta.split(' ').collect();
            let version = meta.first().copied().unwrap_or_default().to_string();
            let anchor: i64 = meta.get(5).and_then(|a| a.parse().ok()).unwrap_or(at);
            let plan = timing.as_ref().and_then(|timing| {
                let rule = timing.rule(anchor).ok()?;
                Some(timing.due(&rule, at, now))
            });
            let plan = plan.unwrap_or_else(|| {
                // Gone (deleted meanwhile: the script sees the version
                // change) or unreadable: it ends, firing nothing.
                tracing::warn!(schedule = %id, "schedule cannot be read; it ends");
                schedule::Due::default()
            });
            args.push(arg(id));
            args.push(arg(&at));
            args.push(arg(&version));
            args.push(arg(&join(&plan.fire)));
            args.push(arg(&join(&plan.skipped)));
            args.push(arg(&plan.next.map(|n| n.to_string()).unwrap_or_default()));
        }
        Ok(args)
    }
}
