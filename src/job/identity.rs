//! The identity of a JSON body: when two bodies are the same content.
//!
//! Two bodies are the same whatever their whitespace and key order, but only
//! if every number is the same number exactly (SPEC §14). serde_json reads a
//! number into a u64, an i64 or an f64, so `18446744073709551616` (2^64) and
//! `18446744073709551617` read as the same f64. Here each number is read
//! from its text: one that serde_json reads exactly (its value written back
//! is the same decimal) stays a JSON value, as before; any other is kept
//! apart, by its position, as its exact decimal (`1e400` and `10e399` are
//! one number, 2^64 and 2^64 + 1 two).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};

/// Deepest nesting read (a body accepted by validation nests at most
/// [`super::MAX_BODY_DEPTH`] levels).
const MAX_DEPTH: usize = 256;

/// One step of a path into a body.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(untagged)]
enum Step {
    /// An object's key.
    Key(String),
    /// An array's index.
    Index(usize),
}

/// What a body means, for comparing: its JSON value, with every number
/// serde_json cannot read exactly replaced by `null` and listed in `exact`
/// by its path, as its exact decimal.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BodyIdentity {
    /// The body's value (numbers read inexactly are `null` here).
    pub value: Value,
    /// Path -> exact decimal of each number read inexactly.
    exact: BTreeMap<Vec<Step>, String>,
}

impl BodyIdentity {
    /// The identity of the JSON text `raw`, or None when it is not JSON (or
    /// nests deeper than [`MAX_DEPTH`]).
    pub(crate) fn of(raw: &str) -> Option<BodyIdentity> {
        let mut reader = Reader {
            text: raw.as_bytes(),
            raw,
            pos: 0,
            path: Vec::new(),
            exact: BTreeMap::new(),
        };
        let value = reader.value(0)?;
        reader.skip_space();
        (reader.pos == raw.len()).then_some(BodyIdentity {
            value,
            exact: reader.exact,
        })
    }

    /// The numbers read inexactly, as JSON (`[[path, decimal], ...]`), or
    /// None when there are none (the value alone is the identity).
    pub(crate) fn exact_json(&self) -> Option<String> {
        if self.exact.is_empty() {
            return None;
        }
        let pairs: Vec<(&Vec<Step>, &String)> = self.exact.iter().collect();
        serde_json::to_string(&pairs).ok()
    }
}

/// The decimal a JSON number means, written one way: sign, digits without
/// leading or trailing zeros, exponent (`-12e3`; zero is `0`). A number
/// whose exponent does not fit an i64 is kept as written, marked `=`.
pub(crate) fn canonical_number(text: &str) -> String {
    let as_written = || format!("={text}");
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], &unsigned[at + 1..]),
        None => (unsigned, "0"),
    };
    let Ok(exponent) = exponent.trim_start_matches('+').parse::<i64>() else {
        return as_written();
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    let trimmed = digits.trim_end_matches('0');
    if trimmed.is_empty() {
        return "0".into();
    }
    let shift = (digits.len() - trimmed.len()) as i64 - frac.len() as i64;
    match exponent.checked_add(shift) {
        Some(exponent) => format!("{}{trimmed}e{exponent}", if negative { "-" } else { "" }),
        None => as_written(),
    }
}

/// A reader of JSON text that keeps each number's text.
struct Reader<'a> {
    text: &'a [u8],
    raw: &'a str,
    pos: usize,
    /// Where the value being read is.
    path: Vec<Step>,
    exact: BTreeMap<Vec<Step>, String>,
}

