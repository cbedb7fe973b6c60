//! Calls made at the same moment go to Redis together (SPEC §16).
//!
//! At a steady load the claim loops of several partitions claim at the
//! same moment (the carrier's round hands each its promotion), and the
//! outcome recording writes one call per partition it has outcomes for.
//! Each call alone wakes Redis and pays a script call's fixed cost; on a
//! single Redis with Functions, the calls of [`BATCHED`] scripts queued at
//! one moment instead go out as one `FCALL` of the library's batch
//! function (`lua/batch.lua`), which runs each as it would run alone and
//! answers each its own reply or error. A call alone, a cluster (whose
//! partitions live on several nodes) and a Redis without Functions run as
//! before.
//!
//! One task sends the batches, one at a time ([`IN_FLIGHT`]): while one
//! runs, the next one gathers, so under load batches grow instead of
//! queueing. A batch carries at most [`MAX_ARGS`] arguments of calls to
//! send (and [`RIDE_MAX_ARGS`] with riders), so that no single `FCALL`
//! holds Redis for long, and the claims and promotions
//! queued go before the outcomes: a job just due does not wait behind a
//! bulk's outcomes, which are delivered already and held by their leases.
//!
//! Two things keep a steady load to one wake of Redis per carrier round:
//! - the carrier says how many calls its round sets off
//!   ([`Store::expect_calls`]); a batch waits for them, up to
//!   [`EXPECT_WAIT`], instead of leaving with the first loop that woke;
//! - a call may *ride* ([`Store::complete_many`]'s outcomes do): it waits
//!   for the next batch that goes anyway with room for it, and goes alone
//!   only once its time to ride is up.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use super::connection::{decode, function_missing};
use super::scripts::{Runner, ScriptDef, BATCHED, COMPLETE_JOBS};
use super::{RedisConn, Store, StoreError, StoreResult};

/// How many times the task lets the other tasks run before it sends what
/// it has: the loops woken by one round make their calls meanwhile.
const GATHER_YIELDS: usize = 3;
/// Batches in flight at once. Measured with two interleaved runs each
/// (one, two, four): one costs Redis about a quarter less per job in a
/// burst (`one_host_default` 12.3-12.7 µs against 16.4-16.7 at two) at the
/// same rate, and holds that rate behind a 2 and 4 ms round trip to Redis
/// (27,300-29,000 jobs/s): the outcomes queued meanwhile make larger calls.
const IN_FLIGHT: usize = 1;
/// Most arguments (all calls' ARGV together) of the calls to send one
/// batch carries; a call larger than that goes alone. Measured under a
/// 200,000-job bulk with another tenant's trickle (`tenants_fair`): at
/// 2,048 a batch held Redis for milliseconds and the trickle's claims
/// waited 20-50 ms behind batches of outcomes; at 256 they wait a few, and
/// Redis spent less per job (why was not profiled; see
/// docs/performance.md, Tenants).
const MAX_ARGS: usize = 256;
/// Most arguments a batch carries once riding calls have boarded. Riders
/// are outcome calls of a light load (a full outcome batch does not ride),
/// each small, and a window's worth of them is the 16 partitions' calls:
/// ~600 arguments at 200 jobs/s. Cut at [`MAX_ARGS`], two in three of them
/// missed the round they rode for and woke Redis alone a few milliseconds
/// later (53 of 307 `FCALL`s of `steady_200`; 7 of 258 with this, and
/// ~13 % less Redis CPU a job there, docs/performance.md).
const RIDE_MAX_ARGS: usize = 1024;
/// Longest a batch waits for the calls a carrier round said would come.
const EXPECT_WAIT: Duration = Duration::from_millis(2);

/// One call waiting for its batch.
struct Call {
    def: &'static ScriptDef,
    keys: Vec<String>,
    args: Vec<Vec<u8>>,
    reply: oneshot::Sender<StoreResult<Value>>,
    /// A call that rides: it goes with the next batch, or alone at this
    /// time (see the module doc).
    ride_until: Option<Instant>,
}

/// The queue of a store's batched calls (see the module doc).
pub(crate) struct Batcher {
    queue: mpsc::UnboundedSender<Call>,
    /// Calls a carrier round said would come and that have not yet.
    expected: Arc<AtomicUsize>,
}

impl Batcher {
    /// Starts the task sending `store`'s batches (a store without a
    /// batcher of its own, so the task ends with the last handle).
    pub(crate) fn start(store: Store) -> Batcher {
        let (queue, rx) = mpsc::unbounded_channel();
        let expected = Arc::new(AtomicUsize::new(0));
        tokio::spawn(send_batches(store, rx, expected.clone()));
        Batcher { queue, expected }
    }
}

