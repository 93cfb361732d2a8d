//! The blocklist: agents the principal refuses, read from ConfigMap
//! [`CONFIG_MAP`] (`argocd-agent-tls-blocklist`) in the principal namespace.
//!
//! Keys (values are free text, e.g. why the entry was added; upstream ignores them):
//! * 64 hex digits: the SHA-256 of a leaf client certificate's DER, upstream's form
//!   (`internal/blocklist`, upper case there; compared case-insensitively here) — it matches a
//!   session bound to that certificate ([`auth::Binding::CertificateSha256`], native mTLS);
//! * `agent.<agent-name>` (our extension): the agent of that name, whatever its transport
//!   identity — the way to block an agent identified by a SPIFFE ID or a forwarded header, which
//!   has no certificate at the principal.
//!
//! Other keys are ignored with a warning (an entry that does not parse must not block everyone,
//! nor stop the rest of the list from applying).
//!
//! The list is read when the principal starts and then watched (a deleted ConfigMap is an empty
//! list). Unlike upstream, which checks it only in the mTLS `Authenticate`, it applies
//! everywhere an agent proves who it is:
//! * `Authenticate` is refused with `PermissionDenied` and `RefreshToken` with
//!   `Unauthenticated`, naming the entry and the ConfigMap ([`crate::SessionHook`]);
//! * opening a stream with an access token issued before the entry was added is refused;
//! * on every change, the live stream of each listed agent is revoked at once
//!   ([`crate::peer::Peers::revoke`]: it ends with `Unauthenticated` and its access token
//!   is refused from then on), and the streams are checked again every [`RESWEEP`] while the
//!   list is not empty (a stream that was being opened while the entry arrived).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::watcher;
use link::lock;
use link::watch::Index;
use tokio_util::sync::CancellationToken;

use crate::sync::hub::Hub;

/// The ConfigMap holding the blocklist, in the principal namespace (upstream's name).
pub const CONFIG_MAP: &str = "argocd-agent-tls-blocklist";
/// The prefix of keys that block an agent by name (ours; upstream has certificate keys only).
pub const AGENT_KEY_PREFIX: &str = "agent.";
/// How often live streams are checked against a non-empty list, besides on every change.
pub const RESWEEP: Duration = Duration::from_secs(5);
/// Hex digits in a SHA-256 fingerprint.
const FINGERPRINT_LEN: usize = 64;

// === Entries ===

/// One blocklist entry.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Entry {
    /// A leaf client certificate, by the upper-case hex SHA-256 of its DER.
    Certificate(String),
    /// An agent, by name (a DNS-1123 label).
    Agent(String),
}

/// Why a key or an argument is not a blocklist entry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidEntry {
    /// The key has neither form.
    #[error(
        "{key:?} is neither a certificate fingerprint (64 hex digits: the SHA-256 of the leaf certificate's DER) \
         nor {AGENT_KEY_PREFIX}<agent-name>"
    )]
    UnknownForm {
        /// The key.
        key: String,
    },
    /// Not a SHA-256 fingerprint.
    #[error(
        "{input:?} is not a SHA-256 certificate fingerprint: {reason} (expected 64 hex digits, optionally \
         ':'-separated, e.g. as `openssl x509 -noout -fingerprint -sha256` prints it)"
    )]
    BadFingerprint {
        /// What was given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Not a valid agent name.
    #[error("{input:?} is not an agent name: {source}")]
    BadAgentName {
        /// What was given.
        input: String,
        /// What is wrong with it.
        #[source]
        source: auth::InvalidAgentName,
    },
}

impl Entry {
    /// A certificate entry from a fingerprint: 64 hex digits in either case, optionally
    /// separated by `:` (as `openssl x509 -fingerprint` prints them); kept in upstream's
    /// upper-case form.
    ///
    /// # Errors
    ///
    /// [`InvalidEntry::BadFingerprint`] naming what is wrong.
    pub fn certificate(fingerprint: &str) -> Result<Self, InvalidEntry> {
        let input = fingerprint.trim();
        let bad = |reason: String| InvalidEntry::BadFingerprint { input: input.to_owned(), reason };
        let digits: String = if input.contains(':') {
            let groups: Vec<&str> = input.split(':').collect();
            if groups.iter().any(|g| g.len() != 2) {
                return Err(bad("':'-separated fingerprints have two hex digits between separators".to_owned()));
            }
            groups.concat()
        } else {
            input.to_owned()
        };
        if let Some((position, ch)) = digits.chars().enumerate().find(|(_, c)| !c.is_ascii_hexdigit()) {
            return Err(bad(format!("{ch:?} at position {position} is not a hex digit")));
        }
        if digits.len() != FINGERPRINT_LEN {
            return Err(bad(format!("it has {} hex digits", digits.len())));
        }
        Ok(Self::Certificate(digits.to_ascii_uppercase()))
    }

