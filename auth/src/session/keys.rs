//! The principal's JWT signing key. RSA by default, as upstream requires (it signs RS512 and
//! panics on other key types); or ECDSA P-256, signing ES256 (`argocd-agentctl jwt create-key
//! --type ecdsa-p256`): a signature costs a fraction of an RSA-4096 one, which bounds how fast a
//! principal can sign agents in (two tokens per `Authenticate`) and refresh them. Only the
//! principals sharing the key read tokens; agents treat them as opaque, so the key type is the
//! hub's choice, except that an upstream principal sharing the key (a cross-hub pair) needs RSA.
//! Loaded from PKCS#8 PEM (`jwt.key` of secret `argocd-agent-jwt`, or `--jwt-key`), PKCS#1 PEM
//! (RSA), or generated (`--insecure-jwt-generate`, RSA).

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
/// The OID of `id-ecPublicKey`.
const EC_PUBLIC_KEY_OID: &str = "1.2.840.10045.2.1";

/// A key pair that signs and verifies session tokens: RSA (RS512) or ECDSA P-256 (ES256).
///
/// RSA signing goes through `ring` (assembly Montgomery arithmetic: an RSA-4096 signature costs
/// a fraction of what the pure-Rust `rsa` crate needs, and `Authenticate` signs two tokens);
/// keys `ring` refuses (it takes two-prime keys of 2048 to 4096 bits with a public exponent
/// of at least 65537) are signed by jsonwebtoken's RustCrypto backend. PKCS#1 v1.5 signatures
/// are deterministic, so both give the same token. ECDSA P-256 keys sign with `ring` too.
#[derive(Clone)]
pub struct SigningKey {
    material: Material,
    encoding: EncodingKey,
    decoding: DecodingKey,
}

#[derive(Clone)]
enum Material {
    Rsa { private: Box<RsaPrivateKey>, ring: Option<Arc<ring::signature::RsaKeyPair>> },
    EcP256 { pkcs8: Arc<Vec<u8>>, pair: Arc<ring::signature::EcdsaKeyPair> },
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
        "the JWT signing key is neither RSA nor ECDSA P-256 (PKCS#8 algorithm {algorithm}); tokens are \
         RS512 or ES256: create a key with `argocd-agentctl jwt create-key [--type ecdsa-p256]`"
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
                        Ok(info) if info.algorithm.oid.to_string() == EC_PUBLIC_KEY_OID => {
                            return Self::from_ec_pkcs8(der);
                        }
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

