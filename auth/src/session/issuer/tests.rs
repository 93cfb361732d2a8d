use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{EncodingKey, Header};

use super::*;

const KEY_A: &str = include_str!("../../../tests/fixtures/jwt-key-a.pem");
const KEY_B: &str = include_str!("../../../tests/fixtures/jwt-key-b.pem");

fn start() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn issuer(pem: &str, clock: &ManualClock) -> SessionIssuer {
    SessionIssuer::new(SigningKey::from_pem(pem).expect("key")).with_clock(Arc::new(clock.clone()))
}

fn identity() -> AgentIdentity {
    AgentIdentity::new(AgentName::new("agent-1").expect("name"), "mtls", Binding::certificate(b"leaf"))
}

#[test]
fn issued_tokens_verify_with_upstream_claims() {
    let clock = ManualClock::new(start());
    let iss = issuer(KEY_A, &clock);
    let tokens = iss.issue(&identity(), AgentMode::Managed).expect("issue");

    let access = iss.verify(&tokens.access_token, TokenKind::Access).expect("access");
    assert_eq!(access.agent.as_str(), "agent-1");
    assert_eq!(access.mode, Some(AgentMode::Managed));
    assert_eq!(access.binding, Some(Binding::certificate(b"leaf")));
    assert_eq!(access.method.as_deref(), Some("mtls"));
    assert_eq!(access.expires_at, Some(start() + ACCESS_TOKEN_LIFETIME));
    let c = &access.claims;
    assert_eq!(c.iss, "argocd-agent-server");
    assert_eq!(c.sub, r#"{"clientID":"agent-1","mode":"managed"}"#);
    assert_eq!(c.aud, vec!["argocd-agent-server-access".to_owned()]);
    assert_eq!((c.iat, c.nbf), (Some(1_700_000_000), Some(1_700_000_000)));
    assert_eq!(c.exp, Some(1_700_000_000 + 300));
    assert_eq!(c.jti.len(), 36);

    let header = jsonwebtoken::decode_header(&tokens.access_token).expect("header");
    assert_eq!(header.alg, Algorithm::RS512);
    assert!(header.kid.is_none());

    let refresh = iss.verify(&tokens.refresh_token, TokenKind::Refresh).expect("refresh");
    assert_eq!(refresh.expires_at, Some(start() + REFRESH_TOKEN_LIFETIME));
    assert_ne!(refresh.claims.jti, access.claims.jti);
}

#[test]
fn expired_tokens_are_refused_with_times() {
    let clock = ManualClock::new(start());
    let iss = issuer(KEY_A, &clock);
    let tokens = iss.issue(&identity(), AgentMode::Autonomous).expect("issue");
    clock.advance(ACCESS_TOKEN_LIFETIME.saturating_sub(Duration::from_secs(1)));
    assert!(iss.verify(&tokens.access_token, TokenKind::Access).is_ok());
    clock.advance(Duration::from_secs(1));
    let err = iss.verify(&tokens.access_token, TokenKind::Access).expect_err("expired");
    assert!(matches!(err, AuthError::TokenExpired { .. }), "{err}");
    assert!(err.to_string().contains("2023-11-14T22:18:20Z"), "{err}");
    // The refresh token still works.
    assert!(iss.verify(&tokens.refresh_token, TokenKind::Refresh).is_ok());
}

#[test]
fn tokens_not_yet_valid_are_refused() {
    let clock = ManualClock::new(start());
    let iss = issuer(KEY_A, &clock);
    let tokens = iss.issue(&identity(), AgentMode::Managed).expect("issue");
    clock.set(start() - Duration::from_secs(10));
    let err = iss.verify(&tokens.access_token, TokenKind::Access).expect_err("early");
    assert!(matches!(err, AuthError::TokenNotYetValid { .. }), "{err}");
}

#[test]
fn tokens_of_another_key_are_refused() {
    let clock = ManualClock::new(start());
    let tokens = issuer(KEY_B, &clock).issue(&identity(), AgentMode::Managed).expect("issue");
    let err = issuer(KEY_A, &clock).verify(&tokens.access_token, TokenKind::Access).expect_err("other key");
    assert!(matches!(err, AuthError::TokenSignature { .. }), "{err}");
    assert!(err.to_string().contains("signed with another key"), "{err}");
}

#[test]
fn wrong_audience_is_refused() {
    let clock = ManualClock::new(start());
    let iss = issuer(KEY_A, &clock);
    let tokens = iss.issue(&identity(), AgentMode::Managed).expect("issue");
    let err = iss.verify(&tokens.refresh_token, TokenKind::Access).expect_err("refresh as access");
    assert!(matches!(err, AuthError::TokenAudience { .. }), "{err}");
    assert!(err.to_string().contains("argocd-agent-server-refresh"), "{err}");
    let err = iss.verify(&tokens.access_token, TokenKind::Refresh).expect_err("access as refresh");
    assert!(matches!(err, AuthError::TokenAudience { .. }), "{err}");
}

#[test]
fn wrong_issuer_is_refused() {
    let clock = ManualClock::new(start());
    let other = issuer(KEY_A, &clock).with_issuer("someone-else");
    let tokens = other.issue(&identity(), AgentMode::Managed).expect("issue");
    let err = issuer(KEY_A, &clock).verify(&tokens.access_token, TokenKind::Access).expect_err("issuer");
    assert!(matches!(err, AuthError::TokenIssuer { .. }), "{err}");
}

#[test]
fn other_algorithms_and_garbage_are_refused() {
    let clock = ManualClock::new(start());
    let iss = issuer(KEY_A, &clock);
    let claims = serde_json::json!({
        "iss": "argocd-agent-server", "sub": "{\"clientID\":\"agent-1\",\"mode\":\"managed\"}",
        "aud": ["argocd-agent-server-access"], "exp": 1_700_000_300, "jti": "x"
    });
    let hs =
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(b"k")).expect("hs256");
    let err = iss.verify(&hs, TokenKind::Access).expect_err("hs256");
    assert!(matches!(err, AuthError::TokenAlgorithm { .. }), "{err}");
    let err = iss.verify("not-a-jwt", TokenKind::Access).expect_err("garbage");
    assert!(matches!(err, AuthError::MalformedToken { .. }), "{err}");
}