    /// An agent entry.
    ///
    /// # Errors
    ///
    /// [`InvalidEntry::BadAgentName`] when `name` is not a DNS-1123 label.
    pub fn agent(name: &str) -> Result<Self, InvalidEntry> {
        auth::AgentName::new(name)
            .map(|n| Self::Agent(n.to_string()))
            .map_err(|source| InvalidEntry::BadAgentName { input: name.to_owned(), source })
    }

    /// Reads a ConfigMap key: `agent.<name>`, or a fingerprint (64 hex digits, either case).
    ///
    /// # Errors
    ///
    /// [`InvalidEntry`] when the key has neither form.
    pub fn from_key(key: &str) -> Result<Self, InvalidEntry> {
        if let Some(name) = key.strip_prefix(AGENT_KEY_PREFIX) {
            return Self::agent(name);
        }
        if key.len() == FINGERPRINT_LEN && key.chars().all(|c| c.is_ascii_hexdigit()) {
            return Self::certificate(key);
        }
        Err(InvalidEntry::UnknownForm { key: key.to_owned() })
    }

    /// The entry's ConfigMap key: the upper-case fingerprint (upstream's form) or
    /// `agent.<name>`.
    #[must_use]
    pub fn key(&self) -> String {
        match self {
            Self::Certificate(fingerprint) => fingerprint.clone(),
            Self::Agent(name) => format!("{AGENT_KEY_PREFIX}{name}"),
        }
    }

    /// Whether the entry covers `agent` calling with a session bound to `binding`.
    #[must_use]
    pub fn matches(&self, agent: &str, binding: Option<&auth::Binding>) -> bool {
        match self {
            Self::Agent(name) => name == agent,
            Self::Certificate(fingerprint) => {
                binding.and_then(auth::Binding::fingerprint).is_some_and(|f| f.eq_ignore_ascii_case(fingerprint))
            }
        }
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Certificate(fingerprint) => write!(f, "client certificate SHA-256 {fingerprint}"),
            Self::Agent(name) => write!(f, "agent {name}"),
        }
    }
}

/// A listed entry as the ConfigMap holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The key as written.
    pub key: String,
    /// The value (free text, e.g. the reason; may be empty).
    pub reason: String,
}

/// The parsed ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlocklistData {
    entries: BTreeMap<Entry, Listed>,
    ignored: Vec<(String, InvalidEntry)>,
}

impl BlocklistData {
    /// Parses the ConfigMap's `data`; keys of neither form are kept aside in [`Self::ignored`].
    #[must_use]
    pub fn from_data(data: &BTreeMap<String, String>) -> Self {
        let mut out = Self::default();
        for (key, value) in data {
            match Entry::from_key(key) {
                Ok(entry) => {
                    out.entries.insert(entry, Listed { key: key.clone(), reason: value.clone() });
                }
                Err(e) => out.ignored.push((key.clone(), e)),
            }
        }
        out
    }

    /// Parses a ConfigMap (`None`, e.g. deleted: an empty list). Keys of `binaryData` count
    /// too (values are not read), as values do not matter.
    #[must_use]
    pub fn from_config_map(cm: Option<&ConfigMap>) -> Self {
        let Some(cm) = cm else { return Self::default() };
        let mut data = cm.data.clone().unwrap_or_default();
        for key in cm.binary_data.iter().flat_map(BTreeMap::keys) {
            data.entry(key.clone()).or_default();
        }
        Self::from_data(&data)
    }

    /// Whether nothing is listed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries, with their keys and values.
    pub fn entries(&self) -> impl Iterator<Item = (&Entry, &Listed)> {
        self.entries.iter()
    }

    /// The keys that are no entry, and why.
    #[must_use]
    pub fn ignored(&self) -> &[(String, InvalidEntry)] {
        &self.ignored
    }

    /// The first entry covering `agent` with a session bound to `binding`.
    #[must_use]
    pub fn matching(&self, agent: &str, binding: Option<&auth::Binding>) -> Option<(&Entry, &Listed)> {
        self.entries.iter().find(|(entry, _)| entry.matches(agent, binding))
    }
}

// === The principal's blocklist ===

