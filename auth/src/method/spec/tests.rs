//! Every `--auth` form, its defaults, and the errors that explain a refusal.

use super::*;

fn mtls(spec: &str) -> (IdentitySource, String, bool) {
    match AuthMethodSpec::parse(spec).expect("parses") {
        AuthMethodSpec::Mtls { source, regex, deprecated_syntax } => (source, regex.to_string(), deprecated_syntax),
        other => panic!("{spec}: {other:?}"),
    }
}

#[test]
fn mtls_forms() {
    assert_eq!(mtls("mtls:subject:CN=([^,]+)"), (IdentitySource::Subject, "CN=([^,]+)".into(), false));
    assert_eq!(
        mtls("mtls:uri:spiffe://td/ns/argocd/sa/(.+)"),
        (IdentitySource::Uri, "spiffe://td/ns/argocd/sa/(.+)".into(), false)
    );
    // Deprecated alias; the regex itself may contain ':'.
    assert_eq!(mtls("mtls:CN=(a:b)"), (IdentitySource::Subject, "CN=(a:b)".into(), true));
    let spec = AuthMethodSpec::parse("mtls:CN=([^,]+)").expect("parses");
    assert_eq!(spec.to_string(), "mtls:subject:CN=([^,]+)");
    assert_eq!(spec.method(), "mtls");
    assert!(spec.requires_client_certificates());
    assert_eq!(spec.authenticator().method(), "mtls");
}

#[test]
fn bad_mtls_configs_are_explained() {
    assert!(matches!(AuthMethodSpec::parse("mtls:subject:"), Err(SpecError::EmptyRegex { .. })));
    assert!(matches!(AuthMethodSpec::parse("mtls:"), Err(SpecError::EmptyRegex { .. })));
    assert!(matches!(AuthMethodSpec::parse("mtls:uri:("), Err(SpecError::InvalidRegex { .. })));
    let err = AuthMethodSpec::parse("mtls:subject:CN=agent").expect_err("no group");
    assert!(matches!(err, SpecError::NoCaptureGroup { .. }));
    assert!(err.to_string().contains("capture group"), "{err}");
    assert!(matches!(AuthMethodSpec::parse("mtls"), Err(SpecError::MissingConfig(_))));
    assert!(matches!(AuthMethodSpec::parse(""), Err(SpecError::Empty)));
}

