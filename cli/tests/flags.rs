//! Upstream flags for features not built yet are accepted by the parser and refused at startup
//! with a message naming them, whether given as flags or as upstream's environment variables.

use std::process::Command;

fn run(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_argocd-agent"));
    cmd.args(args).env("KUBECONFIG", "/nonexistent").env_remove("SPIFFE_ENDPOINT_SOCKET");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run argocd-agent: {e}"));
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Upstream v0.10's SPIRE flags (and their environment variables, so upstream's
/// `{principal,agent}.spire.*` ConfigMap keys) are taken and checked as upstream checks them; with
/// SPIRE on, an empty `--auth` is upstream's default and startup goes on to the cluster.
#[test]
fn spire_flags_and_env_vars_are_taken_and_checked_as_upstream() {
    let base = ["principal", "-n", "argocd", "--metrics-port", "0", "--healthz-port", "0"];
    let (ok, err) = run(&[&base[..], &["--spire-agent-socket", "unix:/s"]].concat(), &[]);
    assert!(!ok && err.contains("--spire-auth-method is required") && !err.contains("not supported yet"), "{err}");
    let socket = ("ARGOCD_PRINCIPAL_SPIRE_AGENT_SOCKET", "unix:/run/spire/agent.sock");
    let (ok, err) = run(&base, &[socket, ("ARGOCD_PRINCIPAL_SPIRE_AUTH_METHOD", "x509")]);
    assert!(!ok && err.contains("'jwt' or 'mtls'"), "{err}");
    let (ok, err) = run(
        &[&base[..], &["--insecure-plaintext"]].concat(),
        &[socket, ("ARGOCD_PRINCIPAL_SPIRE_AUTH_METHOD", "mtls")],
    );
    assert!(!ok && err.contains("--insecure-plaintext"), "{err}");
    let (ok, err) = run(
        &[&base[..], &["--spiffe-jwt-binding", "login"]].concat(),
        &[socket, ("ARGOCD_PRINCIPAL_SPIRE_AUTH_METHOD", "mtls")],
    );
    assert!(!ok && err.contains("--spiffe-jwt-binding"), "{err}");
    for method in ["jwt", "mtls"] {
        let (ok, err) = run(&base, &[socket, ("ARGOCD_PRINCIPAL_SPIRE_AUTH_METHOD", method)]);
        assert!(
            !ok && !err.contains("--spire") && !err.contains("--auth") && !err.contains("not supported yet"),
            "{method}: {err}"
        );
    }
    let (ok, err) = run(
        &base,
        &[socket, ("ARGOCD_PRINCIPAL_SPIRE_AUTH_METHOD", "jwt"), ("ARGOCD_PRINCIPAL_SPIFFE_JWT_BINDING", "login")],
    );
    assert!(!ok && !err.contains("--spire") && !err.contains("binding"), "{err}");

    let agent =
        ["agent", "--server-address", "p", "--metrics-address", "127.0.0.1:0", "--healthz-address", "127.0.0.1:0"];
    let (ok, err) = run(&agent, &[("ARGOCD_AGENT_SPIRE_AUTH_METHOD", "mtls")]);
    assert!(!ok && err.contains("requires --spire-agent-socket"), "{err}");
    let spire = ["--spire-agent-socket", "unix:/run/spire/agent.sock", "--spire-auth-method"];
    let (ok, err) = run(&[&agent[..], &spire, &["mtls", "--insecure-plaintext"]].concat(), &[]);
    assert!(!ok && err.contains("--insecure-plaintext"), "{err}");
    let (ok, err) = run(&[&agent[..], &spire, &["jwt", "--creds", "mtls:any"]].concat(), &[]);
    assert!(!ok && err.contains("--creds") && err.contains("--spire-auth-method jwt"), "{err}");
    for method in ["jwt", "mtls"] {
        let (ok, err) = run(&[&agent[..], &spire, &[method]].concat(), &[]);
        assert!(!ok && !err.contains("--spire") && !err.contains("not supported yet"), "{method}: {err}");
    }
}

/// Cross-hub HA's flags (upstream's names and environment variables) are supported and checked
/// before anything starts, each bad value named.
#[test]
fn ha_flags_are_checked_by_name() {
    let base = ["principal", "-n", "argocd", "--auth", "mtls:subject:CN=([^,]+)"];
    let (ok, err) = run(&[&base[..], &["--ha-enabled", "--ha-preferred-role", "replica"]].concat(), &[]);
    assert!(!ok && !err.contains("not supported yet") && err.contains("--ha-peer-address"), "{err}");
    let (ok, err) =
        run(&base, &[("ARGOCD_PRINCIPAL_HA_ENABLED", "true"), ("ARGOCD_PRINCIPAL_HA_PREFERRED_ROLE", "boss")]);
    assert!(!ok && err.contains("--ha-preferred-role") && err.contains("unknown role: boss"), "{err}");
    let (ok, err) = run(&[&base[..], &["--ha-enabled", "--ha-admin-auth", "CN=admin"]].concat(), &[]);
    assert!(!ok && err.contains("--ha-admin-auth") && err.contains("must start with 'mtls:'"), "{err}");
    let header = ["principal", "-n", "argocd", "--auth", "header:x-id:(.+)", "--insecure-plaintext", "--ha-enabled"];
    let (ok, err) = run(&header, &[]);
    assert!(!ok && err.contains("--ha-enabled needs --auth mtls"), "{err}");
}

/// The Redis proxy's flags (upstream's names and environment variables) are accepted and
/// checked: a knob without effect is explained, conflicting ones are refused by name.
#[test]
fn redis_flags_are_accepted_and_checked() {
    let base = ["principal", "-n", "argocd", "--auth", "mtls:subject:CN=([^,]+)", "--metrics-port", "0"];
    let tls = ["--redis-server-address", "r:6379", "--disable-redis-proxy=false", "--redis-tls-enabled"];
    let (ok, err) = run(&[&base[..], &tls, &["--redis-ca-path", "/ca.crt"]].concat(), &[("REDIS_PASSWORD", "s")]);
    // Accepted: startup goes on to the hub, which does not exist here.
    assert!(!ok && !err.contains("not supported yet"), "{err}");
    // The password is for the cluster info the principal writes into that Redis.
    assert!(!err.contains("--redis-password"), "{err}");
    let (ok, err) = run(&base, &[("REDIS_PASSWORD", "s")]);
    assert!(!ok && err.contains("--redis-password/--redis-creds-dir-path have no effect without"), "{err}");
    let (ok, err) = run(&[&base[..], &["--redis-creds-dir-path", "/creds"]].concat(), &[("REDIS_PASSWORD", "s")]);
    assert!(!ok && err.contains("--redis-creds-dir-path cannot be combined with --redis-password"), "{err}");
    let (ok, err) = run(&[&base[..], &["--redis-ca-path", "/ca.crt", "--redis-tls-insecure"]].concat(), &[]);
    assert!(!ok && err.contains("--redis-tls-insecure") && !err.contains("not supported yet"), "{err}");
    let (ok, err) = run(&base, &[("ARGOCD_PRINCIPAL_REDIS_COMPRESSION_TYPE", "zstd")]);
    assert!(!ok && err.contains("--redis-compression-type"), "{err}");
    let agent =
        ["agent", "--server-address", "p", "--metrics-address", "127.0.0.1:0", "--healthz-address", "127.0.0.1:0"];
    let (ok, err) = run(&agent, &[("REDIS_PASSWORD", "s"), ("REDIS_CREDS_DIR_PATH", "/creds")]);
    assert!(!ok && err.contains("--redis-creds-dir-path cannot be combined"), "{err}");
    let env = [("REDIS_ADDR", "r:6379"), ("REDIS_USERNAME", "u"), ("ARGOCD_AGENT_REDIS_TLS_INSECURE", "true")];
    let (ok, err) = run(&agent, &env);
    assert!(!ok && !err.contains("not supported yet") && !err.contains("--redis"), "{err}");
}

#[test]
fn self_registration_needs_its_client_certificate_and_the_resource_proxy() {
    let base = ["principal", "-n", "argocd", "--auth", "mtls:subject:CN=([^,]+)", "--enable-self-cluster-registration"];
    let (ok, err) = run(&base, &[]);
    assert!(
        !ok && err.contains("--self-registration-client-cert-secret") && !err.contains("not supported yet"),
        "{err}"
    );
    let (ok, err) = run(
        &[&base[..], &["--self-registration-client-cert-secret", "s", "--enable-resource-proxy=false"]].concat(),
        &[],
    );
    assert!(!ok && err.contains("needs the resource proxy"), "{err}");
}

#[test]
fn knobs_without_a_counterpart_are_checked_then_said_to_do_nothing() {
    let base = [
        "principal",
        "-n",
        "argocd",
        "--auth",
        "mtls:subject:CN=([^,]+)",
        "--metrics-port",
        "0",
        "--healthz-port",
        "0",
    ];
    let knobs = ["--pprof-port", "6060", "--keepalive-min-interval", "10s", "--full-detail", "events,actions"];
    let (ok, err) = run(&[&base[..], &knobs[..]].concat(), &[]);
    assert!(!ok, "the test kubeconfig does not exist, so the principal stops after its checks: {err}");
    for flag in ["--pprof-port", "--keepalive-min-interval", "--full-detail"] {
        assert!(err.contains(&format!("{flag} has no effect here")), "{flag}: {err}");
    }
    for (bad, named) in [
        (["--full-detail", "everything"], "--full-detail"),
        (["--keepalive-min-interval", "often"], "--keepalive-min-interval"),
        (["--namespace-create-pattern", "agent-("], "--namespace-create-pattern"),
        (["--namespace-create-labels", "novalue"], "--namespace-create-labels"),
    ] {
        let (ok, err) = run(&[&base[..], &bad[..]].concat(), &[]);
        assert!(!ok && err.contains(named) && !err.contains("not supported yet"), "{bad:?}: {err}");
    }
    let agent =
        ["agent", "--server-address", "p", "--metrics-address", "127.0.0.1:0", "--healthz-address", "127.0.0.1:0"];
    let (ok, err) = run(&[&agent[..], &["--pprof-port", "6060"]].concat(), &[]);
    assert!(!ok && err.contains("--pprof-port has no effect here"), "{err}");
}

#[test]
fn destination_based_mapping_flags_are_checked_together() {
    let agent = ["agent", "--server-address", "p"];
    let (ok, err) = run(&[&agent[..], &["--agent-mode", "autonomous", "--destination-based-mapping"]].concat(), &[]);
    assert!(!ok && err.contains("--destination-based-mapping") && err.contains("managed"), "{err}");
    let (ok, err) = run(&agent, &[("ARGOCD_AGENT_CREATE_NAMESPACE", "true")]);
    assert!(!ok && err.contains("--create-namespace") && !err.contains("not supported yet"), "{err}");
    let (ok, err) = run(&[&agent[..], &["--allowed-namespaces", "team-*"]].concat(), &[]);
    assert!(!ok && err.contains("--allowed-namespaces") && err.contains("--destination-based-mapping"), "{err}");
}

#[test]
fn a_label_selector_that_does_not_parse_is_refused_naming_the_flag() {
    let base = ["principal", "-n", "argocd", "--auth", "mtls:subject:CN=([^,]+)", "--metrics-port", "0"];
    let (ok, err) = run(&base, &[("ARGOCD_PRINCIPAL_LABEL_SELECTOR", "team in (a")]);
    assert!(!ok && err.contains("--label-selector") && !err.contains("not supported yet"), "{err}");
    let (ok, err) = run(&["agent", "--server-address", "p", "--label-selector", "=x"], &[]);
    assert!(!ok && err.contains("--label-selector") && !err.contains("not supported yet"), "{err}");
    let (ok, err) =
        run(&["agent", "--server-address", "p", "--agent-mode", "autonomous", "--ignore-unmanaged-apps"], &[]);
    assert!(!ok && err.contains("--ignore-unmanaged-apps"), "{err}");
}

#[test]
fn an_access_token_lifetime_outside_a_minute_to_an_hour_is_refused_naming_the_flag_and_the_range() {
    let base = ["principal", "-n", "argocd", "--auth", "mtls:subject:CN=([^,]+)", "--metrics-port", "0"];
    for (flag, env) in [(Some("30s"), None), (None, Some("2h")), (Some("soon"), None)] {
        let args = flag.map_or_else(|| base.to_vec(), |v| [&base[..], &["--access-token-lifetime", v]].concat());
        let env: Vec<_> = env.map(|v| ("ARGOCD_PRINCIPAL_ACCESS_TOKEN_LIFETIME", v)).into_iter().collect();
        let (ok, err) = run(&args, &env);
        assert!(!ok && err.contains("--access-token-lifetime"), "{flag:?} {env:?}: {err}");
        if flag != Some("soon") {
            assert!(err.contains("60s..=3600s"), "{err}");
        }
    }
    // In range, startup goes past the flags (to the cluster, which is not there).
    let (ok, err) = run(&[&base[..], &["--access-token-lifetime", "30m"]].concat(), &[]);
    assert!(!ok && !err.contains("--access-token-lifetime"), "{err}");
}

#[test]
fn otlp_flags_are_accepted_and_checked() {
    // --otlp-address is supported (docs/operations/tracing.md); bad values are refused by name.
    let base = ["principal", "-n", "argocd", "--auth", "mtls:subject:CN=([^,]+)", "--metrics-port", "0"];
    let (ok, err) =
        run(&[&base[..], &["--otlp-address", "127.0.0.1:4317", "--otlp-sampling-ratio", "2"]].concat(), &[]);
    assert!(!ok && err.contains("--otlp-sampling-ratio") && !err.contains("not supported yet"), "{err}");
    let (ok, err) = run(&["agent", "--server-address", "p", "--otlp-address", "https://collector:4317"], &[]);
    assert!(!ok && err.contains("--otlp-address") && !err.contains("not supported yet"), "{err}");
}

/// A knob of upstream internals is accepted with a warning saying why it does nothing; a bad
/// value in one is refused by name.
#[test]
fn upstream_only_flags_are_refused_or_explained_by_name() {
    let agent =
        ["agent", "--server-address", "p", "--metrics-address", "127.0.0.1:0", "--healthz-address", "127.0.0.1:0"];
    let (ok, err) = run(&agent, &[("ARGOCD_AGENT_ADOPTION_POLICY", "sometimes")]);
    assert!(
        !ok && err.contains("adoption-policy") && err.contains("always") && !err.contains("not supported yet"),
        "{err}"
    );
    let (ok, err) = run(&[&agent[..], &["--informer-sync-timeout", "soon"]].concat(), &[]);
    assert!(!ok && err.contains("--informer-sync-timeout") && !err.contains("not supported yet"), "{err}");
    let (ok, err) = run(&[&agent[..], &["--informer-sync-timeout", "5s"]].concat(), &[]);
    assert!(!ok && err.contains("--informer-sync-timeout has no effect here"), "{err}");
}

#[test]
fn required_settings_are_named() {
    let (ok, err) = run(&["principal", "--auth", "mtls:subject:CN=([^,]+)"], &[]);
    assert!(!ok && err.contains("--namespace"), "{err}");
    let (ok, err) = run(&["principal", "-n", "argocd"], &[]);
    assert!(!ok && err.contains("--auth"), "{err}");
    let (ok, err) = run(&["principal", "-n", "argocd", "--auth", "userpass:/x"], &[]);
    assert!(!ok && err.contains("--auth"), "{err}");
    // The SPIFFE methods need a Workload API: the error names the variable or option to set.
    let (ok, err) = run(&["principal", "-n", "argocd", "--auth", "spiffe:jwt"], &[]);
    assert!(!ok && err.contains("spiffe:jwt") && err.contains("SPIFFE_ENDPOINT_SOCKET"), "{err}");
    let (ok, err) = run(&["agent", "--server-address", "p", "--creds", "spiffe:x509"], &[]);
    assert!(!ok && err.contains("spiffe:x509") && err.contains("SPIFFE_ENDPOINT_SOCKET"), "{err}");
    let (ok, err) = run(&["agent", "--server-address", "p", "--creds", "spiffe:x509:colour=blue"], &[]);
    assert!(!ok && err.contains("unknown option \"colour\""), "{err}");
    let (ok, err) = run(&["agent"], &[]);
    assert!(!ok && err.contains("--server-address"), "{err}");
}

#[test]
fn metrics_and_health_flags_are_accepted_and_checked() {
    // Non-default ports are no longer refused as "not supported yet"; a malformed address is
    // refused by name before anything starts.
    let base = ["principal", "-n", "argocd", "--auth", "mtls:subject:CN=([^,]+)", "--metrics-port", "0"];
    let (ok, err) = run(&[&base[..], &["--healthz-port", "0", "--metrics-address", "nowhere"]].concat(), &[]);
    assert!(!ok && err.contains("--metrics-address") && !err.contains("not supported yet"), "{err}");
    let (ok, err) = run(
        &["agent", "--server-address", "p", "--metrics-port", "0"],
        &[("ARGOCD_AGENT_HEALTH_CHECK_ADDRESS", "127.0.0.1:http")],
    );
    assert!(!ok && err.contains("--healthz-address") && !err.contains("not supported yet"), "{err}");
}

/// Where the metrics and health endpoints of a process that gets that far listen.
const LOOPBACK: &str = "127.0.0.1:0";

/// A principal command line complete but for a cluster, its endpoints on loopback.
const PRINCIPAL: [&str; 9] = [
    "principal",
    "-n",
    "argocd",
    "--auth",
    "mtls:subject:CN=([^,]+)",
    "--metrics-address",
    LOOPBACK,
    "--healthz-address",
    LOOPBACK,
];

#[test]
fn booleans_take_pflags_forms_on_the_command_line_and_in_the_environment() {
    let base = PRINCIPAL;
    // The inert value of an unsupported flag is accepted in every form; any other is refused.
    for inert in [&["--ha-enabled=false"][..], &["--ha-enabled=0"], &["--namespace-create-enable=F"]] {
        let (_, err) = run(&[&base[..], inert].concat(), &[]);
        assert!(
            !err.contains("not supported yet") && !err.contains("\nerror:") && !err.starts_with("error:"),
            "parsed: {inert:?}: {err}"
        );
    }
    // --ha-enabled is supported: every form parses, and startup goes on (to the hub, which
    // does not exist here).
    for set in [&["--ha-enabled"][..], &["--ha-enabled=true"], &["--ha-enabled=T"]] {
        let (ok, err) = run(&[&base[..], set].concat(), &[]);
        assert!(!ok && !err.contains("not supported yet") && !err.contains("--ha-enabled"), "{set:?}: {err}");
    }
    let (ok, err) = run(&base, &[("ARGOCD_PRINCIPAL_HA_ENABLED", "true")]);
    assert!(!ok && !err.contains("not supported yet"), "{err}");
    // --enable-websocket is supported: every form parses, and startup goes on (to the hub,
    // which does not exist here).
    for set in [&["--enable-websocket"][..], &["--enable-websocket=true"], &["--enable-websocket=T"]] {
        let (ok, err) = run(&[&base[..], set].concat(), &[]);
        assert!(!ok && !err.contains("not supported yet") && !err.contains("--enable-websocket"), "{set:?}: {err}");
    }
    let (ok, err) = run(&base, &[("ARGOCD_PRINCIPAL_ENABLE_WEBSOCKET", "true")]);
    assert!(!ok && !err.contains("not supported yet"), "{err}");
    let agent = ["agent", "--server-address", "p", "--metrics-address", LOOPBACK, "--healthz-address", LOOPBACK];
    let (ok, err) = run(&[&agent[..], &["--enable-websocket"]].concat(), &[("ARGOCD_AGENT_ENABLE_WEBSOCKET", "true")]);
    assert!(!ok && !err.contains("not supported yet"), "{err}");
    let (ok, err) = run(&[&base[..], &["--insecure-plaintext=maybe"]].concat(), &[]);
    assert!(!ok && err.contains("maybe") && err.contains("--insecure-plaintext"), "{err}");
}

#[test]
fn an_empty_environment_variable_is_unset_as_upstreams_configmap_means_it() {
    // Upstream's manifests wire every argocd-agent-params key to an env var; an empty key is the
    // default, not an empty value.
    let base = PRINCIPAL;
    let empty = [
        ("ARGOCD_PRINCIPAL_TLS_SERVER_CERT_PATH", ""),
        ("ARGOCD_PRINCIPAL_TLS_SERVER_KEY_PATH", ""),
        ("ARGOCD_PRINCIPAL_ENABLE_RESOURCE_PROXY", ""),
        ("ARGOCD_PRINCIPAL_INSECURE_PLAINTEXT", ""),
        ("ARGOCD_PRINCIPAL_LABEL_SELECTOR", ""),
    ];
    let (ok, err) = run(&base, &empty);
    assert!(!ok, "no API server here: {err}");
    assert!(err.contains("argocd-agent: error:") && !err.contains("not supported yet"), "parsed: {err}");
    let (ok, err) = run(
        &["agent", "--server-address", "p", "--metrics-address", LOOPBACK, "--healthz-address", LOOPBACK],
        &[("ARGOCD_AGENT_ENABLE_WEBSOCKET", "")],
    );
    assert!(!ok && err.contains("argocd-agent: error:") && !err.contains("not supported yet"), "parsed: {err}");
}
