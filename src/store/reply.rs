//! The scripts' replies, decoded: one type per reply shape, each a
//! [`FromRedisValue`] that refuses a reply of any other shape (an array too
//! short or too long, a value of the wrong type, an outcome code the script
//! does not answer). Every script call decodes its reply through one of them
//! (`Store::invoke`), and a refusal becomes [`StoreError::Reply`] naming the
//! script; no wrapper reads a reply by hand.
//!
//! [`StoreError::Reply`]: super::StoreError::Reply

use redis::{ErrorKind, FromRedisValue, RedisError, RedisResult, Value};

use super::scripts::Code;
use super::{FailOutcome, Promotion, Reclaim, ReplayOutcome, RescheduleOutcome};
use crate::job::State;

/// A reply that does not have the shape its type expects.
fn malformed(detail: impl Into<String>) -> RedisError {
    RedisError::from((
        ErrorKind::TypeError,
        "malformed script reply",
        detail.into(),
    ))
}

/// An array reply, taken apart element by element (each moved out, not
/// copied): asking past its end, or leaving elements unread at
/// [`Fields::end`], is an error.
pub(super) struct Fields {
    values: std::vec::IntoIter<Value>,
    at: usize,
}

impl Fields {
    /// The elements of `value`, which must be an array.
    pub(super) fn of(value: Value) -> RedisResult<Self> {
        match value {
            Value::Array(values) => Ok(Fields {
                values: values.into_iter(),
                at: 0,
            }),
            other => Err(malformed(format!("an array expected, not {other:?}"))),
        }
    }

    /// The next element as a `T`; `what` names it in the error.
    pub(super) fn next<T: FromRedisValue>(&mut self, what: &str) -> RedisResult<T> {
        let value = self
            .values
            .next()
            .ok_or_else(|| malformed(format!("no {what} at position {}", self.at)))?;
        self.at += 1;
        T::from_owned_redis_value(value).map_err(|e| malformed(format!("{what}: {e}")))
    }

    /// Whether every element has been read.
    pub(super) fn is_empty(&self) -> bool {
        self.values.len() == 0
    }

    /// Checks that every element has been read.
    pub(super) fn end(self) -> RedisResult<()> {
        match self.values.len() {
            0 => Ok(()),
            left => Err(malformed(format!("{left} values left unread"))),
        }
    }
}

/// Reads the whole array `value` with `read`, refusing elements left over.
fn whole<T>(value: Value, read: impl FnOnce(&mut Fields) -> RedisResult<T>) -> RedisResult<T> {
    let mut fields = Fields::of(value)?;
    let decoded = read(&mut fields)?;
    fields.end()?;
    Ok(decoded)
}

/// Implements [`FromRedisValue`] for an array reply type from its
/// `from_owned_redis_value` (the path `Store::invoke` takes, which moves
/// strings out of the reply); the by-reference path copies the reply first.
macro_rules! by_reference_through_owned {
    ($($reply:ty),*) => {$(
        impl FromRedisValue for $reply {
            fn from_redis_value(v: &Value) -> RedisResult<$reply> {
                Self::from_owned_redis_value(v.clone())
            }

            fn from_owned_redis_value(v: Value) -> RedisResult<$reply> {
                <$reply>::decode(v)
            }
        }
    )*};
}

by_reference_through_owned!(
    Promotion,
    Reclaim,
    FailOutcome,
    RescheduleOutcome,
    EnqueueReply,
    ClaimReply,
    FireReply
);

/// A script's outcome code: the reply itself, never an array.
impl FromRedisValue for Code {
    fn from_redis_value(v: &Value) -> RedisResult<Code> {
        let n: i64 = FromRedisValue::from_redis_value(v)?;
        Code::from_number(n).ok_or_else(|| malformed(format!("unknown outcome code {n}")))
    }
}

/// A state name as the scripts answer it (`scheduled`, `ready`, ...).
impl FromRedisValue for State {
    fn from_redis_value(v: &Value) -> RedisResult<State> {
        let name: String = FromRedisValue::from_redis_value(v)?;
        State::parse(&name).ok_or_else(|| malformed(format!("unknown state {name}")))
    }
}

/// `promote_due`: `{moved, next due or -1, now, started, horizon,
/// {started in...}}`.
impl Promotion {
    /// Takes the reply apart (see the type's doc for its shape).
    fn decode(v: Value) -> RedisResult<Promotion> {
        whole(v, |f| {
            let moved = f.next("moved")?;
            let next: i64 = f.next("next due")?;
            Ok(Promotion {
                moved,
                next_due: (next >= 0).then_some(next),
                now: f.next("now")?,
                started: f.next::<i64>("started")? == 1,
                horizon: f.next("horizon")?,
                started_in: f.next("started in")?,
            })
        })
    }
}

