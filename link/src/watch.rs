//! The watch -> index driver: every Kubernetes watcher of both sides is an [`Index`] fed by
//! [`run`].
//!
//! The driver owns recovery, so no watcher writes it again:
//! * a failed watch is logged and retried with kube-runtime's default backoff; the index keeps
//!   what it knew meanwhile;
//! * after an error or 410 Gone the watcher lists again, bracketed by `Init` .. `InitDone`.
//!   Each listed object is [`Index::apply`]d as it arrives; at `InitDone`, every object the
//!   index knew ([`Index::known`]) that the list did not return was deleted during the gap and
//!   is [`Index::delete`]d then (upstream's informers drop such tombstones, §10.11);
//! * every completed list is reported ([`Index::synced`]), e.g. for readiness.
//!
//! Objects the index does not want (another namespace, not ours, not decodable) are filtered by
//! [`Index::decode`] and never reach it.

use std::collections::HashSet;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;

use futures::{Stream, StreamExt};
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WatchEvent};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

/// A cache of one kind of object, kept in line with the API server by [`run`].
pub trait Index: Send + Sync {
    /// What is watched.
    type Object: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static;
    /// What the index keeps of an object.
    type Item: Send;
    /// How items are told apart (a name, or namespace and name).
    type Key: Eq + Hash + Send;

    /// What is watched, in log lines ("hub Application").
    fn what(&self) -> &str;
    /// The item for `obj`, or `None` when the index does not want it (logged by the index when
    /// that is worth a line).
    fn decode(&self, obj: &Self::Object) -> Option<Self::Item>;
    /// The key of `item`.
    fn key(item: &Self::Item) -> Self::Key;
    /// `item` was created or changed (or listed again).
    fn apply(&self, item: Self::Item) -> impl Future<Output = ()> + Send;
    /// `item` was deleted (seen, or inferred from a re-list that no longer returned it).
    fn delete(&self, item: Self::Item) -> impl Future<Output = ()> + Send;
    /// Every item the index holds, to find those a re-list no longer returns.
    fn known(&self) -> Vec<Self::Item>;
    /// A (re-)list completed.
    fn synced(&self) {}
}

/// Watches `api` with `config` into `index` until `cancel` fires or the watch ends.
pub async fn run<I: Index>(index: &I, api: Api<I::Object>, config: watcher::Config, cancel: &CancellationToken) {
    drive(index, watcher::watcher(api, config).default_backoff(), cancel).await;
}

