//! The principal's JWT signing key: RSA, as upstream requires (it signs RS512 and panics on other
//! key types). Loaded from PKCS#8 PEM (`jwt.key` of secret `argocd-agent-jwt`, or `--jwt-key`),
//! PKCS#1 PEM, or generated (`--insecure-jwt-generate`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use jsonwebtoken::{DecodingKey, EncodingKey};
use rsa::pkcs1::{DecodeRsaPrivateKey, EncodeRsaPrivateKey};
use rsa::pkcs8::{DecodePrivateKey, EncodePrivateKey, LineEnding, PrivateKeyInfo};
use rsa::traits::PublicKeyParts;
use rsa::{RsaPrivateKey, RsaPublicKey};
use sha2::{Digest, Sha256};

/// The size of a volatile key from `--insecure-jwt-generate` (upstream `principal/options.go`).
pub const GENERATED_KEY_BITS: usize = 2048;

/// The size `argocd-agentctl jwt create-key` generates.
pub const CREATED_KEY_BITS: usize = 4096;

/// The smallest RSA key accepted.
pub const MIN_KEY_BITS: usize = 2048;

/// The OID of `rsaEncryption` in a PKCS#8 `AlgorithmIdentifier`.
const RSA_ENCRYPTION_OID: &str = "1.2.840.113549.1.1.1";

/// An RSA key pair that signs and verifies session tokens.
///
/// Signing goes through `ring` (assembly Montgomery arithmetic: an RSA-4096 signature costs a
/// fraction of what the pure-Rust `rsa` crate needs, and `Authenticate` signs two tokens);
/// keys `ring` refuses (it takes two-prime keys of 2048 to 4096 bits with a public exponent
/// of at least 65537) are signed by jsonwebtoken's RustCrypto backend. PKCS#1 v1.5 signatures
/// are deterministic, so both give the same token.
#[derive(Clone)]
pub struct SigningKey {
    private: RsaPrivateKey,
    encoding: EncodingKey,
    decoding: DecodingKey,
    ring: Option<Arc<ring::signature::RsaKeyPair>>,
}

/// Why a signing key could not be loaded or made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key file could not be read.
    #[error("cannot read the JWT signing key {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The data is not PEM.
    #[error("the JWT signing key is not PEM: {reason}")]
    NotPem {
        /// What the decoder said.
        reason: String,
    },
    /// A PEM block of the wrong kind.
    #[error(
        "the JWT signing key is a \"{label}\" PEM block; expected \"PRIVATE KEY\" (PKCS#8, as \
         `argocd-agentctl jwt create-key` writes) or \"RSA PRIVATE KEY\" (PKCS#1)"
    )]
    UnexpectedPem {
        /// The PEM label found.
        label: String,
    },
    /// A PKCS#8 key of another algorithm.
    #[error(
        "the JWT signing key is not an RSA key (PKCS#8 algorithm {algorithm}); tokens are RS512, \
         create an RSA key with `argocd-agentctl jwt create-key`"
    )]
    NotRsa {
        /// The key's algorithm OID.
        algorithm: String,
    },
    /// The key data does not decode.
    #[error("the JWT signing key does not decode as {format}: {reason}")]
    Decode {
        /// `PKCS#8` or `PKCS#1`.
        format: &'static str,
        /// What the decoder said.
        reason: String,
    },
    /// The key is too small.
    #[error("the JWT signing key has {bits} bits; at least {MIN_KEY_BITS} are required")]
    TooSmall {
        /// The key size.
        bits: usize,
    },
    /// Generating or encoding a key failed.
    #[error("cannot {action} the JWT signing key: {reason}")]
    Crypto {
        /// What was being done.
        action: &'static str,
        /// What the library said.
        reason: String,
    },
}

