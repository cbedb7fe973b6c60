//! The `[[hosts]]` `match` pattern: which hosts a rule applies to. A config
//! value type, so that loading the config can check it without reaching up
//! into the delivery machinery that uses it (`crate::hosts`).

/// A `[[hosts]]` `match` pattern: an exact name or `*.suffix` (subdomains of
/// `suffix`, not `suffix` itself), optionally restricted to a scheme and/or port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostPattern {
    scheme: Option<String>,
    name: NamePattern,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum NamePattern {
    Exact(String),
    Subdomains(String),
}

impl HostPattern {
    /// Parses `api.example.com`, `*.example.com`, `127.0.0.1:8080`,
    /// `https://*.example.com:443`.
    pub(crate) fn parse(text: &str) -> Result<HostPattern, String> {
        let (scheme, rest) = match text.split_once("://") {
            Some((s, rest)) if s == "http" || s == "https" => (Some(s.to_string()), rest),
            Some((s, _)) => return Err(format!("`{text}`: scheme `{s}` is not http or https")),
            None => (None, text),
        };
        // `[v6]:port`, `[v6]`, `name:port`, `name`.
        let split = match rest.strip_prefix('[') {
            Some(v6) => v6
                .split_once(']')
                .map(|(addr, tail)| (&rest[..addr.len() + 2], tail.strip_prefix(':'))),
            None => Some(match rest.rsplit_once(':') {
                Some((name, port)) => (name, Some(port)),
                None => (rest, None),
            }),
        };
        let Some((name, port)) = split else {
            return Err(format!("`{text}`: an IPv6 address needs its closing `]`"));
        };
        let port = match port {
            Some(port) => Some(
                port.parse::<u16>()
                    .map_err(|_| format!("`{text}`: `{port}` is not a port"))?,
            ),
            None => None,
        };
        let name = name.to_ascii_lowercase();
        let valid = |n: &str| {
            !n.is_empty()
                && n.len() <= 253
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.[]:".contains(&b))
        };
        let name = match name.strip_prefix("*.") {
            Some(suffix) if valid(suffix) => NamePattern::Subdomains(suffix.to_string()),
            None if valid(&name) && !name.contains('*') => NamePattern::Exact(name),
            _ => {
                return Err(format!(
                    "`{text}` is not a host pattern like api.example.com or *.example.com"
                ))
            }
        };
        Ok(HostPattern { scheme, name, port })
    }

    /// Whether the host `key` (`scheme://host:port`) matches.
    pub(crate) fn matches(&self, key: &str) -> bool {
        let Some((scheme, rest)) = key.split_once("://") else {
            return false;
        };
        let Some((name, port)) = rest.rsplit_once(':') else {
            return false;
        };
        if self.scheme.as_deref().is_some_and(|s| s != scheme) {
            return false;
        }
        if self.port.is_some_and(|p| port.parse::<u16>() != Ok(p)) {
            return false;
        }
        match &self.name {
            NamePattern::Exact(n) => name.eq_ignore_ascii_case(n),
            NamePattern::Subdomains(suffix) => {
                name.len() > suffix.len() + 1
                    && name[name.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
                    && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_names_subdomains_and_ports() {
        let exact = HostPattern::parse("api.example.com").expect("pattern");
        assert!(exact.matches("https://api.example.com:443"));
        assert!(exact.matches("http://API.example.com:80"));
        assert!(!exact.matches("https://x.api.example.com:443"));
        let wild = HostPattern::parse("*.example.com").expect("pattern");
        assert!(wild.matches("https://a.example.com:443"));
        assert!(wild.matches("https://a.b.example.com:443"));
        assert!(!wild.matches("https://example.com:443"));
        assert!(!wild.matches("https://badexample.com:443"));
        let v6 = HostPattern::parse("[::1]:8080").expect("pattern");
        assert!(v6.matches("http://[::1]:8080"));
        let port = HostPattern::parse("127.0.0.1:8080").expect("pattern");
        assert!(port.matches("http://127.0.0.1:8080"));
        assert!(!port.matches("http://127.0.0.1:8081"));
        let scheme = HostPattern::parse("https://*.example.com").expect("pattern");
        assert!(!scheme.matches("http://a.example.com:80"));
        for bad in ["", "*", "a.*.com", "ftp://x", "h:99999", "sp ace", "*."] {
            assert!(HostPattern::parse(bad).is_err(), "{bad} should be refused");
        }
    }
}
