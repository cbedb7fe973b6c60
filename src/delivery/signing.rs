//! Temporary: replaced by the signing module.
use base64::Engine;
use hmac::{Hmac, Mac};
/// A secret.
pub struct SigningSecret(Vec<u8>);
/// Error.
#[derive(Debug, thiserror::Error)]
#[error("bad secret")]
pub struct SecretError;
impl SigningSecret {
    /// Parse.
    pub fn parse(s: &str) -> Result<Self, SecretError> {
        let b = s.strip_prefix("whsec_").ok_or(SecretError)?;
        Ok(SigningSecret(
            base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|_| SecretError)?,
        ))
    }
}
/// Signer.
pub struct Signer {
    secrets: Vec<SigningSecret>,
}
impl Signer {
    /// New.
    pub fn new(secrets: Vec<SigningSecret>) -> Self {
        Signer { secrets }
    }
    /// Empty.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }
    /// Header.
    pub fn signature_header(&self, id: &str, ts: i64, body: &[u8]) -> Option<String> {
        if self.secrets.is_empty() {
            return None;
        }
        Some(
            self.secrets
                .iter()
                .map(|s| {
                    let mut m = Hmac::<sha2::Sha256>::new_from_slice(&s.0).expect("hmac");
                    m.update(format!("{id}.{ts}.").as_bytes());
                    m.update(body);
                    format!(
                        "v1,{}",
                        base64::engine::general_purpose::STANDARD.encode(m.finalize().into_bytes())
                    )
                })
                .collect::<Vec<_>>()
                .join(" "),
        )
    }
}