impl Store {
    /// This store, sending the calls of the hot scripts made at one moment
    /// together (see the module doc) on a single Redis; a cluster's store
    /// as it is. Call within a Tokio runtime (it starts the batching task).
    pub fn batching(mut self) -> Store {
        if matches!(self.conn, RedisConn::Single(_)) {
            let plain = self.clone();
            self.batcher = Some(Arc::new(Batcher::start(plain)));
        }
        self
    }

    /// The batcher this store's calls go through: a single Redis with
    /// Functions only.
    fn active_batcher(&self) -> Option<&Batcher> {
        match &self.batcher {
            Some(b) if self.scripts.runner() == Runner::Functions => Some(b),
            _ => None,
        }
    }

    /// True when this store sends calls made at one moment together (so
    /// that a call may ride with the next batch; see the module doc).
    pub(crate) fn batches_calls(&self) -> bool {
        self.active_batcher().is_some()
    }

    /// Says that `n` batched calls are about to be made (a carrier round's
    /// claims and promotions): the next batch waits for them, up to
    /// [`EXPECT_WAIT`]. Nothing when this store does not batch.
    pub fn expect_calls(&self, n: usize) {
        if let Some(b) = self.active_batcher() {
            b.expected.store(n, Ordering::Release);
        }
    }

    /// Runs script `def` (one of [`BATCHED`]) with `keys` and `args`, in a
    /// batch with the calls made at the same moment when this store batches
    /// (else alone, as [`Store::invoke`] does); decodes its reply. With
    /// `ride_until`, the call waits for the next batch up to that time.
    pub(super) async fn invoke_batched<T: redis::FromRedisValue>(
        &self,
        def: &'static ScriptDef,
        keys: &[&str],
        args: Vec<Vec<u8>>,
        ride_until: Option<Instant>,
    ) -> StoreResult<T> {
        let batched = BATCHED.iter().any(|b| b.name == def.name);
        let batcher = match self.active_batcher() {
            Some(b) if batched => b,
            _ => return self.invoke(def, keys, &args).await,
        };
        Store::check_inputs(def, keys, &args)?;
        if ride_until.is_none() {
            // (Saturating: a call nobody announced takes nothing.)
            let _ = batcher
                .expected
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
        let (reply, answer) = oneshot::channel();
        let call = Call {
            def,
            keys: keys.iter().map(|k| k.to_string()).collect(),
            args,
            reply,
            ride_until,
        };
        if let Err(mpsc::error::SendError(call)) = batcher.queue.send(call) {
            // (The task has ended: the runtime is going down.)
            return self.invoke(def, keys, &call.args).await;
        }
        let value = answer
            .await
            .unwrap_or_else(|_| Err(StoreError::reply(def.name, "the batch was dropped")))?;
        decode(def, value)
    }

    /// Runs `calls` as one `FCALL` of the batch function (loading the
    /// library first when Redis lacks it); each call's reply or error, in
    /// order.
    async fn run_batch(&self, conn: &mut RedisConn, calls: &[Call]) -> Vec<StoreResult<Value>> {
        let mut fcall = redis::cmd("FCALL");
        let keys: usize = calls.iter().map(|c| c.keys.len()).sum();
        fcall.arg(&self.scripts.library().batch).arg(keys);
        for call in calls {
            for key in &call.keys {
                fcall.arg(key);
            }
        }
        fcall.arg(calls.len());
        for call in calls {
            fcall
                .arg(call.def.name)
                .arg(call.keys.len())
                .arg(call.args.len());
        }
        for call in calls {
            for arg in &call.args {
                fcall.arg(arg.as_slice());
            }
        }
        let mut reply = fcall.query_async::<Value>(conn).await;
        if matches!(&reply, Err(err) if function_missing(err)) {
            tracing::info!(
                library = %self.scripts.library().name,
                "Redis lacks the Lua library (restarted or flushed): loading it"
            );
            reply = match self.load_library(conn, None).await {
                Ok(()) => fcall.query_async::<Value>(conn).await,
                Err(err) => Err(err),
            };
        }
        match reply {
            Ok(Value::Array(replies)) if replies.len() == 2 * calls.len() => {
                let mut parts = replies.into_iter();
                calls
                    .iter()
                    .map(|c| one(c.def, parts.next(), parts.next()))
                    .collect()
            }
            Ok(other) => shared_error(
                calls.len(),
                StoreError::reply(
                    "batch",
                    format!("expected {} replies, got {other:?}", 2 * calls.len()),
                ),
            ),
            Err(err) => shared_error(calls.len(), StoreError::from(err)),
        }
    }
}

/// `err` as the answer of each of `n` calls ([`StoreError::Shared`]).
fn shared_error(n: usize, err: StoreError) -> Vec<StoreResult<Value>> {
    let err = Arc::new(err);
    (0..n)
        .map(|_| Err(StoreError::Shared(err.clone())))
        .collect()
}

/// One call's part of a batch's reply: 1 and its reply, or 0 and its
/// error.
fn one(def: &ScriptDef, status: Option<Value>, reply: Option<Value>) -> StoreResult<Value> {
    match (status, reply) {
        (Some(Value::Int(1)), Some(reply)) => Ok(reply),
        (Some(Value::Int(0)), Some(message)) => {
            let message: String = redis::from_owned_redis_value(message)
                .unwrap_or_else(|_| "an error without a message".to_string());
            Err(StoreError::reply(def.name, message))
        }
        _ => Err(StoreError::reply(
            def.name,
            "batched reply of another shape",
        )),
    }
}

/// The calls waiting in the batching task: those to send, and those
/// riding (see the module doc).
#[derive(Default)]
struct Waiting {
    to_send: Vec<Call>,
    riding: Vec<Call>,
}

impl Call {
    /// True for an outcome (`complete_jobs`): it goes after the claims and
    /// promotions queued with it (see the module doc).
    fn is_outcome(&self) -> bool {
        self.def.name == COMPLETE_JOBS.name
    }
}

impl Waiting {
    /// Sorts `call` in.
    fn take(&mut self, call: Call) {
        if call.ride_until.is_some() {
            self.riding.push(call);
        } else {
            self.to_send.push(call);
        }
    }

