//! `argocd-agentctl blocklist`: the agents the principal refuses, in ConfigMap
//! `argocd-agent-tls-blocklist` of the principal's namespace (upstream `cmd/ctl/blocklist.go`).
//!
//! Upstream's commands, `blocklist tls add|remove <fingerprint>` and `blocklist tls list`, keep
//! leaf certificate fingerprints (upper-case hex SHA-256 of the DER) as keys. Ours besides:
//! `blocklist agent add|remove|list` for `agent.<name>` keys (agents identified by SPIFFE ID or
//! a forwarded header have no certificate at the principal), `blocklist list` for everything,
//! and `--reason`, kept as the entry's value (upstream writes empty values and ignores them).
//! The running principal applies every change within seconds (principal `blocklist` module).

use std::collections::BTreeMap;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use principal::blocklist::{BlocklistData, CONFIG_MAP, Entry};

use super::GlobalFlags;

/// How often a write is retried when another writer changed the ConfigMap in between.
const WRITE_ATTEMPTS: usize = 5;

/// `blocklist` subcommands.
#[derive(Debug, Subcommand)]
pub enum BlocklistCommand {
    /// Manage the TLS certificate fingerprint blocklist (upstream's).
    #[command(subcommand)]
    Tls(TlsCommand),
    /// Manage agents blocked by name, whatever their certificate or SPIFFE ID (ours).
    #[command(subcommand)]
    Agent(AgentCommand),
    /// List every entry: certificate fingerprints and agent names, with their reasons.
    List(ListArgs),
}

/// `blocklist tls` subcommands.
#[derive(Debug, Subcommand)]
pub enum TlsCommand {
    /// Add a certificate fingerprint to the blocklist.
    Add(TlsAddArgs),
    /// Remove a certificate fingerprint from the blocklist.
    Remove(TlsRemoveArgs),
    /// List all fingerprints in the blocklist.
    List,
}

/// `blocklist agent` subcommands.
#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Block an agent by name.
    Add(AgentAddArgs),
    /// Unblock an agent blocked by name.
    Remove(AgentRemoveArgs),
    /// List the agents blocked by name.
    List,
}

/// `blocklist tls add` arguments.
#[derive(Debug, clap::Args)]
pub struct TlsAddArgs {
    /// SHA-256 of the leaf certificate's DER: 64 hex digits, either case, optionally
    /// ':'-separated (`argocd-agentctl agent inspect` and `openssl x509 -fingerprint -sha256`
    /// print it).
    fingerprint: String,
    /// Why the entry was added, kept as its value.
    #[arg(long, default_value = "")]
    reason: String,
}

/// `blocklist tls remove` arguments.
#[derive(Debug, clap::Args)]
pub struct TlsRemoveArgs {
    /// The fingerprint, in any form `add` accepts.
    fingerprint: String,
}

/// `blocklist agent add` arguments.
#[derive(Debug, clap::Args)]
pub struct AgentAddArgs {
    /// The agent's name (a DNS-1123 label).
    name: String,
    /// Why the entry was added, kept as its value.
    #[arg(long, default_value = "")]
    reason: String,
}

/// `blocklist agent remove` arguments.
#[derive(Debug, clap::Args)]
pub struct AgentRemoveArgs {
    /// The agent's name.
    name: String,
}

/// `blocklist list` flags.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Output format (text or json).
    #[arg(short, long, default_value = "text", value_parser = ["text", "json"])]
    output: String,
}

