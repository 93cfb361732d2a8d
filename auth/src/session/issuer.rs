//! Issuing and verifying session tokens: RS512 JWTs signed with the principal's key, as upstream
//! does (`internal/issuer/jwt.go`). Verification checks the signature with jsonwebtoken, then the
//! claims here against an injectable [`Clock`], so every failure gets its own message.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Header, Validation};

use super::keys::SigningKey;
use super::token::{
    ACCESS_TOKEN_LIFETIME, AgentSubject, Claims, Confirmation, DEFAULT_ISSUER, IssuedTokens, REFRESH_TOKEN_LIFETIME,
    REFRESH_TOKEN_RENEW_WITHIN, RefreshedTokens, TokenKind,
};
use crate::error::AuthError;
use crate::identity::{AgentIdentity, AgentMode, AgentName, Binding};

/// The only algorithm upstream signs with and accepts (RSA keys; an ECDSA P-256 key signs ES256,
/// [`SigningKey::algorithm`]).
pub const ALGORITHM: Algorithm = Algorithm::RS512;

// === Clock ===

/// Where the issuer reads the time; tests substitute a [`ManualClock`].
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told; clones share the time.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<Mutex<SystemTime>>);

impl ManualClock {
    /// A clock showing `now`.
    #[must_use]
    pub fn new(now: SystemTime) -> Self {
        Self(Arc::new(Mutex::new(now)))
    }

    /// Sets the time.
    pub fn set(&self, now: SystemTime) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = now;
    }

    /// Moves the time forward.
    pub fn advance(&self, by: Duration) {
        let mut now = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *now += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

// === TokenLifetimes ===

/// How long tokens live; the defaults are upstream's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenLifetimes {
    /// Access token lifetime (5 min).
    pub access: Duration,
    /// Refresh token lifetime (24 h).
    pub refresh: Duration,
    /// A refresh renews the refresh token only when it expires within this (10 min).
    pub renew_refresh_within: Duration,
}

/// An access-token lifetime outside what [`TokenLifetimes::with_access`] accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "an access-token lifetime of {}s is outside {}s..={}s (upstream's is {}s)",
    found.as_secs(),
    TokenLifetimes::MIN_ACCESS.as_secs(),
    TokenLifetimes::MAX_ACCESS.as_secs(),
    ACCESS_TOKEN_LIFETIME.as_secs()
)]
pub struct AccessLifetimeOutOfRange {
    /// The lifetime asked for.
    pub found: Duration,
}

impl TokenLifetimes {
    /// The shortest access-token lifetime [`Self::with_access`] accepts: agents refresh 30 s
    /// before expiry (upstream's threshold), so a shorter one would have them refresh nearly
    /// all the time.
    pub const MIN_ACCESS: Duration = Duration::from_secs(60);
    /// The longest. A token is bound to the transport identity it was issued to, and the
    /// principal's blocklist refuses a listed agent's token whatever its expiry, so a longer
    /// lifetime does not let a stolen token be used without the identity; an hour still keeps
    /// short the life of a token presented alone (a method that accepts a token alone for a
    /// call that presents no identity).
    pub const MAX_ACCESS: Duration = Duration::from_secs(60 * 60);

    /// Upstream's lifetimes with another access-token lifetime (upstream's is 5 min). Each
    /// refresh signs a new access token, so the signing a fleet costs in steady state is its
    /// size over this lifetime. The refresh token is renewed when it expires within two access
    /// lifetimes (at least upstream's 10 min), so an agent that refreshes once per access
    /// lifetime always renews it before it runs out.
    ///
    /// # Errors
    ///
    /// [`AccessLifetimeOutOfRange`] outside [`Self::MIN_ACCESS`]..=[`Self::MAX_ACCESS`].
    pub fn with_access(access: Duration) -> Result<Self, AccessLifetimeOutOfRange> {
        if !(Self::MIN_ACCESS..=Self::MAX_ACCESS).contains(&access) {
            return Err(AccessLifetimeOutOfRange { found: access });
        }
        Ok(Self { access, renew_refresh_within: REFRESH_TOKEN_RENEW_WITHIN.max(access * 2), ..Self::default() })
    }
}

impl Default for TokenLifetimes {
    fn default() -> Self {
        Self {
            access: ACCESS_TOKEN_LIFETIME,
            refresh: REFRESH_TOKEN_LIFETIME,
            renew_refresh_within: REFRESH_TOKEN_RENEW_WITHIN,
        }
    }
}

// === VerifiedToken ===

