//! `hookq serve`: wires config → store → carrier, wake subscriber, worker pool
//! and API, and owns their shutdown.
//!
//! One root [`CancellationToken`] stops everything: the API stops accepting,
//! the carrier and claim loops stop, and attempts in flight get
//! `delivery.shutdown_grace` to finish (the rest are recovered by their
//! leases). Tests start a [`Daemon`] in-process on `127.0.0.1:0`.

use crate::backoff::Backoff;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::{self, AppState};
use crate::carrier::Carrier;
use crate::clock::RedisClock;
use crate::config::Config;
use crate::delivery::Deliverer;
use crate::fleet::Fleet;
use crate::hosts::breaker::Breaker;
use crate::hosts::lanes::Lanes;
use crate::hosts::HostRules;
use crate::store::{Store, StoreError};
use crate::wake::{self, Signals};
use crate::worker::{Cues, WorkerPool};

/// A running daemon.
pub struct Daemon {
    addr: SocketAddr,
    token: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

/// The process-wide Prometheus recorder (the `metrics` facade is global by
/// design; installed once, shared by every daemon in the process).
fn metrics_handle() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    static HANDLE: OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
        OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = metrics_exporter_prometheus::PrometheusBuilder::new()
                .set_buckets(&[
                    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0,
                ])
                .ok()?;
            let handle = builder.install_recorder().ok()?;
            zero_series();
            Some(handle)
        })
        .clone()
}

/// Puts the counters of rare events and the lag gauges on `/metrics` at 0
/// from the start: a series that appears only with its first event cannot
/// be told from a missing one, and `increase()` does not count that first
/// event. The gauges' loops set them later (the worker pool's first
/// eviction round comes a while after the API answers).
fn zero_series() {
    for name in [
        "hookq_promoted_total",
        "hookq_leases_expired_total",
        "hookq_deferred_total",
    ] {
        metrics::counter!(name).increment(0);
    }
    for component in ["api", "carrier", "fleet", "firer", "worker"] {
        metrics::counter!("hookq_redis_errors_total", "component" => component).increment(0);
    }
    for name in [
        "hookq_oldest_ready_lag_seconds",
        "hookq_oldest_waiting_lag_seconds",
    ] {
        metrics::gauge!(name).set(0.0);
    }
}

/// Connects to Redis, retrying with backoff until it answers or `token` is
/// cancelled.
async fn connect_store(config: &Config, token: &CancellationToken) -> anyhow::Result<Store> {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        match Store::connect(config).await {
            // The ledger is seeded before the API serves a create, so no
            // job of this daemon is counted both by its create and by the
            // seed.
            Ok(store) => match store.seed_ledgers().await {
                Ok(0) => return Ok(store),
                Ok(n) => {
                    tracing::info!(
                        jobs = n,
                        "tenants' ledger seeded with the jobs live before it"
                    );
                    return Ok(store);
                }
                Err(err) => {
                    tracing::warn!(cause = %err, retry_in = ?backoff.current(), "cannot seed the tenants' ledger yet");
                }
            },
            Err(err @ (StoreError::Schema { .. } | StoreError::Partitions { .. })) => {
                return Err(err.into())
            }
            Err(err) => {
                tracing::warn!(cause = %err, retry_in = ?backoff.current(), "cannot connect to Redis yet");
            }
        }
        tokio::select! {
            _ = token.cancelled() => anyhow::bail!("stopped before Redis was reachable"),
            _ = tokio::time::sleep(backoff.step()) => {}
        }
    }
}

/// Binds the API's listener to `api.listen`.
async fn bind_api(config: &Config) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(&config.api.listen)
        .await
        .with_context(|| {
            format!(
                "config key `api.listen`: cannot listen on {}",
                config.api.listen
            )
        })
}

/// A client per Redis node the wake subscriber listens on: `redis.url`, or
/// every seed of `redis.cluster_nodes`.
fn wake_clients(config: &Config) -> anyhow::Result<Vec<redis::Client>> {
    let wake_urls = if config.redis.cluster_nodes.is_empty() {
        vec![config.redis.url.clone()]
    } else {
        config.redis.cluster_nodes.clone()
    };
    wake_urls
        .iter()
        .map(|url| {
            redis::Client::open(url.as_str()).with_context(|| {
                format!(
                    "config key `redis.url`/`redis.cluster_nodes`: cannot use `{}`",
                    crate::config::redact_url(url)
                )
            })
        })
        .collect()
}

/// Loads the scripts, retrying with backoff until they load; breaks when
/// `token` is cancelled first.
async fn load_scripts(store: &Store, token: &CancellationToken) -> ControlFlow<()> {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    while let Err(err) = store.load_scripts().await {
        tracing::warn!(cause = %err, "cannot load scripts yet");
        tokio::select! {
            _ = token.cancelled() => return ControlFlow::Break(()),
            _ = tokio::time::sleep(backoff.step()) => {}
        }
    }
    ControlFlow::Continue(())
}

