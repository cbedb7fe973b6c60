//! The counts of `GET /v1/stats`: per partition, the sizes of the `due`
//! zset, the ready list, the lease zset and the dead stream, the jobs held
//! for a host or behind their ordering key, and the delivery counters.

use std::collections::HashMap;

use serde::Serialize;

use crate::store::{Store, StoreResult};

/// Counts of `GET /v1/stats`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Jobs waiting for their due time (including between retries), and
    /// those held for an open or paused host.
    pub scheduled: u64,
    /// Of `scheduled`, the jobs held (parked) for an open or paused host.
    pub held_for_host: u64,
    /// Of `scheduled`: jobs held behind earlier jobs of their ordering key.
    pub held_in_order: u64,
    /// Ids in ready lists (may include ids of jobs cancelled while queued).
    pub ready: u64,
    /// Attempts under a lease.
    pub inflight: u64,
    /// Dead letters in the streams.
    pub dead: u64,
    /// How long the oldest ready job has been due, ms (0 when none).
    pub oldest_ready_lag_ms: i64,
    /// Attempts that got a 2xx.
    pub delivered: u64,
    /// Attempts that failed.
    pub failed_attempts: u64,
    /// Jobs dead-lettered.
    pub dead_lettered: u64,
    /// Jobs cancelled (by the API, the CLI or the console).
    pub cancelled: u64,
    /// Attempts whose lease expired (daemon died or hung).
    pub expired_leases: u64,
    /// The same counts per partition, in partition order.
    pub partitions: Vec<PartitionStats>,
}

/// The counts of one partition in `GET /v1/stats`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PartitionStats {
    /// Partition number.
    pub partition: u16,
    /// Jobs waiting for their due time, held ones included. (On a single
    /// Redis the jobs of every partition's due sets, which are shared,
    /// count under partition 0; the others count their jobs waiting far
    /// ahead in the timing wheel and those held.)
    pub scheduled: u64,
    /// Ids in the ready list.
    pub ready: u64,
    /// Attempts under a lease.
    pub inflight: u64,
    /// Dead letters in the partition's stream.
    pub dead: u64,
    /// Attempts that got a 2xx.
    pub delivered: u64,
}

impl Store {
    /// Counts per state and the delivery counters, over all partitions.
    pub async fn stats(&self) -> StoreResult<Stats> {
        let mut conn = self.conn.clone();
        let mut stats = Stats::default();
        let now = self.redis_time_ms().await?;
        // The live round leases' entries, by round space (one for every
        // partition on a single Redis): their jobs are in flight too (see
        // "Round leases" in `lua/prelude.lua`).
        let mut rounds: HashMap<String, Vec<String>> = HashMap::new();
        for p in 0..self.keys.partitions() {
            #[allow(clippy::type_complexity)]
            let (
                mut due,
                mut ready,
                mut inflight,
                dead,
                counters,
                head,
                parked_hosts,
                tenants,
                due_tenants,
            ): (
                u64,
                u64,
                u64,
                u64,
                HashMap<String, u64>,
                Option<String>,
                Vec<String>,
                Vec<String>,
                Vec<String>,
            ) = redis::pipe()
                .zcard(self.keys.due(p))
                .llen(self.keys.ready(p))
                .zcard(self.keys.inflight(p))
                .xlen(self.keys.dead(p))
                .hgetall(self.keys.stats(p))
                .lindex(self.keys.ready(p), 0)
                .smembers(self.keys.parked_hosts(p))
                .smembers(self.keys.tenants(p))
                .zrange(self.keys.due_tenants(p), 0, -1)
                .query_async(&mut conn)
                .await?;
            let space = self.keys.round_jobs(p);
            if !rounds.contains_key(&space) {
                let entries: Vec<String> = redis::cmd("HVALS")
                    .arg(&space)
                    .query_async(&mut conn)
                    .await?;
                rounds.insert(space.clone(), entries);
            }
            if let Some(entries) = rounds.get(&space) {
                inflight += self.round_ids(p, entries).len() as u64;
            }
            // Shared timers (a single Redis): every partition's due set is
            // partition 0's, counted there once.
            if self.keys.timer_partition(p) != p {
                due = 0;
            }
            // Other tenants' due sets (see `lua/prelude.lua`).
            if !due_tenants.is_empty() && self.keys.timer_partition(p) == p {
                let mut pipe = redis::pipe();
                for tenant in &due_tenants {
                    pipe.zcard(self.keys.tenant_due(p, tenant));
                }
                let sizes: Vec<u64> = pipe.query_async(&mut conn).await?;
                due += sizes.iter().sum::<u64>();
            }
            // Other tenants' ready lists (see `lua/prelude.lua`): counted,
            // and their heads are candidates for the oldest ready job.
            let mut heads: Vec<String> = head.into_iter().collect();
            if !tenants.is_empty() {
                let mut pipe = redis::pipe();
                for tenant in &tenants {
                    let key = self.keys.tenant_ready(p, tenant);
                    pipe.llen(&key).lindex(&key, 0);
                }
                let lists: Vec<(u64, Option<String>)> = pipe.query_async(&mut conn).await?;
                for (len, head) in lists {
                    ready += len;
                    heads.extend(head);
                }
            }
            let mut held_here = 0;
            for host in parked_hosts {
                let held: u64 = redis::cmd("ZCARD")
                    .arg(self.keys.park(p, &host))
                    .query_async(&mut conn)
                    .await?;
                held_here += held;
            }
            let counter = |name: &str| counters.get(name).copied().unwrap_or_default();
            // Jobs waiting in the timing wheel, or held behind earlier jobs
            // of their ordering key, are scheduled too.
            let scheduled = due + counter("wheel") + held_here + counter("held");
            stats.held_for_host += held_here;
            stats.held_in_order += counter("held");
            stats.scheduled += scheduled;
            stats.ready += ready;
            stats.inflight += inflight;
            stats.dead += dead;
            stats.partitions.push(PartitionStats {
                partition: p,
                scheduled,
                ready,
                inflight,
                dead,
                delivered: counter("delivered"),
            });
            stats.delivered += counter("delivered");
            stats.failed_attempts += counter("failed_attempts");
            stats.dead_lettered += counter("dead_lettered");
            stats.cancelled += counter("cancelled");
            stats.expired_leases += counter("expired_leases");
            for id in heads {
                if let Some(header) = self.record_header(p, &id).await? {
                    stats.oldest_ready_lag_ms = stats.oldest_ready_lag_ms.max(now - header.due);
                }
            }
        }
        Ok(stats)
    }
}
