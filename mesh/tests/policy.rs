//! SPIFFE policy decisions and the XFCC identity rule: last element, exactly one non-empty URI,
//! a SPIFFE ID the policy accepts.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use mesh::identity::{identity_from_element, identity_from_linkerd, spiffe_id_from_linkerd};
use mesh::policy::{KUBERNETES_PATTERN, PolicyConfigError, PolicyError};
use mesh::spiffe::SpiffeIdError;
use mesh::{
    IdentityError, MeshProfile, PathPattern, SpiffeId, SpiffePolicy, TrustDomain, XfccElement, identity_from_xfcc,
};

fn id(s: &str) -> SpiffeId {
    SpiffeId::parse(s).unwrap()
}

fn istio() -> SpiffePolicy {
    MeshProfile::Istio.default_policy()
}

fn policy(tds: &[&str], patterns: &[&str]) -> SpiffePolicy {
    SpiffePolicy::new(
        tds.iter().map(|t| TrustDomain::new(t).unwrap()),
        patterns.iter().map(|p| PathPattern::new(p).unwrap()),
    )
    .unwrap()
}

const AGENT_1: &str = "spiffe://cluster.local/ns/agents/sa/agent-1";

#[test]
fn accepts_the_kubernetes_convention() {
    let ok = istio().authorize(&id(AGENT_1)).unwrap();
    assert_eq!(ok.agent(), "agent-1");
    assert_eq!(ok.namespace(), Some("agents"));
    assert_eq!(ok.spiffe_id(), &id(AGENT_1));
}

#[test]
fn wrong_trust_domain_is_rejected_unlike_upstreams_regex() {
    // Upstream's header regex authenticates this as `my-agent`.
    let err = istio().authorize(&id("spiffe://evil.example/ns/x/sa/my-agent")).unwrap_err();
    assert_eq!(
        err,
        PolicyError::TrustDomainNotAllowed {
            id: "spiffe://evil.example/ns/x/sa/my-agent".into(),
            trust_domain: "evil.example".into(),
            allowed: vec!["cluster.local".into()],
        }
    );
    assert!(err.to_string().contains("trust domain \"evil.example\" is not allowed"), "{err}");
}

#[test]
fn wrong_pattern_is_rejected() {
    for path in ["/ns/agents/sa", "/ns/agents/sa/agent-1/extra", "/ns/agents/serviceaccount/agent-1", "", "/sa/agent-1"]
    {
        let spiffe = id(&format!("spiffe://cluster.local{path}"));
        let err = istio().authorize(&spiffe).unwrap_err();
        assert!(matches!(&err, PolicyError::PathMismatch { path: p, .. } if p == path), "{path}: {err:?}");
        assert!(err.to_string().contains("/ns/{namespace}/sa/{agent}"), "{err}");
    }
}

#[test]
fn agent_must_be_a_dns_label() {
    for (sa, reason) in [
        ("Agent-1", "a-z, 0-9"),
        ("agent_1", "a-z, 0-9"),
        ("agent.1", "a-z, 0-9"),
        ("-agent", "starts or ends"),
        ("agent-", "starts or ends"),
        (&"a".repeat(64), "63"),
    ] {
        let err = istio().authorize(&id(&format!("spiffe://cluster.local/ns/agents/sa/{sa}"))).unwrap_err();
        assert!(
            matches!(&err, PolicyError::AgentNotDnsLabel { agent, reason: r, .. } if agent == sa && r.contains(reason)),
            "{sa}: {err:?}"
        );
    }
    assert!(istio().authorize(&id(&format!("spiffe://cluster.local/ns/a/sa/{}", "a".repeat(63)))).is_ok());
}

#[test]
fn namespace_allow_list() {
    let p = istio().with_allowed_namespaces(["agents", "edge"]).unwrap();
    assert!(p.authorize(&id(AGENT_1)).is_ok());
    let err = p.authorize(&id("spiffe://cluster.local/ns/default/sa/agent-1")).unwrap_err();
    assert_eq!(
        err,
        PolicyError::NamespaceNotAllowed {
            id: "spiffe://cluster.local/ns/default/sa/agent-1".into(),
            namespace: "default".into(),
            allowed: vec!["agents".into(), "edge".into()],
        }
    );
}

