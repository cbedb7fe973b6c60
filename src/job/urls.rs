//! A job's target URL: checked and normalised when it comes in, shown with
//! any credentials masked, compared by origin, and keyed by host for
//! per-host limits.

use super::FieldError;

/// Longest URL accepted, in bytes.
pub(crate) const MAX_URL_LEN: usize = 2048;

/// Checks a target URL: absolute http(s), with a host, at most 2048 bytes,
/// no control characters (a URL parser drops tabs and newlines silently,
/// and an escape sequence printed raw by `hookq show` would rewrite the
/// operator's terminal).
pub(crate) fn validate_url(url: &str, field: &str) -> Result<String, FieldError> {
    if url.len() > MAX_URL_LEN {
        return Err(FieldError::new(
            "invalid_url",
            field,
            format!("{field} is longer than {MAX_URL_LEN} bytes"),
        ));
    }
    if url.chars().any(char::is_control) {
        return Err(FieldError::new(
            "invalid_url",
            field,
            format!("{field} contains a control character"),
        ));
    }
    let parsed = url::Url::parse(url).map_err(|e| {
        FieldError::new(
            "invalid_url",
            field,
            format!("{field} is not an absolute URL: {e}"),
        )
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(FieldError::new(
            "invalid_url",
            field,
            format!("{field} must use http or https"),
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(FieldError::new(
            "invalid_url",
            field,
            format!("{field} has no host"),
        ));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        // Views show URLs, and a password in one would be shown with it;
        // header values are write-only (SPEC §14).
        return Err(FieldError::new(
            "invalid_url",
            field,
            format!("{field} must not carry credentials (user:password@); send them in a header such as authorization, whose value no view shows"),
        ));
    }
    let normalised = String::from(parsed);
    if normalised.len() > MAX_URL_LEN {
        return Err(FieldError::new(
            "invalid_url",
            field,
            format!("{field} is longer than {MAX_URL_LEN} bytes once normalised"),
        ));
    }
    Ok(normalised)
}

/// A stored URL as every view shows it: any `user:password@` masked
/// (`http://***@host/`). New jobs cannot carry credentials
/// ([`validate_url`] refuses them); this covers jobs stored before that.
pub(crate) fn shown_url(url: &str) -> String {
    crate::config::redact_url(url)
}

/// Whether two URLs share an origin (scheme, host and port). A URL that
/// does not parse shares none.
pub(crate) fn same_origin(a: &str, b: &str) -> bool {
    match (url::Url::parse(a), url::Url::parse(b)) {
        (Ok(a), Ok(b)) => a.origin() == b.origin(),
        _ => false,
    }
}

/// The host key of a job's URL, the unit of per-host limits and breakers: `scheme://host:port` (the port always written).
/// A URL that does not parse is its own key.
pub fn host_key(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => format!(
            "{}://{}:{}",
            u.scheme(),
            u.host_str().unwrap_or_default(),
            u.port_or_known_default().unwrap_or_default()
        ),
        Err(_) => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::testing::input;
    use crate::job::{JobView, State, ViewFacts};

    #[test]
    fn urls_with_credentials_are_refused_and_never_shown() {
        for url in [
            "http://alice:S3cretPW@a.example/hook",
            "http://alice@a.example/",
            "https://:pw@a.example/",
        ] {
            let err = validate_url(url, "url").expect_err(url);
            assert_eq!(err.field.as_deref(), Some("url"));
            assert!(!err.message.contains("S3cretPW"), "{}", err.message);
        }
        // A job stored before they were refused shows them masked.
        let mut spec = input(r#"{"url":"http://a.example/hook"}"#)
            .expect("valid")
            .spec;
        spec.url = "http://alice:S3cretPW@a.example/hook?q=1".into();
        let shown = spec.to_shown_json().to_string();
        assert!(
            !shown.contains("S3cretPW") && shown.contains("***@a.example"),
            "{shown}"
        );
        let facts = ViewFacts {
            state: State::Scheduled,
            attempts: 0,
            max_attempts: 1,
            due: 0,
            created: 0,
            updated: 0,
            history: Vec::new(),
            summarized: false,
            waiting_for: None,
            held_by: None,
            waiting_until: None,
        };
        let view = JobView::of("a".into(), spec, facts);
        assert_eq!(view.url.as_deref(), Some("http://***@a.example/hook?q=1"));
    }

    #[test]
    fn urls_with_control_characters_are_refused() {
        for url in [
            "http://a.example/\u{1b}[2Kstate delivered",
            "http://a.example/a\nb",
            "http://a.example/\tx",
            "http://a.example/\u{7f}",
            "http://a.example/\u{85}",
        ] {
            let err = validate_url(url, "url").expect_err(url);
            assert_eq!(err.field.as_deref(), Some("url"));
            assert!(err.message.contains("control character"), "{}", err.message);
        }
        assert!(validate_url("http://a.example/caf\u{e9}?q=1", "url").is_ok());
    }

    /// What is stored is the URL as it will be requested: host lower-cased,
    /// default port and dot segments gone, non-ASCII percent-encoded.
    #[test]
    fn urls_are_stored_normalised() {
        for (given, stored) in [
            ("HTTP://A.Example:80/a/../b?q=1", "http://a.example/b?q=1"),
            ("https://a.example", "https://a.example/"),
            ("http://a.example/caf\u{e9}", "http://a.example/caf%C3%A9"),
            ("http://[::1]:8080/x", "http://[::1]:8080/x"),
        ] {
            assert_eq!(validate_url(given, "url").as_deref(), Ok(stored), "{given}");
        }
        let job = input(r#"{"url":"HTTPS://Shop.Example:443/hook"}"#).expect("valid");
        assert_eq!(job.spec.url, "https://shop.example/hook");
        let long = format!("http://a.example/{}", "\u{e9}".repeat(1000));
        assert!(long.len() <= MAX_URL_LEN);
        let err = validate_url(&long, "url").expect_err("too long once encoded");
        assert!(err.message.contains("normalised"), "{}", err.message);
    }

    #[test]
    fn origins() {
        assert!(same_origin("http://a.example/x", "HTTP://a.example:80/y"));
        assert!(!same_origin("http://a.example/", "https://a.example/"));
        assert!(!same_origin("http://a.example/", "http://a.example:8080/"));
        assert!(!same_origin("http://a.example/", "http://b.example/"));
        assert!(!same_origin("not a url", "not a url"));
    }
}
