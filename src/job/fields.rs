//! The checks of a job's other fields: ids, topics and ordering keys (and
//! the charset rule other names share), extra headers, the body, and how a
//! refusal quotes what it refuses.

use std::collections::BTreeMap;

use super::{FieldError, JobInput};
use crate::config::Config;

/// Most extra headers a job may carry.
pub(crate) const MAX_HEADERS: usize = 64;
/// Longest header value, in bytes.
pub(crate) const MAX_HEADER_VALUE: usize = 8192;

/// Header names a job may not set: hop-by-hop headers, framing, and the
/// headers hookq itself sends on every attempt.
const RESERVED_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "content-type",
    "user-agent",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "traceparent",
    "tracestate",
];

/// Whether `text` is 1 to `max` bytes of ASCII letters, digits and `extra`.
pub(crate) fn is_charset(text: &str, max: usize, extra: &[u8]) -> bool {
    (1..=max).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
}

/// Checks that `text` (field `field`) is 1 to `max` characters of
/// A-Z a-z 0-9 and `extra`, refusing it with `code` otherwise; the message
/// spells the rule out.
pub(crate) fn validate_charset(
    text: &str,
    max: usize,
    extra: &[u8],
    code: &'static str,
    field: &str,
) -> Result<(), FieldError> {
    if is_charset(text, max, extra) {
        return Ok(());
    }
    let extra: Vec<String> = extra.iter().map(|b| (*b as char).to_string()).collect();
    Err(FieldError::new(
        code,
        field,
        format!(
            "{field} must be 1-{max} characters of A-Z a-z 0-9 {}",
            extra.join(" ")
        ),
    ))
}

/// Checks a job id: `[A-Za-z0-9._:-]{1,128}`.
pub(crate) fn validate_id(id: &str) -> Result<(), FieldError> {
    validate_charset(id, 128, b"._:-", "invalid_id", "id")
}

/// Checks a tenant name given in field (or parameter) `field`: 400
/// `invalid_tenant` naming it otherwise.
pub(crate) fn validate_tenant(name: &str, field: &str) -> Result<(), FieldError> {
    if crate::tenant::is_tenant_name(name) {
        return Ok(());
    }
    Err(FieldError::new(
        "invalid_tenant",
        field,
        format!(
            "{field} must be 1-{} characters of a-z 0-9 -, starting with a letter or digit",
            crate::tenant::TENANT_MAX
        ),
    ))
}

/// Checks an ordering key: `[A-Za-z0-9._:-]{1,128}`.
pub(crate) fn validate_ordering_key(key: &str) -> Result<(), FieldError> {
    validate_charset(key, 128, b"._:-", "invalid_ordering_key", "ordering_key")
}

/// Checks a topic: `[A-Za-z0-9._-]{1,64}`.
pub(crate) fn validate_topic(topic: &str) -> Result<(), FieldError> {
    validate_charset(topic, 64, b"._-", "invalid_topic", "topic")
}

/// Most bytes of a refused input an error message quotes (SPEC §14): a
/// request of 16 MB of bad header names must not answer twice that.
pub(crate) const MAX_QUOTE: usize = 100;

/// `text` as an error message quotes it: whole up to [`MAX_QUOTE`] bytes,
/// else its first bytes (cut on a character boundary) and `…`.
pub(crate) fn quote(text: &str) -> std::borrow::Cow<'_, str> {
    cut(text, MAX_QUOTE)
}

/// `text` whole up to `max` bytes, else its first bytes up to `max` (cut
/// on a character boundary) followed by `…`.
pub(crate) fn cut(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…", &text[..end]))
}

