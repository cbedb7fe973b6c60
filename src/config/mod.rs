//! Configuration: the TOML keys of SPEC §7, their defaults, the layering
//! (defaults → file → `HOOKQ_<SECTION>__<KEY>` environment → flags) and the
//! validation that names the offending key.
//!
//! Nothing here touches Redis or the network; `Config::load` is pure apart from
//! reading the file and the environment it is given.
//!
//! This file holds the sections, their defaults and their validation; `load`
//! holds the loading and layering, the value parsers and the masking of
//! secrets in messages.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;

mod host_pattern;
mod load;
pub(crate) mod secret;

pub(crate) use host_pattern::HostPattern;
pub(crate) use load::redact_url;
use load::{de_durations, de_size, humantime_serde};

/// The whole daemon configuration, one struct per TOML section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[redis]`: where jobs live.
    pub redis: RedisConfig,
    /// `[api]`: the HTTP ingest API.
    pub api: ApiConfig,
    /// `[delivery]`: how attempts are made.
    pub delivery: DeliveryConfig,
    /// `[retention]`: how long finished records stay.
    pub retention: RetentionConfig,
    /// `[log]`: logging.
    pub log: LogConfig,
    /// `[[hosts]]`: per-host overrides of the delivery limits, first match wins.
    pub hosts: Vec<HostRule>,
    /// `[breaker]`: the circuit breaker shared by every daemon.
    pub breaker: BreakerConfig,
    /// `[alerts]`: operational events sent to an operator's endpoint.
    pub alerts: AlertsConfig,
    /// `[telemetry]`: span export.
    pub telemetry: TelemetryConfig,
    /// `[[tenants]]`: named tenants' weights and quotas.
    pub tenants: Vec<crate::tenant::TenantEntry>,
    /// `[tenant_defaults]`: the settings of every tenant `[[tenants]]` does
    /// not list (and of what an entry leaves out).
    pub tenant_defaults: crate::tenant::TenantSettings,
}

/// `[telemetry]` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// OTLP/HTTP collector base URL (spans go to `<it>/v1/traces`); empty:
    /// no export.
    pub otlp_endpoint: String,
}

/// One `[[hosts]]` entry: limits for the hosts its `match` names.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostRule {
    /// `api.example.com`, `*.example.com` (subdomains only), optionally with
    /// `:port` and/or a `scheme://` prefix.
    #[serde(rename = "match")]
    pub pattern: String,
    /// Concurrent attempts to a matching host (default: `delivery.per_host_concurrency`).
    pub concurrency: Option<usize>,
    /// Requests per second to a matching host, 0 = unlimited (default:
    /// `delivery.per_host_rate`).
    pub rate: Option<f64>,
}

/// `[breaker]` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Consecutive failed attempts (connection errors, timeouts, 5xx, 429)
    /// that open a host; 0 turns the breaker off.
    pub failures: u32,
    /// How long a host stays open before one probe attempt; doubles per
    /// failed probe.
    #[serde(with = "humantime_serde")]
    pub open_for: Duration,
    /// Upper bound of the open period and of a `Retry-After` pause.
    #[serde(with = "humantime_serde")]
    pub max_open: Duration,
}

/// `[alerts]` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertsConfig {
    /// Endpoint receiving operational events; empty = off.
    pub url: String,
    /// Standard Webhooks secret (`whsec_...`) the events are signed with.
    pub signing_secret: String,
}

/// `[redis]` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// Connection URL of a single Redis (`redis://` or `rediss://`).
    pub url: String,
    /// Seed nodes of a Redis Cluster; non-empty switches to cluster mode.
    pub cluster_nodes: Vec<String>,
    /// Key prefix, so several deployments can share one Redis.
    pub namespace: String,
    /// Number of hash-tagged key groups the jobs are spread over.
    pub partitions: u16,
    /// Width of the timing wheel's finest buckets (the next levels are 64
    /// and 4096 times wider): jobs due at least this far ahead wait in the
    /// wheel's compact buckets rather than in the due set.
    #[serde(with = "humantime_serde")]
    pub wheel_bucket: Duration,
    /// Replicas every acknowledged write (create, PATCH, cancel, replay)
    /// and recorded outcome is `WAIT`ed for; 0: none.
    pub ack_replicas: u32,
    /// How long that `WAIT` may take (503 `not_replicated` past it).
    #[serde(with = "humantime_serde")]
    pub ack_timeout: Duration,
}

