//! Per-host concurrency: at most `delivery.per_host_concurrency` attempts to
//! one host (scheme, host, port) at a time, so one slow or dead endpoint
//! cannot occupy the whole worker pool.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Hosts remembered before idle ones are forgotten.
const PRUNE_ABOVE: usize = 4096;

/// One host's slots and the jobs waiting for them.
struct Host {
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
}

/// Slots per host.
pub struct HostLimits {
    per_host: usize,
    hosts: Mutex<HashMap<String, Arc<Host>>>,
}

impl HostLimits {
    /// `per_host` concurrent attempts per host.
    pub fn new(per_host: usize) -> Self {
        HostLimits {
            per_host: per_host.max(1),
            hosts: Mutex::new(HashMap::new()),
        }
    }

    /// The host key of a URL: `scheme://host:port`.
    pub fn key(url: &str) -> String {
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

    fn host(&self, key: &str) -> Arc<Host> {
        let mut hosts = match self.hosts.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(h) = hosts.get(key) {
            return h.clone();
        }
        if hosts.len() >= PRUNE_ABOVE {
            let per_host = self.per_host;
            hosts.retain(|_, h| Arc::strong_count(h) > 1 || h.slots.available_permits() < per_host);
        }
        let h = Arc::new(Host {
            slots: Arc::new(Semaphore::new(self.per_host)),
            waiting: AtomicUsize::new(0),
        });
        hosts.insert(key.to_string(), h.clone());
        h
    }

    /// A slot for `key` if one is free now.
    pub fn try_acquire(&self, key: &str) -> Option<OwnedSemaphorePermit> {
        self.host(key).slots.clone().try_acquire_owned().ok()
    }

    /// A slot for `key` if one frees up within `wait`; None at once when as
    /// many jobs as the host has slots are already waiting.
    pub async fn acquire_within(&self, key: &str, wait: Duration) -> Option<OwnedSemaphorePermit> {
        let host = self.host(key);
        if host.waiting.fetch_add(1, Ordering::AcqRel) >= self.per_host {
            host.waiting.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let slot = tokio::time::timeout(wait, host.slots.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok);
        host.waiting.fetch_sub(1, Ordering::AcqRel);
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_scheme_host_and_port() {
        assert_eq!(
            HostLimits::key("https://a.example/x?y"),
            "https://a.example:443"
        );
        assert_eq!(
            HostLimits::key("http://a.example:8080/"),
            "http://a.example:8080"
        );
    }

    #[tokio::test]
    async fn waiters_are_capped_at_the_slot_count() {
        use futures_util::FutureExt;
        let limits = Arc::new(HostLimits::new(1));
        let taken = limits.try_acquire("h").expect("slot");
        // The one allowed waiter waits (far longer than the test) for the slot.
        let first = tokio::spawn({
            let limits = limits.clone();
            async move {
                limits
                    .acquire_within("h", Duration::from_secs(600))
                    .await
                    .is_some()
            }
        });
        let waiting = || limits.host("h").waiting.load(Ordering::Acquire);
        tokio::time::timeout(Duration::from_secs(30), async {
            while waiting() == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the first waiter registers");
        // A second waiter is refused at its first poll, without waiting: no
        // clock is involved, so a loaded machine cannot fail this.
        let second = limits
            .acquire_within("h", Duration::from_secs(600))
            .now_or_never();
        assert!(
            matches!(second, Some(None)),
            "a second waiter is refused at once (it waited instead)"
        );
        assert_eq!(waiting(), 1, "the refused waiter is not counted");
        // The slot freed goes to the first waiter.
        drop(taken);
        let got = tokio::time::timeout(Duration::from_secs(30), first)
            .await
            .expect("the first waiter is woken")
            .expect("waiter task");
        assert!(got, "the first waiter gets the freed slot");
    }

    #[tokio::test]
    async fn a_full_host_refuses_then_frees() {
        let limits = HostLimits::new(2);
        let a = limits.try_acquire("h").expect("slot 1");
        let _b = limits.try_acquire("h").expect("slot 2");
        assert!(limits.try_acquire("h").is_none());
        assert!(limits.try_acquire("other").is_some());
        assert!(limits
            .acquire_within("h", Duration::from_millis(10))
            .await
            .is_none());
        drop(a);
        assert!(limits
            .acquire_within("h", Duration::from_millis(10))
            .await
            .is_some());
    }
}
