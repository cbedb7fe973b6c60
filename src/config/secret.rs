//! The format of a signing secret as configured, `whsec_<base64 key>`
//! (Standard Webhooks). A config value type: loading the config checks it
//! here, and `crate::delivery::signing` keys its HMAC with what it decodes.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;

/// Prefix of a Standard Webhooks signing secret.
pub(crate) const SECRET_PREFIX: &str = "whsec_";

/// Standard base64 that accepts the key with or without `=` padding.
const SECRET_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Why a signing secret was refused. The messages never contain the secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SecretError {
    /// The secret does not start with `whsec_`.
    #[error("signing secret must start with `whsec_`")]
    MissingPrefix,
    /// What follows `whsec_` is not standard base64.
    #[error("signing secret must be `whsec_` followed by standard base64")]
    InvalidBase64,
    /// The decoded key is shorter than [`MIN_KEY_BYTES`] (guessable).
    #[error(
        "signing secret key is {0} bytes; at least 24 are needed (`hookq new-secret` makes one of 32)"
    )]
    TooShort(usize),
    /// HMAC-SHA256 refused the key (it accepts any length, so this is not
    /// expected in practice).
    #[error("signing secret key is not a valid HMAC-SHA256 key")]
    InvalidKey,
}

/// The shortest key a signing secret may hold, in bytes (Standard Webhooks
/// secrets are 24 to 64 bytes).
pub(crate) const MIN_KEY_BYTES: usize = 24;

/// The key of secret `text` (`whsec_<base64>`, padding optional, at least
/// [`MIN_KEY_BYTES`] bytes).
pub(crate) fn secret_key(text: &str) -> Result<Vec<u8>, SecretError> {
    let encoded = text
        .strip_prefix(SECRET_PREFIX)
        .ok_or(SecretError::MissingPrefix)?;
    let key = SECRET_BASE64
        .decode(encoded)
        .map_err(|_| SecretError::InvalidBase64)?;
    if key.len() < MIN_KEY_BYTES {
        return Err(SecretError::TooShort(key.len()));
    }
    Ok(key)
}
