//! Finished-job summaries, on the Rust side. A delivered or cancelled job
//! (unless `retention.keep_bodies`) leaves no record but a summary of at
//! most 64 bytes, one field of a small hash, with its attempt history in
//! compact form (11 bytes an earlier attempt; a history that does not fit
//! goes on in continuation fields of the same hash, each at most 64 bytes);
//! `lua/prelude.lua` documents the layout and its scripts write every one.
//! This module builds the part of a summary the daemon supplies on delivery
//! (the tail), finds a summary by id (the same hash and shard address as
//! the scripts) and decodes it for views, listings and `hookq show`.

use super::JobRecord;
use crate::job::{JobSpec, State};

/// Most bytes of a summary: what keeps its hash in the listpack encoding
/// under Redis's stock `hash-max-listpack-value`.
pub(crate) const SUMMARY_MAX: usize = 64;

/// Bytes of the head the scripts write (state, attempts, max, created,
/// finished).
const HEAD_LEN: usize = 17;

/// Bytes of the tail before the topic (digest, last attempt, topic length).
const TAIL_FIXED: usize = 21;

/// The topic length's bit saying earlier attempts follow the topic.
const HAS_EARLIER: u8 = 0x80;

/// The earlier-attempt count's bit saying the newest one kept is attempt
/// `attempts - 1` (a cancel found an attempt in flight).
const BEHIND: u8 = 0x80;

/// Bytes of an earlier attempt: ms before the finish (5), duration ms (4),
/// status or error kind (2).
const ENTRY_LEN: usize = 11;

/// Error kinds of earlier attempts, coded 1000 + their place from 1 (the
/// prelude's `SUMMARY_KINDS`).
const KINDS: [&str; 8] = [
    "http_status",
    "redirect",
    "timeout",
    "connect",
    "ssrf_blocked",
    "request",
    "invalid_job",
    "lease_expired",
];

/// The field of continuation piece `k` (from 1) of `id`'s summary: `#<k><id>`
/// (no id has a `#`).
pub(crate) fn continuation_field(id: &str, k: usize) -> String {
    format!("#{k}{id}")
}

/// Whether a summary shard's field is a continuation piece, not an id.
pub(crate) fn is_continuation(field: &str) -> bool {
    field.starts_with('#')
}

/// Most continuation fields a summary has (`#1` to `#9`).
const MAX_CONTINUATIONS: usize = 9;

/// How many continuation fields may follow the summary whose first piece
/// is `value`: none unless it keeps earlier attempts and fills its 64
/// bytes (a piece shorter than that is the last).
pub(crate) fn continuations(value: &[u8]) -> usize {
    match value.get(HEAD_LEN + TAIL_FIXED - 1) {
        Some(topic_byte) if topic_byte & HAS_EARLIER != 0 && value.len() == SUMMARY_MAX => {
            MAX_CONTINUATIONS
        }
        _ => 0,
    }
}

/// A whole summary: its first piece `first`, then continuation pieces
/// `rest` (fields `#1`, `#2`, ... in order; None when absent), each taken
/// while the one before filled its 64 bytes.
pub(crate) fn join<'a>(first: &[u8], rest: impl IntoIterator<Item = Option<&'a [u8]>>) -> Vec<u8> {
    let mut whole = first.to_vec();
    let mut full = continuations(first) > 0;
    for piece in rest {
        match piece {
            Some(piece) if full => {
                whole.extend_from_slice(piece);
                full = piece.len() == SUMMARY_MAX;
            }
            _ => break,
        }
    }
    whole
}

/// The 32-bit hash of an id that places it in a bucket's shard (the
/// prelude's `id_hash`): a polynomial over its last 8 bytes, then one round
/// of murmur3's finaliser, so ids differing only in their last characters
/// spread evenly. Cheap, since the scripts compute it in Lua.
pub(crate) fn id_hash(id: &str) -> u32 {
    let bytes = id.as_bytes();
    let tail = &bytes[bytes.len().saturating_sub(8)..];
    let mut h = tail.iter().fold(0u64, |h, b| h * 31 + u64::from(*b)) as u32;
    h = (h ^ (h >> 16)).wrapping_mul(0x85eb_ca6b);
    h ^ (h >> 13)
}