#[test]
fn refresh_renews_the_refresh_token_only_near_expiry() {
    let clock = ManualClock::new(start());
    let iss = issuer(KEY_A, &clock);
    let tokens = iss.issue(&identity(), AgentMode::Managed).expect("issue");

    clock.advance(Duration::from_secs(60 * 60));
    let refresh = iss.verify(&tokens.refresh_token, TokenKind::Refresh).expect("refresh");
    let out = iss.refresh(&refresh).expect("refreshed");
    assert!(out.refresh_token.is_none());
    let access = iss.verify(&out.access_token, TokenKind::Access).expect("new access");
    assert_eq!(access.binding, Some(Binding::certificate(b"leaf")));
    assert_eq!(access.expires_at, Some(clock.now() + ACCESS_TOKEN_LIFETIME));

    clock.set(start() + REFRESH_TOKEN_LIFETIME - Duration::from_secs(5 * 60));
    let refresh = iss.verify(&tokens.refresh_token, TokenKind::Refresh).expect("refresh");
    let out = iss.refresh(&refresh).expect("refreshed");
    let renewed = out.refresh_token.expect("renewed");
    let renewed = iss.verify(&renewed, TokenKind::Refresh).expect("renewed verifies");
    assert_eq!(renewed.binding, refresh.binding);
    assert_eq!(renewed.expires_at, Some(clock.now() + REFRESH_TOKEN_LIFETIME));
}

#[test]
fn a_longer_access_lifetime_signs_fewer_refreshes_and_still_renews_the_refresh_token_in_time() {
    let clock = ManualClock::new(start());
    let thirty_minutes = Duration::from_secs(30 * 60);
    let lifetimes = TokenLifetimes::with_access(thirty_minutes).expect("in range");
    assert_eq!(lifetimes.refresh, REFRESH_TOKEN_LIFETIME);
    let iss = issuer(KEY_A, &clock).with_lifetimes(lifetimes);
    let tokens = iss.issue(&identity(), AgentMode::Managed).expect("issue");
    let access = iss.verify(&tokens.access_token, TokenKind::Access).expect("access");
    assert_eq!(access.expires_at, Some(start() + thirty_minutes));
    assert_eq!(access.claims.exp, Some(1_700_000_000 + 30 * 60));

    // An agent refreshing 30 s before each access token expires: the refresh token is renewed
    // on the last refresh before it runs out, never found expired.
    let mut refresh_token = tokens.refresh_token;
    let mut renewed = 0;
    let mut at = start();
    while at < start() + 2 * REFRESH_TOKEN_LIFETIME {
        at += thirty_minutes - Duration::from_secs(30);
        clock.set(at);
        let refresh = iss.verify(&refresh_token, TokenKind::Refresh).expect("the refresh token is still valid");
        let out = iss.refresh(&refresh).expect("refreshed");
        assert_eq!(out.access_expires_at, at + thirty_minutes);
        if let Some(next) = out.refresh_token {
            refresh_token = next;
            renewed += 1;
        }
    }
    assert_eq!(renewed, 2, "renewed once per refresh-token lifetime");
}

