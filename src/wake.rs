//! Wakeups: how a sleeping carrier or an idle worker learns, within a round
//! trip, that something changed — in this process or in another instance
//! sharing the Redis.
//!
//! Scripts `PUBLISH` to partition p's channel `<ns>:wake:<p>` (see
//! [`crate::store::Keys::partition_wake_channel`]) `d<p>:<ms>` when a job
//! becomes the earliest of its due set and `r<p>` when its ready list goes
//! from empty to non-empty; only the daemon the fleet dealt p to listens
//! there (see [`crate::fleet`]), so a job's wakes reach one daemon however
//! many share the Redis; there too `f<p>:<ms>` when a schedule's next fire
//! time becomes the earliest of its partition. On `<ns>:wake`, which every daemon hears: `x<id>`
//! when a job under a lease was cancelled (a daemon holding it for its host
//! drops it), `h<host>` when a host's breaker state changed. One subscriber
//! task per daemon turns those messages into [`Signals`], and follows the
//! partitions dealt to it (subscribing to a gained partition's channel, then
//! asking for it to be re-read). Pub/sub is fire and
//! forget, so the subscriber pings its connection on a timer (a watchdog: a
//! silently dead connection is detected within seconds), reconnects with
//! backoff, and after every (re)subscribe tells everyone to re-read Redis, so
//! a message lost while disconnected costs one extra check, never a stuck job.

use crate::backoff::Backoff;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

/// How often the subscriber pings its connection.
pub(crate) const WATCHDOG_INTERVAL: Duration = Duration::from_secs(3);
/// How long a ping may take before the connection is considered dead.
pub(crate) const WATCHDOG_TIMEOUT: Duration = Duration::from_secs(2);

/// In-process wake signals, one set per daemon.
pub struct Signals {
    /// Wakes the carrier.
    pub carrier: Notify,
    /// Per partition: the earliest due time someone announced (epoch ms),
    /// `i64::MAX` when none is pending.
    due_hints: Vec<AtomicI64>,
    /// Per partition: wakes that partition's claim loop.
    ready: Vec<Notify>,
    /// Per partition: a ready list started (a tenant's jobs its claim loop
    /// has not seen): a loop waiting for room claims a few at once.
    started: Vec<Notify>,
    /// Per partition: its claim loop waits with room to claim, so a due
    /// promotion can be handed to it (one call promotes and claims).
    claim_idle: Vec<AtomicBool>,
    /// Per partition: its claim loop waits for room with the reserve free,
    /// so a due promotion can be handed to it too (it promotes and claims
    /// a few jobs from the reserve in one call).
    claim_waiting: Vec<AtomicBool>,
    /// Per partition: the last promotion left jobs due (a backlog is being
    /// promoted): its promotions are not handed to a loop waiting for room,
    /// whose reserve is kept for ready lists that start.
    backlog: Vec<AtomicBool>,
    /// Per partition: a promotion handed to the claim loop, not yet taken.
    promotion_asked: Vec<AtomicBool>,
    /// Per partition: the last promotion the claim loop reported came
    /// before its due time (the carrier then waits for the time itself).
    came_early: Vec<AtomicBool>,
    /// Ids of leased jobs cancelled since last taken.
    cancelled: Mutex<Vec<String>>,
    /// Wakes the worker pool when `cancelled` grows.
    pub cancellations: Notify,
    /// Wakes the host-state refresher when a host's breaker state changed.
    pub hosts: Notify,
    /// Wakes the firer (schedules).
    pub firer: Notify,
    /// Tells the outcome recording that a carrier round is claiming now,
    /// so that the outcomes gathered go to Redis with its claims.
    pub round: Notify,
    /// Per partition: the earliest fire time someone announced (epoch ms),
    /// `i64::MAX` when none is pending.
    fire_hints: Vec<AtomicI64>,
}