/// Feeds `events` into `index` (what [`run`] does with a live watch).
pub async fn drive<I, S>(index: &I, events: S, cancel: &CancellationToken)
where
    I: Index,
    S: Stream<Item = Result<WatchEvent<I::Object>, watcher::Error>>,
{
    let mut events = std::pin::pin!(events);
    // During a (re-)list: the keys it returned so far.
    let mut relisted: Option<HashSet<I::Key>> = None;
    loop {
        let next = tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            next = events.next() => next,
        };
        let event = match next {
            None => return,
            Some(Err(e)) => {
                tracing::warn!(what = %index.what(), error = %e, "watch failed; retrying with backoff");
                continue;
            }
            Some(Ok(event)) => event,
        };
        match event {
            WatchEvent::Init => relisted = Some(HashSet::new()),
            WatchEvent::InitApply(obj) | WatchEvent::Apply(obj) => {
                let Some(item) = index.decode(&obj) else { continue };
                if let Some(seen) = relisted.as_mut() {
                    seen.insert(I::key(&item));
                }
                index.apply(item).await;
            }
            WatchEvent::InitDone => {
                index.synced();
                let Some(seen) = relisted.take() else { continue };
                let gone: Vec<I::Item> = index.known().into_iter().filter(|i| !seen.contains(&I::key(i))).collect();
                if !gone.is_empty() {
                    tracing::info!(what = %index.what(), deleted = gone.len(), "re-list: deleted while unwatched");
                }
                for item in gone {
                    index.delete(item).await;
                }
            }
            WatchEvent::Delete(obj) => {
                if let Some(item) = index.decode(&obj) {
                    index.delete(item).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{DeleteParams, ObjectMeta, PostParams};

    use super::*;
    use crate::lock;

    /// ConfigMaps by name, with a log of what the driver did.
    #[derive(Default)]
    struct Maps {
        held: Mutex<BTreeMap<String, ConfigMap>>,
        log: Mutex<Vec<String>>,
        synced: AtomicUsize,
    }

    impl Index for Maps {
        type Object = ConfigMap;
        type Item = ConfigMap;
        type Key = String;

        fn what(&self) -> &str {
            "test ConfigMap"
        }
        fn decode(&self, obj: &ConfigMap) -> Option<ConfigMap> {
            // Not ours: filtered before the index sees it.
            (!obj.metadata.name.as_deref().unwrap_or_default().starts_with("other-")).then(|| obj.clone())
        }
        fn key(item: &ConfigMap) -> String {
            item.metadata.name.clone().unwrap_or_default()
        }
        async fn apply(&self, item: ConfigMap) {
            let name = Self::key(&item);
            lock(&self.log).push(format!("apply {name}"));
            lock(&self.held).insert(name, item);
        }
        async fn delete(&self, item: ConfigMap) {
            let name = Self::key(&item);
            lock(&self.log).push(format!("delete {name}"));
            lock(&self.held).remove(&name);
        }
        fn known(&self) -> Vec<ConfigMap> {
            lock(&self.held).values().cloned().collect()
        }
        fn synced(&self) {
            self.synced.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn cm(name: &str) -> ConfigMap {
        ConfigMap { metadata: ObjectMeta { name: Some(name.into()), ..Default::default() }, ..Default::default() }
    }

    fn log(index: &Maps) -> Vec<String> {
        std::mem::take(&mut *lock(&index.log))
    }

    #[tokio::test]
    async fn a_relist_deletes_what_it_no_longer_returns_and_filters_what_is_not_ours() {
        use WatchEvent::{Apply, Delete, Init, InitApply, InitDone};
        let index = Maps::default();
        let events = vec![
            Ok(Init),
            Ok(InitApply(cm("a"))),
            Ok(InitApply(cm("b"))),
            Ok(InitApply(cm("other-x"))),
            Ok(InitDone),
            Ok(Apply(cm("c"))),
            Ok(Delete(cm("a"))),
            Err(watcher::Error::NoResourceVersion),
            // The watch broke; during the gap `b` was deleted and `d` created.
            Ok(Init),
            Ok(InitApply(cm("c"))),
            Ok(InitApply(cm("d"))),
            Ok(InitDone),
        ];
        drive(&index, futures::stream::iter(events), &CancellationToken::new()).await;
        assert_eq!(
            log(&index),
            ["apply a", "apply b", "apply c", "delete a", "apply c", "apply d", "delete b"],
            "the re-list's tombstone is delivered at InitDone; `other-x` never reached the index"
        );
        assert_eq!(index.synced.load(Ordering::Relaxed), 2);
        assert_eq!(lock(&index.held).keys().cloned().collect::<Vec<_>>(), ["c", "d"]);
    }

    #[tokio::test]
    async fn cancelling_stops_the_driver() {
        let index = Maps::default();
        let cancel = CancellationToken::new();
        cancel.cancel();
        let forever = futures::stream::pending::<Result<WatchEvent<ConfigMap>, watcher::Error>>();
        tokio::time::timeout(Duration::from_secs(10), drive(&index, forever, &cancel)).await.expect("stopped");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_live_watch_on_a_real_api_server_feeds_the_index() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let server = apiserver::ApiServer::start(apiserver::Config::new(dir.path().join("data"))).await?;
        let client = server.client().await?;
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        api.create(&PostParams::default(), &cm("before")).await?;

        let index = std::sync::Arc::new(Maps::default());
        let cancel = CancellationToken::new();
        let watching = tokio::spawn({
            let (index, api, cancel) = (index.clone(), api.clone(), cancel.clone());
            async move { run(&*index, api, watcher::Config::default(), &cancel).await }
        });
        let wait = |what: &'static str, name: &'static str, present: bool| {
            let index = index.clone();
            async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                while lock(&index.held).contains_key(name) != present {
                    assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        wait("the initial list", "before", true).await;
        api.create(&PostParams::default(), &cm("after")).await?;
        wait("the created ConfigMap", "after", true).await;
        api.delete("before", &DeleteParams::default()).await?;
        wait("the deletion", "before", false).await;
        assert!(index.synced.load(Ordering::Relaxed) >= 1);

        cancel.cancel();
        watching.await?;
        server.shutdown().await;
        Ok(())
    }
}
