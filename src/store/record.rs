//! A job record as Redis holds it, read on the Rust side: one value (a field
//! of a record hash while the job is live, a string once it finished and is
//! kept whole), a fixed 39-byte binary header followed by the job's spec
//! JSON. The scripts write
//! it (`lua/prelude.lua` documents the same layout and owns every change);
//! this module only decodes it for views, listings and `hookq show`.

use super::{StoreError, StoreResult};
use crate::job::{JobSpec, JobView, State, ViewFacts};

/// Bytes of the header before the spec JSON.
pub(crate) const HEADER_LEN: usize = 39;

/// The partition a placement pointer names (a live-record value
/// `@<partition>` standing for a job that lives in another partition, see
/// [`super::Keys::placed`]), or None when `value` is not one.
pub(crate) fn pointer_of(value: &[u8]) -> Option<u16> {
    let digits = value.strip_prefix(b"@")?;
    if value.len() >= HEADER_LEN || digits.is_empty() {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The spec JSON of record value `value`: the bytes after its header; what
/// is wrong when there are none or they are not UTF-8.
pub(crate) fn spec_json_of(value: &[u8]) -> Result<&str, String> {
    let spec = value
        .get(HEADER_LEN..)
        .ok_or_else(|| "shorter than a record's header".to_string())?;
    std::str::from_utf8(spec).map_err(|e| format!("spec: {e}"))
}

/// What an attempt's outcome takes from its record as its claim read it
/// (see [`super::Lease`]): the lease in ms (0: the daemon's default), the
/// attempts allowed and the creation time; None when `value` is shorter
/// than a header.
pub(crate) fn lease_fields(value: &[u8]) -> Option<(u32, u16, i64)> {
    let h = value.get(..HEADER_LEN)?;
    Some((
        be(&h[29..33]) as u32,
        be(&h[9..11]) as u16,
        be(&h[23..29]) as i64,
    ))
}

/// The fixed header of a job record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// Lifecycle state (a parked job reads as scheduled).
    pub state: State,
    /// Held for its host (parked) while scheduled.
    pub parked: bool,
    /// Waiting in the timing wheel (scheduled far ahead), not the due set.
    pub in_wheel: bool,
    /// Held back behind earlier jobs of its ordering key (state byte `o`):
    /// reads as scheduled before its due time and ready after it.
    pub held: bool,
    /// Last change, epoch ms.
    pub updated: i64,
    /// Attempts started: the record counts those before a claim, and
    /// [`RecordHeader::leased`] adds the one in flight (a failure's
    /// fencing token).
    pub attempts: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// Due time of the pending or last attempt, epoch ms.
    pub due: i64,
    /// Due-set or parking sequence (0: none); for a dead job, its dead
    /// letter's entry id's milliseconds.
    pub seq: u64,
    /// Created, epoch ms.
    pub created: i64,
    /// Lease in ms (0: the daemon's default); for a dead job, its dead
    /// letter's entry id's sequence part.
    pub lease: u32,
    /// The due time as given ([`crate::job::JobSpec::given_due`]).
    pub given: u64,
}

fn be(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0, |n, b| (n << 8) | u64::from(*b))
}

/// How far ahead of this host's clock a waiting job's due time may be for
/// it to be in a round lease: the longest claim ahead (50 ms, by Redis's
/// clock) with room for this host's clock to lag Redis's by up to a
/// minute.
const ROUND_CHECK_AHEAD_MS: i64 = 60_000;

impl RecordHeader {
    /// Decodes the header at the start of `value`; None when it is too short
    /// or its state byte is unknown (not a record hookq wrote). A scheduled
    /// record whose due time has passed reads as ready: `promote_due` moves
    /// its id to the ready list without writing the record.
    pub fn parse(value: &[u8]) -> Option<RecordHeader> {
        let h = value.get(..HEADER_LEN)?;
        let (lease, max_attempts, created) = lease_fields(h)?;
        let due = be(&h[11..17]) as i64;
        let state = match h[0] {
            b's' | b'o' if due <= crate::job::now_ms() => State::Ready,
            b's' | b'w' | b'p' | b'o' => State::Scheduled,
            b'r' => State::Ready,
            b'i' => State::Inflight,
            b'd' => State::Delivered,
            b'x' => State::Dead,
            b'c' => State::Cancelled,
            _ => return None,
        };
        Some(RecordHeader {
            state,
            parked: h[0] == b'p',
            in_wheel: h[0] == b'w',
            held: h[0] == b'o',
            updated: be(&h[1..7]) as i64,
            attempts: be(&h[7..9]) as u32,
            max_attempts: u32::from(max_attempts),
            due,
            seq: be(&h[17..23]),
            created,
            lease,
            given: be(&h[33..39]),
        })
    }

