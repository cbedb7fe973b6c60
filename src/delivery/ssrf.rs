//! The SSRF guard: which addresses a delivery may connect to.
//!
//! By default deliveries may not reach loopback, private (RFC 1918, RFC 4193),
//! link-local, CGNAT, multicast, broadcast, unspecified or reserved addresses,
//! nor the IPv4-mapped / NAT64 forms of those. The check runs on the address
//! actually connected to: hostnames are resolved by [`GuardedResolver`], which
//! hands reqwest only the addresses that pass (so DNS rebinding between check
//! and connect is impossible), and IP-literal URLs, which skip the resolver,
//! are checked by [`AddressPolicy::check_url_host`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;

/// Which targets deliveries may connect to.
#[derive(Debug, Clone)]
pub struct AddressPolicy {
    allow_private: bool,
    allow_cidrs: Vec<IpNet>,
}

/// A refused address, with the class that refused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// The address.
    pub ip: IpAddr,
    /// Why: `loopback`, `private`, `link-local`, ...
    pub class: &'static str,
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "address {} is {}; deliveries to private networks are refused (see delivery.allow_private / delivery.allow_cidrs)",
            self.ip, self.class
        )
    }
}

impl std::error::Error for Blocked {}

/// The forbidden class of an IPv4 address, if any.
fn v4_class(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    Some(match o {
        [0, ..] => "unspecified (0.0.0.0/8)",
        [127, ..] => "loopback",
        [10, ..] => "private (RFC 1918)",
        [172, b, ..] if (16..=31).contains(&b) => "private (RFC 1918)",
        [192, 168, ..] => "private (RFC 1918)",
        [100, b, ..] if (64..=127).contains(&b) => "CGNAT (100.64.0.0/10)",
        [169, 254, ..] => "link-local",
        [192, 0, 0, _] => "IETF protocol assignments (192.0.0.0/24)",
        [198, b, ..] if b == 18 || b == 19 => "benchmarking (198.18.0.0/15)",
        [255, 255, 255, 255] => "broadcast",
        [a, ..] if (224..=239).contains(&a) => "multicast",
        [a, ..] if a >= 240 => "reserved (240.0.0.0/4)",
        _ => return None,
    })
}

/// The IPv4 address embedded in an IPv4-mapped (`::ffff:a.b.c.d`),
/// IPv4-compatible (`::a.b.c.d`) or NAT64 (`64:ff9b::a.b.c.d`) IPv6 address.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = ip.segments();
    let tail = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if s[..6] == [0, 0, 0, 0, 0, 0] && !ip.is_loopback() && !ip.is_unspecified() {
        return Some(tail);
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(tail);
    }
    None
}

/// The forbidden class of an IPv6 address, if any.
fn v6_class(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_unspecified() {
        Some("unspecified")
    } else if ip.is_loopback() {
        Some("loopback")
    } else if first & 0xfe00 == 0xfc00 {
        Some("unique-local (RFC 4193)")
    } else if first & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else if first & 0xff00 == 0xff00 {
        Some("multicast")
    } else if first & 0xffc0 == 0xfec0 {
        Some("site-local (deprecated)")
    } else {
        None
    }
}

impl AddressPolicy {
    /// A policy: `allow_private` turns the guard off; otherwise addresses in
    /// `allow_cidrs` are allowed even if private.
    pub fn new(allow_private: bool, allow_cidrs: Vec<IpNet>) -> Self {
        AddressPolicy {
            allow_private,
            allow_cidrs,
        }
    }

    fn allowlisted(&self, ip: IpAddr) -> bool {
        self.allow_cidrs.iter().any(|net| net.contains(&ip))
    }

    /// Whether a delivery may connect to `ip`.
    pub fn check(&self, ip: IpAddr) -> Result<(), Blocked> {
        if self.allow_private || self.allowlisted(ip) {
            return Ok(());
        }
        let class = match ip {
            IpAddr::V4(v4) => v4_class(v4),
            IpAddr::V6(v6) => match embedded_v4(v6) {
                Some(v4) if self.allowlisted(IpAddr::V4(v4)) => return Ok(()),
                Some(v4) => v4_class(v4),
                None => v6_class(v6),
            },
        };
        match class {
            Some(class) => Err(Blocked { ip, class }),
            None => Ok(()),
        }
    }

