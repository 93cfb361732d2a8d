//! Which SPIFFE IDs are agents, and which agent each one is: [`SpiffePolicy`].
//!
//! A policy names the trust domains it accepts and path patterns such as
//! `/ns/{namespace}/sa/{agent}`: literal segments match exactly, a `{placeholder}` captures one
//! whole segment. The agent name is the capture of the agent placeholder (default `{agent}`) and
//! must be a DNS-1123 label, as upstream requires of every agent ID. Namespaces can be limited by
//! an allow list and a deny list (the mesh profiles deny the mesh's own namespace, where ingress
//! gateways live: a gateway's identity is never an agent).

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use crate::spiffe::{SpiffeId, TrustDomain, is_path_segment_char};

/// A configuration mistake in a [`SpiffePolicy`] or a [`PathPattern`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyConfigError {
    /// A path pattern is malformed.
    #[error("SPIFFE path pattern {pattern:?}: {reason}")]
    BadPattern {
        /// The pattern as given.
        pattern: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The policy accepts no trust domain.
    #[error("a SPIFFE policy needs at least one trust domain")]
    NoTrustDomains,
    /// The policy has no path pattern.
    #[error("a SPIFFE policy needs at least one path pattern, such as /ns/{{namespace}}/sa/{{agent}}")]
    NoPatterns,
    /// A pattern lacks the placeholder the agent name is taken from.
    #[error("SPIFFE path pattern {pattern:?} has no {{{placeholder}}} placeholder to take the agent name from")]
    MissingAgentPlaceholder {
        /// The pattern.
        pattern: String,
        /// The agent placeholder's name.
        placeholder: String,
    },
    /// Namespace lists are configured but a pattern captures no namespace.
    #[error(
        "SPIFFE path pattern {pattern:?} has no {{namespace}} placeholder, so namespace allow/deny lists cannot apply"
    )]
    MissingNamespacePlaceholder {
        /// The pattern.
        pattern: String,
    },
}

/// Why a SPIFFE ID is not an agent under a [`SpiffePolicy`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The ID's trust domain is not one the policy accepts.
    #[error("SPIFFE ID {id}: trust domain {trust_domain:?} is not allowed (allowed: {allowed:?})")]
    TrustDomainNotAllowed {
        /// The ID.
        id: String,
        /// Its trust domain.
        trust_domain: String,
        /// The trust domains the policy accepts.
        allowed: Vec<String>,
    },
    /// The ID's path matches none of the policy's patterns.
    #[error("SPIFFE ID {id}: path {path:?} matches none of the patterns {patterns:?}")]
    PathMismatch {
        /// The ID.
        id: String,
        /// Its path.
        path: String,
        /// The policy's patterns.
        patterns: Vec<String>,
    },
    /// The captured namespace is on the deny list (e.g. the mesh's own namespace, where gateways run).
    #[error("SPIFFE ID {id}: namespace {namespace:?} is denied (a mesh gateway or control plane is never an agent)")]
    NamespaceDenied {
        /// The ID.
        id: String,
        /// The captured namespace.
        namespace: String,
    },
    /// The captured namespace is not on the allow list.
    #[error("SPIFFE ID {id}: namespace {namespace:?} is not in the allowed namespaces {allowed:?}")]
    NamespaceNotAllowed {
        /// The ID.
        id: String,
        /// The captured namespace.
        namespace: String,
        /// The allowed namespaces.
        allowed: Vec<String>,
    },
    /// The captured agent name is not a DNS-1123 label.
    #[error("SPIFFE ID {id}: agent name {agent:?} is not a DNS-1123 label: {reason}")]
    AgentNotDnsLabel {
        /// The ID.
        id: String,
        /// The captured name.
        agent: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
}

// === PathPattern ===

/// The Kubernetes SPIFFE path convention (Istio, SPIRE's k8s workload attestor).
pub const KUBERNETES_PATTERN: &str = "/ns/{namespace}/sa/{agent}";

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Placeholder(String),
}

