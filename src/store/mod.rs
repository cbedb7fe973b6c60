//! The store: hookq's only door to Redis. It owns the connection (single node
//! or cluster), the key schema ([`Keys`]) and a typed wrapper per Lua script
//! ([`scripts`]); every state change of a job is one script call here.
//!
//! Redis structures, per partition `p` (see [`Keys`] for the exact names):
//! job records (live ones as fields of the record hashes, laid out in
//! [`record`]; finished ones kept whole or as [`summary`] entries) and
//! history lists, the `due` zset, the `ready` list, the
//! `inflight` zset of leases, the `dead` stream and the `seq` counter.
//!
//! Where each part lives: this file holds the [`Store`] handle and
//! [`StoreError`]; `connection` connects and runs the scripts; `enqueue`
//! creates jobs; `attempts` holds the delivery path's calls (promote, claim,
//! complete, fail, defer, reclaim); `changes` cancels, reschedules and
//! replays; `lookup` finds one job; [`listing`] pages through jobs and dead
//! letters and counts them; `fleet`, [`hosts`], [`schedules`] and
//! `placement` hold their own structures.

mod attempts;
mod batcher;
mod changes;
pub(crate) mod cluster;
mod connection;
mod enqueue;
mod fleet;
pub mod hosts;
pub mod keys;
mod libraries;
pub mod listing;
mod lookup;
pub(crate) mod placement;
pub mod record;
mod reply;
pub mod schedules;
pub(crate) mod schema;
pub(crate) mod scripts;
pub(crate) mod summary;

use std::sync::Arc;

pub use attempts::{ClaimBatch, Claimed, FailOutcome, Failure, Lease, Outcome, Promotion, Reclaim};
pub use changes::{CancelOutcome, ReplayOutcome, Reschedule, RescheduleOutcome};
pub(crate) use cluster::ClusterConn;
pub(crate) use connection::{RedisConn, CONNECT_TIMEOUT};
pub use enqueue::EnqueueOutcome;
pub use keys::Keys;
pub use libraries::OtherLibraries;
pub(crate) use record::JobRecord;
use scripts::{Code, Scripts};
pub use summary::{Bucket, Delivery, Earlier, Kept, Summary};

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
    /// The namespace's data is spread over another number of partitions
    /// than `redis.partitions` says.
    #[error("Redis holds this namespace's jobs in {recorded} partitions, but config key `redis.partitions` is {configured}: a job lives in the partition its id hashes to, so with {configured} the jobs of the others would never be delivered or found; set `redis.partitions = {recorded}`")]
    Partitions {
        /// The count the data was written with.
        recorded: String,
        /// `redis.partitions`.
        configured: u16,
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

/// Settings the scripts need, taken from the config once.
#[derive(Debug, Clone, Copy)]
struct Settings {
    retention_ms: u64,
    keep_bodies: bool,
    dead_letters_max: u64,
    default_lease_ms: u64,
    /// `delivery.claim_ahead` in ms.
    claim_ahead_ms: u64,
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
    /// The claim's weight arguments ([`crate::tenant::weight_args`]).
    tenant_weights: Arc<Vec<String>>,
    /// Sends the hot scripts' calls made at one moment together (a single
    /// Redis only; see [`batcher`]); None: each call alone.
    batcher: Option<Arc<batcher::Batcher>>,
}
