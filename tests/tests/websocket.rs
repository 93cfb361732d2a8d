//! gRPC over WebSocket (`--enable-websocket`), spawned binaries on loopback with real TLS:
//!
//! * our agent and our principal, both with `--enable-websocket`: managed sync and status back;
//! * our client over WebSocket against our principal: Authenticate, RefreshToken, Version, the
//!   auth layer (no token, no client certificate) and a trailers-only error, with native HTTP/2
//!   still served on the same port;
//! * the Go peer speaking grpc-http1's wire (`tests/gopeer/cmd/gopeer/grpcws.go`, on
//!   `github.com/coder/websocket` as grpc-http1 is): an upstream-style agent against our
//!   principal, and our agent against an upstream-style principal behind the downgrading handler;
//! * upstream's `Test_WithHTTP1Downgrade`: behind a real Envoy that speaks only HTTP/1.1 to the
//!   principal, an agent without `--enable-websocket` never connects, and with it does.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use kube::api::{Patch, PatchParams, PostParams};
use protocol::mode::AgentMode;
use protocol::pb::authapi::authentication_client::AuthenticationClient;
use protocol::pb::eventstreamapi::PingRequest;
use protocol::pb::eventstreamapi::event_stream_client::EventStreamClient;
use protocol::pb::versionapi::VersionRequest;
use protocol::pb::versionapi::version_client::VersionClient;
use protocol::{EventType, Target};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tests::apps::{apps, converge as wait_app, path_is};
use tests::fixtures::dynamic;
use tests::gopeer::{GoPeer, OUR_VERSION, Pki, check_received};
use tests::process::ChildProcess;
use tests::topology::{ARGOCD_NS, Mode, StartOptions, Topology};
use tests::wait::{wait_for, wait_until_async};

const CONVERGE: Duration = Duration::from_secs(60);

fn websocket_options(start_agents: bool) -> StartOptions {
    StartOptions {
        start_agents,
        principal_args: vec!["--enable-websocket".into()],
        agent_args: vec!["--enable-websocket".into()],
        ..StartOptions::default()
    }
}

/// The principal's log lines of WebSocket calls to `method` (`/authapi.Authentication/...`).
fn websocket_calls(t: &Topology, method: &str) -> usize {
    t.principal_log_lines("WebSocket call opened").iter().filter(|l| l.contains(method)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_our_agent_and_principal_managed_sync_and_status() -> Result<()> {
    let agent = "ws-m1";
    let t = Topology::start_with_options(&[(agent, Mode::Managed)], websocket_options(true)).await?;
    let hub = apps(&t.hub(), agent);
    let spoke = apps(&t.spoke(agent)?, ARGOCD_NS);

    hub.create(&PostParams::default(), &tests::fixtures::app_with_path("web", agent, "v1")?).await?;
    wait_app(&t, &spoke, "web", "create reaches the spoke over WebSocket", path_is("v1")).await?;
    spoke
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}})),
        )
        .await?;
    wait_app(&t, &hub, "web", "status comes back to the hub over WebSocket", |o| {
        o.is_some_and(|o| o["status"]["health"]["status"] == "Healthy")
    })
    .await?;
    // Every call of the agent went over WebSocket: its authentication and its stream.
    ensure!(websocket_calls(&t, "/authapi.Authentication/Authenticate") >= 1, "{}", t.logs());
    ensure!(websocket_calls(&t, "/eventstreamapi.EventStream/Subscribe") >= 1, "{}", t.logs());
    ensure!(t.principal_connects(agent) >= 1, "{}", t.logs());
    Ok(())
}

// === our client, call by call ===