/// `reclaim_expired`: `{requeued, dead, next deadline or -1, now,
/// {materialized in...}}`.
impl Reclaim {
    /// Takes the reply apart (see the type's doc for its shape).
    fn decode(v: Value) -> RedisResult<Reclaim> {
        whole(v, |f| {
            let requeued = f.next("requeued")?;
            let dead = f.next("dead")?;
            let next: i64 = f.next("next deadline")?;
            Ok(Reclaim {
                requeued,
                dead,
                next_deadline: (next >= 0).then_some(next),
                now: f.next("now")?,
                materialized_in: f.next("materialized in")?,
            })
        })
    }
}

/// `fail_job`: `{UNCHANGED}`, `{DONE, next due}` or `{DEAD_LETTERED, entry id}`.
impl FailOutcome {
    /// Takes the reply apart (see the type's doc for its shape).
    fn decode(v: Value) -> RedisResult<FailOutcome> {
        whole(v, |f| match f.next("code")? {
            Code::Unchanged => Ok(FailOutcome::Stale),
            Code::Done => Ok(FailOutcome::Scheduled(f.next("next due")?)),
            Code::DeadLettered => Ok(FailOutcome::DeadLettered(f.next("entry id")?)),
            other => Err(malformed(format!("code {other:?}"))),
        })
    }
}

/// `reschedule_job`: `{DONE, state, due, now}`, `{NOT_FOUND}`,
/// `{WRONG_STATE, state}` or `{CHANGED, state}`.
impl RescheduleOutcome {
    /// Takes the reply apart (see the type's doc for its shape).
    fn decode(v: Value) -> RedisResult<RescheduleOutcome> {
        whole(v, |f| match f.next("code")? {
            Code::Done => Ok(RescheduleOutcome::Changed {
                state: f.next("state")?,
                due: f.next("due")?,
                now: f.next("now")?,
            }),
            Code::NotFound => Ok(RescheduleOutcome::NotFound),
            Code::WrongState => Ok(RescheduleOutcome::NotScheduled(f.next("state")?)),
            Code::Changed => {
                let _stored: State = f.next("state")?;
                Ok(RescheduleOutcome::Modified)
            }
            other => Err(malformed(format!("code {other:?}"))),
        })
    }
}

/// `replay_dead`: a code.
impl FromRedisValue for ReplayOutcome {
    fn from_redis_value(v: &Value) -> RedisResult<ReplayOutcome> {
        match Code::from_redis_value(v)? {
            Code::Done => Ok(ReplayOutcome::Revived),
            Code::Unchanged => Ok(ReplayOutcome::AlreadyLive),
            Code::NotFound => Ok(ReplayOutcome::Gone),
            other => Err(malformed(format!("code {other:?}"))),
        }
    }
}

/// What `enqueue_jobs` answered for one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum EnqueuedJob {
    /// Created in `state`, due at `due`; held behind `ahead` when not empty.
    Created {
        /// `scheduled`, `ready` (or held, shown as one of them).
        state: State,
        /// Due time, epoch ms.
        due: i64,
        /// The id just ahead in its ordering list, or "".
        ahead: String,
    },
    /// An identical job exists.
    Identical,
    /// The id's job differs.
    Conflict,
    /// Only a finished job's summary remains: its content digest.
    Summarized(Vec<u8>),
    /// A placement pointer to this partition.
    Elsewhere(u16),
    /// Compare only: no such id here.
    Absent,
    /// The id is one of an existing schedule's fire ids (nothing changed).
    Reserved,
}

/// `enqueue_jobs`: `{now, code1, state1, due1, ahead1, code2, ...}`.
#[derive(Debug)]
pub(super) struct EnqueueReply {
    /// Redis time, epoch ms.
    pub now: i64,
    /// Per job, in the order sent.
    pub jobs: Vec<EnqueuedJob>,
}