/// The shard of hash `h` in a bucket of `shards` shards (linear hashing;
/// the prelude's `summary_shard`).
pub(crate) fn shard_of(h: u32, shards: u32) -> u32 {
    let shards = shards.max(1);
    let base = 1u32 << (31 - shards.leading_zeros());
    let a = h % (base * 2);
    if a >= shards {
        h % base
    } else {
        a
    }
}

/// One bucket of the partition's summary index (`<ns>:{p}:done`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Start of the bucket's finish-time span, epoch ms (the field name).
    pub start: String,
    /// Shards the bucket is split into.
    pub shards: u32,
    /// Fields written into it: a summary's, and its continuation fields
    /// (what its shards split by).
    pub count: u64,
    /// When its shards expire, epoch ms.
    pub expires: i64,
}

impl Bucket {
    /// Parses one index entry: field `<start>`, value `<shards>:<count>:<expires>`.
    pub(crate) fn parse(start: &str, value: &str) -> Option<Bucket> {
        let mut parts = value.split(':');
        let bucket = Bucket {
            start: start.to_string(),
            shards: parts.next()?.parse().ok()?,
            count: parts.next()?.parse().ok()?,
            expires: parts.next()?.parse().ok()?,
        };
        start.parse::<i64>().ok()?;
        Some(bucket)
    }

    /// The bucket's start as a number (for ordering).
    pub(crate) fn start_ms(&self) -> i64 {
        self.start.parse().unwrap_or_default()
    }
}

/// The last attempt a summary keeps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LastAttempt<'a> {
    /// Attempt start, epoch ms.
    pub at: i64,
    /// Its duration in ms.
    pub duration_ms: u64,
    /// The HTTP status, if a response came.
    pub status: Option<u16>,
    /// `kind: message` of a failure, or "".
    pub error: &'a str,
}

/// The tail of a summary the daemon supplies when it records a delivery:
/// the content digest, the last attempt and the topic, then as much of the
/// error text as fits in [`SUMMARY_MAX`].
pub(crate) fn summary_tail(digest: [u8; 8], topic: &str, last: &LastAttempt<'_>) -> Vec<u8> {
    let topic = &topic.as_bytes()[..topic.len().min(127)];
    let mut tail = Vec::with_capacity(SUMMARY_MAX - HEAD_LEN);
    tail.extend_from_slice(&digest);
    tail.extend_from_slice(&(last.at.max(0) as u64).to_be_bytes()[2..]);
    tail.extend_from_slice(&(last.duration_ms.min(u64::from(u32::MAX)) as u32).to_be_bytes());
    tail.extend_from_slice(&last.status.unwrap_or(0).to_be_bytes());
    tail.push(topic.len() as u8);
    tail.extend_from_slice(topic);
    let room = SUMMARY_MAX.saturating_sub(HEAD_LEN + tail.len());
    let mut cut = last.error.len().min(room);
    while !last.error.is_char_boundary(cut) {
        cut -= 1;
    }
    tail.extend_from_slice(&last.error.as_bytes()[..cut]);
    tail
}

/// The counters of a summary's head, after its state byte and before its
/// finish time, as `complete_jobs.lua` takes them from the daemon: the
/// attempt number and the attempts allowed (2 bytes each), then the
/// creation time (6 bytes), big-endian.
pub(crate) fn summary_counters(attempt: u32, max_attempts: u16, created: i64) -> [u8; 10] {
    let mut counters = [0; 10];
    counters[..2].copy_from_slice(&(attempt.min(u32::from(u16::MAX)) as u16).to_be_bytes());
    counters[2..4].copy_from_slice(&max_attempts.to_be_bytes());
    counters[4..].copy_from_slice(&(created.max(0) as u64).to_be_bytes()[2..]);
    counters
}

