//! Key material for the principal and agent: from files when paths are given, else from the
//! Kubernetes secrets upstream uses (section 7.3), with messages that name the flag or secret.

use std::path::Path;

use anyhow::Context as _;

use crate::ctl::kube::{Secrets, field_text};

/// The version both sides announce; upstream requires an exact match on Authenticate.
pub const VERSION: &str = concat!("argocd-agent-", env!("CARGO_PKG_VERSION"));

/// Read a PEM file, naming the flag when it fails.
///
/// # Errors
/// The file cannot be read.
pub fn read_pem(path: &Path, flag: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("{flag} {}: cannot read", path.display()))
}

/// One field of a secret, naming the secret and the flag that names it when it is missing.
///
/// # Errors
/// The secret or the field does not exist.
pub async fn secret_field(secrets: &Secrets, name: &str, fields: &[&str], flag: &str) -> anyhow::Result<String> {
    let secret = secrets.get(name).await?.with_context(|| {
        format!(
            "secret {}/{name} (from {flag}) does not exist: create it with argocd-agentctl pki, or pass the file flags",
            secrets.namespace()
        )
    })?;
    let mut last = None;
    for field in fields {
        match field_text(&secret, field) {
            Ok(text) => return Ok(text),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no field requested")))
}

/// A PEM either from a file flag or from a secret field.
///
/// # Errors
/// Neither source yields it.
pub async fn pem_from(
    path: Option<&Path>,
    path_flag: &str,
    secrets: &Secrets,
    secret: &str,
    fields: &[&str],
    secret_flag: &str,
) -> anyhow::Result<String> {
    match path {
        Some(p) => read_pem(p, path_flag),
        None => secret_field(secrets, secret, fields, secret_flag).await,
    }
}

/// The agent name in a client certificate: its subject CN (what `mtls:subject:CN=([^,]+)` reads).
///
/// # Errors
/// The PEM does not parse or has no CN.
pub fn common_name(cert_pem: &str) -> anyhow::Result<String> {
    let der = crate::ctl::certs::first_cert_der(cert_pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| anyhow::anyhow!("client certificate does not parse: {e}"))?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .context("the client certificate has no subject CN: pass --agent-name")?;
    Ok(cn.to_string())
}