/// A SPIFFE ID path pattern such as `/ns/{namespace}/sa/{agent}`: literal segments match
/// exactly, each `{name}` captures one whole segment. Names are `[a-z_][a-z0-9_]*`, each at most
/// once per pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    segments: Vec<Segment>,
}

impl PathPattern {
    /// Parses a pattern.
    ///
    /// # Errors
    ///
    /// [`PolicyConfigError::BadPattern`] saying what is wrong.
    pub fn new(pattern: &str) -> Result<Self, PolicyConfigError> {
        let bad =
            |reason: &str| PolicyConfigError::BadPattern { pattern: pattern.to_owned(), reason: reason.to_owned() };
        let rest = pattern.strip_prefix('/').ok_or_else(|| bad("it must start with '/'"))?;
        let mut segments = Vec::new();
        for segment in rest.split('/') {
            if segment.is_empty() {
                return Err(bad("it has an empty segment or a trailing '/'"));
            }
            if let Some(name) = segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                let valid = name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                    && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
                if !valid {
                    return Err(bad("placeholder names are [a-z_][a-z0-9_]*, e.g. {agent}"));
                }
                if segments.contains(&Segment::Placeholder(name.to_owned())) {
                    return Err(bad("a placeholder appears twice"));
                }
                segments.push(Segment::Placeholder(name.to_owned()));
            } else if segment == "." || segment == ".." || !segment.chars().all(is_path_segment_char) {
                return Err(bad(
                    "a literal segment holds only letters, digits, '.', '-', '_' and is not '.' or '..'; \
                     a placeholder is a whole segment like {agent}",
                ));
            } else {
                segments.push(Segment::Literal(segment.to_owned()));
            }
        }
        Ok(Self { text: pattern.to_owned(), segments })
    }

    /// Whether the pattern has a `{name}` placeholder.
    #[must_use]
    pub fn has_placeholder(&self, name: &str) -> bool {
        self.segments.iter().any(|s| matches!(s, Segment::Placeholder(p) if p == name))
    }

    /// Matches a SPIFFE ID's path; on a match, returns the captures as `(placeholder, segment)`
    /// pairs in pattern order.
    #[must_use]
    pub fn captures<'a>(&'a self, id: &'a SpiffeId) -> Option<Vec<(&'a str, &'a str)>> {
        let mut path = id.segments();
        let mut captures = Vec::new();
        for segment in &self.segments {
            let actual = path.next()?;
            match segment {
                Segment::Literal(literal) if literal == actual => {}
                Segment::Literal(_) => return None,
                Segment::Placeholder(name) => captures.push((name.as_str(), actual)),
            }
        }
        path.next().is_none().then_some(captures)
    }

    /// The pattern as written.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for PathPattern {
    type Err = PolicyConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

// === AuthorizedAgent ===

/// A SPIFFE ID a [`SpiffePolicy`] accepted, and the agent it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthorizedAgent {
    agent: String,
    namespace: Option<String>,
    spiffe_id: SpiffeId,
}

impl AuthorizedAgent {
    /// The agent name: a DNS-1123 label.
    #[must_use]
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// The captured `{namespace}`, if the matching pattern has one.
    #[must_use]
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The SPIFFE ID the agent was derived from (what mesh sessions bind to).
    #[must_use]
    pub fn spiffe_id(&self) -> &SpiffeId {
        &self.spiffe_id
    }
}

// === SpiffePolicy ===

/// Which SPIFFE IDs are agents: allowed trust domains, path patterns, where the agent name comes
/// from, and optional namespace allow and deny lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpiffePolicy {
    trust_domains: Vec<TrustDomain>,
    patterns: Vec<PathPattern>,
    agent_placeholder: String,
    allowed_namespaces: Option<BTreeSet<String>>,
    denied_namespaces: BTreeSet<String>,
}

impl SpiffePolicy {
    /// The placeholder the agent name is taken from unless configured otherwise.
    pub const DEFAULT_AGENT_PLACEHOLDER: &'static str = "agent";
    /// The placeholder namespace lists apply to.
    pub const NAMESPACE_PLACEHOLDER: &'static str = "namespace";

