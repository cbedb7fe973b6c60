//! Loading and layering: defaults, then the TOML file, then
//! `HOOKQ_<SECTION>__<KEY>` variables, deserialized with the value parsers
//! the sections use (sizes, durations), and the masking of secrets and URL
//! passwords in what a refusal prints.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Deserializer};

use super::Config;

/// Prefix of the environment variables that override config keys.
pub(crate) const ENV_PREFIX: &str = "HOOKQ_";

impl Config {
    /// Loads defaults, then `file` (if any), then `HOOKQ_<SECTION>__<KEY>`
    /// variables from `env`, and validates the result.
    ///
    /// A message that quotes a value (serde's, TOML's, a check's) has the
    /// password of every URL in it masked ([`redact_urls_in`]).
    pub fn load<I>(file: Option<&Path>, env: I) -> anyhow::Result<Config>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        Config::load_unmasked(file, env)
            .map_err(|err| anyhow::anyhow!("{}", redact_urls_in(&format!("{err:#}"))))
    }

    /// [`Config::load`] before its message is masked.
    fn load_unmasked<I>(file: Option<&Path>, env: I) -> anyhow::Result<Config>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let mut table = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read config file {}", path.display()))?;
                toml::from_str::<toml::Table>(&text)
                    .with_context(|| format!("config file {} is not valid TOML", path.display()))?
            }
            None => toml::Table::new(),
        };
        apply_env(&mut table, env)?;
        let config: Config =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|err| {
                let path = err.path().to_string();
                let message = err.into_inner().to_string();
                if is_secret_key(&path) {
                    // Serde quotes the value it refused: not for a secret.
                    let expected = message
                        .find(", expected")
                        .map_or("", |i| &message[i..]);
                    let expected = expected.lines().next().unwrap_or("");
                    anyhow::anyhow!(
                        "config key `{path}`: the value has the wrong shape{expected} (a secret: its value is not shown)"
                    )
                } else {
                    anyhow::anyhow!("config key `{path}`: {message}")
                }
            })?;
        config.validate()?;
        Ok(config)
    }

    /// Loads from a file and the process environment.
    pub(crate) fn from_process(file: Option<&Path>) -> anyhow::Result<Config> {
        Config::load(file, std::env::vars())
    }
}

/// Overlays `HOOKQ_<SECTION>__<KEY>=value` variables onto `table`. A value is
/// read as a TOML value when it parses as one (`true`, `16`, `["1s"]`) and as a
/// plain string otherwise (`redis://...`).
fn apply_env<I>(table: &mut toml::Table, env: I) -> anyhow::Result<()>
where
    I: IntoIterator<Item = (String, String)>,
{
    let mut overrides: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in env {
        if let Some(rest) = name.strip_prefix(ENV_PREFIX) {
            if rest.contains("__") {
                overrides.insert(rest.to_string(), value);
            }
        }
    }
    for (rest, raw) in overrides {
        let Some((section, key)) = rest.split_once("__") else {
            continue;
        };
        let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
        let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.clone()));
        let entry = table
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let Some(section_table) = entry.as_table_mut() else {
            bail!("environment {ENV_PREFIX}{rest}: config `{section}` is not a section");
        };
        section_table.insert(key, value);
    }
    Ok(())
}

