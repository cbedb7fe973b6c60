//! The SSRF guard: which addresses an outgoing delivery may connect to.
//!
//! This module owns the address policy ([`AddressPolicy`]), the DNS resolver
//! that enforces it ([`GuardedResolver`]) and the refusal error ([`Blocked`]).
//!
//! Unless `delivery.allow_private` is set, these addresses are refused:
//!
//! | class                      | IPv4                                           | IPv6                    |
//! |----------------------------|------------------------------------------------|-------------------------|
//! | `unspecified`              | 0.0.0.0/8 ("this network")                     | `::`                    |
//! | `loopback`                 | 127.0.0.0/8                                    | `::1`                   |
//! | `private`                  | 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16      | —                       |
//! | `unique-local`             | —                                              | fc00::/7 (RFC 4193)     |
//! | `carrier-grade NAT`        | 100.64.0.0/10                                  | —                       |
//! | `link-local`               | 169.254.0.0/16                                 | fe80::/10               |
//! | `site-local`               | —                                              | fec0::/10 (deprecated)  |
//! | `multicast`                | 224.0.0.0/4                                    | ff00::/8                |
//! | `broadcast`                | 255.255.255.255                                | —                       |
//! | `IETF protocol assignment` | 192.0.0.0/24                                   | —                       |
//! | `benchmarking`             | 198.18.0.0/15                                  | 2001:2::/48             |
//! | `documentation`            | 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24  | 2001:db8::/32, 3fff::/20 |
//! | `Teredo`                   | —                                              | 2001::/32 (RFC 4380)    |
//! | `reserved`                 | 240.0.0.0/4                                    | outside 2000::/3, unless listed above |
//!
//! Documentation and benchmarking ranges are refused although they are not
//! routable on the internet: no legitimate receiver lives there, and some
//! networks reuse them internally.
//!
//! An IPv6 address that stands for an IPv4 one is judged as that IPv4 address
//! (both for its class and for the allowlist): IPv4-mapped `::ffff:a.b.c.d`,
//! IPv4-compatible `::a.b.c.d`, NAT64 well-known prefix `64:ff9b::a.b.c.d`
//! and 6to4 `2002:aabb:ccdd::/48`. Teredo (2001::/32) addresses are refused
//! as a class of their own: a tunnel whose embedded (obfuscated) IPv4 relay
//! and client addresses say nothing reliable about the host reached, and no
//! webhook receiver is only reachable through one.
//!
//! An address inside one of `delivery.allow_cidrs` (trusted private ranges)
//! is allowed even if its class is refused. Everything else is public and
//! always allowed.
//!
//! The check runs on the address actually connected to. Hostnames are
//! resolved by [`GuardedResolver`], which hands reqwest only the addresses
//! that pass, so DNS rebinding between check and connect is impossible.
//! IP-literal URLs never reach a resolver in reqwest, so they must be checked
//! with [`AddressPolicy::check_url_host`] before sending.

use std::error::Error;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;

/// Which addresses deliveries may connect to (`delivery.allow_private`,
/// `delivery.allow_cidrs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AddressPolicy {
    allow_private: bool,
    allow_cidrs: Vec<IpNet>,
}

/// A refused address and the class that refused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Blocked {
    /// The refused address, as it was checked.
    pub ip: IpAddr,
    /// Why it was refused: `loopback`, `private`, `link-local`, ...
    pub class: &'static str,
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "address {} is {}; deliveries to private networks are refused \
             (delivery.allow_private / delivery.allow_cidrs)",
            self.ip, self.class
        )
    }
}

impl Error for Blocked {}

impl AddressPolicy {
    /// A policy. `allow_private` turns the guard off entirely; otherwise an
    /// address in one of `allow_cidrs` is allowed even if its class is
    /// refused.
    pub(crate) fn new(allow_private: bool, allow_cidrs: Vec<IpNet>) -> Self {
        AddressPolicy {
            allow_private,
            allow_cidrs,
        }
    }

