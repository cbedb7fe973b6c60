//! Finding one job: the partition it lives in (its id's, its ordering
//! key's behind a placement pointer, or its schedule's), its record's
//! header, and its whole record with its history, read from the live
//! record, a finished one kept whole, or a finished job's summary.

use super::{record, summary, JobRecord, Store, StoreError, StoreResult, Summary};

/// A record found where a schedule's firing puts the job of its id: a
/// finished job's summary keeps no spec, so its `schedule_id` comes from
/// the id (`<schedule id>:<fire time>`).
fn fired_summary(mut record: JobRecord) -> JobRecord {
    if record.summarized {
        record.spec.schedule_id =
            crate::schedule::fired_by(&record.id).map(|(schedule, _)| schedule.to_string());
    }
    record
}

impl Store {
    /// The partition the schedule lives in whose firing would give job id
    /// `id`, if it is such an id (a schedule with an ordering key lives in
    /// its key's partition: one read finds it).
    pub(super) async fn fired_home(&self, id: &str) -> StoreResult<Option<u16>> {
        match crate::schedule::fired_by(id) {
            Some((schedule, _)) => Ok(Some(self.schedule_home(schedule).await?)),
            None => Ok(None),
        }
    }

    /// The partition of the schedule whose firing would give job id `id`
    /// (see [`crate::schedule::fired_by`]), if it is such an id.
    fn fired_partition(&self, id: &str) -> Option<u16> {
        crate::schedule::fired_by(id).map(|(schedule, _)| self.keys.partition_of(schedule))
    }

    /// Reads the header of job `id`'s record in partition `p` (live, or a
    /// finished one kept whole); None if there is no record.
    pub(crate) async fn record_header(
        &self,
        p: u16,
        id: &str,
    ) -> StoreResult<Option<record::RecordHeader>> {
        let mut conn = self.conn.clone();
        let (live, lease, kept): (Vec<u8>, Option<f64>, Vec<u8>) = redis::pipe()
            .hget(self.keys.live_records(p, id), id)
            .zscore(self.keys.inflight(p), id)
            .cmd("GETRANGE")
            .arg(self.keys.job(p, id))
            .arg(0)
            .arg(record::HEADER_LEN - 1)
            .query_async(&mut conn)
            .await?;
        match record::RecordHeader::parse(&live) {
            Some(header) => {
                let leased = self.live_leased(p, id, &header, lease.is_some()).await?;
                Ok(Some(header.leased(leased)))
            }
            None => Ok(record::RecordHeader::parse(&kept)),
        }
    }

    /// Whether job `id` of partition `p`, whose live record's header is
    /// `header`, holds a lease: its own (`own_lease`, read beside the
    /// record) or, when it may be in one, a live round's (one more read,
    /// only then: a view of a job due later or in flight on a lease of its
    /// own reads no round).
    async fn live_leased(
        &self,
        p: u16,
        id: &str,
        header: &record::RecordHeader,
        own_lease: bool,
    ) -> StoreResult<bool> {
        Ok(own_lease || (header.may_be_in_round() && self.in_round(p, id).await?))
    }

    /// The partition job `id` lives in: its id's, unless a placement
    /// pointer there names another (see [`Keys::placed`](super::Keys::placed)).
    pub(crate) async fn home_of(&self, id: &str) -> StoreResult<u16> {
        let own = self.keys.partition_of(id);
        let mut conn = self.conn.clone();
        let at = self.keys.live_records(own, id);
        // A pointer is a few bytes: a record is read only when it is one.
        let len: usize = redis::cmd("HSTRLEN")
            .arg(&at)
            .arg(id)
            .query_async(&mut conn)
            .await?;
        if len >= record::HEADER_LEN {
            return Ok(own);
        }
        if len == 0 {
            // A job a schedule fired lives in the schedule's partition,
            // unless one of its id was created by hand (kept or summarised
            // here).
            let Some(fired) = self.fired_home(id).await?.filter(|&p| p != own) else {
                return Ok(own);
            };
            let kept: bool = redis::cmd("EXISTS")
                .arg(self.keys.job(own, id))
                .query_async(&mut conn)
                .await?;
            if kept || self.find_summary(own, id).await?.is_some() {
                return Ok(own);
            }
            return Ok(fired);
        }
        let value: Vec<u8> = redis::cmd("HGET")
            .arg(&at)
            .arg(id)
            .query_async(&mut conn)
            .await?;
        Ok(self.pointed(&value).unwrap_or(own))
    }

    /// The partition a live-record value points to, when it is a valid
    /// placement pointer.
    pub(super) fn pointed(&self, value: &[u8]) -> Option<u16> {
        record::pointer_of(value).filter(|&q| q < self.keys.partitions())
    }

    /// Reads a job record and its history: the live record, else a finished
    /// one kept whole, else a finished job's summary; None if unknown (or
    /// expired). A job held behind its ordering list's earlier jobs shows
    /// the one just ahead of it.
    pub async fn get(&self, id: &str) -> StoreResult<Option<JobRecord>> {
        let own = self.keys.partition_of(id);
        match self.get_in(own, id).await? {
            Err(q) => match self.get_in(q, id).await? {
                Ok(found) => Ok(found),
                Err(_) => Err(StoreError::reply(
                    "job record",
                    format!("{id}: a pointer to a pointer"),
                )),
            },
            Ok(None) => match self.fired_home(id).await?.filter(|&p| p != own) {
                // A job a schedule fired lives in the schedule's partition.
                Some(p) => Ok(self.get_in(p, id).await?.unwrap_or(None).map(fired_summary)),
                None => Ok(None),
            },
            Ok(Some(record)) if self.fired_partition(id) == Some(own) => {
                Ok(Some(fired_summary(record)))
            }
            Ok(found) => Ok(found),
        }
    }

