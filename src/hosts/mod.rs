//! Hosts: the operator's names for a host (a job's host is
//! [`crate::job::host_key`], `scheme://host:port` of its URL), the limits
//! that apply to one (`delivery.per_host_*` and the first matching
//! `[[hosts]]` rule), and the machinery that holds delivery to those limits:
//! the in-memory per-host lanes ([`lanes`]), the rate limit shared through
//! Redis ([`rate`]) and the circuit breaker
//! every daemon shares ([`breaker`]).

pub(crate) mod breaker;
pub(crate) mod lanes;
pub(crate) mod rate;
pub(crate) mod view;

use crate::config::{Config, HostPattern, HostRule};
use crate::job::host_key;

/// Normalises what an operator types for a host (`https://api.example.com`,
/// `api.example.com`, `api.example.com:8443`, `http://h:80`) to its key.
/// Without a scheme, `https` is assumed; without a port, the scheme's default.
pub(crate) fn parse_host(text: &str) -> Result<String, String> {
    let text = text.trim();
    // What the messages quote: at most 100 bytes of the input (SPEC §14).
    let shown = crate::job::quote(text);
    if let Some((scheme, rest)) = text.split_once("://") {
        if rest.trim_end_matches('/').is_empty() {
            return Err(format!(
                "`{shown}` names no host after {}://",
                crate::job::quote(scheme)
            ));
        }
    }
    let text = text.strip_suffix('/').unwrap_or(text);
    if text.is_empty() {
        return Err("is empty".into());
    }
    let with_scheme = if text.contains("://") {
        text.to_string()
    } else {
        format!("https://{text}")
    };
    let url = url::Url::parse(&with_scheme)
        .map_err(|e| format!("`{shown}` is not a host like https://api.example.com:443 ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("`{shown}`: the scheme must be http or https"));
    }
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err(format!(
            "`{shown}` has a path; a host is scheme://host:port only"
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "`{shown}` carries credentials; a host is scheme://host:port only"
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("`{shown}` names no host"));
    }
    // As typed (before IDNA mapping): an ASCII name (internationalised names
    // in their xn-- form), an IPv4 address or a bracketed IPv6 address.
    let typed = with_scheme
        .split_once("://")
        .map_or("", |(_, rest)| rest)
        .trim_end_matches('/');
    let typed_host = match typed.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => typed.rsplit_once(':').map_or(typed, |(h, _)| h),
    };
    if !typed.starts_with('[') && !valid_name(typed_host) {
        return Err(format!(
            "`{shown}`: a host name is ASCII letters, digits, `-` and `.` (an international name in its xn-- form)"
        ));
    }
    Ok(host_key(url.as_str()))
}

/// A DNS name (letters, digits, inner hyphens; the last label not all
/// digits) or a dotted IPv4 address.
fn valid_name(name: &str) -> bool {
    if name.parse::<std::net::Ipv4Addr>().is_ok() {
        return true;
    }
    let labels: Vec<&str> = name.split('.').collect();
    name.len() <= 253
        && labels.iter().all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
        && labels.last().is_some_and(|l| !numeric_label(l))
}

/// Whether a last label would make a URL parser read the name as an IPv4
/// address (all digits, or `0x` hex): such a name is no host name. Any other
/// label is fine, `4hxv0` included, as in a job's URL.
fn numeric_label(label: &str) -> bool {
    let lower = label.to_ascii_lowercase();
    match lower.strip_prefix("0x") {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => lower.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// The limits one host is delivered under.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Limits {
    /// Concurrent attempts (in this daemon).
    pub concurrency: usize,
    /// Requests per second across all daemons, 0 = unlimited.
    pub rate: f64,
}

/// The defaults and the `[[hosts]]` rules, resolved per host.
#[derive(Debug, Clone)]
pub(crate) struct HostRules {
    default: Limits,
    rules: Vec<(HostPattern, HostRule)>,
}

impl HostRules {
    /// The rules of `config` (validated: a bad pattern was refused at load).
    pub(crate) fn new(config: &Config) -> Self {
        HostRules {
            default: Limits {
                concurrency: config.delivery.per_host_concurrency.max(1),
                rate: config.delivery.per_host_rate,
            },
            rules: config
                .hosts
                .iter()
                .filter_map(|r| Some((HostPattern::parse(&r.pattern).ok()?, r.clone())))
                .collect(),
        }
    }

    /// The limits of host `key`: the first matching rule's, else the defaults.
    pub(crate) fn limits(&self, key: &str) -> Limits {
        match self.rules.iter().find(|(p, _)| p.matches(key)) {
            Some((_, rule)) => Limits {
                concurrency: rule.concurrency.unwrap_or(self.default.concurrency).max(1),
                rate: rule.rate.unwrap_or(self.default.rate),
            },
            None => self.default,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_errors_quote_at_most_100_bytes_of_the_input() {
        let long = "a".repeat(10_000);
        for text in [
            format!("{long}://"),
            format!("https://{long}/path"),
            format!("ftp://{long}"),
            format!("https://u:p@{long}"),
            format!("h_{long}"),
        ] {
            let err = parse_host(&text).expect_err("refused");
            assert!(err.len() < 400, "{} bytes: {}", err.len(), &err[..200]);
        }
    }

    #[test]
    fn keys_name_scheme_host_and_port() {
        assert_eq!(host_key("https://a.example/x?y"), "https://a.example:443");
        assert_eq!(host_key("http://a.example:8080/"), "http://a.example:8080");
    }

    #[test]
    fn operators_may_type_hosts_loosely() {
        assert_eq!(
            parse_host("api.example.com").as_deref(),
            Ok("https://api.example.com:443")
        );
        assert_eq!(parse_host("http://h:8080/").as_deref(), Ok("http://h:8080"));
        assert_eq!(
            parse_host("HTTPS://A.example").as_deref(),
            Ok("https://a.example:443")
        );
        assert_eq!(
            parse_host("10.0.0.1:80").as_deref(),
            Ok("https://10.0.0.1:80")
        );
        assert_eq!(
            parse_host("http://[::1]:8080").as_deref(),
            Ok("http://[::1]:8080")
        );
        // Any name a job's URL may have: a last label may begin with a digit.
        assert_eq!(parse_host("http://4hxv0").as_deref(), Ok("http://4hxv0:80"));
        for bad in [
            "1.2.3",
            "a.0x1f",
            "__main__",
            "ünï.example",
            "a..b",
            "-a.example",
            "1.2.3.999",
            "",
            "ftp://h",
            "https://h/path",
            "https://u:p@h",
            "h:notaport",
            "https://",
        ] {
            assert!(parse_host(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn the_first_matching_rule_wins() {
        let mut config = Config::default();
        config.delivery.per_host_rate = 5.0;
        config.hosts = vec![
            HostRule {
                pattern: "slow.example.com".into(),
                concurrency: Some(2),
                rate: None,
            },
            HostRule {
                pattern: "*.example.com".into(),
                concurrency: None,
                rate: Some(0.0),
            },
        ];
        let rules = HostRules::new(&config);
        let slow = rules.limits("https://slow.example.com:443");
        assert_eq!((slow.concurrency, slow.rate), (2, 5.0));
        let other = rules.limits("https://x.example.com:443");
        assert_eq!((other.concurrency, other.rate), (64, 0.0));
        let none = rules.limits("https://elsewhere.org:443");
        assert_eq!((none.concurrency, none.rate), (64, 5.0));
    }
}