#[test]
fn custom_patterns_placeholders_and_trust_domains() {
    let p = policy(&["a.example", "b.example"], &["/agents/{agent}", "/cluster/{c}/ns/{namespace}/sa/{agent}"]);
    assert_eq!(p.authorize(&id("spiffe://b.example/agents/spoke-1")).unwrap().agent(), "spoke-1");
    let ok = p.authorize(&id("spiffe://a.example/cluster/east/ns/argocd/sa/spoke-2")).unwrap();
    assert_eq!((ok.agent(), ok.namespace()), ("spoke-2", Some("argocd")));
    assert!(matches!(
        p.authorize(&id("spiffe://a.example/cluster/east/ns/argocd")),
        Err(PolicyError::PathMismatch { .. })
    ));

    let td = || [TrustDomain::new("cluster.local").unwrap()];
    let pat = |p: &str| [PathPattern::new(p).unwrap()];
    assert!(matches!(
        SpiffePolicy::new(td(), pat("/ns/{namespace}/sa/{sa}")),
        Err(PolicyConfigError::MissingAgentPlaceholder { .. })
    ));
    let by_sa = SpiffePolicy::with_agent_placeholder(td(), pat("/ns/{namespace}/sa/{sa}"), "sa").unwrap();
    assert_eq!(by_sa.authorize(&id(AGENT_1)).unwrap().agent(), "agent-1");
    let by_ns = SpiffePolicy::with_agent_placeholder(td(), pat("/ns/{agent}/sa/{sa}"), "agent").unwrap();
    assert_eq!(by_ns.authorize(&id("spiffe://cluster.local/ns/spoke-3/sa/argocd-agent")).unwrap().agent(), "spoke-3");
}

#[test]
fn configuration_mistakes_are_reported() {
    let bad = |p: &str| match PathPattern::new(p) {
        Err(PolicyConfigError::BadPattern { reason, .. }) => reason,
        other => panic!("{p}: {other:?}"),
    };
    assert!(bad("ns/{namespace}").contains("start with '/'"));
    assert!(bad("/ns//sa/{agent}").contains("empty segment"));
    assert!(bad("/ns/{namespace}/").contains("trailing"));
    assert!(bad("/ns/x{agent}").contains("placeholder is a whole segment"));
    assert!(bad("/ns/{Agent}").contains("placeholder names"));
    assert!(bad("/{agent}/{agent}").contains("twice"));
    assert!(bad("/ns/../{agent}").contains("'..'"));

    let td = || [TrustDomain::new("cluster.local").unwrap()];
    let pat = || [PathPattern::new(KUBERNETES_PATTERN).unwrap()];
    assert_eq!(SpiffePolicy::new([], pat()), Err(PolicyConfigError::NoTrustDomains));
    assert_eq!(SpiffePolicy::new(td(), []), Err(PolicyConfigError::NoPatterns));
    assert!(matches!(
        SpiffePolicy::new(td(), [PathPattern::new("/ns/{namespace}").unwrap()]),
        Err(PolicyConfigError::MissingAgentPlaceholder { .. })
    ));
    let no_ns = SpiffePolicy::new(td(), [PathPattern::new("/agent/{agent}").unwrap()]).unwrap();
    assert!(matches!(
        no_ns.clone().with_allowed_namespaces(["a"]),
        Err(PolicyConfigError::MissingNamespacePlaceholder { .. })
    ));
    assert!(matches!(no_ns.with_denied_namespaces(["a"]), Err(PolicyConfigError::MissingNamespacePlaceholder { .. })));
}

// === identity from XFCC ===

const GATEWAY: &str = "spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account";

#[test]
fn last_element_is_the_identity_earlier_ones_are_history() {
    let header = format!(
        "By=spiffe://cluster.local/ns/x/sa/y;URI=spiffe://cluster.local/ns/agents/sa/someone-else,\
         By=spiffe://cluster.local/ns/argocd/sa/argocd-agent-principal;Hash=ab;Subject=\"\";URI={AGENT_1}"
    );
    assert_eq!(identity_from_xfcc(&header, &istio()).unwrap().agent(), "agent-1");
}

