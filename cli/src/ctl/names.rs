//! Checks on names that end up in certificates: agent names (DNS-1123 labels, as the principal
//! requires of every agent ID it extracts) and the parts of a SPIFFE ID.

use anyhow::bail;

/// Longest DNS-1123 label (and so longest agent name).
pub const MAX_LABEL_LEN: usize = 63;
/// Longest SPIFFE trust domain.
const MAX_TRUST_DOMAIN_LEN: usize = 255;

/// Check that `name` is a DNS-1123 label, which the principal requires of agent IDs
/// (upstream `internal/auth/mtls/mtls.go`), so a certificate for any other name could never log in.
///
/// # Errors
/// The name breaks the rule; the message states it.
pub fn validate_agent_name(name: &str) -> anyhow::Result<()> {
    let bytes = name.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= MAX_LABEL_LEN
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric);
    if !ok {
        bail!(
            "invalid agent name {name:?}: an agent name must be a DNS-1123 label (RFC 1123): 1 to \
             {MAX_LABEL_LEN} characters, only lowercase letters a-z, digits 0-9 and '-', starting and ending \
             with a letter or digit; the principal rejects agents whose certificate CN is not one"
        );
    }
    Ok(())
}

/// Check a SPIFFE trust domain: lowercase letters, digits, `.`, `-` and `_`, at most 255 bytes.
///
/// # Errors
/// The trust domain breaks the SPIFFE-ID rules; the message states which.
pub fn validate_trust_domain(td: &str) -> anyhow::Result<()> {
    if td.is_empty() || td.len() > MAX_TRUST_DOMAIN_LEN {
        bail!(
            "invalid SPIFFE trust domain {td:?} (--spiffe-trust-domain): it must be 1 to {MAX_TRUST_DOMAIN_LEN} bytes"
        );
    }
    if !td.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')) {
        bail!(
            "invalid SPIFFE trust domain {td:?} (--spiffe-trust-domain): only lowercase letters, digits, '.', '-' \
             and '_' are allowed (no scheme, port or path)"
        );
    }
    Ok(())
}

/// Check one path segment of a SPIFFE ID.
///
/// # Errors
/// The segment is empty, `.`/`..`, or has a character outside `[A-Za-z0-9._-]`.
pub fn validate_spiffe_segment(what: &str, segment: &str) -> anyhow::Result<()> {
    if segment.is_empty() || segment == "." || segment == ".." {
        bail!("invalid {what} {segment:?} for a SPIFFE ID: a path segment cannot be empty, '.' or '..'");
    }
    if !segment.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')) {
        bail!("invalid {what} {segment:?} for a SPIFFE ID: only letters, digits, '.', '-' and '_' are allowed");
    }
    Ok(())
}

/// `spiffe://<td>/ns/<namespace>/sa/<service-account>`, the Kubernetes convention of Istio and SPIRE.
///
/// # Errors
/// A part breaks the SPIFFE-ID rules.
pub fn kubernetes_spiffe_id(trust_domain: &str, namespace: &str, service_account: &str) -> anyhow::Result<String> {
    validate_trust_domain(trust_domain)?;
    validate_spiffe_segment("namespace (--spiffe-namespace)", namespace)?;
    validate_spiffe_segment("service account (--spiffe-service-account)", service_account)?;
    Ok(format!("spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_names_follow_dns_1123_labels() {
        for good in ["agent-1", "a", "0", "a-b-c", &"x".repeat(63)] {
            validate_agent_name(good).unwrap();
        }
        for bad in ["", "Agent_1", "-a", "a-", "a.b", "agent_1", "UPPER", &"x".repeat(64)] {
            let err = validate_agent_name(bad).unwrap_err().to_string();
            assert!(err.contains("DNS-1123"), "{err}");
        }
    }

    #[test]
    fn spiffe_ids() {
        assert_eq!(
            kubernetes_spiffe_id("cluster.local", "argocd", "agent-1").unwrap(),
            "spiffe://cluster.local/ns/argocd/sa/agent-1"
        );
        assert!(kubernetes_spiffe_id("Cluster.local", "argocd", "a").is_err());
        assert!(kubernetes_spiffe_id("td:443", "argocd", "a").is_err());
        assert!(kubernetes_spiffe_id("td", "..", "a").is_err());
        assert!(kubernetes_spiffe_id("td", "ns", "a/b").is_err());
    }
}