    /// When the first riding call must go, if one rides.
    fn ride_ends(&self) -> Option<Instant> {
        self.riding.iter().filter_map(|c| c.ride_until).min()
    }

    /// Puts the riding calls with those to send (their time is up, or the
    /// queue has closed).
    fn board(&mut self) {
        self.to_send.append(&mut self.riding);
    }

    /// Takes the next batch: the calls to send, the claims and promotions
    /// before the outcomes, up to [`MAX_ARGS`] arguments (at least one
    /// call); then, if all of them fit, the riding calls that fit within
    /// [`RIDE_MAX_ARGS`]. The rest stay for the next batch.
    fn next_batch(&mut self) -> Vec<Call> {
        // (Stable: each kind keeps the order it was queued in.)
        self.to_send.sort_by_key(Call::is_outcome);
        let mut args = 0;
        let cut = self
            .to_send
            .iter()
            .position(|c| {
                args += c.args.len();
                args > MAX_ARGS
            })
            .unwrap_or(self.to_send.len())
            .max(1);
        let mut batch: Vec<Call> = self.to_send.drain(..cut).collect();
        if self.to_send.is_empty() && args <= MAX_ARGS {
            let boarding = self
                .riding
                .iter()
                .position(|c| {
                    args += c.args.len();
                    args > RIDE_MAX_ARGS
                })
                .unwrap_or(self.riding.len());
            batch.extend(self.riding.drain(..boarding));
        }
        batch
    }
}

/// Waits until `waiting` has calls to send: a call that does not ride
/// (then the calls made at the same moment and those `expected` join it,
/// see [`gather`]) or a riding call whose time is up. False when the queue
/// has closed and nothing is left.
async fn wait_for_calls(
    rx: &mut mpsc::UnboundedReceiver<Call>,
    waiting: &mut Waiting,
    expected: &AtomicUsize,
) -> bool {
    while waiting.to_send.is_empty() {
        let ride_ends = waiting.ride_ends();
        let mut fresh = Vec::new();
        tokio::select! {
            n = rx.recv_many(&mut fresh, 1024) => {
                if n == 0 {
                    // Closed: what rides goes now.
                    waiting.board();
                    return !waiting.to_send.is_empty();
                }
                fresh.into_iter().for_each(|c| waiting.take(c));
                if !waiting.to_send.is_empty() {
                    gather(rx, waiting, expected).await;
                }
            }
            _ = tokio::time::sleep_until(ride_ends.unwrap_or_else(Instant::now)), if ride_ends.is_some() => {
                waiting.board();
            }
        }
    }
    true
}

/// Lets the loops woken with the first call make theirs, and waits (up to
/// [`EXPECT_WAIT`]) for the calls a carrier round announced.
async fn gather(
    rx: &mut mpsc::UnboundedReceiver<Call>,
    waiting: &mut Waiting,
    expected: &AtomicUsize,
) {
    for _ in 0..GATHER_YIELDS {
        tokio::task::yield_now().await;
    }
    let deadline = Instant::now() + EXPECT_WAIT;
    while expected.load(Ordering::Acquire) > 0 {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(call)) => waiting.take(call),
            Ok(None) => break,
            Err(_) => {
                // They are not coming (a loop without room): forget them.
                expected.store(0, Ordering::Release);
                break;
            }
        }
    }
}

