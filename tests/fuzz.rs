//! Fuzzing the two parsers that take outside input: the job JSON (what the API
//! and `hookq enqueue` accept) and the config (TOML file and `HOOKQ_*`
//! variables). Property tests, run by `cargo test`: arbitrary bytes and
//! structure-aware documents (known field names with values of every type)
//! must never panic; they either parse into something valid or give an error
//! that names the field or config key. `PROPTEST_CASES=100000 cargo test
//! --test fuzz` runs a longer campaign.

use std::io::Write;

use hookq::api::parse_json;
use hookq::config::{Config, SigningMode};
use hookq::job::JobInput;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const JOB_FIELDS: &[&str] = &[
    "id",
    "topic",
    "url",
    "method",
    "headers",
    "body",
    "body_text",
    "content_type",
    "run_at",
    "delay",
    "retry",
    "timeout",
    "unknown",
];

/// Strings that have broken parsers before: edges of numbers, durations,
/// URLs, times, encodings.
fn tricky_string() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-z0-9:/._-]{0,40}",
        Just("http://127.0.0.1:9/".to_string()),
        Just("https://example.com/a?b=c#d".to_string()),
        Just("ftp://example.com/".to_string()),
        Just("http://[::1]:80/".to_string()),
        Just("30m".to_string()),
        Just("1h 30m".to_string()),
        Just("0s".to_string()),
        Just("18446744073709551615s".to_string()),
        Just("-1s".to_string()),
        Just("2026-11-22T10:00:00Z".to_string()),
        Just("2026-13-45T99:99:99+25:00".to_string()),
        Just("9999-12-31T23:59:59Z".to_string()),
        Just("POST".to_string()),
        Just("DELETE".to_string()),
        Just("\u{0}\u{ffff}".to_string()),
        Just("x".repeat(3000)),
    ]
}

/// Any JSON value, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        tricky_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(tricky_string(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A job-shaped object: known field names (and an unknown one) with values
/// of any type.
fn job_object() -> impl Strategy<Value = Value> {
    prop::collection::vec((prop::sample::select(JOB_FIELDS), json_value()), 0..8).prop_map(
        |fields| {
            let mut map = Map::new();
            for (k, v) in fields {
                map.insert(k.to_string(), v);
            }
            Value::Object(map)
        },
    )
}

