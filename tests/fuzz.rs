//! Fuzzing the two parsers that take outside input: the job JSON (what the API
//! and `hookq enqueue` accept) and the config (TOML file and `HOOKQ_*`
//! variables). Property tests, run by `cargo test`: arbitrary bytes and
//! structure-aware documents (known field names with values of every type)
//! must never panic; they either parse into something valid or give an error
//! that names the field or config key. `PROPTEST_CASES=100000 cargo test
//! --test fuzz` runs a longer campaign.

use std::io::Write;

use hookq::api::parse_json;
use hookq::config::Config;
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

const CONFIG_KEYS: &[(&str, &str)] = &[
    ("redis", "url"),
    ("redis", "namespace"),
    ("redis", "partitions"),
    ("redis", "cluster_nodes"),
    ("api", "listen"),
    ("api", "tokens"),
    ("api", "max_body"),
    ("delivery", "workers"),
    ("delivery", "timeout"),
    ("delivery", "retry"),
    ("delivery", "jitter"),
    ("delivery", "per_host_concurrency"),
    ("delivery", "signing_secrets"),
    ("delivery", "allow_private"),
    ("delivery", "allow_cidrs"),
    ("delivery", "dead_letter_statuses"),
    ("delivery", "lease_margin"),
    ("retention", "finished"),
    ("retention", "dead_letters_max"),
    ("log", "level"),
    ("log", "format"),
    ("nonsense", "key"),
    ("delivery", "nope"),
];

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
        entries in prop::collection::vec((prop::sample::select(CONFIG_KEYS), toml_value()), 1..5),
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
        (section, key) in prop::sample::select(CONFIG_KEYS),
        value in prop_oneof![tricky_string(), toml_value()],
    ) {
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

/// A TOML document: each section once, with its keys.
fn config_document(sections: &Sections) -> String {
    let mut text = String::new();
    for (section, keys) in sections {
        text.push_str(&format!("[{section}]\n"));
        for (key, value) in keys {
            text.push_str(&format!("{key} = {value}\n"));
        }
    }
    text
}

/// Whether `message` names one of the keys set (`section.key`), or, for a
/// section or key hookq does not know, that name as an unknown field.
fn names_a_key(message: &str, sections: &Sections) -> bool {
    sections.iter().any(|(section, keys)| {
        message.contains(&format!("unknown field `{section}`"))
            || keys.keys().any(|key| {
                message.contains(&format!("{section}.{key}"))
                    || message.contains(&format!("unknown field `{key}`"))
            })
    })
}

/// A config that loaded holds the values the document gave its plain keys.
fn check_read_as_written(config: &Config, sections: &Sections) -> Result<(), TestCaseError> {
    for (section, keys) in sections {
        for (key, text) in keys {
            let value: toml::Value = toml::from_str::<toml::Table>(&format!("v = {text}"))
                .map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?
                .remove("v")
                .ok_or_else(|| TestCaseError::fail("no value"))?;
            let held: Option<toml::Value> = match (*section, *key) {
                ("redis", "url") => Some(config.redis.url.clone().into()),
                ("redis", "namespace") => Some(config.redis.namespace.clone().into()),
                ("redis", "partitions") => Some(i64::from(config.redis.partitions).into()),
                ("api", "listen") => Some(config.api.listen.clone().into()),
                ("delivery", "workers") => Some((config.delivery.workers as i64).into()),
                ("delivery", "allow_private") => Some(config.delivery.allow_private.into()),
                ("log", "level") => Some(config.log.level.clone().into()),
                ("log", "format") => Some(config.log.format.clone().into()),
                _ => None,
            };
            if let Some(held) = held {
                prop_assert_eq!(
                    &held,
                    &value,
                    "{}.{} = {} was not read as written",
                    section,
                    key,
                    text
                );
            }
        }
    }
    Ok(())
}