#[test]
fn userpass_is_recognised_but_not_supported() {
    match AuthMethodSpec::parse("userpass:/etc/users") {
        Err(SpecError::NotSupportedYet { method, .. }) => assert_eq!(method, "userpass"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn spiffe_x509_defaults_and_options() {
    let spec = AuthMethodSpec::parse("spiffe:x509").expect("parses");
    let AuthMethodSpec::SpiffeX509 { policy, endpoint } = &spec else { panic!("{spec:?}") };
    assert_eq!(join(policy.trust_domains()), "cluster.local");
    assert_eq!(join(policy.patterns()), "/ns/{namespace}/sa/{agent}");
    assert!(policy.denied_namespaces().is_empty() && policy.allowed_namespaces().is_none());
    assert_eq!(endpoint, &None);
    assert_eq!(spec.method(), "spiffe-x509");
    assert!(spec.requires_client_certificates() && !spec.requires_plaintext_behind_proxy());
    assert!(spec.uses_workload_api() && spec.trusted_hops().is_none());
    assert!(matches!(spec.check_listener(true), Err(SpecError::TlsRequired { .. })));
    assert!(spec.check_listener(false).is_ok());
    assert_eq!(spec.authenticator().method(), "spiffe-x509");
    assert_eq!(spec.to_string(), "spiffe:x509:trust-domain=cluster.local;pattern=/ns/{namespace}/sa/{agent}");
    assert!(matches!(
        spec.clone().with_trusted_hops(TrustedHops::loopback()),
        Err(SpecError::TrustedHopsConflict { .. })
    ));

    let spec = AuthMethodSpec::parse(
        "spiffe:x509:trust-domain=prod.example,cluster.local; pattern=/agents/{namespace}/{agent};namespaces=a,b;\
         denied-namespaces=kube-system;endpoint=unix:///run/spire/agent.sock",
    )
    .expect("parses");
    let AuthMethodSpec::SpiffeX509 { policy, endpoint } = &spec else { panic!("{spec:?}") };
    assert_eq!(join(policy.trust_domains()), "prod.example,cluster.local");
    assert_eq!(policy.allowed_namespaces().map(join), Some("a,b".to_owned()));
    assert_eq!(join(policy.denied_namespaces()), "kube-system");
    assert_eq!(endpoint.as_deref(), Some("unix:///run/spire/agent.sock"));
    assert_eq!(spec.workload_endpoint(), Some("unix:///run/spire/agent.sock"));
    let again = AuthMethodSpec::parse(&spec.to_string()).expect("round trip");
    assert_eq!(again.to_string(), spec.to_string());
}

#[test]
fn spiffe_jwt_defaults_and_options() {
    let spec = AuthMethodSpec::parse("spiffe:jwt").expect("parses");
    let AuthMethodSpec::SpiffeJwt { audience, .. } = &spec else { panic!("{spec:?}") };
    assert_eq!(audience, "argocd-agent-principal");
    assert_eq!(spec.method(), "spiffe-jwt");
    assert!(!spec.requires_client_certificates() && !spec.requires_plaintext_behind_proxy());
    assert!(spec.check_listener(true).is_ok() && spec.check_listener(false).is_ok());
    let spec =
        AuthMethodSpec::parse("spiffe:jwt:audience=principal.example;trust-domain=prod.example").expect("parses");
    assert_eq!(
        spec.to_string(),
        "spiffe:jwt:audience=principal.example;trust-domain=prod.example;pattern=/ns/{namespace}/sa/{agent}"
    );
    let again = AuthMethodSpec::parse(&spec.to_string()).expect("round trip");
    assert_eq!(again.to_string(), spec.to_string());
    // Without a Workload API connection the authenticator refuses with a reason.
    let t = crate::identity::TransportIdentity::plaintext(None);
    let h = http::HeaderMap::new();
    let creds = std::collections::HashMap::from([("token".to_owned(), "x.y.z".to_owned())]);
    let cx = super::super::AuthContext { transport: &t, metadata: &h, credentials: Some(&creds) };
    let err = spec.authenticator().authenticate(&cx).expect_err("unconnected");
    assert!(err.to_string().contains("connect_authenticator"), "{err}");
}

#[test]
fn spiffe_errors_are_explained() {
    for (spec, needle) in [
        ("spiffe:x509:audience=a", "unknown key \"audience\""),
        ("spiffe:x509:trust_domain=a", "unknown key"),
        ("spiffe:jwt:audience", "is not key=value"),
        ("spiffe:jwt:audience=a;audience=b", "given twice"),
        ("spiffe:x509:pattern=/a;", "an item is empty"),
    ] {
        let err = AuthMethodSpec::parse(spec).expect_err(spec);
        assert!(matches!(err, SpecError::SpiffeSyntax { .. }), "{spec}: {err}");
        assert!(err.to_string().contains(needle), "{spec}: {err}");
    }
    assert!(AuthMethodSpec::parse("spiffe:x509:x=1").expect_err("x").to_string().contains(SPIFFE_X509_KEYS));
    for (spec, key) in [
        ("spiffe:x509:trust-domain=Bad.Domain", "trust-domain"),
        ("spiffe:x509:trust-domain=", "trust-domain"),
        ("spiffe:x509:pattern=/ns/{namespace}", "pattern"),
        ("spiffe:x509:pattern=/agent/{agent};namespaces=a", "namespaces"),
        ("spiffe:x509:endpoint=", "endpoint"),
        ("spiffe:jwt:audience=", "audience"),
        ("spiffe:jwt:audience=a,b", "audience"),
    ] {
        match AuthMethodSpec::parse(spec) {
            Err(SpecError::SpiffeValue { key: k, .. }) => assert_eq!(k, key, "{spec}"),
            other => panic!("{spec}: {other:?}"),
        }
    }
    assert!(matches!(AuthMethodSpec::parse("spiffe"), Err(SpecError::MissingConfig(_))));
}

fn xfcc(spec: &str) -> (MeshProfile, HeaderName, SpiffePolicy, Option<TrustedHops>) {
    match AuthMethodSpec::parse(spec).expect("parses") {
        AuthMethodSpec::Xfcc { profile, header, policy, trusted_hops } => (profile, header, policy, trusted_hops),
        other => panic!("{spec}: {other:?}"),
    }
}

fn xfcc_err(spec: &str) -> SpecError {
    AuthMethodSpec::parse(spec).expect_err(spec)
}

#[test]
fn xfcc_alone_is_the_istio_profile() {
    for spec in ["xfcc:", "xfcc", "xfcc: "] {
        let (profile, header, policy, hops) = xfcc(spec);
        assert_eq!(profile, MeshProfile::Istio);
        assert_eq!(header.as_str(), "x-forwarded-client-cert");
        assert_eq!(policy, MeshProfile::Istio.default_policy());
        assert_eq!(hops, None);
    }
    let spec = AuthMethodSpec::parse("xfcc:").expect("parses");
    assert_eq!(spec.method(), "header");
    assert!(spec.requires_plaintext_behind_proxy() && !spec.requires_client_certificates());
    assert_eq!(spec.trusted_hops(), Some(TrustedHops::loopback()));
    assert_eq!(spec.authenticator().method(), "header");
    assert_eq!(
        spec.to_string(),
        "xfcc:profile=istio;trust-domain=cluster.local;pattern=/ns/{namespace}/sa/{agent};\
         denied-namespaces=istio-system;trusted-hops=127.0.0.0/8,::1/128;header=x-forwarded-client-cert"
    );
    // The canonical form parses back to the same configuration.
    let again = AuthMethodSpec::parse(&spec.to_string()).expect("round trip");
    assert_eq!(again.to_string(), spec.to_string());
}

#[test]
fn xfcc_every_key() {
    let (profile, header, policy, hops) = xfcc(
        "xfcc:profile=envoy;trust-domain=cluster.local,prod.example;pattern=/ns/{namespace}/sa/{agent},\
         /agents/{namespace}/{agent};namespaces=a,b;denied-namespaces=kube-system;\
         trusted-hops=127.0.0.1/32,::1/128,10.0.0.7;header=X-Client-Identity",
    );
    assert_eq!(profile, MeshProfile::Envoy);
    assert_eq!(header.as_str(), "x-client-identity");
    assert_eq!(join(policy.trust_domains()), "cluster.local,prod.example");
    assert_eq!(join(policy.patterns()), "/ns/{namespace}/sa/{agent},/agents/{namespace}/{agent}");
    assert_eq!(policy.allowed_namespaces().map(join), Some("a,b".to_owned()));
    assert_eq!(join(policy.denied_namespaces()), "kube-system");
    assert_eq!(hops.map(|h| join(h.networks())), Some("127.0.0.1/32,::1/128,10.0.0.7/32".to_owned()));

    let (profile, header, policy, _) = xfcc("xfcc:profile=linkerd");
    assert_eq!((profile, header.as_str()), (MeshProfile::Linkerd, "l5d-client-id"));
    assert_eq!(policy, MeshProfile::Linkerd.default_policy());
    // denied-namespaces= (empty) denies none, so a pattern without {namespace} is allowed.
    let (_, _, policy, _) = xfcc("xfcc:pattern=/agent/{agent};denied-namespaces=");
    assert!(policy.denied_namespaces().is_empty());
    // Whitespace around items is tolerated.
    let (profile, ..) = xfcc("xfcc: profile = envoy ");
    assert_eq!(profile, MeshProfile::Envoy);
}

#[test]
fn xfcc_errors_are_explained() {
    let err = xfcc_err("xfcc:profile=istio;trust_domain=x");
    assert!(matches!(&err, SpecError::XfccUnknownKey { key, .. } if key == "trust_domain"), "{err}");
    assert!(err.to_string().contains(XFCC_KEYS), "{err}");
    for (spec, needle) in [
        ("xfcc:profile", "\"profile\" is not key=value"),
        ("xfcc:profile=istio;", "an item is empty"),
        ("xfcc:profile=istio;;header=x", "an item is empty"),
        ("xfcc:profile=istio;profile=envoy", "key profile is given twice"),
    ] {
        let err = xfcc_err(spec);
        assert!(matches!(err, SpecError::XfccSyntax { .. }), "{spec}: {err}");
        assert!(err.to_string().contains(needle) && err.to_string().contains(XFCC_KEYS), "{spec}: {err}");
    }
    for (spec, key, needle) in [
        ("xfcc:profile=consul", "profile", "expected one of istio, linkerd, envoy"),
        ("xfcc:trust-domain=Cluster.Local", "trust-domain", "Cluster.Local"),
        ("xfcc:trust-domain=", "trust-domain", "the list is empty"),
        ("xfcc:pattern=ns/{namespace}/sa/{agent}", "pattern", "must start with '/'"),
        ("xfcc:pattern=/ns/{namespace}/sa/{sa}", "pattern", "no {agent} placeholder"),
        ("xfcc:pattern=/sa/{agent}", "pattern", "give denied-namespaces= to deny none"),
        ("xfcc:pattern=/sa/{agent};denied-namespaces=x", "denied-namespaces", "no {namespace} placeholder"),
        ("xfcc:namespaces=", "namespaces", "the list is empty"),
        ("xfcc:pattern=/sa/{agent};denied-namespaces=;namespaces=a", "namespaces", "no {namespace} placeholder"),
        ("xfcc:trusted-hops=", "trusted-hops", "the list is empty"),
        ("xfcc:trusted-hops=127.0.0.1/33", "trusted-hops", "prefix length"),
        ("xfcc:trusted-hops=localhost", "trusted-hops", "not an IP address"),
        ("xfcc:header=", "header", "not a valid header name"),
        ("xfcc:header=x forwarded", "header", "not a valid header name"),
    ] {
        match xfcc_err(spec) {
            SpecError::XfccValue { key: k, reason, .. } => {
                assert_eq!(k, key, "{spec}");
                assert!(reason.contains(needle), "{spec}: {reason}");
            }
            other => panic!("{spec}: {other:?}"),
        }
    }
}

#[test]
fn header_mode_is_upstreams_syntax() {
    let istio = "header:X-Forwarded-Client-Cert:^.*URI=spiffe://[^/]+/ns/[^/]+/sa/([^,;]+)";
    match AuthMethodSpec::parse(istio).expect("parses") {
        AuthMethodSpec::Header { header, regex, trusted_hops } => {
            assert_eq!(header.as_str(), "x-forwarded-client-cert");
            assert_eq!(regex.as_str(), "^.*URI=spiffe://[^/]+/ns/[^/]+/sa/([^,;]+)");
            assert_eq!(trusted_hops, None);
        }
        other => panic!("{other:?}"),
    }
    let spec = AuthMethodSpec::parse(r"header:l5d-client-id:^([^.]+)\..*").expect("parses");
    assert_eq!(spec.to_string(), r"header:l5d-client-id:^([^.]+)\..*");
    assert_eq!((spec.method(), spec.authenticator().method()), ("header", "header"));
    assert!(spec.requires_plaintext_behind_proxy());
    // The regex may contain ':'.
    assert!(AuthMethodSpec::parse("header:x-id:^a:(.+)$").is_ok());

    for spec in ["header:x-id", "header::(.+)"] {
        assert!(matches!(AuthMethodSpec::parse(spec), Err(SpecError::HeaderSyntax { .. })), "{spec}");
    }
    assert!(matches!(AuthMethodSpec::parse("header"), Err(SpecError::MissingConfig(_))));
    assert!(matches!(AuthMethodSpec::parse("header:x id:(.+)"), Err(SpecError::BadHeaderName { .. })));
    assert!(matches!(AuthMethodSpec::parse("header:x-id:"), Err(SpecError::EmptyRegex { .. })));
    assert!(matches!(AuthMethodSpec::parse("header:x-id:("), Err(SpecError::InvalidRegex { .. })));
    assert!(matches!(AuthMethodSpec::parse("header:x-id:agent"), Err(SpecError::NoCaptureGroup { .. })));
}

#[test]
fn trusted_hops_are_set_in_one_place() {
    let ten = TrustedHops::parse_list("10.9.9.9/32").expect("hops");
    let spec = AuthMethodSpec::parse("header:x-id:(.+)").expect("parses").with_trusted_hops(ten.clone()).expect("set");
    assert_eq!(spec.trusted_hops(), Some(ten.clone()));
    let spec = AuthMethodSpec::parse("xfcc:").expect("parses").with_trusted_hops(ten.clone()).expect("set");
    assert_eq!(spec.trusted_hops(), Some(ten.clone()));
    let err = AuthMethodSpec::parse("xfcc:trusted-hops=::1").expect("parses").with_trusted_hops(ten.clone());
    assert!(matches!(err, Err(SpecError::TrustedHopsConflict { .. })), "{err:?}");
    let err = AuthMethodSpec::parse("mtls:subject:CN=(.+)").expect("parses").with_trusted_hops(ten);
    assert!(matches!(err, Err(SpecError::TrustedHopsConflict { .. })), "{err:?}");
    assert_eq!(AuthMethodSpec::parse("mtls:subject:CN=(.+)").expect("parses").trusted_hops(), None);
}

#[test]
fn listener_checks() {
    let mtls = AuthMethodSpec::parse("mtls:subject:CN=([^,]+)").expect("parses");
    let xfcc = AuthMethodSpec::parse("xfcc:").expect("parses");
    let header = AuthMethodSpec::parse("header:x-forwarded-client-cert:URI=spiffe://[^/]+/ns/[^/]+/sa/([^,;]+)")
        .expect("parses");
    let loopback = TrustedHops::loopback();

    assert!(check_listener(&mtls, false, &loopback).is_ok());
    let err = check_listener(&mtls, true, &loopback).expect_err("mtls on plaintext");
    assert!(matches!(err, SpecError::TlsRequired { .. }) && err.to_string().contains("--insecure-plaintext"), "{err}");
    assert!(mtls.check_listener(true).is_err());

    for spec in [&xfcc, &header] {
        assert!(check_listener(spec, true, &loopback).is_ok(), "{spec}");
        assert!(spec.check_listener(true).is_ok(), "{spec}");
        let err = check_listener(spec, false, &loopback).expect_err("header over TLS");
        assert!(matches!(err, SpecError::PlaintextRequired { .. }), "{err}");
        assert!(err.to_string().contains("plaintext gRPC behind the sidecar"), "{err}");
        assert!(spec.check_listener(false).is_err());

        let any = TrustedHops::parse_list("127.0.0.1, 0.0.0.0/0").expect("hops");
        let err = check_listener(spec, true, &any).expect_err("any source");
        assert!(matches!(err, SpecError::UnrestrictedTrust { .. }), "{err}");
        assert!(err.to_string().contains("trusts every source") && err.to_string().contains("0.0.0.0/0"), "{err}");
        let err = check_listener(spec, true, &TrustedHops::parse_list("::/0").expect("hops")).expect_err("v6 any");
        assert!(err.to_string().contains("upstream trusts any caller"), "{err}");
        let err = check_listener(spec, true, &TrustedHops::new([])).expect_err("none");
        assert!(err.to_string().contains("trust no source"), "{err}");
    }
    let wide = AuthMethodSpec::parse("xfcc:trusted-hops=0.0.0.0/0").expect("parses");
    assert!(matches!(wide.check_listener(true), Err(SpecError::UnrestrictedTrust { .. })));
}

#[test]
fn unknown_methods_are_refused() {
    assert!(matches!(AuthMethodSpec::parse("oidc:x"), Err(SpecError::UnknownMethod(m)) if m == "oidc"));
    assert!(matches!(AuthMethodSpec::parse("spiffe:k8s"), Err(SpecError::UnknownMethod(_))));
    assert!(matches!(AuthMethodSpec::parse("kerberos"), Err(SpecError::UnknownMethod(_))));
}

#[test]
fn upstream_spiffe_jwt_regex_and_spire_defaults() {
    // Upstream v0.10's `spiffe-jwt:<regex>`: the regex over the whole SPIFFE ID, audience fixed.
    let spec = AuthMethodSpec::parse("spiffe-jwt:spiffe://prod\\.example/agents/(.+)").expect("parses");
    let AuthMethodSpec::SpiffeJwtRegex { regex, audience, endpoint, binding } = &spec else { panic!("{spec:?}") };
    assert_eq!(regex.as_str(), "spiffe://prod\\.example/agents/(.+)");
    assert_eq!(audience, "argocd-agent-principal");
    assert_eq!((endpoint, binding), (&None, &JwtSessionBinding::EveryCall));
    assert_eq!(spec.method(), "spiffe-jwt");
    assert_eq!(spec.authenticator().method(), "spiffe-jwt");
    assert!(spec.uses_workload_api() && !spec.requires_client_certificates());
    assert_eq!(spec.to_string(), "spiffe-jwt:spiffe://prod\\.example/agents/(.+)");
    assert!(matches!(AuthMethodSpec::parse("spiffe-jwt:"), Err(SpecError::EmptyRegex { .. })));
    assert!(matches!(AuthMethodSpec::parse("spiffe-jwt:spiffe://td/a"), Err(SpecError::NoCaptureGroup { .. })));
    assert!(matches!(AuthMethodSpec::parse("spiffe-jwt"), Err(SpecError::MissingConfig(_))));

    // Upstream's defaults when SPIRE is on and --auth is empty, with the socket as endpoint.
    let mtls = AuthMethodSpec::spire_default(SpireAuthMethod::Mtls, Some("unix:///run/spire/a.sock")).expect("mtls");
    assert_eq!(mtls.to_string(), "mtls:uri:spiffe://[^/]+/(.+)");
    assert_eq!(mtls.to_string(), SPIRE_MTLS_DEFAULT);
    assert_eq!(mtls.method(), "mtls");
    let jwt = AuthMethodSpec::spire_default(SpireAuthMethod::Jwt, Some("unix:///run/spire/a.sock")).expect("jwt");
    assert_eq!(jwt.to_string(), SPIRE_JWT_DEFAULT);
    assert_eq!(jwt.workload_endpoint(), Some("unix:///run/spire/a.sock"));
    // An endpoint the spec names itself wins over the socket.
    let own = AuthMethodSpec::parse("spiffe:jwt:endpoint=unix:/own.sock").expect("parses");
    assert_eq!(own.with_workload_endpoint(Some("unix:/spire.sock")).workload_endpoint(), Some("unix:/own.sock"));
    assert_eq!("jwt".parse::<SpireAuthMethod>(), Ok(SpireAuthMethod::Jwt));
    assert!("x509".parse::<SpireAuthMethod>().expect_err("unknown").contains("'jwt' or 'mtls'"));

    // The login-only binding is for JWT-SVID methods only.
    let login = jwt.with_jwt_binding(JwtSessionBinding::LoginOnly).expect("jwt");
    assert!(matches!(login, AuthMethodSpec::SpiffeJwtRegex { binding: JwtSessionBinding::LoginOnly, .. }));
    assert!(matches!(mtls.with_jwt_binding(JwtSessionBinding::LoginOnly), Err(SpecError::NotJwt { .. })));
}
