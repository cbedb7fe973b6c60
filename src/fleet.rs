//! The fleet: the daemons sharing one Redis deal its partitions out among
//! themselves, so that each partition's due jobs are promoted, claimed and
//! recovered by one daemon, and its wake messages reach that daemon only.
//! Without this every daemon ran every partition's scripts for every job,
//! and Redis's work per job grew with the number of daemons.
//!
//! Every daemon beats every [`BEAT`] (`lua/fleet_beat.lua`): its membership
//! in `<ns>:fleet` lasts [`MEMBER_TTL`], and the beat answers the live
//! members. Each daemon computes the same deal from that list by rendezvous
//! hashing (a partition goes to the member whose hash with it is highest),
//! so a member joining or leaving moves only its own share. With more
//! daemons than partitions the extra ones have none: they serve the API
//! and stand by.
//!
//! The deal is advisory. Every script stays atomic and safe when two daemons
//! act on one partition (for a beat, while their lists differ), which costs
//! only duplicate work; a partition nobody has for a beat waits at most
//! that long. A daemon killed with kill -9 drops out when its membership
//! runs out, and the others take its partitions at their next beat: within
//! `MEMBER_TTL + BEAT` (7 s); its attempts in flight come back when their
//! leases expire. A daemon that stops cleanly leaves at once. A daemon that
//! cannot reach Redis keeps its deal (it can do nothing else meanwhile).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::store::{Store, StoreResult};
use crate::wake::Signals;

/// How often a daemon beats (each beat is a round trip to Redis: with 50
/// daemons, 25 a second).
pub const BEAT: Duration = Duration::from_secs(2);
/// How long a membership lasts without a beat.
pub const MEMBER_TTL: Duration = Duration::from_secs(5);

/// This daemon's place in the fleet: its id and the partitions it has.
pub struct Fleet {
    id: String,
    owned: watch::Sender<Vec<bool>>,
}

impl Fleet {
    /// A member with a fresh id that has all `partitions` until its first
    /// beat says otherwise (alone, it keeps them).
    pub fn new(partitions: u16) -> Arc<Fleet> {
        let (owned, _) = watch::channel(vec![true; partitions as usize]);
        Arc::new(Fleet {
            id: ulid::Ulid::new().to_string(),
            owned,
        })
    }

    /// Whether this daemon has partition `p`.
    pub(crate) fn owns(&self, p: u16) -> bool {
        self.owned
            .borrow()
            .get(p as usize)
            .copied()
            .unwrap_or(false)
    }

    /// The partitions this daemon has, as they change.
    pub(crate) fn watch(&self) -> watch::Receiver<Vec<bool>> {
        self.owned.subscribe()
    }

    /// Beats once and applies the deal: partitions gained are re-read
    /// (their due and ready work may have waited for an owner).
    pub(crate) async fn beat(&self, store: &Store, signals: &Signals) -> StoreResult<()> {
        let members = store.fleet_beat(&self.id, MEMBER_TTL).await?;
        let partitions = store.keys().partitions();
        let dealt = deal(&members, &self.id, partitions);
        let before = self.owned.borrow().clone();
        if dealt == before {
            return Ok(());
        }
        let gained: Vec<u16> = (0..partitions)
            .filter(|&p| dealt[p as usize] && !before[p as usize])
            .collect();
        tracing::info!(
            daemons = members.len(),
            partitions = dealt.iter().filter(|o| **o).count(),
            "the fleet changed; partitions dealt anew"
        );
        self.owned.send_replace(dealt);
        for p in gained {
            signals.due(p, 0);
            signals.ready(p);
        }
        Ok(())
    }

    /// Beats every [`BEAT`] until `token` is cancelled, then leaves.
    pub(crate) async fn run(
        self: Arc<Self>,
        store: Store,
        signals: Arc<Signals>,
        token: CancellationToken,
    ) {
        loop {
            if let Err(err) = self.beat(&store, &signals).await {
                metrics::counter!("hookq_redis_errors_total", "component" => "fleet").increment(1);
                tracing::warn!(cause = %err, "fleet heartbeat failed; keeping the partitions dealt");
            }
            tokio::select! {
                biased;
                _ = token.cancelled() => break,
                _ = tokio::time::sleep(BEAT) => {}
            }
        }
        if let Err(err) = store.fleet_beat(&self.id, Duration::ZERO).await {
            tracing::warn!(cause = %err, "could not leave the fleet; the others wait for the membership to run out");
        }
    }
}

/// Which of `partitions` member `me` has among `members` (sorted or not):
/// each goes to the member with the highest [`affinity`]. A `me` missing
/// from `members` (its membership ran out) gets none; with no members at
/// all, `me` keeps every partition.
pub(crate) fn deal(members: &[String], me: &str, partitions: u16) -> Vec<bool> {
    if members.is_empty() {
        return vec![true; partitions as usize];
    }
    (0..partitions)
        .map(|p| {
            members
                .iter()
                .max_by_key(|m| (affinity(m, p), m.as_str()))
                .is_some_and(|owner| owner == me)
        })
        .collect()
}

/// The rendezvous score of `member` for partition `p`: FNV-1a over the id
/// and the partition, then murmur3's 64-bit finaliser (the same on every
/// build, so daemons of different versions agree).
pub(crate) fn affinity(member: &str, p: u16) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in member.bytes().chain(p.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("daemon-{i:02}")).collect()
    }

    #[test]
    fn every_partition_has_exactly_one_owner() {
        for n in [1, 2, 5, 16, 20, 50] {
            let all = members(n);
            let mut owners = vec![0; 16];
            for m in &all {
                for (p, owned) in deal(&all, m, 16).into_iter().enumerate() {
                    owners[p] += usize::from(owned);
                }
            }
            assert_eq!(owners, vec![1; 16], "{n} daemons");
        }
    }

    #[test]
    fn the_deal_is_spread_and_moves_little_when_one_joins() {
        let five = members(5);
        let most = five
            .iter()
            .map(|m| deal(&five, m, 64).into_iter().filter(|o| *o).count())
            .max()
            .unwrap_or(0);
        assert!(
            most <= 24,
            "one of five daemons has {most} of 64 partitions"
        );
        let six = members(6);
        let moved = (0..64u16)
            .filter(|&p| {
                let owner = |all: &[String]| {
                    all.iter()
                        .position(|m| deal(all, m, 64)[p as usize])
                        .unwrap_or(usize::MAX)
                };
                owner(&five) != owner(&six)
            })
            .count();
        // Only what the newcomer takes moves (about a sixth).
        assert!(moved > 0 && moved <= 24, "{moved} of 64 partitions moved");
    }

    #[test]
    fn a_lapsed_member_has_nothing_and_an_empty_fleet_keeps_all() {
        assert_eq!(deal(&members(3), "someone-else", 4), vec![false; 4]);
        assert_eq!(deal(&[], "me", 4), vec![true; 4]);
    }
}