    /// An ECDSA P-256 key from its PKCS#8 DER.
    fn from_ec_pkcs8(der: Vec<u8>) -> Result<Self, KeyError> {
        use base64::Engine as _;
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let pair = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &der,
            &ring::rand::SystemRandom::new(),
        )
        .map_err(|e| KeyError::Decode {
            format: "PKCS#8 ECDSA P-256 (other curves are not supported)",
            reason: e.to_string(),
        })?;
        // The public key is the uncompressed point: 0x04 || x || y.
        let point = ring::signature::KeyPair::public_key(&pair).as_ref().to_vec();
        let (x, y) = point.get(1..33).zip(point.get(33..65)).ok_or_else(|| KeyError::Decode {
            format: "PKCS#8 ECDSA P-256",
            reason: "the public key is not an uncompressed P-256 point".to_owned(),
        })?;
        let decoding = DecodingKey::from_ec_components(&URL_SAFE_NO_PAD.encode(x), &URL_SAFE_NO_PAD.encode(y))
            .map_err(|e| KeyError::Crypto { action: "load", reason: e.to_string() })?;
        let encoding = EncodingKey::from_ec_der(&der);
        Ok(Self { material: Material::EcP256 { pkcs8: Arc::new(der), pair: Arc::new(pair) }, encoding, decoding })
    }

    /// The JWT algorithm this key signs with: RS512 (RSA) or ES256 (ECDSA P-256).
    #[must_use]
    pub fn algorithm(&self) -> jsonwebtoken::Algorithm {
        match self.material {
            Material::Rsa { .. } => jsonwebtoken::Algorithm::RS512,
            Material::EcP256 { .. } => jsonwebtoken::Algorithm::ES256,
        }
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
        Ok(Self { material: Material::Rsa { private: Box::new(private), ring }, encoding, decoding })
    }

    /// A signed JWT (`header.claims.signature`, base64url without padding) with `header` and
    /// `claims`; the header's `alg` must be [`Self::algorithm`].
    pub(crate) fn sign_jwt<T: serde::Serialize>(
        &self,
        header: &jsonwebtoken::Header,
        claims: &T,
    ) -> Result<String, String> {
        use base64::Engine as _;
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let rng = ring::rand::SystemRandom::new();
        let signing_input = || -> Result<String, String> {
            let header = serde_json::to_vec(header).map_err(|e| e.to_string())?;
            let claims = serde_json::to_vec(claims).map_err(|e| e.to_string())?;
            Ok(format!("{}.{}", URL_SAFE_NO_PAD.encode(header), URL_SAFE_NO_PAD.encode(claims)))
        };
        match (&self.material, header.alg) {
            (Material::Rsa { ring: Some(pair), .. }, jsonwebtoken::Algorithm::RS512) => {
                let message = signing_input()?;
                let mut signature = vec![0; pair.public().modulus_len()];
                pair.sign(&ring::signature::RSA_PKCS1_SHA512, &rng, message.as_bytes(), &mut signature)
                    .map_err(|_| "the RSA signature failed".to_owned())?;
                Ok(format!("{message}.{}", URL_SAFE_NO_PAD.encode(signature)))
            }
            (Material::EcP256 { pair, .. }, jsonwebtoken::Algorithm::ES256) => {
                let message = signing_input()?;
                // FIXED signing: r || s, 64 bytes, as JWS ES256 wants.
                let signature =
                    pair.sign(&rng, message.as_bytes()).map_err(|_| "the ECDSA signature failed".to_owned())?;
                Ok(format!("{message}.{}", URL_SAFE_NO_PAD.encode(signature.as_ref())))
            }
            _ => jsonwebtoken::encode(header, claims, &self.encoding).map_err(|e| e.to_string()),
        }
    }

    /// The key as PKCS#8 PEM, the format of upstream's `jwt.key`.
    ///
    /// # Errors
    ///
    /// [`KeyError::Crypto`] if encoding fails.
    pub fn to_pkcs8_pem(&self) -> Result<String, KeyError> {
        let encoded = match &self.material {
            Material::Rsa { private, .. } => private.to_pkcs8_pem(LineEnding::LF).map(|pem| pem.to_string()),
            Material::EcP256 { pkcs8, .. } => {
                rsa::pkcs8::der::pem::encode_string("PRIVATE KEY", LineEnding::LF, pkcs8).map_err(Into::into)
            }
        };
        encoded.map_err(|e| KeyError::Crypto { action: "encode", reason: e.to_string() })
    }

    /// The key size in bits (256 for ECDSA P-256).
    #[must_use]
    pub fn bits(&self) -> usize {
        match &self.material {
            Material::Rsa { private, .. } => private.size() * 8,
            Material::EcP256 { .. } => 256,
        }
    }

    /// Upper-case hex SHA-256 of the public modulus (RSA) or point (ECDSA): names the key in
    /// logs without revealing it.
    #[must_use]
    pub fn fingerprint(&self) -> String {
        match &self.material {
            Material::Rsa { private, .. } => hex::encode_upper(Sha256::digest(private.n().to_bytes_be())),
            Material::EcP256 { pair, .. } => {
                hex::encode_upper(Sha256::digest(ring::signature::KeyPair::public_key(pair.as_ref()).as_ref()))
            }
        }
    }

    pub(crate) fn decoding(&self) -> &DecodingKey {
        &self.decoding
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("algorithm", &self.algorithm())
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
        assert!(
            matches!(key.material, Material::Rsa { ring: Some(_), .. }),
            "ring accepts a 2048-bit key with e = 65537"
        );
        let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS512);
        let claims = serde_json::json!({"sub": "agent-1", "exp": 4_000_000_000_u64, "aud": "x"});
        let ours = key.sign_jwt(&header, &claims).expect("ring");
        let reference = jsonwebtoken::encode(&header, &claims, &key.encoding).expect("rust_crypto");
        assert_eq!(ours, reference, "PKCS#1 v1.5 signatures are deterministic");
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS512);
        validation.set_audience(&["x"]);
        jsonwebtoken::decode::<serde_json::Value>(&ours, key.decoding(), &validation).expect("verifies");
    }

    /// Ed25519, PKCS#8 (`openssl genpkey -algorithm ed25519`): neither RSA nor ECDSA P-256.
    const ED25519_KEY: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIIpKEcQ6oND+Ux229ynKSMY2oa7aAPKTBlxnN+UWpWB6
-----END PRIVATE KEY-----
";

    #[test]
    fn an_ecdsa_p256_key_signs_es256_tokens_that_verify() {
        let key = SigningKey::from_pem(EC_KEY).expect("P-256 PKCS#8");
        assert_eq!((key.algorithm(), key.bits()), (jsonwebtoken::Algorithm::ES256, 256));
        let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        let claims = serde_json::json!({"sub": "agent-1", "exp": 4_000_000_000_u64, "aud": "x"});
        let ours = key.sign_jwt(&header, &claims).expect("ring");
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
        validation.set_audience(&["x"]);
        jsonwebtoken::decode::<serde_json::Value>(&ours, key.decoding(), &validation).expect("verifies");
        let reference = jsonwebtoken::encode(&header, &claims, &key.encoding).expect("rust_crypto");
        jsonwebtoken::decode::<serde_json::Value>(&reference, key.decoding(), &validation).expect("theirs verifies");
        let again = SigningKey::from_pem(&key.to_pkcs8_pem().expect("pem")).expect("round trip");
        assert_eq!(again.fingerprint(), key.fingerprint());
        let mut tampered = ours.clone();
        tampered.replace_range(ours.len() - 4.., "AAAA");
        assert!(jsonwebtoken::decode::<serde_json::Value>(&tampered, key.decoding(), &validation).is_err());
    }

    #[test]
    fn non_rsa_and_non_keys_are_explained() {
        assert!(matches!(SigningKey::from_pem(ED25519_KEY), Err(KeyError::NotRsa { .. })));
        assert!(matches!(SigningKey::from_pem("hello"), Err(KeyError::NotPem { .. })));
        let cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(matches!(SigningKey::from_pem(cert), Err(KeyError::UnexpectedPem { .. })));
        assert!(matches!(SigningKey::generate(1024), Err(KeyError::TooSmall { bits: 1024 })));
    }
}
