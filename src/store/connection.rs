//! The connection to Redis (a single server or a Cluster) and the calls
//! every other part of the store goes through: connecting and building the
//! [`Store`], loading the scripts (the Lua library as Redis Functions, or
//! each script for `EVALSHA` on a Redis without Functions), the checked
//! script invocation (`FCALL`, reloading the library on a node that lacks
//! it; with `WAIT` after the writes that must reach replicas), PING and
//! Redis's clock.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, FromRedisValue, Pipeline, RedisError, RedisFuture, Value};

use super::scripts::{Runner, ScriptDef, Scripts};
use super::{ClusterConn, Keys, Settings, Store, StoreError, StoreResult};
use crate::config::Config;

/// Decodes the reply of script `def` as a `T` (see [`reply`](super::reply)); a reply of
/// another shape is [`StoreError::Reply`] naming the script.
pub(super) fn decode<T: FromRedisValue>(def: &ScriptDef, value: Value) -> StoreResult<T> {
    T::from_owned_redis_value(value).map_err(|e| StoreError::reply(def.name, e.to_string()))
}

/// Whether `err` says the function called is not on that Redis: a Redis
/// restarted without persistence or flushed (`FUNCTION FLUSH`), a new or
/// failed-over master.
pub(super) fn function_missing(err: &RedisError) -> bool {
    err.to_string().contains("Function not found")
}

/// Whether `err` says that Redis has no Functions (before 7.0): `FCALL` or
/// `FUNCTION` is an unknown command.
fn functions_unsupported(err: &RedisError) -> bool {
    let text = err.to_string().to_ascii_lowercase();
    text.contains("unknown command") && (text.contains("fcall") || text.contains("function"))
}