/// A 2xx attempt to record, prepared for the store's retention mode: only
/// what that mode keeps is built (see [`super::Store::delivery`]).
#[derive(Debug, Clone)]
pub struct Delivery {
    /// What the finished job keeps.
    pub kept: Kept,
    /// The job's ordering list ([`JobSpec::ordering_list`]): it leaves it.
    pub order: Option<String>,
}

/// What a delivered job keeps, by retention mode.
#[derive(Debug, Clone)]
pub enum Kept {
    /// `retention.keep_bodies`: the attempt record JSON, pushed to the
    /// job's history.
    Whole(String),
    /// The default: the job's [`summary_tail`].
    Summarized(Vec<u8>),
}

impl Delivery {
    /// A delivery under `retention.keep_bodies` of a job without an
    /// ordering key, with attempt record JSON `record`.
    pub fn whole(record: String) -> Delivery {
        Delivery {
            kept: Kept::Whole(record),
            order: None,
        }
    }

    /// A delivery of the job with `spec`: under `keep_bodies` its attempt
    /// record JSON (`record`, built only then), else its summary tail from
    /// the attempt's summary fields.
    pub(crate) fn new(
        keep_bodies: bool,
        spec: &JobSpec,
        record: impl FnOnce() -> String,
        last: &LastAttempt<'_>,
    ) -> Delivery {
        let kept = if keep_bodies {
            Kept::Whole(record())
        } else {
            Kept::Summarized(summary_tail(spec.content_digest(), &spec.topic, last))
        };
        Delivery {
            kept,
            order: spec.ordering_list(),
        }
    }

    /// A delivery read from a stored spec JSON and an attempt record JSON
    /// (fields it lacks count as absent).
    pub(crate) fn from_json(keep_bodies: bool, spec_json: &str, record: &str) -> Delivery {
        let spec = serde_json::from_str::<JobSpec>(spec_json)
            .unwrap_or_else(|_| JobSpec::summary_of(crate::job::DEFAULT_TOPIC.into()));
        let attempt: serde_json::Value = serde_json::from_str(record).unwrap_or_default();
        let number = |k: &str| attempt.get(k).and_then(serde_json::Value::as_u64);
        let text = |k: &str| attempt.get(k).and_then(serde_json::Value::as_str);
        let error = match (text("error"), text("message")) {
            (Some(kind), Some(message)) => format!("{kind}: {message}"),
            (Some(kind), None) => kind.to_string(),
            _ => String::new(),
        };
        let last = LastAttempt {
            at: number("at").unwrap_or(0) as i64,
            duration_ms: number("duration_ms").unwrap_or(0),
            status: number("status").and_then(|s| u16::try_from(s).ok()),
            error: &error,
        };
        Delivery::new(keep_bodies, &spec, || record.to_string(), &last)
    }
}

fn be(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0, |n, b| (n << 8) | u64::from(*b))
}

/// An earlier attempt a summary keeps, in compact form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Earlier {
    /// Start, epoch ms.
    pub at: i64,
    /// Duration, ms.
    pub duration_ms: u64,
    /// HTTP status (100..=999), 1000 + the place of its error kind in
    /// the kinds list (from 1), 1999 another kind, 0 unknown.
    pub code: u16,
}

impl Earlier {
    /// The status and error kind the code stands for (a status's kind is
    /// `redirect` for a 3xx, `http_status` for any other non-2xx, as the
    /// deliverer names them).
    fn status_and_kind(&self) -> (Option<u16>, Option<&'static str>) {
        match self.code {
            100..=999 => {
                let kind = match self.code {
                    200..=299 => None,
                    300..=399 => Some("redirect"),
                    _ => Some("http_status"),
                };
                (Some(self.code), kind)
            }
            1001..=1008 => (None, Some(KINDS[usize::from(self.code - 1001)])),
            1000..=1999 => (None, Some("unknown")),
            _ => (None, None),
        }
    }

    /// The attempt as an attempt record JSON (`attempt` when known; no
    /// duration for a lost lease, as its record has none).
    fn record(&self, attempt: Option<u32>) -> serde_json::Value {
        let (status, kind) = self.status_and_kind();
        let mut record = serde_json::json!({ "at": self.at });
        if let Some(n) = attempt {
            record["attempt"] = n.into();
        }
        if kind != Some("lease_expired") {
            record["duration_ms"] = self.duration_ms.into();
        }
        if let Some(status) = status {
            record["status"] = status.into();
        }
        if let Some(kind) = kind {
            record["error"] = kind.into();
        }
        record
    }
}

