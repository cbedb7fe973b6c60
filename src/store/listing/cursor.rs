//! The pages and cursors of the cross-partition listings: a [`Page`] of
//! items, the [`Cursor`] (`<partition>:<position>`) that resumes a listing,
//! and the refusal of a cursor of a shape its listing never writes
//! ([`BadCursor`]).

use serde::Serialize;

/// A page of results.
#[derive(Debug, Clone, Serialize)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// Pass as `cursor` to get the next page; None at the end.
    pub next_cursor: Option<String>,
}

/// A position in a cross-partition listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// Partition to continue in.
    pub partition: u16,
    /// Position inside it (meaning depends on the listing).
    pub position: String,
}

/// Which listing a cursor belongs to: its positions have different shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorKind {
    /// Jobs: an offset, `<shard>.<scan>.<skip>`, `k<scan>.<skip>` or
    /// `s<bucket>.<shard>.<skip>`.
    Jobs,
    /// Dead letters: a stream id to start at (`-`, `<ms>`, `<ms>-<seq>`) or
    /// after (`(<ms>-<seq>`).
    DeadLetters,
}

/// Whether `position` has a shape `kind`'s listing writes. An offset has
/// at most 18 digits, so that no arithmetic on it overflows; the positions
/// that hold an `HSCAN`/`SCAN` cursor (which may use all 64 bits) take any
/// u64, and what is added to their numbers saturates.
fn position_fits(kind: CursorKind, position: &str) -> bool {
    let numbers = |text: &str, separator: char, parts: &[usize], digits: usize| {
        let numbers: Vec<&str> = text.split(separator).collect();
        parts.contains(&numbers.len())
            && numbers.iter().all(|n| {
                (1..=digits).contains(&n.len())
                    && n.bytes().all(|b| b.is_ascii_digit())
                    && n.parse::<u64>().is_ok()
            })
    };
    match kind {
        CursorKind::Jobs => match position.strip_prefix(['k', 's']) {
            Some(rest) if position.starts_with('k') => numbers(rest, '.', &[1, 2], 20),
            Some(rest) => numbers(rest, '.', &[3], 18),
            None => numbers(position, '.', &[1], 18) || numbers(position, '.', &[3], 20),
        },
        CursorKind::DeadLetters => match position.strip_prefix('(') {
            Some(id) => numbers(id, '-', &[2], 18),
            None => position == "-" || numbers(position, '-', &[1, 2], 18),
        },
    }
}

/// A cursor that no page of its listing could have returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BadCursor {
    /// The parameter that carried it.
    pub field: String,
    /// The refusal, naming that parameter.
    pub message: String,
}

impl BadCursor {
    /// The refusal of the cursor given as `field`.
    fn of(field: &str) -> BadCursor {
        BadCursor {
            field: field.to_string(),
            message: format!("{field} is not a cursor returned by a previous page"),
        }
    }
}

impl Cursor {
    /// Parses `<partition>:<position>` of a `kind` listing; `field` names
    /// the parameter in errors.
    pub fn parse(
        text: &str,
        partitions: u16,
        kind: CursorKind,
        field: &str,
    ) -> Result<Cursor, BadCursor> {
        let bad = || BadCursor::of(field);
        let (p, position) = text.split_once(':').ok_or_else(bad)?;
        let partition: u16 = p.parse().map_err(|_| bad())?;
        if partition >= partitions || !position_fits(kind, position) {
            return Err(bad());
        }
        Ok(Cursor {
            partition,
            position: position.to_string(),
        })
    }

    /// The cursor at `position` in partition `partition`.
    pub(super) fn start(partition: u16, position: &str) -> Cursor {
        Cursor {
            partition,
            position: position.to_string(),
        }
    }

    /// `<partition>:<position>`, as [`Cursor::parse`] reads it.
    pub(super) fn encode(&self) -> String {
        format!("{}:{}", self.partition, self.position)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_take_only_the_shapes_their_listing_writes() {
        for ok in [
            "0:0",
            "3:17",
            "1:12.4096.3",
            "0:k88.2",
            "2:s1795468361728.3.0",
            "1:63.18446744073709551615.7",
            "0:k18446744073709551615.2",
            "0:k0",
            "3:k1536",
        ] {
            assert!(
                Cursor::parse(ok, 4, CursorKind::Jobs, "cursor").is_ok(),
                "{ok}"
            );
        }
        for ok in [
            "0:-",
            "1:1795468361728",
            "0:1795468361728-0",
            "3:(1795468361728-12",
        ] {
            assert!(
                Cursor::parse(ok, 4, CursorKind::DeadLetters, "cursor").is_ok(),
                "{ok}"
            );
        }
        for bad in [
            "0:9223372036854775807",
            "1:63.18446744073709551616.7",
            "0:k18446744073709551616.2",
            "0:abc",
            "0:",
            "4:0",
            "x:0",
            "0",
            "0:1.2",
            "0:k",
            "0:s1.2",
            "0:-1",
            "0:(1-2",
        ] {
            let err = Cursor::parse(bad, 4, CursorKind::Jobs, "cursor").expect_err(bad);
            assert_eq!(err.field, "cursor");
        }
        for bad in ["0:0.1.2", "0:(x", "0:(1", "0:1-2-3", "0:+", "0:k1.2"] {
            assert!(
                Cursor::parse(bad, 4, CursorKind::DeadLetters, "cursor").is_err(),
                "{bad}"
            );
        }
    }
}
