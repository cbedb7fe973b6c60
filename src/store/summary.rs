//! Finished-job summaries, on the Rust side. A delivered or cancelled job
//! (unless `retention.keep_bodies`) leaves no record but a summary of at
//! most 64 bytes, one field of a small hash; `lua/prelude.lua` documents the
//! layout and its scripts write every one. This module builds the part of a
//! summary the daemon supplies on delivery (the tail), finds a summary by id
//! (the same hash and shard address as the scripts) and decodes it for
//! views, listings and `hookq show`.

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
    /// Summaries written into it.
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
    let topic = &topic.as_bytes()[..topic.len().min(255)];
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
}

impl Summary {
    /// Decodes a stored summary; None when it is not one hookq wrote.
    pub(crate) fn parse(value: &[u8]) -> Option<Summary> {
        if value.len() < HEAD_LEN + TAIL_FIXED {
            return None;
        }
        let state = match value[0] {
            b'd' => State::Delivered,
            b'c' => State::Cancelled,
            _ => return None,
        };
        let topic_len = usize::from(value[HEAD_LEN + TAIL_FIXED - 1]);
        let topic_end = HEAD_LEN + TAIL_FIXED + topic_len;
        let topic = value.get(HEAD_LEN + TAIL_FIXED..topic_end)?;
        let mut digest = [0u8; 8];
        digest.copy_from_slice(&value[17..25]);
        Some(Summary {
            state,
            attempts: be(&value[1..3]) as u32,
            max_attempts: be(&value[3..5]) as u32,
            created: be(&value[5..11]) as i64,
            finished: be(&value[11..17]) as i64,
            digest,
            last_at: be(&value[25..31]) as i64,
            last_duration_ms: be(&value[31..35]),
            last_status: be(&value[35..37]) as u16,
            topic: String::from_utf8_lossy(topic).into_owned(),
            last_error: String::from_utf8_lossy(&value[topic_end..]).into_owned(),
        })
    }

    /// The summary as a job record: its topic, counts and times, and its
    /// last attempt as the history (no url, headers or body).
    pub(crate) fn into_record(self, id: &str) -> JobRecord {
        let mut history = Vec::new();
        if self.last_at > 0 {
            let mut attempt = serde_json::json!({
                "attempt": self.attempts,
                "at": self.last_at,
                "duration_ms": self.last_duration_ms,
            });
            if self.last_status > 0 {
                attempt["status"] = self.last_status.into();
            }
            if !self.last_error.is_empty() {
                let (kind, message) = match self.last_error.split_once(": ") {
                    Some((kind, message)) => (kind, Some(message)),
                    None => (self.last_error.as_str(), None),
                };
                attempt["error"] = kind.into();
                if let Some(message) = message {
                    attempt["message"] = message.into();
                }
            }
            history.push(attempt.to_string());
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
}
