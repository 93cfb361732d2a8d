//! The version handshake on `Authenticate`: which agent versions the principal accepts, and
//! which version it answers with.
//!
//! What each side sends (upstream `internal/version`, `principal/apis/auth/auth.go` since
//! argoproj-labs/argocd-agent PR #757):
//!
//! * an upstream agent sends its bare build version in `AuthRequest.version` (`0.10.0`, as
//!   `-X internal/version.version=$(cat VERSION)` sets it; `99.9.9-unreleased` for a dev build);
//!   the handshake (commit `33793feb`, PR #757, merged 2026-02-24) is in every release from v0.8.0
//!   (2026-04-07) on; releases before it (v0.7.x, v0.7.7 of 2026-05-19 too) send nothing;
//! * an upstream principal refuses an empty version (`InvalidArgument`) and any version that is
//!   not byte-equal to its own (`FailedPrecondition "version mismatch"`), and answers its own bare
//!   version in `AuthResponse.version`; `versionapi.Version` answers `argocd-agent-<version>`;
//! * our agents send `argocd-agent-<our version>`: our version numbers are not upstream's, so
//!   the qualified form tells our agents apart from upstream ones.
//!
//! Upstream's rule makes every upgrade a flag day. [`VersionCheck::Compatible`] (the default)
//! accepts our agents and every upstream release from a minimum on, and answers an upstream
//! agent with its own version. Upstream's agents do not read `AuthResponse.version` at all
//! (`pkg/client/remote.go` of v0.8.0, v0.9.0 and main of 2026-08-20, days before v0.10.0); their
//! own version is the one answer an agent comparing it as upstream's principal does would accept.

use std::fmt;
use std::str::FromStr;

use tonic::Status;

/// The prefix of a qualified version (`argocd-agent-0.1.0`), as upstream's `QualifiedVersion`.
pub const QUALIFIED_PREFIX: &str = "argocd-agent-";

/// The oldest upstream agent release [`VersionCheck::Compatible`] accepts by default: v0.8.0, the
/// first release with the version handshake (every release that speaks the protocol as we do).
pub const DEFAULT_MIN_AGENT_VERSION: ReleaseVersion = ReleaseVersion { major: 0, minor: 8, patch: 0 };

/// A release number `MAJOR.MINOR[.PATCH]`, read from upstream's spellings: an optional
/// `argocd-agent-` and `v` prefix, and a pre-release or build suffix (`-rc1`, `+abc`) that is
/// ignored when comparing (a release candidate of the minimum is accepted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReleaseVersion {
    /// Major.
    pub major: u64,
    /// Minor.
    pub minor: u64,
    /// Patch (0 when absent).
    pub patch: u64,
}

impl fmt::Display for ReleaseVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A version string that is not `MAJOR.MINOR[.PATCH]`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a release version (expected MAJOR.MINOR.PATCH, e.g. 0.10.0)")]
pub struct InvalidVersion(pub String);

impl FromStr for ReleaseVersion {
    type Err = InvalidVersion;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || InvalidVersion(s.to_owned());
        let bare = s.strip_prefix(QUALIFIED_PREFIX).unwrap_or(s);
        let bare = bare.strip_prefix(['v', 'V']).unwrap_or(bare);
        let core = bare.split(['-', '+']).next().unwrap_or_default();
        let mut parts = core.split('.');
        let mut number = |required: bool| match parts.next() {
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p.parse::<u64>().map_err(|_| bad()),
            None if !required => Ok(0),
            _ => Err(bad()),
        };
        let version = Self { major: number(true)?, minor: number(true)?, patch: number(false)? };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(version)
    }
}

/// How `Authenticate` judges the agent's `version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VersionCheck {
    /// Our agents (`argocd-agent-<version>`, any version) and upstream agents whose version is a
    /// release at or after `min`; an empty or unreadable version is refused. An upstream agent
    /// is answered with its own version.
    Compatible {
        /// The oldest upstream release accepted.
        min: ReleaseVersion,
    },
    /// Upstream's rule: the version must equal the principal's own string exactly (so only our
    /// agents of the same build); an empty one is refused.
    Exact,
    /// No check; an empty version is accepted too (upstream agents from before the handshake).
    Skip,
}

impl Default for VersionCheck {
    fn default() -> Self {
        Self::Compatible { min: DEFAULT_MIN_AGENT_VERSION }
    }
}