/// Checks extra headers: valid names and values, none reserved, no name
/// given twice (HTTP names are case-insensitive: `X-A` and `x-a` would
/// both be sent).
pub(crate) fn validate_headers(headers: &BTreeMap<String, String>) -> Result<(), FieldError> {
    if headers.len() > MAX_HEADERS {
        return Err(FieldError::new(
            "invalid_header",
            "headers",
            format!("at most {MAX_HEADERS} headers"),
        ));
    }
    let mut seen = std::collections::HashSet::with_capacity(headers.len());
    for (name, value) in headers {
        // Names are quoted (in the message and the field) cut at MAX_QUOTE.
        let shown = quote(name);
        let field = format!("headers.{shown}");
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(FieldError::new(
                "invalid_header",
                &field,
                format!("`{shown}` is not a valid header name"),
            ));
        }
        let lower = name.to_ascii_lowercase();
        if !seen.insert(lower.clone()) {
            return Err(FieldError::new(
                "duplicate_header",
                "headers",
                format!("header `{shown}` is given twice (header names are case-insensitive)"),
            ));
        }
        if RESERVED_HEADERS.contains(&lower.as_str()) || lower.starts_with("hookq-") {
            return Err(FieldError::new(
                "reserved_header",
                &field,
                format!("header `{shown}` is set by hookq (hop-by-hop, framing, signature or trace-context header; a trace context goes in the create request's own `traceparent` header) and may not be given"),
            ));
        }
        if value.len() > MAX_HEADER_VALUE
            || !value.is_ascii()
            || reqwest::header::HeaderValue::from_str(value).is_err()
        {
            return Err(FieldError::new(
                "invalid_header",
                &field,
                format!("the value of header `{shown}` is not a valid header value (visible ASCII, at most {MAX_HEADER_VALUE} bytes)"),
            ));
        }
    }
    Ok(())
}

/// Deepest nesting of arrays and objects a JSON body may have (serde_json's
/// own recursion limit, so every accepted body can be parsed again).
pub(crate) const MAX_BODY_DEPTH: usize = 128;