#[test]
fn gateway_identity_is_never_an_agent() {
    // SANITIZE_SET at the gateway, then our sidecar: the last URI is the gateway's.
    let through_gateway =
        format!("By=spiffe://cluster.local/ns/argocd/sa/argocd-agent-principal;Subject=\"\";URI={GATEWAY}");
    let err = identity_from_xfcc(&through_gateway, &istio()).unwrap_err();
    assert!(
        matches!(&err, IdentityError::Policy(PolicyError::NamespaceDenied { namespace, .. }) if namespace == "istio-system"),
        "{err:?}"
    );
    // A real agent's element before the gateway's is history and does not help.
    let appended = format!("URI={AGENT_1},By=spiffe://cluster.local/ns/argocd/sa/argocd-agent-principal;URI={GATEWAY}");
    assert!(matches!(
        identity_from_xfcc(&appended, &istio()),
        Err(IdentityError::Policy(PolicyError::NamespaceDenied { .. }))
    ));
    // With an allow list, a gateway in its own namespace is rejected too.
    let p = policy(&["cluster.local"], &[KUBERNETES_PATTERN]).with_allowed_namespaces(["agents"]).unwrap();
    let gw = "URI=spiffe://cluster.local/ns/ingress/sa/gateway";
    assert!(matches!(identity_from_xfcc(gw, &p), Err(IdentityError::Policy(PolicyError::NamespaceNotAllowed { .. }))));
}

#[test]
fn uri_count_and_shape() {
    let p = istio();
    assert_eq!(identity_from_xfcc("By=a;Hash=b", &p), Err(IdentityError::NoUri));
    assert_eq!(identity_from_xfcc("By=a;URI=", &p), Err(IdentityError::EmptyUri));
    assert_eq!(
        identity_from_xfcc(&format!("URI={AGENT_1};URI={AGENT_1}"), &p),
        Err(IdentityError::MultipleUris { count: 2 })
    );
    assert_eq!(identity_from_xfcc(&format!("URI=;URI={AGENT_1}"), &p), Err(IdentityError::MultipleUris { count: 2 }));
    assert_eq!(
        identity_from_xfcc("URI=spiffe://cluster.local/ns/a/sa/b/", &p),
        Err(IdentityError::NotSpiffe {
            uri: "spiffe://cluster.local/ns/a/sa/b/".into(),
            source: SpiffeIdError::TrailingSlash
        })
    );
    // A quoted URI is accepted: quoting is transport, not content.
    assert_eq!(identity_from_xfcc(&format!("uri=\"{AGENT_1}\""), &p).unwrap().agent(), "agent-1");
    assert!(matches!(identity_from_xfcc("", &p), Err(IdentityError::Xfcc(mesh::XfccError::EmptyHeader))));
    let element = XfccElement { uris: vec![AGENT_1.into()], ..Default::default() };
    assert_eq!(identity_from_element(&element, &p).unwrap().agent(), "agent-1");
}

// === Linkerd ===

#[test]
fn linkerd_client_id_maps_to_the_kubernetes_spiffe_id() {
    let value = "agent-1.agents.serviceaccount.identity.linkerd.cluster.local";
    assert_eq!(spiffe_id_from_linkerd(value), Ok(id(AGENT_1)));
    let policy = MeshProfile::Linkerd.default_policy();
    assert_eq!(identity_from_linkerd(value, &policy).unwrap().agent(), "agent-1");
    let cp = "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local";
    assert!(matches!(
        identity_from_linkerd(cp, &policy),
        Err(IdentityError::Policy(PolicyError::NamespaceDenied { .. }))
    ));
    for bad in [
        "agent-1.agents",
        "a.b.serviceaccount.identity",
        "a.b.sa.identity.linkerd.cluster.local",
        "a..serviceaccount.identity.linkerd.cluster.local",
        "a.b.serviceaccount.identity.linkerd.Cluster",
    ] {
        assert!(matches!(spiffe_id_from_linkerd(bad), Err(IdentityError::BadLinkerdId { .. })), "{bad}");
    }
}
