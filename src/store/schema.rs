//! The layout version of a namespace's data (`<ns>:schema`) and the one
//! migration between layouts (`hookq migrate`).
//!
//! Layout 1 kept each job in a many-field hash; layout 2 in one string per
//! job (see [`super::record`]); layout 3 keeps a live job's record as a
//! field of one of its partition's record hashes and only finished records
//! kept whole as strings. Layout 4 keeps layout 3's records, but a claim
//! no longer writes a job's record: its lease alone says it is in flight
//! (see "In flight" in `lua/prelude.lua`), which the scripts of layout 3
//! would misread (a daemon of layout 3 taking back an expired lease of
//! layout 4 would drop its job), so the two must not run together.
//!
//! A daemon meets the version at start: on a Redis with no hookq data it
//! writes its own; on older data it refuses to start and names `hookq
//! migrate`, which (with every daemon stopped) converts every record of
//! layouts 1 and 2 in place, one batch per script call, and takes layout 3
//! as it is (its records, and its claims' `i` state, read the same). Each
//! batch is atomic and converted records are skipped, so a migration that
//! was killed is finished by running it again; the version says `<from>>5`
//! until the last batch is done.
//!
//! Layout 5 keeps layout 4's records; on a single Redis every partition's
//! scheduled jobs wait in one set of due sets and one wheel (the shared
//! timers, see [`super::Keys`]), each due member tagged with its job's
//! partition, so the migration also moves each partition's own into them
//! (`lua/merge_timers.lua`, a batch per call). A daemon of layout 4 would
//! not see them there. In a cluster, layout 5 is layout 4.
//!
//! Layout 6 keeps layout 5's data; the jobs a claim takes straight from
//! the promotion share one round lease (see "Round leases" in
//! `lua/prelude.lua`), which the scripts of layout 5 would not see (a
//! cancel would find such a job not in flight, a daemon's lease recovery
//! would never take it back), so the two must not run together either: the
//! migration from 5 only writes the version.

use super::{arg, scripts, Keys, Store, StoreError, StoreResult};

/// The layout this hookq reads and writes.
pub(crate) const SCHEMA_VERSION: &str = "6";
/// Versions a migration starts from: layouts 1 to 5, and migrations that
/// were interrupted (`1>2` was written by the hookq of layout 2, `1>3` and
/// `2>3` by that of layout 3, `<n>>4` by that of layout 4, `<n>>5` by that
/// of layout 5, `<n>>6` by this one).
const MIGRATES_FROM: &[&str] = &[
    "1", "2", "3", "4", "5", "1>2", "1>3", "2>3", "1>4", "2>4", "3>4", "1>5", "2>5", "3>5", "4>5",
    "1>6", "2>6", "3>6", "4>6", "5>6",
];
/// Layouts whose records this hookq reads as they are (a migration from
/// one converts no record).
const READS_AS_IS: &[&str] = &["3", "4", "5"];
/// Job records converted per script call.
const MIGRATE_BATCH: usize = 200;
/// Timer entries moved per script call.
const MERGE_BATCH: usize = 1000;

/// What a migration did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MigrateReport {
    /// Job records converted.
    pub converted: u64,
    /// Records that were in the new layout already (an earlier, interrupted run).
    pub skipped: u64,
    /// Scheduled jobs (due-set members and wheel ids) moved into the shared
    /// timers, and index entries cleared on the way.
    pub timers_moved: u64,
}

impl Store {
    /// The version of the data in Redis: the schema key, or `1` when it is
    /// absent but layout-1 data is there, or None for a Redis without hookq
    /// data in this namespace.
    pub(crate) async fn schema_version(&self) -> StoreResult<Option<String>> {
        let mut conn = self.conn.clone();
        let version: Option<String> = redis::cmd("GET")
            .arg(self.keys.schema())
            .query_async(&mut conn)
            .await?;
        if version.is_some() {
            return Ok(version);
        }
        // Layout 1 wrote no version; every deployment that ever held a job
        // has one of these per-partition keys (the counters never expire).
        for p in 0..self.keys.partitions() {
            let mut pipe = redis::pipe();
            for key in [
                self.keys.seq(p),
                self.keys.stats(p),
                self.keys.due(p),
                self.keys.ready(p),
                self.keys.inflight(p),
                self.keys.dead(p),
            ] {
                pipe.exists(key);
            }
            let found: Vec<bool> = pipe.query_async(&mut conn).await?;
            if found.into_iter().any(|f| f) {
                return Ok(Some("1".into()));
            }
        }
        Ok(None)
    }