impl EnqueueReply {
    /// Takes the reply apart (see the type's doc for its shape).
    fn decode(v: Value) -> RedisResult<EnqueueReply> {
        whole(v, |f| {
            let now = f.next("now")?;
            let mut jobs = Vec::new();
            while !f.is_empty() {
                let code: Code = f.next("code")?;
                let job = match code {
                    Code::Done => EnqueuedJob::Created {
                        state: f.next("state")?,
                        due: f.next("due")?,
                        ahead: f.next("ahead")?,
                    },
                    Code::Summarized => {
                        let _state: String = f.next("state")?;
                        let digest = f.next("digest")?;
                        let _: String = f.next("ahead")?;
                        EnqueuedJob::Summarized(digest)
                    }
                    Code::Elsewhere => {
                        let _: String = f.next("state")?;
                        let partition = f.next("partition")?;
                        let _: String = f.next("ahead")?;
                        EnqueuedJob::Elsewhere(partition)
                    }
                    Code::Unchanged | Code::Changed | Code::NotFound | Code::Reserved => {
                        for what in ["state", "due", "ahead"] {
                            let _: Value = f.next(what)?;
                        }
                        match code {
                            Code::Unchanged => EnqueuedJob::Identical,
                            Code::Changed => EnqueuedJob::Conflict,
                            Code::Reserved => EnqueuedJob::Reserved,
                            _ => EnqueuedJob::Absent,
                        }
                    }
                    other => return Err(malformed(format!("code {other:?}"))),
                };
                jobs.push(job);
            }
            Ok(EnqueueReply { now, jobs })
        })
    }
}

/// One job `claim_ready` leased.
#[derive(Debug)]
pub(super) struct ClaimedJob {
    /// Job id.
    pub id: String,
    /// Attempt number (the lease's fencing token).
    pub attempt: u32,
    /// When the attempt was due, epoch ms.
    pub due: i64,
    /// Spec JSON.
    pub spec_json: String,
    /// The lease's fencing token: its deadline, or its round's token (see
    /// "Round leases" in `lua/prelude.lua`).
    pub token: String,
    /// The record's attempts allowed.
    pub max_attempts: u16,
    /// When the job was created, epoch ms.
    pub created: i64,
    /// The partition it lives in, when not the claim's own (a job the
    /// promotion took from shared timers).
    pub partition: Option<u16>,
}

/// `claim_ready`: `{now, more, moved or -1, next due or -1, horizon,
/// {started in...}, id1, attempt1, due1, record1, partition1 or -1,
/// token1, id2, ...}` (`moved` is -1 when no promotion was asked for; a record is the
/// value as read, its header then its spec; -1: the claim's partition).
#[derive(Debug)]
pub(super) struct ClaimReply {
    /// Redis time, epoch ms.
    pub now: i64,
    /// Whether the ready list may hold more.
    pub more: bool,
    /// What the promotion before the claim did, if one was asked for.
    pub promotion: Option<Promotion>,
    /// The jobs leased.
    pub jobs: Vec<ClaimedJob>,
}

impl ClaimReply {
    /// Takes the reply apart (see the type's doc for its shape).
    fn decode(v: Value) -> RedisResult<ClaimReply> {
        whole(v, |f| {
            let now = f.next("now")?;
            let more: i64 = f.next("more")?;
            let moved: i64 = f.next("moved")?;
            let next_due: i64 = f.next("next due")?;
            let horizon: i64 = f.next("horizon")?;
            let started_in: Vec<u16> = f.next("started in")?;
            let mut jobs = Vec::new();
            while !f.is_empty() {
                let id = f.next("id")?;
                let attempt = f.next("attempt")?;
                let due = f.next("due")?;
                let record: Vec<u8> = f.next("record")?;
                let (_, max_attempts, created) = super::record::lease_fields(&record)
                    .ok_or_else(|| malformed("claim_ready: a record shorter than its header"))?;
                let partition: i64 = f.next("partition")?;
                let token = f.next("token")?;
                jobs.push(ClaimedJob {
                    partition: u16::try_from(partition).ok(),
                    id,
                    attempt,
                    due,
                    spec_json: claimed_spec(record)?,
                    token,
                    max_attempts,
                    created,
                });
            }
            Ok(ClaimReply {
                now,
                more: more == 1,
                promotion: (moved >= 0).then_some(Promotion {
                    moved: moved as usize,
                    next_due: (next_due >= 0).then_some(next_due),
                    now,
                    started: false,
                    horizon,
                    started_in,
                }),
                jobs,
            })
        })
    }
}

/// The spec JSON of a claimed job's record as read (see
/// [`spec_json_of`](super::record::spec_json_of)).
fn claimed_spec(record: Vec<u8>) -> RedisResult<String> {
    super::record::spec_json_of(&record)
        .map(str::to_string)
        .map_err(|e| malformed(format!("claim_ready: a record: {e}")))
}

