//! Reading a request's input: a JSON body and the query string, refused
//! as an [`ApiError`] that names the offending field or parameter.

use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::ApiError;
use crate::job::FieldError;

/// Parses a JSON request body, naming the field of a type error.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        // serde_path_to_error writes `?` for a segment it could not tell
        // (e.g. where a truncated body ended): keep the known part only.
        let full_path = err.path().to_string();
        let path = match full_path.find('?') {
            Some(unknown) => full_path[..unknown]
                .trim_end_matches(['.', '['])
                .to_string(),
            None => full_path,
        };
        let path = if path.is_empty() {
            ".".to_string()
        } else {
            path
        };
        let path = crate::job::quote(&path).into_owned();
        let inner = err.into_inner();
        let message = quote_serde_input(&inner.to_string());
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next());
        let field = match (path.as_str(), missing) {
            (".", Some(name)) => Some(name.to_string()),
            (_, Some(name)) => Some(format!("{path}.{name}")),
            (".", None) => None,
            _ => Some(path),
        };
        let code = if inner.is_syntax() || inner.is_eof() {
            "invalid_json"
        } else if field.is_none() {
            "invalid_request"
        } else {
            "invalid_field"
        };
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code,
            message,
            field,
        }
    })?;
    de.end()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", e.to_string()))?;
    Ok(value)
}

/// A serde error message with the input it quotes (an unknown field's
/// name in backticks, a string value in double quotes) cut at
/// [`crate::job::MAX_QUOTE`] bytes.
fn quote_serde_input(message: &str) -> String {
    let Some(open) = message.find(['`', '"']) else {
        return message.to_string();
    };
    let delimiter = &message[open..open + 1];
    let rest = &message[open + 1..];
    // The quote ends before serde's `, expected ...`, or at the last
    // delimiter (the input itself may hold either).
    let close = rest
        .rfind(&format!("{delimiter}, expected"))
        .or_else(|| rest.rfind(delimiter));
    match close {
        Some(close) => format!(
            "{}{}{}",
            &message[..=open],
            crate::job::quote(&rest[..close]),
            &rest[close..]
        ),
        None => crate::job::cut(message, 2 * crate::job::MAX_QUOTE).into_owned(),
    }
}

/// Parses a query string into pairs, refusing parameters not in `allowed`.
pub(crate) fn parse_query(
    raw: Option<&str>,
    allowed: &[&str],
) -> Result<Vec<(String, String)>, ApiError> {
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(raw.unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    for (name, _) in &pairs {
        if !allowed.contains(&name.as_str()) {
            let name = crate::job::quote(name);
            return Err(FieldError::new(
                "unknown_parameter",
                &name,
                format!(
                    "unknown query parameter `{name}` (allowed: {})",
                    allowed.join(", ")
                ),
            )
            .into());
        }
    }
    Ok(pairs)
}

/// Parses the `limit` query parameter: 1..=1000, default 100.
pub(crate) fn parse_limit(value: Option<&str>) -> Result<usize, ApiError> {
    match value {
        None => Ok(100),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=1000).contains(&n) => Ok(n),
            _ => Err(FieldError::new(
                "invalid_limit",
                "limit",
                "limit must be an integer from 1 to 1000",
            )
            .into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_name_fields() {
        use crate::job::JobInput;
        let e = parse_json::<JobInput>(br#"{"url": 5}"#).expect_err("type");
        assert_eq!(e.field.as_deref(), Some("url"));
        let e = parse_json::<JobInput>(br#"{"url": "http://a.example/", "bogus": 1}"#)
            .expect_err("unknown");
        assert_eq!(e.field.as_deref(), Some("bogus"));
        let e = parse_json::<JobInput>(br#"{"url": "#).expect_err("syntax");
        assert_eq!(e.code, "invalid_json");
        let e = parse_json::<JobInput>(br#"{"url": "http://a.example/"} trailing"#)
            .expect_err("trailing");
        assert_eq!(e.code, "invalid_json");
        // The input a message quotes is cut at 100 bytes.
        let long = "k".repeat(10_000);
        for body in [
            format!(r#"{{"url": "http://a.example/", "{long}": 1}}"#),
            format!(r#"{{"url": "http://a.example/", "retry": "{long}"}}"#),
            format!(r#"{{"url": "http://a.example/", "headers": {{"{long}": 5}}}}"#),
        ] {
            let e = parse_json::<JobInput>(body.as_bytes()).expect_err("refused");
            let shown = e.to_json().to_string();
            assert!(shown.len() < 500, "{shown}");
            assert!(shown.contains(&"k".repeat(90)), "{shown}");
        }
        assert_eq!(
            quote_serde_input(&format!("unknown field `{long}`, expected `id` at line 1")),
            format!(
                "unknown field `{}…`, expected `id` at line 1",
                "k".repeat(100)
            )
        );
    }
}
