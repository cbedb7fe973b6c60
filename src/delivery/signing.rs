//! Standard Webhooks signatures (<https://www.standardwebhooks.com>): every
//! attempt carries `webhook-id`, `webhook-timestamp` (seconds) and
//! `webhook-signature` = `v1,` + base64(HMAC-SHA256(key, "id.timestamp.body")),
//! one per configured secret, space-separated, so secrets can be rotated.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Prefix of a Standard Webhooks secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// Why a secret was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// It does not start with `whsec_`.
    #[error("a signing secret must start with `whsec_`")]
    MissingPrefix,
    /// The rest is not base64.
    #[error("a signing secret must be `whsec_` followed by base64")]
    NotBase64,
    /// The key is empty or shorter than 16 bytes.
    #[error("a signing secret's key must be at least 16 bytes")]
    TooShort,
}

/// A signing key. Its `Debug` never shows the key.
#[derive(Clone)]
pub struct SigningSecret {
    key: Vec<u8>,
}

impl std::fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningSecret(<redacted>)")
    }
}

impl SigningSecret {
    /// Parses `whsec_<base64>`.
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        let encoded = text
            .strip_prefix(SECRET_PREFIX)
            .ok_or(SecretError::MissingPrefix)?;
        let key = STANDARD
            .decode(encoded)
            .map_err(|_| SecretError::NotBase64)?;
        if key.len() < 16 {
            return Err(SecretError::TooShort);
        }
        Ok(SigningSecret { key })
    }

    fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        // HMAC accepts keys of any length; new_from_slice cannot fail for it.
        let mut mac = match Hmac::<Sha256>::new_from_slice(&self.key) {
            Ok(mac) => mac,
            Err(_) => return String::new(),
        };
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

/// Signs attempts with every configured secret.
#[derive(Debug, Clone, Default)]
pub struct Signer {
    secrets: Vec<SigningSecret>,
}

impl Signer {
    /// A signer over `secrets` (none: attempts are not signed).
    pub fn new(secrets: Vec<SigningSecret>) -> Self {
        Signer { secrets }
    }

    /// Whether no secret is configured.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// The `webhook-signature` header value, or None without secrets.
    pub fn signature_header(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> Option<String> {
        if self.secrets.is_empty() {
            return None;
        }
        Some(
            self.secrets
                .iter()
                .map(|s| s.sign(msg_id, timestamp, body))
                .collect::<Vec<_>>()
                .join(" "),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn matches_the_specification_test_vector() {
        let signer = Signer::new(vec![SigningSecret::parse(SECRET).expect("secret")]);
        let header = signer
            .signature_header(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                br#"{"test": 2432232314}"#,
            )
            .expect("signed");
        assert_eq!(header, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn rotation_sends_every_signature() {
        let other = format!("{SECRET_PREFIX}{}", STANDARD.encode([7u8; 32]));
        let signer = Signer::new(vec![
            SigningSecret::parse(SECRET).expect("secret"),
            SigningSecret::parse(&other).expect("secret"),
        ]);
        let header = signer.signature_header("id", 1, b"{}").expect("signed");
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert!(parts.iter().all(|p| p.starts_with("v1,")));
        assert_ne!(parts[0], parts[1]);
    }

    #[test]
    fn bad_secrets_and_redaction() {
        assert_eq!(
            SigningSecret::parse("MfKQ9r8G").expect_err("prefix"),
            SecretError::MissingPrefix
        );
        assert_eq!(
            SigningSecret::parse("whsec_!!!").expect_err("b64"),
            SecretError::NotBase64
        );
        assert_eq!(
            SigningSecret::parse("whsec_YQ==").expect_err("short"),
            SecretError::TooShort
        );
        let secret = SigningSecret::parse(SECRET).expect("secret");
        assert_eq!(format!("{secret:?}"), "SigningSecret(<redacted>)");
        assert!(Signer::default().signature_header("a", 1, b"").is_none());
    }
}