#[test]
fn access_lifetimes_outside_a_minute_to_an_hour_are_refused_naming_the_range() {
    assert_eq!(TokenLifetimes::with_access(ACCESS_TOKEN_LIFETIME).expect("upstream's"), TokenLifetimes::default());
    for bad in [Duration::ZERO, Duration::from_secs(59), Duration::from_secs(60 * 60 + 1)] {
        let err = TokenLifetimes::with_access(bad).expect_err("out of range");
        assert_eq!(err.found, bad);
        let text = err.to_string();
        assert!(text.contains("60s..=3600s") && text.contains("upstream's is 300s"), "{text}");
    }
    for good in [TokenLifetimes::MIN_ACCESS, TokenLifetimes::MAX_ACCESS] {
        let lifetimes = TokenLifetimes::with_access(good).expect("in range");
        assert!(
            lifetimes.renew_refresh_within >= 2 * good && lifetimes.renew_refresh_within >= REFRESH_TOKEN_RENEW_WITHIN
        );
    }
}

#[test]
fn a_refresh_reports_the_access_tokens_own_expiry_to_the_second() {
    // Mid-second: the token's `exp` is whole seconds, and a stream extended to the reported
    // expiry must not outlive the token.
    let clock = ManualClock::new(start() + Duration::from_millis(900));
    let iss = issuer(KEY_A, &clock);
    let tokens = iss.issue(&identity(), AgentMode::Managed).expect("issue");
    clock.advance(Duration::from_millis(60_750));
    let refresh = iss.verify(&tokens.refresh_token, TokenKind::Refresh).expect("refresh");
    let out = iss.refresh(&refresh).expect("refreshed");
    let access = iss.verify(&out.access_token, TokenKind::Access).expect("new access");
    assert_eq!(access.expires_at, Some(out.access_expires_at));
    assert_eq!(out.access_expires_at, start() + Duration::from_secs(61) + ACCESS_TOKEN_LIFETIME);
}

#[test]
fn resource_proxy_tokens_never_expire_and_carry_the_bare_name() {
    let clock = ManualClock::new(start());
    let iss = issuer(KEY_A, &clock);
    let agent = AgentName::new("agent-1").expect("name");
    let token = iss.issue_resource_proxy_token(&agent).expect("issue");
    clock.advance(Duration::from_secs(10 * 365 * 24 * 3600));
    let verified = iss.verify(&token, TokenKind::ResourceProxy).expect("verify");
    assert_eq!(verified.agent, agent);
    assert_eq!(verified.claims.sub, "agent-1");
    assert!(verified.expires_at.is_none() && verified.binding.is_none());
    let err = iss.verify(&token, TokenKind::Access).expect_err("not an access token");
    assert!(matches!(err, AuthError::TokenAudience { .. }), "{err}");
}

#[test]
fn verified_access_tokens_are_cached_by_their_exact_bytes() {
    let clock = ManualClock::new(start());
    let iss = issuer(KEY_A, &clock);
    let tokens = iss.issue(&identity(), AgentMode::Managed).expect("issue");
    let first = iss.verify(&tokens.access_token, TokenKind::Access).expect("verify");
    assert_eq!(iss.verify(&tokens.access_token, TokenKind::Access).expect("cached"), first);
    // A token differing in one byte of its signature is verified, not looked up.
    let mut tampered = tokens.access_token.clone();
    let last = tampered.pop().expect("non-empty");
    tampered.push(if last == 'A' { 'B' } else { 'A' });
    assert!(iss.verify(&tampered, TokenKind::Access).is_err());
    // A cached access token is still not a refresh token, and another key's issuer does not share the cache.
    assert!(iss.verify(&tokens.access_token, TokenKind::Refresh).is_err());
    assert!(issuer(KEY_B, &clock).verify(&tokens.access_token, TokenKind::Access).is_err());
    // A hit skips only the signature: the claims are checked again, the clock included.
    clock.advance(TokenLifetimes::default().access);
    let err = iss.verify(&tokens.access_token, TokenKind::Access).expect_err("expired since");
    assert!(matches!(err, AuthError::TokenExpired { .. }), "{err}");
}