    /// The header as the job's lease reads it: a claim leaves a scheduled
    /// or ready record as it found it, so a job with a lease (`leased`) is
    /// in flight, on the attempt after those the record counts (see "In
    /// flight" in `lua/prelude.lua`). A record of layout 3 says so itself.
    pub(crate) fn leased(mut self, leased: bool) -> RecordHeader {
        if leased && self.waiting() {
            self.state = State::Inflight;
            self.attempts += 1;
        }
        self
    }

    /// Whether the record waits for a claim (scheduled in the due set, or
    /// ready): what a lease, of its own or a round's, makes in flight.
    fn waiting(&self) -> bool {
        matches!(self.state, State::Scheduled | State::Ready)
            && !(self.parked || self.in_wheel || self.held)
    }

    /// Whether the job may be in a live round lease: it waits for a claim
    /// and is due by now plus [`ROUND_CHECK_AHEAD_MS`] (a claim takes a
    /// job at most `delivery.claim_ahead` early). A view reads the live
    /// rounds only then.
    pub(crate) fn may_be_in_round(&self) -> bool {
        self.waiting() && self.due <= crate::job::now_ms().saturating_add(ROUND_CHECK_AHEAD_MS)
    }

    /// The stream entry id of a dead job's dead letter.
    pub fn dead_letter_entry(&self) -> Option<String> {
        (self.state == State::Dead && self.seq > 0).then(|| format!("{}-{}", self.seq, self.lease))
    }
}

/// A job record as read from Redis.
#[derive(Debug, Clone)]
pub struct JobRecord {
    /// Job id.
    pub id: String,
    /// The stored spec JSON, byte for byte (for optimistic changes).
    pub spec_json: String,
    /// Content.
    pub spec: JobSpec,
    /// Lifecycle state.
    pub state: State,
    /// Attempts started.
    pub attempts: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// Due time of the pending or last attempt (epoch ms).
    pub due: i64,
    /// Created (epoch ms).
    pub created: i64,
    /// Last change (epoch ms).
    pub updated: i64,
    /// Attempt records, newest first.
    pub history: Vec<String>,
    /// Only the summary of a finished job remains: `spec` holds its topic
    /// alone and `spec_json` is empty (see [`super::summary`]).
    pub summarized: bool,
    /// Held back behind earlier jobs of its ordering key (the record's
    /// state byte `o`): it is in none of the partition's sets yet.
    pub held: bool,
    /// While held: the id of the job just ahead of it (read only for a
    /// single job's view).
    pub waiting_for: Option<String>,
    /// While held: the job that holds its ordering key, and until when
    /// (read only for a single job's view).
    pub holder: Option<Holder>,
}

/// The job that holds an ordering key: the head of the key's list, the one
/// job of the key that is scheduled, ready or in flight (SPEC §11.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its id.
    pub id: String,
    /// Its due time (epoch ms) while it waits for it; None when it is due
    /// already (ready, in flight, or parked for its host).
    pub until: Option<i64>,
}

impl JobRecord {
    /// Decodes a stored record (header and spec), `leased` when the job
    /// holds a lease (see [`RecordHeader::leased`]); None when there is
    /// none (an empty value: the key does not exist; or a placement
    /// pointer).
    pub(crate) fn decode(
        id: &str,
        value: &[u8],
        history: Vec<String>,
        leased: bool,
    ) -> StoreResult<Option<JobRecord>> {
        if value.is_empty() || pointer_of(value).is_some() {
            return Ok(None);
        }
        let bad = |d: String| StoreError::reply("job record", format!("{id}: {d}"));
        let header = RecordHeader::parse(value)
            .ok_or_else(|| bad("not a hookq job record".into()))?
            .leased(leased);
        let spec_json = spec_json_of(value).map_err(bad)?.to_string();
        let mut spec: JobSpec =
            serde_json::from_str(&spec_json).map_err(|e| bad(format!("spec: {e}")))?;
        spec.restore_given(header.given);
        Ok(Some(JobRecord {
            id: id.to_string(),
            spec_json,
            spec,
            state: header.state,
            attempts: header.attempts,
            max_attempts: header.max_attempts,
            due: header.due,
            created: header.created,
            updated: header.updated,
            history,
            summarized: false,
            held: header.held,
            waiting_for: None,
            holder: None,
        }))
    }