impl SigningKey {
    /// Loads a PEM key: PKCS#8 (`PRIVATE KEY`) or PKCS#1 (`RSA PRIVATE KEY`).
    ///
    /// # Errors
    ///
    /// [`KeyError`] for non-PEM data, another PEM kind, a non-RSA key or a key under 2048 bits.
    pub fn from_pem(pem: &str) -> Result<Self, KeyError> {
        let (label, der) = rsa::pkcs8::der::pem::decode_vec(pem.trim().as_bytes())
            .map_err(|e| KeyError::NotPem { reason: e.to_string() })?;
        let private = match label {
            "PRIVATE KEY" => match RsaPrivateKey::from_pkcs8_der(&der) {
                Ok(key) => key,
                Err(e) => {
                    return Err(match PrivateKeyInfo::try_from(der.as_slice()) {
                        Ok(info) if info.algorithm.oid.to_string() != RSA_ENCRYPTION_OID => {
                            KeyError::NotRsa { algorithm: info.algorithm.oid.to_string() }
                        }
                        _ => KeyError::Decode { format: "PKCS#8", reason: e.to_string() },
                    });
                }
            },
            "RSA PRIVATE KEY" => RsaPrivateKey::from_pkcs1_der(&der)
                .map_err(|e| KeyError::Decode { format: "PKCS#1", reason: e.to_string() })?,
            other => return Err(KeyError::UnexpectedPem { label: other.to_owned() }),
        };
        Self::from_rsa(private)
    }

    /// Loads a PEM key file.
    ///
    /// # Errors
    ///
    /// [`KeyError::Read`], or what [`SigningKey::from_pem`] reports.
    pub fn from_pem_file(path: &Path) -> Result<Self, KeyError> {
        let pem = std::fs::read_to_string(path).map_err(|source| KeyError::Read { path: path.to_owned(), source })?;
        Self::from_pem(&pem)
    }

    /// Generates a new RSA key of `bits` bits (slow: seconds for 4096 bits).
    ///
    /// # Errors
    ///
    /// [`KeyError::TooSmall`] under 2048 bits, [`KeyError::Crypto`] if generation fails.
    pub fn generate(bits: usize) -> Result<Self, KeyError> {
        if bits < MIN_KEY_BITS {
            return Err(KeyError::TooSmall { bits });
        }
        let private = RsaPrivateKey::new(&mut rsa::rand_core::OsRng, bits)
            .map_err(|e| KeyError::Crypto { action: "generate", reason: e.to_string() })?;
        Self::from_rsa(private)
    }

    fn from_rsa(private: RsaPrivateKey) -> Result<Self, KeyError> {
        let bits = private.size() * 8;
        if bits < MIN_KEY_BITS {
            return Err(KeyError::TooSmall { bits });
        }
        let pkcs1 = private.to_pkcs1_der().map_err(|e| KeyError::Crypto { action: "encode", reason: e.to_string() })?;
        let encoding = EncodingKey::from_rsa_der(pkcs1.as_bytes());
        let public = RsaPublicKey::from(&private);
        let decoding = DecodingKey::from_rsa_raw_components(&public.n().to_bytes_be(), &public.e().to_bytes_be());
        let ring = match ring::signature::RsaKeyPair::from_der(pkcs1.as_bytes()) {
            Ok(pair) => Some(Arc::new(pair)),
            Err(e) => {
                tracing::info!(reason = %e, "the JWT signing key is signed with the slower RustCrypto RSA");
                None
            }
        };
        Ok(Self { private, encoding, decoding, ring })
    }

    /// A signed JWT (`header.claims.signature`, base64url without padding) with `header` and
    /// `claims`; the header's `alg` must be RS512.
    pub(crate) fn sign_jwt<T: serde::Serialize>(
        &self,
        header: &jsonwebtoken::Header,
        claims: &T,
    ) -> Result<String, String> {
        use base64::Engine as _;
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let Some(pair) = self.ring.as_deref().filter(|_| header.alg == jsonwebtoken::Algorithm::RS512) else {
            return jsonwebtoken::encode(header, claims, &self.encoding).map_err(|e| e.to_string());
        };
        let header = serde_json::to_vec(header).map_err(|e| e.to_string())?;
        let claims = serde_json::to_vec(claims).map_err(|e| e.to_string())?;
        let message = format!("{}.{}", URL_SAFE_NO_PAD.encode(header), URL_SAFE_NO_PAD.encode(claims));
        let mut signature = vec![0; pair.public().modulus_len()];
        pair.sign(
            &ring::signature::RSA_PKCS1_SHA512,
            &ring::rand::SystemRandom::new(),
            message.as_bytes(),
            &mut signature,
        )
        .map_err(|_| "the RSA signature failed".to_owned())?;
        Ok(format!("{message}.{}", URL_SAFE_NO_PAD.encode(signature)))
    }