/// The batching task: gathers the calls queued (see [`wait_for_calls`]),
/// cuts them into batches ([`Waiting::next_batch`]: claims first, riders
/// boarding where there is room) and sends each (a batch of one as a
/// plain call), [`IN_FLIGHT`] at a time; ends when the queue
/// closes.
async fn send_batches(
    store: Store,
    mut rx: mpsc::UnboundedReceiver<Call>,
    expected: Arc<AtomicUsize>,
) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut waiting = Waiting::default();
    loop {
        if !wait_for_calls(&mut rx, &mut waiting, &expected).await {
            return;
        }
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        while let Ok(call) = rx.try_recv() {
            waiting.take(call);
        }
        let mut batch = waiting.next_batch();
        let store = store.clone();
        tokio::spawn(async move {
            let mut conn = store.conn.clone();
            if batch.len() == 1 {
                let call = batch.remove(0);
                let keys: Vec<&str> = call.keys.iter().map(String::as_str).collect();
                let value = store.run(&mut conn, call.def, &keys, &call.args).await;
                let _ = call.reply.send(value);
            } else {
                let replies = store.run_batch(&mut conn, &batch).await;
                for (call, reply) in batch.into_iter().zip(replies) {
                    let _ = call.reply.send(reply);
                }
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scripts::CLAIM_READY;

    /// A call of `def` with `args` arguments, riding when `rides`.
    fn call(def: &'static ScriptDef, args: usize, rides: bool) -> Call {
        Call {
            def,
            keys: Vec::new(),
            args: vec![Vec::new(); args],
            reply: oneshot::channel().0,
            ride_until: rides.then(Instant::now),
        }
    }

    /// The sizes of `batch`'s calls, claims as positive, outcomes negative.
    fn shape(batch: &[Call]) -> Vec<i64> {
        batch
            .iter()
            .map(|c| {
                let n = c.args.len() as i64;
                if c.is_outcome() {
                    -n
                } else {
                    n
                }
            })
            .collect()
    }

    /// Claims go before the outcomes queued ahead of them, each kind in
    /// its order, and a batch stops at MAX_ARGS arguments.
    #[test]
    fn claims_go_before_outcomes_and_a_batch_stops_at_its_size() {
        let mut waiting = Waiting::default();
        for args in [100, 101, 102] {
            waiting.take(call(&COMPLETE_JOBS, args, false));
        }
        waiting.take(call(&CLAIM_READY, 7, false));
        waiting.take(call(&CLAIM_READY, 8, false));
        assert_eq!(shape(&waiting.next_batch()), [7, 8, -100, -101]);
        assert_eq!(shape(&waiting.next_batch()), [-102]);
        assert!(waiting.to_send.is_empty());
    }

    /// Riders board a batch only when every call to send fits, and only
    /// as many as fit within RIDE_MAX_ARGS, past MAX_ARGS: the others
    /// ride on. A call larger than a batch goes alone.
    #[test]
    fn riders_board_where_there_is_room() {
        let mut waiting = Waiting::default();
        waiting.take(call(&COMPLETE_JOBS, 100, true));
        waiting.take(call(&COMPLETE_JOBS, 100, true));
        waiting.take(call(&CLAIM_READY, 50, false));
        assert_eq!(shape(&waiting.next_batch()), [50, -100, -100]);
        assert!(waiting.riding.is_empty());

        // A light load's window of outcomes: past MAX_ARGS, within
        // RIDE_MAX_ARGS.
        for _ in 0..16 {
            waiting.take(call(&COMPLETE_JOBS, 36, true));
        }
        waiting.take(call(&CLAIM_READY, 72, false));
        assert_eq!(waiting.next_batch().len(), 17, "every rider boards");

        let half = RIDE_MAX_ARGS / 2;
        waiting.take(call(&COMPLETE_JOBS, half, true));
        waiting.take(call(&COMPLETE_JOBS, half, true));
        waiting.take(call(&CLAIM_READY, 50, false));
        assert_eq!(shape(&waiting.next_batch()), [50, -(half as i64)]);
        assert_eq!(waiting.riding.len(), 1, "one rides on");

        waiting.take(call(&CLAIM_READY, MAX_ARGS + 1, false));
        waiting.take(call(&CLAIM_READY, 10, false));
        assert_eq!(shape(&waiting.next_batch()), [MAX_ARGS as i64 + 1]);
        assert_eq!(shape(&waiting.next_batch()), [10, -(half as i64)]);
    }
}
