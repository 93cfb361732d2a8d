//! Which certificates and names are never an agent's.
//!
//! One CA commonly issues every certificate of a deployment (`argocd-agentctl pki`, as
//! upstream's): the principal's and the resource proxy's server certificates, the agents' gRPC
//! client certificates, and the client certificates the hub's Argo CD presents to the resource
//! proxy (cluster secrets). Chaining to the CA therefore says nothing about what a certificate is
//! for, and two rules keep the populations apart:
//!
//! * **The resource proxy's callers carry a mark an agent's certificate never has**: the subject
//!   organizational unit [`RESOURCE_PROXY_CLIENT_OU`], which only the CA can put there (the
//!   subject is signed). The resource proxy refuses a client certificate without it (unless the
//!   operator opts out for certificates issued before the mark existed), so an agent's own client
//!   certificate, readable on its spoke, does not open the proxy; and `Authenticate` refuses a
//!   certificate with it, so a cluster secret's certificate does not make an agent.
//! * **Principal replicas carry a mark of their own**: the subject OU [`PRINCIPAL_REPLICA_OU`]
//!   (`argocd-agentctl pki issue replica`). A replica that does not own an agent forwards the
//!   resource-proxy requests for it to the replica that does, presenting that certificate; the
//!   owner then trusts the agent the forwarding replica names. Only a certificate with this mark
//!   and without the resource-proxy client mark is a replica's: neither an agent's certificate nor
//!   a cluster secret's can pass as one, and `Authenticate` refuses a replica's.
//! * **Names the PKI gives to non-agent certificates are never agent names**
//!   ([`NON_AGENT_NAMES`]): the principal's certificate (`clientAuth` too, which cross-hub HA
//!   needs) would otherwise authenticate as agent `argocd-agent-principal` and self-register a
//!   cluster.

use x509_parser::prelude::{FromDer, X509Certificate};

/// The subject OU that marks a client certificate of the resource proxy's callers (cluster
/// secrets written by `argocd-agentctl agent create` and self-registration's shared client
/// certificate).
pub const RESOURCE_PROXY_CLIENT_OU: &str = "argocd-agent-resource-proxy-client";

/// The subject OU that marks the client certificate principal replicas present to each other
/// when one forwards a resource-proxy request to the replica that owns the agent
/// (`argocd-agentctl pki issue replica`).
pub const PRINCIPAL_REPLICA_OU: &str = "argocd-agent-principal-replica";

/// The CNs `argocd-agentctl pki` (ours and upstream's) gives to certificates that are not
/// agents': the CA, the principal, the resource proxy.
pub const NON_AGENT_NAMES: [&str; 3] = ["argocd-agent-ca", "argocd-agent-principal", "argocd-agent-resource-proxy"];

/// Whether `name` is one of [`NON_AGENT_NAMES`].
#[must_use]
pub fn is_non_agent_name(name: &str) -> bool {
    NON_AGENT_NAMES.contains(&name)
}

/// Whether the DER certificate carries the resource-proxy client mark
/// ([`RESOURCE_PROXY_CLIENT_OU`] among its subject's OUs). An unparsable certificate carries
/// none.
#[must_use]
pub fn is_resource_proxy_client(der: &[u8]) -> bool {
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return false;
    };
    cert.subject().iter_organizational_unit().any(|ou| ou.as_str().is_ok_and(|v| v == RESOURCE_PROXY_CLIENT_OU))
}

/// Whether the DER certificate is a principal replica's: it carries [`PRINCIPAL_REPLICA_OU`] and
/// not [`RESOURCE_PROXY_CLIENT_OU`] (a certificate with both marks is neither's). An unparsable
/// certificate is no replica's.
#[must_use]
pub fn is_principal_replica(der: &[u8]) -> bool {
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return false;
    };
    let ous: Vec<&str> = cert.subject().iter_organizational_unit().filter_map(|ou| ou.as_str().ok()).collect();
    ous.contains(&PRINCIPAL_REPLICA_OU) && !ous.contains(&RESOURCE_PROXY_CLIENT_OU)
}

/// Why the DER client certificate of an `Authenticate` call is not an agent's, or `None` when
/// nothing marks it as another's.
#[must_use]
pub fn not_an_agent_certificate(der: &[u8]) -> Option<String> {
    let marked = |ou: &str| {
        X509Certificate::from_der(der)
            .is_ok_and(|(_, cert)| cert.subject().iter_organizational_unit().any(|v| v.as_str().is_ok_and(|v| v == ou)))
    };
    let (what, ou) = if is_resource_proxy_client(der) {
        ("a resource-proxy client certificate", RESOURCE_PROXY_CLIENT_OU)
    } else if marked(PRINCIPAL_REPLICA_OU) {
        ("a principal replica's certificate", PRINCIPAL_REPLICA_OU)
    } else {
        return None;
    };
    Some(format!(
        "the client certificate is {what} (subject OU {ou}), not an agent's: issue the agent its own \
         certificate (argocd-agentctl pki issue agent)"
    ))
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, DnType, KeyPair};

    use super::*;

    fn cert(cn: &str, ou: Option<&str>) -> Vec<u8> {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        if let Some(ou) = ou {
            params.distinguished_name.push(DnType::OrganizationalUnitName, ou);
        }
        let key = KeyPair::generate().expect("key");
        params.self_signed(&key).expect("cert").der().to_vec()
    }

    #[test]
    fn the_mark_is_read_from_the_subject() {
        assert!(is_resource_proxy_client(&cert("agent-a", Some(RESOURCE_PROXY_CLIENT_OU))));
        assert!(!is_resource_proxy_client(&cert("agent-a", None)));
        assert!(!is_resource_proxy_client(&cert("agent-a", Some("team-a"))));
        assert!(!is_resource_proxy_client(b"not a certificate"));
        assert!(not_an_agent_certificate(&cert("agent-a", Some(RESOURCE_PROXY_CLIENT_OU))).is_some());
        assert!(not_an_agent_certificate(&cert("agent-a", None)).is_none());
    }

    #[test]
    fn only_the_replica_mark_alone_makes_a_replica() {
        assert!(is_principal_replica(&cert("principal-0", Some(PRINCIPAL_REPLICA_OU))));
        assert!(!is_principal_replica(&cert("agent-a", None)), "an agent's certificate");
        assert!(!is_principal_replica(&cert("agent-a", Some(RESOURCE_PROXY_CLIENT_OU))), "a cluster secret's");
        assert!(!is_principal_replica(b"not a certificate"));
        assert!(not_an_agent_certificate(&cert("principal-0", Some(PRINCIPAL_REPLICA_OU))).is_some());
    }

    #[test]
    fn pki_names_are_not_agent_names() {
        assert!(is_non_agent_name("argocd-agent-principal"));
        assert!(is_non_agent_name("argocd-agent-resource-proxy"));
        assert!(!is_non_agent_name("agent-a"));
    }
}