    /// The API view of this record.
    pub(crate) fn view(self) -> JobView {
        let facts = ViewFacts {
            state: self.state,
            attempts: self.attempts,
            max_attempts: self.max_attempts,
            due: self.due,
            created: self.created,
            updated: self.updated,
            history: self
                .history
                .iter()
                .filter_map(|h| attempt_view(h))
                .collect(),
            summarized: self.summarized,
            waiting_for: self.waiting_for,
            held_by: self.holder.as_ref().map(|h| h.id.clone()),
            waiting_until: self.holder.and_then(|h| h.until),
        };
        JobView::of(self.id, self.spec, facts)
    }
}

/// An attempt record as the API shows it: the stored JSON with its start
/// time `at` (epoch ms in Redis) in RFC 3339.
fn attempt_view(stored: &str) -> Option<serde_json::Value> {
    let mut record: serde_json::Value = serde_json::from_str(stored).ok()?;
    if let Some(at) = record.get_mut("at") {
        if let Some(ms) = at.as_i64() {
            *at = crate::job::format_ms(ms).into();
        }
    }
    Some(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_decodes_big_endian_fields() {
        let mut v = vec![b'x'];
        v.extend_from_slice(&1_700_000_000_123u64.to_be_bytes()[2..]);
        v.extend_from_slice(&3u16.to_be_bytes());
        v.extend_from_slice(&9u16.to_be_bytes());
        v.extend_from_slice(&1_800_000_000_000u64.to_be_bytes()[2..]);
        v.extend_from_slice(&1_700_000_000_200u64.to_be_bytes()[2..]);
        v.extend_from_slice(&1_600_000_000_000u64.to_be_bytes()[2..]);
        v.extend_from_slice(&7u32.to_be_bytes());
        v.extend_from_slice(&(crate::job::GIVEN_DELAY | 5000).to_be_bytes()[2..]);
        v.extend_from_slice(br#"{"url":"http://a/"}"#);
        let h = RecordHeader::parse(&v).expect("header");
        assert_eq!(h.state, State::Dead);
        assert_eq!(h.updated, 1_700_000_000_123);
        assert_eq!((h.attempts, h.max_attempts), (3, 9));
        assert_eq!(h.due, 1_800_000_000_000);
        assert_eq!(h.created, 1_600_000_000_000);
        assert_eq!(h.dead_letter_entry().as_deref(), Some("1700000000200-7"));
        let r = JobRecord::decode("a", &v, Vec::new(), false)
            .expect("decodes")
            .expect("some");
        assert_eq!(r.spec.url, "http://a/");
        assert_eq!((r.spec.delay_ms, r.spec.run_at), (Some(5000), None));
        assert!(RecordHeader::parse(&v[..20]).is_none());
        v[0] = b'?';
        assert!(RecordHeader::parse(&v).is_none());
    }

    /// A header of state `state` due at `due`, the other fields zero.
    fn header(state: u8, due: i64) -> RecordHeader {
        let mut v = vec![0; HEADER_LEN];
        v[0] = state;
        v[11..17].copy_from_slice(&due.to_be_bytes()[2..]);
        RecordHeader::parse(&v).expect("header")
    }

    /// Only a job waiting for a claim and due by about now may be in a
    /// round lease (a view reads the rounds only for it).
    #[test]
    fn only_a_waiting_job_due_now_may_be_in_a_round() {
        let now = crate::job::now_ms();
        assert!(header(b's', now).may_be_in_round());
        assert!(header(b'r', now - 60_000).may_be_in_round());
        assert!(header(b's', now + 1_000).may_be_in_round());
        assert!(!header(b's', now + 3_600_000).may_be_in_round());
        for state in [b'w', b'p', b'o', b'i', b'd', b'x', b'c'] {
            assert!(
                !header(state, now).may_be_in_round(),
                "state {}",
                state as char
            );
        }
    }
}
