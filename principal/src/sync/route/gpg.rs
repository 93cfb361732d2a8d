//! The GPG keys ConfigMap in managed mode (upstream §4.6): `argocd-gpg-keys-cm` of the principal
//! namespace goes to every managed agent; autonomous agents never get it. The decisions and their
//! bookkeeping live in [`crate::sync::hub::GpgIndex`].

use std::collections::BTreeSet;

use protocol::argocd::ConfigMap;

use crate::config::AgentMode;
use crate::sync::hub::Hub;

/// The connected-since-start managed agents.
pub(crate) fn targets(hub: &Hub) -> BTreeSet<String> {
    // (Whether the ConfigMap itself is left out is decided by its callers.)
    hub.peers.all().into_iter().filter(|s| s.mode() == AgentMode::Managed).map(|s| s.name().to_owned()).collect()
}

/// The watch shows the ConfigMap (new, changed, or listed again).
pub(crate) fn hub_gpg_changed(hub: &Hub, cm: &ConfigMap) {
    if hub.excluded(&cm.metadata) {
        hub_gpg_deleted(hub, cm);
        return;
    }
    let mut shipper = hub.shipper();
    hub.gpg.observed(cm, &targets(hub), |agent, ty, c| shipper.ship(agent, ty, c));
}

/// The watch shows it deleted.
pub(crate) fn hub_gpg_deleted(hub: &Hub, cm: &ConfigMap) {
    let mut shipper = hub.shipper();
    hub.gpg.deleted(cm, &targets(hub), |agent, ty, c| shipper.ship(agent, ty, c));
}