/// A token whose signature, issuer, audience and validity period checked out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedToken {
    /// Which kind it was verified as.
    pub kind: TokenKind,
    /// The agent it names.
    pub agent: AgentName,
    /// The agent's mode (`None` for resource-proxy tokens, whose subject is the bare name).
    pub mode: Option<AgentMode>,
    /// The transport binding, if the token carries one.
    pub binding: Option<Binding>,
    /// The authentication method (`amr`), if the token carries one.
    pub method: Option<String>,
    /// Expiry (`None` for resource-proxy tokens).
    pub expires_at: Option<SystemTime>,
    /// All claims as sent.
    pub claims: Claims,
}

/// The validity period: not expired (`exp`), already valid (`nbf`), no leeway.
fn check_period(kind: TokenKind, exp: Option<i64>, nbf: Option<i64>, now_secs: i64) -> Result<(), AuthError> {
    if let Some(exp) = exp
        && now_secs >= exp
    {
        return Err(AuthError::TokenExpired { kind, expired_at: rfc3339(exp), now: rfc3339(now_secs) });
    }
    if let Some(nbf) = nbf
        && now_secs < nbf
    {
        return Err(AuthError::TokenNotYetValid { kind, not_before: rfc3339(nbf), now: rfc3339(now_secs) });
    }
    Ok(())
}

// === SessionIssuer ===

/// Issues and verifies the principal's session tokens.
#[derive(Clone, Debug)]
pub struct SessionIssuer {
    key: Arc<SigningKey>,
    issuer: String,
    lifetimes: TokenLifetimes,
    clock: Arc<dyn Clock>,
    verified: Arc<VerifiedCache>,
}

/// Access tokens whose signature already verified, by the SHA-256 of the token, with their
/// expiry: an agent presents the same access token on every call for minutes, and an RS512
/// verification costs about a millisecond (4096-bit key), the largest part of a call's cost
/// (docs/benchmarks.md). A hit skips only the signature: the claims are read from the token
/// again and checked as on a miss (issuer, audience, validity period against the clock,
/// subject), so an entry is 40 bytes rather than the claims it would otherwise keep for every
/// idle agent. The binding is checked per call by the caller either way. Bounded: when full,
/// expired entries go, and if none have, the cache starts over.
#[derive(Debug, Default)]
struct VerifiedCache {
    /// Expiry (seconds since the epoch; `i64::MAX` without one) by the token's SHA-256.
    entries: Mutex<std::collections::HashMap<[u8; 32], i64>>,
}

impl VerifiedCache {
    /// Entries kept at most (about 10 k agents' current and previous access tokens).
    const CAPACITY: usize = 32_768;

    fn key(token: &str) -> [u8; 32] {
        use sha2::Digest as _;
        sha2::Sha256::digest(token.as_bytes()).into()
    }

    fn contains(&self, key: &[u8; 32]) -> bool {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).contains_key(key)
    }

    fn insert(&self, key: [u8; 32], expires: Option<i64>, now: SystemTime) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= Self::CAPACITY {
            let now = unix_seconds(now);
            entries.retain(|_, exp| *exp > now);
            if entries.len() >= Self::CAPACITY {
                entries.clear();
            }
        }
        entries.insert(key, expires.unwrap_or(i64::MAX));
    }
}

impl SessionIssuer {
    /// An issuer named `argocd-agent-server` with upstream's lifetimes and the system clock.
    #[must_use]
    pub fn new(key: SigningKey) -> Self {
        Self {
            key: Arc::new(key),
            issuer: DEFAULT_ISSUER.to_owned(),
            lifetimes: TokenLifetimes::default(),
            clock: Arc::new(SystemClock),
            verified: Arc::default(),
        }
    }

    /// Uses another issuer name (`iss`; audiences follow it).
    #[must_use]
    pub fn with_issuer(mut self, issuer: impl Into<String>) -> Self {
        self.issuer = issuer.into();
        self
    }

    /// Uses other token lifetimes.
    #[must_use]
    pub fn with_lifetimes(mut self, lifetimes: TokenLifetimes) -> Self {
        self.lifetimes = lifetimes;
        self
    }

    /// Reads the time from `clock`.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The issuer name.
    #[must_use]
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The token lifetimes.
    #[must_use]
    pub fn lifetimes(&self) -> TokenLifetimes {
        self.lifetimes
    }

    /// The signing key.
    #[must_use]
    pub fn key(&self) -> &SigningKey {
        &self.key
    }