/// Default `redis.wheel_bucket`: 2^16 ms (about 65 s).
pub(crate) const DEFAULT_WHEEL_BUCKET: Duration = Duration::from_millis(65_536);

/// `[api]` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Address the HTTP API listens on.
    pub listen: String,
    /// Bearer tokens accepted on `/v1/*` with every scope; with `keys` also
    /// empty, no authentication.
    pub tokens: Vec<String>,
    /// `[[api.keys]]`: named keys, each with its scopes.
    pub keys: Vec<ApiKey>,
    /// Serve without tokens on an address other than loopback (refused at
    /// start-up otherwise).
    pub allow_unauthenticated: bool,
    /// Request body limit, also a job's body limit.
    #[serde(deserialize_with = "de_size")]
    pub max_body: u64,
    /// Request body limit of `POST /v1/jobs/batch`.
    #[serde(deserialize_with = "de_size")]
    pub max_batch_body: u64,
    /// How long a client may take to send a request's headers, in total.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// How long a client may take to send a request's body, in total from
    /// the end of its headers.
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
    /// How long a connection may stay without a request in progress (bytes
    /// trickled meanwhile do not count), or, with one, without traffic.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Open connections at most; a connection past it is closed at once.
    pub max_connections: usize,
    /// Serve `/metrics` without a token even when `tokens` or `keys` are
    /// set (for a scraper on a private network); otherwise it then needs a
    /// key with the `read` scope.
    pub metrics_public: bool,
}

/// What the secrets of `delivery.signing_secrets` sign with
/// (`delivery.signing_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SigningMode {
    /// Every receiver gets signatures of the configured secrets themselves.
    #[default]
    Shared,
    /// Each origin gets signatures of its own secret, derived from each
    /// configured (master) secret: a receiver's secret verifies only what
    /// was sent to its origin.
    PerOrigin,
}

/// What a key may do (SPEC §11.3). The scopes are independent: a key that
/// creates jobs and reads them back needs `read` and `write`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// GET routes (and the console's views).
    Read,
    /// Create, patch and cancel jobs.
    Write,
    /// Replay and delete dead letters, pause and resume hosts.
    Admin,
}

impl Scope {
    /// Every scope (what an `api.tokens` token may do).
    pub(crate) const ALL: [Scope; 3] = [Scope::Read, Scope::Write, Scope::Admin];

    /// The scope named `name` as configured (`read`, `write`, `admin`).
    pub(crate) fn parse(name: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The scope's name as configured.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Admin => "admin",
        }
    }
}

/// One `[[api.keys]]` entry: a named key stored as the SHA-256 of its token
/// (the token itself is never stored), with its scopes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    /// Who holds it (shown in logs, never secret).
    pub name: String,
    /// SHA-256 of the bearer token, 64 hex digits (`hookq new-key` prints
    /// a token and its digest).
    pub token_sha256: String,
    /// What it may do.
    pub scopes: Vec<Scope>,
    /// The tenant it acts in, alone (SPEC §15); none: any tenant.
    #[serde(default)]
    pub tenant: Option<String>,
}

