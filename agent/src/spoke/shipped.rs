//! Core objects the principal ships to a managed agent (upstream §4.5, §4.6): repository and
//! repo-creds Secrets, and the GPG keys ConfigMap. One machinery for both:
//!
//! * an incoming `create`/`spec-update` writes the copy in the agent's namespace, stamped with the
//!   hub object's UID as `source-uid` (a same-named local object is taken over; a Secret of
//!   another `type` is replaced, as Kubernetes cannot change it in place); `delete` removes it;
//! * the watch reverts local edits of what the principal owns and recreates a copy deleted
//!   locally. Autonomous agents keep these to themselves and run no such watch.
//!
//! Re-lists are handled by [`link::watch`].

use std::sync::Arc;

use kube::api::DynamicObject;
use kube::runtime::watcher;
use link::watch::Index;
use link::{Copies, Gone};
use protocol::argocd::annotations::{LAST_APPLIED_CONFIGURATION, SOURCE_UID};
use protocol::argocd::core::{GPG_KEYS_CONFIG_MAP, gpg_keys_selector, repository_selector};
use protocol::argocd::{ConfigMap, ObjectMeta, Secret};
use protocol::kube_store::ObjectStore;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::{Spoke, clear_server_fields};
use crate::error::InboundError;

/// A kind of core object the principal ships.
pub(crate) trait Shipped: Clone + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static {
    /// What it is, in log lines.
    const WHAT: &'static str;
    fn meta(&self) -> &ObjectMeta;
    fn meta_mut(&mut self) -> &mut ObjectMeta;
    /// Whether an object of the kind in the agent's namespace is one of these.
    fn is_shipped(&self) -> bool;
    /// The store and the copies of the kind.
    fn of(spoke: &Spoke) -> (&ObjectStore, &Copies<String, Self>);
    /// Watch options: which objects of the kind the watch lists.
    fn watch_config() -> watcher::Config;
    /// Whether the parts the principal owns differ.
    fn owned_differ(&self, other: &Self) -> bool;
    /// Takes the parts the principal owns from `src`.
    fn take_owned(&mut self, src: &Self);
    /// Whether `self` cannot become `src` in place (an immutable field differs).
    fn must_replace(&self, _src: &Self) -> bool {
        false
    }
}

impl Shipped for Secret {
    const WHAT: &'static str = "repository secret";
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
    fn is_shipped(&self) -> bool {
        self.is_repository()
    }
    fn of(spoke: &Spoke) -> (&ObjectStore, &Copies<String, Self>) {
        (&spoke.secrets, &spoke.managed_repos)
    }
    fn watch_config() -> watcher::Config {
        watcher::Config::default().labels(&repository_selector())
    }
    fn owned_differ(&self, other: &Self) -> bool {
        self.data != other.data || self.type_ != other.type_ || self.metadata.labels != other.metadata.labels
    }
    fn take_owned(&mut self, src: &Self) {
        self.data.clone_from(&src.data);
        self.string_data = None;
        self.metadata.labels.clone_from(&src.metadata.labels);
    }
    fn must_replace(&self, src: &Self) -> bool {
        self.type_.is_some() && self.type_ != src.type_
    }
}

impl Shipped for ConfigMap {
    const WHAT: &'static str = "GPG keys ConfigMap";
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
    fn is_shipped(&self) -> bool {
        self.metadata.name.as_deref() == Some(GPG_KEYS_CONFIG_MAP)
    }
    fn of(spoke: &Spoke) -> (&ObjectStore, &Copies<String, Self>) {
        (&spoke.config_maps, &spoke.managed_gpg)
    }
    fn watch_config() -> watcher::Config {
        watcher::Config::default().fields(&gpg_keys_selector())
    }
    fn owned_differ(&self, other: &Self) -> bool {
        self.data != other.data
            || self.binary_data != other.binary_data
            || self.metadata.labels != other.metadata.labels
    }
    fn take_owned(&mut self, src: &Self) {
        self.data.clone_from(&src.data);
        self.binary_data.clone_from(&src.binary_data);
        self.metadata.labels.clone_from(&src.metadata.labels);
    }
}

fn name_of<T: Shipped>(obj: &T) -> String {
    obj.meta().name.clone().unwrap_or_default()
}

/// The spoke copy of a hub object: in the agent's namespace, stamped with the hub object's UID
/// as `source-uid`.
pub(crate) fn to_spoke<T: Shipped>(incoming: &T, ns: &str) -> T {
    let mut local = incoming.clone();
    let source_uid = incoming.meta().uid.clone().unwrap_or_default();
    let meta = local.meta_mut();
    clear_server_fields(meta);
    meta.namespace = Some(ns.to_owned());
    meta.remove_annotation(LAST_APPLIED_CONFIGURATION);
    meta.set_annotation(SOURCE_UID, source_uid);
    local
}

