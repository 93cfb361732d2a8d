//! Session token kinds and claims, as upstream issues them (`internal/issuer/jwt.go`), plus two
//! additive claims Go peers ignore: `cnf` (the transport binding) and `amr` (the method).
//!
//! ```json
//! { "iss": "argocd-agent-server",
//!   "sub": "{\"clientID\":\"agent-1\",\"mode\":\"managed\"}",
//!   "aud": ["argocd-agent-server-access"],
//!   "exp": 1700000300, "nbf": 1700000000, "iat": 1700000000,
//!   "jti": "5f0c…",
//!   "cnf": { "x5t#S256": "<base64url SHA-256 of the client certificate DER>" },
//!   "amr": ["mtls"] }
//! ```
//!
//! `cnf` follows RFC 7800; `x5t#S256` is RFC 8705's certificate-bound token confirmation. A mesh
//! session binds to `{"spiffe_id": "spiffe://…"}` instead; `header:<name>:<regex>` sessions whose
//! agent name is not taken from a SPIFFE ID bind to `{"hdr#S256": "<base64url SHA-256 of the
//! header value>"}` (a private confirmation method, in the style of RFC 8705's).

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

use crate::identity::{AgentMode, AgentName, Binding};

/// Access token lifetime (upstream `accessTokenValidity`).
pub const ACCESS_TOKEN_LIFETIME: Duration = Duration::from_secs(5 * 60);

/// Refresh token lifetime (upstream `refreshTokenValidity`).
pub const REFRESH_TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);

/// `RefreshToken` issues a new refresh token only when the old one expires within this
/// (upstream `refreshTokenAutoRefresh`); otherwise the response's refresh token is empty.
pub const REFRESH_TOKEN_RENEW_WITHIN: Duration = Duration::from_secs(10 * 60);

/// The issuer name (`iss`) upstream's principal uses; audiences derive from it.
pub const DEFAULT_ISSUER: &str = "argocd-agent-server";

/// The three kinds of token, told apart by audience.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// Sent on every protected call (`<issuer>-access`).
    Access,
    /// Exchanged for new tokens (`<issuer>-refresh`).
    Refresh,
    /// Argo CD's bearer token for the resource proxy (`<issuer>-resource-proxy`); `sub` is the
    /// bare agent name, no `exp`, not bound.
    ResourceProxy,
}

impl TokenKind {
    /// The audience of this kind for `issuer`.
    #[must_use]
    pub fn audience(self, issuer: &str) -> String {
        let suffix = match self {
            Self::Access => "access",
            Self::Refresh => "refresh",
            Self::ResourceProxy => "resource-proxy",
        };
        format!("{issuer}-{suffix}")
    }
}

impl fmt::Display for TokenKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Access => "access",
            Self::Refresh => "refresh",
            Self::ResourceProxy => "resource-proxy",
        })
    }
}

/// The JSON carried in `sub` of access and refresh tokens (upstream `auth.AuthSubject`), in
/// upstream's field order so the string is byte-identical.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentSubject {
    /// The agent name.
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// `managed` or `autonomous`.
    pub mode: String,
}

impl AgentSubject {
    /// The subject of `name` in `mode`.
    #[must_use]
    pub fn new(name: &AgentName, mode: AgentMode) -> Self {
        Self { client_id: name.as_str().to_owned(), mode: mode.as_str().to_owned() }
    }
}

/// The `cnf` claim: what the token is bound to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confirmation {
    /// Base64url (no padding) SHA-256 of the client certificate DER (RFC 8705).
    #[serde(rename = "x5t#S256", default, skip_serializing_if = "Option::is_none")]
    pub x5t_s256: Option<String>,
    /// A SPIFFE ID (mesh sessions).
    #[serde(rename = "spiffe_id", default, skip_serializing_if = "Option::is_none")]
    pub spiffe_id: Option<String>,
    /// Base64url (no padding) SHA-256 of a forwarded identity header's value (`header:` sessions
    /// not identified by a SPIFFE ID).
    #[serde(rename = "hdr#S256", default, skip_serializing_if = "Option::is_none")]
    pub hdr_s256: Option<String>,
}

impl From<&Binding> for Confirmation {
    fn from(binding: &Binding) -> Self {
        match binding {
            Binding::CertificateSha256(hash) => {
                Self { x5t_s256: Some(URL_SAFE_NO_PAD.encode(hash)), ..Self::default() }
            }
            Binding::SpiffeId(id) => Self { spiffe_id: Some(id.clone()), ..Self::default() },
            Binding::HeaderSha256(hash) => Self { hdr_s256: Some(URL_SAFE_NO_PAD.encode(hash)), ..Self::default() },
        }
    }
}