impl ApiKey {
    /// Whether `name` may name a key: 1-64 characters of A-Z a-z 0-9 . _ -.
    pub(crate) fn name_is_valid(name: &str) -> bool {
        (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    }

    /// The token's digest as bytes (None unless 64 hex digits).
    pub(crate) fn digest(&self) -> Option<[u8; 32]> {
        let hex = self.token_sha256.as_bytes();
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in hex.chunks(2).enumerate() {
            let text = std::str::from_utf8(pair).ok()?;
            out[i] = u8::from_str_radix(text, 16).ok()?;
        }
        Some(out)
    }
}

impl ApiConfig {
    /// True when neither `tokens` nor `keys` is set: the API asks for no
    /// authentication.
    pub(crate) fn is_open(&self) -> bool {
        self.tokens.is_empty() && self.keys.is_empty()
    }
}

/// `[delivery]` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeliveryConfig {
    /// Concurrent attempts in this daemon.
    pub workers: usize,
    /// Default per-attempt timeout.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Upper bound of a job's own `timeout`.
    #[serde(with = "humantime_serde")]
    pub max_timeout: Duration,
    /// Added to the attempt timeout to form the lease (TTR) of an attempt.
    #[serde(with = "humantime_serde")]
    pub lease_margin: Duration,
    /// Default retry ladder: delay before attempt k+1 after failure k.
    #[serde(deserialize_with = "de_durations")]
    pub retry: Vec<Duration>,
    /// Fraction (0..=1) of each rung added at random; only ever adds time.
    pub jitter: f64,
    /// Concurrent attempts to one host (scheme, host, port).
    pub per_host_concurrency: usize,
    /// Requests per second to one host across all daemons, 0 = unlimited.
    pub per_host_rate: f64,
    /// Statuses that dead-letter a job at once.
    pub dead_letter_statuses: Vec<u16>,
    /// Turns the SSRF guard off.
    pub allow_private: bool,
    /// Private ranges deliveries may reach while the guard is on.
    pub allow_cidrs: Vec<String>,
    /// Standard Webhooks secrets (`whsec_...`); several for rotation.
    pub signing_secrets: Vec<String>,
    /// What receivers verify with: the secrets themselves (`shared`), or
    /// a secret per origin derived from each (`per_origin`).
    pub signing_mode: SigningMode,
    /// Jobs claimed from Redis in one round trip, at most.
    pub claim_batch: usize,
    /// How long before its due time a job may be claimed and held in the
    /// daemon (sent at its due time, never before), at most 50ms; 0 claims
    /// only jobs already due.
    #[serde(with = "humantime_serde")]
    pub claim_ahead: Duration,
    /// How long a graceful stop waits for in-flight attempts.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

/// `[retention]` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// How long delivered, dead and cancelled jobs are kept (delivered and
    /// cancelled ones as summaries unless `keep_bodies`).
    #[serde(with = "humantime_serde")]
    pub finished: Duration,
    /// Keep a delivered or cancelled job's whole record (spec, body, up to
    /// 20 attempt records) for `finished` instead of a summary.
    pub keep_bodies: bool,
    /// Cap on each dead-letter stream's length (the oldest go past it).
    pub dead_letters_max: u64,
}

/// `[log]` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: String,
    /// A tracing filter, e.g. `info` or `hookq=debug,info`.
    pub level: String,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: "redis://127.0.0.1:6379/0".into(),
            cluster_nodes: Vec::new(),
            namespace: "hookq".into(),
            partitions: 16,
            wheel_bucket: DEFAULT_WHEEL_BUCKET,
            ack_replicas: 0,
            ack_timeout: Duration::from_secs(1),
        }
    }
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: "127.0.0.1:8080".into(),
            tokens: Vec::new(),
            keys: Vec::new(),
            allow_unauthenticated: false,
            max_body: 1 << 20,
            max_batch_body: 16 << 20,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            metrics_public: false,
        }
    }
}

/// The default retry ladder of SPEC §4: 15s, 3m, 10m, 30m, 1h, 2h, 6h, 15h.
pub(crate) fn default_ladder() -> Vec<Duration> {
    [15, 180, 600, 1800, 3600, 7200, 21600, 54000]
        .into_iter()
        .map(Duration::from_secs)
        .collect()
}

/// The longest `delivery.claim_ahead` (SPEC §16): a job is handed to a
/// daemon at most this long before its due time.
pub const MAX_CLAIM_AHEAD: Duration = Duration::from_millis(50);

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            workers: 512,
            timeout: Duration::from_secs(10),
            max_timeout: Duration::from_secs(60),
            lease_margin: Duration::from_secs(20),
            retry: default_ladder(),
            jitter: 0.0,
            per_host_concurrency: 64,
            per_host_rate: 0.0,
            dead_letter_statuses: vec![410],
            allow_private: false,
            allow_cidrs: Vec::new(),
            signing_secrets: Vec::new(),
            signing_mode: SigningMode::Shared,
            claim_batch: 64,
            claim_ahead: MAX_CLAIM_AHEAD,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            finished: Duration::from_secs(24 * 3600),
            keep_bodies: false,
            dead_letters_max: 1_000_000,
        }
    }
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failures: 20,
            open_for: Duration::from_secs(30),
            max_open: Duration::from_secs(600),
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: "text".into(),
            level: "info".into(),
        }
    }
}

