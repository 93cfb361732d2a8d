//! Upstream flags of features this implementation does not have yet (none at the moment: the
//! SPIRE flags live in `crate::spire`), and tuning knobs of upstream internals that have no counterpart here. Each parses with upstream's name and environment variable, so an upstream command line, manifest or
//! `argocd-agent-params` ConfigMap reaches a clear answer: setting a feature's flag stops startup
//! naming it ([`Unsupported`]); a knob without a counterpart is accepted and logged as having no
//! effect ([`AgentOnly::notes`]). docs/compatibility.md lists both.

use crate::unsupported::Unsupported;

/// The principal's (none at the moment).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PrincipalOnly {}

impl PrincipalOnly {
    /// Records every flag that was set to use a missing feature.
    pub fn check(&self, _u: &mut Unsupported) {}
}

/// The agent's.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AgentOnly {
    /// Accepted, no effect: upstream's limit on waiting for its informers at start.
    #[arg(long, env = "ARGOCD_AGENT_INFORMER_SYNC_TIMEOUT", hide = true)]
    informer_sync_timeout: Option<String>,
    /// Accepted, no effect: upstream's coalescing of informer events.
    #[arg(long, env = "ARGOCD_AGENT_BUFFER_INFORMER_EVENT_INTERVAL", hide = true)]
    buffer_informer_event_interval: Option<String>,
}

impl AgentOnly {
    /// Records every flag that was set to use a missing feature (none at the moment).
    pub fn check(&self, _u: &mut Unsupported) {}

    /// The knobs that were set although they have no effect here, each with why; and an error
    /// for one that is not a duration (upstream would refuse it too).
    ///
    /// # Errors
    /// A value is not a duration.
    pub fn notes(&self) -> anyhow::Result<Vec<String>> {
        let knobs = [
            (
                "--informer-sync-timeout",
                &self.informer_sync_timeout,
                "the agent's watches wait for their first list with no time limit, retrying with backoff; nothing gives up after a timeout",
            ),
            (
                "--buffer-informer-event-interval",
                &self.buffer_informer_event_interval,
                "every change is sent as it happens; the outbox coalesces updates of one object that wait to be sent",
            ),
        ];
        let mut notes = Vec::new();
        for (flag, value, why) in knobs {
            if let Some(v) = value {
                crate::flags::parse_duration(v).map_err(|e| anyhow::anyhow!("{flag} {v:?}: {e}"))?;
                notes.push(format!("{flag} has no effect here: {why}"));
            }
        }
        Ok(notes)
    }
}

/// Upstream's debugging knobs that have no counterpart here, on both commands: `--pprof-port`
/// (Go's profiler) and `--full-detail` (extra log detail). Checked as upstream would; each set
/// one gives a note saying what to use instead. `subsystem` names a log target for the example.
///
/// # Errors
/// A `--full-detail` part upstream would refuse.
pub fn debug_knob_notes(
    pprof_port: Option<u16>,
    full_detail: Option<&str>,
    subsystem: &str,
) -> anyhow::Result<Vec<String>> {
    let mut notes = Vec::new();
    if pprof_port.is_some_and(|p| p != 0) {
        notes.push("--pprof-port has no effect here: there is no Go profiler; profile with perf or the OTLP traces (docs/operations/tracing.md)".to_owned());
    }
    if let Some(v) = full_detail.filter(|v| !v.is_empty()) {
        for part in v.split(',') {
            anyhow::ensure!(
                ["all", "actions", "events", "informers"].contains(&part.trim()),
                "--full-detail {v:?}: {part:?} is none of all, actions, events, informers"
            );
        }
        notes.push(format!(
            "--full-detail has no effect here: raise a subsystem's level in --log-level instead, e.g. info,{subsystem}=debug"
        ));
    }
    Ok(notes)
}
