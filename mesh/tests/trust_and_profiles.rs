//! Trusted hops (CIDRs) and mesh profile defaults.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::net::IpAddr;
use std::time::Duration;

use mesh::policy::KUBERNETES_PATTERN;
use mesh::{Cidr, CidrError, IdentityHeader, MeshProfile, PathPattern, SpiffePolicy, TrustDomain, TrustedHops};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn default_trusts_loopback_only() {
    let hops = TrustedHops::default();
    for trusted in ["127.0.0.1", "127.255.0.9", "::1", "::ffff:127.0.0.1"] {
        assert!(hops.is_trusted(ip(trusted)), "{trusted}");
    }
    for untrusted in ["10.0.0.1", "128.0.0.1", "::2", "::ffff:10.0.0.1", "0.0.0.0", "::"] {
        assert!(!hops.is_trusted(ip(untrusted)), "{untrusted}");
    }
}

#[test]
fn cidr_parsing() {
    assert_eq!(Cidr::parse("127.0.0.0/8").unwrap().to_string(), "127.0.0.0/8");
    assert_eq!(Cidr::parse("::1/128").unwrap().to_string(), "::1/128");
    assert_eq!(Cidr::parse("10.1.2.3").unwrap().to_string(), "10.1.2.3/32", "a bare IPv4 address is a /32");
    assert_eq!(Cidr::parse("fd00::7").unwrap().to_string(), "fd00::7/128", "a bare IPv6 address is a /128");
    assert_eq!(Cidr::parse(" 10.1.2.3/8 ").unwrap().to_string(), "10.0.0.0/8", "host bits are cleared");
    assert_eq!(Cidr::parse("0.0.0.0/0").unwrap().to_string(), "0.0.0.0/0");
    assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("203.0.113.9")));
    assert!(Cidr::parse("fd00::/8").unwrap().contains(ip("fdff::1")));
    assert!(!Cidr::parse("fd00::/8").unwrap().contains(ip("10.0.0.1")), "families never match");
    assert!(matches!(Cidr::parse("10.0.0.0/33"), Err(CidrError::BadPrefix { max: 32, .. })));
    assert!(matches!(Cidr::parse("::/129"), Err(CidrError::BadPrefix { max: 128, .. })));
    assert!(matches!(Cidr::parse("10.0.0.0/+8"), Err(CidrError::BadPrefix { .. })));
    assert!(matches!(Cidr::parse("10.0.0.0/"), Err(CidrError::BadPrefix { .. })));
    assert!(matches!(Cidr::parse("localhost"), Err(CidrError::BadAddress { .. })));
    assert!(matches!(Cidr::parse("10.0.0/8"), Err(CidrError::BadAddress { .. })));
    assert!("::1/128".parse::<Cidr>().is_ok());
}

#[test]
fn trusted_hop_lists() {
    let hops = TrustedHops::parse_list("127.0.0.0/8, ::1/128, 10.0.0.7,fd00::/16").unwrap();
    assert_eq!(hops.networks().len(), 4);
    assert!(hops.is_trusted(ip("10.0.0.7")));
    assert!(!hops.is_trusted(ip("10.0.0.8")));
    assert!(hops.is_trusted(ip("fd00:1::1")));
    let none = TrustedHops::parse_list(" ").unwrap();
    assert!(!none.is_trusted(ip("127.0.0.1")), "an empty list trusts nothing");
    assert!(TrustedHops::new([]).networks().is_empty());
    let err = TrustedHops::parse_list("127.0.0.1, nope").unwrap_err();
    assert!(err.to_string().contains("\"nope\""), "{err}");
}

#[test]
fn profiles_parse_by_name() {
    for p in MeshProfile::ALL {
        assert_eq!(p.name().parse::<MeshProfile>(), Ok(p));
        assert_eq!(p.to_string(), p.name());
    }
    assert_eq!(" Istio ".parse::<MeshProfile>(), Ok(MeshProfile::Istio));
    let err = "consul".parse::<MeshProfile>().unwrap_err();
    assert!(err.to_string().contains("istio, linkerd, envoy"), "{err}");
}

#[test]
fn profile_headers() {
    assert_eq!(MeshProfile::Istio.identity_header(), IdentityHeader::Xfcc);
    assert_eq!(MeshProfile::Envoy.identity_header().name(), "x-forwarded-client-cert");
    assert_eq!(MeshProfile::Linkerd.identity_header().name(), "l5d-client-id");
    let istio = MeshProfile::Istio;
    let agent = istio
        .identity_header()
        .identify(
            "By=spiffe://cluster.local/ns/argocd/sa/p;URI=spiffe://cluster.local/ns/a/sa/agent-1",
            &istio.default_policy(),
        )
        .unwrap();
    assert_eq!(agent.agent(), "agent-1");
    let linkerd = MeshProfile::Linkerd;
    let agent = linkerd
        .identity_header()
        .identify("agent-2.a.serviceaccount.identity.linkerd.cluster.local", &linkerd.default_policy())
        .unwrap();
    assert_eq!(agent.agent(), "agent-2");
}

#[test]
fn default_policies_equal_their_validated_construction() {
    for (profile, denied) in [
        (MeshProfile::Istio, &["istio-system"][..]),
        (MeshProfile::Linkerd, &["linkerd"][..]),
        (MeshProfile::Envoy, &[][..]),
    ] {
        let validated = SpiffePolicy::new(
            [TrustDomain::new(MeshProfile::DEFAULT_TRUST_DOMAIN).unwrap()],
            [PathPattern::new(KUBERNETES_PATTERN).unwrap()],
        )
        .unwrap()
        .with_denied_namespaces(denied.iter().copied())
        .unwrap();
        assert_eq!(profile.default_policy(), validated, "{profile}");
    }
}

#[test]
fn heartbeat_stays_well_under_the_idle_timeout() {
    assert_eq!(MeshProfile::Istio.stream_idle_timeout(), Some(Duration::from_secs(300)));
    assert_eq!(MeshProfile::Envoy.stream_idle_timeout(), Some(Duration::from_secs(300)));
    assert_eq!(MeshProfile::Linkerd.stream_idle_timeout(), None);
    for p in MeshProfile::ALL {
        let heartbeat = p.heartbeat_interval();
        assert_eq!(heartbeat, Duration::from_secs(30));
        if let Some(idle) = p.stream_idle_timeout() {
            // Upstream's guidance is 50-75 % of the idle timeout at most; we keep a wide margin.
            assert!(heartbeat * 4 <= idle, "{p}: heartbeat {heartbeat:?} vs idle {idle:?}");
        }
    }
}