impl Signals {
    /// Signals for `partitions` partitions.
    pub fn new(partitions: u16) -> Arc<Signals> {
        Arc::new(Signals {
            carrier: Notify::new(),
            due_hints: (0..partitions).map(|_| AtomicI64::new(i64::MAX)).collect(),
            ready: (0..partitions).map(|_| Notify::new()).collect(),
            started: (0..partitions).map(|_| Notify::new()).collect(),
            claim_idle: (0..partitions).map(|_| AtomicBool::new(false)).collect(),
            claim_waiting: (0..partitions).map(|_| AtomicBool::new(false)).collect(),
            backlog: (0..partitions).map(|_| AtomicBool::new(false)).collect(),
            promotion_asked: (0..partitions).map(|_| AtomicBool::new(false)).collect(),
            came_early: (0..partitions).map(|_| AtomicBool::new(false)).collect(),
            cancelled: Mutex::new(Vec::new()),
            cancellations: Notify::new(),
            hosts: Notify::new(),
            firer: Notify::new(),
            round: Notify::new(),
            fire_hints: (0..partitions).map(|_| AtomicI64::new(i64::MAX)).collect(),
        })
    }

    /// Announces that partition `p` has a job due at `due_ms`.
    pub(crate) fn due(&self, p: u16, due_ms: i64) {
        if let Some(hint) = self.due_hints.get(p as usize) {
            hint.fetch_min(due_ms, Ordering::AcqRel);
            self.carrier.notify_one();
        }
    }

    /// Announces that partition `p` has a schedule to fire at `at_ms`.
    pub(crate) fn fire(&self, p: u16, at_ms: i64) {
        if let Some(hint) = self.fire_hints.get(p as usize) {
            hint.fetch_min(at_ms, Ordering::AcqRel);
            self.firer.notify_one();
        }
    }

    /// Takes the pending fire hint of partition `p`.
    pub(crate) fn take_fire_hint(&self, p: u16) -> Option<i64> {
        let hint = self
            .fire_hints
            .get(p as usize)?
            .swap(i64::MAX, Ordering::AcqRel);
        (hint != i64::MAX).then_some(hint)
    }

    /// Takes the pending due hint of partition `p`.
    pub(crate) fn take_due_hint(&self, p: u16) -> Option<i64> {
        let hint = self
            .due_hints
            .get(p as usize)?
            .swap(i64::MAX, Ordering::AcqRel);
        (hint != i64::MAX).then_some(hint)
    }

    /// Announces that partition `p` has ready work.
    pub(crate) fn ready(&self, p: u16) {
        if let Some(n) = self.ready.get(p as usize) {
            n.notify_one();
        }
    }

    /// Announces that a ready list of partition `p` started: wakes its claim
    /// loop, or has it claim at once if it is waiting for room.
    pub(crate) fn list_started(&self, p: u16) {
        self.ready(p);
        if let Some(n) = self.started.get(p as usize) {
            n.notify_one();
        }
    }

    /// The notifier of a started ready list of partition `p`.
    pub(crate) fn started_notify(&self, p: u16) -> Option<&Notify> {
        self.started.get(p as usize)
    }

    /// Partition `p`'s claim loop says whether it waits with room to claim.
    pub(crate) fn set_claim_idle(&self, p: u16, idle: bool) {
        if let Some(flag) = self.claim_idle.get(p as usize) {
            flag.store(idle, Ordering::Release);
        }
    }

    /// Partition `p`'s claim loop says whether it waits for room with the
    /// reserve free.
    pub(crate) fn set_claim_waiting(&self, p: u16, waiting: bool) {
        if let Some(flag) = self.claim_waiting.get(p as usize) {
            flag.store(waiting, Ordering::Release);
        }
    }

    /// Records whether partition `p`'s last promotion left jobs due.
    pub(crate) fn set_backlog(&self, p: u16, backlog: bool) {
        if let Some(flag) = self.backlog.get(p as usize) {
            flag.store(backlog, Ordering::Release);
        }
    }

    /// Hands partition `p`'s due promotion to its claim loop if that waits
    /// with room, or for room with the reserve free and no backlog being
    /// promoted (true: it will promote,
    /// claim and report through [`Signals::promoted`], or give the
    /// promotion back with [`Signals::due`]); false: the caller promotes.
    pub(crate) fn hand_promotion(&self, p: u16) -> bool {
        let flag = |flags: &[AtomicBool]| {
            flags
                .get(p as usize)
                .is_some_and(|f| f.load(Ordering::Acquire))
        };
        let idle = flag(&self.claim_idle);
        let waiting = flag(&self.claim_waiting) && !flag(&self.backlog);
        if !(idle || waiting) {
            return false;
        }
        let Some(asked) = self.promotion_asked.get(p as usize) else {
            return false;
        };
        asked.store(true, Ordering::Release);
        if idle {
            self.ready(p);
        } else if let Some(n) = self.started.get(p as usize) {
            n.notify_one();
        }
        true
    }