    /// Whether a delivery may connect to `ip`.
    pub(crate) fn check(&self, ip: IpAddr) -> Result<(), Blocked> {
        if self.allow_private {
            return Ok(());
        }
        match refused_class(ip) {
            Some(class) if !self.allowlisted(ip) => Err(Blocked { ip, class }),
            _ => Ok(()),
        }
    }

    /// Checks the host of `url` if it is an IP literal (`1.2.3.4` or
    /// `[::1]`); hostnames pass here, as [`GuardedResolver`] checks the
    /// addresses they resolve to.
    pub(crate) fn check_url_host(&self, url: &reqwest::Url) -> Result<(), Blocked> {
        let Some(host) = url.host_str() else {
            return Ok(());
        };
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        match bare.parse::<IpAddr>() {
            Ok(ip) => self.check(ip),
            Err(_) => Ok(()),
        }
    }

    /// Whether `ip`, or the IPv4 address it stands for, is in `allow_cidrs`.
    fn allowlisted(&self, ip: IpAddr) -> bool {
        let embedded = match ip {
            IpAddr::V4(_) => None,
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
        };
        self.allow_cidrs
            .iter()
            .any(|net| net.contains(&ip) || embedded.is_some_and(|v4| net.contains(&v4)))
    }
}

/// The refused class of `ip`, or `None` when it is public.
fn refused_class(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_class(v4),
        IpAddr::V6(v6) => v6_class(v6),
    }
}

/// The refused class of an IPv4 address, or `None` when it is public.
fn v4_class(ip: Ipv4Addr) -> Option<&'static str> {
    let class = match ip.octets() {
        [0, ..] => "unspecified",
        [127, ..] => "loopback",
        [10, ..] | [172, 16..=31, ..] | [192, 168, ..] => "private",
        [100, 64..=127, ..] => "carrier-grade NAT",
        [169, 254, ..] => "link-local",
        [192, 0, 0, _] => "IETF protocol assignment",
        [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => "documentation",
        [198, 18..=19, ..] => "benchmarking",
        [224..=239, ..] => "multicast",
        [255, 255, 255, 255] => "broadcast",
        [240..=255, ..] => "reserved",
        _ => return None,
    };
    Some(class)
}

/// The refused class of an IPv6 address, or `None` when it is public.
fn v6_class(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    if let Some(v4) = embedded_v4(ip) {
        return v4_class(v4);
    }
    let s = ip.segments();
    let class = match s[0] {
        0xfc00..=0xfdff => "unique-local",
        0xfe80..=0xfebf => "link-local",
        0xfec0..=0xfeff => "site-local",
        0xff00..=0xffff => "multicast",
        0x2001 if s[1] == 0x0db8 => "documentation",
        0x2001 if s[1] == 0x0000 => "Teredo",
        0x2001 if s[1] == 0x0002 && s[2] == 0 => "benchmarking",
        0x3fff if s[1] <= 0x0fff => "documentation",
        0x2000..=0x3fff => return None,
        _ => "reserved",
    };
    Some(class)
}

/// The IPv4 address that an IPv6 address stands for: IPv4-mapped
/// (`::ffff:0:0/96`), IPv4-compatible (`::/96`, except `::` and `::1`),
/// NAT64 well-known prefix (`64:ff9b::/96`) or 6to4 (`2002::/16`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = ip.segments();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    match s {
        [0, 0, 0, 0, 0, 0, _, _] if !ip.is_unspecified() && !ip.is_loopback() => {
            Some(v4(s[6], s[7]))
        }
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(v4(s[6], s[7])),
        [0x2002, ..] => Some(v4(s[1], s[2])),
        _ => None,
    }
}

/// A DNS resolver for reqwest that returns only the addresses its policy
/// allows. When a name has addresses but all of them are refused, resolution
/// fails with a boxed [`Blocked`] (find it with [`find_blocked`]).
#[derive(Debug, Clone)]
pub(crate) struct GuardedResolver {
    policy: Arc<AddressPolicy>,
}