impl Config {
    /// Checks the invariants that types cannot express; the error names the key.
    /// The checks run in a fixed order (redis, api, delivery attempts, hosts,
    /// breaker, alerts, the rest of delivery, retention, telemetry, log), so
    /// of several mistakes the same one is always reported.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.redis.validate()?;
        self.api.validate()?;
        self.delivery.validate_attempts()?;
        validate_host_rules(&self.hosts)?;
        self.breaker.validate()?;
        self.alerts.validate()?;
        self.delivery.validate_statuses_cidrs_secrets_and_batch()?;
        if self.retention.finished < Duration::from_secs(1) {
            bail!("config key `retention.finished`: must be at least 1s");
        }
        self.telemetry.validate()?;
        if self.retention.dead_letters_max == 0 {
            bail!("config key `retention.dead_letters_max`: must be positive");
        }
        self.log.validate()?;
        crate::tenant::validate(&self.tenant_defaults, &self.tenants)
    }

    /// The weight and quotas of tenant `name`.
    pub(crate) fn tenant_settings(&self, name: &str) -> crate::tenant::TenantSettings {
        crate::tenant::settings_for(&self.tenant_defaults, &self.tenants, name)
    }

    /// The lease (TTR) of an attempt with the given timeout.
    pub(crate) fn lease_for(&self, timeout: Duration) -> Duration {
        timeout + self.delivery.lease_margin
    }
}

impl RedisConfig {
    /// Checks `[redis]`: the URL or cluster nodes, the namespace, the
    /// partitions, the replica acknowledgement and the wheel bucket.
    fn validate(&self) -> anyhow::Result<()> {
        if self.cluster_nodes.is_empty() {
            redis::parse_redis_url(&self.url).with_context(|| {
                format!(
                    "config key `redis.url`: `{}` is not a redis:// or rediss:// URL",
                    redact_url(&self.url)
                )
            })?;
        }
        for node in &self.cluster_nodes {
            if redis::parse_redis_url(node).is_none() {
                bail!(
                    "config key `redis.cluster_nodes`: `{}` is not a redis:// URL",
                    redact_url(node)
                );
            }
        }
        if self.namespace.is_empty()
            || self.namespace.len() > 64
            || !self
                .namespace
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            bail!("config key `redis.namespace`: must be 1-64 characters of [A-Za-z0-9._-]");
        }
        if !(1..=1024).contains(&self.partitions) {
            bail!("config key `redis.partitions`: must be between 1 and 1024");
        }
        if self.ack_replicas > 16 {
            bail!("config key `redis.ack_replicas`: must be between 0 and 16");
        }
        if !(Duration::from_millis(10)..=Duration::from_secs(30)).contains(&self.ack_timeout) {
            bail!("config key `redis.ack_timeout`: must be between 10ms and 30s");
        }
        if !(Duration::from_millis(16)..=Duration::from_secs(3600)).contains(&self.wheel_bucket) {
            bail!("config key `redis.wheel_bucket`: must be between 16ms and 1h");
        }
        Ok(())
    }
}

impl ApiConfig {
    /// Checks `[api]`: the listen address (and that an open API listens on
    /// loopback only, unless allowed), the keys, the tokens, the timeouts
    /// and the limits.
    fn validate(&self) -> anyhow::Result<()> {
        let listen = self.listen.parse::<SocketAddr>().with_context(|| {
            format!(
                "config key `api.listen`: `{}` is not an address like 127.0.0.1:8080",
                self.listen
            )
        })?;
        if self.is_open() && !listen.ip().is_loopback() && !self.allow_unauthenticated {
            bail!(
                "config key `api.tokens`: empty (and no `api.keys`) while `api.listen` ({}) is not \
                 a loopback address: anyone who reaches it could create, cancel and replay jobs; \
                 set `api.tokens` or `[[api.keys]]`, or `api.allow_unauthenticated = true` if the \
                 network itself is trusted",
                self.listen
            );
        }
        self.validate_keys()?;
        if self.tokens.iter().any(|t| t.len() < 8) {
            bail!("config key `api.tokens`: every token must be at least 8 characters");
        }
        for (key, value) in [
            ("header_timeout", self.header_timeout),
            ("body_timeout", self.body_timeout),
            ("idle_timeout", self.idle_timeout),
        ] {
            if !(Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&value) {
                bail!("config key `api.{key}`: must be between 100ms and 1h");
            }
        }
        if !(1..=1_000_000).contains(&self.max_connections) {
            bail!("config key `api.max_connections`: must be between 1 and 1000000");
        }
        if self.max_body == 0 || self.max_batch_body == 0 {
            bail!("config keys `api.max_body` / `api.max_batch_body` must be positive");
        }
        Ok(())
    }