    /// Takes a promotion handed to partition `p`'s claim loop.
    pub(crate) fn take_promotion(&self, p: u16) -> bool {
        self.promotion_asked
            .get(p as usize)
            .is_some_and(|f| f.swap(false, Ordering::AcqRel))
    }

    /// The claim loop of partition `p` promoted: work is left from
    /// `next_due` (None: none), and whether it came before that time.
    pub(crate) fn promoted(&self, p: u16, next_due: Option<i64>, came_early: bool) {
        if let Some(flag) = self.came_early.get(p as usize) {
            flag.store(came_early, Ordering::Release);
        }
        if let Some(due) = next_due {
            self.due(p, due);
        }
    }

    /// Takes whether the last promotion the claim loop of `p` reported came
    /// early.
    pub(crate) fn take_came_early(&self, p: u16) -> bool {
        self.came_early
            .get(p as usize)
            .is_some_and(|f| f.swap(false, Ordering::AcqRel))
    }

    /// The notifier of partition `p`'s claim loop.
    pub(crate) fn ready_notify(&self, p: u16) -> Option<&Notify> {
        self.ready.get(p as usize)
    }

    /// Announces that the leased job `id` was cancelled.
    pub(crate) fn cancelled(&self, id: &str) {
        match self.cancelled.lock() {
            Ok(mut ids) => ids.push(id.to_string()),
            Err(poisoned) => poisoned.into_inner().push(id.to_string()),
        }
        self.cancellations.notify_one();
    }

    /// Takes the ids announced cancelled so far.
    pub(crate) fn take_cancelled(&self) -> Vec<String> {
        match self.cancelled.lock() {
            Ok(mut ids) => std::mem::take(&mut *ids),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        }
    }

    /// Tells everyone to re-read Redis (after a reconnect, messages may be lost).
    pub(crate) fn everything(&self) {
        for p in 0..self.ready.len() {
            self.due(p as u16, 0);
            self.ready(p as u16);
            self.fire(p as u16, 0);
        }
        self.hosts.notify_one();
    }

    /// Applies one message of the wake channel.
    pub(crate) fn apply(&self, message: &str) {
        if let Some(rest) = message.strip_prefix('d') {
            if let Some((p, ms)) = rest.split_once(':') {
                if let (Ok(p), Ok(ms)) = (p.parse(), ms.parse()) {
                    self.due(p, ms);
                }
            }
        } else if let Some(rest) = message.strip_prefix('f') {
            if let Some((p, ms)) = rest.split_once(':') {
                if let (Ok(p), Ok(ms)) = (p.parse(), ms.parse()) {
                    self.fire(p, ms);
                }
            }
        } else if let Some(p) = message.strip_prefix('r') {
            if let Ok(p) = p.parse() {
                self.list_started(p);
            }
        } else if let Some(id) = message.strip_prefix('x') {
            self.cancelled(id);
        } else if message.starts_with('h') {
            self.hosts.notify_one();
        }
    }
}

/// The channels a daemon listens on: everyone's, and one per partition
/// (indexed by partition) of which it hears those dealt to it.
pub(crate) struct Channels {
    /// `<ns>:wake`.
    pub common: String,
    /// `<ns>:wake:<p>` for every partition p.
    pub partitions: Vec<String>,
}

impl Channels {
    /// The channels to listen on while `owned` partitions are dealt here.
    fn wanted(&self, owned: &[bool]) -> Vec<String> {
        std::iter::once(self.common.clone())
            .chain(
                self.partitions
                    .iter()
                    .zip(owned)
                    .filter(|(_, o)| **o)
                    .map(|(c, _)| c.clone()),
            )
            .collect()
    }
}

