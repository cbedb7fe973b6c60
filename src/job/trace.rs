//! A job's W3C trace context: the one its create request carried (kept
//! with the job, not content), and the trace id and `traceparent` of each
//! attempt.

use serde::{Deserialize, Serialize};

/// A W3C trace context (`traceparent`, and `tracestate` if any), as a
/// create request carried it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceContext {
    /// `traceparent`: `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`.
    #[serde(rename = "p")]
    pub parent: String,
    /// `tracestate`, passed on unchanged.
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

impl TraceContext {
    /// The context of `traceparent` (and `tracestate`), or None when the
    /// `traceparent` is not a valid version-00 one (W3C Trace Context: lower
    /// hex, trace and parent ids not all zeros): a malformed one is
    /// ignored, never refused, and the job starts a trace of its own. A
    /// `tracestate` longer than 512 bytes or not visible ASCII is dropped.
    pub(crate) fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        let parts: Vec<&str> = traceparent.trim().split('-').collect();
        let hex = |s: &str, len: usize| {
            s.len() == len
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let [version, trace_id, parent_id, flags] = parts[..] else {
            return None;
        };
        let valid = version == "00"
            && hex(trace_id, 32)
            && hex(parent_id, 16)
            && hex(flags, 2)
            && trace_id.bytes().any(|b| b != b'0')
            && parent_id.bytes().any(|b| b != b'0');
        let state = tracestate
            .map(str::trim)
            .filter(|s| {
                !s.is_empty() && s.len() <= 512 && s.bytes().all(|b| (b' '..=b'~').contains(&b))
            })
            .map(str::to_string);
        valid.then(|| TraceContext {
            parent: parts.join("-"),
            state,
        })
    }

    /// The trace id (32 hex digits).
    pub(crate) fn trace_id(&self) -> &str {
        &self.parent[3..35]
    }

    /// The creator's span id (16 hex digits).
    pub(crate) fn parent_id(&self) -> &str {
        &self.parent[36..52]
    }

    /// The trace flags (2 hex digits).
    pub(crate) fn flags(&self) -> &str {
        &self.parent[53..55]
    }
}

/// The trace id of job `id`: its creator's, or, when it came without one,
/// one derived from the id (the first 16 bytes of SHA-256 of it), so that
/// every attempt of a job belongs to one trace without storing anything.
pub(crate) fn trace_id_of(id: &str, trace: Option<&TraceContext>) -> String {
    use sha2::Digest;
    match trace {
        Some(context) => context.trace_id().to_string(),
        None => sha2::Sha256::digest(format!("hookq-trace:{id}").as_bytes())[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    }
}

/// The `traceparent` of one attempt of job `id`: its trace, a fresh span
/// id, its creator's flags (sampled when it had none).
pub(crate) fn attempt_traceparent(id: &str, trace: Option<&TraceContext>) -> String {
    let span: u64 = rand::random::<u64>().max(1);
    let flags = trace.map_or("01", TraceContext::flags);
    format!("00-{}-{span:016x}-{flags}", trace_id_of(id, trace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_contexts_are_taken_only_when_valid() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = TraceContext::parse(good, Some(" vendor=abc ")).expect("valid");
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.state.as_deref(), Some("vendor=abc"));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
        ] {
            assert_eq!(TraceContext::parse(bad, None), None, "{bad}");
        }
        let long_state = "a=".to_string() + &"b".repeat(600);
        assert_eq!(
            TraceContext::parse(good, Some(&long_state)).and_then(|c| c.state),
            None
        );
        // An attempt: the creator's trace and flags, a fresh span.
        let tp = attempt_traceparent("job-1", Some(&context));
        assert!(
            tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
            "{tp}"
        );
        assert!(tp.ends_with("-01") && tp.len() == 55, "{tp}");
        assert_ne!(tp, good);
        // Without one: a trace of the job's own, the same for every attempt.
        let own = trace_id_of("job-1", None);
        assert_eq!(own.len(), 32);
        assert_eq!(own, trace_id_of("job-1", None));
        assert_ne!(own, trace_id_of("job-2", None));
        assert!(attempt_traceparent("job-1", None).contains(&own));
    }
}