/// The blocklist could not be read at startup.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot read the blocklist, ConfigMap {namespace}/{CONFIG_MAP} (may the principal get, list and watch \
     ConfigMaps in namespace {namespace}?): {source}"
)]
pub struct BlocklistError {
    /// The principal namespace.
    pub namespace: String,
    /// The client error.
    #[source]
    pub source: kube::Error,
}

/// The blocklist as the principal applies it: the current list, and the transport identity of
/// each agent's latest stream (to match certificate entries against live streams).
pub struct Blocklist {
    namespace: String,
    api: Api<ConfigMap>,
    current: RwLock<Arc<BlocklistData>>,
    /// Agent name → the binding of the access token its latest stream was opened with.
    streams: Mutex<HashMap<String, Option<auth::Binding>>>,
}

impl fmt::Debug for Blocklist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blocklist").field("namespace", &self.namespace).finish_non_exhaustive()
    }
}

/// Why a blocklisted agent is refused: names the entry, the ConfigMap and how to undo it.
fn refusal(namespace: &str, agent: &str, entry: &Entry, listed: &Listed) -> String {
    let reason = if listed.reason.trim().is_empty() { String::new() } else { format!(" ({})", listed.reason.trim()) };
    format!(
        "agent {agent:?} is blocklisted: entry {:?} ({entry}) in ConfigMap {namespace}/{CONFIG_MAP}{reason}; remove \
         the entry (argocd-agentctl blocklist) to let it connect again",
        listed.key
    )
}

impl Blocklist {
    /// An empty blocklist for the principal in `namespace`, read through `client`.
    #[must_use]
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            api: Api::namespaced(client, namespace),
            current: RwLock::new(Arc::new(BlocklistData::default())),
            streams: Mutex::new(HashMap::new()),
        }
    }

    /// Reads the ConfigMap once (a missing one is an empty list).
    ///
    /// # Errors
    ///
    /// [`BlocklistError`] when the hub cannot be read.
    pub async fn load(&self) -> Result<(), BlocklistError> {
        let cm = self
            .api
            .get_opt(CONFIG_MAP)
            .await
            .map_err(|source| BlocklistError { namespace: self.namespace.clone(), source })?;
        self.replace(BlocklistData::from_config_map(cm.as_ref()));
        Ok(())
    }

    /// The current list.
    #[must_use]
    pub fn current(&self) -> Arc<BlocklistData> {
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Installs `data`; returns whether it differs from the list before. Logs the change and
    /// every key that is no entry.
    pub(crate) fn replace(&self, data: BlocklistData) -> bool {
        let mut current = self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if **current == data {
            return false;
        }
        for (key, error) in data.ignored() {
            tracing::warn!(configmap = %format!("{}/{CONFIG_MAP}", self.namespace), %key, %error,
                "ignoring a blocklist key");
        }
        let keys: Vec<String> = data.entries().map(|(_, l)| l.key.clone()).collect();
        tracing::info!(configmap = %format!("{}/{CONFIG_MAP}", self.namespace), entries = keys.len(), ?keys,
            "blocklist loaded");
        *current = Arc::new(data);
        true
    }

    /// `Err(message)` when `agent`, with a session bound to `binding`, is listed.
    ///
    /// # Errors
    ///
    /// The refusal message, naming the entry and the ConfigMap.
    pub fn check(&self, agent: &str, binding: Option<&auth::Binding>) -> Result<(), String> {
        let data = self.current();
        match data.matching(agent, binding) {
            Some((entry, listed)) => Err(refusal(&self.namespace, agent, entry, listed)),
            None => Ok(()),
        }
    }

    /// Remembers the binding of `agent`'s latest stream (for [`Self::sweep`]).
    pub(crate) fn record_stream(&self, agent: &str, binding: Option<auth::Binding>) {
        lock(&self.streams).insert(agent.to_owned(), binding);
    }

    /// Revokes the live stream of every listed agent; returns the agents revoked.
    pub(crate) fn sweep(&self, hub: &Hub) -> Vec<String> {
        let data = self.current();
        if data.is_empty() {
            return Vec::new();
        }
        let streams: Vec<(String, Option<auth::Binding>)> =
            lock(&self.streams).iter().map(|(a, b)| (a.clone(), b.clone())).collect();
        let mut revoked = Vec::new();
        for (agent, binding) in streams {
            let Some((entry, listed)) = data.matching(&agent, binding.as_ref()) else { continue };
            if !hub.peers.get(&agent).is_some_and(|s| s.is_connected()) {
                continue;
            }
            let reason = refusal(&self.namespace, &agent, entry, listed);
            if hub.peers.revoke_with(&agent, tonic::Status::unauthenticated(reason.clone())) {
                tracing::warn!(%agent, entry = %listed.key, %reason, "blocklisted agent disconnected: session revoked");
                revoked.push(agent);
            }
        }
        revoked
    }

    /// Watches the ConfigMap until `cancel` fires, applying every change to live streams, and
    /// sweeps the streams again every [`RESWEEP`].
    pub(crate) async fn run(self: Arc<Self>, hub: Arc<Hub>, cancel: CancellationToken) {
        let config = watcher::Config::default().fields(&format!("metadata.name={CONFIG_MAP}"));
        let watched = Watched { list: &self, hub: &hub };
        let resweep = async {
            let mut every = tokio::time::interval(RESWEEP);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                self.sweep(&hub);
            }
        };
        tokio::select! {
            () = link::watch::run(&watched, self.api.clone(), config, &cancel) => {}
            () = resweep => {}
        }
    }
}

