//! Dead letters: reading them from the partitions' `dead` streams (a page
//! of them, or the newest of one job through the `dead:ids` index),
//! deleting one (`drop_dead`), and indexing the streams written before the
//! index existed (`index_dead`).

use redis::streams::{StreamId, StreamRangeReply};
use serde::Serialize;

use super::{Cursor, Page, ReadBudget, MAX_PARTITIONS_PER_PAGE};
use crate::store::scripts::{self, Code};
use crate::store::{arg, Store, StoreResult};

/// One dead letter, as listed and replayed.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    /// Stream entry id.
    pub entry_id: String,
    /// Partition of the stream.
    #[serde(skip)]
    pub partition: u16,
    /// The job's internal id (`<tenant>/<id>` outside the default
    /// tenant): what the store knows it by.
    #[serde(skip)]
    pub id: String,
    /// The job's id within its tenant.
    #[serde(rename = "id")]
    pub job_id: String,
    /// The job's tenant.
    pub tenant: String,
    /// Topic.
    pub topic: String,
    /// Attempts made.
    pub attempts: u32,
    /// `kind: message` of the last failure.
    pub last_error: String,
    /// Last HTTP status, if a response came.
    pub last_status: Option<u16>,
    /// When it was dead-lettered (RFC 3339).
    pub dead_at: String,
    /// Dead-lettered at, epoch ms.
    #[serde(skip)]
    pub dead_at_ms: i64,
    /// The job's spec JSON (what a replay revives).
    #[serde(skip)]
    pub job_json: String,
    /// The job as a client would write it (RFC 3339 times, humantime
    /// durations), for display.
    pub job: serde_json::Value,
}

impl DeadLetter {
    /// Reads a stream entry. A listing shows the job `with_body` false:
    /// without `body` and `body_text`, which are then never turned into
    /// JSON values (reading the one dead letter shows them).
    fn from_entry(partition: u16, entry: &StreamId, with_body: bool) -> Option<DeadLetter> {
        let text = |name: &str| -> Option<String> { entry.get(name) };
        let id = text("id")?;
        let job_json = text("job").unwrap_or_default();
        let dead_at_ms: i64 = text("dead_at")
            .and_then(|v| v.parse().ok())
            .unwrap_or_default();
        let (tenant, job_id) = crate::tenant::split_id(&id);
        let (tenant, job_id) = (tenant.to_string(), job_id.to_string());
        Some(DeadLetter {
            entry_id: entry.id.clone(),
            partition,
            id,
            job_id,
            tenant,
            topic: text("topic").unwrap_or_else(|| crate::job::DEFAULT_TOPIC.into()),
            attempts: text("attempts")
                .and_then(|v| v.parse().ok())
                .unwrap_or_default(),
            last_error: text("last_error").unwrap_or_default(),
            last_status: text("last_status").and_then(|v| v.parse().ok()),
            dead_at: crate::job::format_ms(dead_at_ms),
            dead_at_ms,
            job: serde_json::from_str::<crate::job::JobSpec>(&job_json)
                .map(|mut spec| {
                    // The due time the job was created with (its record's
                    // header kept it; the spec JSON leaves it out).
                    if let Some(given) = text("given").and_then(|g| g.parse().ok()) {
                        spec.restore_given(given);
                    }
                    if !with_body {
                        spec.body = None;
                        spec.body_text = None;
                    }
                    spec.to_shown_json()
                })
                .unwrap_or(serde_json::Value::Null),
            job_json,
        })
    }
}

/// The bytes of a stream entry's values (what reading it cost).
fn entry_bytes(entry: &StreamId) -> usize {
    entry
        .map
        .values()
        .map(|v| match v {
            redis::Value::BulkString(bytes) => bytes.len(),
            _ => 8,
        })
        .sum()
}