fn check_job_bytes(bytes: &[u8]) -> Result<(), TestCaseError> {
    let config = Config::default();
    match parse_json::<JobInput>(bytes) {
        Ok(input) => {
            if let Err(e) = input.validate(&config) {
                prop_assert!(!e.message.is_empty());
                prop_assert!(!e.code.is_empty());
            }
        }
        Err(e) => {
            prop_assert_eq!(e.status.as_u16(), 400);
            prop_assert!(!e.message.is_empty());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn job_parser_survives_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check_job_bytes(&bytes)?;
    }

    #[test]
    fn job_parser_survives_job_shaped_documents(doc in job_object()) {
        check_job_bytes(doc.to_string().as_bytes())?;
    }

    #[test]
    fn valid_looking_jobs_either_validate_or_name_a_field(
        url in tricky_string(),
        delay in tricky_string(),
        retry in prop::collection::vec(tricky_string(), 0..4),
        headers in prop::collection::btree_map("[A-Za-z-]{0,20}", tricky_string(), 0..4),
    ) {
        let doc = json!({"url": url, "delay": delay, "retry": retry, "headers": headers});
        let input: JobInput = parse_json(doc.to_string().as_bytes()).map_err(|e| TestCaseError::fail(e.message))?;
        if let Err(e) = input.validate(&Config::default()) {
            let field = e.field.unwrap_or_default();
            prop_assert!(
                ["url", "delay", "retry", "headers"].iter().any(|f| field.starts_with(f)),
                "error names no input field: {field:?} ({})", e.message
            );
        }
    }
}

/// Every key of the config (`src/config`), as (section, key); `hosts` is
/// the one at the top level (section ""). `every_config_key_is_listed`
/// holds this list to the config's own fields.
const CONFIG_KEYS: &[(&str, &str)] = &[
    ("", "hosts"),
    ("redis", "url"),
    ("redis", "cluster_nodes"),
    ("redis", "namespace"),
    ("redis", "partitions"),
    ("redis", "wheel_bucket"),
    ("redis", "ack_replicas"),
    ("redis", "ack_timeout"),
    ("api", "listen"),
    ("api", "tokens"),
    ("api", "keys"),
    ("api", "allow_unauthenticated"),
    ("api", "max_body"),
    ("api", "max_batch_body"),
    ("api", "header_timeout"),
    ("api", "body_timeout"),
    ("api", "idle_timeout"),
    ("api", "max_connections"),
    ("api", "metrics_public"),
    ("delivery", "workers"),
    ("delivery", "timeout"),
    ("delivery", "max_timeout"),
    ("delivery", "lease_margin"),
    ("delivery", "retry"),
    ("delivery", "jitter"),
    ("delivery", "per_host_concurrency"),
    ("delivery", "per_host_rate"),
    ("delivery", "dead_letter_statuses"),
    ("delivery", "allow_private"),
    ("delivery", "allow_cidrs"),
    ("delivery", "signing_secrets"),
    ("delivery", "signing_mode"),
    ("delivery", "claim_batch"),
    ("delivery", "claim_ahead"),
    ("delivery", "shutdown_grace"),
    ("retention", "finished"),
    ("retention", "keep_bodies"),
    ("retention", "dead_letters_max"),
    ("log", "level"),
    ("log", "format"),
    ("breaker", "failures"),
    ("breaker", "open_for"),
    ("breaker", "max_open"),
    ("alerts", "url"),
    ("alerts", "signing_secret"),
    ("telemetry", "otlp_endpoint"),
    ("", "tenants"),
    ("tenant_defaults", "weight"),
    ("tenant_defaults", "max_live_jobs"),
    ("tenant_defaults", "create_rate"),
];

/// Keys hookq does not know: a section and a key of a known section.
const UNKNOWN_KEYS: &[(&str, &str)] = &[("nonsense", "key"), ("delivery", "nope")];

/// Known and unknown keys, for the generators of bad documents.
fn any_key() -> impl Strategy<Value = (&'static str, &'static str)> {
    prop::sample::select([CONFIG_KEYS, UNKNOWN_KEYS].concat())
}

/// A TOML value of any kind, as text.
fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| format!("{f:?}")),
        tricky_string().prop_map(|s| toml::Value::String(s).to_string()),
        prop::collection::vec(tricky_string(), 0..4).prop_map(|v| {
            toml::Value::Array(v.into_iter().map(toml::Value::String).collect()).to_string()
        }),
        Just("{ a = 1 }".to_string()),
        Just("[1, \"two\"]".to_string()),
    ]
}

fn load_toml(text: &str) -> anyhow::Result<Config> {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(text.as_bytes()).expect("write");
    Config::load(Some(file.path()), Vec::<(String, String)>::new())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn config_parser_survives_arbitrary_text(text in any::<String>()) {
        if let Err(e) = load_toml(&text) {
            let message = format!("{e:#}");
            prop_assert!(message.contains("config"), "{message}");
            if toml::from_str::<toml::Table>(&text).is_ok() {
                prop_assert!(!message.contains("not valid TOML"), "{message}\n{text:?}");
            }
        }
    }

    #[test]
    fn config_errors_name_the_key(
        entries in prop::collection::vec((any_key(), toml_value()), 1..5),
    ) {
        let entries = by_section(&entries);
        let text = config_document(&entries);
        // The generator writes well-formed TOML (each section once, each key
        // once), so any error is about a key, never about the syntax.
        prop_assert!(toml::from_str::<toml::Table>(&text).is_ok(), "generator wrote bad TOML:\n{text}");
        match load_toml(&text) {
            Ok(config) => check_read_as_written(&config, &entries)?,
            Err(e) => {
                let message = format!("{e:#}");
                prop_assert!(!message.contains("not valid TOML"), "{message}\n{text}");
                prop_assert!(message.contains("config key"), "{message}\n{text}");
                prop_assert!(
                    names_a_key(&message, &entries),
                    "the error names none of the keys set:\n{message}\n{text}"
                );
            }
        }
    }

    #[test]
    fn env_overrides_name_the_key(
        (section, key) in any_key(),
        value in prop_oneof![tricky_string(), toml_value()],
    ) {
        // `hosts` has no section: no variable sets it.
        prop_assume!(!section.is_empty());
        let name = format!("HOOKQ_{}__{}", section.to_uppercase(), key.to_uppercase());
        if let Err(e) = Config::load(None, vec![(name.clone(), value.clone())]) {
            let message = format!("{e:#}");
            let entries = by_section(&[((section, key), value)]);
            prop_assert!(
                message.contains(&name) || names_a_key(&message, &entries),
                "the error names neither {name} nor its key: {message}"
            );
        }
    }
}