/// `create` / `spec-update` from the principal.
pub(crate) async fn upsert<T: Shipped>(spoke: &Spoke, incoming: &T) -> Result<(), InboundError> {
    let (store, copies) = T::of(spoke);
    let ns = spoke.ns();
    let name = name_of(incoming);
    let local = to_spoke(incoming, ns);
    copies.set_source(name.clone(), local.clone());
    if store.create(ns, &name, &local).await? {
        return Ok(());
    }
    if let Some(cur) = store.get::<T>(ns, &name).await?
        && cur.must_replace(&local)
    {
        tracing::info!(name = %name, what = T::WHAT, "replacing a local object the principal's cannot update in place");
        copies.expect_delete(name.clone());
        store.delete(ns, &name).await?;
        copies.set_source(name.clone(), local.clone());
        store.create(ns, &name, &local).await?;
        return Ok(());
    }
    // A same-named object here (an earlier copy, or one made locally before the principal
    // owned it) takes the principal's version.
    store
        .update::<T, _>(ns, &name, |cur| {
            let before = cur.clone();
            cur.take_owned(&local);
            let meta = cur.meta_mut();
            meta.annotations.clone_from(&local.meta().annotations);
            meta.finalizers.clone_from(&local.meta().finalizers);
            *cur != before
        })
        .await?;
    Ok(())
}

/// `delete` from the principal.
pub(crate) async fn delete<T: Shipped>(spoke: &Spoke, incoming: &T) -> Result<(), InboundError> {
    let (store, copies) = T::of(spoke);
    let name = name_of(incoming);
    copies.owner_deleted(name.clone());
    if !store.delete(spoke.ns(), &name).await? {
        copies.cancel_delete(&name);
    }
    Ok(())
}

/// The principal-owned objects of the kind on the spoke (they carry `source-uid`).
pub(crate) async fn held<T: Shipped>(spoke: &Spoke) -> Result<Vec<T>, protocol::kube_store::StoreError> {
    let (store, _) = T::of(spoke);
    let all = store.list::<T>(spoke.ns()).await?;
    Ok(all.into_iter().filter(|o| o.is_shipped() && o.meta().source_uid().is_some()).collect())
}

/// The principal-owned objects of one kind on the spoke, by name.
pub(crate) struct Watched<'a, T>(pub(crate) &'a Spoke, std::marker::PhantomData<T>);

impl<T: Shipped> Index for Watched<'_, T> {
    type Object = DynamicObject;
    type Item = T;
    type Key = String;

    fn what(&self) -> &str {
        T::WHAT
    }
    fn decode(&self, obj: &DynamicObject) -> Option<T> {
        T::of(self.0).0.decode_or_skip::<T>(obj, T::WHAT).filter(|o| o.is_shipped() && o.meta().source_uid().is_some())
    }
    fn key(o: &T) -> String {
        name_of(o)
    }
    async fn apply(&self, o: T) {
        applied(self.0, o).await;
    }
    async fn delete(&self, o: T) {
        deleted(self.0, o).await;
    }
    fn known(&self) -> Vec<T> {
        T::of(self.0).1.sources()
    }
}

/// Watches the spoke's objects of kind `T` until `cancel` fires.
pub(crate) async fn run<T: Shipped>(spoke: Arc<Spoke>, cancel: CancellationToken) {
    let api = T::of(&spoke).0.api(Some(spoke.ns()));
    link::watch::run(&Watched::<T>(&spoke, std::marker::PhantomData), api, T::watch_config(), &cancel).await;
}

async fn applied<T: Shipped>(spoke: &Spoke, obj: T) {
    let (store, copies) = T::of(spoke);
    let name = name_of(&obj);
    if obj.meta().deletion_timestamp.is_some() {
        return;
    }
    let Some(src) = copies.source_or_adopt(&name, &obj) else { return };
    if !src.owned_differ(&obj) {
        return;
    }
    tracing::info!(name = %name, what = T::WHAT, "reverting a local edit of a principal-owned object");
    let result = store
        .update::<T, _>(spoke.ns(), &name, |cur| {
            let changed = src.owned_differ(cur);
            cur.take_owned(&src);
            changed
        })
        .await;
    if let Err(e) = result {
        tracing::warn!(name = %name, what = T::WHAT, error = %e, "cannot revert a local edit");
    }
}

async fn deleted<T: Shipped>(spoke: &Spoke, obj: T) {
    let (store, copies) = T::of(spoke);
    let name = name_of(&obj);
    let Gone::Restore(mut src) = copies.deleted(&name) else { return };
    tracing::info!(name = %name, what = T::WHAT, "recreating a principal-owned object deleted locally");
    clear_server_fields(src.meta_mut());
    if let Err(e) = store.create(spoke.ns(), &name, &src).await {
        tracing::warn!(name = %name, what = T::WHAT, error = %e, "cannot recreate a deleted object");
    }
}
