//! Keys and secrets: `hookq new-key` (an API key and its config entry),
//! `hookq new-secret` and `hookq signing-secret URL` (signing secrets).

use std::process::ExitCode;

use super::table::print_json;
use super::{fail, CliError};
use crate::config::Config;

/// `hookq new-key`: a random token (`hq_` + 32 random bytes, hex) and the
/// config entry that admits it with `scopes`.
pub(super) fn new_key(name: &str, scopes: &[String], json: bool) -> Result<ExitCode, CliError> {
    use sha2::Digest;
    let scopes: Vec<&str> = scopes
        .iter()
        .map(|name| {
            let name = name.trim();
            crate::config::Scope::parse(name)
                .map(crate::config::Scope::as_str)
                .ok_or_else(|| fail(2, format!("--scopes: `{name}` is not read, write or admin")))
        })
        .collect::<Result<_, _>>()?;
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let token = format!("hq_{}", hex(&rand::random::<[u8; 32]>()));
    let digest = hex(&sha2::Sha256::digest(token.as_bytes()));
    if !crate::config::ApiKey::name_is_valid(name) {
        return Err(fail(
            2,
            "--name: 1-64 characters of A-Z a-z 0-9 . _ -".into(),
        ));
    }
    let quoted: Vec<String> = scopes.iter().map(|s| format!("\"{s}\"")).collect();
    if json {
        print_json(&serde_json::json!({
            "name": name, "token": token, "token_sha256": digest, "scopes": scopes,
        }))?;
    } else {
        println!("token (give it to {name}; it is not stored anywhere): {token}");
        println!();
        println!("[[api.keys]]");
        println!("name = \"{name}\"");
        println!("token_sha256 = \"{digest}\"");
        println!("scopes = [{}]", quoted.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}

/// `hookq new-secret`: a fresh Standard Webhooks signing secret.
pub(super) fn new_secret(json: bool) -> Result<ExitCode, CliError> {
    let secret = crate::delivery::signing::SigningSecret::generate();
    if json {
        print_json(&serde_json::json!({ "secret": secret }))?;
    } else {
        println!("{secret}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `hookq signing-secret URL`: the secrets a receiver at URL verifies with.
pub(super) fn signing_secret(config: &Config, url: &str, json: bool) -> Result<ExitCode, CliError> {
    let url =
        crate::job::validate_url(url, "URL").map_err(|e| fail(2, format!("URL: {}", e.message)))?;
    match crate::delivery::signing::receiver_secrets_for(&config.delivery, &url) {
        Ok(answer) if json => print_json(&answer)?,
        Ok(answer) => {
            for secret in &answer.secrets {
                println!("{secret}");
            }
        }
        Err(why) => {
            return Err(fail(
                2,
                format!("config key `delivery.signing_mode`: {why}"),
            ))
        }
    }
    Ok(ExitCode::SUCCESS)
}
