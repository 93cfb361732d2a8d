//! Private keys for the PKI: the algorithms upstream offers (`--key-algorithm`, `--key-size`),
//! key generation, and loading keys that we or upstream's Go tooling wrote into secrets.
//!
//! Signing is ring's (through rcgen). ring cannot *generate* RSA keys, so RSA keys are generated
//! with RustCrypto's `rsa` crate and handed to ring as PKCS#8; everything is written as PKCS#8 PEM,
//! as upstream does (`internal/tlsutil/keygen.go`).

use anyhow::{Context as _, bail};
use rcgen::KeyPair;

/// Upstream's default `--key-algorithm`.
pub const DEFAULT_KEY_ALGORITHM: &str = "rsa";
/// Upstream's default `--key-size` (RSA bits).
pub const DEFAULT_RSA_BITS: u32 = 4096;
/// RSA sizes upstream accepts.
const SUPPORTED_RSA_BITS: [u32; 3] = [2048, 3072, 4096];

/// A key algorithm chosen with `--key-algorithm` / `--key-size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAlgorithm {
    /// RSA with this many bits (2048, 3072 or 4096).
    Rsa(u32),
    /// ECDSA on P-256.
    EcdsaP256,
    /// ECDSA on P-384.
    EcdsaP384,
    /// Ed25519.
    Ed25519,
}

impl KeyAlgorithm {
    /// Parse upstream's flag values.
    ///
    /// # Errors
    /// An unknown algorithm, an unsupported RSA size, or `ecdsa-p521` (ring has no P-521 signer).
    pub fn parse(algorithm: &str, rsa_bits: u32) -> anyhow::Result<Self> {
        Ok(match algorithm {
            "rsa" => {
                if !SUPPORTED_RSA_BITS.contains(&rsa_bits) {
                    bail!("unsupported RSA key size {rsa_bits} (--key-size); supported values are 2048, 3072, 4096");
                }
                Self::Rsa(rsa_bits)
            }
            "ecdsa-p256" => Self::EcdsaP256,
            "ecdsa-p384" => Self::EcdsaP384,
            "ed25519" => Self::Ed25519,
            "ecdsa-p521" => bail!(
                "--key-algorithm ecdsa-p521 is not supported by this build (its signer, ring, has no P-521); \
                 use ecdsa-p384 or rsa"
            ),
            other => bail!(
                "unsupported key algorithm {other:?} (--key-algorithm); supported values are rsa, ecdsa-p256, \
                 ecdsa-p384, ed25519"
            ),
        })
    }

    /// Generate a fresh key pair.
    ///
    /// # Errors
    /// The random source or the key encoder fails.
    pub fn generate(self) -> anyhow::Result<KeyPair> {
        match self {
            Self::Rsa(bits) => {
                let der = generate_rsa_pkcs8_der(bits)?;
                KeyPair::try_from(der.as_slice()).context("cannot load the generated RSA key")
            }
            Self::EcdsaP256 => {
                KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).context("cannot generate an ECDSA P-256 key")
            }
            Self::EcdsaP384 => {
                KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).context("cannot generate an ECDSA P-384 key")
            }
            Self::Ed25519 => KeyPair::generate_for(&rcgen::PKCS_ED25519).context("cannot generate an Ed25519 key"),
        }
    }
}

/// Generate an RSA private key, PKCS#8 DER.
fn generate_rsa_pkcs8_der(bits: u32) -> anyhow::Result<Vec<u8>> {
    use rsa::pkcs8::EncodePrivateKey as _;
    let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, bits as usize)
        .with_context(|| format!("cannot generate an RSA-{bits} key"))?;
    let der = key.to_pkcs8_der().context("cannot encode the RSA key as PKCS#8")?;
    Ok(der.as_bytes().to_vec())
}

/// Generate an RSA private key as PKCS#8 PEM (what `jwt create-key` stores).
///
/// # Errors
/// The random source or the encoder fails.
pub fn generate_rsa_pkcs8_pem(bits: u32) -> anyhow::Result<String> {
    use rsa::pkcs8::EncodePrivateKey as _;
    let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, bits as usize)
        .with_context(|| format!("cannot generate an RSA-{bits} key"))?;
    let pem = key.to_pkcs8_pem(rsa::pkcs8::LineEnding::LF).context("cannot encode the RSA key as PKCS#8 PEM")?;
    Ok(pem.as_str().to_owned())
}

/// Load a PEM private key: PKCS#8 (`PRIVATE KEY`, what we and current upstream write) or PKCS#1
/// (`RSA PRIVATE KEY`, what older upstream releases wrote).
///
/// # Errors
/// The PEM is not a private key in one of those forms.
pub fn load_private_key_pem(pem: &str) -> anyhow::Result<KeyPair> {
    if pem.contains("-----BEGIN RSA PRIVATE KEY-----") {
        use rsa::pkcs1::DecodeRsaPrivateKey as _;
        use rsa::pkcs8::EncodePrivateKey as _;
        let key = rsa::RsaPrivateKey::from_pkcs1_pem(pem).context("cannot parse the PKCS#1 RSA private key")?;
        let der = key.to_pkcs8_der().context("cannot convert the RSA key to PKCS#8")?;
        return KeyPair::try_from(der.as_bytes()).context("cannot load the RSA private key");
    }
    if pem.contains("-----BEGIN EC PRIVATE KEY-----") {
        bail!(
            "SEC1 (\"EC PRIVATE KEY\") keys are not supported; convert the key to PKCS#8 \
             (openssl pkcs8 -topk8 -nocrypt) and store that"
        );
    }
    KeyPair::from_pem(pem).context("cannot parse the private key (expected PKCS#8 PEM, \"PRIVATE KEY\")")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_upstream_flag_values() {
        assert_eq!(KeyAlgorithm::parse("rsa", 4096).unwrap(), KeyAlgorithm::Rsa(4096));
        assert_eq!(KeyAlgorithm::parse("ecdsa-p256", 4096).unwrap(), KeyAlgorithm::EcdsaP256);
        assert_eq!(KeyAlgorithm::parse("ed25519", 0).unwrap(), KeyAlgorithm::Ed25519);
        assert!(KeyAlgorithm::parse("rsa", 1024).unwrap_err().to_string().contains("--key-size"));
        assert!(KeyAlgorithm::parse("dsa", 0).unwrap_err().to_string().contains("--key-algorithm"));
        assert!(KeyAlgorithm::parse("ecdsa-p521", 0).is_err());
    }

    #[test]
    fn generated_keys_round_trip_through_pem() {
        for alg in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::EcdsaP384, KeyAlgorithm::Ed25519] {
            let key = alg.generate().unwrap();
            let again = load_private_key_pem(&key.serialize_pem()).unwrap();
            assert_eq!(key.public_key_raw(), again.public_key_raw());
        }
    }

    #[test]
    fn pkcs1_rsa_keys_load() {
        use rsa::pkcs1::EncodeRsaPrivateKey as _;
        let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).unwrap();
        let pem = key.to_pkcs1_pem(rsa::pkcs1::LineEnding::LF).unwrap();
        let pair = load_private_key_pem(&pem).unwrap();
        assert_eq!(pair.algorithm(), &rcgen::PKCS_RSA_SHA256);
    }
}