    /// [`Store::get`] in partition `p`: Err(q) when the id points to
    /// partition q instead.
    async fn get_in(&self, p: u16, id: &str) -> StoreResult<Result<Option<JobRecord>, u16>> {
        let mut conn = self.conn.clone();
        let (live, lease, kept, history): (Vec<u8>, Option<f64>, Vec<u8>, Vec<String>) =
            redis::pipe()
                .hget(self.keys.live_records(p, id), id)
                .zscore(self.keys.inflight(p), id)
                .get(self.keys.job(p, id))
                .lrange(self.keys.history(p, id), 0, 19)
                .query_async(&mut conn)
                .await?;
        if let Some(q) = self.pointed(&live) {
            return Ok(Err(q));
        }
        // (A kept record is of a finished job: no lease.)
        let leased = match record::RecordHeader::parse(&live) {
            Some(header) => self.live_leased(p, id, &header, lease.is_some()).await?,
            None => false,
        };
        let value = if live.is_empty() { kept } else { live };
        let record = match JobRecord::decode(id, &value, history, leased)? {
            Some(mut record) => {
                if record.held {
                    self.read_hold(p, &mut record).await?;
                }
                Some(record)
            }
            None => self
                .find_summary(p, id)
                .await?
                .map(|summary| summary.into_record(id)),
        };
        Ok(Ok(record))
    }

    /// Fills in, for held job `record` of partition `p`, the id just ahead
    /// of it in its ordering list and the job that holds the key (the
    /// list's head) with its due time. Read for a held job's view alone:
    /// three round trips, none on the path of a delivery.
    async fn read_hold(&self, p: u16, record: &mut JobRecord) -> StoreResult<()> {
        let Some(order) = record.spec.ordering_list() else {
            return Ok(());
        };
        let list = self
            .keys
            .order_list(p, &crate::tenant::order_line(&record.id, &order));
        let mut conn = self.conn.clone();
        let at: Option<i64> = redis::cmd("LPOS")
            .arg(&list)
            .arg(&record.id)
            .query_async(&mut conn)
            .await?;
        let Some(i) = at.filter(|&i| i > 0) else {
            return Ok(());
        };
        let (ahead, head): (Option<String>, Option<String>) = redis::pipe()
            .lindex(&list, (i - 1) as isize)
            .lindex(&list, 0)
            .query_async(&mut conn)
            .await?;
        record.waiting_for = ahead;
        if let Some(head) = head {
            // The head lives in the key's partition, as every job of it.
            let header = self.record_header(p, &head).await?;
            let until = header
                .filter(|h| h.state == crate::job::State::Scheduled && h.due > crate::job::now_ms())
                .map(|h| h.due);
            record.holder = Some(record::Holder { id: head, until });
        }
        Ok(())
    }

    /// The newest summary of finished job `id` of partition `p`: one read of
    /// the partition's bucket index, then one HGET per bucket, pipelined;
    /// then, for a summary whose history goes on in continuation fields,
    /// one HMGET of those.
    pub(crate) async fn find_summary(&self, p: u16, id: &str) -> StoreResult<Option<Summary>> {
        let buckets = self.summary_buckets(p).await?;
        if buckets.is_empty() {
            return Ok(None);
        }
        let h = summary::id_hash(id);
        let mut pipe = redis::pipe();
        let mut shards = Vec::with_capacity(buckets.len());
        for bucket in &buckets {
            let shard = self
                .keys
                .done_shard(p, &bucket.start, summary::shard_of(h, bucket.shards));
            pipe.hget(&shard, id);
            shards.push(shard);
        }
        let mut conn = self.conn.clone();
        let values: Vec<Option<Vec<u8>>> = pipe.query_async(&mut conn).await?;
        let Some((shard, value, _)) = values
            .into_iter()
            .zip(shards)
            .filter_map(|(v, shard)| v.map(|v| (shard, v)))
            .filter_map(|(shard, v)| Summary::finished_of(&v).map(|f| (shard, v, f)))
            .max_by_key(|(_, _, finished)| *finished)
        else {
            return Ok(None);
        };
        let more = summary::continuations(&value);
        if more > 0 {
            let fields: Vec<String> = (1..=more)
                .map(|k| summary::continuation_field(id, k))
                .collect();
            let pieces: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
                .arg(&shard)
                .arg(&fields)
                .query_async(&mut conn)
                .await?;
            let whole = summary::join(&value, pieces.iter().map(|p| p.as_deref()));
            return Ok(Summary::parse(&whole));
        }
        Ok(Summary::parse(&value))
    }

    /// The summary buckets of partition `p` (expired ones may linger in the
    /// index until the next new bucket; their shards are gone).
    pub async fn summary_buckets(&self, p: u16) -> StoreResult<Vec<summary::Bucket>> {
        let mut conn = self.conn.clone();
        let index: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(self.keys.done(p))
            .query_async(&mut conn)
            .await?;
        let mut buckets: Vec<summary::Bucket> = index
            .iter()
            .filter_map(|(start, value)| summary::Bucket::parse(start, value))
            .collect();
        buckets.sort_by_key(summary::Bucket::start_ms);
        Ok(buckets)
    }
}
