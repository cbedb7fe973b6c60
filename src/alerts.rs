//! Operational events (SPEC §11.1): `host.opened`, `host.closed`,
//! `host.paused` and `job.dead_lettered`, POSTed to `alerts.url` in batches
//! (a JSON array of `{"type", "at", "data"}` items), signed with
//! `alerts.signing_secret` itself (Standard Webhooks; never a secret derived
//! per origin, whatever `delivery.signing_mode` says) and sent through the
//! same SSRF guard as deliveries.
//!
//! Losing an alert never blocks delivery: events go into a bounded queue
//! (dropped, and counted, when it is full); one task sends a batch at a time
//! (up to [`BATCH_MAX`] events gathered for up to [`BATCH_WAIT`]), retried on
//! its own short ladder ([`LADDER`]) and then given up with a warning.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::clock::RedisClock;
use crate::config::Config;
use crate::delivery::{Deliverer, Outcome};
use crate::job::{format_ms, JobSpec};

/// Events held while the sender is busy or the endpoint is down.
pub(crate) const QUEUE: usize = 10_000;
/// Most events in one POST.
pub(crate) const BATCH_MAX: usize = 100;
/// How long a batch gathers events after its first.
pub(crate) const BATCH_WAIT: Duration = Duration::from_millis(500);
/// Waits before the retries of one batch.
pub(crate) const LADDER: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(5),
    Duration::from_secs(30),
];
/// Timeout of one POST.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The sending end: cheap to clone; a no-op when alerts are off.
#[derive(Clone, Default)]
pub(crate) struct Alerts {
    tx: Option<mpsc::Sender<Value>>,
    clock: RedisClock,
}

impl Alerts {
    /// Starts the sender when `alerts.url` is set (call within a runtime).
    pub(crate) fn start(
        config: &Config,
        clock: RedisClock,
        token: CancellationToken,
    ) -> anyhow::Result<Alerts> {
        if config.alerts.url.is_empty() {
            return Ok(Alerts { tx: None, clock });
        }
        let mut own = config.clone();
        own.delivery.signing_secrets = if config.alerts.signing_secret.is_empty() {
            Vec::new()
        } else {
            vec![config.alerts.signing_secret.clone()]
        };
        // The alert receiver verifies with `alerts.signing_secret` itself:
        // never a secret derived per origin (`delivery.signing_mode`
        // concerns the jobs' receivers only).
        own.delivery.signing_mode = crate::config::SigningMode::Shared;
        own.delivery.dead_letter_statuses = Vec::new();
        let deliverer = Deliverer::new(&own)?;
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(send_loop(
            deliverer,
            config.alerts.url.clone(),
            clock.clone(),
            rx,
            token,
        ));
        Ok(Alerts {
            tx: Some(tx),
            clock,
        })
    }

    /// Queues an event of `kind` with `data`; never waits.
    pub(crate) fn emit(&self, kind: &str, data: Value) {
        let Some(tx) = &self.tx else {
            return;
        };
        let event = json!({"type": kind, "at": format_ms(self.clock.now_ms()), "data": data});
        if tx.try_send(event).is_err() {
            metrics::counter!("hookq_alerts_dropped_total").increment(1);
        }
    }
}

async fn send_loop(
    deliverer: Deliverer,
    url: String,
    clock: RedisClock,
    mut rx: mpsc::Receiver<Value>,
    token: CancellationToken,
) {
    loop {
        let first = tokio::select! {
            _ = token.cancelled() => return,
            event = rx.recv() => match event {
                Some(e) => e,
                None => return,
            },
        };
        let mut batch = vec![first];
        let gather = tokio::time::sleep(BATCH_WAIT);
        tokio::pin!(gather);
        while batch.len() < BATCH_MAX {
            tokio::select! {
                _ = &mut gather => break,
                event = rx.recv() => match event {
                    Some(e) => batch.push(e),
                    None => break,
                },
            }
        }
        send_batch(&deliverer, &url, &clock, batch, &token).await;
    }
}

/// Sends one batch, retrying on [`LADDER`]; the batch keeps its
/// `webhook-id` across retries so the receiver can deduplicate.
async fn send_batch(
    deliverer: &Deliverer,
    url: &str,
    clock: &RedisClock,
    batch: Vec<Value>,
    token: &CancellationToken,
) {
    let n = batch.len();
    let spec: JobSpec = match serde_json::from_value(json!({"url": url, "body": batch})) {
        Ok(spec) => spec,
        Err(err) => {
            tracing::warn!(cause = %err, "cannot build the alert batch");
            return;
        }
    };
    let id = format!("alert_{}", ulid::Ulid::new());
    for attempt in 1..=(LADDER.len() as u32 + 1) {
        let report = deliverer
            .attempt(&id, attempt, &spec, TIMEOUT, clock.now_ms())
            .await;
        if report.outcome == Outcome::Delivered {
            metrics::counter!("hookq_alerts_sent_total").increment(n as u64);
            return;
        }
        let error = report.record.last_error();
        let Some(wait) = LADDER.get(attempt as usize - 1) else {
            metrics::counter!("hookq_alerts_dropped_total").increment(n as u64);
            tracing::warn!(events = n, %error, "alerts could not be sent; given up");
            return;
        };
        tracing::info!(events = n, %error, retry_in = ?wait, "alerts not sent yet");
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(*wait) => {}
        }
    }
}
