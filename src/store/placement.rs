//! Placement pointers: a job whose partition is not its id's (an ordered
//! job lives where its ordering key does) is found by id through a pointer
//! `@<partition>` in its id's partition (see [`Keys::placed`] and
//! `lua/place_jobs.lua`). This module owns their upkeep: the daemon's sweep
//! drops the pointers of jobs that are gone, so they cost memory only while
//! their job, its summary or its dead letter lasts.

use std::collections::BTreeMap;

use super::{arg, scripts, Keys, Store, StoreResult};

/// Pointers checked per call of the sweep.
const SWEEP_BATCH: usize = 200;

/// What one sweep of a partition did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sweep {
    /// Pointers whose check time had come.
    pub checked: usize,
    /// Pointers dropped (their jobs are gone).
    pub dropped: usize,
}

impl Store {
    /// How often the daemon sweeps its partitions' placement pointers:
    /// half the time a pointer waits for its check, at most a minute.
    pub(crate) fn placement_sweep_every(&self) -> std::time::Duration {
        std::time::Duration::from_millis((self.pointer_check_ms() / 2).clamp(500, 60_000))
    }

    /// Sweeps the placement pointers of the partitions this daemon
    /// carries (`owns`), every [`Store::placement_sweep_every`], until
    /// `token` is cancelled.
    pub(crate) async fn run_placement_sweep(
        self,
        owns: impl Fn(u16) -> bool,
        token: tokio_util::sync::CancellationToken,
    ) {
        let every = self.placement_sweep_every();
        loop {
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            for p in (0..self.keys.partitions()).filter(|&p| owns(p)) {
                match self.sweep_placed(p).await {
                    Ok(sweep) if sweep.dropped > 0 => {
                        tracing::debug!(
                            partition = p,
                            dropped = sweep.dropped,
                            "placement pointers of finished jobs dropped"
                        );
                    }
                    Ok(_) => {}
                    Err(err) => {
                        tracing::warn!(cause = %err, partition = p, "cannot sweep placement pointers yet");
                        break;
                    }
                }
            }
        }
    }

    /// Checks the placement pointers of partition `p` whose check time has
    /// come (a batch at a time, until none is left): each one's job is
    /// looked for in the partition it points to (its record, kept record,
    /// summary or dead letter); the pointers of jobs gone are dropped, the
    /// others checked again later.
    pub(crate) async fn sweep_placed(&self, p: u16) -> StoreResult<Sweep> {
        let mut sweep = Sweep::default();
        loop {
            let now = self.redis_time_ms().await?;
            let mut conn = self.conn.clone();
            let due: Vec<(String, i64)> = redis::cmd("ZRANGE")
                .arg(self.keys.placed(p))
                .arg("-inf")
                .arg(now)
                .arg("BYSCORE")
                .arg("LIMIT")
                .arg(0)
                .arg(SWEEP_BATCH)
                .arg("WITHSCORES")
                .query_async(&mut conn)
                .await?;
            if due.is_empty() {
                return Ok(sweep);
            }
            let mut pipe = redis::pipe();
            for (id, _) in &due {
                pipe.hget(self.keys.live_records(p, id), id);
            }
            let values: Vec<Vec<u8>> = pipe.query_async(&mut conn).await?;
            // Pointed-to partition -> indexes into `due`.
            let mut by_target: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
            let mut exists = vec![false; due.len()];
            for (i, value) in values.iter().enumerate() {
                if let Some(q) = self.pointed(value) {
                    by_target.entry(q).or_default().push(i);
                }
            }
            for (q, indexes) in by_target {
                let ids: Vec<&str> = indexes.iter().map(|&i| due[i].0.as_str()).collect();
                for (&i, found) in indexes.iter().zip(self.traces(q, &ids).await?) {
                    exists[i] = found;
                }
            }
            let mut args = vec![arg(&self.keys.job_prefix(p)), arg(&self.pointer_check_ms())];
            for ((id, score), found) in due.iter().zip(&exists) {
                args.push(arg(id));
                args.push(arg(score));
                args.push(arg(&if *found { "1" } else { "0" }));
            }
            let dropped: usize = self
                .invoke(&scripts::UNPLACE_JOBS, &[&self.keys.placed(p)], &args)
                .await?;
            sweep.checked += due.len();
            sweep.dropped += dropped;
            if due.len() < SWEEP_BATCH {
                return Ok(sweep);
            }
        }
    }

    /// Whether each of `ids` has anything left in partition `p`: a live or
    /// kept record, a dead letter, or a finished job's summary.
    async fn traces(&self, p: u16, ids: &[&str]) -> StoreResult<Vec<bool>> {
        let keys: &Keys = &self.keys;
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.hexists(keys.live_records(p, id), id)
                .exists(keys.job(p, id))
                .hexists(keys.dead_index(p), id);
        }
        let mut conn = self.conn.clone();
        let found: Vec<bool> = pipe.query_async(&mut conn).await?;
        let mut out = Vec::with_capacity(ids.len());
        for (id, f) in ids.iter().zip(found.chunks_exact(3)) {
            let any = f.iter().any(|x| *x) || self.find_summary(p, id).await?.is_some();
            out.push(any);
        }
        Ok(out)
    }
}