impl GuardedResolver {
    /// A resolver enforcing `policy`.
    pub(crate) fn new(policy: Arc<AddressPolicy>) -> Self {
        GuardedResolver { policy }
    }
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = Arc::clone(&self.policy);
        Box::pin(async move {
            let mut first_refusal = None;
            let allowed: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), 0))
                .await?
                .filter(|addr| match policy.check(addr.ip()) {
                    Ok(()) => true,
                    Err(blocked) => {
                        first_refusal.get_or_insert(blocked);
                        false
                    }
                })
                .collect();
            match first_refusal {
                Some(blocked) if allowed.is_empty() => {
                    Err(Box::new(blocked) as Box<dyn Error + Send + Sync>)
                }
                _ => Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}

/// Finds the [`Blocked`] refusal in `err` or its `source()` chain (reqwest
/// wraps the resolver's error a few levels deep). Also looks inside
/// `std::io::Error` wrappers, whose `source()` skips their own payload.
pub(crate) fn find_blocked<'a>(err: &'a (dyn Error + 'static)) -> Option<&'a Blocked> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(blocked) = e.downcast_ref::<Blocked>() {
            return Some(blocked);
        }
        current = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(payload) => Some(payload),
            None => e.source(),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("valid IP address")
    }

    fn cidr(text: &str) -> IpNet {
        text.parse().expect("valid CIDR")
    }

    fn strict() -> AddressPolicy {
        AddressPolicy::new(false, Vec::new())
    }

    fn url(text: &str) -> reqwest::Url {
        reqwest::Url::parse(text).expect("valid URL")
    }

    /// A client whose only resolver is the guard (no proxy from the environment).
    fn client(policy: AddressPolicy) -> reqwest::Client {
        reqwest::Client::builder()
            .no_proxy()
            .dns_resolver(Arc::new(GuardedResolver::new(Arc::new(policy))))
            .build()
            .expect("client builds")
    }

    #[test]
    fn every_refused_class_is_refused() {
        let table = [
            // IPv4
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "unspecified"),
            ("127.0.0.1", "loopback"),
            ("127.255.255.254", "loopback"),
            ("10.0.0.1", "private"),
            ("10.255.255.255", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("100.127.255.254", "carrier-grade NAT"),
            ("169.254.169.254", "link-local"),
            ("192.0.0.8", "IETF protocol assignment"),
            ("192.0.2.1", "documentation"),
            ("198.51.100.7", "documentation"),
            ("203.0.113.9", "documentation"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.255", "benchmarking"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.250", "multicast"),
            ("240.0.0.1", "reserved"),
            ("255.255.255.254", "reserved"),
            ("255.255.255.255", "broadcast"),
            // IPv6
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("fc00::1", "unique-local"),
            ("fd12:3456:789a::1", "unique-local"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("fec0::1", "site-local"),
            ("ff02::1", "multicast"),
            ("ff0e::1", "multicast"),
            ("2001:db8::1", "documentation"),
            ("3fff::1", "documentation"),
            ("2001:2::1", "benchmarking"),
            ("2001::1", "Teredo"),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
            ("100::1", "reserved"),
            ("64:ff9b:1::1", "reserved"),
            ("4000::1", "reserved"),
            // IPv6 forms of refused IPv4 addresses
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("::ffff:169.254.169.254", "link-local"),
            ("::ffff:0.0.0.0", "unspecified"),
            ("::ffff:100.64.0.1", "carrier-grade NAT"),
            ("::127.0.0.1", "loopback"),
            ("::192.168.0.1", "private"),
            ("::2", "unspecified"),
            ("64:ff9b::7f00:1", "loopback"),
            ("64:ff9b::169.254.169.254", "link-local"),
            ("2002:7f00:1::1", "loopback"),
            ("2002:a00:1::", "private"),
        ];
        let policy = strict();
        for (text, class) in table {
            let addr = ip(text);
            assert_eq!(
                policy.check(addr),
                Err(Blocked { ip: addr, class }),
                "{text} should be refused as {class}"
            );
        }
    }

    #[test]
    fn public_addresses_are_allowed() {
        let policy = strict();
        for text in [
            "93.184.216.34",
            "8.8.8.8",
            "1.1.1.1",
            "172.15.255.255",
            "172.32.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "169.253.0.1",
            "192.0.1.1",
            "192.167.0.1",
            "198.17.255.255",
            "198.20.0.1",
            "223.255.255.255",
            "2606:4700::1",
            "2001:4860:4860::8888",
            "2a00:1450:4001::1",
            "2001:db9::1",
            "3fff:1000::1",
            "2001:3::1",
            "::ffff:93.184.216.34",
            "64:ff9b::8.8.8.8",
            "2002:5db8:d822::1",
        ] {
            assert_eq!(policy.check(ip(text)), Ok(()), "{text} should be allowed");
        }
    }

    #[test]
    fn allow_private_allows_everything() {
        let open = AddressPolicy::new(true, Vec::new());
        for text in [
            "127.0.0.1",
            "10.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "255.255.255.255",
            "::1",
            "fc00::1",
            "::ffff:127.0.0.1",
            "93.184.216.34",
        ] {
            assert_eq!(open.check(ip(text)), Ok(()), "{text} should be allowed");
        }
    }

    #[test]
    fn allow_cidrs_allows_only_the_listed_ranges() {
        let policy = AddressPolicy::new(false, vec![cidr("10.1.0.0/16"), cidr("fd00:1::/32")]);
        for text in [
            "10.1.2.3",
            "10.1.255.255",
            "::ffff:10.1.2.3",
            "64:ff9b::10.1.2.3",
            "fd00:1::5",
            "93.184.216.34",
        ] {
            assert_eq!(policy.check(ip(text)), Ok(()), "{text} should be allowed");
        }
        for text in [
            "10.2.0.1",
            "10.0.255.255",
            "::ffff:10.2.0.1",
            "127.0.0.1",
            "fd00:2::5",
            "::1",
        ] {
            assert!(policy.check(ip(text)).is_err(), "{text} should be refused");
        }
    }

    #[test]
    fn blocked_displays_address_class_and_settings() {
        let blocked = strict().check(ip("127.0.0.1")).expect_err("refused");
        assert_eq!(
            blocked.to_string(),
            "address 127.0.0.1 is loopback; deliveries to private networks are refused \
             (delivery.allow_private / delivery.allow_cidrs)"
        );
        let mapped = strict().check(ip("::ffff:10.0.0.1")).expect_err("refused");
        assert!(
            mapped
                .to_string()
                .starts_with("address ::ffff:10.0.0.1 is private;"),
            "{mapped}"
        );
        let as_error: &dyn Error = &blocked;
        assert!(as_error.source().is_none());
    }

    #[test]
    fn ip_literal_urls_are_checked_and_hostnames_pass() {
        let policy = strict();
        for refused in [
            "http://127.0.0.1:8080/hook",
            "https://10.0.0.1/",
            "http://[::1]/",
            "http://[::ffff:7f00:1]/",
            "http://[fe80::1]:8080/",
            "http://169.254.169.254/latest/meta-data/",
            // The URL parser normalises these to 127.0.0.1.
            "http://0x7f000001/",
            "http://2130706433/",
            "http://127.1/",
            "http://127.0.0.1./",
        ] {
            assert!(
                policy.check_url_host(&url(refused)).is_err(),
                "{refused} should be refused"
            );
        }
        for allowed in [
            "http://93.184.216.34/",
            "https://[2606:4700::1]:8443/",
            "https://example.com/",
            "http://localhost:9/",
            "http://internal.corp/",
        ] {
            assert_eq!(
                policy.check_url_host(&url(allowed)),
                Ok(()),
                "{allowed} should pass"
            );
        }
        let open = AddressPolicy::new(true, Vec::new());
        assert_eq!(open.check_url_host(&url("http://127.0.0.1/")), Ok(()));
        let listed = AddressPolicy::new(false, vec![cidr("10.1.0.0/16")]);
        assert_eq!(listed.check_url_host(&url("http://10.1.2.3/")), Ok(()));
        assert!(listed.check_url_host(&url("http://10.2.0.1/")).is_err());
    }

    #[test]
    fn find_blocked_walks_source_chains() {
        #[derive(Debug)]
        struct Wrapper(Box<dyn Error + Send + Sync>);
        impl fmt::Display for Wrapper {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("wrapper")
            }
        }
        impl Error for Wrapper {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&*self.0)
            }
        }

        let blocked = Blocked {
            ip: ip("127.0.0.1"),
            class: "loopback",
        };
        assert_eq!(find_blocked(&blocked), Some(&blocked));
        let nested = Wrapper(Box::new(Wrapper(Box::new(blocked))));
        assert_eq!(find_blocked(&nested), Some(&blocked));
        let in_io = Wrapper(Box::new(std::io::Error::other(blocked)));
        assert_eq!(find_blocked(&in_io), Some(&blocked));
        let unrelated = Wrapper(Box::new(std::io::Error::other("connection refused")));
        assert_eq!(find_blocked(&unrelated), None);
    }

    #[tokio::test]
    async fn resolver_refuses_localhost_with_blocked() {
        use reqwest::dns::Resolve;

        let resolver = GuardedResolver::new(Arc::new(strict()));
        let name: reqwest::dns::Name = "localhost".parse().expect("valid name");
        let err = match resolver.resolve(name).await {
            Ok(addrs) => panic!("localhost resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(err) => err,
        };
        let blocked = err.downcast_ref::<Blocked>().expect("error is Blocked");
        assert!(blocked.ip.is_loopback(), "{blocked}");
        assert_eq!(blocked.class, "loopback");
    }

    #[tokio::test]
    async fn resolver_returns_only_allowed_addresses() {
        use reqwest::dns::Resolve;

        // localhost may resolve to both 127.0.0.1 and ::1; only IPv4 is listed.
        let policy = AddressPolicy::new(false, vec![cidr("127.0.0.0/8")]);
        let resolver = GuardedResolver::new(Arc::new(policy));
        let name: reqwest::dns::Name = "localhost".parse().expect("valid name");
        let addrs: Vec<SocketAddr> = resolver.resolve(name).await.expect("resolves").collect();
        assert!(!addrs.is_empty());
        assert!(addrs.iter().all(|a| a.ip() == ip("127.0.0.1")), "{addrs:?}");
    }

    #[tokio::test]
    async fn reqwest_error_for_a_refused_name_contains_blocked() {
        let err = client(strict())
            .get("http://localhost:9/")
            .send()
            .await
            .expect_err("request is refused");
        let blocked = find_blocked(&err).expect("Blocked in the reqwest error chain");
        assert!(blocked.ip.is_loopback(), "{blocked}");
        assert!(err.is_connect(), "{err:?}");
    }

    #[tokio::test]
    async fn unrelated_reqwest_errors_contain_no_blocked() {
        // A port nobody listens on any more: with the guard off, connecting
        // fails with a plain connect error that is not a refusal.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("local addr").port();
        drop(listener);
        let err = client(AddressPolicy::new(true, Vec::new()))
            .get(format!("http://127.0.0.1:{port}/"))
            .send()
            .await
            .expect_err("nothing listens");
        assert!(find_blocked(&err).is_none(), "{err:?}");
    }

    /// Serves one request with an empty 200 on 127.0.0.1; returns the port.
    async fn serve_one_ok() -> (u16, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("local addr").port();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            // Read the request head first: closing with unread data resets
            // the connection, which the client could see before the response.
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
            }
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .await
                .expect("write");
            socket.shutdown().await.expect("shutdown");
        });
        (port, server)
    }

    #[tokio::test]
    async fn allow_private_reaches_localhost_by_name() {
        let (port, server) = serve_one_ok().await;
        let response = client(AddressPolicy::new(true, Vec::new()))
            .get(format!("http://localhost:{port}/"))
            .send()
            .await
            .expect("localhost is reachable with allow_private");
        assert_eq!(response.status(), reqwest::StatusCode::OK);
        server.await.expect("server task");
    }

    #[tokio::test]
    async fn allow_cidrs_reaches_localhost_by_name() {
        let (port, server) = serve_one_ok().await;
        let response = client(AddressPolicy::new(false, vec![cidr("127.0.0.0/8")]))
            .get(format!("http://localhost:{port}/"))
            .send()
            .await
            .expect("127.0.0.0/8 is allowlisted");
        assert_eq!(response.status(), reqwest::StatusCode::OK);
        server.await.expect("server task");
    }
}