/// A connection to a single Redis or to a Redis Cluster; both reconnect by
/// themselves.
#[derive(Clone)]
pub(crate) enum RedisConn {
    /// One Redis server (auto-reconnecting, multiplexed).
    Single(ConnectionManager),
    /// A Redis Cluster (follows MOVED/ASK, rebuilds itself after a failover).
    Cluster(ClusterConn),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(cmd, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

impl RedisConn {
    /// One `SCAN` step over the keys matching `pattern` on the node holding
    /// `key`'s slot (on a single Redis, the one server): (next cursor, keys).
    pub(crate) async fn scan_near(
        &mut self,
        key: &str,
        cursor: &str,
        pattern: &str,
        count: usize,
    ) -> StoreResult<(String, Vec<String>)> {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        let value = match self {
            RedisConn::Single(c) => cmd.query_async(c).await?,
            RedisConn::Cluster(c) => c.on_master_of(key, &cmd).await?,
        };
        Ok(redis::from_redis_value(&value)?)
    }
}

/// How long one Redis command may take before it counts as failed.
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How many times the cluster client itself retries a call (after MOVED,
/// ASK, TRYAGAIN or a lost connection) before the caller sees the error.
pub(crate) const CLUSTER_RETRIES: u32 = 3;
/// Bounds of the cluster client's wait before such a retry, in ms.
pub(crate) const CLUSTER_RETRY_WAIT_MS: (u64, u64) = (10, 200);
/// How long connecting to Redis may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

impl Store {
    /// Connects to the Redis (or Redis Cluster) named by `config`, holding
    /// data of this hookq's layout ([`Store::check_schema`]).
    pub async fn connect(config: &Config) -> StoreResult<Store> {
        let store = Store::connect_unchecked(config).await?;
        store.check_schema().await?;
        Ok(store)
    }

    /// Connects whatever the layout of the data in Redis (for `hookq
    /// migrate` and `hookq doctor`).
    pub(crate) async fn connect_unchecked(config: &Config) -> StoreResult<Store> {
        let conn = Store::open(config, RESPONSE_TIMEOUT).await?;
        let mut store = Store::with_conn(conn, config);
        if config.redis.ack_replicas > 0 {
            store.acked =
                Some(Store::open(config, RESPONSE_TIMEOUT + config.redis.ack_timeout).await?);
        }
        Ok(store)
    }

    /// A new connection to the Redis (or Cluster) of `config`.
    async fn open(config: &Config, response_timeout: Duration) -> StoreResult<RedisConn> {
        Ok(if config.redis.cluster_nodes.is_empty() {
            let client = redis::Client::open(config.redis.url.as_str())?;
            let manager_config = ConnectionManagerConfig::new()
                .set_connection_timeout(CONNECT_TIMEOUT)
                .set_response_timeout(response_timeout)
                // Each caller (API, carrier, workers) has its own backoff, so a
                // failed reconnect should fail the call at once rather than
                // hold it for seconds.
                .set_number_of_retries(0);
            RedisConn::Single(ConnectionManager::new_with_config(client, manager_config).await?)
        } else {
            let client =
                redis::cluster::ClusterClientBuilder::new(config.redis.cluster_nodes.clone())
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(response_timeout)
                    // Callers have their own backoff; a call to a lost node
                    // should fail soon and let the connection be rebuilt.
                    .retries(CLUSTER_RETRIES)
                    // redis-rs waits at least 1.28 s before a retry by
                    // default; a slot being moved is usually settled in ms.
                    .min_retry_wait(CLUSTER_RETRY_WAIT_MS.0)
                    .max_retry_wait(CLUSTER_RETRY_WAIT_MS.1)
                    .build()?;
            RedisConn::Cluster(ClusterConn::connect(client).await?)
        })
    }

    /// A store over an existing connection.
    pub(crate) fn with_conn(conn: RedisConn, config: &Config) -> Store {
        let in_cluster = matches!(conn, RedisConn::Cluster(_));
        let keys = if in_cluster {
            Keys::in_cluster(&config.redis.namespace, config.redis.partitions)
        } else {
            Keys::new(&config.redis.namespace, config.redis.partitions)
        };
        let channel = keys.wake_channel();
        Store {
            conn,
            acked: None,
            keys: Arc::new(keys),
            scripts: Arc::new(Scripts::new(
                in_cluster,
                config.redis.wheel_bucket.as_millis() as u64,
            )),
            settings: Settings {
                retention_ms: config.retention.finished.as_millis() as u64,
                keep_bodies: config.retention.keep_bodies,
                dead_letters_max: config.retention.dead_letters_max,
                default_lease_ms: config.lease_for(config.delivery.timeout).as_millis() as u64,
                claim_ahead_ms: config.delivery.claim_ahead.as_millis() as u64,
                ack_replicas: config.redis.ack_replicas,
                ack_timeout_ms: config.redis.ack_timeout.as_millis() as u64,
            },
            channel: Arc::new(channel),
            tenant_weights: Arc::new(crate::tenant::weight_args(
                &config.tenant_defaults,
                &config.tenants,
            )),
            batcher: None,
        }
    }

    /// The key schema.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// `delivery.claim_ahead` in ms: how long before their due time jobs
    /// are promoted and claimed.
    pub(crate) fn claim_ahead_ms(&self) -> i64 {
        self.settings.claim_ahead_ms as i64
    }

    /// A clone of the underlying connection, for commands outside the scripts.
    pub(crate) fn conn(&self) -> RedisConn {
        self.conn.clone()
    }

    /// Loads the scripts: the Lua library as Redis Functions on the Redis
    /// (on every master of a cluster), or, on a Redis without Functions,
    /// every script into its script cache for `EVALSHA` (readiness means
    /// the scripts are there). Logs which of the two is used when that is
    /// new.
    pub async fn load_scripts(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        match self.load_library(&mut conn, None).await {
            Ok(()) => {
                if self.scripts.set_runner(Runner::Functions) {
                    tracing::info!(
                        library = %self.scripts.library().name,
                        "Lua library loaded as Redis Functions: scripts run by FCALL"
                    );
                }
                Ok(())
            }
            Err(err) if functions_unsupported(&err) => {
                if self.scripts.set_runner(Runner::Evalsha) {
                    tracing::info!("Redis has no Functions (before 7.0): scripts run by EVALSHA");
                }
                for (_, script) in self.scripts.iter() {
                    script.prepare_invoke().load_async(&mut conn).await?;
                }
                Ok(())
            }
            Err(err) => Err(err.into()),
        }
    }

    /// `FUNCTION LOAD` of the library (never `REPLACE`: its name carries
    /// its digest, so one of that name is this very library) on the Redis,
    /// on every master of a cluster, or, with `near`, on the master holding
    /// that key only. A library already there is fine. On a single Redis
    /// `conn` is then named after the library (see
    /// [`libraries`](super::libraries)): loaded again after a restart, a
    /// connection has its name again too.
    pub(super) async fn load_library(
        &self,
        conn: &mut RedisConn,
        near: Option<&str>,
    ) -> redis::RedisResult<()> {
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg(&self.scripts.library().code);
        let loaded = match (&mut *conn, near) {
            (RedisConn::Cluster(cluster), Some(key)) => cluster.on_master_of(key, &load).await,
            (conn, _) => load.query_async::<Value>(conn).await,
        };
        match loaded {
            Err(err) if err.to_string().contains("already exists") => {}
            other => other.map(drop)?,
        }
        self.name_connection(conn).await;
        Ok(())
    }

    /// Whether Redis answers: PING on a single Redis; on a cluster, a read
    /// in every partition (so every master holding one must answer).
    pub(crate) async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        match conn {
            RedisConn::Single(_) => {
                redis::cmd("PING").query_async::<()>(&mut conn).await?;
            }
            RedisConn::Cluster(_) => {
                // A PING reaches one node; a keyed read per partition reaches
                // every master that holds one, so a master lost in a failover
                // shows as not ready until its replica has taken over.
                // (A cluster pipeline must stay on one node: one call each.)
                let reads = (0..self.keys.partitions()).map(|p| {
                    let mut conn = conn.clone();
                    let key = self.keys.seq(p);
                    async move {
                        redis::cmd("EXISTS")
                            .arg(key)
                            .query_async::<()>(&mut conn)
                            .await
                    }
                });
                for result in futures_util::future::join_all(reads).await {
                    result?;
                }
            }
        }
        Ok(())
    }

    /// Redis's clock, epoch ms.
    pub async fn redis_time_ms(&self) -> StoreResult<i64> {
        let mut conn = self.conn.clone();
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// Checks `keys` and `args` against `def`'s header.
    pub(super) fn check_inputs(
        def: &ScriptDef,
        keys: &[&str],
        args: &[Vec<u8>],
    ) -> StoreResult<()> {
        let args_fit = if def.repeat == 0 {
            args.len() == def.args
        } else {
            args.len() >= def.args && (args.len() - def.args) % def.repeat == 0
        };
        if keys.len() != def.keys || !args_fit {
            return Err(StoreError::reply(
                "script wrapper",
                format!(
                    "{} called with {} keys / {} args, header declares {} / {}",
                    def.name,
                    keys.len(),
                    args.len(),
                    def.keys,
                    def.args
                ),
            ));
        }
        Ok(())
    }

    /// Runs script `def` with `keys` and `args` on `conn` (checked against
    /// its header): `FCALL` of the library's function; when that node lacks
    /// the function, the library is loaded there and the call made once
    /// more; on a Redis without Functions, `EVALSHA` (which loads the script
    /// on `NOSCRIPT`) from then on.
    pub(super) async fn run(
        &self,
        conn: &mut RedisConn,
        def: &'static ScriptDef,
        keys: &[&str],
        args: &[Vec<u8>],
    ) -> StoreResult<Value> {
        Store::check_inputs(def, keys, args)?;
        if self.scripts.runner() != Runner::Evalsha {
            let mut fcall = redis::cmd("FCALL");
            fcall.arg(self.scripts.function(def)?).arg(keys.len());
            for key in keys {
                fcall.arg(*key);
            }
            for arg in args {
                fcall.arg(arg.as_slice());
            }
            match fcall.query_async::<Value>(conn).await {
                Err(err) if function_missing(&err) => {
                    tracing::info!(
                        library = %self.scripts.library().name,
                        "a Redis node lacks the Lua library (restarted, flushed or a new master): loading it there"
                    );
                    self.load_library(conn, keys.first().copied()).await?;
                    return Ok(fcall.query_async::<Value>(conn).await?);
                }
                Err(err) if functions_unsupported(&err) => {
                    if self.scripts.set_runner(Runner::Evalsha) {
                        tracing::info!(
                            "Redis has no Functions (before 7.0): scripts run by EVALSHA"
                        );
                    }
                }
                other => return Ok(other?),
            }
        }
        let mut invocation = self.scripts.get(def)?.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(arg.as_slice());
        }
        Ok(invocation.invoke_async::<Value>(conn).await?)
    }

    /// Runs script `def` with `keys` and `args`, decoding its reply.
    pub(super) async fn invoke<T: FromRedisValue>(
        &self,
        def: &'static ScriptDef,
        keys: &[&str],
        args: &[Vec<u8>],
    ) -> StoreResult<T> {
        let mut conn = self.conn.clone();
        decode(def, self.run(&mut conn, def, keys, args).await?)
    }

    /// [`Store::invoke`] for a write the API or CLI acknowledges (or an
    /// outcome being recorded): with `redis.ack_replicas` > 0, the script
    /// runs on the connection kept for such writes and is followed there by
    /// `WAIT` on the master holding `keys[0]`; fewer replicas in time is
    /// [`StoreError::NotReplicated`] (the write may have landed: retrying
    /// it is idempotent).
    pub(super) async fn invoke_acked<T: FromRedisValue>(
        &self,
        def: &'static ScriptDef,
        keys: &[&str],
        args: &[Vec<u8>],
    ) -> StoreResult<T> {
        let Some(acked) = &self.acked else {
            return self.invoke(def, keys, args).await;
        };
        let mut conn = acked.clone();
        let value: T = decode(def, self.run(&mut conn, def, keys, args).await?)?;
        let wanted = self.settings.ack_replicas;
        let mut wait = redis::cmd("WAIT");
        wait.arg(wanted).arg(self.settings.ack_timeout_ms);
        let acknowledged: i64 = match &mut conn {
            RedisConn::Single(single) => wait.query_async(single).await?,
            RedisConn::Cluster(cluster) => {
                let key = keys.first().copied().unwrap_or_default();
                redis::from_redis_value(&cluster.on_master_of(key, &wait).await?)?
            }
        };
        if acknowledged < i64::from(wanted) {
            metrics::counter!("hookq_writes_not_replicated_total").increment(1);
            return Err(StoreError::NotReplicated {
                acknowledged,
                wanted,
            });
        }
        Ok(value)
    }
}
