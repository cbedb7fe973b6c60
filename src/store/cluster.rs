//! The Redis Cluster connection, and how it follows a failover.
//!
//! redis-rs's async cluster connection re-reads the slot map when a node
//! answers MOVED, but when a master dies it only reconnects to that same
//! address, forever: the slots it served stall even after a replica has been
//! promoted. [`ClusterConn`] watches the answers instead; when one says a
//! node is gone (connection refused or reset, timeout, CLUSTERDOWN), it
//! builds a fresh connection from the seed nodes in the background, which
//! reads the cluster's current slot map, and swaps it in. Calls made in the
//! meantime fail fast and are retried by their callers, as with any Redis
//! error.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

/// The shortest time between two rebuilds, so a burst of failing calls
/// causes one rebuild, and a failover still in progress is looked at again
/// soon after.
pub(crate) const REBUILD_INTERVAL: Duration = Duration::from_millis(500);

/// A self-healing connection to a Redis Cluster. Cheap to clone; clones share
/// the current connection.
#[derive(Clone)]
pub(crate) struct ClusterConn {
    client: Arc<ClusterClient>,
    shared: Arc<Shared>,
}

struct Shared {
    current: RwLock<ClusterConnection>,
    rebuilding: AtomicBool,
    last_rebuild: Mutex<Instant>,
}

impl ClusterConn {
    /// Connects through `client`'s seed nodes.
    pub(crate) async fn connect(client: ClusterClient) -> RedisResult<ClusterConn> {
        let conn = client.get_async_connection().await?;
        Ok(ClusterConn {
            client: Arc::new(client),
            shared: Arc::new(Shared {
                current: RwLock::new(conn),
                rebuilding: AtomicBool::new(false),
                last_rebuild: Mutex::new(Instant::now()),
            }),
        })
    }

    fn current(&self) -> ClusterConnection {
        match self.shared.current.read() {
            Ok(conn) => conn.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Starts a rebuild in the background after `err`, if the error says a
    /// node may be gone and no rebuild ran in the last [`REBUILD_INTERVAL`].
    fn after_error(&self, err: &RedisError) {
        if !signals_topology_change(err) {
            return;
        }
        {
            let last = match self.shared.last_rebuild.lock() {
                Ok(last) => *last,
                Err(poisoned) => *poisoned.into_inner(),
            };
            if last.elapsed() < REBUILD_INTERVAL {
                return;
            }
        }
        if self.shared.rebuilding.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        let cause = err.to_string();
        tokio::spawn(async move {
            match this.client.get_async_connection().await {
                Ok(fresh) => {
                    tracing::info!(%cause, "rebuilt the cluster connection from the seed nodes");
                    match this.shared.current.write() {
                        Ok(mut current) => *current = fresh,
                        Err(poisoned) => *poisoned.into_inner() = fresh,
                    }
                }
                Err(e) => tracing::warn!(cause = %e, "cannot rebuild the cluster connection yet"),
            }
            match this.shared.last_rebuild.lock() {
                Ok(mut last) => *last = Instant::now(),
                Err(poisoned) => *poisoned.into_inner() = Instant::now(),
            }
            this.shared.rebuilding.store(false, Ordering::Release);
        });
    }
}

/// Whether `err` may mean the cluster's topology changed under us: a node
/// refusing, resetting or not answering, or the cluster saying it is down.
fn signals_topology_change(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || matches!(
            err.kind(),
            ErrorKind::ClusterDown | ErrorKind::MasterDown | ErrorKind::ClusterConnectionNotFound
        )
}

impl ClusterConn {
    /// Sends `cmd` to the master serving the slot of `key` (for commands
    /// such as SCAN that name no key but must reach that node).
    pub(crate) async fn on_master_of(&self, key: &str, cmd: &Cmd) -> RedisResult<Value> {
        let mut conn = self.current();
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut conn)
            .await?;
        let route = Route::new(slot, SlotAddr::Master);
        let result = conn
            .route_command(
                cmd,
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
            )
            .await;
        if let Err(e) = &result {
            self.after_error(e);
        }
        result
    }
}

impl ConnectionLike for ClusterConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let mut conn = self.current();
        Box::pin(async move {
            let result = conn.req_packed_command(cmd).await;
            if let Err(e) = &result {
                self.after_error(e);
            }
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let mut conn = self.current();
        Box::pin(async move {
            let result = conn.req_packed_commands(cmd, offset, count).await;
            if let Err(e) = &result {
                self.after_error(e);
            }
            result
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_loss_and_cluster_down_ask_for_a_rebuild() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(signals_topology_change(&refused));
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(signals_topology_change(&timeout));
        let down = RedisError::from((ErrorKind::ClusterDown, "CLUSTERDOWN"));
        assert!(signals_topology_change(&down));
    }

    #[test]
    fn script_and_type_errors_do_not() {
        let script = RedisError::from((ErrorKind::ResponseError, "ERR user_script"));
        assert!(!signals_topology_change(&script));
        let oom = RedisError::from((
            ErrorKind::ExtensionError,
            "OOM",
            "command not allowed".to_string(),
        ));
        assert!(!signals_topology_change(&oom));
        let noscript = RedisError::from((ErrorKind::NoScriptError, "NOSCRIPT"));
        assert!(!signals_topology_change(&noscript));
    }
}
