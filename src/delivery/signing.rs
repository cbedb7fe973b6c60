//! Standard Webhooks signatures (<https://www.standardwebhooks.com>).
//!
//! This module owns the signing secrets and the `webhook-signature` header.
//! A secret is configured as `whsec_<base64 key>`; every attempt is signed as
//! `v1,<base64(HMAC-SHA256(key, "{msg_id}.{timestamp}.{body}"))>`, once per
//! configured secret, the signatures separated by a single space so that
//! receivers can rotate keys without a gap. The caller sends the same
//! `msg_id` and `timestamp` (seconds since the epoch) as the `webhook-id` and
//! `webhook-timestamp` headers.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::config::secret::secret_key;
use crate::config::secret::{SecretError, SECRET_PREFIX};

type HmacSha256 = Hmac<Sha256>;

/// A signing key parsed from `whsec_<base64>`. Its `Debug` never shows the key.
#[derive(Clone)]
pub(crate) struct SigningSecret {
    /// HMAC state already keyed with the secret; cloned for every signature.
    mac: HmacSha256,
}

impl std::fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningSecret(<redacted>)")
    }
}

impl SigningSecret {
    /// Parses `whsec_<base64>` (padding optional) into a secret.
    pub(crate) fn parse(text: &str) -> Result<Self, SecretError> {
        let key = secret_key(text)?;
        let mac = HmacSha256::new_from_slice(&key).map_err(|_| SecretError::InvalidKey)?;
        Ok(SigningSecret { mac })
    }

    /// A fresh secret, `whsec_` and 32 random bytes in base64, for
    /// `delivery.signing_secrets` (`hookq new-secret` prints one).
    pub(crate) fn generate() -> String {
        let key: [u8; 32] = rand::random();
        format!("{SECRET_PREFIX}{}", STANDARD.encode(key))
    }

    /// `v1,<base64 signature>` of one message under this secret.
    fn sign(&self, msg_id: &str, timestamp_secs: i64, body: &[u8]) -> String {
        let mut mac = self.mac.clone();
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp_secs.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

pub(crate) use crate::config::SigningMode;

/// The text a per-origin key is derived from, before the origin.
const PER_ORIGIN_LABEL: &[u8] = b"hookq/per-origin/v1 ";

impl SigningSecret {
    /// The secret of origin `origin` (`scheme://host[:port]`, the port
    /// left out when it is the scheme's default): HMAC-SHA256 of this
    /// (master) secret's key over a label and the origin.
    fn derive(&self, origin: &str) -> [u8; 32] {
        let mut mac = self.mac.clone();
        mac.update(PER_ORIGIN_LABEL);
        mac.update(origin.as_bytes());
        mac.finalize().into_bytes().into()
    }
}

/// The origin a per-origin secret belongs to, as browsers write origins
/// (`https://shop.example`, `http://127.0.0.1:8080`); None for a URL that
/// does not parse or has no host.
pub(crate) fn origin_of(url: &str) -> Option<String> {
    origin_of_url(&url::Url::parse(url).ok()?)
}

/// [`origin_of`] for a URL already parsed.
fn origin_of_url(url: &url::Url) -> Option<String> {
    let origin = url.origin();
    origin.is_tuple().then(|| origin.ascii_serialization())
}

/// Signs attempts with every configured secret (several = key rotation),
/// or with each one's per-origin secret.
#[derive(Debug, Default)]
pub(crate) struct Signer {
    secrets: Vec<SigningSecret>,
    mode: SigningMode,
    /// Per-origin secrets already derived, by origin (at most
    /// [`DERIVED_CACHE`] origins; emptied when full).
    derived: std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<[SigningSecret]>>>,
}

/// Origins whose derived secrets a signer keeps.
const DERIVED_CACHE: usize = 4096;

/// What a receiver at a URL verifies with (`GET /v1/signing-secret`,
/// `hookq signing-secret`).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct ReceiverSecrets {
    /// The receiver's origin, as its secrets are derived for it.
    pub origin: Option<String>,
    /// Its `whsec_` secrets, one per configured secret, the newest first.
    pub secrets: Vec<String>,
}

/// Why there are no receiver secrets to show.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NoReceiverSecrets {
    /// The configured secrets cannot be read.
    #[error("delivery.signing_secrets: {0}")]
    Config(SecretError),
    /// Nothing is signed.
    #[error("delivery.signing_secrets is empty: attempts are not signed")]
    Unsigned,
    /// Shared mode: the receivers' secrets are the configured ones, never
    /// printed.
    #[error(
        "delivery.signing_mode is shared: every receiver verifies with delivery.signing_secrets"
    )]
    Shared,
}

