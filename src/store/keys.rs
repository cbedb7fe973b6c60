//! Every Redis key name hookq uses, built in one place.
//!
//! Keys are grouped into `redis.partitions` partitions; all keys of partition
//! `p` share the hash tag `{p}`, so each Lua script (which only touches one
//! partition) runs on one Redis Cluster slot, while the partitions spread over
//! the cluster's shards. A job's partition is a stable hash of its id.
//!
//! The timers (due sets and the timing wheel) are the exception on a single
//! Redis: every partition's are one set under `<ns>:{0}:t:` ("shared timers", see
//! `lua/prelude.lua`), so that a round of promotion is one call whatever
//! the partitions its jobs live in. In a cluster each partition keeps its
//! own.

/// Record hashes per partition (the prelude's `JOB_SHARDS`).
pub const JOB_SHARDS: u32 = 64;

/// The record hash of job `id` (the prelude's `job_shard`): a polynomial of
/// its last four bytes, where ids differ most.
pub(crate) fn job_shard_of(id: &str) -> u32 {
    let bytes = id.as_bytes();
    bytes[bytes.len().saturating_sub(4)..]
        .iter()
        .fold(0u32, |h, b| h * 31 + u32::from(*b))
        % JOB_SHARDS
}

/// Builds key names for one namespace.
#[derive(Debug, Clone)]
pub struct Keys {
    namespace: String,
    partitions: u16,
    /// Whether every partition's timers are partition 0's (a single Redis).
    shared_timers: bool,
}

impl Keys {
    /// Key names under `namespace` on a single Redis, spread over
    /// `partitions` partitions, with shared timers.
    pub fn new(namespace: &str, partitions: u16) -> Self {
        Keys {
            namespace: namespace.to_string(),
            partitions: partitions.max(1),
            shared_timers: true,
        }
    }