    /// Checks each `[[api.keys]]` entry in order: a valid, unique name, a
    /// SHA-256 digest and at least one scope.
    fn validate_keys(&self) -> anyhow::Result<()> {
        let mut names = std::collections::HashSet::new();
        for (i, key) in self.keys.iter().enumerate() {
            if !ApiKey::name_is_valid(&key.name) {
                bail!("config key `api.keys[{i}].name`: 1-64 characters of A-Z a-z 0-9 . _ -");
            }
            if !names.insert(key.name.as_str()) {
                bail!(
                    "config key `api.keys[{i}].name`: `{}` names two keys",
                    key.name
                );
            }
            if key.digest().is_none() {
                bail!(
                    "config key `api.keys[{i}].token_sha256`: must be the SHA-256 of the token \
                     as 64 hex digits (`hookq new-key` prints one)"
                );
            }
            if key.scopes.is_empty() {
                bail!("config key `api.keys[{i}].scopes`: give at least one of read, write, admin");
            }
            if let Some(tenant) = &key.tenant {
                if !crate::tenant::is_tenant_name(tenant) {
                    bail!(
                        "config key `api.keys[{i}].tenant`: 1-{} characters of a-z 0-9 -, starting with a letter or digit",
                        crate::tenant::TENANT_MAX
                    );
                }
            }
        }
        Ok(())
    }
}

impl DeliveryConfig {
    /// Checks how `[delivery]` makes and paces attempts: workers, timeouts,
    /// the lease margin, the retry ladder, jitter and the per-host limits.
    fn validate_attempts(&self) -> anyhow::Result<()> {
        if self.workers == 0 {
            bail!("config key `delivery.workers`: must be at least 1");
        }
        if self.timeout.is_zero() {
            bail!("config key `delivery.timeout`: must be positive");
        }
        if self.max_timeout < self.timeout {
            bail!("config key `delivery.max_timeout`: must be at least `delivery.timeout`");
        }
        if self.lease_margin < Duration::from_millis(100) {
            bail!("config key `delivery.lease_margin`: must be at least 100ms so a lease outlives its attempt");
        }
        if self.retry.len() > 64 {
            bail!("config key `delivery.retry`: at most 64 rungs");
        }
        if self.retry.iter().any(Duration::is_zero) {
            bail!("config key `delivery.retry`: every rung must be positive");
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            bail!("config key `delivery.jitter`: must be between 0 and 1");
        }
        if self.per_host_concurrency == 0 {
            bail!("config key `delivery.per_host_concurrency`: must be at least 1");
        }
        if !(self.per_host_rate.is_finite() && self.per_host_rate >= 0.0) {
            bail!("config key `delivery.per_host_rate`: must be a number of requests per second, 0 or more");
        }
        Ok(())
    }

    /// Checks the rest of `[delivery]`: `dead_letter_statuses`,
    /// `allow_cidrs`, `signing_secrets` and `claim_batch`.
    fn validate_statuses_cidrs_secrets_and_batch(&self) -> anyhow::Result<()> {
        if self
            .dead_letter_statuses
            .iter()
            .any(|s| !(100..=599).contains(s))
        {
            bail!("config key `delivery.dead_letter_statuses`: statuses must be 100..=599");
        }
        for cidr in &self.allow_cidrs {
            cidr.parse::<ipnet::IpNet>().with_context(|| {
                format!("config key `delivery.allow_cidrs`: `{cidr}` is not a CIDR like 10.0.0.0/8")
            })?;
        }
        for (i, secret) in self.signing_secrets.iter().enumerate() {
            secret::secret_key(secret)
                .with_context(|| format!("config key `delivery.signing_secrets[{i}]`"))?;
        }
        if !(1..=1000).contains(&self.claim_batch) {
            bail!("config key `delivery.claim_batch`: must be between 1 and 1000");
        }
        if self.claim_ahead > MAX_CLAIM_AHEAD {
            bail!("config key `delivery.claim_ahead`: at most 50ms (a cancel or PATCH earlier than that always wins)");
        }
        Ok(())
    }
}