/// Deletes the Lua libraries of hookq versions and configs that no
/// connected daemon runs (see `store::libraries`); a failure (`CLIENT
/// LIST` refused by the ACL, say) leaves them, with a warning.
async fn delete_stale_libraries(store: &Store) {
    match store.delete_stale_libraries().await {
        Ok(deleted) if deleted.is_empty() => {}
        Ok(deleted) => tracing::info!(
            libraries = %deleted.join(", "),
            "deleted the Lua libraries no connected daemon uses (earlier versions or configs)"
        ),
        Err(err) => tracing::warn!(
            cause = %err,
            "cannot look for Lua libraries of earlier versions; any there are left (FUNCTION LIST shows them)"
        ),
    }
}

/// Indexes the dead letters of a hookq from before the dead-letter index
/// (once, beside the traffic: a few calls per partition when there are
/// none), unless `token` is cancelled first.
async fn index_dead_letters(store: Store, token: CancellationToken) {
    tokio::select! {
        _ = token.cancelled() => {}
        done = store.index_dead_letters() => match done {
            Ok(0) => {}
            Ok(n) => tracing::info!(entries = n, "dead letters indexed"),
            Err(err) => tracing::warn!(cause = %err, "cannot index the dead letters yet; the next start tries again"),
        },
    }
}

/// Joins the fleet: the first beat deals the partitions before anything
/// runs (a daemon that cannot beat yet starts with all of them).
async fn join_fleet(store: &Store, signals: &Signals) -> Arc<Fleet> {
    let fleet = Fleet::new(store.keys().partitions());
    if let Err(err) = fleet.beat(store, signals).await {
        tracing::warn!(cause = %err, "cannot join the fleet yet; carrying every partition meanwhile");
    }
    fleet
}

/// The wake channels: the common one and one per partition.
fn wake_channels(store: &Store) -> wake::Channels {
    wake::Channels {
        common: store.keys().wake_channel(),
        partitions: (0..store.keys().partitions())
            .map(|p| store.keys().partition_wake_channel(p))
            .collect(),
    }
}

/// What the engine (wake subscriber, fleet, carrier, firer, sweeps, breaker
/// and workers) runs on once the scripts are loaded.
struct Engine {
    config: Arc<Config>,
    store: Store,
    deliverer: Deliverer,
    signals: Arc<Signals>,
    clock: RedisClock,
    lanes: Arc<Lanes>,
    breaker: Arc<Breaker>,
    wake_clients: Vec<redis::Client>,
    /// Set once the scripts are loaded (the API answers not-ready before).
    scripts_loaded: Arc<AtomicBool>,
}

impl Engine {
    /// Loads the scripts, then runs every subsystem until `token` is
    /// cancelled and they have all finished.
    async fn run(self, token: CancellationToken) {
        if load_scripts(&self.store, &token).await.is_break() {
            return;
        }
        self.scripts_loaded.store(true, Ordering::Release);
        delete_stale_libraries(&self.store).await;
        self.run_subsystems(token).await;
    }

    /// Starts every subsystem and waits for them all to finish.
    async fn run_subsystems(self, token: CancellationToken) {
        let Engine {
            config,
            store,
            deliverer,
            signals,
            clock,
            lanes,
            breaker,
            wake_clients,
            ..
        } = self;
        let indexing = tokio::spawn(index_dead_letters(store.clone(), token.child_token()));
        if let Ok(now) = store.redis_time_ms().await {
            clock.observe(now);
        }
        let fleet = join_fleet(&store, &signals).await;
        let fleet_task = tokio::spawn(fleet.clone().run(
            store.clone(),
            signals.clone(),
            token.child_token(),
        ));
        let subscriber = tokio::spawn(wake::run_subscriber(
            wake_clients,
            wake_channels(&store),
            fleet.watch(),
            signals.clone(),
            token.child_token(),
        ));
        let sweep = {
            let fleet = fleet.clone();
            tokio::spawn(
                store
                    .clone()
                    .run_placement_sweep(move |p| fleet.owns(p), token.child_token()),
            )
        };
        let firer =
            crate::firer::Firer::new(store.clone(), signals.clone(), clock.clone(), fleet.clone());
        let firer = tokio::spawn(firer.run(token.child_token()));
        // The carrier's and the workers' calls made at one moment go to
        // Redis together.
        let store = store.batching();
        let carrier = Carrier::new(
            store.clone(),
            signals.clone(),
            clock.clone(),
            fleet.clone(),
            config.delivery.lease_margin,
        );
        let carrier = tokio::spawn(carrier.run(token.child_token()));
        let breaker_task = tokio::spawn(breaker.clone().run(token.child_token()));
        let cues = Cues { signals, fleet };
        let pool = WorkerPool::new(store, deliverer, config, cues, clock, lanes, breaker);
        let pool = tokio::spawn(pool.run(token.child_token()));
        let _ = tokio::join!(
            subscriber,
            carrier,
            pool,
            breaker_task,
            fleet_task,
            indexing,
            sweep,
            firer
        );
    }
}

