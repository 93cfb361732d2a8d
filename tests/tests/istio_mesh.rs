//! A real Istio control plane (phase 1 of the Istio mesh, `tests::istio`): istiod built from the
//! `istio.io/istio` Go module runs against the real kube-apiserver (`tests::realkube`), and a
//! workload outside Kubernetes joins its mesh the way Istio's VM docs prescribe (WorkloadGroup,
//! bootstrap ServiceAccount token, `pilot-agent proxy sidecar`, no iptables). The test shows that
//! istiod's own CA signs the workload's certificate with its SPIFFE ID after validating the token
//! through the API server, that pilot-agent hands it to the venv's Envoy over SDS, and that istiod
//! pushes Envoy a configuration it accepts (inbound listener from the `Sidecar` resource).
//!
//! Phase 2 (`tests::istio::IstioMesh`): our `istio/principal` manifests applied to the hub
//! (adapted only where a workload outside Kubernetes needs it, see `adapt_principal_overlay`),
//! the principal behind its Istio sidecar, a managed and an autonomous agent each behind its
//! own, every certificate from istiod: the principal identifies the agents from the XFCC
//! Istio's sidecar sets, Applications sync both ways, PeerAuthentication STRICT refuses a
//! plaintext caller, and the AuthorizationPolicy refuses a workload that is not an agent (and a
//! gateway identity) before it reaches the principal; let through by the policy, the gateway is
//! still refused by the principal's `istio` profile.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use protocol::pb::authapi::AuthRequest;
use protocol::pb::authapi::authentication_client::AuthenticationClient;
use serde_json::{Value, json};
use tests::apps::{apps, path_is, wait_object};
use tests::istio::{ARGOCD_NS, ISTIO_NAMESPACE, IstioMesh, IstioMeshOptions, Istiod, MeshWorkload, WorkloadSpec};
use tests::realkube::RealCluster;
use tests::topology::Mode;
use tests::wait_for_async;
use x509_parser::prelude::{FromDer as _, GeneralName, ParsedExtension, X509Certificate};

const NS: &str = "argocd";
const WORKLOAD: &str = "agent-1";

/// The DER of every certificate in `pem`, in order.
fn pem_certs(pem: &str) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        out.push(block.context("bad PEM")?.contents);
    }
    ensure!(!out.is_empty(), "no certificate in PEM");
    Ok(out)
}

fn uri_sans(cert: &X509Certificate<'_>) -> Vec<String> {
    cert.extensions()
        .iter()
        .filter_map(|e| match e.parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => Some(san),
            _ => None,
        })
        .flat_map(|san| san.general_names.iter())
        .filter_map(|n| match n {
            GeneralName::URI(uri) => Some((*uri).to_string()),
            _ => None,
        })
        .collect()
}

/// Names of the dynamic resources of one kind in Envoy's `/config_dump` (`dynamic_listeners`,
/// `dynamic_active_clusters`).
fn dynamic_names(dump: &Value, field: &str) -> Vec<String> {
    dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c[field].as_array().into_iter().flatten())
        .filter_map(|r| {
            r["name"]
                .as_str()
                .or_else(|| r["cluster"]["name"].as_str())
                .or_else(|| r["active_state"]["listener"]["name"].as_str())
        })
        .map(str::to_string)
        .collect()
}