/// Checks each `[[hosts]]` rule in order: its `match` pattern, and that a
/// concurrency it sets is at least 1 and a rate a number, 0 or more.
fn validate_host_rules(rules: &[HostRule]) -> anyhow::Result<()> {
    for (i, rule) in rules.iter().enumerate() {
        HostPattern::parse(&rule.pattern)
            .map_err(|e| anyhow::anyhow!("config key `hosts[{i}].match`: {e}"))?;
        if rule.concurrency == Some(0) {
            bail!("config key `hosts[{i}].concurrency`: must be at least 1");
        }
        if let Some(rate) = rule.rate {
            if !(rate.is_finite() && rate >= 0.0) {
                bail!("config key `hosts[{i}].rate`: must be a number of requests per second, 0 or more");
            }
        }
    }
    Ok(())
}

impl BreakerConfig {
    /// Checks `[breaker]`: `open_for` at least 10ms, `max_open` no shorter.
    fn validate(&self) -> anyhow::Result<()> {
        if self.open_for < Duration::from_millis(10) {
            bail!("config key `breaker.open_for`: must be at least 10ms");
        }
        if self.max_open < self.open_for {
            bail!("config key `breaker.max_open`: must be at least `breaker.open_for`");
        }
        Ok(())
    }
}

impl AlertsConfig {
    /// Checks `[alerts]`: `url`, when set, is an http(s) URL, and
    /// `signing_secret`, when set, is a signing secret.
    fn validate(&self) -> anyhow::Result<()> {
        if !self.url.is_empty() {
            let url = url::Url::parse(&self.url).map_err(|e| {
                anyhow::anyhow!(
                    "config key `alerts.url`: `{}` is not a URL: {e}",
                    redact_url(&self.url)
                )
            })?;
            if !matches!(url.scheme(), "http" | "https") {
                bail!("config key `alerts.url`: must be an http:// or https:// URL");
            }
        }
        if !self.signing_secret.is_empty() {
            secret::secret_key(&self.signing_secret)
                .context("config key `alerts.signing_secret`")?;
        }
        Ok(())
    }
}

impl TelemetryConfig {
    /// Checks `[telemetry]`: `otlp_endpoint`, when set, is an http(s) URL
    /// with a host.
    fn validate(&self) -> anyhow::Result<()> {
        let otlp = &self.otlp_endpoint;
        if !otlp.is_empty() {
            let ok = url::Url::parse(otlp)
                .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some());
            if !ok {
                bail!(
                    "config key `telemetry.otlp_endpoint`: `{}` is not an http(s) URL like http://collector:4318",
                    redact_url(otlp)
                );
            }
        }
        Ok(())
    }
}