/// Parses a size like `1MiB`, `512KiB`, `16MB`, `1024` (bytes).
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a size like 1MiB"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "`{text}` has an unknown size unit (use B, KiB, MiB, GiB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{text}` is too large"))
}

pub(super) fn de_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Int(u64),
        Text(String),
    }
    match Size::deserialize(d)? {
        Size::Int(n) => Ok(n),
        Size::Text(t) => parse_size(&t).map_err(serde::de::Error::custom),
    }
}

pub(super) fn de_durations<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
    let items = Vec::<String>::deserialize(d)?;
    items
        .iter()
        .map(|s| humantime::parse_duration(s).map_err(|e| format!("`{s}`: {e}")))
        .collect::<Result<_, _>>()
        .map_err(serde::de::Error::custom)
}

/// Serde adapter for humantime duration strings.
pub(super) mod humantime_serde {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    /// A duration from a humantime string (`5s`, `250ms`).
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s)
            .map_err(|e| serde::de::Error::custom(format!("`{s}` is not a duration like 10s: {e}")))
    }
}

/// Whether config key `path` (e.g. `api.tokens`, `delivery.signing_secrets[0]`)
/// holds a secret, whose value no message may repeat.
fn is_secret_key(path: &str) -> bool {
    let key = path.split('.').next_back().unwrap_or(path);
    let key = key.split('[').next().unwrap_or(key);
    key.contains("secret") || key.contains("token") || key.contains("password")
}

/// `url` with the credentials of its user part replaced by `***`, for
/// printing (`redis://:secret@host:6379/0` → `redis://***@host:6379/0`);
/// the text between `://` and the last `@` before the path, even when the
/// URL does not parse.
pub(crate) fn redact_url(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let authority_end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    match url[start..authority_end].rfind('@') {
        Some(at) => format!("{}***{}", &url[..start], &url[start + at..]),
        None => url.to_string(),
    }
}

/// `text` with the credentials of every URL in it replaced by `***`: after
/// each `://`, the text up to the last `@` before the next `/`, `?`, `#` or
/// line end (so a quoted URL is masked whatever follows its password, at
/// the cost of masking more than needed when the text goes on with an `@`).
pub(crate) fn redact_urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let start = i + 3;
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        let end = after.find(['/', '?', '#', '\n']).unwrap_or(after.len());
        rest = match after[..end].rfind('@') {
            Some(at) => {
                out.push_str("***");
                &after[at..]
            }
            None => after,
        };
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::env;

    #[test]
    fn a_secret_in_the_wrong_shape_is_not_echoed() {
        for (key, value) in [
            ("HOOKQ_API__TOKENS", "supersecret-token-value"),
            (
                "HOOKQ_DELIVERY__SIGNING_SECRETS",
                "whsec_supersecret-token-value",
            ),
            ("HOOKQ_API__TOKENS", "[\"supersecret-token-value"),
        ] {
            let err = Config::load(None, [(key.to_string(), value.to_string())])
                .expect_err("a string where a list is expected");
            let text = format!("{err:#}");
            assert!(!text.contains("supersecret"), "{text}");
            assert!(text.contains("config key `"), "{text}");
        }
        assert!(is_secret_key("delivery.signing_secrets[1]"));
        assert!(is_secret_key("alerts.signing_secret"));
        assert!(!is_secret_key("delivery.timeout"));
    }

    #[test]
    fn printed_urls_hide_their_credentials() {
        assert_eq!(
            redact_url("redis://:s3cret@127.0.0.1:6379/0"),
            "redis://***@127.0.0.1:6379/0"
        );
        assert_eq!(
            redact_url("rediss://user:pa@ss@host/1?x=@"),
            "rediss://***@host/1?x=@"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(redact_url("not a url:pw@x"), "not a url:pw@x");
        assert_eq!(redact_url("redis://:pw@"), "redis://***@");
        assert_eq!(
            redact_urls_in(
                "string \"redis://:pw@h:1\", expected a sequence; `http://a:b@c/d@e` and http://x/"
            ),
            "string \"redis://***@h:1\", expected a sequence; `http://***@c/d@e` and http://x/"
        );
        assert_eq!(
            redact_urls_in("2 | url = \"redis://:p w\"@x:1\n  |  ^"),
            "2 | url = \"redis://***@x:1\n  |  ^"
        );
    }

    #[test]
    fn env_overrides_typed_and_string_values() {
        let c = Config::load(
            None,
            env(&[
                ("HOOKQ_DELIVERY__ALLOW_PRIVATE", "true"),
                ("HOOKQ_REDIS__URL", "redis://127.0.0.1:7000/2"),
                ("HOOKQ_DELIVERY__RETRY", r#"["50ms", "100ms"]"#),
                ("HOOKQ_API__MAX_BODY", "2MiB"),
                ("UNRELATED", "x"),
            ]),
        )
        .expect("load");
        assert!(c.delivery.allow_private);
        assert_eq!(c.redis.url, "redis://127.0.0.1:7000/2");
        assert_eq!(
            c.delivery.retry,
            vec![Duration::from_millis(50), Duration::from_millis(100)]
        );
        assert_eq!(c.api.max_body, 2 << 20);
    }

    #[test]
    fn file_then_env() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[delivery]\nworkers = 8\ntimeout = \"2s\"\n").expect("write");
        let c = Config::load(Some(&path), env(&[("HOOKQ_DELIVERY__WORKERS", "9")])).expect("load");
        assert_eq!(c.delivery.workers, 9);
        assert_eq!(c.delivery.timeout, Duration::from_secs(2));
        std::fs::write(&path, "[delivery]\nworkerz = 8\n").expect("write");
        let err = Config::load(Some(&path), env(&[])).expect_err("unknown key");
        assert!(format!("{err:#}").contains("workerz"));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("16 MB"), Ok(16_000_000));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999999GiB").is_err());
    }
}