impl Store {
    /// Pages through dead letters, oldest first per partition, optionally of
    /// one tenant, of one topic and dead-lettered at or after `since_ms`.
    /// Like the topic, the tenant filters what a page read: a page may hold
    /// fewer than `limit` (even none) while `next_cursor` says more follow.
    pub(crate) async fn list_dead(
        &self,
        tenant: Option<&str>,
        topic: Option<&str>,
        since_ms: Option<i64>,
        limit: usize,
        cursor: Option<Cursor>,
    ) -> StoreResult<Page<DeadLetter>> {
        let initial = since_ms.map_or_else(|| "-".to_string(), |ms| format!("{}", ms.max(0)));
        let partitions = self.keys.partitions();
        let mut cursor = cursor.unwrap_or_else(|| Cursor::start(0, &initial));
        let mut items = Vec::new();
        let mut visited = 0;
        let mut budget = ReadBudget::new();
        let mut conn = self.conn.clone();
        while cursor.partition < partitions
            && items.len() < limit
            && visited < MAX_PARTITIONS_PER_PAGE
            && !budget.exhausted(items.len())
        {
            let p = cursor.partition;
            let want = budget.batch(limit - items.len());
            let reply: StreamRangeReply = redis::cmd("XRANGE")
                .arg(self.keys.dead(p))
                .arg(&cursor.position)
                .arg("+")
                .arg("COUNT")
                .arg(want)
                .query_async(&mut conn)
                .await?;
            let full = reply.ids.len() == want;
            let last = reply.ids.last().map(|e| format!("({}", e.id));
            for entry in &reply.ids {
                budget.spend(entry_bytes(entry));
                if let Some(dead) = DeadLetter::from_entry(p, entry, false) {
                    if topic.is_none_or(|t| t == dead.topic)
                        && tenant.is_none_or(|t| t == dead.tenant)
                    {
                        items.push(dead);
                    }
                }
            }
            cursor = match (full, last) {
                (true, Some(position)) => Cursor::start(p, &position),
                _ => {
                    visited += 1;
                    Cursor::start(p + 1, &initial)
                }
            };
        }
        Ok(Page {
            items,
            next_cursor: (cursor.partition < partitions).then(|| cursor.encode()),
        })
    }

    /// The newest dead letter of job `id`: its entry is named by the
    /// partition's dead-letter index (or, for a dead letter made before the
    /// index and not yet indexed, by the dead job's record), so a lookup
    /// reads one entry and never walks the stream.
    pub async fn find_dead(&self, id: &str) -> StoreResult<Option<DeadLetter>> {
        let p = self.home_of(id).await?;
        let mut conn = self.conn.clone();
        let indexed: Option<String> = redis::cmd("HGET")
            .arg(self.keys.dead_index(p))
            .arg(id)
            .query_async(&mut conn)
            .await?;
        let entry_id = match indexed {
            Some(entry) => Some(entry),
            None => self
                .record_header(p, id)
                .await?
                .and_then(|h| h.dead_letter_entry()),
        };
        let Some(entry_id) = entry_id else {
            return Ok(None);
        };
        let reply: StreamRangeReply = redis::cmd("XRANGE")
            .arg(self.keys.dead(p))
            .arg(&entry_id)
            .arg(&entry_id)
            .query_async(&mut conn)
            .await?;
        Ok(reply
            .ids
            .first()
            .and_then(|e| DeadLetter::from_entry(p, e, true))
            .filter(|dead| dead.id == id))
    }

    /// Deletes job `id`'s newest dead letter; false when it has none.
    pub(crate) async fn drop_dead(&self, id: &str) -> StoreResult<bool> {
        let Some(dead) = self.find_dead(id).await? else {
            return Ok(false);
        };
        let p = dead.partition;
        let code: Code = self
            .invoke_acked(
                &scripts::DROP_DEAD,
                &[&self.keys.dead(p), &self.keys.dead_index(p)],
                &[arg(&id), arg(&dead.entry_id)],
            )
            .await?;
        Ok(code == Code::Done)
    }

    /// Indexes the dead letters of partitions whose index is not complete
    /// yet (those made by a hookq from before the index), walking each such
    /// stream once, oldest first; the number of entries indexed. An empty
    /// stream costs two reads and writes nothing. Safe to run beside live
    /// traffic and from several daemons at once.
    pub(crate) async fn index_dead_letters(&self) -> StoreResult<u64> {
        let mut indexed = 0;
        let mut conn = self.conn.clone();
        for p in 0..self.keys.partitions() {
            let complete: bool = redis::cmd("HEXISTS")
                .arg(self.keys.dead_index(p))
                .arg("~complete")
                .query_async(&mut conn)
                .await?;
            if complete {
                continue;
            }
            let mut from = "-".to_string();
            loop {
                let reply: StreamRangeReply = redis::cmd("XRANGE")
                    .arg(self.keys.dead(p))
                    .arg(&from)
                    .arg("+")
                    .arg("COUNT")
                    .arg(INDEX_BATCH)
                    .query_async(&mut conn)
                    .await?;
                if reply.ids.is_empty() && from == "-" {
                    // No dead letters: nothing to index, nothing written.
                    break;
                }
                let last = reply.ids.len() < INDEX_BATCH;
                let mut args = vec![arg(&if last { 1 } else { 0 })];
                for entry in &reply.ids {
                    if let Some(id) = entry.get::<String>("id") {
                        args.push(arg(&id));
                        args.push(arg(&entry.id));
                    }
                }
                let written: u64 = self
                    .invoke(
                        &scripts::INDEX_DEAD,
                        &[&self.keys.dead(p), &self.keys.dead_index(p)],
                        &args,
                    )
                    .await?;
                indexed += written;
                match reply.ids.last() {
                    Some(entry) if !last => from = format!("({}", entry.id),
                    _ => break,
                }
            }
        }
        Ok(indexed)
    }
}

/// Stream entries handed to one `index_dead` call.
const INDEX_BATCH: usize = 32;