fn client_tls(pki: &Path, agent: Option<&str>) -> Result<agent::AgentTls> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(pki.join("ca.crt"))?)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let config = match agent {
        Some(name) => {
            let chain =
                CertificateDer::pem_file_iter(pki.join(format!("{name}.crt")))?.collect::<Result<Vec<_>, _>>()?;
            let key = PrivateKeyDer::from_pem_file(pki.join(format!("{name}.key")))?;
            builder.with_client_auth_cert(chain, key)?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(agent::AgentTls::Rustls { config: Arc::new(config), server_name: "localhost".into() })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_calls_pass_the_same_auth_layer_and_services_as_native_ones() -> Result<()> {
    use agent::transport::{Wire, connect_over};
    let agent = "ws-calls";
    let t = Topology::start_with_options(&[(agent, Mode::Managed)], websocket_options(false)).await?;
    let addr = format!("https://{}", t.principal_addr().context("principal address")?);
    let tls = client_tls(&t.pki_dir(), Some(agent))?;
    let channel = connect_over(&addr, Some(&tls), None, Wire::WebSocket).await?;

    let creds = auth::Credentials::new();
    let params = auth::AuthParams {
        method: "mtls".into(),
        credentials: HashMap::new(),
        mode: AgentMode::Managed,
        version: OUR_VERSION.into(),
        agent_namespace: ARGOCD_NS.into(),
    };
    let info = creds.authenticate(&mut AuthenticationClient::new(channel.clone()), &params).await?;
    ensure!(info.agent_name.as_str() == agent, "the client certificate named the agent: {info:?}");
    let first = creds.access_token().context("an access token")?;
    creds.refresh(&mut AuthenticationClient::new(channel.clone())).await?;
    ensure!(creds.access_token().is_some());

    let version = VersionClient::new(channel.clone()).version(VersionRequest {}).await?.into_inner();
    ensure!(version.version == OUR_VERSION, "{version:?}");

    // The auth layer runs on WebSocket calls: no token, no stream.
    let mut events = EventStreamClient::new(channel.clone());
    let refused = events.ping(PingRequest {}).await.err().context("a call without a token must be refused")?;
    ensure!(refused.code() == tonic::Code::Unauthenticated, "{refused:?}");
    // With one it reaches the service, whose trailers-only error comes back as it is.
    let mut ping = tonic::Request::new(PingRequest {});
    ping.metadata_mut().insert("authorization", first.parse()?);
    let unimplemented = events.ping(ping).await.err().context("our principal does not implement Ping")?;
    ensure!(unimplemented.code() == tonic::Code::Unimplemented, "{unimplemented:?}");
    ensure!(unimplemented.message().contains("heartbeat"), "the service's own message: {unimplemented:?}");

    // Without a client certificate the mTLS method has nothing to go by, over WebSocket too.
    let anonymous = connect_over(&addr, Some(&client_tls(&t.pki_dir(), None)?), None, Wire::WebSocket).await?;
    let err = auth::Credentials::new()
        .authenticate(&mut AuthenticationClient::new(anonymous), &params)
        .await
        .err()
        .context("no certificate, no session")?;
    ensure!(err.to_string().to_lowercase().contains("certificate"), "{err}");

    // Native HTTP/2 on the same port keeps working.
    let native = connect_over(&addr, Some(&tls), None, Wire::Http2).await?;
    let version = VersionClient::new(native).version(VersionRequest {}).await?.into_inner();
    ensure!(version.version == OUR_VERSION, "{version:?}");

    for method in [
        "/authapi.Authentication/Authenticate",
        "/authapi.Authentication/RefreshToken",
        "/versionapi.Version/Version",
        "/eventstreamapi.EventStream/Ping",
    ] {
        ensure!(websocket_calls(&t, method) >= 1, "no WebSocket call to {method}:\n{}", t.logs());
    }
    ensure!(websocket_calls(&t, "/versionapi.Version/Version") == 1, "the native call stayed native");
    Ok(())
}

/// A WebSocket client at the principal without `--enable-websocket` is told what to fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_against_a_principal_without_it_fails_with_a_clear_error() -> Result<()> {
    let agent = "ws-off";
    let options = StartOptions { start_agents: false, ..StartOptions::default() };
    let t = Topology::start_with_options(&[(agent, Mode::Managed)], options).await?;
    let addr = format!("https://{}", t.principal_addr().context("principal address")?);
    let tls = client_tls(&t.pki_dir(), Some(agent))?;
    let channel = agent::transport::connect_over(&addr, Some(&tls), None, agent::transport::Wire::WebSocket).await?;
    let status = VersionClient::new(channel).version(VersionRequest {}).await.err().context("must fail")?;
    ensure!(status.code() == tonic::Code::Unavailable, "{status:?}");
    ensure!(status.message().contains("cannot open a WebSocket to the principal"), "{status:?}");
    ensure!(status.message().contains("--enable-websocket"), "says what to fix: {status:?}");
    Ok(())
}

// === interop with grpc-http1's wire (the Go peer) ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upstream_style_go_agent_against_our_principal() -> Result<()> {
    let agent = "ws-goa";
    let t = Topology::start_with_options(&[(agent, Mode::Managed)], websocket_options(false)).await?;
    let pki = Pki::of_kubeconfig(&t.kubeconfig())?;
    let addr = t.principal_addr().context("principal address")?;
    let mut go = GoPeer::agent_with(&pki, agent, addr, "managed", "0.10.0", &["--websocket"])?;
    let auth = go
        .wait("authenticated", |r| {
            ["authenticated", "auth_error", "version_refused"].contains(&r["kind"].as_str().unwrap_or(""))
        })
        .await?;
    ensure!(auth["kind"] == "authenticated", "{auth}\n{}\n{}", go.diagnostics(), t.logs());
    let version = go.wait("the Version answer", |r| r["kind"] == "version").await?;
    ensure!(version["version"] == OUR_VERSION, "{version}");
    go.wait("subscribed", |r| r["kind"] == "subscribed").await?;
    let resync = received(&mut go, EventType::RequestResourceResync, Target::ResourceResync).await?;
    check_received(&resync)?;

    // Hub -> Go agent over WebSocket.
    let hub = apps(&t.hub(), agent);
    hub.create(
        &PostParams::default(),
        &dynamic(tests::fixtures::application_without_finalizers("guestbook", agent, "v1"))?,
    )
    .await?;
    let created = go
        .wait("the create", |r| r["type"] == EventType::Create.as_str() && r["data"]["metadata"]["name"] == "guestbook")
        .await?;
    check_received(&created)?;

    // Go agent -> hub over WebSocket: a status update, applied and ACKed.
    let mut status = created["data"].clone();
    status["status"] = json!({"sync": {"status": "Synced", "revision": "ws-rev"}, "health": {"status": "Healthy"}});
    status["metadata"]["resourceVersion"] = json!("go-1");
    let sent = go
        .ask(
            "status",
            json!({"cmd": "send", "type": EventType::StatusUpdate.as_str(), "target": "application", "data": status}),
        )
        .await?;
    let ack = go
        .wait("the ACK", |r| {
            r["type"] == EventType::Processed.as_str()
                && r["resourceid"] == sent["resourceid"]
                && r["eventid"] == sent["eventid"]
        })
        .await?;
    check_received(&ack)?;
    wait_until_async(CONVERGE, "the hub to show the Go agent's status", || async {
        hub.get("guestbook").await.is_ok_and(|a| a.data["status"]["sync"]["revision"] == "ws-rev")
    })
    .await?;
    ensure!(websocket_calls(&t, "/eventstreamapi.EventStream/Subscribe") >= 1, "{}", t.logs());
    ensure!(go.matching(|r| r["kind"] == "dropped").is_empty(), "{}", go.diagnostics());
    Ok(())
}

