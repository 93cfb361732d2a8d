//! [`EnvoySidecar`]: a real Envoy (from the test venv) running one of the repo's sidecar bootstrap
//! templates in `envoy/`, rendered with test certificates and ports.
//!
//! Ports: Envoy binds its listener and admin interface on port 0 itself; the admin address is read
//! from `--admin-address-path` and the listener's port from the admin API (`/listeners`), so there
//! is no window in which another process can take a port picked in advance.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::bin_path::{envoy_path, workspace_root};
use crate::process::ChildProcess;
use crate::wait::wait_for;

/// How long Envoy may take to start and report LIVE on a busy machine.
const START: Duration = Duration::from_secs(60);

/// The stream idle timeout of the production configs (`envoy/README.md`): agents heartbeat at 30 s.
pub const PRODUCTION_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Which sidecar, i.e. which template under `envoy/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SidecarKind {
    /// `envoy/principal-sidecar.yaml`: mTLS listener, XFCC (`SANITIZE_SET`), h2c to the principal.
    Principal,
    /// `envoy/agent-sidecar.yaml`: loopback h2c listener, mTLS to the principal sidecar.
    Agent,
}

impl SidecarKind {
    /// File name of the template under `envoy/`.
    #[must_use]
    pub fn template_file(self) -> &'static str {
        match self {
            Self::Principal => "principal-sidecar.yaml",
            Self::Agent => "agent-sidecar.yaml",
        }
    }

    /// The `stat_prefix` of the sidecar's HTTP connection manager (`http.<prefix>.*` stats).
    #[must_use]
    pub fn stat_prefix(self) -> &'static str {
        match self {
            Self::Principal => "agents",
            Self::Agent => "agent",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Principal => "envoy-principal-sidecar",
            Self::Agent => "envoy-agent-sidecar",
        }
    }
}

/// What a sidecar is rendered with. The same shape serves both kinds:
///
/// | field | principal sidecar | agent sidecar |
/// |---|---|---|
/// | `upstream` | the principal's h2c address (must be on 127.0.0.1) | the principal sidecar |
/// | `cert`, `key` | certificate shown to agents | the agent's client certificate |
/// | `ca` | CA of agent certificates | CA of the principal's certificate |
/// | `principal_sni` | unused | SNI and DNS SAN required of the principal |
#[derive(Debug, Clone)]
pub struct SidecarParams {
    /// Where the sidecar forwards to.
    pub upstream: SocketAddr,
    /// PEM certificate chain this sidecar presents.
    pub cert: PathBuf,
    /// PEM private key of `cert`.
    pub key: PathBuf,
    /// PEM CA bundle the peer's certificate is verified with.
    pub ca: PathBuf,
    /// Agent sidecar: SNI sent and DNS SAN required of the principal (default `localhost`).
    pub principal_sni: String,
    /// `${STREAM_IDLE_TIMEOUT}` (default [`PRODUCTION_STREAM_IDLE_TIMEOUT`]).
    pub stream_idle_timeout: Duration,
}

impl SidecarParams {
    /// Params with the defaults for `principal_sni` and `stream_idle_timeout`.
    #[must_use]
    pub fn new(
        upstream: SocketAddr,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
        ca: impl Into<PathBuf>,
    ) -> Self {
        Self {
            upstream,
            cert: cert.into(),
            key: key.into(),
            ca: ca.into(),
            principal_sni: "localhost".to_string(),
            stream_idle_timeout: PRODUCTION_STREAM_IDLE_TIMEOUT,
        }
    }

    /// Set `${STREAM_IDLE_TIMEOUT}`.
    #[must_use]
    pub fn with_stream_idle_timeout(mut self, timeout: Duration) -> Self {
        self.stream_idle_timeout = timeout;
        self
    }

    /// Set `${PRINCIPAL_SNI}` (agent sidecar).
    #[must_use]
    pub fn with_principal_sni(mut self, sni: impl Into<String>) -> Self {
        self.principal_sni = sni.into();
        self
    }

    /// The placeholder values for `kind`, with Envoy choosing the admin and listener ports.
    ///
    /// # Errors
    /// A principal sidecar's upstream is not on 127.0.0.1 (the template forwards to loopback only).
    pub fn placeholders(&self, kind: SidecarKind) -> anyhow::Result<BTreeMap<&'static str, String>> {
        let path = |p: &Path| p.display().to_string();
        let mut values = BTreeMap::from([
            ("ADMIN_PORT", "0".to_string()),
            ("LISTEN_PORT", "0".to_string()),
            ("STREAM_IDLE_TIMEOUT", proto_duration(self.stream_idle_timeout)),
        ]);
        match kind {
            SidecarKind::Principal => {
                if self.upstream.ip() != std::net::Ipv4Addr::LOCALHOST {
                    bail!("the principal sidecar forwards to 127.0.0.1 only, not {}", self.upstream);
                }
                values.extend([
                    ("LISTEN_ADDRESS", "127.0.0.1".to_string()),
                    ("PRINCIPAL_PORT", self.upstream.port().to_string()),
                    ("SERVER_CERT_PATH", path(&self.cert)),
                    ("SERVER_KEY_PATH", path(&self.key)),
                    ("CLIENT_CA_PATH", path(&self.ca)),
                ]);
            }
            SidecarKind::Agent => values.extend([
                ("PRINCIPAL_SIDECAR_HOST", self.upstream.ip().to_string()),
                ("PRINCIPAL_SIDECAR_PORT", self.upstream.port().to_string()),
                ("PRINCIPAL_SNI", self.principal_sni.clone()),
                ("CLIENT_CERT_PATH", path(&self.cert)),
                ("CLIENT_KEY_PATH", path(&self.key)),
                ("PRINCIPAL_CA_PATH", path(&self.ca)),
            ]),
        }
        Ok(values)
    }
}

/// A protobuf JSON duration (`2.500s`).
#[must_use]
pub fn proto_duration(d: Duration) -> String {
    format!("{}.{:03}s", d.as_secs(), d.subsec_millis())
}

/// The text of a template under the repo's `envoy/` directory.
///
/// # Errors
/// The file cannot be read.
pub fn template(file_name: &str) -> anyhow::Result<String> {
    let path = workspace_root().join("envoy").join(file_name);
    std::fs::read_to_string(&path).with_context(|| format!("cannot read the Envoy template {}", path.display()))
}

/// Replace every `${NAME}` in `template` by `values[NAME]`.
///
/// # Errors
/// A value names no placeholder of the template (the renderer and the file drifted apart), or a
/// placeholder outside a comment has no value.
pub fn render(template: &str, values: &BTreeMap<&str, String>) -> anyhow::Result<String> {
    let mut out = template.to_string();
    for (name, value) in values {
        let placeholder = format!("${{{name}}}");
        if !out.contains(&placeholder) {
            bail!("the template has no placeholder {placeholder}");
        }
        out = out.replace(&placeholder, value);
    }
    let missing: Vec<&str> = out
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .filter_map(|line| {
            let start = line.find("${")?;
            let len = line[start..].find('}').map_or(line.len() - start, |end| end + 1);
            Some(&line[start..start + len])
        })
        .collect();
    if !missing.is_empty() {
        bail!("placeholders without a value: {}", missing.join(", "));
    }
    Ok(out)
}

/// Check a rendered bootstrap with `envoy --mode validate` (no ports, no upstreams needed).
///
/// # Errors
/// Envoy is missing or rejects the config (its output is in the error).
pub fn validate(rendered: &str) -> anyhow::Result<()> {
    let envoy = envoy_path()?;
    let dir = tempfile::Builder::new().prefix("envoy-validate-").tempdir()?;
    let config = dir.path().join("envoy.yaml");
    std::fs::write(&config, rendered)?;
    let out = Command::new(&envoy)
        .arg("--mode")
        .arg("validate")
        .arg("--config-path")
        .arg(&config)
        .arg("--disable-hot-restart")
        .output()
        .with_context(|| format!("cannot run {}", envoy.display()))?;
    if !out.status.success() {
        bail!(
            "envoy rejected the config ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A running Envoy sidecar. Dropping it kills Envoy (and prints its log tail for failing tests).
#[derive(Debug)]
pub struct EnvoySidecar {
    // Declared first so it is dropped (killed) before its config dir is removed.
    process: ChildProcess,
    kind: SidecarKind,
    admin: SocketAddr,
    listen: SocketAddr,
    dir: tempfile::TempDir,
}

impl EnvoySidecar {
    /// Render `kind`'s template with `params`, start Envoy on it and wait until it is LIVE.
    ///
    /// Blocks the calling thread while it polls (a second or two): from async tests, use a
    /// multi-thread runtime.
    ///
    /// # Errors
    /// Envoy is missing (run `scripts/install-test-deps`), the template does not render, or Envoy
    /// exits or is not LIVE within a minute (its log tail is in the error).
    pub fn start(kind: SidecarKind, params: &SidecarParams) -> anyhow::Result<Self> {
        Self::start_edited(kind, params, Ok)
    }

    /// As [`Self::start`], with `edit` applied to the rendered configuration first (e.g. a
    /// control run without one of its settings, to show what that setting does).
    ///
    /// # Errors
    /// As [`Self::start`], and whatever `edit` returns.
    pub fn start_edited(
        kind: SidecarKind,
        params: &SidecarParams,
        edit: impl FnOnce(String) -> anyhow::Result<String>,
    ) -> anyhow::Result<Self> {
        let envoy = envoy_path().context("Envoy sidecar tests need the real Envoy")?;
        let rendered = render(&template(kind.template_file())?, &params.placeholders(kind)?)
            .with_context(|| format!("cannot render envoy/{}", kind.template_file()))?;
        let rendered = edit(rendered)?;
        let dir = tempfile::Builder::new().prefix(&format!("{}-", kind.label())).tempdir()?;
        let config = dir.path().join("envoy.yaml");
        std::fs::write(&config, &rendered).with_context(|| format!("cannot write {}", config.display()))?;
        let admin_path = dir.path().join("admin-address");

        let mut cmd = Command::new(&envoy);
        cmd.arg("--config-path")
            .arg(&config)
            .arg("--admin-address-path")
            .arg(&admin_path)
            // Several Envoys run at once: no shared-memory hot-restart state, and a base id the
            // server picks itself in case anything still keys on it.
            .arg("--disable-hot-restart")
            .arg("--use-dynamic-base-id")
            .arg("--concurrency")
            .arg("1")
            // A drain (`/drain_listeners?graceful`, as a pod's `preStop` hook sends it) sends
            // every downstream HTTP/2 connection a GOAWAY at once, not gradually over
            // `--drain-time-s` (envoy/README.md).
            .args(["--drain-strategy", "immediate", "--drain-time-s", "5"])
            .arg("--log-level")
            .arg("info");
        let mut process = ChildProcess::spawn(kind.label(), cmd)?;

        let admin = wait_for(START, &format!("{} to write its admin address", kind.label()), || {
            process.ensure_running()?;
            let text = std::fs::read_to_string(&admin_path).unwrap_or_default();
            Ok(text.trim().parse::<SocketAddr>().ok())
        })?;
        wait_for(START, &format!("{} to be LIVE", kind.label()), || {
            process.ensure_running()?;
            Ok(admin_get(admin, "/ready").ok().filter(|(status, body)| *status == 200 && body.trim() == "LIVE"))
        })?;
        let listen = listener_address(admin).with_context(|| process.log_tail(20))?;
        Ok(Self { process, kind, admin, listen, dir })
    }

    /// Starts draining, as a `preStop` hook does before the pod's containers get SIGTERM
    /// (`POST /drain_listeners?graceful`): downstream HTTP/2 connections get a GOAWAY, so their
    /// clients open new streams on new connections (through the Service, to another replica).
    ///
    /// # Errors
    /// The admin interface refuses it.
    pub fn drain(&self) -> anyhow::Result<()> {
        let (status, body) = admin_call(self.admin, "POST", "/drain_listeners?graceful")?;
        if status != 200 {
            bail!("envoy /drain_listeners?graceful answered {status}: {body}");
        }
        Ok(())
    }

    /// Which sidecar this is.
    #[must_use]
    pub fn kind(&self) -> SidecarKind {
        self.kind
    }

    /// Where the sidecar's (only) listener is bound.
    #[must_use]
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }

    /// The admin interface.
    #[must_use]
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// The rendered bootstrap Envoy runs.
    #[must_use]
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("envoy.yaml")
    }

    /// The Envoy process (logs, signals).
    pub fn process_mut(&mut self) -> &mut ChildProcess {
        &mut self.process
    }

    /// Envoy's process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// A counter or gauge from the admin `/stats`, `None` if Envoy has no stat of that name.
    ///
    /// # Errors
    /// The admin API cannot be reached.
    pub fn stat(&self, name: &str) -> anyhow::Result<Option<u64>> {
        let (status, body) = admin_get(self.admin, &format!("/stats?filter=^{name}$"))?;
        if status != 200 {
            bail!("admin /stats answered {status}: {body}");
        }
        Ok(body
            .lines()
            .filter_map(|line| line.split_once(": "))
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.trim().parse().ok()))
    }

    /// `http.<stat_prefix>.<suffix>` of this sidecar's connection manager, 0 if absent.
    ///
    /// # Errors
    /// The admin API cannot be reached.
    pub fn http_stat(&self, suffix: &str) -> anyhow::Result<u64> {
        Ok(self.stat(&format!("http.{}.{suffix}", self.kind.stat_prefix()))?.unwrap_or(0))
    }
}

/// The address of the first listener, from `/listeners?format=json`.
fn listener_address(admin: SocketAddr) -> anyhow::Result<SocketAddr> {
    let (status, body) = admin_get(admin, "/listeners?format=json")?;
    if status != 200 {
        bail!("admin /listeners answered {status}: {body}");
    }
    let json: Value = serde_json::from_str(&body).with_context(|| format!("admin /listeners: {body}"))?;
    let socket = &json["listener_statuses"][0]["local_address"]["socket_address"];
    let (Some(ip), Some(port)) = (socket["address"].as_str(), socket["port_value"].as_u64()) else {
        bail!("no listener address in admin /listeners: {body}");
    };
    Ok(SocketAddr::new(ip.parse()?, u16::try_from(port)?))
}

/// A minimal blocking HTTP/1.1 GET to Envoy's admin interface: (status, body).
///
/// # Errors
/// The admin interface cannot be reached or answers malformed HTTP.
pub fn admin_get(admin: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    admin_call(admin, "GET", path)
}

/// The same with `method` (`POST` for Envoy's mutating admin endpoints, e.g.
/// `/drain_listeners?graceful`).
///
/// # Errors
/// The admin interface cannot be reached or answers malformed HTTP.
pub fn admin_call(admin: SocketAddr, method: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&admin, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "{method} {path} HTTP/1.1\r\nHost: {admin}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else { bail!("malformed admin answer: {text}") };
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked { dechunk(body)? } else { body.to_string() };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    loop {
        let Some((size, rest)) = body.split_once("\r\n") else { bail!("malformed chunked body") };
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = rest.get(..size).context("truncated chunk")?;
        out.push_str(chunk);
        body = rest.get(size..).unwrap_or("").trim_start_matches("\r\n");
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    fn params() -> SidecarParams {
        SidecarParams::new(SocketAddr::from(([127, 0, 0, 1], 9)), "c", "k", "ca")
    }

    #[test]
    fn both_templates_render_completely() -> anyhow::Result<()> {
        for kind in [SidecarKind::Principal, SidecarKind::Agent] {
            let out = render(&template(kind.template_file())?, &params().placeholders(kind)?)?;
            assert!(out.lines().filter(|l| !l.trim_start().starts_with('#')).all(|l| !l.contains("${")), "{kind:?}");
            assert!(out.contains("300.000s"), "{kind:?}: idle timeout not rendered");
        }
        Ok(())
    }

    #[test]
    fn render_names_missing_and_unknown_placeholders() {
        let values = BTreeMap::from([("A", "1".to_string())]);
        let err = render("a: ${A}\nb: ${B}\n# ${C} in a comment is fine\n", &values).err().map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("placeholders without a value: ${B}"));
        let err = render("a: 1\n", &values).err().map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("the template has no placeholder ${A}"));
    }

    #[test]
    fn durations_are_protobuf_json() {
        assert_eq!(proto_duration(Duration::from_millis(2500)), "2.500s");
        assert_eq!(proto_duration(Duration::from_secs(300)), "300.000s");
    }

    #[test]
    fn chunked_bodies_are_joined() -> anyhow::Result<()> {
        assert_eq!(dechunk("4\r\nLIVE\r\n1\r\n\n\r\n0\r\n\r\n")?, "LIVE\n");
        Ok(())
    }
}