/// A decoded summary.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Delivered or cancelled.
    pub state: State,
    /// Attempts made.
    pub attempts: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// Created, epoch ms.
    pub created: i64,
    /// Finished, epoch ms.
    pub finished: i64,
    /// Content digest.
    pub digest: [u8; 8],
    /// Last attempt's start, epoch ms (0: never attempted).
    pub last_at: i64,
    /// Last attempt's duration, ms.
    pub last_duration_ms: u64,
    /// Last attempt's HTTP status (0: none).
    pub last_status: u16,
    /// Topic.
    pub topic: String,
    /// Last error text (`kind: message`, maybe cut short).
    pub last_error: String,
    /// The attempts before the last, newest first (as many as the pieces
    /// given to [`Summary::parse`] hold).
    pub earlier: Vec<Earlier>,
    /// The last attempt kept is attempt `attempts - 1` (cancelled with an
    /// attempt in flight).
    pub behind: bool,
}

impl Summary {
    /// The finish time of the summary whose first piece is `value` (read
    /// from its head alone: a long topic may go on in the next piece), or
    /// None when it is not one hookq wrote.
    pub(crate) fn finished_of(value: &[u8]) -> Option<i64> {
        match value.first() {
            Some(b'd' | b'c') if value.len() >= HEAD_LEN + TAIL_FIXED => {
                Some(be(&value[11..17]) as i64)
            }
            _ => None,
        }
    }

    /// Decodes a stored summary: its first piece, then its continuation
    /// pieces (see [`continuations`]) concatenated; None when it is not
    /// one hookq wrote.
    pub(crate) fn parse(value: &[u8]) -> Option<Summary> {
        if value.len() < HEAD_LEN + TAIL_FIXED {
            return None;
        }
        let state = match value[0] {
            b'd' => State::Delivered,
            b'c' => State::Cancelled,
            _ => return None,
        };
        let topic_byte = value[HEAD_LEN + TAIL_FIXED - 1];
        let topic_len = usize::from(topic_byte & !HAS_EARLIER);
        let topic_end = HEAD_LEN + TAIL_FIXED + topic_len;
        let topic = value.get(HEAD_LEN + TAIL_FIXED..topic_end)?;
        let finished = be(&value[11..17]) as i64;
        let (earlier, behind, text_start) = if topic_byte & HAS_EARLIER != 0 {
            let count = *value.get(topic_end)?;
            let start = topic_end + 1;
            let n = usize::from(count & !BEHIND);
            let earlier = value[start..]
                .chunks_exact(ENTRY_LEN)
                .take(n)
                .map(|e| Earlier {
                    at: finished - be(&e[0..5]) as i64,
                    duration_ms: be(&e[5..9]),
                    code: be(&e[9..11]) as u16,
                })
                .collect();
            (earlier, count & BEHIND != 0, start + n * ENTRY_LEN)
        } else {
            (Vec::new(), false, topic_end)
        };
        let mut digest = [0u8; 8];
        digest.copy_from_slice(&value[17..25]);
        Some(Summary {
            state,
            attempts: be(&value[1..3]) as u32,
            max_attempts: be(&value[3..5]) as u32,
            created: be(&value[5..11]) as i64,
            finished,
            digest,
            last_at: be(&value[25..31]) as i64,
            last_duration_ms: be(&value[31..35]),
            last_status: be(&value[35..37]) as u16,
            topic: String::from_utf8_lossy(topic).into_owned(),
            last_error: value
                .get(text_start..)
                .map(|t| String::from_utf8_lossy(t).into_owned())
                .unwrap_or_default(),
            earlier,
            behind,
        })
    }