impl Reader<'_> {
    fn skip_space(&mut self) {
        while self
            .text
            .get(self.pos)
            .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        {
            self.pos += 1;
        }
    }

    /// Reads `byte` (after whitespace), or fails.
    fn expect(&mut self, byte: u8) -> Option<()> {
        self.skip_space();
        (self.text.get(self.pos) == Some(&byte)).then(|| self.pos += 1)
    }

    /// Reads one value at `depth`.
    fn value(&mut self, depth: usize) -> Option<Value> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.skip_space();
        match *self.text.get(self.pos)? {
            b'{' => self.object(depth),
            b'[' => self.array(depth),
            b'"' => self.string().map(Value::String),
            b't' => self.literal("true", Value::Bool(true)),
            b'f' => self.literal("false", Value::Bool(false)),
            b'n' => self.literal("null", Value::Null),
            _ => self.number(),
        }
    }

    fn literal(&mut self, word: &str, value: Value) -> Option<Value> {
        let end = self.pos + word.len();
        (self.text.get(self.pos..end) == Some(word.as_bytes())).then(|| {
            self.pos = end;
            value
        })
    }

    /// Reads a string, escapes decoded.
    fn string(&mut self) -> Option<String> {
        let start = self.pos;
        self.pos += 1;
        loop {
            match *self.text.get(self.pos)? {
                b'\\' => self.pos += 2,
                b'"' => break,
                _ => self.pos += 1,
            }
        }
        self.pos += 1;
        serde_json::from_str(self.raw.get(start..self.pos)?).ok()
    }

    /// Reads a number: as a JSON value when serde_json reads it exactly,
    /// else `null` with its exact decimal listed under its path.
    fn number(&mut self) -> Option<Value> {
        let start = self.pos;
        while self
            .text
            .get(self.pos)
            .is_some_and(|b| matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
        {
            self.pos += 1;
        }
        let text = self.raw.get(start..self.pos)?;
        if text.is_empty() {
            return None;
        }
        let exact = canonical_number(text);
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Number(n)) if canonical_number(&n.to_string()) == exact => {
                Some(Value::Number(n))
            }
            // Not a number at all (`1-2`; f64 parsing takes every JSON
            // number, out of range ones too).
            Err(_) if text.parse::<f64>().is_err() => None,
            _ => {
                self.exact.insert(self.path.clone(), exact);
                Some(Value::Null)
            }
        }
    }

    fn array(&mut self, depth: usize) -> Option<Value> {
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_space();
        if self.text.get(self.pos) == Some(&b']') {
            self.pos += 1;
            return Some(Value::Array(items));
        }
        loop {
            self.path.push(Step::Index(items.len()));
            let item = self.value(depth + 1);
            self.path.pop();
            items.push(item?);
            self.skip_space();
            match *self.text.get(self.pos)? {
                b',' => self.pos += 1,
                b']' => {
                    self.pos += 1;
                    return Some(Value::Array(items));
                }
                _ => return None,
            }
        }
    }

    fn object(&mut self, depth: usize) -> Option<Value> {
        self.pos += 1;
        let mut map = Map::new();
        self.skip_space();
        if self.text.get(self.pos) == Some(&b'}') {
            self.pos += 1;
            return Some(Value::Object(map));
        }
        loop {
            self.skip_space();
            if self.text.get(self.pos) != Some(&b'"') {
                return None;
            }
            let key = self.string()?;
            self.expect(b':')?;
            self.path.push(Step::Key(key.clone()));
            if map.contains_key(&key) {
                // A key given again replaces its value (as serde_json
                // reads it): its numbers go with it.
                let prefix = self.path.clone();
                self.exact.retain(|path, _| !path.starts_with(&prefix));
            }
            let item = self.value(depth + 1);
            self.path.pop();
            map.insert(key, item?);
            self.skip_space();
            match *self.text.get(self.pos)? {
                b',' => self.pos += 1,
                b'}' => {
                    self.pos += 1;
                    return Some(Value::Object(map));
                }
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_have_one_canonical_decimal() {
        for (text, canonical) in [
            ("0", "0"),
            ("-0.000", "0"),
            ("1", "1e0"),
            ("100", "1e2"),
            ("1.50", "15e-1"),
            ("-12e3", "-12e3"),
            ("1e400", "1e400"),
            ("10E+399", "1e400"),
            ("0.001e3", "1e0"),
            ("18446744073709551616", "18446744073709551616e0"),
        ] {
            assert_eq!(canonical_number(text), canonical, "{text}");
        }
        let huge = "1e99999999999999999999";
        assert_eq!(canonical_number(huge), format!("={huge}"));
    }

    #[test]
    fn spelling_does_not_matter_but_every_digit_does() {
        let id = |raw: &str| BodyIdentity::of(raw).expect("JSON");
        assert_eq!(
            id(r#"{"a": 1, "b": [true, null, "x\u0041"]}"#),
            id(r#"{"b":[true,null,"xA"],"a":1}"#)
        );
        for (a, b) in [
            ("18446744073709551616", "18446744073709551617"),
            (
                r#"{"x":18446744073709551616}"#,
                r#"{"x":18446744073709551617}"#,
            ),
            ("[1e400, 1]", "[1e400, 2]"),
            ("[1e400, null]", "[null, 1e400]"),
            ("[1e400]", "[1e401]"),
            ("0.1", "0.10000000000000000001"),
            ("1", "1.0"),
            (r#"{"a":1e400,"a":null}"#, r#"{"a":null,"a":1e400}"#),
        ] {
            assert_ne!(id(a), id(b), "{a} vs {b}");
        }
        assert_eq!(id("[1e400]"), id("[10e399]"));
        // Numbers serde_json reads exactly stay plain values.
        let plain = id(r#"{"n": 0.1, "m": -5, "k": 18446744073709551615}"#);
        assert_eq!(plain.exact_json(), None);
        assert_eq!(
            plain.value,
            serde_json::json!({"n": 0.1, "m": -5, "k": 18446744073709551615u64})
        );
        assert!(id("[18446744073709551616]").exact_json().is_some());
        for bad in ["", "{", "[1,]", r#"{"a"}"#, "1 2", "tru", "[1-2]"] {
            assert_eq!(BodyIdentity::of(bad), None, "{bad:?}");
        }
    }
}