/// The first number of valid JSON text `text` that is out of range for a
/// JSON reader (beyond ±1.8e308, such as `1e400`), if any: such a body is
/// refused, since no reader (serde_json included) can tell its numbers apart.
fn number_out_of_range(text: &str) -> Option<&str> {
    let bytes = text.as_bytes();
    let mut strings = JsonStrings::default();
    let mut i = 0usize;
    while i < bytes.len() {
        let b = bytes[i];
        if strings.in_string(b) {
            i += 1;
            continue;
        }
        if b == b'-' || b.is_ascii_digit() {
            let start = i;
            while i < bytes.len()
                && matches!(bytes[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
            {
                i += 1;
            }
            let number = &text[start..i];
            // Up to 15 digits without an exponent always fit an f64.
            let may_overflow = number.len() > 15 || number.contains(['e', 'E']);
            if may_overflow && !number.parse::<f64>().is_ok_and(f64::is_finite) {
                return Some(number);
            }
            continue;
        }
        i += 1;
    }
    None
}

/// Follows valid JSON text byte by byte and tells which bytes belong to a
/// string (its quotes included), so that a scan looks only at the rest.
#[derive(Default)]
struct JsonStrings {
    open: bool,
    escaped: bool,
}

impl JsonStrings {
    /// Whether `b`, the next byte, is part of a string.
    fn in_string(&mut self, b: u8) -> bool {
        if self.open {
            match (self.escaped, b) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => self.open = false,
                _ => {}
            }
            true
        } else {
            self.open = b == b'"';
            self.open
        }
    }
}

/// Nesting depth of valid JSON text, counting brackets outside strings.
fn json_depth(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut strings = JsonStrings::default();
    for b in text.bytes() {
        if strings.in_string(b) {
            continue;
        }
        match b {
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Checks `body` / `body_text` / `content_type` together.
pub(super) fn validate_body(input: &JobInput, config: &Config) -> Result<(), FieldError> {
    let limit = config.api.max_body;
    if input.body.is_some() && input.body_text.is_some() {
        return Err(FieldError::new(
            "conflicting_fields",
            "body_text",
            "give either body or body_text, not both",
        ));
    }
    if let Some(raw) = &input.body {
        if raw.get().len() as u64 > limit {
            return Err(FieldError::new(
                "body_too_large",
                "body",
                format!("body is larger than {limit} bytes (api.max_body)"),
            ));
        }
        if json_depth(raw.get()) > MAX_BODY_DEPTH {
            return Err(FieldError::new(
                "body_too_deep",
                "body",
                format!("body nests arrays and objects deeper than {MAX_BODY_DEPTH} levels"),
            ));
        }
        if let Some(number) = number_out_of_range(raw.get()) {
            return Err(FieldError::new(
                "invalid_body",
                "body",
                format!(
                    "body holds the number `{}`, beyond the range of a JSON number reader (±1.8e308)",
                    quote(number)
                ),
            ));
        }
    }
    if let Some(text) = &input.body_text {
        if text.len() as u64 > limit {
            return Err(FieldError::new(
                "body_too_large",
                "body_text",
                format!("body_text is larger than {limit} bytes (api.max_body)"),
            ));
        }
    }
    if let Some(ct) = &input.content_type {
        if input.body_text.is_none() {
            return Err(FieldError::new(
                "conflicting_fields",
                "content_type",
                "content_type applies to body_text only (a JSON body is sent as application/json)",
            ));
        }
        if ct.is_empty() || ct.len() > 256 || reqwest::header::HeaderValue::from_str(ct).is_err() {
            return Err(FieldError::new(
                "invalid_content_type",
                "content_type",
                "content_type must be a valid header value of at most 256 bytes",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names_are_refused_naming_their_field() {
        assert!(validate_tenant("billing-eu", "tenant").is_ok());
        let err = validate_tenant("Bad", "tenant").unwrap_err();
        assert_eq!(
            (err.code, err.field.as_deref()),
            ("invalid_tenant", Some("tenant"))
        );
    }
    use crate::job::parse_duration;
    use crate::job::testing::input;

    #[test]
    fn numbers_out_of_range_are_refused() {
        for body in ["1e400", "[1, -1E309]", r#"{"x":1e400,"y":"1e400"}"#] {
            let json = format!(r#"{{"url":"https://a.example/","body":{body}}}"#);
            let err = input(&json).expect_err(body);
            assert_eq!(err.field.as_deref(), Some("body"), "{body}");
        }
        let long = format!("1{}", "0".repeat(400));
        let json = format!(r#"{{"url":"https://a.example/","body":[{long}]}}"#);
        assert!(input(&json).is_err());
        for body in [
            r#""1e400""#,
            "1e308",
            "1e-400",
            "18446744073709551617",
            "-0.5e-3",
        ] {
            let json = format!(r#"{{"url":"https://a.example/","body":{body}}}"#);
            assert!(input(&json).is_ok(), "{body}");
        }
    }

    #[test]
    fn header_names_are_unique_in_any_case() {
        let err = input(r#"{"url":"http://a.example/","headers":{"X-A":"1","x-a":"2"}}"#)
            .expect_err("duplicate");
        assert_eq!(err.field.as_deref(), Some("headers"));
        assert_eq!(err.code, "duplicate_header");
        assert!(input(r#"{"url":"http://a.example/","headers":{"X-A":"1","X-B":"2"}}"#).is_ok());
    }

    #[test]
    fn quotes_are_cut_at_100_bytes_on_a_character_boundary() {
        assert_eq!(quote("short"), "short");
        let long = "é".repeat(80);
        let cut = quote(&long);
        assert!(cut.len() <= MAX_QUOTE + "…".len(), "{}", cut.len());
        assert!(cut.ends_with('…') && cut.starts_with("éé"));
        let name = "x".repeat(10_000) + "\n";
        let headers = BTreeMap::from([(name, "v".to_string())]);
        let err = validate_headers(&headers).expect_err("bad name");
        assert!(err.message.len() < 200, "{}", err.message.len());
        assert!(err.field.as_deref().is_some_and(|f| f.len() < 120));
        let err = parse_duration(&"9".repeat(10_000), "delay").expect_err("too large");
        assert!(err.message.len() < 300, "{}", err.message);
    }

    #[test]
    fn json_depth_ignores_brackets_in_strings() {
        assert_eq!(json_depth(r#"{"a": [1, {"b": "[[[["}]}"#), 3);
        assert_eq!(json_depth(r#""\"[""#), 0);
        assert_eq!(json_depth("1"), 0);
    }
}
