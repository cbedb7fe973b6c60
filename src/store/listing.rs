//! Views across partitions: paging through jobs by state or topic (this
//! file), the counts of `GET /v1/stats` (`stats`), the tenants' ledger
//! (`ledger`), and dead letters
//! (`dead_letters`). The reads need no script; the only writes, deleting a
//! dead letter and indexing the dead-letter streams, are in `dead_letters`.
//! Each page costs a few pipelined round trips per partition visited and
//! never reads a whole set; pages and cursors are in `cursor`.
//!
//! Cursors are `<partition>:<position>`, where the position is an index into
//! the partition's zset or list, a `SCAN` cursor (with the keys of its step
//! already listed), a place among the finished-job summaries
//! (`s<bucket>.<shard>.<skip>`), or a stream entry id. A cursor of another
//! shape is refused as a [`BadCursor`].

mod cursor;
mod dead_letters;
mod ledger;
mod stats;

use std::collections::{BTreeSet, HashMap};

use super::{summary, JobRecord, Store, StoreResult, Summary};
use crate::job::State;
pub use cursor::{BadCursor, Cursor, CursorKind, Page};
pub use dead_letters::DeadLetter;
pub use ledger::{tenant_views, Ledger, TenantView};
pub use stats::{PartitionStats, Stats};

/// Partitions visited at most per page, so one request stays bounded.
const MAX_PARTITIONS_PER_PAGE: u16 = 64;

/// Summary shards (about 40 to 80 summaries each) read at most per page.
const MAX_SHARDS_PER_PAGE: u32 = 64;

/// Bytes of stored jobs (or dead letters) one page reads from Redis before
/// it ends early with a cursor, once it holds at least one item: a page over
/// large jobs stays small in time and memory however high its `limit`.
pub(crate) const PAGE_READ_BYTES: usize = 8 << 20;

/// Most records one Redis call of a listing reads.
const MAX_READ_BATCH: usize = 100;

/// What one page may still read from Redis ([`PAGE_READ_BYTES`]), and how
/// many records to ask for per call so that one call stays within it. Every
/// listing of stored records (jobs, dead letters, schedules) pages with one.
pub(super) struct ReadBudget {
    left: usize,
    read_bytes: usize,
    read_records: usize,
}

impl ReadBudget {
    /// A page's budget: [`PAGE_READ_BYTES`], nothing read yet.
    pub(super) fn new() -> ReadBudget {
        ReadBudget {
            left: PAGE_READ_BYTES,
            read_bytes: 0,
            read_records: 0,
        }
    }

    /// Counts one record of `bytes` read.
    pub(super) fn spend(&mut self, bytes: usize) {
        self.left = self.left.saturating_sub(bytes);
        self.read_bytes += bytes;
        self.read_records += 1;
    }

    /// Whether a page that holds `items` so far must end here.
    pub(super) fn exhausted(&self, items: usize) -> bool {
        self.left == 0 && items > 0
    }

    /// Records to read in the next call, at most `want`: 4 until sizes are
    /// known, then as many as the budget left holds at the average size.
    pub(super) fn batch(&self, want: usize) -> usize {
        let fit = match self.read_bytes.checked_div(self.read_records) {
            None => 4,
            Some(average) => self.left / average.max(1),
        };
        fit.clamp(1, MAX_READ_BATCH).min(want.max(1))
    }
}

/// A record as a listing shows it: without its body (the job view has it),
/// so that a page's answer stays small.
fn listed(mut record: JobRecord) -> JobRecord {
    record.spec.body = None;
    record.spec.body_text = None;
    record.spec_json = String::new();
    record
}

/// Which ids a job listing walks.
enum Source {
    /// The ready list, by offset.
    Ready,
    /// The lease zset, by offset.
    Inflight,
    /// Every live record (the record hashes), then, `with_kept`, the
    /// finished jobs kept whole and the summaries.
    Scan { with_kept: bool },
}

impl Source {
    /// What a listing of jobs in `state` (or in any state) walks. Scheduled
    /// jobs wait in three places, but every live job is a field of a record
    /// hash: their listing scans the record hashes alone, while a listing
    /// that may hold finished jobs goes on to those kept whole and the
    /// summaries.
    fn of(state: Option<State>) -> Source {
        match state {
            Some(State::Ready) => Source::Ready,
            Some(State::Inflight) => Source::Inflight,
            Some(State::Scheduled) => Source::Scan { with_kept: false },
            _ => Source::Scan { with_kept: true },
        }
    }
}