    /// Key names under `namespace` on a Redis Cluster: each partition has
    /// timers of its own (a script stays on one slot).
    pub fn in_cluster(namespace: &str, partitions: u16) -> Self {
        Keys {
            shared_timers: false,
            ..Keys::new(namespace, partitions)
        }
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Number of partitions.
    pub fn partitions(&self) -> u16 {
        self.partitions
    }

    /// Whether every partition's timers are partition 0's (a single Redis).
    pub fn shared_timers(&self) -> bool {
        self.shared_timers
    }

    /// The partition whose timers (due sets, wheel) hold partition `p`'s
    /// scheduled jobs: 0 with shared timers, else `p` itself.
    pub fn timer_partition(&self, p: u16) -> u16 {
        if self.shared_timers {
            0
        } else {
            p
        }
    }

    /// The partitions that have timers of their own: partition 0 alone
    /// with shared timers, else every one. (Readers of the due sets and
    /// the wheel read each once.)
    pub fn timer_partitions(&self) -> std::ops::Range<u16> {
        if self.shared_timers {
            0..1
        } else {
            0..self.partitions
        }
    }

    /// The partition holding job `id` (FNV-1a of the id, modulo partitions).
    pub fn partition_of(&self, id: &str) -> u16 {
        let mut hash: u32 = 0x811c_9dc5;
        for b in id.bytes() {
            hash ^= u32::from(b);
            hash = hash.wrapping_mul(0x0100_0193);
        }
        (hash % u32::from(self.partitions)) as u16
    }

    fn prefix(&self, p: u16) -> String {
        format!("{}:{{{}}}:", self.namespace, p)
    }

    /// The partition holding the jobs of ordering list `order`
    /// (`<topic>:<ordering key>`, see [`crate::job::JobSpec::ordering_list`]):
    /// they must share one so that each step on them is one script.
    pub fn order_partition(&self, order: &str) -> u16 {
        self.partition_of(order)
    }

    /// LIST `<ns>:{p}:order:<line>`, the line `<topic>:<ordering key>` in
    /// the default tenant and `<tenant>/<topic>:<ordering key>` in another
    /// ([`crate::tenant::order_line`]): the ids of the ordering
    /// line's unfinished jobs in creation order; only the head is
    /// scheduled, ready or in flight, the others are held (see
    /// `lua/prelude.lua`).
    pub(crate) fn order_list(&self, p: u16, order: &str) -> String {
        format!("{}order:{order}", self.prefix(p))
    }

    /// ZSET `<ns>:{p}:placed`: ids of partition `p` whose job lives in
    /// another partition (an ordered job lives with its ordering key), each
    /// with a pointer `@<partition>` in place of its live record; scored by
    /// when the daemon checks that the job still exists there.
    pub fn placed(&self, p: u16) -> String {
        format!("{}placed", self.prefix(p))
    }

    /// HASH `<ns>:{p}:sched:<id>`: schedule `id` (its content, template,
    /// next fire time, last runs; see `lua/put_schedule.lua`), in the
    /// partition of its id.
    pub fn schedule(&self, p: u16, id: &str) -> String {
        format!("{}sched:{id}", self.prefix(p))
    }

    /// ZSET `<ns>:{p}:fires`: the active schedules of partition `p`,
    /// scored by their next fire time.
    pub fn fires(&self, p: u16) -> String {
        format!("{}fires", self.prefix(p))
    }

    /// ZSET `<ns>:{p}:schedules`: every schedule of partition `p` (score
    /// 0, so ordered by id for paging).
    pub(crate) fn schedules(&self, p: u16) -> String {
        format!("{}schedules", self.prefix(p))
    }

    /// `<ns>:{p}:`, the start of every key of partition `p`.
    pub(crate) fn partition_prefix(&self, p: u16) -> String {
        self.prefix(p)
    }

    /// STRING `<ns>:{p}:job:<id>`: a finished job's record kept whole (dead,
    /// or `retention.keep_bodies`), expiring after the retention period: a
    /// fixed binary header (state, times, attempts = fencing token, due-set
    /// sequence, lease) followed by the spec JSON; see [`super::record`].
    pub fn job(&self, p: u16, id: &str) -> String {
        format!("{}job:{id}", self.prefix(p))
    }

    /// HASH `<ns>:{p}:jobs:<shard>`: live job records (scheduled, ready, in
    /// flight), id -> header and spec (see `lua/prelude.lua`); the one that
    /// holds job `id`.
    pub fn live_records(&self, p: u16, id: &str) -> String {
        self.live_shard(p, job_shard_of(id))
    }

    /// The record hash `shard` (0..[`JOB_SHARDS`]) of partition `p`.
    pub fn live_shard(&self, p: u16, shard: u32) -> String {
        format!("{}jobs:{shard}", self.prefix(p))
    }

    /// Prefix of kept (finished, whole) job records in partition `p`
    /// (scripts append the id; they derive the partition's other keys from it).
    pub(crate) fn job_prefix(&self, p: u16) -> String {
        format!("{}job:", self.prefix(p))
    }

    /// LIST `<ns>:{p}:hist:<id>`: attempt records (JSON), newest first, at most 20.
    pub fn history(&self, p: u16, id: &str) -> String {
        format!("{}hist:{id}", self.prefix(p))
    }

    /// Prefix of history lists in partition `p` (scripts append the id).
    pub(crate) fn history_prefix(&self, p: u16) -> String {
        format!("{}hist:", self.prefix(p))
    }

    /// The prefix of partition `p`'s timers: `<ns>:{p}:`, or with shared
    /// timers `<ns>:{0}:t:` for every partition.
    fn timers_prefix(&self, p: u16) -> String {
        if self.shared_timers {
            format!("{}t:", self.prefix(0))
        } else {
            self.prefix(p)
        }
    }

    /// ZSET `<ns>:{p}:due` (shared timers: `<ns>:{0}:t:due`): the default
    /// tenant's scheduled jobs, score = due epoch ms, member = 12 hex
    /// digits of enqueue sequence, with shared timers 4 hex digits of the
    /// job's partition (its tag), then the id.
    pub fn due(&self, p: u16) -> String {
        format!("{}due", self.timers_prefix(p))
    }

    /// ZSET `<ns>:{p}:due:<tenant>`: the scheduled jobs of a tenant other
    /// than `default`, like [`Keys::due`].
    pub fn tenant_due(&self, p: u16, tenant: &str) -> String {
        format!("{}due:{tenant}", self.timers_prefix(p))
    }

    /// ZSET `<ns>:{p}:due-tenants`: the tenants other than `default` whose
    /// due set in partition `p` may hold jobs, scored at most by its
    /// earliest due time (see `lua/prelude.lua`), like [`Keys::due`].
    pub fn due_tenants(&self, p: u16) -> String {
        format!("{}due-tenants", self.timers_prefix(p))
    }

    /// ZSET `<ns>:{p}:wheel`: the timing wheel's buckets of partition `p`,
    /// member `<level>:<start ms>`, score = when the bucket opens. Each
    /// bucket is a LIST `<ns>:{p}:wheel:<level>:<start ms>` of ids of jobs
    /// due far ahead (see `lua/prelude.lua`). Like [`Keys::due`].
    pub fn wheel(&self, p: u16) -> String {
        format!("{}wheel", self.timers_prefix(p))
    }

    /// A due member's text: 12 hex digits of `seq`, then
    /// [`Keys::wheel_entry`] (as `due_member` in `lua/prelude.lua`).
    pub fn due_member(&self, p: u16, seq: u64, id: &str) -> String {
        format!("{seq:012x}{}", self.wheel_entry(p, id))
    }

    /// A wheel bucket's entry for job `id` of partition `p`: with shared
    /// timers the partition's tag (4 hex digits) then the id, else the id
    /// (as `wheel_entry` in `lua/prelude.lua`).
    pub fn wheel_entry(&self, p: u16, id: &str) -> String {
        if self.shared_timers {
            format!("{p:04x}{id}")
        } else {
            id.to_string()
        }
    }

    /// LIST `<ns>:{p}:ready`: ids of due jobs waiting for a worker, oldest first.
    pub fn ready(&self, p: u16) -> String {
        format!("{}ready", self.prefix(p))
    }

    /// LIST `<ns>:{p}:ready:<tenant>`: the ready list of a tenant other
    /// than `default` (whose jobs' ids are `<tenant>/<id>`).
    pub fn tenant_ready(&self, p: u16, tenant: &str) -> String {
        format!("{}ready:{tenant}", self.prefix(p))
    }

    /// SET `<ns>:{p}:tenants`: the tenants other than `default` whose ready
    /// list in partition `p` may hold ids (see `lua/prelude.lua`).
    pub fn tenants(&self, p: u16) -> String {
        format!("{}tenants", self.prefix(p))
    }

    /// STRING `<ns>:{p}:turn`: where partition `p`'s fair share between
    /// tenants is in its cycle (see `lua/claim_ready.lua`).
    pub fn turn(&self, p: u16) -> String {
        format!("{}turn", self.prefix(p))
    }

    /// ZSET `<ns>:{p}:inflight`: ids of jobs under a lease, score = lease deadline ms.
    pub fn inflight(&self, p: u16) -> String {
        format!("{}inflight", self.prefix(p))
    }

    /// ZSET `<ns>:{p}:rounds` (shared timers: `<ns>:{0}:t:rounds`, for
    /// every partition): the live round leases' tokens, score = deadline
    /// ms (see "Round leases" in `lua/prelude.lua`).
    pub fn rounds(&self, p: u16) -> String {
        format!("{}rounds", self.timers_prefix(p))
    }

    /// HASH `<ns>:{p}:round` (shared timers: `<ns>:{0}:t:round`): per
    /// live round's token its jobs' [`Keys::wheel_entry`]s, each between
    /// spaces, and under `<token>#` how many of them have not ended; under
    /// `next` the count of rounds made (a token's second part).
    pub fn round_jobs(&self, p: u16) -> String {
        format!("{}round", self.timers_prefix(p))
    }

    /// STREAM `<ns>:{p}:dead`: dead letters (`id`, `topic`, `attempts`,
    /// `last_error`, `last_status`, `job`, `dead_at`).
    pub fn dead(&self, p: u16) -> String {
        format!("{}dead", self.prefix(p))
    }

    /// HASH `<ns>:{p}:dead:ids`: job id -> the stream entry id of its newest
    /// dead letter (and `~complete` once older entries are indexed).
    pub fn dead_index(&self, p: u16) -> String {
        format!("{}dead:ids", self.prefix(p))
    }

    /// HASH `<ns>:{p}:stats`: delivery counters (`delivered`,
    /// `failed_attempts`, `dead_lettered`, `expired_leases`).
    pub fn stats(&self, p: u16) -> String {
        format!("{}stats", self.prefix(p))
    }

    /// HASH `<ns>:{p}:ledger`: the tenants' ledger of partition `p`,
    /// `<tenant>:<counter>` -> jobs (`created`, `replayed`, `delivered`,
    /// `dead_lettered`, `cancelled`), each counted by the script making the
    /// change; `~seeded` once the jobs live before the ledger are counted
    /// (see `lua/prelude.lua`, `lua/seed_ledger.lua`).
    pub fn ledger(&self, p: u16) -> String {
        format!("{}ledger", self.prefix(p))
    }

    /// HASH `<ns>:{p}:done`: the index of finished-job summary buckets,
    /// `<start ms>` -> `<shards>:<count>:<expires ms>` (see `lua/prelude.lua`).
    pub(crate) fn done(&self, p: u16) -> String {
        format!("{}done", self.prefix(p))
    }

    /// HASH `<ns>:{p}:done:<bucket>:<shard>`: summaries, id -> packed summary.
    pub fn done_shard(&self, p: u16, bucket: &str, shard: u32) -> String {
        format!("{}done:{bucket}:{shard}", self.prefix(p))
    }

    /// STRING `<ns>:{p}:seq`: enqueue sequence counter of the due set.
    pub fn seq(&self, p: u16) -> String {
        format!("{}seq", self.prefix(p))
    }

    /// HASH `<ns>:{hosts}:host:<host>`: a host's breaker record (`state`
    /// closed|open|half_open|paused, `fails` consecutive failures,
    /// `opened_at`, `open_for`, `next_probe_at` (probe time, or a pause's end;
    /// 0 = none), `probe_until`, `reason`, `ut`). Every host record shares
    /// the hash tag `{hosts}` with the two sets below, so one script updates
    /// a record and its set entries atomically.
    pub(crate) fn host(&self, host: &str) -> String {
        format!("{}:{{hosts}}:host:{host}", self.namespace)
    }

    /// ZSET `<ns>:{hosts}:blocked`: hosts some daemon must act on (open,
    /// half-open, paused, or closed with parked jobs to drain), score = when.
    pub(crate) fn hosts_blocked(&self) -> String {
        format!("{}:{{hosts}}:blocked", self.namespace)
    }

    /// ZSET `<ns>:{hosts}:known`: hosts with a breaker record, score = last change.
    pub(crate) fn hosts_known(&self) -> String {
        format!("{}:{{hosts}}:known", self.namespace)
    }

    /// ZSET `<ns>:{p}:park:<host>`: jobs held for their host while it is
    /// open or paused, member = 12 hex digits of parking sequence followed
    /// by the id (as in the due set), score = due ms.
    pub fn park(&self, p: u16, host: &str) -> String {
        format!("{}park:{host}", self.prefix(p))
    }

    /// SET `<ns>:{p}:parked`: hosts with jobs parked in partition p.
    pub fn parked_hosts(&self, p: u16) -> String {
        format!("{}parked", self.prefix(p))
    }

    /// HASH `<ns>:rate:{<host>}`: the host's shared request budget of the
    /// current rate window (`w` window number, `n` requests taken).
    pub(crate) fn rate(&self, host: &str) -> String {
        format!("{}:rate:{{{host}}}", self.namespace)
    }

    /// HASH `<ns>:tenant-rate:{<tenant>}`: the tenant's shared create
    /// budget of the current rate window (`w` window number, `n` creates
    /// taken; see `lua/take_rate.lua`).
    pub(crate) fn tenant_rate(&self, tenant: &str) -> String {
        format!("{}:tenant-rate:{{{tenant}}}", self.namespace)
    }

    /// STRING `<ns>:schema`: the layout version of this namespace's data
    /// (`5`; `<from>>5` while a migration runs or after one was interrupted).
    pub(crate) fn schema(&self) -> String {
        format!("{}:schema", self.namespace)
    }

    /// STRING `<ns>:partitions`: how many partitions this namespace's data
    /// is spread over (`redis.partitions` of the first daemon or command
    /// that used it; see [`Store::check_schema`](super::Store::check_schema)).
    pub(crate) fn partition_count(&self) -> String {
        format!("{}:partitions", self.namespace)
    }

    /// Pub/sub channel `<ns>:wake`, for every daemon: `x<id>` when a leased
    /// job was cancelled, `h<host>` when a host's breaker state changed.
    pub(crate) fn wake_channel(&self) -> String {
        format!("{}:wake", self.namespace)
    }

    /// Pub/sub channel `<ns>:wake:<p>`, for the daemon that has partition
    /// `p` (see [`crate::fleet`]): `d<p>:<ms>` when a job becomes the
    /// earliest of its due set, `r<p>` when its ready list stops being empty.
    pub(crate) fn partition_wake_channel(&self, p: u16) -> String {
        format!("{}:wake:{p}", self.namespace)
    }

    /// Sorted set `<ns>:fleet`: the live daemons sharing the partitions,
    /// each scored by when its membership runs out.
    pub(crate) fn fleet(&self) -> String {
        format!("{}:fleet", self.namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_carry_the_partition_hash_tag() {
        let k = Keys::in_cluster("hq", 16);
        let p = k.partition_of("order-1");
        assert!(p < 16);
        let tag = format!("{{{p}}}");
        for key in [
            k.job(p, "order-1"),
            k.due(p),
            k.ready(p),
            k.inflight(p),
            k.rounds(p),
            k.round_jobs(p),
            k.dead(p),
            k.dead_index(p),
            k.seq(p),
            k.history(p, "order-1"),
            k.order_list(p, "t:key-1"),
            k.placed(p),
        ] {
            assert!(key.starts_with("hq:"), "{key}");
            assert!(key.contains(&tag), "{key}");
        }
        assert_eq!(k.job(3, "x"), "hq:{3}:job:x");
        assert!(k.job(p, "order-1").starts_with(&k.job_prefix(p)));
    }

    /// On a single Redis every partition's timers are partition 0's; the
    /// rest stays the partition's own.
    #[test]
    fn a_single_redis_shares_partition_zeros_timers() {
        let k = Keys::new("hq", 16);
        assert_eq!(k.due(5), "hq:{0}:t:due");
        assert_eq!(k.tenant_due(5, "acme"), "hq:{0}:t:due:acme");
        assert_eq!(k.due_tenants(5), "hq:{0}:t:due-tenants");
        assert_eq!(k.wheel(5), "hq:{0}:t:wheel");
        assert_eq!(k.due_member(5, 26, "x"), "00000000001a0005x");
        assert_eq!(k.ready(5), "hq:{5}:ready");
        assert_eq!(k.inflight(5), "hq:{5}:inflight");
        assert_eq!(k.timer_partitions(), 0..1);
        let c = Keys::in_cluster("hq", 16);
        assert_eq!(c.due(5), "hq:{5}:due");
        assert_eq!(c.wheel(5), "hq:{5}:wheel");
        assert_eq!(c.timer_partitions(), 0..16);
    }

    #[test]
    fn partitions_are_stable_and_spread() {
        let k = Keys::new("hq", 16);
        assert_eq!(k.partition_of("abc"), k.partition_of("abc"));
        let mut seen = [0u32; 16];
        for i in 0..16_000 {
            seen[k.partition_of(&format!("job-{i}")) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 500), "{seen:?}");
    }
}