async fn received(go: &mut GoPeer, event_type: EventType, target: Target) -> Result<Value> {
    go.wait(&format!("{event_type} on {target}"), |r| {
        r["type"] == event_type.as_str() && r["target"] == target.as_str()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_our_agent_against_an_upstream_style_downgrading_principal() -> Result<()> {
    let agent = "ws-gop";
    let mut t = Topology::start_with_options(&[(agent, Mode::Managed)], websocket_options(false)).await?;
    let pki = Pki::of_kubeconfig(&t.kubeconfig())?;
    let (mut go, addr) = GoPeer::principal_with(&pki, OUR_VERSION, &["--websocket"]).await?;
    t.start_agent_via(agent, addr).await?;
    let auth = go.wait("our agent to authenticate", |r| r["kind"] == "authenticate").await?;
    ensure!(auth["agent"] == agent && auth["method"] == "mtls", "{auth}");
    go.wait("our agent to subscribe", |r| r["kind"] == "subscribed").await?;
    let list = received(&mut go, EventType::RequestSyncedResourceList, Target::ResourceResync).await?;
    check_received(&list)?;

    // Go principal -> our agent: an Application, applied to the spoke and ACKed.
    let app = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "web", "namespace": agent, "uid": "hub-uid-ws", "resourceVersion": "1"},
        "spec": {"project": "default",
                 "source": {"repoURL": "https://example.com/r.git", "path": "ws", "targetRevision": "HEAD"},
                 "destination": {"server": "https://kubernetes.default.svc", "namespace": "guestbook"}},
    });
    let project = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": "default", "namespace": "argocd", "uid": "p-uid", "resourceVersion": "4"},
        "spec": {"sourceRepos": ["*"], "destinations": [{"server": "*", "namespace": "*"}]},
    });
    for (id, target, data) in [("proj", "appproject", project), ("app", "application", app)] {
        let sent = go
            .ask(id, json!({"cmd": "send", "type": EventType::Create.as_str(), "target": target, "data": data}))
            .await?;
        let ack = go
            .wait(&format!("the ACK of {id}"), |r| {
                r["type"] == EventType::Processed.as_str()
                    && r["resourceid"] == sent["resourceid"]
                    && r["eventid"] == sent["eventid"]
            })
            .await?;
        check_received(&ack)?;
    }
    let spoke = apps(&t.spoke(agent)?, ARGOCD_NS);
    wait_app(&t, &spoke, "web", "the Go principal's Application on the spoke", path_is("ws")).await?;

    // Our agent -> Go principal: the spoke's status.
    spoke
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"sync": {"status": "Synced", "revision": "spoke-ws"}}})),
        )
        .await?;
    let update = go
        .wait("the status update", |r| {
            r["type"] == EventType::StatusUpdate.as_str() && r["data"]["status"]["sync"]["revision"] == "spoke-ws"
        })
        .await?;
    check_received(&update)?;
    ensure!(go.matching(|r| r["kind"] == "dropped").is_empty(), "{}", go.diagnostics());
    Ok(())
}

