//! Upstream's HA states, roles and transition table (`pkg/ha/state.go`), with the wire strings
//! `argocd-agentctl ha` prints.

use std::fmt;

/// Where a principal of a cross-hub pair stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Starting: the role is not decided yet.
    Recovering,
    /// A replica fetching its first snapshot from the peer.
    Syncing,
    /// A replica following the active peer's stream.
    Replicating,
    /// A replica whose replication stream is down.
    Disconnected,
    /// Serving agents (the only state that does).
    Active,
}

impl State {
    /// Every state, for the state gauge.
    pub const ALL: [Self; 5] = [Self::Recovering, Self::Syncing, Self::Replicating, Self::Disconnected, Self::Active];

    /// The wire string (`HAStatusResponse.state`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Recovering => "recovering",
            Self::Syncing => "syncing",
            Self::Replicating => "replicating",
            Self::Disconnected => "disconnected",
            Self::Active => "active",
        }
    }

    /// Whether agents are served and `/healthz` answers 200: only when active, as upstream.
    #[must_use]
    pub fn accepts_agents(self) -> bool {
        self == Self::Active
    }

    /// Whether this principal follows a peer (a replica's states).
    #[must_use]
    pub fn is_replica(self) -> bool {
        matches!(self, Self::Syncing | Self::Replicating | Self::Disconnected)
    }

    /// Upstream's `ValidTransition` table, plus `syncing -> disconnected` (upstream leaves a
    /// replica that never reached its peer in `syncing` forever, where not even a forced
    /// promotion is possible) and `active -> syncing` is not allowed (a demoted primary goes to
    /// `replicating`, as upstream).
    #[must_use]
    pub fn can_become(self, to: Self) -> bool {
        use State::{Active, Disconnected, Recovering, Replicating, Syncing};
        matches!(
            (self, to),
            (Recovering, Active | Syncing | Replicating | Disconnected)
                | (Replicating, Disconnected | Active | Syncing)
                | (Disconnected, Replicating | Active | Syncing)
                | (Active, Replicating)
                | (Syncing, Replicating | Disconnected | Active)
        )
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The role a principal takes at start (`--ha-preferred-role`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Goes active at start (unless fenced: see [`super::Ha::run`]).
    Primary,
    /// Follows the peer at start.
    Replica,
}

impl Role {
    /// The wire string (`HAStatusResponse.preferred_role`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Primary => "primary",
            Self::Replica => "replica",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    /// Upstream's `ParseRole`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "primary" => Ok(Self::Primary),
            "replica" => Ok(Self::Replica),
            other => Err(format!("unknown role: {other} (use 'primary' or 'replica')")),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an operator's promotion or demotion was refused (`FailedPrecondition` on the wire).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// Promote while active.
    #[error("already active")]
    AlreadyActive,
    /// Promote while the replication stream from the peer is live.
    #[error("still replicating from peer — demote peer first, or use --force")]
    StillReplicating,
    /// Promote while the peer still answers as active.
    #[error("peer {peer} is still active (epoch {epoch}) — demote peer first, or use --force")]
    PeerActive {
        /// The peer's address.
        peer: String,
        /// The peer's epoch.
        epoch: u64,
    },
    /// Promote of a replica that never completed a snapshot, without force.
    #[error(
        "can only promote from replicating or disconnected state, current: {0} (this replica has not completed a snapshot of the peer since it started or was cut off; use --force to promote it anyway)"
    )]
    NeverSynced(State),
    /// Demote while not active.
    #[error("can only demote from active state, current: {0}")]
    NotActive(State),
    /// Persisting the new epoch to the hub failed: the transition did not happen.
    #[error("cannot record the HA state on the hub (ConfigMap {config_map}): {reason}")]
    Persist {
        /// The ConfigMap.
        config_map: String,
        /// Why.
        reason: String,
    },
}