/// A counter from Envoy's plain `/stats` (`name: value` lines).
fn envoy_stat(stats: &str, name: &str) -> Option<u64> {
    stats.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(": ")?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istiod_signs_a_vm_workload_certificate_and_programs_its_envoy() -> Result<()> {
    let cluster = RealCluster::start().await?;
    let mut istiod = Istiod::start(&cluster).await?;
    // Where the application would listen; nothing needs to for this test.
    let app_port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let spec = WorkloadSpec::new(NS, WORKLOAD, app_port);
    let expected_id = spec.spiffe_id();
    let mut workload = MeshWorkload::join(&cluster, &istiod, spec).await?;

    // The certificate pilot-agent wrote to OUTPUT_CERTS: the workload's SPIFFE ID, nothing else,
    // issued by istiod's self-signed root (the one published in istio-ca-root-cert).
    let chain = pem_certs(&workload.cert_chain_pem()?)?;
    let (_, leaf) = X509Certificate::from_der(&chain[0])?;
    assert_eq!(uri_sans(&leaf), vec![expected_id.clone()], "SANs of the workload certificate");
    let root_der = pem_certs(istiod.root_cert_pem())?.remove(0);
    let (_, root) = X509Certificate::from_der(&root_der)?;
    assert_eq!(leaf.issuer(), root.subject(), "the workload certificate is issued by istiod's root");
    let key_id = |c: &X509Certificate<'_>, authority: bool| {
        c.extensions().iter().find_map(|e| match e.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(aki) if authority => {
                aki.key_identifier.as_ref().map(|k| k.0.to_vec())
            }
            ParsedExtension::SubjectKeyIdentifier(ski) if !authority => Some(ski.0.to_vec()),
            _ => None,
        })
    };
    assert_eq!(key_id(&leaf, true), key_id(&root, false), "the leaf's authority key ID is the root's key ID");
    assert_eq!(root.subject().to_string(), "O=cluster.local", "istiod's self-signed root");

    // Envoy got the same identity from pilot-agent's SDS.
    let uris = wait_for_async(Duration::from_secs(60), "Envoy to hold the workload certificate", || async {
        anyhow::Ok(workload.envoy_cert_uris().await.ok().filter(|u| u.contains(&expected_id)))
    })
    .await?;
    assert_eq!(uris, vec![expected_id.clone()], "Envoy's certificates (/certs)");

    // istiod's configuration, accepted by upstream Envoy: the inbound listener of the Sidecar
    // resource on 127.0.0.1 and istiod's clusters, and no rejected update.
    let inbound = format!("127.0.0.1_{}", workload.ports().inbound);
    let dump = wait_for_async(Duration::from_secs(60), "the inbound listener in Envoy's config_dump", || async {
        anyhow::Ok(
            workload.config_dump().await.ok().filter(|d| dynamic_names(d, "dynamic_listeners").contains(&inbound)),
        )
    })
    .await?;
    let clusters = dynamic_names(&dump, "dynamic_active_clusters");
    for name in ["BlackHoleCluster", "PassthroughCluster", "InboundPassthroughCluster"] {
        assert!(clusters.iter().any(|c| c == name), "cluster {name} from istiod in {clusters:?}");
    }
    let stats = workload.envoy_admin("/stats?filter=update_rejected").await?;
    for counter in ["cluster_manager.cds.update_rejected", "listener_manager.lds.update_rejected"] {
        assert_eq!(envoy_stat(&stats, counter), Some(0), "{counter} in\n{stats}");
    }

    // That Envoy is the venv's, started by pilot-agent with the bootstrap it rendered.
    let server_info: Value = serde_json::from_str(&workload.envoy_admin("/server_info").await?)?;
    let config_path = server_info["command_line_options"]["config_path"].as_str().unwrap_or_default();
    assert!(config_path.ends_with("/etc/istio/proxy/envoy-rev.json"), "Envoy's bootstrap: {server_info}");
    assert_eq!(server_info["state"], "LIVE", "{server_info}");

    // istiod says so too: it signed the CSR for that identity, auto-registered the WorkloadEntry
    // and pushed the proxy its listeners and clusters.
    let node = format!("{}.{NS}", workload.spec().node_name());
    let log = istiod.log();
    for needle in [
        format!("CSR successfully signed, sans [{expected_id}]"),
        format!("auto-registered WorkloadEntry {NS}/{WORKLOAD}-127.0.0.1"),
        format!("CDS: PUSH request for node:{node}"),
        format!("LDS: PUSH request for node:{node}"),
    ] {
        assert!(log.contains(&needle), "istiod's log lacks {needle:?}\n{}", istiod.process().log_tail(60));
    }
    let gvk = kube::api::GroupVersionKind::gvk("networking.istio.io", "v1", "WorkloadEntry");
    let entries: Api<DynamicObject> = Api::namespaced_with(cluster.client(), NS, &ApiResource::from_gvk(&gvk));
    let entry = entries.get(&format!("{WORKLOAD}-127.0.0.1")).await.context("the auto-registered WorkloadEntry")?;
    assert_eq!(entry.data["spec"]["serviceAccount"], WORKLOAD);
    assert_eq!(entry.data["spec"]["address"], "127.0.0.1");

    istiod.ensure_running()?;
    workload.ensure_running()?;
    Ok(())
}