    /// The last attempt as an attempt record JSON.
    fn last_record(&self, attempt: Option<u32>) -> serde_json::Value {
        let mut record = serde_json::json!({
            "at": self.last_at,
            "duration_ms": self.last_duration_ms,
        });
        if let Some(n) = attempt {
            record["attempt"] = n.into();
        }
        if self.last_status > 0 {
            record["status"] = self.last_status.into();
        }
        if !self.last_error.is_empty() {
            let (kind, message) = match self.last_error.split_once(": ") {
                Some((kind, message)) => (kind, Some(message)),
                None => (self.last_error.as_str(), None),
            };
            record["error"] = kind.into();
            if let Some(message) = message {
                record["message"] = message.into();
            }
        }
        record
    }

    /// The summary as a job record: its topic, counts and times, and its
    /// attempts as the history, newest first (numbered down from the last
    /// one's; no url, headers or body).
    pub(crate) fn into_record(self, id: &str) -> JobRecord {
        let mut history = Vec::new();
        if self.last_at > 0 {
            let newest = self.attempts.saturating_sub(u32::from(self.behind));
            let number = |i: usize| {
                u32::try_from(i)
                    .ok()
                    .and_then(|i| newest.checked_sub(i))
                    .filter(|n| *n > 0)
            };
            history.push(self.last_record(number(0)).to_string());
            for (i, earlier) in self.earlier.iter().enumerate() {
                history.push(earlier.record(number(i + 1)).to_string());
            }
        }
        JobRecord {
            id: id.to_string(),
            spec_json: String::new(),
            spec: JobSpec::summary_of(self.topic),
            state: self.state,
            attempts: self.attempts,
            max_attempts: self.max_attempts,
            due: self.finished,
            created: self.created,
            updated: self.finished,
            history,
            summarized: true,
            held: false,
            waiting_for: None,
            holder: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_follow_linear_hashing() {
        // With 3 shards, shard 0 has been split into 0 and 2; 1 has not.
        assert_eq!(shard_of(4, 3), 0);
        assert_eq!(shard_of(6, 3), 2);
        assert_eq!(shard_of(5, 3), 1);
        assert_eq!(shard_of(7, 3), 1);
        assert_eq!(shard_of(123, 1), 0);
        for h in 0..1000 {
            for n in 1..70 {
                assert!(shard_of(h, n) < n);
            }
        }
        // Ids that differ only at the end spread over every shard.
        let mut per_shard = [0u32; 64];
        for i in 0..6400 {
            per_shard[shard_of(id_hash(&format!("job-{i:05}")), 64) as usize] += 1;
        }
        assert!(
            per_shard.iter().all(|n| (60..=140).contains(n)),
            "{per_shard:?}"
        );
    }

    #[test]
    fn a_summary_round_trips_within_64_bytes() {
        let last = LastAttempt {
            at: 1_700_000_000_123,
            duration_ms: 42,
            status: Some(503),
            error: "http_status: the receiver answered 503 Service Unavailable",
        };
        let tail = summary_tail([7; 8], "orders", &last);
        let mut value = vec![b'c', 0, 3, 0, 9];
        value.extend_from_slice(&1_600_000_000_000u64.to_be_bytes()[2..]);
        value.extend_from_slice(&1_700_000_000_500u64.to_be_bytes()[2..]);
        value.extend_from_slice(&tail);
        assert_eq!(value.len(), SUMMARY_MAX);
        let s = Summary::parse(&value).expect("a summary");
        assert_eq!(
            (s.state, s.attempts, s.max_attempts),
            (State::Cancelled, 3, 9)
        );
        assert_eq!(
            (s.created, s.finished),
            (1_600_000_000_000, 1_700_000_000_500)
        );
        assert_eq!(
            (s.last_at, s.last_duration_ms, s.last_status),
            (1_700_000_000_123, 42, 503)
        );
        assert_eq!(s.topic, "orders");
        assert_eq!(s.digest, [7; 8]);
        assert!(last.error.starts_with(&s.last_error) && !s.last_error.is_empty());
        let view = s.into_record("job-1").view();
        assert!(view.summarized && view.url.is_none());
        assert_eq!(view.history[0]["error"], "http_status");
        assert_eq!(view.history[0]["status"], 503);
        assert!(Summary::parse(&value[..30]).is_none());
    }

    /// A summary as the prelude's `summary_pieces` lays it out: `base`
    /// (head and tail without error text) with `entries` (each `(ms before
    /// the finish, duration, code)`), `behind`, then `error`, in pieces of
    /// 64 bytes. Written here from the layout, so a Rust reading that drifts
    /// from the documented one fails.
    fn pieces(base: &[u8], entries: &[(u64, u32, u16)], behind: bool, error: &str) -> Vec<Vec<u8>> {
        let mut blob = base.to_vec();
        let topic_at = HEAD_LEN + TAIL_FIXED - 1;
        blob[topic_at] |= 0x80;
        blob.push(entries.len() as u8 | if behind { 0x80 } else { 0 });
        for (before, took, code) in entries {
            blob.extend_from_slice(&before.to_be_bytes()[3..]);
            blob.extend_from_slice(&took.to_be_bytes());
            blob.extend_from_slice(&code.to_be_bytes());
        }
        let size = (blob.len() + error.len().min(32)).div_ceil(SUMMARY_MAX) * SUMMARY_MAX;
        let room = size - blob.len();
        blob.extend_from_slice(&error.as_bytes()[..error.len().min(room)]);
        blob.chunks(SUMMARY_MAX).map(<[u8]>::to_vec).collect()
    }

    fn base(state: u8, attempts: u16, finished: i64, last: &LastAttempt<'_>) -> Vec<u8> {
        let mut value = vec![state];
        value.extend_from_slice(&summary_counters(u32::from(attempts), 9, 1_600_000_000_000));
        value.extend_from_slice(&(finished as u64).to_be_bytes()[2..]);
        let bare = LastAttempt { error: "", ..*last };
        value.extend_from_slice(&summary_tail([7; 8], "orders.paid", &bare));
        value
    }

    const FINISHED: i64 = 1_700_000_100_000;

    fn delivered_last() -> LastAttempt<'static> {
        LastAttempt {
            at: FINISHED - 20,
            duration_ms: 12,
            status: Some(204),
            error: "",
        }
    }

    #[test]
    fn one_earlier_attempt_fits_in_the_value_in_twelve_bytes() {
        let first = base(b'd', 1, FINISHED, &delivered_last());
        let second = pieces(
            &base(b'd', 2, FINISHED, &delivered_last()),
            &[(60_050, 31, 500)],
            false,
            "",
        );
        assert_eq!(second.len(), 1, "one field");
        assert_eq!(second[0].len(), first.len() + 12);
        assert!(second[0].len() < SUMMARY_MAX);
        assert_eq!(continuations(&second[0]), 0);
        assert_eq!(continuations(&first), 0);
        let s = Summary::parse(&second[0]).expect("a summary");
        assert_eq!(
            s.earlier,
            [Earlier {
                at: FINISHED - 60_050,
                duration_ms: 31,
                code: 500
            }]
        );
        let view = s.into_record("job-1").view();
        assert_eq!(view.history.len(), 2, "{:?}", view.history);
        assert_eq!(view.history[0]["attempt"], 2);
        assert_eq!(view.history[0]["status"], 204);
        assert!(view.history[0].get("error").is_none());
        assert_eq!(view.history[1]["attempt"], 1);
        assert_eq!(view.history[1]["status"], 500);
        assert_eq!(view.history[1]["error"], "http_status");
        assert_eq!(view.history[1]["duration_ms"], 31);
        assert_eq!(
            view.history[1]["at"],
            crate::job::format_ms(FINISHED - 60_050)
        );
        // A summary without history (as every one written before) reads
        // as before: the last attempt alone.
        let old = Summary::parse(&first).expect("a summary");
        assert!(old.earlier.is_empty() && !old.behind);
        assert_eq!(old.into_record("job-0").view().history.len(), 1);
    }

    #[test]
    fn a_long_history_goes_on_in_continuation_pieces() {
        let last = LastAttempt {
            at: FINISHED - 5,
            duration_ms: 3,
            status: None,
            error: "",
        };
        // Codes: a 302, every kind, another kind, unknown; then more.
        let mut entries: Vec<(u64, u32, u16)> = vec![(100, 1, 302)];
        entries.extend((1001..=1008).map(|c| (u64::from(c) * 1000, 7, c)));
        entries.extend([(2_000_000, 8, 1999), (3_000_000, 9, 0)]);
        entries.extend((0..9).map(|i| (4_000_000 + i, 10, 503)));
        assert_eq!(entries.len(), 20);
        let error = "timeout: no complete response within 10s, and a long message after it";
        let all = pieces(&base(b'c', 21, FINISHED, &last), &entries, false, error);
        assert!(all.len() > 3 && all.iter().all(|p| p.len() <= SUMMARY_MAX));
        assert_eq!(continuations(&all[0]), MAX_CONTINUATIONS);
        // Pieces are read up to the first absent one, and only while the
        // one before was full.
        let mut read: Vec<Option<&[u8]>> = all[1..].iter().map(|p| Some(p.as_slice())).collect();
        read.extend([None, Some(b"stray".as_slice())]);
        let short = &all[0][..SUMMARY_MAX - 1];
        assert_eq!(join(short, [Some(b"stray".as_slice())]), short);
        let whole = join(&all[0], read);
        assert_eq!(whole, all.concat());
        let s = Summary::parse(&whole).expect("a summary");
        assert_eq!(s.earlier.len(), 20);
        assert!(error.starts_with(&s.last_error), "{}", s.last_error);
        let view = s.into_record("job-2").view();
        let h = &view.history;
        assert_eq!(h.len(), 21);
        assert_eq!(
            (h[0]["attempt"].as_u64(), h[20]["attempt"].as_u64()),
            (Some(21), Some(1))
        );
        assert_eq!(
            (&h[1]["status"], &h[1]["error"]),
            (&serde_json::json!(302), &serde_json::json!("redirect"))
        );
        let kinds: Vec<&str> = h[2..=9]
            .iter()
            .map(|a| a["error"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(kinds, KINDS);
        assert!(h[2..=9].iter().all(|a| a.get("status").is_none()));
        assert!(
            h[9].get("duration_ms").is_none(),
            "a lost lease has no duration: {}",
            h[9]
        );
        assert_eq!(h[8]["duration_ms"], 7);
        assert_eq!(h[10]["error"], "unknown");
        assert!(h[11].get("error").is_none() && h[11].get("status").is_none());
        assert_eq!(h[20]["status"], 503);
        // Only the first piece read: the entries it holds, no garbage.
        let s = Summary::parse(&all[0]).expect("a summary");
        assert!(s.earlier.len() < 20 && s.last_error.is_empty());
    }

    #[test]
    fn a_cancel_behind_an_attempt_in_flight_numbers_the_kept_ones_below_it() {
        let last = LastAttempt {
            at: FINISHED - 300,
            duration_ms: 40,
            status: None,
            error: "connect: connection refused",
        };
        let all = pieces(
            &base(b'c', 3, FINISHED, &last),
            &[(900, 2, 1004)],
            true,
            last.error,
        );
        // The error text's first 32 bytes did not fit after the entry:
        // they have a piece.
        assert_eq!(all.len(), 2);
        let s = Summary::parse(&join(&all[0], [Some(all[1].as_slice())])).expect("a summary");
        assert!(last.error.starts_with(&s.last_error) && s.last_error.len() > 20);
        assert!(s.behind);
        let view = s.into_record("job-3").view();
        assert_eq!(view.attempts, 3);
        assert_eq!(view.history[0]["attempt"], 2);
        assert_eq!(view.history[0]["error"], "connect");
        assert_eq!(view.history[1]["attempt"], 1);
        assert_eq!(view.history[1]["error"], "connect");
    }

    #[test]
    fn continuation_fields_are_no_ids() {
        let field = continuation_field("job-1", 3);
        assert_eq!(field, "#3job-1");
        assert!(is_continuation(&field) && !is_continuation("job-1"));
        assert!(crate::job::validate_id(&field).is_err());
    }
}