    /// Checks a URL whose host is an IP literal (hostnames are checked by the
    /// resolver when they are resolved).
    pub fn check_url_host(&self, url: &reqwest::Url) -> Result<(), Blocked> {
        match url.host() {
            Some(url::Host::Ipv4(v4)) => self.check(IpAddr::V4(v4)),
            Some(url::Host::Ipv6(v6)) => self.check(IpAddr::V6(v6)),
            _ => Ok(()),
        }
    }
}

/// A DNS resolver for reqwest that returns only addresses the policy allows;
/// when every address of a name is refused, resolution fails with [`Blocked`].
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    policy: Arc<AddressPolicy>,
}

impl GuardedResolver {
    /// A resolver enforcing `policy`.
    pub fn new(policy: Arc<AddressPolicy>) -> Self {
        GuardedResolver { policy }
    }
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut first_refusal = None;
            let allowed: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(|addr| match policy.check(addr.ip()) {
                    Ok(()) => true,
                    Err(blocked) => {
                        first_refusal.get_or_insert(blocked);
                        false
                    }
                })
                .collect();
            match (allowed.is_empty(), first_refusal) {
                (true, Some(blocked)) => {
                    Err(Box::new(blocked) as Box<dyn std::error::Error + Send + Sync>)
                }
                _ => Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}

/// Finds a [`Blocked`] refusal in an error's source chain (reqwest wraps the
/// resolver's error a few levels deep).
pub fn find_blocked<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a Blocked> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(blocked) = e.downcast_ref::<Blocked>() {
            return Some(blocked);
        }
        current = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> AddressPolicy {
        AddressPolicy::new(false, Vec::new())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn every_forbidden_class_is_refused() {
        let refused = [
            "127.0.0.1",
            "127.1.2.3",
            "0.0.0.0",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.254",
            "169.254.169.254",
            "224.0.0.1",
            "239.255.255.250",
            "255.255.255.255",
            "240.0.0.1",
            "192.0.0.8",
            "198.18.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
        ];
        for addr in refused {
            assert!(guard().check(ip(addr)).is_err(), "{addr} should be refused");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for addr in [
            "93.184.216.34",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1",
            "::ffff:8.8.8.8",
        ] {
            assert!(guard().check(ip(addr)).is_ok(), "{addr} should pass");
        }
    }

    #[test]
    fn allow_private_and_allow_cidrs() {
        let open = AddressPolicy::new(true, Vec::new());
        assert!(open.check(ip("127.0.0.1")).is_ok());
        let listed = AddressPolicy::new(false, vec!["10.1.0.0/16".parse().expect("cidr")]);
        assert!(listed.check(ip("10.1.2.3")).is_ok());
        assert!(listed.check(ip("::ffff:10.1.2.3")).is_ok());
        assert!(listed.check(ip("10.2.0.1")).is_err());
        assert!(listed.check(ip("127.0.0.1")).is_err());
    }

    #[test]
    fn ip_literal_urls_are_checked() {
        let url = |u: &str| reqwest::Url::parse(u).expect("url");
        assert!(guard()
            .check_url_host(&url("http://127.0.0.1:8080/"))
            .is_err());
        assert!(guard()
            .check_url_host(&url("http://[::ffff:7f00:1]/"))
            .is_err());
        assert!(guard().check_url_host(&url("http://example.com/")).is_ok());
    }

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_and_found_in_the_error() {
        let client = reqwest::Client::builder()
            .dns_resolver(Arc::new(GuardedResolver::new(Arc::new(guard()))))
            .build()
            .expect("client");
        let err = client
            .get("http://localhost:9/")
            .send()
            .await
            .expect_err("refused");
        let blocked = find_blocked(&err).expect("Blocked in the chain");
        assert!(blocked.ip.is_loopback(), "{blocked}");
    }
}