// === upstream's Test_WithHTTP1Downgrade, with a real Envoy ===

/// Envoy in front of the principal, speaking only HTTP/1.1 (WebSocket upgrades allowed) over TLS
/// to it with `agent`'s client certificate; agents reach it in plaintext on loopback.
struct Http1Proxy {
    process: ChildProcess,
    listen: SocketAddr,
    _dir: tempfile::TempDir,
}

fn http1_proxy_config(principal: SocketAddr, pki: &Path, agent: &str) -> String {
    let file = |name: &str| pki.join(name).display().to_string();
    format!(
        r#"
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
static_resources:
  listeners:
  - name: front
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: front
          codec_type: AUTO
          upgrade_configs: [{{ upgrade_type: websocket }}]
          stream_idle_timeout: 0s
          request_timeout: 0s
          route_config:
            virtual_hosts:
            - name: principal
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route: {{ cluster: principal, timeout: 0s }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}
  clusters:
  - name: principal
    type: STATIC
    connect_timeout: 5s
    load_assignment:
      cluster_name: principal
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }}
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http_protocol_options: {{}} }}
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: localhost
        common_tls_context:
          tls_params: {{ tls_minimum_protocol_version: TLSv1_3, tls_maximum_protocol_version: TLSv1_3 }}
          alpn_protocols: ["http/1.1"]
          tls_certificates:
          - certificate_chain: {{ filename: "{cert}" }}
            private_key: {{ filename: "{key}" }}
          validation_context:
            trusted_ca: {{ filename: "{ca}" }}
            match_typed_subject_alt_names: [{{ san_type: DNS, matcher: {{ exact: localhost }} }}]
"#,
        port = principal.port(),
        cert = file(&format!("{agent}.crt")),
        key = file(&format!("{agent}.key")),
        ca = file("ca.crt"),
    )
}

