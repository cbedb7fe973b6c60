//! The store: hookq's only door to Redis. It owns the connection (single node
//! or cluster), the key schema ([`Keys`]) and a typed wrapper per Lua script
//! ([`scripts`]); every state change of a job is one script call here.
//!
//! Redis structures, per partition `p` (see [`Keys`] for the exact names):
//! job records (one string each, laid out in [`record`]) and history lists,
//! the `due` zset, the `ready` list, the
//! `inflight` zset of leases, the `dead` stream and the `seq` counter.

mod attempts;
mod changes;
pub(crate) mod cluster;
mod connection;
mod enqueue;
pub mod hosts;
pub mod keys;
pub mod listing;
pub(crate) mod placement;
pub mod record;
mod reply;
pub mod schedules;
pub(crate) mod schema;
pub(crate) mod scripts;
pub(crate) mod summary;

use std::time::Duration;

use std::sync::Arc;

pub use attempts::{ClaimBatch, Claimed, FailOutcome, Failure, Promotion, Reclaim};
pub use changes::{CancelOutcome, ReplayOutcome, Reschedule, RescheduleOutcome};
pub(crate) use cluster::ClusterConn;
pub(crate) use connection::{RedisConn, CONNECT_TIMEOUT};
pub use enqueue::EnqueueOutcome;
pub use keys::Keys;
pub(crate) use record::JobRecord;
use scripts::{Code, Scripts};
pub use summary::{Delivery, Earlier, Kept, Summary};

/// Errors talking to Redis.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis could not be reached or answered an error.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A script or command answered something hookq does not understand.
    #[error("unexpected reply from {what}: {detail}")]
    Reply {
        /// The script or command.
        what: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// Redis holds hookq data of another layout version.
    #[error("Redis holds hookq data in layout version `{found}`, this hookq reads layout {}: stop every hookq daemon and run `hookq migrate` (it converts in place and resumes if interrupted)", schema::SCHEMA_VERSION)]
    Schema {
        /// The version found.
        found: String,
    },
    /// The error of a script call, shared by every job that call carried.
    #[error("{0}")]
    Shared(Arc<StoreError>),
    /// Fewer replicas than `redis.ack_replicas` had the write within
    /// `redis.ack_timeout` (it may still have landed on the master).
    #[error("the write reached {acknowledged} of the {wanted} replicas redis.ack_replicas asks for within redis.ack_timeout")]
    NotReplicated {
        /// Replicas that acknowledged it.
        acknowledged: i64,
        /// `redis.ack_replicas`.
        wanted: u32,
    },
}

impl StoreError {
    /// An answer hookq does not understand (or a batch that could not run).
    pub(crate) fn reply(what: &'static str, detail: impl Into<String>) -> Self {
        StoreError::Reply {
            what,
            detail: detail.into(),
        }
    }
}

/// Encodes one script argument.
fn arg<T: redis::ToRedisArgs>(value: &T) -> Vec<u8> {
    value.to_redis_args().concat()
}

/// Result of store calls.
pub type StoreResult<T> = Result<T, StoreError>;

/// A record found where a schedule's firing puts the job of its id: a
/// finished job's summary keeps no spec, so its `schedule_id` comes from
/// the id (`<schedule id>:<fire time>`).
fn fired_summary(mut record: JobRecord) -> JobRecord {
    if record.summarized {
        record.spec.schedule_id =
            crate::schedule::fired_by(&record.id).map(|(schedule, _)| schedule.to_string());
    }
    record
}

/// Settings the scripts need, taken from the config once.
#[derive(Debug, Clone, Copy)]
struct Settings {
    retention_ms: u64,
    keep_bodies: bool,
    dead_letters_max: u64,
    default_lease_ms: u64,
    ack_replicas: u32,
    ack_timeout_ms: u64,
}

/// The handle to hookq's Redis state. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    conn: RedisConn,
    /// With `redis.ack_replicas` > 0: a connection of its own for the
    /// writes that are `WAIT`ed for, so that a slow replica holds up only
    /// those.
    acked: Option<RedisConn>,
    // Shared, not copied: the API clones the store for every request.
    keys: Arc<Keys>,
    scripts: Arc<Scripts>,
    settings: Settings,
    channel: Arc<String>,
}

impl Store {
    /// Beats for daemon `id` in the fleet, its membership lasting `ttl` (zero:
    /// leaves); answers the live members' ids, sorted.
    pub(crate) async fn fleet_beat(&self, id: &str, ttl: Duration) -> StoreResult<Vec<String>> {
        let mut members: Vec<String> = self
            .invoke(
                &scripts::FLEET_BEAT,
                &[&self.keys.fleet()],
                &[arg(&id), arg(&(ttl.as_millis() as u64))],
            )
            .await?;
        members.sort_unstable();
        Ok(members)
    }

