//! [`RedisServer`]: a real `redis-server` (Debian's, installed by `scripts/install-test-deps`)
//! on a loopback port, plaintext or TLS only, saving nothing; stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::pki::Ca;
use crate::process::ChildProcess;
use crate::wait::{DEFAULT_TIMEOUT, Poller};

/// A TLS server's files: certificate, key, and the CA that issued it.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The server certificate (for 127.0.0.1 and localhost).
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// The CA clients verify it with.
    pub ca: PathBuf,
}

impl TlsFiles {
    /// Issues a server certificate named `name` from `ca` and writes the three files to `dir`.
    ///
    /// # Errors
    /// Issuing or writing fails.
    pub fn issue(ca: &Ca, dir: &Path, name: &str) -> anyhow::Result<Self> {
        let issued = ca.server(name, &["127.0.0.1", "localhost"], &[])?;
        let files = Self {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
            ca: dir.join(format!("{name}-ca.crt")),
        };
        std::fs::write(&files.cert, issued.cert)?;
        std::fs::write(&files.key, issued.key)?;
        std::fs::write(&files.ca, &ca.pem)?;
        Ok(files)
    }
}

/// One redis-server on 127.0.0.1; stopped when dropped.
#[derive(Debug)]
pub struct RedisServer {
    _process: ChildProcess,
    /// Its port (the TLS port with TLS).
    pub port: u16,
    /// With TLS: the CA file clients verify it with.
    pub ca: Option<PathBuf>,
}

impl RedisServer {
    /// Starts one on a free port (plaintext, or TLS only with `tls`; `extra`: more settings,
    /// e.g. `--requirepass`) and waits until it accepts connections.
    ///
    /// # Errors
    /// redis-server is missing or does not start.
    pub async fn start(name: &str, tls: Option<&TlsFiles>, extra: &[&str]) -> anyhow::Result<Self> {
        Self::start_on(name, None, tls, extra).await
    }

    /// [`Self::start`] on `fixed` (`None`: a free port, retried when another process takes it
    /// first).
    ///
    /// # Errors
    /// As [`Self::start`].
    pub async fn start_on(
        name: &str,
        fixed: Option<u16>,
        tls: Option<&TlsFiles>,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        for _attempt in 0..if fixed.is_some() { 1 } else { 5 } {
            let port = match fixed {
                Some(port) => port,
                None => std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port(),
            };
            let mut cmd = Command::new("redis-server");
            cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--protected-mode", "no"]).args(extra);
            match tls {
                None => {
                    cmd.args(["--port", &port.to_string()]);
                }
                Some(files) => {
                    cmd.args(["--port", "0", "--tls-port", &port.to_string(), "--tls-auth-clients", "no"])
                        .arg("--tls-cert-file")
                        .arg(&files.cert)
                        .arg("--tls-key-file")
                        .arg(&files.key)
                        .arg("--tls-ca-cert-file")
                        .arg(&files.ca);
                }
            }
            let mut process = ChildProcess::spawn(name, cmd)
                .context("redis-server is missing: run scripts/install-test-deps (Debian package redis-server)")?;
            let mut poll = Poller::new(DEFAULT_TIMEOUT, format!("{name} to listen on {port}"));
            let listening = loop {
                if !process.is_running() {
                    break false; // lost the port to another process: try another
                }
                if process.stdout().contains("Ready to accept connections") {
                    break true;
                }
                poll.tick().await?;
            };
            if listening {
                return Ok(Self { _process: process, port, ca: tls.map(|f| f.ca.clone()) });
            }
        }
        bail!("{name}: redis-server did not start")
    }

    /// `127.0.0.1:PORT`.
    #[must_use]
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}