impl Http1Proxy {
    fn start(principal: SocketAddr, pki: &Path, agent: &str) -> Result<Self> {
        let envoy = tests::bin_path::envoy_path().context("this test needs the real Envoy")?;
        let dir = tempfile::Builder::new().prefix("envoy-http1-").tempdir()?;
        let config = dir.path().join("envoy.yaml");
        std::fs::write(&config, http1_proxy_config(principal, pki, agent))?;
        let admin_path = dir.path().join("admin-address");
        let mut cmd = Command::new(envoy);
        cmd.arg("--config-path").arg(&config).arg("--admin-address-path").arg(&admin_path).args([
            "--disable-hot-restart",
            "--use-dynamic-base-id",
            "--concurrency",
            "1",
            "--log-level",
            "info",
        ]);
        let mut process = ChildProcess::spawn("envoy-http1", cmd)?;
        let start = Duration::from_secs(60);
        let admin = wait_for(start, "Envoy to write its admin address", || {
            process.ensure_running()?;
            Ok(std::fs::read_to_string(&admin_path).unwrap_or_default().trim().parse::<SocketAddr>().ok())
        })?;
        wait_for(start, "Envoy to be LIVE", || {
            process.ensure_running()?;
            Ok(tests::envoy::admin_get(admin, "/ready")
                .ok()
                .filter(|(status, body)| *status == 200 && body.trim() == "LIVE"))
        })?;
        let (_, body) = tests::envoy::admin_get(admin, "/listeners?format=json")?;
        let json: Value = serde_json::from_str(&body).with_context(|| format!("admin /listeners: {body}"))?;
        let socket = &json["listener_statuses"][0]["local_address"]["socket_address"];
        let (Some(ip), Some(port)) = (socket["address"].as_str(), socket["port_value"].as_u64()) else {
            bail!("no listener address in {body}");
        };
        let listen = SocketAddr::new(ip.parse()?, u16::try_from(port)?);
        Ok(Self { process, listen, _dir: dir })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_gets_through_a_proxy_that_speaks_only_http1_to_the_principal() -> Result<()> {
    let agent = "ws-h1";
    let options = StartOptions {
        start_agents: false,
        principal_args: vec!["--enable-websocket".into()],
        ..StartOptions::default()
    };
    let mut t = Topology::start_with_options(&[(agent, Mode::Managed)], options).await?;
    let principal = t.principal_addr().context("principal address")?;
    let pki = t.pki_dir();
    let mut proxy = tokio::task::block_in_place(|| Http1Proxy::start(principal, &pki, agent))?;

    // Native gRPC: the proxy forwards it as HTTP/1.1, which carries no gRPC; the agent keeps
    // failing and never connects.
    t.set_agent_args(&["--insecure-plaintext", "--agent-name", agent]);
    t.start_agent_via(agent, proxy.listen).await?;
    wait_until_async(CONVERGE, "the agent to fail through the HTTP/1.1 proxy", || async {
        !t.agent_log_lines(agent, "authentication failed").is_empty()
    })
    .await
    .with_context(|| t.logs())?;
    ensure!(t.principal_connects(agent) == 0, "connected without WebSocket through an HTTP/1.1 proxy:\n{}", t.logs());
    let refused = t.principal_log_lines("HTTP/1.1 request refused");
    ensure!(!refused.is_empty(), "the principal saw the downgraded gRPC and said why:\n{}", t.logs());

    // With --enable-websocket the same path works: authentication, stream, sync.
    t.kill_agent(agent)?;
    t.set_agent_args(&["--insecure-plaintext", "--agent-name", agent, "--enable-websocket"]);
    t.start_agent_via(agent, proxy.listen).await?;
    wait_until_async(CONVERGE, "the agent to connect over WebSocket through the proxy", || async {
        t.principal_connects(agent) >= 1
    })
    .await
    .with_context(|| format!("{}\n{}", t.logs(), proxy.process.log_tail(30)))?;
    let hub = apps(&t.hub(), agent);
    let spoke = apps(&t.spoke(agent)?, ARGOCD_NS);
    hub.create(&PostParams::default(), &tests::fixtures::app_with_path("web", agent, "v1")?).await?;
    wait_app(&t, &spoke, "web", "create reaches the spoke through the HTTP/1.1 proxy", path_is("v1")).await?;
    ensure!(websocket_calls(&t, "/eventstreamapi.EventStream/Subscribe") >= 1, "{}", t.logs());
    proxy.process.ensure_running()?;
    Ok(())
}
