//! The agent's mode, as the wire carries it (`AuthRequest.mode`, the token subject) and as
//! `--agent-mode` spells it. One type for principal, agent and auth.

use std::fmt;
use std::str::FromStr;

/// How an agent relates to the hub (upstream default: `autonomous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AgentMode {
    /// The hub is the source of truth for Application specs; the agent reports status.
    Managed,
    /// The agent is the source of truth; the hub holds copies.
    #[default]
    Autonomous,
}

impl AgentMode {
    /// The wire and flag spelling: `managed` or `autonomous`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Managed => "managed",
            Self::Autonomous => "autonomous",
        }
    }
}

impl fmt::Display for AgentMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mode string that is neither `managed` nor `autonomous`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown or missing agent mode \"{0}\": must be \"managed\" or \"autonomous\"")]
pub struct InvalidAgentMode(pub String);

impl FromStr for AgentMode {
    type Err = InvalidAgentMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "managed" => Ok(Self::Managed),
            "autonomous" => Ok(Self::Autonomous),
            other => Err(InvalidAgentMode(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::AgentMode;

    #[test]
    fn round_trips_and_rejects() {
        for m in [AgentMode::Managed, AgentMode::Autonomous] {
            assert_eq!(m.as_str().parse::<AgentMode>(), Ok(m));
        }
        assert!("Managed".parse::<AgentMode>().is_err());
        assert_eq!(AgentMode::default(), AgentMode::Autonomous);
    }
}