    /// Checks that Redis holds data of this hookq's layout, writing the
    /// version on a Redis without hookq data (an error naming `hookq
    /// migrate` otherwise), and spread over `redis.partitions` partitions
    /// ([`Store::check_partition_count`]).
    pub(crate) async fn check_schema(&self) -> StoreResult<()> {
        match self.schema_version().await?.as_deref() {
            Some(SCHEMA_VERSION) => {}
            None => {
                self.set_if_absent(self.keys.schema(), SCHEMA_VERSION)
                    .await?
            }
            Some(found) => {
                return Err(StoreError::Schema {
                    found: found.to_string(),
                })
            }
        }
        self.check_partition_count().await
    }

    /// Writes `value` to `key` unless it holds one already (`SET NX`).
    async fn set_if_absent(&self, key: String, value: impl redis::ToRedisArgs) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let _: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("NX")
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// The number of partitions this namespace's data was written with
    /// (`<ns>:partitions`), None before any daemon or command of a hookq
    /// that records it has used the namespace.
    async fn recorded_partitions(&self) -> StoreResult<Option<String>> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("GET")
            .arg(self.keys.partition_count())
            .query_async(&mut conn)
            .await?)
    }

    /// [`StoreError::Partitions`] when the namespace's data was recorded
    /// with another count than `redis.partitions`; Ok when it was recorded
    /// with this one or not at all. Reads only (`hookq doctor` asks it too).
    pub(crate) async fn check_recorded_partitions(&self) -> StoreResult<()> {
        let configured = self.keys.partitions();
        match self.recorded_partitions().await? {
            Some(recorded) if recorded != configured.to_string() => Err(StoreError::Partitions {
                recorded,
                configured,
            }),
            _ => Ok(()),
        }
    }

    /// Checks that the namespace's data is spread over `redis.partitions`
    /// partitions: a job lives in the partition its id hashes to, so a
    /// daemon configured with another count would never deliver or find
    /// the jobs of the partitions it does not have. The first daemon or
    /// command records its count (on a new namespace, or on data written
    /// before hookq recorded it); every later one must have the same, or
    /// gets an error naming `redis.partitions`. The count is read first,
    /// and written only when absent, so that a daemon starts on a Redis at
    /// `maxmemory` (which refuses every `SET`). (`SET NX` then `GET`, not
    /// `SET NX GET`, which Redis before 7.0 refuses: of two starting with
    /// different counts, the one whose `SET` lost reads the other's.)
    async fn check_partition_count(&self) -> StoreResult<()> {
        if self.recorded_partitions().await?.is_none() {
            self.set_if_absent(self.keys.partition_count(), self.keys.partitions())
                .await?;
        }
        self.check_recorded_partitions().await
    }

    /// Converts the namespace's data to this hookq's layout, calling
    /// `progress` after each partition. Refuses while a daemon is
    /// subscribed to the wake channel (every daemon is), since a daemon of
    /// the old layout would keep writing it.
    pub(crate) async fn migrate(
        &self,
        mut progress: impl FnMut(u16, MigrateReport),
    ) -> StoreResult<MigrateReport> {
        self.refuse_while_daemons_run().await?;
        let mut report = MigrateReport::default();
        let Some(from) = self.version_to_migrate().await? else {
            return Ok(report);
        };
        // `1>2` and `1>3` may hold records of both older layouts: each batch
        // goes through both conversions, each skipping what is not its own.
        let start = from
            .split_once('>')
            .map_or(from.as_str(), |(start, _)| start);
        self.set_schema_version(&format!("{start}>{SCHEMA_VERSION}"))
            .await?;
        for p in 0..self.keys.partitions() {
            if !READS_AS_IS.contains(&start) {
                self.migrate_partition(p, &mut report).await?;
            }
            self.merge_timers(p, &mut report).await?;
            progress(p, report);
        }
        self.set_schema_version(SCHEMA_VERSION).await?;
        Ok(report)
    }

    /// An error when any daemon is subscribed to the namespace's wake
    /// channel (every running daemon is).
    async fn refuse_while_daemons_run(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let (_, listeners): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(self.keys.wake_channel())
            .query_async(&mut conn)
            .await?;
        if listeners > 0 {
            return Err(StoreError::reply(
                "migrate",
                format!(
                    "{listeners} daemon(s) are running on this namespace (subscribed to `{}`); stop every hookq daemon first",
                    self.keys.wake_channel()
                ),
            ));
        }
        Ok(())
    }

    /// The version a migration starts from; None when there is nothing to
    /// migrate (no hookq data, or this layout already), an error for a
    /// layout this hookq does not know.
    async fn version_to_migrate(&self) -> StoreResult<Option<String>> {
        match self.schema_version().await? {
            None => Ok(None),
            Some(v) if v == SCHEMA_VERSION => Ok(None),
            Some(v) if MIGRATES_FROM.contains(&v.as_str()) => Ok(Some(v)),
            Some(other) => Err(StoreError::reply(
                "migrate",
                format!(
                    "layout `{other}` is unknown to this hookq (it migrates 1 to 5 to {SCHEMA_VERSION})"
                ),
            )),
        }
    }

    /// Writes the namespace's layout version (`<ns>:schema`).
    async fn set_schema_version(&self, version: &str) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let _: () = redis::cmd("SET")
            .arg(self.keys.schema())
            .arg(version)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Moves partition `p`'s own due sets and wheel into the shared timers
    /// (a single Redis; nothing in a cluster, where each partition keeps
    /// its own), a batch of [`MERGE_BATCH`] per call; adds what moved to
    /// `report`.
    async fn merge_timers(&self, p: u16, report: &mut MigrateReport) -> StoreResult<()> {
        if !self.keys.shared_timers() {
            return Ok(());
        }
        let own = Keys::in_cluster(self.keys.namespace(), self.keys.partitions());
        loop {
            let moved: u64 = self
                .invoke(
                    &scripts::MERGE_TIMERS,
                    &[
                        &own.due(p),
                        &own.wheel(p),
                        &self.keys.due(p),
                        &self.keys.wheel(p),
                    ],
                    &[arg(&MERGE_BATCH)],
                )
                .await?;
            if moved == 0 {
                return Ok(());
            }
            report.timers_moved += moved;
        }
    }

    /// Converts every job record of partition `p`, scanning its keys and
    /// converting them in batches of [`MIGRATE_BATCH`]; adds what was
    /// converted and skipped to `report`.
    async fn migrate_partition(&self, p: u16, report: &mut MigrateReport) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let prefix = self.keys.job_prefix(p);
        let pattern = format!("{prefix}*");
        let mut cursor = "0".to_string();
        loop {
            let (next, keys) = conn
                .scan_near(&self.keys.seq(p), &cursor, &pattern, 1000)
                .await?;
            for chunk in keys.chunks(MIGRATE_BATCH) {
                let (converted, skipped) = self.migrate_batch(p, &prefix, chunk).await?;
                report.converted += converted;
                report.skipped += skipped;
            }
            if next == "0" {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// Converts one batch of partition `p`'s job keys to layout 3 (which
    /// layout 4 reads as it is): the
    /// layout-1 hashes among them, then the layout-2 strings (each script
    /// skipping what is not its own). Returns (converted, skipped).
    async fn migrate_batch(
        &self,
        p: u16,
        prefix: &str,
        keys: &[String],
    ) -> StoreResult<(u64, u64)> {
        let ids = keys.iter().map(|k| arg(&&k[prefix.len()..]));
        let mut args = vec![arg(&prefix), arg(&self.keys.partition_prefix(p))];
        args.extend(ids.clone());
        let (from_hashes, _): (u64, u64) = self
            .invoke(&scripts::MIGRATE_JOBS, &[&self.keys.seq(p)], &args)
            .await?;
        let mut args = vec![arg(&prefix)];
        args.extend(ids);
        let (from_strings, left): (u64, u64) = self
            .invoke(&scripts::MIGRATE_RECORDS, &[&self.keys.stats(p)], &args)
            .await?;
        Ok((from_hashes + from_strings, left))
    }
}