// === Phase 2: the principal and its agents behind Istio-programmed sidecars ===

const MANAGED: &str = "agent-1";
const AUTONOMOUS: &str = "agent-2";
const CONVERGE: Duration = Duration::from_secs(90);

/// `Authenticate` as an agent with `--creds header:` would, in h2c to `addr`.
async fn authenticate(addr: SocketAddr) -> Result<tonic::Response<protocol::pb::authapi::AuthResponse>, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| tonic::Status::internal(e.to_string()))?
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(20))
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e}")))?;
    let request = AuthRequest {
        method: "header".to_string(),
        credentials: HashMap::new(),
        mode: "managed".to_string(),
        version: tests::loadgen::VERSION.to_string(),
        agent_namespace: ARGOCD_NS.to_string(),
    };
    AuthenticationClient::new(channel).authenticate(request).await
}

/// The sum of a counter's samples in Prometheus text (0 when absent).
fn counter_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The sum of Envoy's counters (plain `/stats`) whose name contains every part of `parts`.
fn envoy_stat_sum(stats: &str, parts: &[&str]) -> u64 {
    stats
        .lines()
        .filter_map(|l| l.split_once(": "))
        .filter(|(name, _)| parts.iter().all(|p| name.contains(p)))
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum()
}

async fn stats(w: &MeshWorkload) -> Result<String> {
    w.envoy_admin("/stats").await
}