impl LogConfig {
    /// Checks `[log]`: the format is `text` or `json`, the level a filter.
    fn validate(&self) -> anyhow::Result<()> {
        if !matches!(self.format.as_str(), "text" | "json") {
            bail!("config key `log.format`: must be `text` or `json`");
        }
        tracing_subscriber::EnvFilter::try_new(&self.level).with_context(|| {
            format!(
                "config key `log.level`: `{}` is not a log filter",
                self.level
            )
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn no_tokens_on_a_public_address_needs_an_explicit_yes() {
        let load = |pairs: &[(&str, &str)]| {
            Config::load(
                None,
                pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())),
            )
        };
        let err = load(&[("HOOKQ_API__LISTEN", "0.0.0.0:8080")]).expect_err("refused");
        assert!(
            format!("{err:#}").contains("api.allow_unauthenticated"),
            "{err:#}"
        );
        assert!(load(&[("HOOKQ_API__LISTEN", "127.0.0.1:8080")]).is_ok());
        assert!(load(&[
            ("HOOKQ_API__LISTEN", "0.0.0.0:8080"),
            ("HOOKQ_API__ALLOW_UNAUTHENTICATED", "true")
        ])
        .is_ok());
        assert!(load(&[
            ("HOOKQ_API__LISTEN", "0.0.0.0:8080"),
            ("HOOKQ_API__TOKENS", "[\"a-long-enough-token\"]")
        ])
        .is_ok());
    }

    #[test]
    fn api_keys_are_checked_naming_the_entry() {
        let digest = "9710efa87f3a003badd610a0cf71b37bf4973cbbb531fc6a66a561add632ab2e";
        let load = |keys: String| Config::load(None, [("HOOKQ_API__KEYS".to_string(), keys)]);
        let entry = |name: &str, digest: &str, scopes: &str| {
            format!(r#"{{name = "{name}", token_sha256 = "{digest}", scopes = {scopes}}}"#)
        };
        let ok = load(format!("[{}]", entry("support", digest, r#"["read"]"#))).expect("valid");
        assert_eq!(ok.api.keys[0].scopes, [Scope::Read]);
        assert!(!ok.api.is_open());
        // A key alone makes a public address fine.
        assert!(Config::load(
            None,
            [
                (
                    "HOOKQ_API__KEYS".to_string(),
                    format!("[{}]", entry("a", digest, r#"["admin"]"#))
                ),
                ("HOOKQ_API__LISTEN".to_string(), "0.0.0.0:8080".to_string()),
            ]
        )
        .is_ok());
        for (keys, named) in [
            (
                format!("[{}]", entry("a b", digest, r#"["read"]"#)),
                "api.keys[0].name",
            ),
            (
                format!("[{}]", entry("a", &digest[1..], r#"["read"]"#)),
                "api.keys[0].token_sha256",
            ),
            (
                format!("[{}]", entry("a", &digest.replace('9', "g"), r#"["read"]"#)),
                "api.keys[0].token_sha256",
            ),
            (
                format!("[{}]", entry("a", digest, "[]")),
                "api.keys[0].scopes",
            ),
            (
                format!(
                    "[{}, {}]",
                    entry("a", digest, r#"["read"]"#),
                    entry("a", digest, r#"["write"]"#)
                ),
                "api.keys[1].name",
            ),
            (
                format!("[{}]", entry("a", digest, r#"["root"]"#)),
                "api.keys",
            ),
        ] {
            let err = format!("{:#}", load(keys.clone()).expect_err(&keys));
            assert!(err.contains(named), "{keys}: {err}");
        }
    }

    #[test]
    fn the_signing_mode_is_shared_or_per_origin() {
        let load = |mode: &str| {
            Config::load(
                None,
                [("HOOKQ_DELIVERY__SIGNING_MODE".to_string(), mode.to_string())],
            )
        };
        assert_eq!(Config::default().delivery.signing_mode, SigningMode::Shared);
        assert_eq!(
            load("per_origin").expect("valid").delivery.signing_mode,
            SigningMode::PerOrigin
        );
        let err = format!("{:#}", load("per-host").expect_err("unknown"));
        assert!(err.contains("delivery.signing_mode"), "{err}");
    }

    #[test]
    fn api_limits_are_checked_naming_the_key() {
        let load = |key: &str, value: &str| {
            Config::load(None, [(format!("HOOKQ_API__{key}"), value.to_string())])
        };
        assert_eq!(Config::default().api.max_connections, 10_000);
        assert!(load("IDLE_TIMEOUT", "\"2m\"").is_ok());
        for (key, value, named) in [
            ("HEADER_TIMEOUT", "\"10ms\"", "api.header_timeout"),
            ("BODY_TIMEOUT", "\"2h\"", "api.body_timeout"),
            ("IDLE_TIMEOUT", "\"0s\"", "api.idle_timeout"),
            ("MAX_CONNECTIONS", "0", "api.max_connections"),
        ] {
            let err = format!("{:#}", load(key, value).expect_err(key));
            assert!(err.contains(named), "{err}");
        }
    }

    #[test]
    fn the_otlp_endpoint_is_an_http_url_or_empty() {
        let load = |url: &str| {
            Config::load(
                None,
                [(
                    "HOOKQ_TELEMETRY__OTLP_ENDPOINT".to_string(),
                    url.to_string(),
                )],
            )
        };
        assert!(load("").is_ok());
        assert!(load("http://127.0.0.1:4318").is_ok());
        for bad in ["collector:4318", "ftp://c/", "http://"] {
            let err = format!("{:#}", load(bad).expect_err(bad));
            assert!(err.contains("telemetry.otlp_endpoint"), "{err}");
        }
    }

    pub(super) fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_valid_and_match_spec() {
        let c = Config::load(None, env(&[])).expect("defaults load");
        assert_eq!(c.redis.partitions, 16);
        assert_eq!(c.delivery.retry.len(), 8);
        assert_eq!(c.api.max_body, 1 << 20);
        assert_eq!(c.delivery.dead_letter_statuses, vec![410]);
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("HOOKQ_DELIVERY__JITTER", "2.0", "delivery.jitter"),
            ("HOOKQ_REDIS__WHEEL_BUCKET", "1ms", "redis.wheel_bucket"),
            ("HOOKQ_DELIVERY__RETRY", r#"["soon"]"#, "delivery.retry"),
            ("HOOKQ_DELIVERY__NOPE", "1", "nope"),
            ("HOOKQ_REDIS__PARTITIONS", "0", "redis.partitions"),
            ("HOOKQ_API__LISTEN", "nowhere", "api.listen"),
            ("HOOKQ_API__MAX_BODY", "1 parsec", "api.max_body"),
            ("HOOKQ_REDIS__NAMESPACE", "a{b}", "redis.namespace"),
            ("HOOKQ_DELIVERY__TIMEOUT", "\"later\"", "delivery.timeout"),
            ("HOOKQ_LOG__FORMAT", "xml", "log.format"),
            (
                "HOOKQ_DELIVERY__PER_HOST_RATE",
                "-1",
                "delivery.per_host_rate",
            ),
            ("HOOKQ_BREAKER__OPEN_FOR", "\"0s\"", "breaker.open_for"),
            (
                "HOOKQ_DELIVERY__CLAIM_AHEAD",
                "\"51ms\"",
                "delivery.claim_ahead",
            ),
            ("HOOKQ_BREAKER__MAX_OPEN", "\"1s\"", "breaker.max_open"),
            ("HOOKQ_ALERTS__URL", "ftp://x", "alerts.url"),
            (
                "HOOKQ_ALERTS__SIGNING_SECRET",
                "nope",
                "alerts.signing_secret",
            ),
        ];
        for (key, value, named) in cases {
            let err = Config::load(None, env(&[(key, value)])).expect_err(key);
            let text = format!("{err:#}");
            assert!(
                text.contains(named),
                "{key}={value}: `{text}` should name {named}"
            );
        }
    }

    #[test]
    fn bad_host_rules_name_their_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cases = [
            ("match = \"a.example\"\nconcurency = 2", "concurency"),
            ("match = \"a.*.example\"", "hosts[0].match"),
            ("match = \"a.example\"\nrate = -1.0", "hosts[0].rate"),
            (
                "match = \"a.example\"\nconcurrency = 0",
                "hosts[0].concurrency",
            ),
            ("concurrency = 2", "match"),
        ];
        for (i, (rule, named)) in cases.iter().enumerate() {
            let path = dir.path().join(format!("c{i}.toml"));
            std::fs::write(
                &path,
                format!("[[hosts]]\nmatch = \"ok.example\"\n\n[[hosts]]\n{rule}\n")
                    .replace("hosts[0]", "hosts[1]"),
            )
            .expect("write");
            let err = Config::load(Some(&path), env(&[])).expect_err(rule);
            let text = format!("{err:#}");
            let named = named.replace("hosts[0]", "hosts[1]");
            assert!(
                text.contains(&named),
                "{rule}: `{text}` should name {named}"
            );
        }
        let path = dir.path().join("good.toml");
        std::fs::write(
            &path,
            "[[hosts]]\nmatch = \"*.example.com\"\nconcurrency = 8\nrate = 2.5\n",
        )
        .expect("write");
        let config = Config::load(Some(&path), env(&[])).expect("a good rule loads");
        assert_eq!(config.hosts[0].concurrency, Some(8));
        assert_eq!(config.hosts[0].rate, Some(2.5));
    }

    #[test]
    fn example_config_is_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config.example.toml");
        let example = Config::load(Some(&path), env(&[])).expect("example loads");
        assert_eq!(format!("{example:?}"), format!("{:?}", Config::default()));
    }
}