/// The blocklist ConfigMap as a watch index: its one object is the list in force.
struct Watched<'a> {
    list: &'a Blocklist,
    hub: &'a Hub,
}

impl Watched<'_> {
    fn install(&self, data: BlocklistData) {
        if self.list.replace(data) {
            self.list.sweep(self.hub);
        }
    }
}

impl Index for Watched<'_> {
    type Object = ConfigMap;
    type Item = ConfigMap;
    type Key = ();

    fn what(&self) -> &str {
        "blocklist ConfigMap (the last list stays in force)"
    }
    fn decode(&self, cm: &ConfigMap) -> Option<ConfigMap> {
        Some(cm.clone())
    }
    fn key(_: &ConfigMap) {}
    async fn apply(&self, cm: ConfigMap) {
        self.install(BlocklistData::from_config_map(Some(&cm)));
    }
    async fn delete(&self, _: ConfigMap) {
        self.install(BlocklistData::default());
    }
    /// The ConfigMap, when a list is in force (a re-list that no longer returns it empties it).
    fn known(&self) -> Vec<ConfigMap> {
        if *self.list.current() == BlocklistData::default() {
            return Vec::new();
        }
        let metadata = kube::api::ObjectMeta { name: Some(CONFIG_MAP.to_owned()), ..Default::default() };
        vec![ConfigMap { metadata, ..Default::default() }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FP: &str = "0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF";

    fn data(pairs: &[(&str, &str)]) -> BlocklistData {
        BlocklistData::from_data(&pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect())
    }

    #[test]
    fn keys_parse_as_fingerprints_or_agent_names() {
        assert_eq!(Entry::from_key(FP), Ok(Entry::Certificate(FP.to_owned())));
        assert_eq!(Entry::from_key(&FP.to_lowercase()), Ok(Entry::Certificate(FP.to_owned())));
        assert_eq!(Entry::from_key("agent.spoke-1"), Ok(Entry::Agent("spoke-1".to_owned())));
        assert!(matches!(Entry::from_key("agent.Spoke_1"), Err(InvalidEntry::BadAgentName { .. })));
        assert!(matches!(Entry::from_key("agent."), Err(InvalidEntry::BadAgentName { .. })));
        for bad in ["spoke-1", &FP[1..], &format!("{FP}0"), &format!("{}G", &FP[1..]), ""] {
            assert!(matches!(Entry::from_key(bad), Err(InvalidEntry::UnknownForm { .. })), "{bad}");
        }
        assert_eq!(Entry::Agent("a".into()).key(), "agent.a");
        assert_eq!(Entry::Certificate(FP.into()).key(), FP);
    }

    #[test]
    fn fingerprints_are_normalised_to_upstreams_form() {
        let colons = FP.as_bytes().chunks(2).map(|c| String::from_utf8_lossy(c).to_lowercase()).collect::<Vec<_>>();
        assert_eq!(Entry::certificate(&colons.join(":")), Ok(Entry::Certificate(FP.to_owned())));
        assert_eq!(Entry::certificate(&format!(" {} ", FP.to_lowercase())), Ok(Entry::Certificate(FP.to_owned())));
        for bad in [&FP[2..], "01:23", &format!("{}Z", &FP[1..]), "0:123", ""] {
            let e = Entry::certificate(bad).expect_err(bad);
            assert!(matches!(e, InvalidEntry::BadFingerprint { .. }), "{bad}: {e}");
            assert!(e.to_string().contains("hex"), "{e}");
        }
    }

    #[test]
    fn the_config_map_parses_into_entries_and_ignored_keys() {
        let list = data(&[(FP, ""), ("agent.spoke-2", "stolen laptop"), ("agent.Bad", ""), ("note", "x")]);
        let entries: Vec<_> = list.entries().map(|(e, l)| (e.clone(), l.reason.as_str())).collect();
        assert_eq!(
            entries,
            vec![(Entry::Certificate(FP.into()), ""), (Entry::Agent("spoke-2".into()), "stolen laptop")]
        );
        let ignored: Vec<&str> = list.ignored().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(ignored, ["agent.Bad", "note"]);
        assert!(BlocklistData::from_config_map(None).is_empty());

        let cm = ConfigMap {
            binary_data: Some(BTreeMap::from([(FP.to_lowercase(), k8s_openapi::ByteString(b"x".to_vec()))])),
            ..ConfigMap::default()
        };
        let from_binary = BlocklistData::from_config_map(Some(&cm));
        assert_eq!(from_binary.entries().count(), 1);
    }

    #[test]
    fn entries_match_agent_names_and_certificate_bindings() {
        let binding = auth::Binding::certificate(b"leaf");
        let fingerprint = binding.fingerprint().unwrap_or_default();
        let list = data(&[(&fingerprint.to_lowercase(), ""), ("agent.spoke-2", "")]);
        assert!(list.matching("spoke-1", Some(&binding)).is_some(), "by certificate, whatever the name");
        assert!(list.matching("spoke-1", Some(&auth::Binding::certificate(b"other"))).is_none());
        assert!(list.matching("spoke-1", None).is_none());
        assert!(list.matching("spoke-2", None).is_some(), "by name, whatever the binding");
        assert!(list.matching("spoke-2", Some(&auth::Binding::SpiffeId("spiffe://td/sa/x".into()))).is_some());
        let spiffe = auth::Binding::SpiffeId("spiffe://td/ns/argocd/sa/spoke-3".into());
        assert!(list.matching("spoke-3", Some(&spiffe)).is_none(), "a SPIFFE binding has no fingerprint");
    }

    /// Waits up to 20 s for `cond`.
    async fn eventually(what: &str, cond: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_list_is_loaded_then_watched_and_a_deleted_config_map_is_empty() {
        use k8s_openapi::api::core::v1::Namespace;
        use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

        let dir = tempfile::tempdir().unwrap();
        let server = apiserver::ApiServer::start(apiserver::Config::new(dir.path().join("data"))).await.unwrap();
        let client = server.client().await.unwrap();
        let ns = Namespace {
            metadata: kube::api::ObjectMeta { name: Some("argocd".into()), ..Default::default() },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "argocd");
        let cm = |pairs: &[(&str, &str)]| ConfigMap {
            metadata: kube::api::ObjectMeta { name: Some(CONFIG_MAP.into()), ..Default::default() },
            data: Some(pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
            ..Default::default()
        };
        cms.create(&PostParams::default(), &cm(&[("agent.spoke-1", "")])).await.unwrap();

        let blocklist = Arc::new(Blocklist::new(client.clone(), "argocd"));
        blocklist.load().await.unwrap();
        let err = blocklist.check("spoke-1", None).unwrap_err();
        assert!(err.contains("argocd/argocd-agent-tls-blocklist"), "{err}");
        assert!(blocklist.check("spoke-2", None).is_ok());

        let hub = Arc::new(Hub::new(crate::PrincipalConfig::new("argocd"), "uid".into(), client.clone()));
        let cancel = CancellationToken::new();
        let watching = tokio::spawn(blocklist.clone().run(hub, cancel.clone()));
        let patch = serde_json::json!({"data": {FP: "leaked"}});
        cms.patch(CONFIG_MAP, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        let binding = auth::Binding::CertificateSha256([0; 32]);
        eventually("the new entry", || blocklist.current().entries().count() == 2).await;
        assert!(blocklist.check("spoke-3", Some(&binding)).is_ok(), "another certificate");

        cms.delete(CONFIG_MAP, &DeleteParams::default()).await.unwrap();
        eventually("the deletion", || blocklist.current().is_empty()).await;
        assert!(blocklist.check("spoke-1", None).is_ok());
        cancel.cancel();
        watching.await.unwrap();
        server.shutdown().await;
    }

    #[test]
    fn refusals_name_the_entry_and_the_config_map() {
        let listed = Listed { key: "agent.spoke-2".into(), reason: "stolen laptop".into() };
        let text = refusal("argocd", "spoke-2", &Entry::Agent("spoke-2".into()), &listed);
        for part in ["blocklisted", "agent.spoke-2", "argocd/argocd-agent-tls-blocklist", "stolen laptop"] {
            assert!(text.contains(part), "{part}: {text}");
        }
    }
}