    /// Issues the access and refresh tokens of a freshly authenticated agent, both bound to its
    /// transport identity.
    ///
    /// # Errors
    ///
    /// [`AuthError::TokenIssue`] if signing fails.
    pub fn issue(&self, identity: &AgentIdentity, mode: AgentMode) -> Result<IssuedTokens, AuthError> {
        let sub = subject_json(identity.name(), mode)?;
        let bound = Bound { binding: identity.binding(), method: identity.method() };
        Ok(IssuedTokens {
            access_token: self.sign(TokenKind::Access, &sub, Some(self.lifetimes.access), Some(bound))?,
            refresh_token: self.sign(TokenKind::Refresh, &sub, Some(self.lifetimes.refresh), Some(bound))?,
        })
    }

    /// Exchanges a verified refresh token for a new access token, with the same subject, binding
    /// and method, and for a new refresh token when the old one expires within
    /// [`TokenLifetimes::renew_refresh_within`] (upstream `RefreshToken`). The caller checks the
    /// binding against the connection first.
    ///
    /// # Errors
    ///
    /// [`AuthError::TokenUnbound`] for a refresh token without binding or method,
    /// [`AuthError::TokenIssue`] if signing fails.
    pub fn refresh(&self, refresh: &VerifiedToken) -> Result<RefreshedTokens, AuthError> {
        let kind = TokenKind::Refresh;
        let (Some(binding), Some(method), Some(mode)) = (&refresh.binding, &refresh.method, refresh.mode) else {
            return Err(AuthError::TokenUnbound { kind });
        };
        let sub = subject_json(&refresh.agent, mode)?;
        let bound = Bound { binding, method };
        let now = self.clock.now();
        let access_token = self.sign_at(now, TokenKind::Access, &sub, Some(self.lifetimes.access), Some(bound))?;
        // The token's own `exp` (whole seconds), so a stream extended to it ends with the token.
        let access_expires_at = exp_time(exp_seconds(unix_seconds(now), self.lifetimes.access));
        let renew = refresh
            .expires_at
            .is_none_or(|exp| exp.duration_since(now).unwrap_or_default() < self.lifetimes.renew_refresh_within);
        let refresh_token = if renew {
            Some(self.sign(TokenKind::Refresh, &sub, Some(self.lifetimes.refresh), Some(bound))?)
        } else {
            None
        };
        Ok(RefreshedTokens { access_token, refresh_token, access_expires_at })
    }

    /// Issues the non-expiring bearer token Argo CD presents to the resource proxy for `agent`
    /// (self-registered cluster secrets; upstream `IssueResourceProxyToken`).
    ///
    /// # Errors
    ///
    /// [`AuthError::TokenIssue`] if signing fails.
    pub fn issue_resource_proxy_token(&self, agent: &AgentName) -> Result<String, AuthError> {
        self.sign(TokenKind::ResourceProxy, agent.as_str(), None, None)
    }

    /// Verifies `token` as a token of `kind`: algorithm, signature, issuer, audience, validity
    /// period and subject. The binding is returned, not checked: see [`crate::Sessions`].
    ///
    /// # Errors
    ///
    /// The [`AuthError`] of the first check that fails.
    pub fn verify(&self, token: &str, kind: TokenKind) -> Result<VerifiedToken, AuthError> {
        if kind != TokenKind::Access {
            return self.verify_uncached(token, kind);
        }
        let key = VerifiedCache::key(token);
        if self.verified.contains(&key) {
            // This exact token's signature verified before: only its claims are read again.
            let claims = jsonwebtoken::dangerous::insecure_decode_claims::<Claims>(token)
                .map_err(|e| AuthError::MalformedToken { kind, reason: e.to_string() })?;
            return self.check_claims(claims, kind);
        }
        let verified = self.verify_uncached(token, kind)?;
        self.verified.insert(key, verified.claims.exp, self.clock.now());
        Ok(verified)
    }

    fn verify_uncached(&self, token: &str, kind: TokenKind) -> Result<VerifiedToken, AuthError> {
        let malformed = |reason: String| AuthError::MalformedToken { kind, reason };
        let header = jsonwebtoken::decode_header(token).map_err(|e| malformed(e.to_string()))?;
        let algorithm = self.key.algorithm();
        if header.alg != algorithm {
            return Err(AuthError::TokenAlgorithm { kind, found: format!("{:?}", header.alg) });
        }
        let mut validation = Validation::new(algorithm);
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        validation.leeway = 0;
        let claims = jsonwebtoken::decode::<Claims>(token, self.key.decoding(), &validation)
            .map_err(|e| match e.kind() {
                ErrorKind::InvalidSignature => AuthError::TokenSignature { kind },
                ErrorKind::InvalidAlgorithm => AuthError::TokenAlgorithm { kind, found: format!("{:?}", header.alg) },
                _ => malformed(e.to_string()),
            })?
            .claims;
        self.check_claims(claims, kind)
    }

