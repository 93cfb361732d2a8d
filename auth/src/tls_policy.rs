//! Upstream's TLS knobs (`--tls-min-version`, `--tls-max-version`, `--tls-ciphersuites`), with
//! Go's names, applied to rustls.
//!
//! rustls offers TLS 1.2 and 1.3 only: a minimum of `tls1.1` therefore means 1.2 here, and a
//! maximum below 1.2 is refused (nothing would be left to negotiate). Cipher suites take Go's
//! `crypto/tls` names (`TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256`, `TLS_AES_128_GCM_SHA256`, ...);
//! [`cipher_suite_names`] lists the ones offered. As in Go, a list that names no TLS 1.3 suite
//! leaves TLS 1.3's suites as they are (Go cannot configure them at all); naming some restricts
//! TLS 1.3 to those as well.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{SupportedCipherSuite, SupportedProtocolVersion};

/// A TLS protocol version by Go's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    /// `tls1.1` (never negotiated here: rustls offers 1.2 and 1.3).
    Tls11,
    /// `tls1.2`
    Tls12,
    /// `tls1.3`
    Tls13,
}

impl std::str::FromStr for TlsVersion {
    type Err = TlsPolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tls1.1" => Ok(Self::Tls11),
            "tls1.2" => Ok(Self::Tls12),
            "tls1.3" => Ok(Self::Tls13),
            other => Err(TlsPolicyError::UnknownVersion(other.to_owned())),
        }
    }
}

/// Why a TLS policy cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsPolicyError {
    /// A version name that is not `tls1.1`, `tls1.2` or `tls1.3`.
    #[error("unknown TLS version {0:?}: use tls1.1, tls1.2 or tls1.3")]
    UnknownVersion(String),
    /// The maximum is below TLS 1.2.
    #[error("TLS version at most {0:?}: only TLS 1.2 and 1.3 are offered (older versions are insecure)")]
    MaxTooLow(String),
    /// The minimum is above the maximum.
    #[error("the minimum TLS version is above the maximum")]
    Inverted,
    /// A cipher suite name that is not offered.
    #[error("unknown or unsupported cipher suite {0:?} (see `--tls-ciphersuites list`)")]
    UnknownCipherSuite(String),
    /// The suites named leave nothing for an allowed version.
    #[error("no cipher suite named in the list can be used with TLS {0}")]
    NoSuiteForVersion(&'static str),
}

/// Go's name of each suite rustls (ring) offers, TLS 1.3 first.
const NAMES: [(&str, rustls::CipherSuite); 9] = [
    ("TLS_AES_128_GCM_SHA256", rustls::CipherSuite::TLS13_AES_128_GCM_SHA256),
    ("TLS_AES_256_GCM_SHA384", rustls::CipherSuite::TLS13_AES_256_GCM_SHA384),
    ("TLS_CHACHA20_POLY1305_SHA256", rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256),
    ("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256),
    ("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256),
    ("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", rustls::CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256),
];

/// Go's older aliases of two suites.
const ALIASES: [(&str, &str); 2] = [
    ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305", "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"),
];

/// The cipher suite names `--tls-ciphersuites` accepts (what `--tls-ciphersuites list` prints).
#[must_use]
pub fn cipher_suite_names() -> Vec<&'static str> {
    NAMES.iter().map(|(n, _)| *n).collect()
}

/// TLS versions and cipher suites for a server or a client.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsPolicy {
    /// The lowest version (`None`: TLS 1.2).
    pub min: Option<TlsVersion>,
    /// The highest version (`None`: TLS 1.3).
    pub max: Option<TlsVersion>,
    /// Go's names of the suites allowed (empty: all offered).
    pub cipher_suites: Vec<String>,
}

impl TlsPolicy {
    /// From the flags' text (an empty text is unset).
    ///
    /// # Errors
    /// A name is unknown, or the combination leaves nothing to negotiate.
    pub fn parse(min: &str, max: &str, cipher_suites: &[String]) -> Result<Self, TlsPolicyError> {
        let version = |s: &str| if s.is_empty() { Ok(None) } else { s.parse().map(Some) };
        let policy = Self { min: version(min)?, max: version(max)?, cipher_suites: cipher_suites.to_vec() };
        policy.versions()?;
        policy.provider()?;
        Ok(policy)
    }

    /// Whether nothing is restricted.
    #[must_use]
    pub fn is_default(&self) -> bool {
        self.min.is_none() && self.max.is_none() && self.cipher_suites.is_empty()
    }