/// The API server, bound and routed.
struct Api {
    listener: tokio::net::TcpListener,
    app: axum::Router,
    addr: SocketAddr,
    config: Arc<Config>,
}

impl Api {
    /// Serves until `token` is cancelled or the server fails, then stops the
    /// engine, waits for it, and flushes the spans still queued.
    async fn serve_then_stop(
        self,
        token: CancellationToken,
        engine: JoinHandle<()>,
        telemetry: Arc<crate::telemetry::Telemetry>,
    ) -> anyhow::Result<()> {
        let api_token = token.child_token();
        let addr = self.addr;
        tracing::info!(%addr, "hookq serving");
        let served = api::serve(self.listener, self.app, &self.config.api, api_token).await;
        token.cancel();
        let _ = engine.await;
        // The spans still queued go out, for at most the export
        // timeout (a blocking call: off the runtime's threads).
        let flush = tokio::task::spawn_blocking(move || telemetry.shutdown());
        let _ = tokio::time::timeout(Duration::from_secs(3), flush).await;
        served.context("API server failed")
    }
}

impl Daemon {
    /// Binds the API, connects to Redis and starts every subsystem.
    pub async fn start(config: Config) -> anyhow::Result<Daemon> {
        let config = Arc::new(config);
        let token = CancellationToken::new();
        let listener = bind_api(&config).await?;
        let addr = listener.local_addr()?;
        if config.api.is_open() {
            tracing::warn!("api.tokens and api.keys are empty: the API accepts requests without authentication");
        }
        let store = connect_store(&config, &token).await?;
        let telemetry = Arc::new(crate::telemetry::Telemetry::start(&config)?);
        let deliverer = Deliverer::new(&config)?.with_telemetry(telemetry.clone());
        let signals = Signals::new(config.redis.partitions);
        let clock = RedisClock::new();
        let scripts_loaded = Arc::new(AtomicBool::new(false));
        let lanes = Arc::new(Lanes::new(
            HostRules::new(&config),
            config.delivery.workers * crate::worker::HELD_PER_WORKER,
        ));
        let alerts = crate::alerts::Alerts::start(&config, clock.clone(), token.clone())?;
        let breaker = Arc::new(Breaker::new(
            store.clone(),
            clock.clone(),
            config.clone(),
            signals.clone(),
            alerts,
        ));
        let wake_clients = wake_clients(&config)?;

        let app = api::router(AppState {
            store: store.clone(),
            config: config.clone(),
            scripts_loaded: scripts_loaded.clone(),
            metrics: metrics_handle(),
            lanes: lanes.clone(),
            breaker: breaker.clone(),
            telemetry: telemetry.clone(),
            quotas: Default::default(),
        });

        // The engine (wake subscriber, carrier, workers) starts once the
        // scripts are loaded; the API serves from the start, answering
        // not-ready (and 503 on Redis errors) meanwhile.
        let engine = Engine {
            config: config.clone(),
            store,
            deliverer,
            signals,
            clock,
            lanes,
            breaker,
            wake_clients,
            scripts_loaded,
        };
        let engine = tokio::spawn(engine.run(token.clone()));
        let api = Api {
            listener,
            app,
            addr,
            config,
        };
        let task = tokio::spawn(api.serve_then_stop(token.clone(), engine, telemetry));
        Ok(Daemon { addr, token, task })
    }

    /// The API's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The API's base URL, e.g. `http://127.0.0.1:8080`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A token that stops the daemon when cancelled.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Stops gracefully and waits until everything has finished.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.token.cancel();
        self.wait().await
    }

    /// Waits until the daemon stops (after its token is cancelled).
    pub async fn wait(self) -> anyhow::Result<()> {
        self.task.await.context("daemon task panicked")?
    }
}

/// Runs the daemon until SIGINT or SIGTERM; a second signal exits at once.
pub(crate) async fn serve(config: Config) -> anyhow::Result<()> {
    // Listening starts before the daemon does and lasts: a signal that
    // arrives while the first is being handled still counts as the second.
    let mut signals = StopSignals::listen()?;
    let daemon = Daemon::start(config).await?;
    let token = daemon.token();
    tokio::spawn(async move {
        signals.next().await;
        tracing::info!("stopping: no new work is claimed; attempts in flight may finish");
        token.cancel();
        signals.next().await;
        tracing::warn!("second signal: exiting now; unfinished attempts are left to their leases");
        std::process::exit(130);
    });
    daemon.wait().await
}

/// SIGINT and SIGTERM, each listened to from creation on, so that none is
/// missed between two waits.
struct StopSignals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn listen() -> anyhow::Result<StopSignals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(StopSignals {
                interrupt: signal(SignalKind::interrupt()).context("listening for SIGINT")?,
                terminate: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
            })
        }
        #[cfg(not(unix))]
        Ok(StopSignals {})
    }

    /// The next SIGINT or SIGTERM.
    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