    /// A policy accepting IDs in `trust_domains` whose path matches one of `patterns` (tried in
    /// order), taking the agent name from `{agent}`.
    ///
    /// # Errors
    ///
    /// [`PolicyConfigError`]: no trust domain, no pattern, or a pattern without `{agent}`.
    pub fn new(
        trust_domains: impl IntoIterator<Item = TrustDomain>,
        patterns: impl IntoIterator<Item = PathPattern>,
    ) -> Result<Self, PolicyConfigError> {
        Self::with_agent_placeholder(trust_domains, patterns, Self::DEFAULT_AGENT_PLACEHOLDER)
    }

    /// As [`Self::new`], taking the agent name from `{agent_placeholder}` (e.g. `sa`).
    ///
    /// # Errors
    ///
    /// [`PolicyConfigError`]: no trust domain, no pattern, or a pattern without the placeholder.
    pub fn with_agent_placeholder(
        trust_domains: impl IntoIterator<Item = TrustDomain>,
        patterns: impl IntoIterator<Item = PathPattern>,
        agent_placeholder: &str,
    ) -> Result<Self, PolicyConfigError> {
        let policy = Self {
            trust_domains: trust_domains.into_iter().collect(),
            patterns: patterns.into_iter().collect(),
            agent_placeholder: agent_placeholder.to_owned(),
            allowed_namespaces: None,
            denied_namespaces: BTreeSet::new(),
        };
        if policy.trust_domains.is_empty() {
            return Err(PolicyConfigError::NoTrustDomains);
        }
        if policy.patterns.is_empty() {
            return Err(PolicyConfigError::NoPatterns);
        }
        if let Some(p) = policy.patterns.iter().find(|p| !p.has_placeholder(agent_placeholder)) {
            return Err(PolicyConfigError::MissingAgentPlaceholder {
                pattern: p.to_string(),
                placeholder: agent_placeholder.to_owned(),
            });
        }
        Ok(policy)
    }

    /// Accepts only agents whose `{namespace}` is one of `namespaces`.
    ///
    /// # Errors
    ///
    /// [`PolicyConfigError::MissingNamespacePlaceholder`] if a pattern captures no namespace.
    pub fn with_allowed_namespaces<S: Into<String>>(
        mut self,
        namespaces: impl IntoIterator<Item = S>,
    ) -> Result<Self, PolicyConfigError> {
        self.check_namespace_placeholder()?;
        self.allowed_namespaces = Some(namespaces.into_iter().map(Into::into).collect());
        Ok(self)
    }

    /// Rejects agents whose `{namespace}` is one of `namespaces` (checked before the allow list).
    ///
    /// # Errors
    ///
    /// [`PolicyConfigError::MissingNamespacePlaceholder`] if a pattern captures no namespace.
    pub fn with_denied_namespaces<S: Into<String>>(
        mut self,
        namespaces: impl IntoIterator<Item = S>,
    ) -> Result<Self, PolicyConfigError> {
        self.check_namespace_placeholder()?;
        self.denied_namespaces = namespaces.into_iter().map(Into::into).collect();
        Ok(self)
    }

    /// The Kubernetes convention every mesh profile uses: `trust_domain`, the single pattern
    /// `/ns/{namespace}/sa/{agent}`, and `denied` namespaces. Built without validation from
    /// static values; a test checks it equals the validated construction.
    pub(crate) fn kubernetes(trust_domain: &'static str, denied: &[&str]) -> Self {
        let segments = vec![
            Segment::Literal("ns".to_owned()),
            Segment::Placeholder(Self::NAMESPACE_PLACEHOLDER.to_owned()),
            Segment::Literal("sa".to_owned()),
            Segment::Placeholder(Self::DEFAULT_AGENT_PLACEHOLDER.to_owned()),
        ];
        Self {
            trust_domains: vec![TrustDomain::from_static(trust_domain)],
            patterns: vec![PathPattern { text: KUBERNETES_PATTERN.to_owned(), segments }],
            agent_placeholder: Self::DEFAULT_AGENT_PLACEHOLDER.to_owned(),
            allowed_namespaces: None,
            denied_namespaces: denied.iter().map(|&s| s.to_owned()).collect(),
        }
    }

