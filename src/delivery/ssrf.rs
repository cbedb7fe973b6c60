//! Temporary: replaced by the ssrf module.
use std::net::IpAddr;
use std::sync::Arc;
/// Policy.
pub struct AddressPolicy {
    allow_private: bool,
}
/// Blocked.
#[derive(Debug, thiserror::Error)]
#[error("address {ip} is {class}")]
pub struct Blocked {
    /// ip
    pub ip: IpAddr,
    /// class
    pub class: &'static str,
}
impl AddressPolicy {
    /// New.
    pub fn new(allow_private: bool, _c: Vec<ipnet::IpNet>) -> Self {
        AddressPolicy { allow_private }
    }
    /// Check url.
    pub fn check_url_host(&self, _u: &reqwest::Url) -> Result<(), Blocked> {
        let _ = self.allow_private;
        Ok(())
    }
}
/// Resolver.
pub struct GuardedResolver {
    _p: Arc<AddressPolicy>,
}
impl GuardedResolver {
    /// New.
    pub fn new(p: Arc<AddressPolicy>) -> Self {
        GuardedResolver { _p: p }
    }
}
impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<std::net::SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}
/// Find.
pub fn find_blocked<'a>(_e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Blocked> {
    None
}