    /// The protocol versions allowed, newest first.
    ///
    /// # Errors
    /// The maximum is below TLS 1.2, or above the minimum.
    pub fn versions(&self) -> Result<Vec<&'static SupportedProtocolVersion>, TlsPolicyError> {
        let min = self.min.unwrap_or(TlsVersion::Tls12).max(TlsVersion::Tls12);
        let max = self.max.unwrap_or(TlsVersion::Tls13);
        if max < TlsVersion::Tls12 {
            return Err(TlsPolicyError::MaxTooLow("tls1.1".into()));
        }
        if min > max {
            return Err(TlsPolicyError::Inverted);
        }
        let mut out = Vec::new();
        if max >= TlsVersion::Tls13 {
            out.push(&rustls::version::TLS13);
        }
        if min <= TlsVersion::Tls12 {
            out.push(&rustls::version::TLS12);
        }
        Ok(out)
    }

    /// The ring crypto provider with only the allowed cipher suites.
    ///
    /// # Errors
    /// A suite name is unknown, or an allowed version is left without a suite.
    pub fn provider(&self) -> Result<Arc<CryptoProvider>, TlsPolicyError> {
        let mut provider = rustls::crypto::ring::default_provider();
        if self.cipher_suites.is_empty() {
            return Ok(Arc::new(provider));
        }
        let mut wanted = Vec::new();
        for name in &self.cipher_suites {
            let name = name.trim();
            let canonical = ALIASES.iter().find(|(alias, _)| *alias == name).map_or(name, |(_, n)| *n);
            let suite = NAMES
                .iter()
                .find(|(n, _)| *n == canonical)
                .map(|(_, s)| *s)
                .ok_or_else(|| TlsPolicyError::UnknownCipherSuite(name.to_owned()))?;
            wanted.push(suite);
        }
        let is13 = |s: &SupportedCipherSuite| matches!(s, SupportedCipherSuite::Tls13(_));
        let names_tls13 = provider.cipher_suites.iter().any(|s| is13(s) && wanted.contains(&s.suite()));
        provider.cipher_suites.retain(|s| wanted.contains(&s.suite()) || (is13(s) && !names_tls13));
        // TLS 1.3 always keeps a suite; TLS 1.2 alone must keep one too.
        let only12 = self.versions()? == [&rustls::version::TLS12];
        if only12 && provider.cipher_suites.iter().all(is13) {
            return Err(TlsPolicyError::NoSuiteForVersion("1.2"));
        }
        Ok(Arc::new(provider))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_follow_gos_names_and_never_go_below_tls12() {
        let p = |min: &str, max: &str| TlsPolicy::parse(min, max, &[]).map(|p| p.versions().unwrap_or_default().len());
        assert_eq!(p("", ""), Ok(2));
        assert_eq!(p("tls1.3", ""), Ok(1));
        assert_eq!(p("tls1.1", "tls1.2"), Ok(1), "a minimum of 1.1 is 1.2 here");
        assert_eq!(p("", "tls1.1"), Err(TlsPolicyError::MaxTooLow("tls1.1".into())));
        assert_eq!(p("tls1.3", "tls1.2"), Err(TlsPolicyError::Inverted));
        assert_eq!(p("ssl3", ""), Err(TlsPolicyError::UnknownVersion("ssl3".into())));
    }

    #[test]
    fn cipher_suites_take_gos_names_and_leave_tls13_alone_unless_named() {
        let suites = |names: &[&str]| {
            let names: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
            TlsPolicy::parse("", "", &names).map(|p| {
                p.provider()
                    .map(|pr| pr.cipher_suites.iter().map(|s| s.suite()).collect::<Vec<_>>())
                    .unwrap_or_default()
            })
        };
        let only12 = suites(&["TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"]).unwrap_or_default();
        assert!(only12.contains(&rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384));
        assert!(!only12.contains(&rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256));
        assert!(only12.contains(&rustls::CipherSuite::TLS13_AES_128_GCM_SHA256), "TLS 1.3 suites stay, as in Go");
        let named13 = suites(&["TLS_AES_256_GCM_SHA384", "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305"]).unwrap_or_default();
        assert_eq!(
            named13,
            [
                rustls::CipherSuite::TLS13_AES_256_GCM_SHA384,
                rustls::CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
            ]
        );
        assert_eq!(
            suites(&["TLS_RSA_WITH_RC4_128_SHA"]),
            Err(TlsPolicyError::UnknownCipherSuite("TLS_RSA_WITH_RC4_128_SHA".into()))
        );
        assert!(cipher_suite_names().iter().all(|n| suites(&[n]).is_ok()));
        let only13 = ["TLS_AES_128_GCM_SHA256".to_owned()];
        assert_eq!(TlsPolicy::parse("", "tls1.2", &only13).err(), Some(TlsPolicyError::NoSuiteForVersion("1.2")));
    }
}