    /// The checks of a token's claims once its signature verified: issuer, audience, validity
    /// period and subject.
    fn check_claims(&self, claims: Claims, kind: TokenKind) -> Result<VerifiedToken, AuthError> {
        if claims.iss != self.issuer {
            return Err(AuthError::TokenIssuer { kind, found: claims.iss, expected: self.issuer.clone() });
        }
        let expected = kind.audience(&self.issuer);
        if !claims.aud.contains(&expected) {
            return Err(AuthError::TokenAudience { kind, found: claims.aud, expected });
        }
        let now = self.clock.now();
        let now_secs = unix_seconds(now);
        if claims.exp.is_none() && kind != TokenKind::ResourceProxy {
            return Err(AuthError::TokenWithoutExpiry { kind });
        }
        check_period(kind, claims.exp, claims.nbf, now_secs)?;

        let subject_error = |reason: String| AuthError::TokenSubject { kind, reason };
        let (agent, mode) = if kind == TokenKind::ResourceProxy {
            (AgentName::new(claims.sub.clone()).map_err(|e| subject_error(e.to_string()))?, None)
        } else {
            let subject: AgentSubject = serde_json::from_str(&claims.sub)
                .map_err(|e| subject_error(format!("not {{\"clientID\":…,\"mode\":…}} JSON: {e}")))?;
            let agent = AgentName::new(subject.client_id).map_err(|e| subject_error(e.to_string()))?;
            let mode = subject.mode.parse::<AgentMode>().map_err(|e| subject_error(e.to_string()))?;
            (agent, Some(mode))
        };
        let binding = claims
            .cnf
            .as_ref()
            .map(Confirmation::binding)
            .transpose()
            .map_err(|reason| AuthError::MalformedToken { kind, reason })?;
        Ok(VerifiedToken {
            kind,
            agent,
            mode,
            binding,
            method: claims.amr.first().cloned(),
            expires_at: claims.exp.map(exp_time),
            claims,
        })
    }

    fn sign(
        &self,
        kind: TokenKind,
        sub: &str,
        lifetime: Option<Duration>,
        bound: Option<Bound<'_>>,
    ) -> Result<String, AuthError> {
        self.sign_at(self.clock.now(), kind, sub, lifetime, bound)
    }

    fn sign_at(
        &self,
        now: SystemTime,
        kind: TokenKind,
        sub: &str,
        lifetime: Option<Duration>,
        bound: Option<Bound<'_>>,
    ) -> Result<String, AuthError> {
        let now = unix_seconds(now);
        let claims = Claims {
            iss: self.issuer.clone(),
            sub: sub.to_owned(),
            aud: vec![kind.audience(&self.issuer)],
            exp: lifetime.map(|l| exp_seconds(now, l)),
            nbf: Some(now),
            iat: Some(now),
            jti: uuid::Uuid::new_v4().to_string(),
            cnf: bound.map(|b| Confirmation::from(b.binding)),
            amr: bound.map(|b| vec![b.method.to_owned()]).unwrap_or_default(),
        };
        self.key
            .sign_jwt(&Header::new(self.key.algorithm()), &claims)
            .map_err(|reason| AuthError::TokenIssue { reason })
    }
}

/// What a bound token carries besides its subject.
#[derive(Clone, Copy)]
struct Bound<'a> {
    binding: &'a Binding,
    method: &'a str,
}

fn subject_json(name: &AgentName, mode: AgentMode) -> Result<String, AuthError> {
    serde_json::to_string(&AgentSubject::new(name, mode)).map_err(|e| AuthError::TokenIssue { reason: e.to_string() })
}

/// A token's `exp` claim: issued at `now` (Unix seconds) and valid for `lifetime`.
fn exp_seconds(now: i64, lifetime: Duration) -> i64 {
    now.saturating_add(i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX))
}

/// The instant an `exp` claim names.
fn exp_time(exp: i64) -> SystemTime {
    u64::try_from(exp).map_or(UNIX_EPOCH, |s| UNIX_EPOCH + Duration::from_secs(s))
}

fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

fn rfc3339(secs: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp(secs, 0)
        .map_or_else(|| format!("{secs}s since the epoch"), |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

#[cfg(test)]
mod tests;
