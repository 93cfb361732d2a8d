//! The quickstart's live table: every Application on the hub and the spokes, where it lives,
//! which agent carries it, and its status.

use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Where the object lives (`hub`, `managed`, `autonomous`).
    pub cluster: String,
    /// `namespace/name`.
    pub application: String,
    /// The agent that carries it.
    pub agent: String,
    /// managed or autonomous.
    pub mode: String,
    /// status.sync.status.
    pub sync: String,
    /// status.health.status.
    pub health: String,
    /// status.sync.revision: the commit the controller last compared with.
    pub revision: String,
    /// status.reconciledAt, else creationTimestamp.
    pub updated: String,
    /// The quickstart run that last touched it (annotation [`RUN_ANNOTATION`]).
    pub run: String,
}

/// Annotation the quickstart stamps on its demo Applications, so `--once` can tell an update
/// delivered by this run from state left by an earlier one.
pub const RUN_ANNOTATION: &str = "quickstart.argocd-agent.io/run";

fn text(v: &Value) -> String {
    v.as_str().filter(|s| !s.is_empty()).unwrap_or("-").to_string()
}

/// List the Applications of one cluster as rows.
///
/// # Errors
/// The list call fails.
pub async fn rows(
    cluster: &str,
    apps: &Api<DynamicObject>,
    agent_of: impl Fn(&str) -> (String, String),
) -> kube::Result<Vec<Row>> {
    let list = apps.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .map(|a| {
            let ns = a.metadata.namespace.clone().unwrap_or_default();
            let (agent, mode) = agent_of(&ns);
            let updated = a.data["status"]["reconciledAt"]
                .as_str()
                .map(str::to_string)
                .or_else(|| a.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()))
                .unwrap_or_default();
            Row {
                cluster: cluster.to_string(),
                application: format!("{ns}/{}", a.metadata.name.clone().unwrap_or_default()),
                agent,
                mode,
                sync: text(&a.data["status"]["sync"]["status"]),
                health: text(&a.data["status"]["health"]["status"]),
                revision: text(&a.data["status"]["sync"]["revision"]),
                updated,
                run: a.metadata.annotations.as_ref().and_then(|m| m.get(RUN_ANNOTATION)).cloned().unwrap_or_default(),
            }
        })
        .collect())
}

/// Render rows as an aligned text table.
#[must_use]
pub fn render(rows: &[Row]) -> String {
    let header = ["CLUSTER", "APPLICATION", "AGENT", "MODE", "SYNC", "HEALTH", "REVISION", "LAST UPDATE"];
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            [
                r.cluster.clone(),
                r.application.clone(),
                r.agent.clone(),
                r.mode.clone(),
                r.sync.clone(),
                r.health.clone(),
                r.revision.chars().take(7).collect(),
                r.updated.clone(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cols: Vec<&str>| {
        cols.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect::<Vec<_>>().join("  ").trim_end().to_string()
    };
    let mut out = vec![line(header.to_vec())];
    out.extend(cells.iter().map(|r| line(r.iter().map(String::as_str).collect())));
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::{Row, render};

    #[test]
    fn aligned_columns() {
        let row = Row {
            cluster: "hub".into(),
            application: "agent-managed/guestbook".into(),
            agent: "agent-managed".into(),
            mode: "managed".into(),
            sync: "Synced".into(),
            health: "Healthy".into(),
            revision: "0123456789abcdef".into(),
            updated: "2026-01-01T00:00:00Z".into(),
            run: String::new(),
        };
        let text = render(&[row]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].find("APPLICATION"), lines[1].find("agent-managed/guestbook"));
    }
}