impl Store {
    /// Reads live job records (without history) of partition `p`, one per id
    /// in order (None where there is none).
    pub(super) async fn records(
        &self,
        p: u16,
        ids: &[String],
    ) -> StoreResult<Vec<Option<JobRecord>>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.hget(self.keys.live_records(p, id), id);
        }
        let mut conn = self.conn.clone();
        let all: Vec<Vec<u8>> = pipe.query_async(&mut conn).await?;
        let leased = self.leased(p, ids).await?;
        ids.iter()
            .zip(all)
            .zip(leased)
            .map(|((id, value), leased)| JobRecord::decode(id, &value, Vec::new(), leased))
            .collect()
    }

    /// Which of jobs `ids` of partition `p` hold a lease, of their own or
    /// in a live round: are in flight (see [`record::RecordHeader::leased`]).
    pub(super) async fn leased<S: AsRef<str>>(&self, p: u16, ids: &[S]) -> StoreResult<Vec<bool>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut cmd = redis::cmd("ZMSCORE");
        cmd.arg(self.keys.inflight(p));
        for id in ids {
            cmd.arg(id.as_ref());
        }
        let mut conn = self.conn.clone();
        let (scores, rounds): (Vec<Option<f64>>, Vec<String>) = redis::pipe()
            .add_command(cmd)
            .hvals(self.keys.round_jobs(p))
            .query_async(&mut conn)
            .await?;
        let in_rounds = self.round_ids(p, &rounds);
        Ok(scores
            .into_iter()
            .zip(ids)
            .map(|(s, id)| s.is_some() || in_rounds.contains(id.as_ref()))
            .collect())
    }

    /// Whether job `id` of partition `p` is in a live round lease: one
    /// `HVALS` of the round space, searched for its entry (see "Round
    /// leases" in `lua/prelude.lua`; a round's entries are each between
    /// spaces, its count and the `next` counter are bare numbers).
    pub(super) async fn in_round(&self, p: u16, id: &str) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        let rounds: Vec<String> = redis::cmd("HVALS")
            .arg(self.keys.round_jobs(p))
            .query_async(&mut conn)
            .await?;
        let needle = format!(" {} ", self.keys.wheel_entry(p, id));
        Ok(rounds.iter().any(|v| v.contains(&needle)))
    }

    /// The ids of partition `p`'s jobs in the live round leases whose
    /// entries `rounds` holds (the values of [`Keys::round_jobs`], whose
    /// counts are skipped; see "Round leases" in `lua/prelude.lua`).
    ///
    /// [`Keys::round_jobs`]: super::Keys::round_jobs
    pub(super) fn round_ids(&self, p: u16, rounds: &[String]) -> BTreeSet<String> {
        let own = self.keys.wheel_entry(p, "");
        rounds
            .iter()
            .filter(|v| v.starts_with(' '))
            .flat_map(|v| v.split_ascii_whitespace())
            .filter_map(|entry| entry.strip_prefix(own.as_str()))
            .map(str::to_string)
            .collect()
    }

    /// Pages through jobs, optionally of one tenant, one state and one
    /// topic. Views carry no history (read one job for that). Like the
    /// topic, the tenant filters what a page read: a page may hold fewer
    /// than `limit` (even none) while `next_cursor` says more follow.
    pub async fn list_jobs(
        &self,
        tenant: Option<&str>,
        state: Option<State>,
        topic: Option<&str>,
        limit: usize,
        cursor: Option<Cursor>,
    ) -> StoreResult<Page<JobRecord>> {
        let source = Source::of(state);
        let keep = |record: &JobRecord| {
            state.is_none_or(|s| s == record.state)
                && topic.is_none_or(|t| t == record.spec.topic)
                && tenant.is_none_or(|t| crate::tenant::belongs_to(&record.id, t))
        };
        let initial = "0";
        let partitions = self.keys.partitions();
        let mut cursor = cursor.unwrap_or_else(|| Cursor::start(0, initial));
        let mut items = Vec::new();
        let mut visited = 0;
        let mut budget = ReadBudget::new();
        while cursor.partition < partitions
            && items.len() < limit
            && visited < MAX_PARTITIONS_PER_PAGE
            && !budget.exhausted(items.len())
        {
            let p = cursor.partition;
            let want = limit - items.len();
            let next = match source {
                Source::Inflight | Source::Ready => {
                    let offset: isize = cursor.position.parse().unwrap_or(0);
                    let ids = self.queued_ids(&source, p, offset, want).await?;
                    let done = self
                        .read_queued(p, &ids, &keep, &mut budget, &mut items)
                        .await?;
                    let full = ids.len() == want;
                    (full || done < ids.len()).then(|| (offset + done as isize).to_string())
                }
                Source::Scan { with_kept } => {
                    let (found, resume) = self
                        .scan_step(p, &cursor.position, want, &keep, with_kept, &mut budget)
                        .await?;
                    items.extend(found);
                    resume
                }
            };
            cursor = match next {
                Some(position) => Cursor::start(p, &position),
                None => {
                    visited += 1;
                    Cursor::start(p + 1, initial)
                }
            };
        }
        Ok(Page {
            items,
            next_cursor: (cursor.partition < partitions).then(|| cursor.encode()),
        })
    }

    /// Up to `want` ids of partition `p`'s ready list or lease zset (as
    /// `source` says), from `offset`.
    async fn queued_ids(
        &self,
        source: &Source,
        p: u16,
        offset: isize,
        want: usize,
    ) -> StoreResult<Vec<String>> {
        let stop = offset + want as isize - 1;
        let mut conn = self.conn.clone();
        if let Source::Inflight = source {
            // The jobs with a lease of their own, then those of the live
            // rounds (by id), read as one list.
            let (mut ids, rounds): (Vec<String>, Vec<String>) = redis::pipe()
                .zrange(self.keys.inflight(p), 0, -1)
                .hvals(self.keys.round_jobs(p))
                .query_async(&mut conn)
                .await?;
            ids.extend(self.round_ids(p, &rounds));
            let from = usize::try_from(offset.max(0)).unwrap_or(0).min(ids.len());
            let to = usize::try_from(stop.saturating_add(1).max(0))
                .unwrap_or(0)
                .clamp(from, ids.len());
            return Ok(ids.drain(from..to).collect());
        }
        // The ready lists, the default tenant's then the others' by name,
        // read as one list: `offset` counts through them in that order.
        let mut tenants: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.keys.tenants(p))
            .query_async(&mut conn)
            .await?;
        tenants.sort();
        let lists: Vec<String> = std::iter::once(self.keys.ready(p))
            .chain(tenants.iter().map(|t| self.keys.tenant_ready(p, t)))
            .collect();
        let mut lengths = redis::pipe();
        for key in &lists {
            lengths.llen(key);
        }
        let lengths: Vec<isize> = lengths.query_async(&mut conn).await?;
        let mut skip = offset.max(0);
        let mut ids = Vec::new();
        for (key, len) in lists.into_iter().zip(lengths) {
            if ids.len() >= want {
                break;
            }
            if skip >= len {
                skip -= len;
                continue;
            }
            let page: Vec<String> = redis::cmd("LRANGE")
                .arg(&key)
                .arg(skip)
                .arg(skip + (want - ids.len()) as isize - 1)
                .query_async(&mut conn)
                .await?;
            ids.extend(page);
            skip = 0;
        }
        Ok(ids)
    }

    /// Reads the live records of `ids` (of partition `p`) in order, in
    /// batches the budget holds, and adds those `keep` accepts to the
    /// page's `items`; stops once the budget is spent and the page holds an
    /// item. The number of ids read.
    async fn read_queued(
        &self,
        p: u16,
        ids: &[String],
        keep: &(dyn Fn(&JobRecord) -> bool + Sync),
        budget: &mut ReadBudget,
        items: &mut Vec<JobRecord>,
    ) -> StoreResult<usize> {
        let mut conn = self.conn.clone();
        let mut done = 0;
        while done < ids.len() && !budget.exhausted(items.len()) {
            let batch = &ids[done..(done + budget.batch(ids.len() - done)).min(ids.len())];
            let mut pipe = redis::pipe();
            for id in batch {
                pipe.hget(self.keys.live_records(p, id), id);
            }
            let values: Vec<Vec<u8>> = pipe.query_async(&mut conn).await?;
            let leased = self.leased(p, batch).await?;
            for ((id, value), leased) in batch.iter().zip(values).zip(leased) {
                budget.spend(value.len());
                if let Some(record) = JobRecord::decode(id, &value, Vec::new(), leased)? {
                    if keep(&record) {
                        items.push(listed(record));
                    }
                }
            }
            done += batch.len();
        }
        Ok(done)
    }

    /// One step of the scan of partition `p` from `position`: the record
    /// hashes (`<shard>.<HSCAN cursor>.<skip>`), then, `with_kept`, the
    /// finished jobs kept whole (`k<SCAN cursor>.<skip>`), then the
    /// summaries (`s...`). The items and the position to resume at, None
    /// once the partition is done.
    async fn scan_step(
        &self,
        p: u16,
        position: &str,
        want: usize,
        keep: &(dyn Fn(&JobRecord) -> bool + Sync),
        with_kept: bool,
        budget: &mut ReadBudget,
    ) -> StoreResult<(Vec<JobRecord>, Option<String>)> {
        if let Some(summaries) = position.strip_prefix('s') {
            return self.summary_page(p, summaries, want, keep).await;
        }
        if let Some(kept) = position.strip_prefix('k') {
            let (found, resume) = self.kept_page(p, kept, want, keep, budget).await?;
            return Ok((found, resume.or_else(|| with_kept.then(|| "s".to_string()))));
        }
        let (found, resume) = self.live_page(p, position, want, keep, budget).await?;
        Ok((
            found,
            resume.or_else(|| with_kept.then(|| "k0".to_string())),
        ))
    }

    /// A page of partition `p`'s live records that `keep` accepts, from
    /// `position` (`<shard>.<HSCAN cursor>.<entries to skip>`, or `0`): the
    /// items and the position to resume at, None once every record hash of
    /// the partition has been read.
    async fn live_page(
        &self,
        p: u16,
        position: &str,
        want: usize,
        keep: &(dyn Fn(&JobRecord) -> bool + Sync),
        budget: &mut ReadBudget,
    ) -> StoreResult<(Vec<JobRecord>, Option<String>)> {
        let mut parts = position.splitn(3, '.');
        let mut shard: u32 = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
        let mut scan = parts.next().unwrap_or("0").to_string();
        let mut skip: usize = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
        let mut items = Vec::new();
        let mut conn = self.conn.clone();
        while shard < super::keys::JOB_SHARDS {
            let (next, entries): (String, Vec<(String, Vec<u8>)>) = redis::cmd("HSCAN")
                .arg(self.keys.live_shard(p, shard))
                .arg(&scan)
                .arg("COUNT")
                .arg(budget.batch(want.max(MAX_READ_BATCH)))
                .query_async(&mut conn)
                .await?;
            let ids: Vec<&str> = entries.iter().map(|(id, _)| id.as_str()).collect();
            let leased = self.leased(p, &ids).await?;
            for (i, ((id, value), leased)) in entries.iter().zip(leased).enumerate().skip(skip) {
                if items.len() == want || budget.exhausted(items.len()) {
                    return Ok((items, Some(format!("{shard}.{scan}.{i}"))));
                }
                budget.spend(value.len());
                if let Some(record) =
                    JobRecord::decode(id, value, Vec::new(), leased)?.filter(|r| keep(r))
                {
                    items.push(listed(record));
                }
            }
            skip = 0;
            if next == "0" {
                shard += 1;
                scan = "0".into();
            } else {
                scan = next;
            }
            if items.len() == want {
                let resume = (shard < super::keys::JOB_SHARDS).then(|| format!("{shard}.{scan}.0"));
                return Ok((items, resume));
            }
        }
        Ok((items, None))
    }

    /// A page of partition `p`'s finished records kept whole (strings
    /// `<ns>:{p}:job:<id>`) that `keep` accepts, from `position` (`<SCAN
    /// cursor>.<keys to skip>`): a page that fills up within one SCAN step
    /// resumes inside that step.
    async fn kept_page(
        &self,
        p: u16,
        position: &str,
        want: usize,
        keep: &(dyn Fn(&JobRecord) -> bool + Sync),
        budget: &mut ReadBudget,
    ) -> StoreResult<(Vec<JobRecord>, Option<String>)> {
        let (scan_cursor, skip) = match position.split_once('.') {
            Some((c, n)) => (c.to_string(), n.parse().unwrap_or(0)),
            None => (position.to_string(), 0usize),
        };
        let mut conn = self.conn.clone();
        let (next_scan, keys) = conn
            .scan_near(
                &self.keys.due(p),
                &scan_cursor,
                &format!("{}*", self.keys.job_prefix(p)),
                want.max(100),
            )
            .await?;
        let prefix_len = self.keys.job_prefix(p).len();
        let ids: Vec<String> = keys
            .iter()
            .skip(skip)
            .map(|k| k[prefix_len..].to_string())
            .collect();
        let mut items = Vec::new();
        let mut done = 0;
        while done < ids.len() {
            if items.len() == want || budget.exhausted(items.len()) {
                return Ok((
                    items,
                    Some(format!("k{scan_cursor}.{}", skip.saturating_add(done))),
                ));
            }
            let batch = &ids[done..(done + budget.batch(want - items.len())).min(ids.len())];
            let mut pipe = redis::pipe();
            for id in batch {
                pipe.get(self.keys.job(p, id));
            }
            let values: Vec<Vec<u8>> = pipe.query_async(&mut conn).await?;
            for (i, (id, value)) in batch.iter().zip(values).enumerate() {
                if items.len() == want {
                    return Ok((
                        items,
                        Some(format!("k{scan_cursor}.{}", skip.saturating_add(done + i))),
                    ));
                }
                budget.spend(value.len());
                // (A kept record is of a finished job: no lease.)
                if let Some(record) =
                    JobRecord::decode(id, &value, Vec::new(), false)?.filter(|r| keep(r))
                {
                    items.push(listed(record));
                }
            }
            done += batch.len();
        }
        Ok((items, (next_scan != "0").then(|| format!("k{next_scan}"))))
    }

    /// A page of partition `p`'s finished-job summaries that `keep`
    /// accepts, from `position` (empty, or `<bucket>.<shard>.<entries to
    /// skip>`): the items and the position to resume at, None once the
    /// partition's summaries are done. A shard's entries are listed in id
    /// order; a page reads at most [`MAX_SHARDS_PER_PAGE`] shards.
    async fn summary_page(
        &self,
        p: u16,
        position: &str,
        want: usize,
        keep: &(dyn Fn(&JobRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<JobRecord>, Option<String>)> {
        let mut from = position.splitn(3, '.').map(|n| n.parse::<i64>().ok());
        let (from_bucket, from_shard, skip) = match (from.next(), from.next(), from.next()) {
            (Some(Some(b)), Some(Some(s)), Some(Some(k))) => {
                (b, s.max(0) as u32, k.max(0) as usize)
            }
            _ => (i64::MIN, 0, 0),
        };
        let mut items = Vec::new();
        let mut shards_read = 0;
        let mut conn = self.conn.clone();
        for bucket in self.summary_buckets(p).await? {
            let start = bucket.start_ms();
            if start < from_bucket {
                continue;
            }
            let first = if start == from_bucket { from_shard } else { 0 };
            for shard in first..bucket.shards {
                if shards_read == MAX_SHARDS_PER_PAGE {
                    return Ok((items, Some(format!("s{}.{shard}.0", bucket.start))));
                }
                shards_read += 1;
                let mut entries: Vec<(String, Vec<u8>)> = redis::cmd("HGETALL")
                    .arg(self.keys.done_shard(p, &bucket.start, shard))
                    .query_async(&mut conn)
                    .await?;
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                let skip = if start == from_bucket && shard == from_shard {
                    skip
                } else {
                    0
                };
                let pieces: HashMap<&str, &[u8]> = entries
                    .iter()
                    .filter(|(field, _)| summary::is_continuation(field))
                    .map(|(field, value)| (field.as_str(), value.as_slice()))
                    .collect();
                for (i, (id, value)) in entries.iter().enumerate().skip(skip) {
                    if items.len() == want {
                        return Ok((items, Some(format!("s{}.{shard}.{i}", bucket.start))));
                    }
                    if summary::is_continuation(id) {
                        continue;
                    }
                    let whole = summary::join(
                        value,
                        (1..=summary::continuations(value)).map(|k| {
                            pieces
                                .get(summary::continuation_field(id, k).as_str())
                                .copied()
                        }),
                    );
                    if let Some(record) = Summary::parse(&whole).map(|s| s.into_record(id)) {
                        if keep(&record) {
                            items.push(record);
                        }
                    }
                }
            }
        }
        Ok((items, None))
    }
}