fn refusals(log: &str) -> usize {
    log.lines().filter(|l| l.contains("authentication refused")).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn principal_and_agents_behind_istio_sidecars() -> Result<()> {
    let started = Instant::now();
    let mut mesh = IstioMesh::start(&[(MANAGED, Mode::Managed), (AUTONOMOUS, Mode::Autonomous)]).await?;
    eprintln!("mesh up in {:.1?}; changes to istio/principal: {:#?}", started.elapsed(), mesh.overlay().changes);
    let net = mesh.net();

    // (a) Each agent authenticated by the SPIFFE ID in the XFCC element its sidecar's peer, the
    // principal's sidecar, appended: the session is bound to that ID.
    let log = mesh.principal_log();
    for agent in [MANAGED, AUTONOMOUS] {
        let id = format!("spiffe://cluster.local/ns/{ARGOCD_NS}/sa/{agent}");
        assert!(
            log.lines().any(|l| l.contains("agent authenticated")
                && l.contains(&format!("agent={agent} "))
                && l.contains(&id)),
            "the principal did not authenticate {agent} as {id}:\n{}",
            mesh.logs()
        );
        // The agent's sidecar holds istiod's certificate for the agent's ServiceAccount.
        assert_eq!(mesh.agent_sidecar(agent)?.envoy_cert_uris().await?, vec![id.clone()], "{agent}'s sidecar");
        // The principal's sidecar logged the Authenticate call with that peer and the XFCC it set
        // (Envoy flushes its access log every few seconds).
        let xfcc = format!("xfcc=By=spiffe://cluster.local/ns/{ARGOCD_NS}/sa/argocd-agent-principal;Hash=");
        let logged = |access: &str| {
            access.lines().any(|l| {
                l.contains("istio-access")
                    && l.contains("/authapi.Authentication/Authenticate 200")
                    && l.contains(&format!("peer={id} "))
                    && l.contains(&xfcc)
                    && l.ends_with(&format!(";Subject=\"\";URI={id}"))
            })
        };
        let waited = tests::wait_until_async(Duration::from_secs(30), "the access log line", || async {
            logged(&mesh.principal_sidecar().log())
        })
        .await;
        assert!(
            waited.is_ok(),
            "no access log line of {agent}'s Authenticate with its XFCC:\n{}",
            mesh.principal_sidecar()
                .log()
                .lines()
                .filter(|l| l.contains("istio-access"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert_eq!(
        mesh.principal_sidecar().envoy_cert_uris().await?,
        vec![format!("spiffe://cluster.local/ns/{ARGOCD_NS}/sa/argocd-agent-principal")]
    );
    let istiod_log = mesh.istiod().log();
    for sa in ["argocd-agent-principal", MANAGED, AUTONOMOUS] {
        let needle = format!("CSR successfully signed, sans [spiffe://cluster.local/ns/{ARGOCD_NS}/sa/{sa}]");
        assert!(istiod_log.contains(&needle), "istiod's log lacks {needle:?}");
    }

    // Managed: created on the hub, it reaches the spoke; status from the spoke comes back.
    let hub_managed = apps(&mesh.hub(), MANAGED);
    let spoke_managed = apps(&mesh.spoke(MANAGED)?, ARGOCD_NS);
    hub_managed.create(&PostParams::default(), &tests::fixtures::app_with_path("web", MANAGED, "v1")?).await?;
    wait_object(&spoke_managed, "web", CONVERGE, "the managed app reaches the spoke", path_is("v1"), || mesh.logs())
        .await?;
    spoke_managed
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}})),
        )
        .await?;
    wait_object(
        &hub_managed,
        "web",
        CONVERGE,
        "the managed app's status comes back to the hub",
        |o| o.is_some_and(|o| o["status"]["health"]["status"] == "Healthy"),
        || mesh.logs(),
    )
    .await?;
    // Autonomous: created on the spoke, it appears on the hub.
    let spoke_autonomous = apps(&mesh.spoke(AUTONOMOUS)?, ARGOCD_NS);
    let hub_autonomous = apps(&mesh.hub(), AUTONOMOUS);
    spoke_autonomous.create(&PostParams::default(), &tests::fixtures::app_with_path("svc", ARGOCD_NS, "v1")?).await?;
    wait_object(&hub_autonomous, "svc", CONVERGE, "the autonomous app reaches the hub", path_is("v1"), || mesh.logs())
        .await?;
    eprintln!("synced both ways after {:.1?}", started.elapsed());

    let metrics = mesh.principal_metrics().await?;
    let failures_before = counter_sum(&metrics, "argocd_principal_auth_failures_total");
    assert_eq!(failures_before, 0.0, "no refused authentication so far:\n{metrics}");
    let refused_before = refusals(&mesh.principal_log());

    // (b) PeerAuthentication STRICT: plaintext to the principal's inbound listener is reset.
    let inbound_stats = stats(mesh.principal_sidecar()).await?;
    let listener = format!("listener.{}_{}", net.principal_inbound().ip(), net.principal_inbound().port());
    let no_match_before = envoy_stat_sum(&inbound_stats, &[&listener, "no_filter_chain_match"]);
    let plaintext = authenticate(net.principal_inbound()).await.expect_err("plaintext must not get through");
    eprintln!("plaintext caller: {plaintext}");
    assert!(
        // The connection is reset (hyper reports it as Unknown, Unavailable or Cancelled), no
        // HTTP answer: no RBAC denial, no principal.
        matches!(
            plaintext.code(),
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Cancelled
        ) && !plaintext.message().contains("RBAC"),
        "plaintext caller: {plaintext:?}"
    );
    let inbound_stats = stats(mesh.principal_sidecar()).await?;
    let no_match = envoy_stat_sum(&inbound_stats, &[&listener, "no_filter_chain_match"]);
    eprintln!("{listener} no_filter_chain_match {no_match_before} -> {no_match}");
    assert!(no_match > no_match_before, "STRICT: the plaintext connection matched no filter chain\n{inbound_stats}");

    // (c) A workload that is not an agent, with its own ServiceAccount in argocd (it matches the
    // principal's --auth pattern): the AuthorizationPolicy refuses it in the principal's sidecar.
    let intruder = mesh.join_client(ARGOCD_NS, "argocd-server", "argocd-server", 5).await?;
    let rbac_before = envoy_stat_sum(&stats(mesh.principal_sidecar()).await?, &["rbac.denied"]);
    let denied = authenticate(net.client(5)).await.expect_err("the policy must refuse argocd-server");
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    assert!(denied.message().contains("RBAC: access denied"), "{denied:?}");
    let rbac_after = envoy_stat_sum(&stats(mesh.principal_sidecar()).await?, &["rbac.denied"]);
    assert!(rbac_after > rbac_before, "the principal's sidecar counted the denial ({rbac_before} -> {rbac_after})");

    // (d) A gateway identity (istio-system): refused by the policy too.
    let gateway = mesh.join_client(ISTIO_NAMESPACE, "istio-eastwestgateway", "istio-eastwestgateway", 6).await?;
    let denied = authenticate(net.client(6)).await.expect_err("the policy must refuse the gateway");
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    assert!(denied.message().contains("RBAC: access denied"), "{denied:?}");

    // Neither reached the principal: no refusal logged, none counted.
    assert_eq!(refusals(&mesh.principal_log()), refused_before, "the principal saw a refused caller:\n{}", mesh.logs());
    let metrics = mesh.principal_metrics().await?;
    assert_eq!(counter_sum(&metrics, "argocd_principal_auth_failures_total"), 0.0, "{metrics}");

    // Let the gateway through the policy (as a too-wide policy would): the principal's own
    // `istio` profile still refuses istio-system.
    let gateway_id = format!("cluster.local/ns/{ISTIO_NAMESPACE}/sa/istio-eastwestgateway");
    mesh.set_policy_principals(&[&gateway_id])?;
    let refused = tests::wait_for_async(
        Duration::from_secs(60),
        "the widened policy to reach the principal's sidecar",
        || async {
            match authenticate(net.client(6)).await {
                Err(s) if s.code() == tonic::Code::PermissionDenied && s.message().contains("RBAC") => anyhow::Ok(None),
                other => anyhow::Ok(Some(other)),
            }
        },
    )
    .await?;
    let status = refused.expect_err("the principal must refuse the gateway");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("istio-system"), "{status:?}");
    let metrics = mesh.principal_metrics().await?;
    assert_eq!(counter_sum(&metrics, "argocd_principal_auth_failures_total"), 1.0, "{metrics}");
    mesh.set_policy_principals(&[])?;

    // Everything still up, both agents connected once (no reconnect through all this).
    assert_eq!(mesh.not_running(), Vec::<String>::new(), "{}", mesh.logs());
    for agent in [MANAGED, AUTONOMOUS] {
        assert_eq!(mesh.principal_connects(agent), 1, "{agent} reconnected:\n{}", mesh.logs());
    }
    if let Ok(dir) = std::env::var("ISTIO_MESH_DUMP") {
        std::fs::write(format!("{dir}/istiod.log"), mesh.istiod().log())?;
        std::fs::write(
            format!("{dir}/principal-sidecar.json"),
            mesh.principal_sidecar().config_dump().await?.to_string(),
        )?;
        std::fs::write(
            format!("{dir}/agent-sidecar.json"),
            mesh.agent_sidecar(MANAGED)?.config_dump().await?.to_string(),
        )?;
        std::fs::write(format!("{dir}/principal-sidecar.log"), mesh.principal_sidecar().log())?;
    }
    drop((intruder, gateway));
    eprintln!("done after {:.1?}", started.elapsed());
    Ok(())
}