/// Run a `blocklist` subcommand.
///
/// # Errors
/// Invalid input, or the ConfigMap cannot be read or written.
pub async fn run(global: &GlobalFlags, cmd: BlocklistCommand) -> anyhow::Result<()> {
    match cmd {
        BlocklistCommand::Tls(TlsCommand::Add(args)) => {
            let entry = Entry::certificate(&args.fingerprint).context("blocklist tls add")?;
            add(global, &entry, &args.reason).await
        }
        BlocklistCommand::Tls(TlsCommand::Remove(args)) => {
            let entry = Entry::certificate(&args.fingerprint).context("blocklist tls remove")?;
            remove(global, &entry).await
        }
        BlocklistCommand::Tls(TlsCommand::List) => {
            list_kind(global, "FINGERPRINT", |e| matches!(e, Entry::Certificate(_)).then(|| e.key())).await
        }
        BlocklistCommand::Agent(AgentCommand::Add(args)) => {
            let entry = Entry::agent(&args.name).context("blocklist agent add")?;
            add(global, &entry, &args.reason).await
        }
        BlocklistCommand::Agent(AgentCommand::Remove(args)) => {
            let entry = Entry::agent(&args.name).context("blocklist agent remove")?;
            remove(global, &entry).await
        }
        BlocklistCommand::Agent(AgentCommand::List) => {
            list_kind(global, "AGENT", |e| match e {
                Entry::Agent(name) => Some(name.clone()),
                Entry::Certificate(_) => None,
            })
            .await
        }
        BlocklistCommand::List(args) => list_all(global, &args).await,
    }
}

/// The blocklist ConfigMap in the principal's cluster and namespace.
struct Store {
    api: Api<ConfigMap>,
    namespace: String,
}

impl Store {
    async fn open(global: &GlobalFlags) -> anyhow::Result<Self> {
        let secrets = global.principal_secrets().await?;
        let namespace = secrets.namespace().to_owned();
        Ok(Self { api: Api::namespaced(secrets.client(), &namespace), namespace })
    }

    fn name(&self) -> String {
        format!("{}/{CONFIG_MAP}", self.namespace)
    }

    fn error(&self, err: kube::Error, verb: &str) -> anyhow::Error {
        let name = self.name();
        let kube::Error::Api(status) = &err else {
            return anyhow::Error::new(err).context(format!("cannot {verb} ConfigMap {name}"));
        };
        let hint = if status.is_not_found() && status.details.as_ref().is_some_and(|d| d.kind == "namespaces") {
            " (create the namespace first, or pass the right --principal-namespace or --principal-context)"
        } else if status.is_forbidden() {
            " (the kubeconfig user lacks RBAC permission on ConfigMaps there)"
        } else {
            ""
        };
        anyhow::anyhow!(
            "cannot {verb} ConfigMap {name}: {} (HTTP {} {}){hint}",
            status.message,
            status.code,
            status.reason
        )
    }

    async fn get(&self) -> anyhow::Result<Option<ConfigMap>> {
        self.api.get_opt(CONFIG_MAP).await.map_err(|e| self.error(e, "read"))
    }

    /// Applies `change` to the data and writes it back, creating the ConfigMap if missing;
    /// retried when another writer got in between. `change` returns `None` when there is
    /// nothing to write, else the message to print.
    async fn update(
        &self,
        mut change: impl FnMut(&mut BTreeMap<String, String>) -> Option<String>,
    ) -> anyhow::Result<Option<String>> {
        for _ in 0..WRITE_ATTEMPTS {
            let existing = self.get().await?;
            let mut data = existing.as_ref().and_then(|cm| cm.data.clone()).unwrap_or_default();
            let Some(message) = change(&mut data) else { return Ok(None) };
            let result = match existing {
                Some(mut cm) => {
                    cm.data = Some(data);
                    self.api.replace(CONFIG_MAP, &PostParams::default(), &cm).await
                }
                None => {
                    let cm = ConfigMap {
                        metadata: ObjectMeta {
                            name: Some(CONFIG_MAP.to_owned()),
                            namespace: Some(self.namespace.clone()),
                            ..ObjectMeta::default()
                        },
                        data: Some(data),
                        ..ConfigMap::default()
                    };
                    self.api.create(&PostParams::default(), &cm).await
                }
            };
            match result {
                Ok(_) => return Ok(Some(message)),
                Err(kube::Error::Api(s)) if s.is_conflict() || s.is_already_exists() => continue,
                Err(e) => return Err(self.error(e, "write")),
            }
        }
        bail!("ConfigMap {} kept changing while it was being written; run the command again", self.name())
    }
}