impl VersionCheck {
    /// Judges `agent`'s version against `principal`'s and returns the version to answer with
    /// (`AuthResponse.version`): `principal`, except that an upstream agent (a bare version)
    /// is answered with its own, the only answer upstream's exact comparison accepts.
    ///
    /// # Errors
    ///
    /// `InvalidArgument` for an empty version (unless [`Self::Skip`]), `FailedPrecondition`
    /// for one outside the policy; the messages say what was expected.
    pub fn judge(&self, agent: &str, principal: &str) -> Result<String, Status> {
        let upstream = !agent.is_empty() && agent != principal && !agent.starts_with(QUALIFIED_PREFIX);
        let answer = if upstream { agent.to_owned() } else { principal.to_owned() };
        if *self == Self::Skip || agent == principal {
            return Ok(answer);
        }
        if agent.is_empty() {
            return Err(Status::invalid_argument(format!(
                "the agent sent no version (upstream agents before the version handshake send none); \
                 this principal is {principal}{}",
                if *self == Self::Exact { "" } else { " and accepts them with --agent-version-check=skip" }
            )));
        }
        let Self::Compatible { min } = *self else {
            return Err(Status::failed_precondition(format!(
                "version mismatch: agent is {agent}, principal is {principal} (--agent-version-check=exact)"
            )));
        };
        if !upstream {
            // One of our agents, of another build.
            return agent
                .parse::<ReleaseVersion>()
                .map(|_| answer)
                .map_err(|e| Status::failed_precondition(e.to_string()));
        }
        match agent.parse::<ReleaseVersion>() {
            Ok(v) if v >= min => Ok(answer),
            Ok(v) => Err(Status::failed_precondition(format!(
                "version mismatch: upstream agent {v} is older than {min}, the oldest this principal accepts \
                 (--min-agent-version)"
            ))),
            Err(e) => Err(Status::failed_precondition(format!("version mismatch: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: &str = "argocd-agent-0.1.0";

    fn v(s: &str) -> ReleaseVersion {
        s.parse().unwrap()
    }

    #[test]
    fn parses_upstream_spellings() {
        let ten = ReleaseVersion { major: 0, minor: 10, patch: 0 };
        for s in
            ["0.10.0", "v0.10.0", "argocd-agent-0.10.0", "argocd-agent-v0.10.0", "0.10", "0.10.0-rc1", "0.10.0+abc"]
        {
            assert_eq!(v(s), ten, "{s}");
        }
        assert_eq!(v("99.9.9-unreleased"), ReleaseVersion { major: 99, minor: 9, patch: 9 });
        for s in ["", "v", "0", "0.x.1", "0.1.2.3", "latest", "0..1", "-1.0.0", "0.1.0 "] {
            assert!(s.parse::<ReleaseVersion>().is_err(), "{s:?}");
        }
        assert!(v("0.10.0") > v("0.9.12"));
    }

    #[test]
    fn compatible_accepts_our_agents_and_upstream_releases_from_the_minimum() {
        let check = VersionCheck::default();
        assert_eq!(check.judge(OURS, OURS).unwrap(), OURS);
        assert_eq!(check.judge("argocd-agent-0.2.0", OURS).unwrap(), OURS);
        for upstream in
            ["0.8.0", "0.8.1", "0.9.0", "0.9.3", "0.10.0", "v0.10.1", "0.11.0-rc1", "1.0.0", "99.9.9-unreleased"]
        {
            assert_eq!(check.judge(upstream, OURS).unwrap(), upstream, "answered with its own version");
        }
        // Older than the handshake: a release string (releases before v0.8.0 send none) or nothing.
        let older = check.judge("0.7.7", OURS).unwrap_err();
        assert_eq!(older.code(), tonic::Code::FailedPrecondition);
        assert!(older.message().contains("older than 0.8.0"), "{}", older.message());
        assert_eq!(check.judge("main", OURS).unwrap_err().code(), tonic::Code::FailedPrecondition);
        assert_eq!(check.judge("argocd-agent-dev", OURS).unwrap_err().code(), tonic::Code::FailedPrecondition);
        let empty = check.judge("", OURS).unwrap_err();
        assert_eq!(empty.code(), tonic::Code::InvalidArgument);
        assert!(empty.message().contains("--agent-version-check=skip"), "{}", empty.message());
        let lower = VersionCheck::Compatible { min: v("0.5.0") };
        assert!(lower.judge("0.7.7", OURS).is_ok());
        let higher = VersionCheck::Compatible { min: v("0.9.0") };
        assert_eq!(higher.judge("0.8.1", OURS).unwrap_err().code(), tonic::Code::FailedPrecondition);
    }

    #[test]
    fn exact_is_upstreams_rule_and_skip_accepts_everything() {
        assert_eq!(VersionCheck::Exact.judge(OURS, OURS).unwrap(), OURS);
        assert_eq!(VersionCheck::Exact.judge("0.10.0", OURS).unwrap_err().code(), tonic::Code::FailedPrecondition);
        assert_eq!(VersionCheck::Exact.judge("", OURS).unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(VersionCheck::Skip.judge("", OURS).unwrap(), OURS);
        assert_eq!(VersionCheck::Skip.judge("0.1.0", OURS).unwrap(), "0.1.0");
        assert_eq!(VersionCheck::Skip.judge("argocd-agent-9.9.9", OURS).unwrap(), OURS);
    }
}