/// The secrets a receiver at (validated) `url` verifies with under
/// `delivery`'s signing settings, or why there are none to show.
pub(crate) fn receiver_secrets_for(
    delivery: &crate::config::DeliveryConfig,
    url: &str,
) -> Result<ReceiverSecrets, NoReceiverSecrets> {
    let signer = Signer::from_config(delivery).map_err(NoReceiverSecrets::Config)?;
    if signer.is_empty() {
        return Err(NoReceiverSecrets::Unsigned);
    }
    let secrets = signer
        .receiver_secrets(url)
        .ok_or(NoReceiverSecrets::Shared)?;
    Ok(ReceiverSecrets {
        origin: origin_of(url),
        secrets,
    })
}

impl Signer {
    /// The signer `[delivery]` configures (`signing_secrets`,
    /// `signing_mode`).
    pub(crate) fn from_config(
        delivery: &crate::config::DeliveryConfig,
    ) -> Result<Signer, SecretError> {
        let secrets = delivery
            .signing_secrets
            .iter()
            .map(|s| SigningSecret::parse(s))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Signer::new(secrets, delivery.signing_mode))
    }

    /// A signer over `secrets` in `mode`; with none, attempts are not signed.
    pub(crate) fn new(secrets: Vec<SigningSecret>, mode: SigningMode) -> Self {
        Signer {
            secrets,
            mode,
            derived: Default::default(),
        }
    }

    /// The secrets of `origin`, derived once and then kept.
    fn derived_for(&self, origin: &str) -> std::sync::Arc<[SigningSecret]> {
        let mut cache = match self.derived.lock() {
            Ok(cache) => cache,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(secrets) = cache.get(origin) {
            return secrets.clone();
        }
        let secrets: std::sync::Arc<[SigningSecret]> = self
            .secrets
            .iter()
            .filter_map(|master| {
                let mac = HmacSha256::new_from_slice(&master.derive(origin)).ok()?;
                Some(SigningSecret { mac })
            })
            .collect();
        if cache.len() >= DERIVED_CACHE {
            cache.clear();
        }
        cache.insert(origin.to_string(), secrets.clone());
        secrets
    }

    /// Whether no secret is configured.
    pub(crate) fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// The `webhook-signature` header value for message `msg_id` sent at
    /// `timestamp_secs` with `body` to `url`: one `v1,<base64>` per
    /// configured secret (per-origin: per secret derived for `url`'s
    /// origin), separated by a single space. `None` when no secret is
    /// configured, or per-origin for a URL without an origin.
    pub(crate) fn signature_header(
        &self,
        msg_id: &str,
        timestamp_secs: i64,
        body: &[u8],
        url: &url::Url,
    ) -> Option<String> {
        if self.secrets.is_empty() {
            return None;
        }
        let signatures: Vec<String> = match self.mode {
            SigningMode::Shared => self
                .secrets
                .iter()
                .map(|secret| secret.sign(msg_id, timestamp_secs, body))
                .collect(),
            SigningMode::PerOrigin => self
                .derived_for(&origin_of_url(url)?)
                .iter()
                .map(|secret| secret.sign(msg_id, timestamp_secs, body))
                .collect(),
        };
        Some(signatures.join(" "))
    }

    /// The `whsec_` secrets a receiver at `url` verifies with, one per
    /// configured secret in order (the first is the newest): per-origin,
    /// the ones derived for its origin; shared, None (the receiver's
    /// secrets are `delivery.signing_secrets` themselves, which this never
    /// prints). None for a URL without an origin.
    pub(crate) fn receiver_secrets(&self, url: &str) -> Option<Vec<String>> {
        if self.mode != SigningMode::PerOrigin {
            return None;
        }
        let origin = origin_of(url)?;
        Some(
            self.secrets
                .iter()
                .map(|master| format!("{SECRET_PREFIX}{}", STANDARD.encode(master.derive(&origin))))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test vector of the Standard Webhooks specification and libraries.
    const SPEC_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const SPEC_MSG_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const SPEC_TIMESTAMP: i64 = 1614265330;
    const SPEC_PAYLOAD: &[u8] = br#"{"test": 2432232314}"#;
    const SPEC_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn url(text: &str) -> url::Url {
        url::Url::parse(text).expect("a URL")
    }

    fn receiver() -> url::Url {
        url("https://receiver.example/hook")
    }

    fn secret(text: &str) -> SigningSecret {
        SigningSecret::parse(text).expect("valid secret")
    }

    fn random_secret() -> String {
        SigningSecret::generate()
    }

    #[test]
    fn generated_secrets_parse_and_differ() {
        let (a, b) = (SigningSecret::generate(), SigningSecret::generate());
        assert!(
            a.starts_with("whsec_") && a.len() == "whsec_".len() + 44,
            "{a}"
        );
        assert_ne!(a, b);
        secret(&a);
    }

    #[test]
    fn matches_the_specification_test_vector() {
        let signer = Signer::new(vec![secret(SPEC_SECRET)], SigningMode::Shared);
        let header = signer
            .signature_header(SPEC_MSG_ID, SPEC_TIMESTAMP, SPEC_PAYLOAD, &receiver())
            .expect("signed");
        assert_eq!(header, SPEC_SIGNATURE);
    }

    #[test]
    fn signing_is_deterministic_and_covers_every_part() {
        let signer = Signer::new(vec![secret(SPEC_SECRET)], SigningMode::Shared);
        let sign =
            |id: &str, ts: i64, body: &[u8]| signer.signature_header(id, ts, body, &receiver());
        assert_eq!(
            sign(SPEC_MSG_ID, SPEC_TIMESTAMP, SPEC_PAYLOAD),
            sign(SPEC_MSG_ID, SPEC_TIMESTAMP, SPEC_PAYLOAD)
        );
        let reference = sign(SPEC_MSG_ID, SPEC_TIMESTAMP, SPEC_PAYLOAD);
        assert_ne!(sign("msg_other", SPEC_TIMESTAMP, SPEC_PAYLOAD), reference);
        assert_ne!(
            sign(SPEC_MSG_ID, SPEC_TIMESTAMP + 1, SPEC_PAYLOAD),
            reference
        );
        assert_ne!(sign(SPEC_MSG_ID, SPEC_TIMESTAMP, b"{}"), reference);
    }

    #[test]
    fn rotation_sends_one_signature_per_secret_in_order() {
        let other = random_secret();
        let signer = Signer::new(
            vec![secret(SPEC_SECRET), secret(&other)],
            SigningMode::Shared,
        );
        let header = signer
            .signature_header(SPEC_MSG_ID, SPEC_TIMESTAMP, SPEC_PAYLOAD, &receiver())
            .expect("signed");
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2, "{header}");
        assert_eq!(parts[0], SPEC_SIGNATURE);
        assert_eq!(
            Some(parts[1].to_string()),
            Signer::new(vec![secret(&other)], SigningMode::Shared).signature_header(
                SPEC_MSG_ID,
                SPEC_TIMESTAMP,
                SPEC_PAYLOAD,
                &receiver()
            )
        );
        assert!(parts[1].starts_with("v1,"));
        assert_ne!(parts[0], parts[1]);
    }

    #[test]
    fn no_secrets_means_no_signature() {
        let signer = Signer::new(Vec::new(), SigningMode::Shared);
        assert!(signer.is_empty());
        assert_eq!(signer.signature_header("msg", 1, b"{}", &receiver()), None);
        assert!(Signer::default().is_empty());
        assert!(!Signer::new(vec![secret(SPEC_SECRET)], SigningMode::Shared).is_empty());
    }

    #[test]
    fn bad_secrets_are_rejected_with_the_right_error() {
        let cases = [
            (
                "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                SecretError::MissingPrefix,
            ),
            ("", SecretError::MissingPrefix),
            (
                "WHSEC_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                SecretError::MissingPrefix,
            ),
            (
                " whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                SecretError::MissingPrefix,
            ),
            ("whsec_not base64!", SecretError::InvalidBase64),
            (
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n",
                SecretError::InvalidBase64,
            ),
            ("whsec_MfKQ9r8G-_", SecretError::InvalidBase64),
            ("whsec_A", SecretError::InvalidBase64),
            ("whsec_", SecretError::TooShort(0)),
            ("whsec_YWI=", SecretError::TooShort(2)),
            (
                "whsec_QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=",
                SecretError::TooShort(23),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(
                SigningSecret::parse(text).expect_err(text),
                expected,
                "{text:?}"
            );
        }
    }

    #[test]
    fn padding_is_optional() {
        // Keys whose base64 needs padding decode the same without it.
        for (padded, unpadded) in [
            (
                "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=",
                "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo",
            ),
            (
                "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWQ==",
                "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWQ",
            ),
        ] {
            let a = Signer::new(vec![secret(padded)], SigningMode::Shared).signature_header(
                "m",
                1,
                b"x",
                &receiver(),
            );
            let b = Signer::new(vec![secret(unpadded)], SigningMode::Shared).signature_header(
                "m",
                1,
                b"x",
                &receiver(),
            );
            assert_eq!(a, b);
        }
    }

    #[test]
    fn errors_explain_what_is_wrong() {
        assert!(SecretError::MissingPrefix.to_string().contains("whsec_"));
        assert!(SecretError::InvalidBase64.to_string().contains("base64"));
        assert!(SecretError::TooShort(3).to_string().contains("at least 24"));
    }

    #[test]
    fn debug_redacts_the_key() {
        let parsed = secret(SPEC_SECRET);
        assert_eq!(format!("{parsed:?}"), "SigningSecret(<redacted>)");
        assert_eq!(format!("{parsed:#?}"), "SigningSecret(<redacted>)");
        let signer = format!("{:?}", Signer::new(vec![parsed], SigningMode::Shared));
        assert!(signer.contains("SigningSecret(<redacted>)"), "{signer}");
        assert!(!signer.contains("MfKQ9r8G"), "{signer}");
    }

    /// Per origin: an origin's secret (as the receiver gets it) verifies
    /// what was sent to it and nothing sent elsewhere; paths and default
    /// ports do not matter, scheme, host and port do; each master secret
    /// gives its own.
    #[test]
    fn per_origin_secrets_verify_only_their_origin() {
        let other = random_secret();
        let signer = Signer::new(
            vec![secret(SPEC_SECRET), secret(&other)],
            SigningMode::PerOrigin,
        );
        let a = signer
            .receiver_secrets("https://a.example/hooks/1")
            .expect("per origin");
        assert_eq!(a.len(), 2);
        assert_ne!(a[0], a[1]);
        assert_eq!(
            signer.receiver_secrets("https://a.example:443/other?x=1"),
            Some(a.clone())
        );
        for elsewhere in [
            "http://a.example/",
            "https://a.example:8443/",
            "https://b.example/",
        ] {
            assert_ne!(
                signer.receiver_secrets(elsewhere).as_ref(),
                Some(&a),
                "{elsewhere}"
            );
        }
        let header = signer
            .signature_header(
                SPEC_MSG_ID,
                SPEC_TIMESTAMP,
                SPEC_PAYLOAD,
                &url("https://a.example/x"),
            )
            .expect("signed");
        let expected: Vec<String> = a
            .iter()
            .map(|derived| secret(derived).sign(SPEC_MSG_ID, SPEC_TIMESTAMP, SPEC_PAYLOAD))
            .collect();
        assert_eq!(header, expected.join(" "));
        assert!(
            !header.contains(SPEC_SIGNATURE),
            "the master secret itself signed"
        );
        let b = signer
            .signature_header(
                SPEC_MSG_ID,
                SPEC_TIMESTAMP,
                SPEC_PAYLOAD,
                &url("https://b.example/x"),
            )
            .expect("signed");
        assert!(expected.iter().all(|sig| !b.contains(sig.as_str())));
        assert_eq!(
            Signer::new(vec![secret(SPEC_SECRET)], SigningMode::Shared)
                .receiver_secrets("https://a.example/"),
            None
        );
        assert_eq!(signer.receiver_secrets("not a url"), None);
    }
}
