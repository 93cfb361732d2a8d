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

/// A secret that must exist, naming the flag that names it when it does not.
async fn existing_secret(
    secrets: &Secrets,
    name: &str,
    flag: &str,
) -> anyhow::Result<k8s_openapi::api::core::v1::Secret> {
    secrets.get(name).await?.with_context(|| {
        format!(
            "secret {}/{name} (from {flag}) does not exist: create it with argocd-agentctl pki, or pass the file flags",
            secrets.namespace()
        )
    })
}

/// The first of `fields` that `secret` has.
fn first_field(secret: &k8s_openapi::api::core::v1::Secret, fields: &[&str]) -> anyhow::Result<String> {
    let mut last = None;
    for field in fields {
        match field_text(secret, field) {
            Ok(text) => return Ok(text),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no field requested")))
}

/// One field of a secret, naming the secret and the flag that names it when it is missing.
///
/// # Errors
/// The secret or the field does not exist.
pub async fn secret_field(secrets: &Secrets, name: &str, fields: &[&str], flag: &str) -> anyhow::Result<String> {
    first_field(&existing_secret(secrets, name, flag).await?, fields)
}

/// A certificate (`tls.crt`) and its key (`tls.key`): each from its file when its flag gives
/// one (`cert` and `key`: the path and the flag's name), the others from one read of secret
/// `secret`, so a certificate and key read together come from the same version of it.
///
/// # Errors
/// A file cannot be read, or the secret or a field does not exist.
pub async fn key_pair(
    cert: (Option<&Path>, &str),
    key: (Option<&Path>, &str),
    secrets: &Secrets,
    secret: &str,
    secret_flag: &str,
) -> anyhow::Result<(String, String)> {
    let stored = match (cert.0, key.0) {
        (Some(_), Some(_)) => None,
        _ => Some(existing_secret(secrets, secret, secret_flag).await?),
    };
    let read = |(path, flag): (Option<&Path>, &str), field: &str| match (path, &stored) {
        (Some(p), _) => read_pem(p, flag),
        (None, Some(s)) => first_field(s, &[field]),
        (None, None) => Err(anyhow::anyhow!("{flag}: no file and no secret")),
    };
    Ok((read(cert, "tls.crt")?, read(key, "tls.key")?))
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

/// The certificates in `pem`, at least one; `what` names them in the error (e.g. "the server
/// certificate").
///
/// # Errors
/// The PEM is malformed or holds no certificate.
pub fn certificates(pem: &str, what: &str) -> anyhow::Result<Vec<rustls_pki_types::CertificateDer<'static>>> {
    use rustls_pki_types::pem::PemObject as _;
    let certs = rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{what} is not PEM certificates"))?;
    anyhow::ensure!(!certs.is_empty(), "{what} holds no certificate");
    Ok(certs)
}

/// The private key in `pem`; `what` names it in the error (e.g. "the server key").
///
/// # Errors
/// The PEM holds no private key.
pub fn private_key(pem: &str, what: &str) -> anyhow::Result<rustls_pki_types::PrivateKeyDer<'static>> {
    use rustls_pki_types::pem::PemObject as _;
    rustls_pki_types::PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .with_context(|| format!("{what} is not a PEM private key"))
}