/// What the operator's promote decides, from the local state and what the peer said.
///
/// `peer_active` is the peer's epoch when it answered as active just now, `synced` whether this
/// replica ever completed a snapshot.
///
/// # Errors
/// Why the promotion is refused.
pub fn check_promote(
    state: State,
    force: bool,
    synced: bool,
    peer: &str,
    peer_active: Option<u64>,
) -> Result<(), TransitionError> {
    match state {
        State::Active => return Err(TransitionError::AlreadyActive),
        State::Replicating if !force => return Err(TransitionError::StillReplicating),
        _ => {}
    }
    if force {
        return Ok(());
    }
    if let Some(epoch) = peer_active {
        return Err(TransitionError::PeerActive { peer: peer.to_owned(), epoch });
    }
    if !synced {
        return Err(TransitionError::NeverSynced(state));
    }
    Ok(())
}

/// Whether this active principal must step down for an active peer: the higher epoch wins; on
/// a tie (two forced promotions from one epoch), the smaller principal UID wins.
#[must_use]
pub fn yields_to(own_epoch: u64, own_uid: &str, peer_epoch: u64, peer_uid: &str) -> bool {
    peer_epoch > own_epoch || (peer_epoch == own_epoch && !peer_uid.is_empty() && peer_uid < own_uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_active_accepts_agents() {
        for s in State::ALL {
            assert_eq!(s.accepts_agents(), s == State::Active, "{s}");
        }
    }

    #[test]
    fn upstream_transitions_hold() {
        use State::*;
        let upstream = [
            (Recovering, Active),
            (Recovering, Syncing),
            (Recovering, Replicating),
            (Recovering, Disconnected),
            (Replicating, Disconnected),
            (Replicating, Active),
            (Disconnected, Replicating),
            (Disconnected, Active),
            (Active, Replicating),
            (Syncing, Replicating),
        ];
        for (from, to) in upstream {
            assert!(from.can_become(to), "{from} -> {to}");
        }
        // Never back to recovering; an active principal only demotes to replicating.
        for s in State::ALL {
            assert!(!s.can_become(Recovering), "{s} -> recovering");
        }
        assert!(!Active.can_become(Disconnected));
        assert!(!Active.can_become(Syncing));
        // Ours on top: a replica that never reached its peer is disconnected, not stuck.
        assert!(Syncing.can_become(Disconnected));
    }

    #[test]
    fn wire_strings_and_roles() {
        let names: Vec<_> = State::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names, ["recovering", "syncing", "replicating", "disconnected", "active"]);
        assert_eq!("primary".parse::<Role>(), Ok(Role::Primary));
        assert_eq!("replica".parse::<Role>(), Ok(Role::Replica));
        assert_eq!("Primary".parse::<Role>().unwrap_err(), "unknown role: Primary (use 'primary' or 'replica')");
    }

    #[test]
    fn promote_is_fenced() {
        use State::*;
        assert_eq!(check_promote(Active, true, true, "p", None), Err(TransitionError::AlreadyActive));
        assert_eq!(check_promote(Replicating, false, true, "p", None), Err(TransitionError::StillReplicating));
        assert_eq!(
            check_promote(Disconnected, false, true, "p:1", Some(3)),
            Err(TransitionError::PeerActive { peer: "p:1".into(), epoch: 3 })
        );
        assert_eq!(check_promote(Syncing, false, false, "p", None), Err(TransitionError::NeverSynced(Syncing)));
        assert_eq!(check_promote(Disconnected, false, true, "p", None), Ok(()));
        // --force overrides every safety check but "already active".
        assert_eq!(check_promote(Replicating, true, true, "p", Some(3)), Ok(()));
        assert_eq!(check_promote(Syncing, true, false, "p", Some(3)), Ok(()));
        assert_eq!(
            TransitionError::StillReplicating.to_string(),
            "still replicating from peer — demote peer first, or use --force"
        );
        assert_eq!(
            TransitionError::NotActive(Replicating).to_string(),
            "can only demote from active state, current: replicating"
        );
    }

    #[test]
    fn the_higher_epoch_wins_and_ties_break_by_uid() {
        assert!(yields_to(1, "b", 2, "a"));
        assert!(!yields_to(2, "a", 1, "b"));
        assert!(yields_to(2, "b", 2, "a"));
        assert!(!yields_to(2, "a", 2, "b"));
        assert!(!yields_to(2, "a", 2, ""), "a peer that does not say its UID does not win a tie");
    }
}