/// The keys of `data` that denote `entry` (a fingerprint may have been written in lower case).
fn keys_of(data: &BTreeMap<String, String>, entry: &Entry) -> Vec<String> {
    data.keys().filter(|k| Entry::from_key(k).as_ref() == Ok(entry)).cloned().collect()
}

async fn add(global: &GlobalFlags, entry: &Entry, reason: &str) -> anyhow::Result<()> {
    let store = Store::open(global).await?;
    let written = store
        .update(|data| {
            let existing = keys_of(data, entry);
            if let Some(key) = existing.first() {
                if reason.is_empty() || data.get(key).is_some_and(|r| r == reason) {
                    return None;
                }
                data.insert(key.clone(), reason.to_owned());
                return Some(format!("Updated the reason of {key} in the blocklist"));
            }
            data.insert(entry.key(), reason.to_owned());
            Some(format!("Added to blocklist: {}", entry.key()))
        })
        .await?;
    match written {
        Some(message) => {
            println!("{message}");
            println!(
                "The principal refuses {entry} and closes its live session within seconds (ConfigMap {}).",
                store.name()
            );
        }
        None => println!("{} already in blocklist.", what(entry)),
    }
    Ok(())
}

async fn remove(global: &GlobalFlags, entry: &Entry) -> anyhow::Result<()> {
    let store = Store::open(global).await?;
    let written = store
        .update(|data| {
            let keys = keys_of(data, entry);
            if keys.is_empty() {
                return None;
            }
            for key in &keys {
                data.remove(key);
            }
            Some(format!("Removed from blocklist: {}", keys.join(", ")))
        })
        .await?;
    match written {
        Some(message) => println!("{message}"),
        None => println!("{} not found in blocklist.", what(entry)),
    }
    Ok(())
}

fn what(entry: &Entry) -> String {
    match entry {
        Entry::Certificate(_) => "Fingerprint".to_owned(),
        Entry::Agent(name) => format!("Agent {name}"),
    }
}

async fn load(global: &GlobalFlags) -> anyhow::Result<BlocklistData> {
    let store = Store::open(global).await?;
    let data = BlocklistData::from_config_map(store.get().await?.as_ref());
    for (key, error) in data.ignored() {
        eprintln!("warning: ConfigMap {} key {key:?} is ignored by the principal: {error}", store.name());
    }
    Ok(data)
}

async fn list_kind(global: &GlobalFlags, header: &str, pick: impl Fn(&Entry) -> Option<String>) -> anyhow::Result<()> {
    let data = load(global).await?;
    let picked: Vec<String> = data.entries().filter_map(|(e, _)| pick(e)).collect();
    if picked.is_empty() {
        println!("No entries in the blocklist.");
        return Ok(());
    }
    println!("{header}");
    for item in picked {
        println!("{item}");
    }
    Ok(())
}

async fn list_all(global: &GlobalFlags, args: &ListArgs) -> anyhow::Result<()> {
    let data = load(global).await?;
    let rows: Vec<(&'static str, String, String)> = data
        .entries()
        .map(|(entry, listed)| match entry {
            Entry::Certificate(fp) => ("certificate", fp.clone(), listed.reason.clone()),
            Entry::Agent(name) => ("agent", name.clone(), listed.reason.clone()),
        })
        .collect();
    if args.output == "json" {
        let items: Vec<serde_json::Value> = rows
            .iter()
            .map(|(kind, value, reason)| serde_json::json!({"kind": kind, "entry": value, "reason": reason}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&items)?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("No entries in the blocklist.");
        return Ok(());
    }
    let width = rows.iter().map(|(_, v, _)| v.len()).max().unwrap_or(0).max("ENTRY".len());
    println!("{:<11}  {:<width$}  REASON", "KIND", "ENTRY");
    for (kind, value, reason) in rows {
        println!("{kind:<11}  {value:<width$}  {reason}");
    }
    Ok(())
}