/// Subscribes to the wake channels until `token` is cancelled, reconnecting
/// with backoff and pinging as a watchdog; follows `owned` (the partitions
/// dealt to this daemon). With several `clients` (the seed nodes of a Redis
/// Cluster, where a `PUBLISH` reaches every node) a failed connection moves
/// on to the next one, so a dead node does not stop wakeups.
pub(crate) async fn run_subscriber(
    clients: Vec<redis::Client>,
    channels: Channels,
    mut owned: watch::Receiver<Vec<bool>>,
    signals: Arc<Signals>,
    token: CancellationToken,
) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    let mut next = 0usize;
    loop {
        let Some(client) = clients.get(next % clients.len().max(1)) else {
            return;
        };
        next += 1;
        let wanted = channels.wanted(&owned.borrow_and_update());
        let subscribed = tokio::select! {
            biased;
            _ = token.cancelled() => return,
            r = tokio::time::timeout(crate::store::CONNECT_TIMEOUT, subscribe(client, &wanted)) => r,
        };
        match subscribed {
            Ok(Ok(pubsub)) => {
                backoff.reset();
                tracing::debug!(channels = wanted.len(), "subscribed to wake channels");
                signals.everything();
                if listen(pubsub, &channels, &mut owned, wanted, &signals, &token).await {
                    return;
                }
                tracing::warn!("wake channel connection lost; reconnecting");
            }
            Ok(Err(err)) => tracing::warn!(cause = %err, "cannot subscribe to wake channel"),
            Err(_) => tracing::warn!("subscribing to wake channel timed out"),
        }
        tokio::select! {
            biased;
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(backoff.step()) => {}
        }
    }
}

async fn subscribe(
    client: &redis::Client,
    channels: &[String],
) -> redis::RedisResult<redis::aio::PubSub> {
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(channels).await?;
    Ok(pubsub)
}

/// Relays messages, and follows the partitions dealt here, until the
/// connection fails (false) or `token` is cancelled (true).
async fn listen(
    pubsub: redis::aio::PubSub,
    channels: &Channels,
    owned: &mut watch::Receiver<Vec<bool>>,
    mut subscribed: Vec<String>,
    signals: &Signals,
    token: &CancellationToken,
) -> bool {
    let (mut sink, mut stream) = pubsub.split();
    let mut watchdog = tokio::time::interval(WATCHDOG_INTERVAL);
    watchdog.tick().await;
    // False once the fleet is gone (shutting down): the channels stay.
    let mut following = true;
    loop {
        tokio::select! {
            biased;
            _ = token.cancelled() => return true,
            changed = owned.changed(), if following => {
                if changed.is_err() {
                    following = false;
                    continue;
                }
                let dealt = owned.borrow_and_update().clone();
                let wanted = channels.wanted(&dealt);
                let gone: Vec<&String> = subscribed.iter().filter(|c| !wanted.contains(c)).collect();
                let new: Vec<&String> = wanted.iter().filter(|c| !subscribed.contains(c)).collect();
                if !gone.is_empty() && sink.unsubscribe(&gone).await.is_err() {
                    return false;
                }
                if !new.is_empty() && sink.subscribe(&new).await.is_err() {
                    return false;
                }
                // What was announced for a gained partition before this
                // subscription is read from Redis instead.
                for (p, channel) in channels.partitions.iter().enumerate() {
                    if new.contains(&channel) {
                        signals.due(p as u16, 0);
                        signals.ready(p as u16);
                    }
                }
                subscribed = wanted;
            }
            message = stream.next() => {
                let Some(message) = message else { return false };
                if let Ok(text) = message.get_payload::<String>() {
                    signals.apply(&text);
                }
            }
            _ = watchdog.tick() => {
                let ping = tokio::time::timeout(WATCHDOG_TIMEOUT, sink.ping::<redis::Value>()).await;
                if !matches!(ping, Ok(Ok(_))) {
                    return false;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_become_signals() {
        let s = Signals::new(4);
        s.apply("d2:1700000000000");
        s.apply("d2:1600000000000");
        s.apply("d9:5");
        s.apply("garbage");
        assert_eq!(s.take_due_hint(2), Some(1_600_000_000_000));
        assert_eq!(s.take_due_hint(2), None);
        assert_eq!(s.take_due_hint(9), None);
    }
}
