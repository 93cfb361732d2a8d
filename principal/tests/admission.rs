//! Admission before side effects (docs/security.md): `Authenticate` applies every rule the
//! principal applies to later calls (`--allowed-namespaces`, the principal's own namespace,
//! names of non-agent certificates, the blocklist) before it signs a token or self-registers a
//! cluster, so a refused caller leaves nothing behind: no tokens, no cluster secret.

mod common;

use std::time::Duration;

use common::{Harness, authenticate, header_sessions};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use tonic::Code;

/// The shared client certificate self-registration copies into cluster secrets.
const SHARED: &str = "shared-client";

/// A hub with self-registration on, the shared client certificate in place, and the principal
/// admitting `allowed`.
async fn hub(allowed: &str) -> anyhow::Result<Harness> {
    let sessions = header_sessions(Duration::from_secs(300));
    let tokens = sessions.issuer().clone();
    let allowed = allowed.to_owned();
    let h = Harness::start_with_auth(
        &["agent-a"],
        move |config| {
            config.allowed_namespaces = vec![allowed];
            config.self_registration = Some(principal::registration::SelfRegistration {
                resource_proxy_address: "argocd-agent-resource-proxy:9090".into(),
                client_cert_secret: SHARED.into(),
                tokens,
            });
        },
        sessions,
    )
    .await?;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": SHARED},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": "cert", "tls.key": "key", "ca.crt": "ca"},
    }))?;
    Api::<Secret>::namespaced(h.client.clone(), "argocd").create(&PostParams::default(), &secret).await?;
    Ok(h)
}

async fn cluster_secret(h: &Harness, agent: &str) -> anyhow::Result<Option<Secret>> {
    Ok(Api::<Secret>::namespaced(h.client.clone(), "argocd").get_opt(&format!("cluster-{agent}")).await?)
}

/// A caller outside `--allowed-namespaces` gets no tokens and no cluster secret; an admitted
/// agent gets both (self-registration is on, so the refusal is what kept the secret away).
#[tokio::test]
async fn a_caller_outside_allowed_namespaces_gets_no_token_and_no_cluster_secret() -> anyhow::Result<()> {
    let h = hub("agent-*").await?;
    let refused = authenticate(&h.url, "outsider", "managed").await;
    let status = refused.expect_err("outsider must be refused").downcast::<tonic::Status>()?;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("--allowed-namespaces"), "names the flag: {}", status.message());
    assert!(cluster_secret(&h, "outsider").await?.is_none(), "no cluster secret for a refused caller");

    let admitted = authenticate(&h.url, "agent-a", "managed").await?;
    assert!(!admitted.access_token.is_empty());
    assert!(cluster_secret(&h, "agent-a").await?.is_some(), "self-registration ran for the admitted agent");
    h.stop().await
}

/// The principal's own certificate name (and the other names the PKI gives to non-agent
/// certificates) is never admitted as an agent, even when `--allowed-namespaces` covers it.
#[tokio::test]
async fn the_principals_certificate_name_is_never_an_agent() -> anyhow::Result<()> {
    let h = hub("*").await?;
    for name in auth::roles::NON_AGENT_NAMES {
        let refused = authenticate(&h.url, name, "managed").await;
        let status = refused.expect_err("a PKI name must be refused").downcast::<tonic::Status>()?;
        assert_eq!(status.code(), Code::PermissionDenied, "{name}: {status:?}");
        assert!(cluster_secret(&h, name).await?.is_none(), "no cluster secret for {name}");
    }
    // The principal's namespace: refused by the auth crate already (reserved), no secret either.
    assert!(authenticate(&h.url, "argocd", "managed").await.is_err());
    assert!(cluster_secret(&h, "argocd").await?.is_none());
    h.stop().await
}