    /// The key as PKCS#8 PEM, the format of upstream's `jwt.key`.
    ///
    /// # Errors
    ///
    /// [`KeyError::Crypto`] if encoding fails.
    pub fn to_pkcs8_pem(&self) -> Result<String, KeyError> {
        self.private
            .to_pkcs8_pem(LineEnding::LF)
            .map(|pem| pem.to_string())
            .map_err(|e| KeyError::Crypto { action: "encode", reason: e.to_string() })
    }

    /// The key size in bits.
    #[must_use]
    pub fn bits(&self) -> usize {
        self.private.size() * 8
    }

    /// Upper-case hex SHA-256 of the public modulus: names the key in logs without revealing it.
    #[must_use]
    pub fn fingerprint(&self) -> String {
        hex::encode_upper(Sha256::digest(self.private.n().to_bytes_be()))
    }

    pub(crate) fn decoding(&self) -> &DecodingKey {
        &self.decoding
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("bits", &self.bits())
            .field("fingerprint", &self.fingerprint())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = include_str!("../../tests/fixtures/jwt-key-a.pem");
    const KEY_A_PKCS1: &str = include_str!("../../tests/fixtures/jwt-key-a-pkcs1.pem");
    const EC_KEY: &str = include_str!("../../tests/fixtures/ec-key.pem");

    #[test]
    fn pkcs8_and_pkcs1_load_the_same_key() {
        let a = SigningKey::from_pem(KEY_A).expect("pkcs8");
        let b = SigningKey::from_pem(KEY_A_PKCS1).expect("pkcs1");
        assert_eq!(a.bits(), 2048);
        assert_eq!(a.fingerprint(), b.fingerprint());
        let again = SigningKey::from_pem(&a.to_pkcs8_pem().expect("pem")).expect("round trip");
        assert_eq!(again.fingerprint(), a.fingerprint());
        assert!(!format!("{a:?}").contains("BEGIN"));
    }

    #[test]
    fn ring_signs_the_same_token_as_rustcrypto_and_it_verifies() {
        let key = SigningKey::from_pem(KEY_A).expect("pkcs8");
        assert!(key.ring.is_some(), "ring accepts a 2048-bit key with e = 65537");
        let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS512);
        let claims = serde_json::json!({"sub": "agent-1", "exp": 4_000_000_000_u64, "aud": "x"});
        let ours = key.sign_jwt(&header, &claims).expect("ring");
        let reference = jsonwebtoken::encode(&header, &claims, &key.encoding).expect("rust_crypto");
        assert_eq!(ours, reference, "PKCS#1 v1.5 signatures are deterministic");
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS512);
        validation.set_audience(&["x"]);
        jsonwebtoken::decode::<serde_json::Value>(&ours, key.decoding(), &validation).expect("verifies");
    }

    #[test]
    fn non_rsa_and_non_keys_are_explained() {
        assert!(matches!(SigningKey::from_pem(EC_KEY), Err(KeyError::NotRsa { .. })));
        assert!(matches!(SigningKey::from_pem("hello"), Err(KeyError::NotPem { .. })));
        let cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(matches!(SigningKey::from_pem(cert), Err(KeyError::UnexpectedPem { .. })));
        assert!(matches!(SigningKey::generate(1024), Err(KeyError::TooSmall { bits: 1024 })));
    }
}