    fn check_namespace_placeholder(&self) -> Result<(), PolicyConfigError> {
        match self.patterns.iter().find(|p| !p.has_placeholder(Self::NAMESPACE_PLACEHOLDER)) {
            Some(p) => Err(PolicyConfigError::MissingNamespacePlaceholder { pattern: p.to_string() }),
            None => Ok(()),
        }
    }

    /// The accepted trust domains.
    #[must_use]
    pub fn trust_domains(&self) -> &[TrustDomain] {
        &self.trust_domains
    }

    /// The path patterns, in the order they are tried.
    #[must_use]
    pub fn patterns(&self) -> &[PathPattern] {
        &self.patterns
    }

    /// The placeholder the agent name is taken from.
    #[must_use]
    pub fn agent_placeholder(&self) -> &str {
        &self.agent_placeholder
    }

    /// The namespace allow list, if any.
    #[must_use]
    pub fn allowed_namespaces(&self) -> Option<&BTreeSet<String>> {
        self.allowed_namespaces.as_ref()
    }

    /// The namespace deny list.
    #[must_use]
    pub fn denied_namespaces(&self) -> &BTreeSet<String> {
        &self.denied_namespaces
    }

    /// Decides whether `id` is an agent, and which: trust domain, then the first matching
    /// pattern, then the namespace lists, then the agent name.
    ///
    /// # Errors
    ///
    /// [`PolicyError`] naming the check that failed and the values involved.
    pub fn authorize(&self, id: &SpiffeId) -> Result<AuthorizedAgent, PolicyError> {
        let id_text = || id.to_string();
        if !self.trust_domains.contains(id.trust_domain()) {
            return Err(PolicyError::TrustDomainNotAllowed {
                id: id_text(),
                trust_domain: id.trust_domain().to_string(),
                allowed: self.trust_domains.iter().map(ToString::to_string).collect(),
            });
        }
        let captures = self.patterns.iter().find_map(|p| p.captures(id)).ok_or_else(|| PolicyError::PathMismatch {
            id: id_text(),
            path: id.path().to_owned(),
            patterns: self.patterns.iter().map(ToString::to_string).collect(),
        })?;
        let capture = |name: &str| captures.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned());
        let namespace = capture(Self::NAMESPACE_PLACEHOLDER);
        if let Some(ns) = &namespace {
            if self.denied_namespaces.contains(ns) {
                return Err(PolicyError::NamespaceDenied { id: id_text(), namespace: ns.clone() });
            }
            if let Some(allowed) = self.allowed_namespaces.as_ref().filter(|a| !a.contains(ns)) {
                return Err(PolicyError::NamespaceNotAllowed {
                    id: id_text(),
                    namespace: ns.clone(),
                    allowed: allowed.iter().cloned().collect(),
                });
            }
        }
        // Every pattern has the agent placeholder (checked when the policy was built).
        let agent = capture(&self.agent_placeholder).unwrap_or_default();
        if let Some(reason) = dns_label_problem(&agent) {
            return Err(PolicyError::AgentNotDnsLabel { id: id_text(), agent, reason });
        }
        Ok(AuthorizedAgent { agent, namespace, spiffe_id: id.clone() })
    }
}

/// Why `name` is not a DNS-1123 label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters),
/// or `None` if it is one.
#[must_use]
pub fn dns_label_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("it is empty")
    } else if name.len() > 63 {
        Some("it is longer than 63 characters")
    } else if !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
        Some("it holds a character other than a-z, 0-9 and '-'")
    } else if name.starts_with('-') || name.ends_with('-') {
        Some("it starts or ends with '-'")
    } else {
        None
    }
}
