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
//! One task sends the batches, at most [`IN_FLIGHT`] at a time: while they
//! run, the next one gathers, so under load batches grow instead of
//! queueing. A batch carries at most [`MAX_ARGS`] arguments, so that no
//! single `FCALL` holds Redis for long.

use std::sync::Arc;

use redis::Value;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::connection::{decode, function_missing};
use super::scripts::{Runner, ScriptDef, BATCHED};
use super::{RedisConn, Store, StoreError, StoreResult};

/// How many times the task lets the other tasks run before it sends what
/// it has: the loops woken by one round make their calls meanwhile.
const GATHER_YIELDS: usize = 3;
/// Batches in flight at once.
const IN_FLIGHT: usize = 2;
/// Most arguments (all calls' ARGV together) one batch carries; a call
/// larger than that goes alone.
const MAX_ARGS: usize = 2048;

/// One call waiting for its batch.
struct Call {
    def: &'static ScriptDef,
    keys: Vec<String>,
    args: Vec<Vec<u8>>,
    reply: oneshot::Sender<StoreResult<Value>>,
}

/// The queue of a store's batched calls (see the module doc).
pub(crate) struct Batcher {
    queue: mpsc::UnboundedSender<Call>,
}

impl Batcher {
    /// Starts the task sending `store`'s batches (a store without a
    /// batcher of its own, so the task ends with the last handle).
    pub(crate) fn start(store: Store) -> Batcher {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(send_batches(store, rx));
        Batcher { queue }
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

    /// Runs script `def` (one of [`BATCHED`]) with `keys` and `args`, in a
    /// batch with the calls made at the same moment when this store batches
    /// (else alone, as [`Store::invoke`] does); decodes its reply.
    pub(super) async fn invoke_batched<T: redis::FromRedisValue>(
        &self,
        def: &'static ScriptDef,
        keys: &[&str],
        args: Vec<Vec<u8>>,
    ) -> StoreResult<T> {
        let batched = BATCHED.iter().any(|b| b.name == def.name);
        let batcher = match &self.batcher {
            Some(b) if batched && self.scripts.runner() == Runner::Functions => b,
            _ => return self.invoke(def, keys, &args).await,
        };
        Store::check_inputs(def, keys, &args)?;
        let (reply, answer) = oneshot::channel();
        let call = Call {
            def,
            keys: keys.iter().map(|k| k.to_string()).collect(),
            args,
            reply,
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
            Ok(Value::Array(replies)) if replies.len() == calls.len() => calls
                .iter()
                .zip(replies)
                .map(|(c, r)| one(c.def, r))
                .collect(),
            Ok(other) => shared_error(
                calls.len(),
                StoreError::reply(
                    "batch",
                    format!("expected {} replies, got {other:?}", calls.len()),
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

/// One call's part of a batch's reply: `{1, reply}` or `{0, error}`.
fn one(def: &ScriptDef, part: Value) -> StoreResult<Value> {
    let Value::Array(mut parts) = part else {
        return Err(StoreError::reply(
            def.name,
            format!("batched reply {part:?}"),
        ));
    };
    let reply = if parts.len() > 1 { parts.pop() } else { None };
    match (parts.first(), reply) {
        (Some(Value::Int(1)), reply) => Ok(reply.unwrap_or(Value::Nil)),
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

/// The batching task: takes every call queued, cuts it into batches of at
/// most [`MAX_ARGS`] arguments and sends each (a batch of one as a plain
/// call), at most [`IN_FLIGHT`] at a time; ends when the queue closes.
async fn send_batches(store: Store, mut rx: mpsc::UnboundedReceiver<Call>) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut queued = Vec::new();
    loop {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        if queued.is_empty() {
            if rx.recv_many(&mut queued, 1024).await == 0 {
                return;
            }
            // Calls made at this same moment (other loops woken together)
            // join.
            for _ in 0..GATHER_YIELDS {
                tokio::task::yield_now().await;
            }
        }
        while let Ok(call) = rx.try_recv() {
            queued.push(call);
        }
        // The first calls, up to MAX_ARGS arguments (at least one call).
        let mut args = 0;
        let cut = queued
            .iter()
            .position(|c| {
                args += c.args.len();
                args > MAX_ARGS
            })
            .unwrap_or(queued.len())
            .max(1);
        let mut batch: Vec<Call> = queued.drain(..cut).collect();
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