/// The serial numbers of the certificates Envoy holds (`/certs`).
async fn envoy_serials(w: &MeshWorkload) -> Result<Vec<String>> {
    let certs: Value = serde_json::from_str(&w.envoy_admin("/certs").await?)?;
    Ok(certs["certificates"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["cert_chain"].as_array().into_iter().flatten())
        .filter(|c| c["subject_alt_names"].as_array().is_some_and(|s| s.iter().any(|s| s["uri"].is_string())))
        .filter_map(|c| c["serial_number"].as_str().map(str::to_string))
        .collect())
}

/// istiod rotates every workload certificate (pilot-agent's `SECRET_TTL` 40s) and the sidecars'
/// HTTP stream idle timeout is 6s (ProxyConfig `connectionSettings.httpStreamIdleTimeout`; istiod
/// programs none on sidecars by default): the agents' streams, with 2s heartbeats, stay up
/// through both, and Applications still sync; an agent without heartbeats (the control) has its
/// quiet stream reset by Istio's idle timeout and reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_stay_up_across_istio_cert_rotation_and_idle_timeout() -> Result<()> {
    const QUIET: &str = "agent-3";
    let started = Instant::now();
    let options = IstioMeshOptions {
        proxy_env: vec![("SECRET_TTL".to_string(), "40s".to_string())],
        proxy_config: json!({"connectionSettings": {"httpStreamIdleTimeout": "6s"}})
            .as_object()
            .cloned()
            .context("an object")?,
        heartbeats: [(MANAGED, "2s"), (AUTONOMOUS, "2s"), (QUIET, "0")]
            .into_iter()
            .map(|(a, h)| (a.to_string(), h.to_string()))
            .collect(),
        ..IstioMeshOptions::default()
    };
    let mut mesh = IstioMesh::start_with(
        &[(MANAGED, Mode::Managed), (AUTONOMOUS, Mode::Autonomous), (QUIET, Mode::Managed)],
        options,
    )
    .await?;
    eprintln!("mesh up in {:.1?}", started.elapsed());
    // istiod programmed the 6s stream idle timeout into both ends.
    for dump in [mesh.principal_sidecar().config_dump().await?, mesh.agent_sidecar(MANAGED)?.config_dump().await?] {
        let text = dump.to_string();
        assert!(text.contains("\"stream_idle_timeout\":\"6s\""), "no 6s stream_idle_timeout in the sidecar's config");
    }

    // Watch the certificates for 70s.
    let mut serials: HashMap<&str, Vec<String>> = HashMap::new();
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(70) {
        for (who, w) in [
            ("principal", mesh.principal_sidecar()),
            (MANAGED, mesh.agent_sidecar(MANAGED)?),
            (AUTONOMOUS, mesh.agent_sidecar(AUTONOMOUS)?),
        ] {
            let seen = serials.entry(who).or_default();
            for serial in envoy_serials(w).await.unwrap_or_default() {
                if !seen.contains(&serial) {
                    seen.push(serial);
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    eprintln!("certificates seen in 70s: {serials:?}");
    for (who, seen) in &serials {
        assert!(seen.len() >= 3, "{who}'s sidecar was not rotated twice in 70s: {seen:?}");
    }
    let log = mesh.istiod().log();
    for sa in ["argocd-agent-principal", MANAGED, AUTONOMOUS] {
        let needle = format!("CSR successfully signed, sans [spiffe://cluster.local/ns/{ARGOCD_NS}/sa/{sa}]");
        let signed = log.matches(&needle).count();
        assert!(signed >= 3, "istiod signed {signed} certificates for {sa}");
    }

    // The heartbeating agents never reconnected; the quiet one was cut by the idle timeout.
    for agent in [MANAGED, AUTONOMOUS] {
        assert_eq!(mesh.principal_connects(agent), 1, "{agent} reconnected:\n{}", mesh.logs());
    }
    let quiet = mesh.principal_connects(QUIET);
    eprintln!("{QUIET} (no heartbeats) connected {quiet} times");
    assert!(quiet >= 3, "{QUIET}'s quiet stream should be reset every 6s, it connected {quiet} times");

    // And the streams carry events after the rotations.
    let hub = apps(&mesh.hub(), MANAGED);
    let spoke = apps(&mesh.spoke(MANAGED)?, ARGOCD_NS);
    hub.create(&PostParams::default(), &tests::fixtures::app_with_path("after-rotation", MANAGED, "v1")?).await?;
    wait_object(&spoke, "after-rotation", CONVERGE, "an app after the rotations", path_is("v1"), || mesh.logs())
        .await?;
    let spoke = apps(&mesh.spoke(AUTONOMOUS)?, ARGOCD_NS);
    let hub = apps(&mesh.hub(), AUTONOMOUS);
    spoke.create(&PostParams::default(), &tests::fixtures::app_with_path("after-rotation", ARGOCD_NS, "v1")?).await?;
    wait_object(&hub, "after-rotation", CONVERGE, "an autonomous app after the rotations", path_is("v1"), || {
        mesh.logs()
    })
    .await?;
    assert_eq!(mesh.principal_connects(MANAGED), 1);
    assert_eq!(mesh.principal_connects(AUTONOMOUS), 1);
    assert_eq!(mesh.not_running(), Vec::<String>::new(), "{}", mesh.logs());
    eprintln!("done after {:.1?}", started.elapsed());
    Ok(())
}