    /// The live members of the fleet (read only; ids sorted).
    pub(crate) async fn fleet_members(&self) -> StoreResult<Vec<String>> {
        let now = self.redis_time_ms().await?;
        let mut conn = self.conn.clone();
        let mut members: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.keys.fleet())
            .arg(format!("({now}"))
            .arg("+inf")
            .arg("BYSCORE")
            .query_async(&mut conn)
            .await?;
        members.sort_unstable();
        Ok(members)
    }

    /// The partition the schedule lives in whose firing would give job id
    /// `id`, if it is such an id (a schedule with an ordering key lives in
    /// its key's partition: one read finds it).
    async fn fired_home(&self, id: &str) -> StoreResult<Option<u16>> {
        match crate::schedule::fired_by(id) {
            Some((schedule, _)) => Ok(Some(self.schedule_home(schedule).await?)),
            None => Ok(None),
        }
    }

    /// The partition of the schedule whose firing would give job id `id`
    /// (see [`crate::schedule::fired_by`]), if it is such an id.
    fn fired_partition(&self, id: &str) -> Option<u16> {
        crate::schedule::fired_by(id).map(|(schedule, _)| self.keys.partition_of(schedule))
    }

    /// Reads the header of job `id`'s record in partition `p` (live, or a
    /// finished one kept whole); None if there is no record.
    pub(crate) async fn record_header(
        &self,
        p: u16,
        id: &str,
    ) -> StoreResult<Option<record::RecordHeader>> {
        let mut conn = self.conn.clone();
        let (live, kept): (Vec<u8>, Vec<u8>) = redis::pipe()
            .hget(self.keys.live_records(p, id), id)
            .cmd("GETRANGE")
            .arg(self.keys.job(p, id))
            .arg(0)
            .arg(record::HEADER_LEN - 1)
            .query_async(&mut conn)
            .await?;
        Ok(record::RecordHeader::parse(&live).or_else(|| record::RecordHeader::parse(&kept)))
    }

    /// The partition job `id` lives in: its id's, unless a placement
    /// pointer there names another (see [`Keys::placed`]).
    pub(crate) async fn home_of(&self, id: &str) -> StoreResult<u16> {
        let own = self.keys.partition_of(id);
        let mut conn = self.conn.clone();
        let at = self.keys.live_records(own, id);
        // A pointer is a few bytes: a record is read only when it is one.
        let len: usize = redis::cmd("HSTRLEN")
            .arg(&at)
            .arg(id)
            .query_async(&mut conn)
            .await?;
        if len >= record::HEADER_LEN {
            return Ok(own);
        }
        if len == 0 {
            // A job a schedule fired lives in the schedule's partition,
            // unless one of its id was created by hand (kept or summarised
            // here).
            let Some(fired) = self.fired_home(id).await?.filter(|&p| p != own) else {
                return Ok(own);
            };
            let kept: bool = redis::cmd("EXISTS")
                .arg(self.keys.job(own, id))
                .query_async(&mut conn)
                .await?;
            if kept || self.find_summary(own, id).await?.is_some() {
                return Ok(own);
            }
            return Ok(fired);
        }
        let value: Vec<u8> = redis::cmd("HGET")
            .arg(&at)
            .arg(id)
            .query_async(&mut conn)
            .await?;
        Ok(self.pointed(&value).unwrap_or(own))
    }

    /// The partition a live-record value points to, when it is a valid
    /// placement pointer.
    pub(super) fn pointed(&self, value: &[u8]) -> Option<u16> {
        record::pointer_of(value).filter(|&q| q < self.keys.partitions())
    }

    /// Reads a job record and its history: the live record, else a finished
    /// one kept whole, else a finished job's summary; None if unknown (or
    /// expired). A job held behind its ordering list's earlier jobs shows
    /// the one just ahead of it.
    pub async fn get(&self, id: &str) -> StoreResult<Option<JobRecord>> {
        let own = self.keys.partition_of(id);
        match self.get_in(own, id).await? {
            Err(q) => match self.get_in(q, id).await? {
                Ok(found) => Ok(found),
                Err(_) => Err(StoreError::reply(
                    "job record",
                    format!("{id}: a pointer to a pointer"),
                )),
            },
            Ok(None) => match self.fired_home(id).await?.filter(|&p| p != own) {
                // A job a schedule fired lives in the schedule's partition.
                Some(p) => Ok(self.get_in(p, id).await?.unwrap_or(None).map(fired_summary)),
                None => Ok(None),
            },
            Ok(Some(record)) if self.fired_partition(id) == Some(own) => {
                Ok(Some(fired_summary(record)))
            }
            Ok(found) => Ok(found),
        }
    }

    /// [`Store::get`] in partition `p`: Err(q) when the id points to
    /// partition q instead.
    async fn get_in(&self, p: u16, id: &str) -> StoreResult<Result<Option<JobRecord>, u16>> {
        let mut conn = self.conn.clone();
        let (live, kept, history): (Vec<u8>, Vec<u8>, Vec<String>) = redis::pipe()
            .hget(self.keys.live_records(p, id), id)
            .get(self.keys.job(p, id))
            .lrange(self.keys.history(p, id), 0, 19)
            .query_async(&mut conn)
            .await?;
        if let Some(q) = self.pointed(&live) {
            return Ok(Err(q));
        }
        let value = if live.is_empty() { kept } else { live };
        let record = match JobRecord::decode(id, &value, history)? {
            Some(mut record) => {
                if record.held {
                    self.read_hold(p, &mut record).await?;
                }
                Some(record)
            }
            None => self
                .find_summary(p, id)
                .await?
                .map(|summary| summary.into_record(id)),
        };
        Ok(Ok(record))
    }

    /// Fills in, for held job `record` of partition `p`, the id just ahead
    /// of it in its ordering list and the job that holds the key (the
    /// list's head) with its due time. Read for a held job's view alone:
    /// three round trips, none on the path of a delivery.
    async fn read_hold(&self, p: u16, record: &mut JobRecord) -> StoreResult<()> {
        let Some(order) = record.spec.ordering_list() else {
            return Ok(());
        };
        let list = self.keys.order_list(p, &order);
        let mut conn = self.conn.clone();
        let at: Option<i64> = redis::cmd("LPOS")
            .arg(&list)
            .arg(&record.id)
            .query_async(&mut conn)
            .await?;
        let Some(i) = at.filter(|&i| i > 0) else {
            return Ok(());
        };
        let (ahead, head): (Option<String>, Option<String>) = redis::pipe()
            .lindex(&list, (i - 1) as isize)
            .lindex(&list, 0)
            .query_async(&mut conn)
            .await?;
        record.waiting_for = ahead;
        if let Some(head) = head {
            // The head lives in the key's partition, as every job of it.
            let header = self.record_header(p, &head).await?;
            let until = header
                .filter(|h| h.state == crate::job::State::Scheduled && h.due > crate::job::now_ms())
                .map(|h| h.due);
            record.holder = Some(record::Holder { id: head, until });
        }
        Ok(())
    }

    /// The newest summary of finished job `id` of partition `p`: one read of
    /// the partition's bucket index, then one HGET per bucket, pipelined;
    /// then, for a summary whose history goes on in continuation fields,
    /// one HMGET of those.
    pub(crate) async fn find_summary(&self, p: u16, id: &str) -> StoreResult<Option<Summary>> {
        let buckets = self.summary_buckets(p).await?;
        if buckets.is_empty() {
            return Ok(None);
        }
        let h = summary::id_hash(id);
        let mut pipe = redis::pipe();
        let mut shards = Vec::with_capacity(buckets.len());
        for bucket in &buckets {
            let shard = self
                .keys
                .done_shard(p, &bucket.start, summary::shard_of(h, bucket.shards));
            pipe.hget(&shard, id);
            shards.push(shard);
        }
        let mut conn = self.conn.clone();
        let values: Vec<Option<Vec<u8>>> = pipe.query_async(&mut conn).await?;
        let Some((shard, value, _)) = values
            .into_iter()
            .zip(shards)
            .filter_map(|(v, shard)| v.map(|v| (shard, v)))
            .filter_map(|(shard, v)| Summary::finished_of(&v).map(|f| (shard, v, f)))
            .max_by_key(|(_, _, finished)| *finished)
        else {
            return Ok(None);
        };
        let more = summary::continuations(&value);
        if more > 0 {
            let fields: Vec<String> = (1..=more)
                .map(|k| summary::continuation_field(id, k))
                .collect();
            let pieces: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
                .arg(&shard)
                .arg(&fields)
                .query_async(&mut conn)
                .await?;
            let whole = summary::join(&value, pieces.iter().map(|p| p.as_deref()));
            return Ok(Summary::parse(&whole));
        }
        Ok(Summary::parse(&value))
    }

    /// The summary buckets of partition `p` (expired ones may linger in the
    /// index until the next new bucket; their shards are gone).
    pub async fn summary_buckets(&self, p: u16) -> StoreResult<Vec<summary::Bucket>> {
        let mut conn = self.conn.clone();
        let index: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(self.keys.done(p))
            .query_async(&mut conn)
            .await?;
        let mut buckets: Vec<summary::Bucket> = index
            .iter()
            .filter_map(|(start, value)| summary::Bucket::parse(start, value))
            .collect();
        buckets.sort_by_key(summary::Bucket::start_ms);
        Ok(buckets)
    }
}