/// Entries grouped by section, the last value of a repeated key winning (as
/// it would in a hand-edited file once the duplicate is removed).
type Sections =
    std::collections::BTreeMap<&'static str, std::collections::BTreeMap<&'static str, String>>;

fn by_section(entries: &[((&'static str, &'static str), String)]) -> Sections {
    let mut sections = Sections::new();
    for ((section, key), value) in entries {
        sections
            .entry(*section)
            .or_default()
            .insert(*key, value.clone());
    }
    sections
}

/// A TOML document: each section once, with its keys (the top-level
/// ones, section "", first: a BTreeMap puts "" first).
fn config_document(sections: &Sections) -> String {
    let mut text = String::new();
    for (section, keys) in sections {
        if !section.is_empty() {
            text.push_str(&format!("[{section}]\n"));
        }
        for (key, value) in keys {
            text.push_str(&format!("{key} = {value}\n"));
        }
    }
    text
}

/// A key's name as error messages write it: `section.key`, or `key` at the
/// top level.
fn key_path(section: &str, key: &str) -> String {
    if section.is_empty() {
        key.to_string()
    } else {
        format!("{section}.{key}")
    }
}

/// Whether `message` names one of the keys set (`section.key`), or, for a
/// section or key hookq does not know, that name as an unknown field.
fn names_a_key(message: &str, sections: &Sections) -> bool {
    sections.iter().any(|(section, keys)| {
        (!section.is_empty() && message.contains(&format!("unknown field `{section}`")))
            || keys.keys().any(|key| {
                message.contains(&format!("`{}", key_path(section, key)))
                    || message.contains(&key_path(section, key))
                    || message.contains(&format!("unknown field `{key}`"))
            })
    })
}