impl Confirmation {
    /// The binding, if the claim holds exactly one well-formed confirmation.
    ///
    /// # Errors
    ///
    /// A description of what is wrong with the claim.
    pub fn binding(&self) -> Result<Binding, String> {
        let sha256 = |value: &str, name: &str| -> Result<[u8; 32], String> {
            let bytes = URL_SAFE_NO_PAD.decode(value).map_err(|e| format!("cnf {name} is not base64url: {e}"))?;
            bytes.try_into().map_err(|_| format!("cnf {name} is not a SHA-256 hash"))
        };
        match (&self.x5t_s256, &self.spiffe_id, &self.hdr_s256) {
            (Some(x5t), None, None) => Ok(Binding::CertificateSha256(sha256(x5t, "x5t#S256")?)),
            (None, Some(id), None) if !id.is_empty() => Ok(Binding::SpiffeId(id.clone())),
            (None, None, Some(hdr)) => Ok(Binding::HeaderSha256(sha256(hdr, "hdr#S256")?)),
            (None, None | Some(_), None) => Err("cnf claim holds no confirmation".to_owned()),
            _ => Err("cnf claim holds two confirmations".to_owned()),
        }
    }
}

/// The claims of every token this crate issues. Field order is upstream's (`jwt.RegisteredClaims`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Issuer.
    pub iss: String,
    /// Subject: [`AgentSubject`] JSON, or the bare agent name for resource-proxy tokens.
    pub sub: String,
    /// Audience; serialized as a one-element array as Go's `jwt.ClaimStrings` does, read from a
    /// string or an array.
    #[serde(with = "audience")]
    pub aud: Vec<String>,
    /// Expiry, seconds since the epoch; absent on resource-proxy tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<i64>,
    /// Not before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
    /// Issued at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<i64>,
    /// Token id (UUID).
    #[serde(default)]
    pub jti: String,
    /// Transport binding (additive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cnf: Option<Confirmation>,
    /// Authentication methods: the one `Authenticate` ran (additive, RFC 8176 `amr`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub amr: Vec<String>,
}

mod audience {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }

    pub(super) fn serialize<S: Serializer>(aud: &[String], s: S) -> Result<S::Ok, S::Error> {
        aud.serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        Ok(match OneOrMany::deserialize(d)? {
            OneOrMany::One(a) => vec![a],
            OneOrMany::Many(a) => a,
        })
    }
}

/// The tokens `Authenticate` hands out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedTokens {
    /// The access token.
    pub access_token: String,
    /// The refresh token.
    pub refresh_token: String,
}

/// The tokens `RefreshToken` hands out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefreshedTokens {
    /// A new access token.
    pub access_token: String,
    /// A new refresh token when the old one was close to expiry, else `None` (empty on the wire).
    pub refresh_token: Option<String>,
    /// When the new access token expires.
    pub access_expires_at: std::time::SystemTime,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_json_is_upstreams() {
        let name = AgentName::new("agent-1").expect("name");
        let json = serde_json::to_string(&AgentSubject::new(&name, AgentMode::Managed)).expect("json");
        assert_eq!(json, r#"{"clientID":"agent-1","mode":"managed"}"#);
    }

    #[test]
    fn audience_reads_string_or_array_and_writes_array() {
        let claims: Claims = serde_json::from_str(r#"{"iss":"i","sub":"s","aud":"a","jti":"j"}"#).expect("string aud");
        assert_eq!(claims.aud, vec!["a".to_owned()]);
        let json = serde_json::to_value(&claims).expect("json");
        assert_eq!(json["aud"], serde_json::json!(["a"]));
        assert!(json.get("cnf").is_none() && json.get("exp").is_none());
    }

    #[test]
    fn confirmation_round_trips_bindings() {
        let cert = Binding::certificate(b"der");
        assert_eq!(Confirmation::from(&cert).binding(), Ok(cert));
        let id = Binding::SpiffeId("spiffe://cluster.local/ns/argocd/sa/agent-1".into());
        let json = serde_json::to_string(&Confirmation::from(&id)).expect("json");
        assert_eq!(json, r#"{"spiffe_id":"spiffe://cluster.local/ns/argocd/sa/agent-1"}"#);
        assert_eq!(Confirmation::from(&id).binding(), Ok(id));
        assert!(Confirmation::default().binding().is_err());
        let short = Confirmation { x5t_s256: Some("AAAA".into()), ..Confirmation::default() };
        assert!(short.binding().is_err());
        let header = Binding::header_value(b"agent-1.ns.serviceaccount.identity.linkerd.cluster.local");
        let json = serde_json::to_value(Confirmation::from(&header)).expect("json");
        assert!(json.get("hdr#S256").is_some(), "{json}");
        assert_eq!(Confirmation::from(&header).binding(), Ok(header.clone()));
        let two = Confirmation { spiffe_id: Some("spiffe://td/x".into()), ..Confirmation::from(&header) };
        assert_eq!(two.binding(), Err("cnf claim holds two confirmations".to_owned()));
    }

    #[test]
    fn audiences_derive_from_the_issuer() {
        assert_eq!(TokenKind::Access.audience(DEFAULT_ISSUER), "argocd-agent-server-access");
        assert_eq!(TokenKind::Refresh.audience(DEFAULT_ISSUER), "argocd-agent-server-refresh");
        assert_eq!(TokenKind::ResourceProxy.audience(DEFAULT_ISSUER), "argocd-agent-server-resource-proxy");
    }
}
