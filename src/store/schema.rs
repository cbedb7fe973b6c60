//! The layout version of a namespace's data (`<ns>:schema`) and the one
//! migration between layouts (`hookq migrate`).
//!
//! Layout 1 kept each job in a many-field hash; layout 2 keeps it in one
//! string (see [`super::record`]). A daemon meets the version at start: on a
//! Redis with no hookq data it writes its own; on older data it refuses to
//! start and names `hookq migrate`, which converts every record in place,
//! one batch per script call. Each batch is atomic and converted records are
//! skipped, so a migration that was killed is finished by running it again;
//! the version says `1>2` until the last batch is done.

use super::{arg, scripts, Store, StoreError, StoreResult};

/// The layout this hookq reads and writes.
pub const SCHEMA_VERSION: &str = "2";
/// The version a migration writes before its first change.
const MIGRATING: &str = "1>2";
/// Job records converted per script call.
const MIGRATE_BATCH: usize = 200;

/// What a migration did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MigrateReport {
    /// Job records converted.
    pub converted: u64,
    /// Records that were in the new layout already (an earlier, interrupted run).
    pub skipped: u64,
}

impl Store {
    /// The version of the data in Redis: the schema key, or `1` when it is
    /// absent but layout-1 data is there, or None for a Redis without hookq
    /// data in this namespace.
    pub async fn schema_version(&self) -> StoreResult<Option<String>> {
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
    /// version on a Redis without hookq data; an error naming `hookq
    /// migrate` otherwise.
    pub async fn check_schema(&self) -> StoreResult<()> {
        match self.schema_version().await?.as_deref() {
            Some(SCHEMA_VERSION) => Ok(()),
            None => {
                let mut conn = self.conn.clone();
                let _: Option<String> = redis::cmd("SET")
                    .arg(self.keys.schema())
                    .arg(SCHEMA_VERSION)
                    .arg("NX")
                    .query_async(&mut conn)
                    .await?;
                Ok(())
            }
            Some(found) => Err(StoreError::Schema {
                found: found.to_string(),
            }),
        }
    }

    /// Converts the namespace's data to this hookq's layout, calling
    /// `progress` after each partition. Refuses while a daemon is
    /// subscribed to the wake channel (every daemon is), since a daemon of
    /// the old layout would keep writing it.
    pub async fn migrate(
        &self,
        mut progress: impl FnMut(u16, MigrateReport),
    ) -> StoreResult<MigrateReport> {
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
        let mut report = MigrateReport::default();
        match self.schema_version().await?.as_deref() {
            Some(SCHEMA_VERSION) | None => return Ok(report),
            Some("1") | Some(MIGRATING) => {}
            Some(other) => {
                return Err(StoreError::reply(
                    "migrate",
                    format!(
                    "layout `{other}` is unknown to this hookq (it migrates 1 to {SCHEMA_VERSION})"
                ),
                ))
            }
        }
        let _: () = redis::cmd("SET")
            .arg(self.keys.schema())
            .arg(MIGRATING)
            .query_async(&mut conn)
            .await?;
        for p in 0..self.keys.partitions() {
            let prefix = self.keys.job_prefix(p);
            let pattern = format!("{prefix}*");
            let mut cursor = "0".to_string();
            loop {
                let (next, keys) = conn
                    .scan_near(&self.keys.seq(p), &cursor, &pattern, 1000)
                    .await?;
                for chunk in keys.chunks(MIGRATE_BATCH) {
                    let mut args = vec![arg(&prefix), arg(&self.keys.partition_prefix(p))];
                    args.extend(chunk.iter().map(|k| arg(&&k[prefix.len()..])));
                    let (converted, skipped): (u64, u64) = self
                        .invoke(&scripts::MIGRATE_JOBS, &[&self.keys.seq(p)], &args)
                        .await?;
                    report.converted += converted;
                    report.skipped += skipped;
                }
                if next == "0" {
                    break;
                }
                cursor = next;
            }
            progress(p, report);
        }
        let _: () = redis::cmd("SET")
            .arg(self.keys.schema())
            .arg(SCHEMA_VERSION)
            .query_async(&mut conn)
            .await?;
        Ok(report)
    }
}