/// A size as the README writes them (`1MiB`, `512KiB`, `16MB`, `1024`):
/// this test's own reading, to hold the config's to.
fn size_of(value: &toml::Value) -> Option<u64> {
    if let Some(n) = value.as_integer() {
        return u64::try_from(n).ok();
    }
    let text = value.as_str()?.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let n: u64 = text[..split].parse().ok()?;
    let unit: u64 = match text[split..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(unit)
}

fn duration_of(value: &toml::Value) -> Option<std::time::Duration> {
    humantime::parse_duration(value.as_str()?).ok()
}

fn list_of<T>(value: &toml::Value, item: impl Fn(&toml::Value) -> Option<T>) -> Option<Vec<T>> {
    value.as_array()?.iter().map(item).collect()
}

fn text_of(value: &toml::Value) -> Option<String> {
    value.as_str().map(str::to_string)
}

fn int_of(value: &toml::Value) -> Option<i64> {
    value.as_integer()
}

fn float_of(value: &toml::Value) -> Option<f64> {
    value
        .as_float()
        .or_else(|| value.as_integer().map(|n| n as f64))
}

/// Field `name` of inline table `value`, read by `read` (None when absent).
fn field<T>(
    value: &toml::Value,
    name: &str,
    read: impl Fn(&toml::Value) -> Option<T>,
) -> Option<Option<T>> {
    match value.as_table()?.get(name) {
        None => Some(None),
        Some(v) => read(v).map(Some),
    }
}

/// What `config` holds at `section.key`, and what the document's `value`
/// for it should have given, both in the same form (Debug text of the
/// field's type); `None` for a key this check does not know.
fn held_and_written(
    config: &Config,
    section: &str,
    key: &str,
    value: &toml::Value,
) -> Option<(String, String)> {
    fn pair<T: std::fmt::Debug>(held: T, written: Option<T>) -> (String, String) {
        (format!("{:?}", Some(held)), format!("{written:?}"))
    }
    let (r, a, d, re, l) = (
        &config.redis,
        &config.api,
        &config.delivery,
        &config.retention,
        &config.log,
    );
    Some(match (section, key) {
        ("", "hosts") => pair(
            config
                .hosts
                .iter()
                .map(|h| (h.pattern.clone(), h.concurrency.map(|c| c as i64), h.rate))
                .collect::<Vec<_>>(),
            list_of(value, |h| {
                Some((
                    field(h, "match", text_of)??,
                    field(h, "concurrency", int_of)?,
                    field(h, "rate", float_of)?,
                ))
            }),
        ),
        ("redis", "url") => pair(r.url.clone(), text_of(value)),
        ("redis", "cluster_nodes") => pair(r.cluster_nodes.clone(), list_of(value, text_of)),
        ("redis", "namespace") => pair(r.namespace.clone(), text_of(value)),
        ("redis", "partitions") => pair(i64::from(r.partitions), int_of(value)),
        ("redis", "wheel_bucket") => pair(r.wheel_bucket, duration_of(value)),
        ("redis", "ack_replicas") => pair(i64::from(r.ack_replicas), int_of(value)),
        ("redis", "ack_timeout") => pair(r.ack_timeout, duration_of(value)),
        ("api", "listen") => pair(a.listen.clone(), text_of(value)),
        ("api", "tokens") => pair(a.tokens.clone(), list_of(value, text_of)),
        ("api", "keys") => pair(
            a.keys
                .iter()
                .map(|k| {
                    let scopes = k.scopes.iter().map(|s| format!("{s:?}").to_lowercase());
                    (
                        k.name.clone(),
                        k.token_sha256.clone(),
                        scopes.collect(),
                        k.tenant.clone(),
                    )
                })
                .collect::<Vec<(String, String, Vec<String>, Option<String>)>>(),
            list_of(value, |k| {
                Some((
                    field(k, "name", text_of)??,
                    field(k, "token_sha256", text_of)??,
                    field(k, "scopes", |s| list_of(s, text_of))??,
                    field(k, "tenant", text_of)?,
                ))
            }),
        ),
        ("", "tenants") => pair(
            config
                .tenants
                .iter()
                .map(|t| {
                    (
                        t.name.clone(),
                        t.weight.map(i64::from),
                        t.max_live_jobs.map(|n| n as i64),
                        t.create_rate,
                    )
                })
                .collect::<Vec<_>>(),
            list_of(value, |t| {
                Some((
                    field(t, "name", text_of)??,
                    field(t, "weight", int_of)?,
                    field(t, "max_live_jobs", int_of)?,
                    field(t, "create_rate", float_of)?,
                ))
            }),
        ),
        ("tenant_defaults", "weight") => {
            pair(i64::from(config.tenant_defaults.weight), int_of(value))
        }
        ("tenant_defaults", "max_live_jobs") => {
            pair(config.tenant_defaults.max_live_jobs as i64, int_of(value))
        }
        ("tenant_defaults", "create_rate") => {
            pair(config.tenant_defaults.create_rate, float_of(value))
        }
        ("api", "allow_unauthenticated") => pair(a.allow_unauthenticated, value.as_bool()),
        ("api", "metrics_public") => pair(a.metrics_public, value.as_bool()),
        ("api", "max_body") => pair(a.max_body, size_of(value)),
        ("api", "max_batch_body") => pair(a.max_batch_body, size_of(value)),
        ("api", "header_timeout") => pair(a.header_timeout, duration_of(value)),
        ("api", "body_timeout") => pair(a.body_timeout, duration_of(value)),
        ("api", "idle_timeout") => pair(a.idle_timeout, duration_of(value)),
        ("api", "max_connections") => pair(a.max_connections as i64, int_of(value)),
        ("delivery", "workers") => pair(d.workers as i64, int_of(value)),
        ("delivery", "timeout") => pair(d.timeout, duration_of(value)),
        ("delivery", "max_timeout") => pair(d.max_timeout, duration_of(value)),
        ("delivery", "lease_margin") => pair(d.lease_margin, duration_of(value)),
        ("delivery", "retry") => pair(d.retry.clone(), list_of(value, duration_of)),
        ("delivery", "jitter") => pair(d.jitter, float_of(value)),
        ("delivery", "per_host_concurrency") => pair(d.per_host_concurrency as i64, int_of(value)),
        ("delivery", "per_host_rate") => pair(d.per_host_rate, float_of(value)),
        ("delivery", "dead_letter_statuses") => pair(
            d.dead_letter_statuses
                .iter()
                .map(|s| i64::from(*s))
                .collect(),
            list_of(value, int_of),
        ),
        ("delivery", "allow_private") => pair(d.allow_private, value.as_bool()),
        ("delivery", "allow_cidrs") => pair(d.allow_cidrs.clone(), list_of(value, text_of)),
        ("delivery", "signing_secrets") => pair(d.signing_secrets.clone(), list_of(value, text_of)),
        ("delivery", "signing_mode") => pair(
            match d.signing_mode {
                SigningMode::Shared => "shared".to_string(),
                SigningMode::PerOrigin => "per_origin".to_string(),
            },
            text_of(value),
        ),
        ("delivery", "claim_batch") => pair(d.claim_batch as i64, int_of(value)),
        ("delivery", "claim_ahead") => pair(d.claim_ahead, duration_of(value)),
        ("delivery", "shutdown_grace") => pair(d.shutdown_grace, duration_of(value)),
        ("retention", "finished") => pair(re.finished, duration_of(value)),
        ("retention", "keep_bodies") => pair(re.keep_bodies, value.as_bool()),
        ("retention", "dead_letters_max") => pair(re.dead_letters_max as i64, int_of(value)),
        ("log", "level") => pair(l.level.clone(), text_of(value)),
        ("log", "format") => pair(l.format.clone(), text_of(value)),
        ("breaker", "failures") => pair(i64::from(config.breaker.failures), int_of(value)),
        ("breaker", "open_for") => pair(config.breaker.open_for, duration_of(value)),
        ("breaker", "max_open") => pair(config.breaker.max_open, duration_of(value)),
        ("alerts", "url") => pair(config.alerts.url.clone(), text_of(value)),
        ("alerts", "signing_secret") => pair(config.alerts.signing_secret.clone(), text_of(value)),
        ("telemetry", "otlp_endpoint") => {
            pair(config.telemetry.otlp_endpoint.clone(), text_of(value))
        }
        _ => return None,
    })
}

/// A config that loaded holds the value the document gave each of its keys.
fn check_read_as_written(config: &Config, sections: &Sections) -> Result<(), TestCaseError> {
    for (section, keys) in sections {
        for (key, text) in keys {
            let value: toml::Value = toml::from_str::<toml::Table>(&format!("v = {text}"))
                .map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?
                .remove("v")
                .ok_or_else(|| TestCaseError::fail("no value"))?;
            let Some((held, written)) = held_and_written(config, section, key, &value) else {
                return Err(TestCaseError::fail(format!(
                    "{} loaded, and this check does not know it",
                    key_path(section, key)
                )));
            };
            prop_assert_eq!(
                &held,
                &written,
                "{} = {} was not read as written",
                key_path(section, key),
                text
            );
        }
    }
    Ok(())
}

const SECRET: &str = "\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"";
const OTHER_SECRET: &str = "\"whsec_Vm9yc2ljaHQgYmVpbSBSb3RpZXJlbiEh\"";
const DIGEST: &str = "\"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"";

/// Valid values of key `section.key` (TOML text), none of them its
/// default, so that a key the config's read path drops is seen holding its
/// default. They are valid together too (timeouts below every
/// `max_timeout`, `open_for` below every `max_open`, loopback addresses).
fn valid_value(section: &str, key: &str) -> BoxedStrategy<String> {
    let one_of = |values: &[&str]| {
        prop::sample::select(values.iter().map(|v| v.to_string()).collect::<Vec<_>>()).boxed()
    };
    let sizes = [
        "\"2MiB\"",
        "4096",
        "\"512KiB\"",
        "\"3 MB\"",
        "\"1GiB\"",
        "\"777\"",
    ];
    let api_timeouts = ["\"100ms\"", "\"5s\"", "\"1h\"", "\"1m 30s\""];
    match (section, key) {
        ("", "hosts") => one_of(&[
            "[{ match = \"api.example.com\", concurrency = 2 }]",
            "[{ match = \"*.example.com\", rate = 5 }, { match = \"https://x.example.org:8443\", concurrency = 1, rate = 0.5 }]",
        ]),
        ("redis", "url") => one_of(&[
            "\"redis://10.0.0.5:6380/2\"",
            "\"rediss://user:pw@redis.example.com:6390/0\"",
        ]),
        ("redis", "cluster_nodes") => one_of(&[
            "[\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001\"]",
            "[\"redis://10.1.1.1:6379\"]",
        ]),
        ("redis", "namespace") => one_of(&["\"jobs-a\"", "\"x.y_z\""]),
        ("redis", "partitions") => (1u16..=1024)
            .prop_filter("not the default", |n| *n != 16)
            .prop_map(|n| n.to_string())
            .boxed(),
        ("redis", "wheel_bucket") => one_of(&["\"16ms\"", "\"1s\"", "\"1h\"", "\"2m 30s\""]),
        ("redis", "ack_replicas") => (1u32..=16).prop_map(|n| n.to_string()).boxed(),
        ("redis", "ack_timeout") => one_of(&["\"10ms\"", "\"250ms\"", "\"30s\""]),
        ("api", "listen") => one_of(&["\"127.0.0.1:9090\"", "\"[::1]:8081\"", "\"127.0.0.5:80\""]),
        ("api", "tokens") => one_of(&["[\"token-one-1234\"]", "[\"abcdefgh\", \"ijklmnopqr\"]"]),
        ("api", "keys") => prop::sample::select(vec![
            format!("[{{ name = \"ops\", token_sha256 = {DIGEST}, scopes = [\"read\", \"admin\"] }}]"),
            format!("[{{ name = \"a.b_c-1\", token_sha256 = {DIGEST}, scopes = [\"write\"] }}, {{ name = \"two\", token_sha256 = {DIGEST}, scopes = [\"read\", \"write\", \"admin\"] }}]"),
            format!("[{{ name = \"billing\", token_sha256 = {DIGEST}, scopes = [\"read\", \"write\"], tenant = \"billing-eu\" }}]"),
        ])
        .boxed(),
        ("", "tenants") => one_of(&[
            "[{ name = \"billing\", weight = 3 }]",
            "[{ name = \"orders\", max_live_jobs = 1000, create_rate = 2.5 }, { name = \"m-2\" }]",
        ]),
        ("tenant_defaults", "weight") => one_of(&["2", "1000"]),
        ("tenant_defaults", "max_live_jobs") => one_of(&["1", "1000000"]),
        ("tenant_defaults", "create_rate") => one_of(&["0.5", "100", "2.5"]),
        ("api", "allow_unauthenticated")
        | ("api", "metrics_public")
        | ("delivery", "allow_private")
        | ("retention", "keep_bodies") => one_of(&["true"]),
        ("api", "max_body") | ("api", "max_batch_body") => one_of(&sizes),
        ("api", "header_timeout") | ("api", "body_timeout") | ("api", "idle_timeout") => {
            one_of(&api_timeouts)
        }
        ("api", "max_connections") => (1usize..=1_000_000)
            .prop_filter("not the default", |n| *n != 10_000)
            .prop_map(|n| n.to_string())
            .boxed(),
        ("delivery", "workers") => (1usize..=4096)
            .prop_filter("not the default", |n| *n != 512)
            .prop_map(|n| n.to_string())
            .boxed(),
        ("delivery", "timeout") => one_of(&["\"1s\"", "\"5s\"", "\"30s\"", "\"250ms\""]),
        ("delivery", "max_timeout") => one_of(&["\"30s\"", "\"90s\"", "\"5m\""]),
        ("delivery", "lease_margin") => one_of(&["\"100ms\"", "\"5s\"", "\"1m\""]),
        ("delivery", "retry") => one_of(&["[]", "[\"1s\"]", "[\"50ms\", \"2m\", \"1h 30m\"]"]),
        ("delivery", "jitter") => one_of(&["0.25", "1.0", "1", "0.5"]),
        ("delivery", "per_host_concurrency") => (1usize..=1000)
            .prop_filter("not the default", |n| *n != 64)
            .prop_map(|n| n.to_string())
            .boxed(),
        ("delivery", "per_host_rate") => one_of(&["2.5", "100", "0.1"]),
        ("delivery", "dead_letter_statuses") => one_of(&["[]", "[404, 410]", "[100, 599]"]),
        ("delivery", "allow_cidrs") => {
            one_of(&["[\"10.0.0.0/8\"]", "[\"192.168.1.0/24\", \"fd00::/8\"]"])
        }
        ("delivery", "signing_secrets") => prop::sample::select(vec![
            format!("[{SECRET}]"),
            format!("[{SECRET}, {OTHER_SECRET}]"),
        ])
        .boxed(),
        ("delivery", "signing_mode") => one_of(&["\"per_origin\""]),
        ("delivery", "claim_batch") => (1usize..=1000)
            .prop_filter("not the default", |n| *n != 64)
            .prop_map(|n| n.to_string())
            .boxed(),
        ("delivery", "claim_ahead") => one_of(&["\"0ms\"", "\"10ms\"", "\"1ms\""]),
        ("delivery", "shutdown_grace") => one_of(&["\"0s\"", "\"5s\"", "\"2m\""]),
        ("retention", "finished") => one_of(&["\"1s\"", "\"3h\"", "\"7days\""]),
        ("retention", "dead_letters_max") => (1u64..=10_000_000_000)
            .prop_filter("not the default", |n| *n != 1_000_000)
            .prop_map(|n| n.to_string())
            .boxed(),
        ("log", "level") => one_of(&["\"debug\"", "\"hookq=debug,info\"", "\"warn\""]),
        ("log", "format") => one_of(&["\"json\""]),
        ("breaker", "failures") => (0u32..=1000)
            .prop_filter("not the default", |n| *n != 20)
            .prop_map(|n| n.to_string())
            .boxed(),
        ("breaker", "open_for") => one_of(&["\"10ms\"", "\"1s\"", "\"5m\""]),
        ("breaker", "max_open") => one_of(&["\"5m\"", "\"1h\"", "\"2h 30m\""]),
        ("alerts", "url") => one_of(&[
            "\"http://127.0.0.1:9/alerts\"",
            "\"https://ops.example.com/hookq\"",
        ]),
        ("alerts", "signing_secret") => one_of(&[SECRET, OTHER_SECRET]),
        ("telemetry", "otlp_endpoint") => {
            one_of(&["\"http://collector:4318\"", "\"https://otel.example.com\""])
        }
        _ => panic!("no valid values for {}", key_path(section, key)),
    }
}

/// A document of some keys, each with a valid value.
fn valid_entries() -> impl Strategy<Value = Vec<((&'static str, &'static str), String)>> {
    prop::collection::vec(prop::sample::select(CONFIG_KEYS), 1..10).prop_flat_map(|keys| {
        keys.into_iter()
            .map(|key| valid_value(key.0, key.1).prop_map(move |v| (key, v)))
            .collect::<Vec<_>>()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Every key is read as written: a document of valid values loads, and
    /// the config holds each value it gave.
    #[test]
    fn valid_values_are_read_as_written(entries in valid_entries()) {
        let entries = by_section(&entries);
        let text = config_document(&entries);
        match load_toml(&text) {
            Ok(config) => check_read_as_written(&config, &entries)?,
            Err(e) => prop_assert!(false, "a valid document was refused: {e:#}\n{text}"),
        }
    }
}

/// The keys of `Config`, read from its Debug text: each field of a section
/// struct (`redis: RedisConfig { url: .. }`) as (section, key), and a
/// top-level field that is not a section (`hosts: []`) as ("", key).
fn config_fields() -> std::collections::BTreeSet<(String, String)> {
    let text = format!("{:?}", Config::default());
    let chars: Vec<char> = text.chars().collect();
    let mut fields = std::collections::BTreeSet::new();
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let (mut word, mut section) = (String::new(), String::new());
    for (i, &c) in chars.iter().enumerate() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | '[' | '(' => depth += 1,
            '}' | ']' | ')' => depth -= 1,
            ':' if chars.get(i + 1) == Some(&' ') => {
                let rest: String = chars[i + 2..].iter().collect();
                let is_struct = rest.split_once(' ').is_some_and(|(name, tail)| {
                    name.starts_with(char::is_uppercase) && tail.starts_with('{')
                });
                match depth {
                    1 if is_struct => section = word.clone(),
                    1 => {
                        fields.insert((String::new(), word.clone()));
                    }
                    2 => {
                        fields.insert((section.clone(), word.clone()));
                    }
                    _ => {}
                }
            }
            _ => {}
        }
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            word.clear();
        }
    }
    fields
}

/// `CONFIG_KEYS` is every key of the config: a key added to `src/config`
/// and not listed here would go unfuzzed and unchecked.
#[test]
fn every_config_key_is_listed() {
    let listed: std::collections::BTreeSet<(String, String)> = CONFIG_KEYS
        .iter()
        .map(|(s, k)| (s.to_string(), k.to_string()))
        .collect();
    let fields = config_fields();
    assert!(fields.len() > 30, "the Debug reader found only {fields:?}");
    assert_eq!(
        listed, fields,
        "CONFIG_KEYS and the fields of Config differ"
    );
    // And each has a read-as-written check and valid values.
    let config = Config::default();
    for (section, key) in CONFIG_KEYS {
        assert!(
            held_and_written(&config, section, key, &toml::Value::Boolean(true)).is_some(),
            "no read-as-written check for {}",
            key_path(section, key)
        );
        let _ = valid_value(section, key);
    }
}