/// `fire_schedules`: `{created at, head or -1, n1, time, fired, time,
/// fired, ..., n2, ...}`: the fire index's earliest time left, then per
/// schedule in the order sent its fire times and whether each fired a job
/// (else it was skipped).
#[derive(Debug)]
pub(super) struct FireReply {
    /// Redis time the jobs were created, epoch ms.
    pub created: i64,
    /// The earliest fire time left in the partition's fire index.
    pub head: Option<i64>,
    /// Per schedule: (fire time, fired).
    pub schedules: Vec<Vec<(i64, bool)>>,
}

impl FireReply {
    /// Takes the reply apart (see the type's doc for its shape).
    fn decode(v: Value) -> RedisResult<FireReply> {
        whole(v, |f| {
            let created = f.next("creation time")?;
            let head: i64 = f.next("head")?;
            let mut schedules = Vec::new();
            while !f.is_empty() {
                let n: usize = f.next("count of fire times")?;
                let mut times = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    let time = f.next("fire time")?;
                    let fired: i64 = f.next("fired")?;
                    times.push((time, fired == 1));
                }
                schedules.push(times);
            }
            Ok(FireReply {
                created,
                head: (head >= 0).then_some(head),
                schedules,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array(values: Vec<Value>) -> Value {
        Value::Array(values)
    }

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// A `claim_ready` reply: `{now, more, moved, next due, horizon}`, then
    /// the claimed jobs' fields.
    fn claim_reply(head: [i64; 5], jobs: Vec<Value>) -> Value {
        let started_in = array(Vec::new());
        array(
            head.into_iter()
                .map(Value::Int)
                .chain(std::iter::once(started_in))
                .chain(jobs)
                .collect(),
        )
    }

    #[test]
    fn a_reply_too_short_or_too_long_is_refused() {
        let fine = array(vec![
            Value::Int(3),
            Value::Int(-1),
            Value::Int(7),
            Value::Int(1),
            Value::Int(57),
            array(vec![Value::Int(4), Value::Int(0)]),
        ]);
        let promotion = Promotion::from_redis_value(&fine).expect("well formed");
        assert_eq!(
            (promotion.moved, promotion.next_due, promotion.started),
            (3, None, true)
        );
        assert_eq!(promotion.started_in, vec![4, 0]);
        let short = array(vec![
            Value::Int(3),
            Value::Int(-1),
            Value::Int(7),
            Value::Int(1),
            Value::Int(57),
        ]);
        assert!(Promotion::from_redis_value(&short).is_err());
        let long = array(vec![
            Value::Int(3),
            Value::Int(-1),
            Value::Int(7),
            Value::Int(0),
            Value::Int(57),
            array(Vec::new()),
            Value::Int(0),
        ]);
        assert!(Promotion::from_redis_value(&long).is_err());
        assert!(Promotion::from_redis_value(&Value::Int(3)).is_err());
    }

    #[test]
    fn a_missing_field_is_refused_not_read_as_zero() {
        let fail = array(vec![Value::Int(1)]);
        assert!(FailOutcome::from_redis_value(&fail).is_err());
        let nil = array(vec![Value::Int(1), Value::Nil]);
        assert!(FailOutcome::from_redis_value(&nil).is_err());
        let done = array(vec![Value::Int(1), Value::Int(42)]);
        assert_eq!(
            FailOutcome::from_redis_value(&done).ok(),
            Some(FailOutcome::Scheduled(42))
        );
    }

    #[test]
    fn unknown_codes_and_states_are_refused() {
        assert!(Code::from_redis_value(&Value::Int(9)).is_err());
        assert!(ReplayOutcome::from_redis_value(&Value::Int(-2)).is_err());
        let state = array(vec![Value::Int(-2), text("sleeping")]);
        assert!(RescheduleOutcome::from_redis_value(&state).is_err());
        let state = array(vec![Value::Int(-2), text("delivered")]);
        assert_eq!(
            RescheduleOutcome::from_redis_value(&state).ok(),
            Some(RescheduleOutcome::NotScheduled(State::Delivered))
        );
    }

    #[test]
    fn well_formed_batches_decode_every_field() {
        let claim = array(vec![
            Value::Int(5000),
            Value::Int(1),
            Value::Int(-1),
            Value::Int(-1),
            Value::Int(5050),
            array(Vec::new()),
            text("a"),
            Value::Int(2),
            Value::Int(4000),
            // The record as read: its header (state, updated, attempts,
            // allowed 3, due, sequence, created 1234, lease 7000, given),
            // then the spec.
            Value::BulkString(
                [
                    &b"r"[..],
                    &[0; 6],
                    &[0, 1],
                    &[0, 3],
                    &[0; 12],
                    &[0, 0, 0, 0, 4, 210],
                    &[0, 0, 27, 88],
                    &[0; 6],
                    b"{}",
                ]
                .concat(),
            ),
            Value::Int(-1),
            Value::BulkString(b"11000/a".to_vec()),
        ]);
        let claim = ClaimReply::from_redis_value(&claim).expect("well formed");
        assert_eq!((claim.now, claim.more, claim.jobs.len()), (5000, true, 1));
        assert!(claim.promotion.is_none(), "-1: no promotion asked for");
        let job = &claim.jobs[0];
        assert_eq!(
            (
                job.id.as_str(),
                job.attempt,
                job.due,
                job.spec_json.as_str()
            ),
            ("a", 2, 4000, "{}")
        );
        assert_eq!(
            (job.token.as_str(), job.max_attempts, job.created),
            ("11000/a", 3, 1234)
        );
        let promoted = claim_reply([5000, 0, 3, 7000, 5050], Vec::new());
        let promotion = ClaimReply::from_redis_value(&promoted)
            .expect("well formed")
            .promotion
            .expect("a promotion");
        assert_eq!(
            (promotion.moved, promotion.next_due, promotion.horizon),
            (3, Some(7000), 5050)
        );

        let fire = array(vec![
            Value::Int(9000),
            Value::Int(12_000),
            Value::Int(2),
            Value::Int(8000),
            Value::Int(1),
            Value::Int(8500),
            Value::Int(0),
            Value::Int(0),
        ]);
        let fire = FireReply::from_redis_value(&fire).expect("well formed");
        assert_eq!((fire.created, fire.head), (9000, Some(12_000)));
        assert_eq!(
            fire.schedules,
            vec![vec![(8000, true), (8500, false)], vec![]]
        );

        let codes = array(vec![
            Value::Int(1000),
            Value::Int(0),
            text("scheduled"),
            Value::Int(2000),
            text(""),
            Value::Int(-3),
            text("ready"),
            Value::Int(2000),
            text(""),
            Value::Int(-4),
            text("delivered"),
            text("digest"),
            text(""),
            Value::Int(-1),
            text(""),
            Value::Int(0),
            text(""),
        ]);
        let decoded = EnqueueReply::from_redis_value(&codes).expect("well formed");
        assert_eq!(
            decoded.jobs,
            vec![
                EnqueuedJob::Identical,
                EnqueuedJob::Conflict,
                EnqueuedJob::Summarized(b"digest".to_vec()),
                EnqueuedJob::Absent,
            ]
        );
    }

    #[test]
    fn batch_replies_decode_per_job_and_refuse_a_partial_job() {
        let reply = array(vec![
            Value::Int(1000),
            Value::Int(1),
            text("scheduled"),
            Value::Int(2000),
            text(""),
            Value::Int(-5),
            text(""),
            Value::Int(3),
            text(""),
        ]);
        let decoded = EnqueueReply::from_redis_value(&reply).expect("well formed");
        assert_eq!(decoded.now, 1000);
        assert_eq!(
            decoded.jobs,
            vec![
                EnqueuedJob::Created {
                    state: State::Scheduled,
                    due: 2000,
                    ahead: String::new()
                },
                EnqueuedJob::Elsewhere(3)
            ]
        );
        let Value::Array(mut values) = reply else {
            unreachable!("built as an array")
        };
        values.pop();
        assert!(EnqueueReply::from_redis_value(&array(values)).is_err());

        // A claimed job without its record, and one whose record is
        // shorter than a header.
        let job = vec![text("a"), Value::Int(1), Value::Int(4)];
        let claim = claim_reply([5, 0, -1, -1, 5050], job.clone());
        assert!(ClaimReply::from_redis_value(&claim).is_err());
        let short_record = claim_reply([5, 0, -1, -1, 5050], [job, vec![text("{}")]].concat());
        assert!(
            ClaimReply::from_redis_value(&short_record).is_err(),
            "a record shorter than its header"
        );
        let fire = array(vec![
            Value::Int(5),
            Value::Int(-1),
            Value::Int(2),
            Value::Int(1),
            Value::Int(1),
        ]);
        assert!(FireReply::from_redis_value(&fire).is_err());
    }
}
