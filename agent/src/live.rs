//! Resource-proxy requests from the principal, executed against this cluster with the agent's
//! own credentials (upstream §5.1, `agent/resource.go`).
//!
//! The proxy serves the hub's Argo CD what it shows and changes of *this agent's*
//! Applications, nothing more. An object is **managed** when
//! * its tracking annotation (`argocd.argoproj.io/tracking-id`,
//!   `<app>:<group>/<kind>:<namespace>/<name>`) names the object itself (Argo CD's
//!   `isSelfReferencedObj`: group, kind and name equal, the namespace equal or the object
//!   cluster-scoped) and an Application of this agent that deploys to this cluster, or
//! * its instance label (`app.kubernetes.io/instance`, or `argocd-cm`'s
//!   `application.instanceLabelKey`) names such an Application, unless `argocd-cm` sets an
//!   annotation-based `application.resourceTrackingMethod` (then Argo CD ignores the label), or
//! * an owner chain of at most 5 links leads to a managed object.
//!
//! `<app>` is Argo CD's instance name: `<name>` for an Application in the agent's namespace
//! (where Argo CD runs), `<namespace>_<name>` for one in another (apps in any namespace). "Of this
//! agent" is what the hub knows ([`Host::application`]): managed, one the principal sent;
//! autonomous, one sent up. "Deploys to this cluster": destination server
//! `https://kubernetes.default.svc` or name `in-cluster` (every managed copy is rewritten to it).
//! A label or annotation alone proves nothing: Helm stamps `app.kubernetes.io/instance` on
//! everything it installs, and anyone who can create an object can annotate it.
//!
//! What may be read and changed (upstream's agent checks only for the label or annotation):
//! * **read** one managed object, and its subresources;
//! * **read** a CRD when it is managed, or when an Application of this agent lists it or a
//!   resource of its group and kind in `status.resources` (Argo CD applies CRDs without tracking
//!   them, upstream #873); other CRDs are refused;
//! * **list** only `events`, filtered to those whose `involvedObject` (`regarding`) is managed
//!   (at most [`EVENT_SUBJECTS`] objects checked per list); and discovery (`/apis`,
//!   `/apis/<group>`, `/api/v1`, `/apis/<group>/<version>`; upstream cannot serve
//!   `/apis/<group>`, #1001), unfiltered: it names types, never objects, and Argo CD resolves
//!   every kind of a resource tree (children included) through it;
//! * **create** only an object managed by its own metadata (its kind checked against the path)
//!   or whose owner is (Argo CD's "create job from cronjob" action); upstream creates anything;
//! * **patch** and **delete** only managed objects; post to a subresource of a managed object.
//!
//! Pod logs ([`crate::logs`]) and terminals ([`crate::terminal`]) reach managed pods only
//! ([`Live::managed_pod`]).
//!
//! Requests run concurrently (bounded), never on the receive loop: a slow API call does not
//! hold up the principal's other events (upstream runs them on its single receive loop). Each
//! request is executed once even if the principal resends it, and every answer, error included,
//! carries the API server's `Status` body, so the hub's Argo CD shows the reason.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt as _;
use protocol::argocd::Application;
use protocol::argocd::application::IN_CLUSTER_NAME;
use protocol::payload::{ApiResource, QUERY_PARAMS, ResourceRequest, ResourceResponse, status_body};
use protocol::{Event, EventType, Payload, Target};
use serde_json::Value;

use crate::error::InboundError;
use crate::host::Host;

/// Requests executed at once; more wait for a slot.
const CONCURRENT: usize = 16;
/// How long one request may take against this cluster before it is answered 504.
const TIMEOUT: Duration = Duration::from_secs(20);
/// How many owner links are followed to find a managed object (upstream's limit).
const OWNER_DEPTH: usize = 5;
/// How many distinct objects the events of one list are checked against; events of further
/// objects are left out (Argo CD lists the events of one object at a time).
pub(crate) const EVENT_SUBJECTS: usize = 64;
/// Argo CD's tracking annotation (annotation-based tracking, the default since 3.0).
const TRACKING_ANNOTATION: &str = "argocd.argoproj.io/tracking-id";
/// Argo CD's default instance label (label-based tracking).
const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// Argo CD's settings ConfigMap, which names another instance label
/// (`application.instanceLabelKey`) and the tracking method
/// (`application.resourceTrackingMethod`).
const ARGOCD_CM: &str = "argocd-cm";
/// How long the settings read from `argocd-cm` are used before they are read again.
const SETTINGS_TTL: Duration = Duration::from_secs(60);
/// The API server of the cluster Argo CD runs in, as Applications name it.
const IN_CLUSTER_SERVER: &str = "https://kubernetes.default.svc";
/// The group of CRDs.
const CRD_GROUP: &str = "apiextensions.k8s.io";

/// How Argo CD tracks resources on this cluster (`argocd-cm` in the agent's namespace).
#[derive(Debug, Clone)]
struct Tracking {
    /// The instance label (`application.instanceLabelKey`, default [`INSTANCE_LABEL`]).
    label: Arc<str>,
    /// Whether the label tracks: `application.resourceTrackingMethod` is `label` or not set.
    /// With `annotation` or `annotation+label` Argo CD reads only the annotation.
    by_label: bool,
}

impl Default for Tracking {
    fn default() -> Self {
        Self { label: Arc::from(INSTANCE_LABEL), by_label: true }
    }
}

/// The agent's side of the resource proxy.
pub(crate) struct Live {
    client: kube::Client,
    /// Where Argo CD's `argocd-cm` is (the agent's namespace).
    namespace: String,
    slots: Arc<tokio::sync::Semaphore>,
    seen: Mutex<crate::recent::RecentIds>,
    /// Argo CD's tracking settings, and when they were read.
    tracking: Mutex<Option<(std::time::Instant, Tracking)>>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

impl Live {
    pub(crate) fn new(client: kube::Client, namespace: &str) -> Self {
        Self {
            client,
            namespace: namespace.to_owned(),
            slots: Arc::new(tokio::sync::Semaphore::new(CONCURRENT)),
            seen: Mutex::default(),
            tracking: Mutex::default(),
        }
    }

    /// How Argo CD tracks resources here: `argocd-cm`'s `application.instanceLabelKey` and
    /// `application.resourceTrackingMethod` in the agent's namespace, else Argo CD's defaults
    /// (also when `argocd-cm` cannot be read). Read at most once a minute.
    async fn tracking(&self) -> Tracking {
        if let Some((at, tracking)) = link::lock(&self.tracking).as_ref()
            && at.elapsed() < SETTINGS_TTL
        {
            return tracking.clone();
        }
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(self.client.clone(), &self.namespace);
        let read = tokio::time::timeout(TIMEOUT, api.get_opt(ARGOCD_CM)).await;
        let tracking = match read {
            Ok(Ok(cm)) => tracking_of(cm.as_ref()),
            Ok(Err(error)) => {
                tracing::debug!(%error, "cannot read argocd-cm; Argo CD's default tracking applies");
                Tracking::default()
            }
            Err(_) => Tracking::default(),
        };
        *link::lock(&self.tracking) = Some((std::time::Instant::now(), tracking.clone()));
        tracking
    }

    /// Whether request `uuid` arrives for the first time (remembering it).
    fn first_time(&self, uuid: &str) -> bool {
        link::lock(&self.seen).first_time(uuid)
    }

    /// The client for this cluster (the agent's own credentials).
    pub(crate) fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Whether pod `namespace/name` is *managed* by an Application of `host` (tracked, or an
    /// owner chain to a tracked object): `Ok`, or the HTTP code and `Status` body refusing it
    /// (404 and the like as the API server gave them). For pod logs ([`crate::logs`]) and
    /// terminals ([`crate::terminal`]).
    pub(crate) async fn managed_pod(&self, host: &dyn Host, namespace: &str, name: &str) -> Result<(), (u16, String)> {
        let req = ResourceRequest {
            version: "v1".to_owned(),
            namespace: namespace.to_owned(),
            resource: "pods".to_owned(),
            name: name.to_owned(),
            ..ResourceRequest::default()
        };
        let tracking = self.tracking().await;
        let judge = Judge::new(&self.client, &tracking, host);
        let found = tokio::time::timeout(TIMEOUT, managed_parent(&judge, &req, &ApiResource::of(&req))).await;
        match found {
            Ok(Ok(Ok(_))) => Ok(()),
            Ok(Ok(Err(refusal))) => Err((refusal.status, refusal.body)),
            Ok(Err(error)) => Err((503, status_body(503, &format!("cannot reach this cluster's API server: {error}")))),
            Err(_) => Err((504, status_body(504, &format!("the pod could not be read within {TIMEOUT:?}")))),
        }
    }
}

/// Whether `ev` is a resource-proxy request (handled here, not by the event handlers).
pub(crate) fn is_request(ev: &Event) -> bool {
    ev.target == Target::Resource && ev.event_type.is_http_method()
}

/// Takes resource-proxy request `ev`: it is executed in the background and answered with a
/// `response` event; the request itself is acknowledged at once.
pub(crate) fn accept<H: Host>(spoke: &Arc<H>, live: &Arc<Live>, ev: &Event) -> Result<(), InboundError> {
    let Payload::ResourceRequest(req) = ev.payload()? else {
        return Ok(());
    };
    if req.uuid.is_empty() || req.uuid != ev.event_id {
        tracing::warn!(uuid = %req.uuid, event_id = %ev.event_id,
            "resource-proxy request whose uuid is not its eventid; ignored");
        return Ok(());
    }
    if !live.first_time(&req.uuid) {
        tracing::debug!(uuid = %req.uuid, "resource-proxy request resent; executed once already");
        return Ok(());
    }
    let (spoke, live) = (spoke.clone(), live.clone());
    tokio::spawn(async move {
        let answer = if spoke.config().enable_resource_proxy {
            let _slot = live.slots.clone().acquire_owned().await;
            let tracking = live.tracking().await;
            let judge = Judge::new(&live.client, &tracking, &*spoke);
            match tokio::time::timeout(TIMEOUT, execute(&judge, &req)).await {
                Ok(answer) => answer,
                Err(_) => Answer::failure(504, &format!("the request took longer than {TIMEOUT:?} on this cluster")),
            }
        } else {
            Answer::failure(
                403,
                &format!(
                    "the resource proxy is disabled on agent {:?} (--enable-resource-proxy=false)",
                    spoke.config().name
                ),
            )
        };
        let answer = answer.fitting(spoke.config().max_message_bytes);
        tracing::debug!(uuid = %req.uuid, method = %req.method, resource = %req.resource, name = %req.name,
            status = answer.status, "resource-proxy request answered");
        let resp = ResourceResponse { uuid: req.uuid.clone(), status: i64::from(answer.status), resource: answer.body };
        match Event::response(EventType::Response, Target::Resource, &req.uuid).with_json(&resp) {
            Ok(ev) => spoke.mailbox().push(ev),
            Err(error) => tracing::warn!(uuid = %req.uuid, %error, "cannot encode a resource-proxy answer"),
        }
    });
    Ok(())
}

/// An answer: HTTP status and body (JSON text; a `Status` object for errors).
#[derive(Debug)]
struct Answer {
    status: u16,
    body: String,
}

impl Answer {
    fn failure(status: u16, message: &str) -> Self {
        Self { status, body: status_body(status, message) }
    }

    fn forbidden(req: &ResourceRequest, why: &str) -> Self {
        Self::failure(403, &format!("{} {:?}: {why}", resource_name(req), req.name))
    }

    /// The answer, or a failure saying it is too large for the stream.
    fn fitting(self, max_message_bytes: usize) -> Self {
        // Room for the envelope around the body.
        let room = max_message_bytes.saturating_sub(64 << 10);
        if self.body.len() <= room {
            return self;
        }
        Self::failure(
            500,
            &format!(
                "the answer is {} bytes, more than the event stream carries ({room}; --grpc-max-message-size)",
                self.body.len()
            ),
        )
    }
}

fn resource_name(req: &ResourceRequest) -> String {
    if req.group.is_empty() { req.resource.clone() } else { format!("{}.{}", req.resource, req.group) }
}

async fn execute(judge: &Judge<'_>, req: &ResourceRequest) -> Answer {
    match run(judge, req).await {
        Ok(answer) => answer,
        Err(error) => Answer::failure(503, &format!("cannot reach this cluster's API server: {error}")),
    }
}

async fn run(judge: &Judge<'_>, req: &ResourceRequest) -> Result<Answer, kube::Error> {
    let client = judge.client;
    let target = ApiResource::of(req);
    let method = req.method.to_ascii_uppercase();
    if req.resource.is_empty() {
        if method != "GET" || !req.name.is_empty() {
            return Ok(Answer::failure(400, "a request without a resource can only read discovery"));
        }
        return match target.discovery_path() {
            Ok(path) => send(client, "GET", &path, "", Vec::new(), None).await,
            Err(e) => Ok(Answer::failure(400, &e.to_string())),
        };
    }
    let path = match target.path() {
        Ok(p) => p,
        Err(e) => return Ok(Answer::failure(400, &e.to_string())),
    };
    let query = query(req);
    match method.as_str() {
        "GET" if req.name.is_empty() => {
            if req.resource != "events" {
                return Ok(Answer::forbidden(req, "only events can be listed through the resource proxy"));
            }
            judge.events(&path, &query).await
        }
        "GET"
            if req.group == CRD_GROUP && req.resource == "customresourcedefinitions" && req.subresource.is_empty() =>
        {
            let answer = send(client, "GET", &path, &query, Vec::new(), None).await?;
            if answer.status != 200 {
                return Ok(answer);
            }
            let Ok(crd) = serde_json::from_str::<Value>(&answer.body) else {
                return Ok(Answer::failure(502, "the API server's answer is not JSON"));
            };
            let direct = match judge.tracked(&crd, &Identity::of(&crd)) {
                Ok(()) => return Ok(answer),
                Err(why) => why,
            };
            if judge.crd_in_use(&crd).await? {
                return Ok(answer);
            }
            Ok(Answer::forbidden(
                req,
                &format!(
                    "{}; and no Application of agent {:?} lists it, or a resource of its group and kind, in status.resources",
                    judge.not_managed(&direct),
                    judge.host.config().name
                ),
            ))
        }
        "GET" => {
            let parent = match managed_parent(judge, req, &target).await? {
                Ok(parent) => parent,
                Err(refusal) => return Ok(refusal),
            };
            if req.subresource.is_empty() {
                return Ok(parent);
            }
            send(client, "GET", &path, &query, Vec::new(), None).await
        }
        "POST" if req.subresource.is_empty() => {
            if !req.name.is_empty() {
                return Ok(Answer::failure(405, "POST creates into a collection; the path must not name an object"));
            }
            let object = match serde_json::from_slice::<Value>(&req.body) {
                Ok(object) if object.is_object() => object,
                _ => return Ok(Answer::failure(400, "the body of a create is not a JSON object")),
            };
            let me = match judge.created(req, &object).await? {
                Ok(me) => me,
                Err(why) => return Ok(Answer::failure(400, &why)),
            };
            if let Err(why) = judge.managed(&object, &me, &req.namespace).await? {
                return Ok(Answer::forbidden(
                    req,
                    &format!(
                        "only an object tracked by an Argo CD Application of agent {:?}, or owned by one it manages, can be created: {why}",
                        judge.host.config().name
                    ),
                ));
            }
            send(client, "POST", &path, &query, req.body.clone(), Some("application/json")).await
        }
        "POST" | "PATCH" | "DELETE" => {
            if let Err(refusal) = managed_parent(judge, req, &target).await? {
                return Ok(refusal);
            }
            let content_type = match method.as_str() {
                "PATCH" => Some(patch_type(req)),
                _ if req.body.is_empty() => None,
                _ => Some("application/json"),
            };
            send(client, &method, &path, &query, req.body.clone(), content_type).await
        }
        other => Ok(Answer::failure(405, &format!("{other} is not served by the resource proxy"))),
    }
}

/// The patch type a PATCH names (`content-type`, as upstream's principal and ours pass it);
/// a JSON merge patch by default, as upstream.
fn patch_type(req: &ResourceRequest) -> &'static str {
    match req.params.get("content-type").map(|c| c.split(';').next().unwrap_or("").trim()) {
        Some("application/json-patch+json") => "application/json-patch+json",
        Some("application/strategic-merge-patch+json") => "application/strategic-merge-patch+json",
        Some("application/apply-patch+yaml") => "application/apply-patch+yaml",
        _ => "application/merge-patch+json",
    }
}

fn query(req: &ResourceRequest) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in &req.params {
        if QUERY_PARAMS.contains(&k.as_str()) {
            q.append_pair(k, v);
        }
    }
    q.finish()
}

/// The named object (without subresource) if it is managed; else the answer refusing the
/// request (404 and the like passed on as the API server gave them).
async fn managed_parent(
    judge: &Judge<'_>,
    req: &ResourceRequest,
    target: &ApiResource,
) -> Result<Result<Answer, Answer>, kube::Error> {
    let parent = ApiResource { subresource: String::new(), ..target.clone() };
    let path = match parent.path() {
        Ok(p) => p,
        Err(e) => return Ok(Err(Answer::failure(400, &e.to_string()))),
    };
    let answer = send(judge.client, "GET", &path, "", Vec::new(), None).await?;
    if answer.status != 200 {
        return Ok(Err(answer));
    }
    let Ok(object) = serde_json::from_str::<Value>(&answer.body) else {
        return Ok(Err(Answer::failure(502, "the API server's answer is not JSON")));
    };
    match judge.managed(&object, &Identity::of(&object), &req.namespace).await? {
        Ok(()) => Ok(Ok(answer)),
        Err(why) => Ok(Err(Answer::forbidden(req, &judge.not_managed(&why)))),
    }
}

/// The tracking settings `argocd-cm` names, or Argo CD's defaults.
fn tracking_of(cm: Option<&k8s_openapi::api::core::v1::ConfigMap>) -> Tracking {
    let data = cm.and_then(|cm| cm.data.as_ref());
    let setting = |key: &str| data.and_then(|d| d.get(key)).map(|v| v.trim()).filter(|v| !v.is_empty());
    Tracking {
        label: Arc::from(setting("application.instanceLabelKey").unwrap_or(INSTANCE_LABEL)),
        by_label: matches!(setting("application.resourceTrackingMethod"), None | Some("label")),
    }
}

/// What an object is, as a tracking id names it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    group: String,
    kind: String,
    namespace: String,
    name: String,
}

impl Identity {
    /// The identity `object` states (`apiVersion`, `kind`, `metadata`), as the API server
    /// answers it.
    fn of(object: &Value) -> Self {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        Self {
            group: api_version.split_once('/').map(|(g, _)| g.to_owned()).unwrap_or_default(),
            kind: text(&object["kind"]),
            namespace: text(&object["metadata"]["namespace"]),
            name: text(&object["metadata"]["name"]),
        }
    }
}

/// Argo CD's tracking id, `<app>:<group>/<kind>:<namespace>/<name>` (its `ParseAppInstanceValue`:
/// split at the first two colons; exactly one `/` in each of the last two parts).
#[derive(Debug, PartialEq, Eq)]
struct TrackingId<'a> {
    app: &'a str,
    group: &'a str,
    kind: &'a str,
    namespace: &'a str,
    name: &'a str,
}

impl<'a> TrackingId<'a> {
    fn parse(value: &'a str) -> Option<Self> {
        let mut parts = value.splitn(3, ':');
        let (app, group_kind, namespace_name) = (parts.next()?, parts.next()?, parts.next()?);
        let (group, kind) = group_kind.split_once('/').filter(|(_, k)| !k.contains('/'))?;
        let (namespace, name) = namespace_name.split_once('/').filter(|(_, n)| !n.contains('/'))?;
        (!app.is_empty()).then_some(Self { app, group, kind, namespace, name })
    }

    /// Whether this id names `object` (Argo CD's `isSelfReferencedObj`: group, kind and name
    /// equal; the namespace equal, or the object cluster-scoped, whose id carries the
    /// Application's destination namespace).
    fn names(&self, object: &Identity) -> bool {
        !object.name.is_empty()
            && self.name == object.name
            && self.kind == object.kind
            && self.group == object.group
            && (object.namespace.is_empty() || self.namespace == object.namespace)
    }
}

/// The Application an Argo CD instance name names, `(namespace, name)`: `<namespace>_<name>`
/// (apps in any namespace), or `<name>` in `control_plane`, the namespace Argo CD runs in
/// (Argo CD's `ParseInstanceName`).
fn instance_app<'a>(instance: &'a str, control_plane: &'a str) -> (&'a str, &'a str) {
    instance.split_once('_').unwrap_or((control_plane, instance))
}

/// Whether `app` deploys to the cluster Argo CD runs in: this one.
fn targets_this_cluster(app: &Application) -> bool {
    let Some(dest) = app.spec.destination.as_ref() else { return false };
    match (dest.server.as_deref().filter(|s| !s.is_empty()), dest.name.as_deref().filter(|n| !n.is_empty())) {
        (Some(server), _) => server.trim_end_matches('/') == IN_CLUSTER_SERVER,
        (None, Some(name)) => name == IN_CLUSTER_NAME,
        (None, None) => false,
    }
}

/// A kind as discovery names it: its plural resource, and whether it is namespaced.
type Kind = (String, bool);

/// Whose objects are managed, per request: this cluster (its discovery remembered for the
/// request), Argo CD's tracking settings, and this agent's Applications.
struct Judge<'a> {
    client: &'a kube::Client,
    tracking: &'a Tracking,
    host: &'a dyn Host,
    /// `(apiVersion, kind)` -> plural resource and whether it is namespaced, as discovered.
    kinds: Mutex<HashMap<(String, String), Option<Kind>>>,
}

impl<'a> Judge<'a> {
    fn new(client: &'a kube::Client, tracking: &'a Tracking, host: &'a dyn Host) -> Self {
        Self { client, tracking, host, kinds: Mutex::default() }
    }

    /// The reason a refusal gives.
    fn not_managed(&self, why: &str) -> String {
        format!("not managed by an Argo CD Application of agent {:?}: {why}", self.host.config().name)
    }

    /// `Ok` when instance name `instance` (found in `source`) names an Application of this
    /// agent that deploys to this cluster; else why not.
    fn owning_app(&self, instance: &str, source: &str) -> Result<(), String> {
        let config = self.host.config();
        let (ns, name) = instance_app(instance, &config.namespace);
        match self.host.application(ns, name) {
            None => Err(format!("{source} names Application {ns}/{name}, which agent {:?} does not have", config.name)),
            Some(app) if !targets_this_cluster(&app) => {
                Err(format!("{source} names Application {ns}/{name}, which deploys to another cluster"))
            }
            Some(_) => Ok(()),
        }
    }

    /// Whether `object`, which is `me`, is tracked by an Application of this agent by its own
    /// metadata (owners aside): `Ok`, or why not.
    fn tracked(&self, object: &Value, me: &Identity) -> Result<(), String> {
        let meta = &object["metadata"];
        let mut why = Vec::new();
        if let Some(value) = meta["annotations"][TRACKING_ANNOTATION].as_str() {
            match TrackingId::parse(value) {
                None => why.push(format!(
                    "its tracking annotation {value:?} is not <application>:<group>/<kind>:<namespace>/<name>"
                )),
                Some(id) if !id.names(me) => why.push(format!(
                    "its tracking annotation {value:?} names another object than {}/{} {}/{}",
                    me.group, me.kind, me.namespace, me.name
                )),
                Some(id) => match self.owning_app(id.app, "its tracking annotation") {
                    Ok(()) => return Ok(()),
                    Err(e) => why.push(e),
                },
            }
        }
        let label = &*self.tracking.label;
        if let Some(value) = meta["labels"][label].as_str() {
            if self.tracking.by_label {
                match self.owning_app(value, &format!("its label {label}={value}")) {
                    Ok(()) => return Ok(()),
                    Err(e) => why.push(e),
                }
            } else {
                why.push(format!(
                    "its label {label}={value} does not track it: argocd-cm sets an annotation-based application.resourceTrackingMethod"
                ));
            }
        }
        if why.is_empty() {
            why.push(format!("it has no tracking annotation ({TRACKING_ANNOTATION}) nor instance label ({label})"));
        }
        Err(why.join("; "))
    }

    /// Whether `object`, which is `me` in request namespace `namespace`, is managed: tracked,
    /// or owned through at most [`OWNER_DEPTH`] links by a tracked object. `Ok`, or why not.
    async fn managed(&self, object: &Value, me: &Identity, namespace: &str) -> Result<Result<(), String>, kube::Error> {
        let why = match self.tracked(object, me) {
            Ok(()) => return Ok(Ok(())),
            Err(why) => why,
        };
        if self.owner_managed(object, namespace, OWNER_DEPTH).await? {
            return Ok(Ok(()));
        }
        let has_owners = object["metadata"]["ownerReferences"].as_array().is_some_and(|o| !o.is_empty());
        Ok(Err(if has_owners { format!("{why}; and no owner within {OWNER_DEPTH} links is managed") } else { why }))
    }

    /// Whether an owner of `object` (within `depth` links) is tracked.
    async fn owner_managed(&self, object: &Value, namespace: &str, depth: usize) -> Result<bool, kube::Error> {
        let Some(owners) = object["metadata"]["ownerReferences"].as_array() else {
            return Ok(false);
        };
        if depth == 0 {
            return Ok(false);
        }
        for owner in owners {
            let (Some(api_version), Some(kind), Some(name)) =
                (owner["apiVersion"].as_str(), owner["kind"].as_str(), owner["name"].as_str())
            else {
                continue;
            };
            let Some(parent) = self.read(api_version, kind, namespace, name).await? else { continue };
            if self.tracked(&parent, &Identity::of(&parent)).is_ok()
                || Box::pin(self.owner_managed(&parent, namespace, depth - 1)).await?
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Object `kind` `name` of `api_version` (in `namespace` when its kind is namespaced), if
    /// it can be read.
    async fn read(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, kube::Error> {
        let Some((plural, namespaced)) = self.resolve(api_version, kind).await? else {
            return Ok(None);
        };
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let target = ApiResource {
            group: group.to_owned(),
            version: version.to_owned(),
            namespace: if namespaced { namespace.to_owned() } else { String::new() },
            resource: plural,
            name: name.to_owned(),
            subresource: String::new(),
        };
        let Ok(path) = target.path() else { return Ok(None) };
        let answer = send(self.client, "GET", &path, "", Vec::new(), None).await?;
        if answer.status != 200 {
            return Ok(None);
        }
        Ok(serde_json::from_str::<Value>(&answer.body).ok())
    }

    /// [`resolve`], remembered for this request.
    async fn resolve(&self, api_version: &str, kind: &str) -> Result<Option<Kind>, kube::Error> {
        let key = (api_version.to_owned(), kind.to_owned());
        if let Some(known) = link::lock(&self.kinds).get(&key) {
            return Ok(known.clone());
        }
        let found = resolve(self.client, api_version, kind).await?;
        link::lock(&self.kinds).insert(key, found.clone());
        Ok(found)
    }

    /// What object `object`, the body of create `req`, will be: its kind checked against the
    /// path's resource (as the API server does), its namespace the path's. `Err` says what to
    /// fix.
    async fn created(&self, req: &ResourceRequest, object: &Value) -> Result<Result<Identity, String>, kube::Error> {
        let api_version = format!("{}{}{}", req.group, if req.group.is_empty() { "" } else { "/" }, req.version);
        let mut me = Identity::of(object);
        if object["apiVersion"].as_str().is_some_and(|v| v != api_version) {
            return Ok(Err(format!(
                "the object's apiVersion {:?} is not {api_version:?}, the path's",
                object["apiVersion"].as_str().unwrap_or_default()
            )));
        }
        me.group.clone_from(&req.group);
        if me.kind.is_empty() {
            return Ok(Err("the object names no kind".to_owned()));
        }
        match self.resolve(&api_version, &me.kind).await? {
            Some((plural, _)) if plural == req.resource => {}
            _ => {
                return Ok(Err(format!("kind {:?} is not resource {:?} of {api_version}", me.kind, req.resource)));
            }
        }
        if !me.namespace.is_empty() && me.namespace != req.namespace {
            return Ok(Err(format!(
                "the object's namespace {:?} is not {:?}, the path's",
                me.namespace, req.namespace
            )));
        }
        me.namespace.clone_from(&req.namespace);
        Ok(Ok(me))
    }

    /// Whether CRD `crd` is in use by an Application of this agent: one lists the CRD itself,
    /// or a resource of its group and kind, in `status.resources`.
    async fn crd_in_use(&self, crd: &Value) -> Result<bool, kube::Error> {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let (group, kind, name) =
            (text(&crd["spec"]["group"]), text(&crd["spec"]["names"]["kind"]), text(&crd["metadata"]["name"]));
        let config = self.host.config();
        let scope = ApiResource {
            group: "argoproj.io".to_owned(),
            version: "v1alpha1".to_owned(),
            namespace: if config.destination_based_mapping { String::new() } else { config.namespace.clone() },
            resource: "applications".to_owned(),
            ..ApiResource::default()
        };
        let Ok(path) = scope.path() else { return Ok(false) };
        let answer = send(self.client, "GET", &path, "", Vec::new(), None).await?;
        let Ok(list) = serde_json::from_str::<Value>(&answer.body) else { return Ok(false) };
        let Some(apps) = list["items"].as_array().filter(|_| answer.status == 200) else { return Ok(false) };
        Ok(apps.iter().any(|app| {
            let me = Identity::of(app);
            let ours = self.host.application(&me.namespace, &me.name).is_some_and(|a| targets_this_cluster(&a));
            ours && app["status"]["resources"].as_array().is_some_and(|resources| {
                resources.iter().any(|r| {
                    let (g, k) = (r["group"].as_str().unwrap_or_default(), r["kind"].as_str().unwrap_or_default());
                    (g == group && k == kind)
                        || (g == CRD_GROUP
                            && k == "CustomResourceDefinition"
                            && r["name"].as_str() == Some(name.as_str()))
                })
            })
        }))
    }

    /// The events list at `path`, only with the events whose subject (`involvedObject`, or
    /// `regarding` in `events.k8s.io`) is managed; the subjects of at most [`EVENT_SUBJECTS`]
    /// are checked, the events of any further ones left out.
    async fn events(&self, path: &str, query: &str) -> Result<Answer, kube::Error> {
        let answer = send(self.client, "GET", path, query, Vec::new(), None).await?;
        if answer.status != 200 {
            return Ok(answer);
        }
        let Ok(mut list) = serde_json::from_str::<Value>(&answer.body) else {
            return Ok(Answer::failure(502, "the API server's answer is not JSON"));
        };
        let Some(items) = list.get_mut("items").and_then(Value::as_array_mut) else {
            return Ok(Answer::failure(502, "the API server's events list has no items"));
        };
        let mut verdicts: HashMap<[String; 5], bool> = HashMap::new();
        let mut kept = Vec::new();
        for event in std::mem::take(items) {
            let subject =
                if event["involvedObject"].is_object() { &event["involvedObject"] } else { &event["regarding"] };
            let text = |key: &str| subject[key].as_str().unwrap_or_default().to_owned();
            let event_ns = event["metadata"]["namespace"].as_str().unwrap_or_default();
            let namespace = Some(text("namespace")).filter(|n| !n.is_empty()).unwrap_or_else(|| event_ns.to_owned());
            let key = [text("apiVersion"), text("kind"), namespace, text("name"), text("uid")];
            let managed = match verdicts.get(&key) {
                Some(known) => *known,
                None => {
                    let managed = verdicts.len() < EVENT_SUBJECTS && self.subject_managed(&key).await?;
                    verdicts.insert(key, managed);
                    managed
                }
            };
            if managed {
                kept.push(event);
            }
        }
        let left_out = verdicts.values().filter(|managed| !**managed).count();
        if left_out > 0 {
            tracing::debug!(path, left_out, "events of objects no Application of this agent manages left out");
        }
        list["items"] = Value::Array(kept);
        Ok(Answer { status: 200, body: list.to_string() })
    }

    /// Whether the object an event is about, `[apiVersion, kind, namespace, name, uid]`, is
    /// managed (the same object: the uid, when the event names one, matches).
    async fn subject_managed(
        &self,
        [api_version, kind, namespace, name, uid]: &[String; 5],
    ) -> Result<bool, kube::Error> {
        let api_version = if api_version.is_empty() { "v1" } else { api_version.as_str() };
        if kind.is_empty() || name.is_empty() {
            return Ok(false);
        }
        let Some(object) = self.read(api_version, kind, namespace, name).await? else { return Ok(false) };
        if !uid.is_empty() && object["metadata"]["uid"].as_str() != Some(uid.as_str()) {
            return Ok(false);
        }
        Ok(self.managed(&object, &Identity::of(&object), namespace).await?.is_ok())
    }
}

/// The plural resource of `kind` in `api_version`, and whether it is namespaced, from discovery.
async fn resolve(client: &kube::Client, api_version: &str, kind: &str) -> Result<Option<(String, bool)>, kube::Error> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let target = ApiResource { group: group.to_owned(), version: version.to_owned(), ..ApiResource::default() };
    let Ok(path) = target.discovery_path() else { return Ok(None) };
    let answer = send(client, "GET", &path, "", Vec::new(), None).await?;
    let Ok(list) = serde_json::from_str::<serde_json::Value>(&answer.body) else { return Ok(None) };
    Ok(list["resources"].as_array().and_then(|resources| {
        resources.iter().find_map(|r| {
            let name = r["name"].as_str()?;
            (r["kind"].as_str() == Some(kind) && !name.contains('/'))
                .then(|| (name.to_owned(), r["namespaced"].as_bool().unwrap_or(false)))
        })
    }))
}

/// One request to this cluster's API server; any status is an answer (2xx becomes 200, which
/// is what upstream's principal passes a body on for), only a transport failure is an error.
async fn send(
    client: &kube::Client,
    method: &str,
    path: &str,
    query: &str,
    body: Vec<u8>,
    content_type: Option<&str>,
) -> Result<Answer, kube::Error> {
    let uri = if query.is_empty() { path.to_owned() } else { format!("{path}?{query}") };
    let mut builder = http::Request::builder().method(method).uri(uri).header(http::header::ACCEPT, "application/json");
    if let Some(ct) = content_type {
        builder = builder.header(http::header::CONTENT_TYPE, ct);
    }
    let request = builder.body(kube::client::Body::from(body)).map_err(kube::Error::HttpError)?;
    let response = client.send(request).await?;
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await?.to_bytes();
    let body = String::from_utf8_lossy(&bytes).into_owned();
    if (200..300).contains(&status) {
        return Ok(Answer { status: 200, body });
    }
    if protocol::payload::is_status(&body) {
        return Ok(Answer { status, body });
    }
    Ok(Answer::failure(status, body.trim()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::{AgentConfig, AgentMode};
    use serde_json::json;

    #[test]
    fn tracking_ids_parse_as_argo_cd_does_and_name_only_their_object() {
        let id = TrackingId::parse("gb:apps/Deployment:guestbook/ui").expect("an id");
        assert_eq!(id, TrackingId { app: "gb", group: "apps", kind: "Deployment", namespace: "guestbook", name: "ui" });
        let core =
            TrackingId::parse("team_gb:/ConfigMap:guestbook/a:b").expect("a core kind; the name keeps its colon");
        assert_eq!((core.app, core.group, core.name), ("team_gb", "", "a:b"));
        for bad in
            ["gb", "gb:apps/Deployment", "gb:Deployment:guestbook/ui", "gb:a/b/c:ns/n", "gb:/Pod:ns", ":/Pod:ns/n"]
        {
            assert_eq!(TrackingId::parse(bad), None, "{bad}");
        }
        let me = |group: &str, kind: &str, namespace: &str, name: &str| Identity {
            group: group.into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        };
        assert!(id.names(&me("apps", "Deployment", "guestbook", "ui")));
        assert!(!id.names(&me("apps", "Deployment", "guestbook", "api")), "another name");
        assert!(!id.names(&me("apps", "ReplicaSet", "guestbook", "ui")), "another kind");
        assert!(!id.names(&me("", "Deployment", "guestbook", "ui")), "another group");
        assert!(!id.names(&me("apps", "Deployment", "default", "ui")), "another namespace");
        let cluster = TrackingId::parse("gb:rbac.authorization.k8s.io/ClusterRole:guestbook/view").expect("an id");
        assert!(cluster.names(&me("rbac.authorization.k8s.io", "ClusterRole", "", "view")), "cluster-scoped");
        assert!(!TrackingId::parse("gb:/Pod:ns/").expect("an id").names(&me("", "Pod", "ns", "")), "no name");

        assert_eq!(instance_app("gb", "argocd"), ("argocd", "gb"));
        assert_eq!(instance_app("team-a_gb", "argocd"), ("team-a", "gb"), "apps in any namespace");
    }

    #[test]
    fn tracking_settings_come_from_argocd_cm() {
        let cm = |data: Value| -> k8s_openapi::api::core::v1::ConfigMap {
            serde_json::from_value(json!({"metadata": {"name": ARGOCD_CM}, "data": data})).expect("a ConfigMap")
        };
        let custom = tracking_of(Some(&cm(json!({"application.instanceLabelKey": "argocd.argoproj.io/instance"}))));
        assert_eq!((&*custom.label, custom.by_label), ("argocd.argoproj.io/instance", true));
        let blank = tracking_of(Some(&cm(json!({"application.instanceLabelKey": " "}))));
        assert_eq!(&*blank.label, INSTANCE_LABEL);
        assert!(tracking_of(None).by_label && &*tracking_of(None).label == INSTANCE_LABEL);
        for method in ["annotation", "annotation+label"] {
            let t = tracking_of(Some(&cm(json!({"application.resourceTrackingMethod": method}))));
            assert!(!t.by_label, "{method}: Argo CD reads only the annotation");
        }
        assert!(tracking_of(Some(&cm(json!({"application.resourceTrackingMethod": "label"})))).by_label);
    }

    #[test]
    fn only_applications_deploying_to_this_cluster_own_its_objects() {
        let app = |destination: Value| -> Application {
            serde_json::from_value(json!({"metadata": {"name": "a"}, "spec": {"destination": destination}}))
                .expect("an Application")
        };
        assert!(targets_this_cluster(&app(json!({"name": "in-cluster", "namespace": "x"}))));
        assert!(targets_this_cluster(&app(json!({"server": "https://kubernetes.default.svc/"}))));
        assert!(!targets_this_cluster(&app(json!({"server": "https://10.0.0.1:6443"}))));
        assert!(!targets_this_cluster(&app(json!({"name": "prod"}))));
        assert!(!targets_this_cluster(&app(json!({"namespace": "x"}))));
    }

    #[tokio::test]
    async fn a_resent_request_runs_once_and_old_uuids_are_forgotten() {
        let live = Live::new(link::testing::offline_client("argocd"), "argocd");
        assert!(live.first_time("a"));
        assert!(!live.first_time("a"), "a resend");
        for i in 0..crate::recent::REMEMBERED {
            assert!(live.first_time(&format!("u{i}")));
        }
        assert!(live.first_time("a"), "remembered ids are bounded");
    }

    #[test]
    fn an_answer_too_large_for_the_stream_becomes_a_failure_saying_so() {
        let big = Answer { status: 200, body: "x".repeat(200 << 10) };
        let fitted = big.fitting(128 << 10);
        assert_eq!(fitted.status, 500);
        assert!(fitted.body.contains("--grpc-max-message-size"), "{}", fitted.body);
        let small = Answer { status: 200, body: "{}".into() }.fitting(128 << 10);
        assert_eq!((small.status, small.body.as_str()), (200, "{}"));
    }

    #[test]
    fn patch_types_follow_the_content_type_passed_with_the_request() {
        let mut req = ResourceRequest::default();
        assert_eq!(patch_type(&req), "application/merge-patch+json");
        req.params.insert("content-type".into(), "application/json-patch+json".into());
        assert_eq!(patch_type(&req), "application/json-patch+json");
        req.params.insert("content-type".into(), "application/strategic-merge-patch+json; charset=utf-8".into());
        assert_eq!(patch_type(&req), "application/strategic-merge-patch+json");
    }

    /// An agent as the resource proxy sees it, whose Applications the test sets.
    pub(crate) struct TestAgent {
        pub(crate) config: AgentConfig,
        mailbox: link::Mailbox,
        apps: Mutex<HashMap<(String, String), Application>>,
    }

    impl TestAgent {
        pub(crate) fn new(config: AgentConfig) -> Self {
            Self { mailbox: link::Mailbox::new(config.retry.clone()), config, apps: Mutex::default() }
        }

        /// Application `namespace/name` of this agent, deploying to `destination`.
        pub(crate) fn add(&self, namespace: &str, name: &str, destination: Value) {
            let app = serde_json::from_value(json!({"metadata": {"name": name, "namespace": namespace},
                "spec": {"destination": destination}}))
            .expect("an Application");
            link::lock(&self.apps).insert((namespace.to_owned(), name.to_owned()), app);
        }
    }

    impl Host for TestAgent {
        fn config(&self) -> &AgentConfig {
            &self.config
        }
        fn mailbox(&self) -> &link::Mailbox {
            &self.mailbox
        }
        fn application(&self, namespace: &str, name: &str) -> Option<Application> {
            link::lock(&self.apps).get(&(namespace.to_owned(), name.to_owned())).cloned()
        }
    }

    /// An embedded API server with namespaces `argocd`, `monitoring` and `kube-system`.
    pub(crate) struct Cluster {
        pub(crate) client: kube::Client,
        _server: apiserver::ApiServer,
        _dir: tempfile::TempDir,
    }

    impl Cluster {
        pub(crate) async fn start() -> Self {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let server = apiserver::ApiServer::start(apiserver::Config::new(dir.path())).await.expect("the API server");
            let client = server.client().await.expect("a client");
            let cluster = Self { client, _server: server, _dir: dir };
            for ns in ["argocd", "monitoring", "kube-system"] {
                let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
                let answer = send(
                    &cluster.client,
                    "POST",
                    "/api/v1/namespaces",
                    "",
                    namespace.to_string().into_bytes(),
                    Some("application/json"),
                )
                .await
                .expect("the API server answers");
                assert!(matches!(answer.status, 200 | 409), "namespace {ns}: {}", answer.body);
            }
            cluster
        }

        /// Creates `object` at `path` directly (not through the proxy).
        pub(crate) async fn create(&self, path: &str, object: Value) {
            let answer =
                send(&self.client, "POST", path, "", object.to_string().into_bytes(), Some("application/json"))
                    .await
                    .expect("the API server answers");
            assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        }
    }

    fn request(method: &str, group: &str, namespace: &str, resource: &str, name: &str) -> ResourceRequest {
        ResourceRequest {
            uuid: "u".into(),
            method: method.into(),
            group: group.into(),
            version: "v1".into(),
            namespace: namespace.into(),
            resource: resource.into(),
            name: name.into(),
            ..ResourceRequest::default()
        }
    }

    /// Runs `req` as the agent would, with Argo CD's default tracking; the code and the
    /// answer's JSON.
    async fn ask(cluster: &Cluster, agent: &TestAgent, req: &ResourceRequest) -> (u16, Value) {
        let tracking = Tracking::default();
        let judge = Judge::new(&cluster.client, &tracking, agent);
        let answer = execute(&judge, req).await;
        (answer.status, serde_json::from_str(&answer.body).expect("a JSON answer"))
    }

    fn agent() -> TestAgent {
        TestAgent::new(AgentConfig::new("http://127.0.0.1:1", "agent-1", AgentMode::Managed))
    }

    #[tokio::test]
    async fn an_instance_label_counts_only_when_it_names_an_application_of_this_agent_deploying_here() {
        let cluster = Cluster::start().await;
        let agent = agent();
        // Helm's standard label on a Secret Argo CD never deployed.
        cluster
            .create(
                "/api/v1/namespaces/monitoring/secrets",
                json!({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": "grafana-admin", "labels": {INSTANCE_LABEL: "grafana"}},
                    "data": {"password": "aHVudGVyMg=="}}),
            )
            .await;
        let read = request("GET", "", "monitoring", "secrets", "grafana-admin");
        let (code, status) = ask(&cluster, &agent, &read).await;
        assert_eq!(code, 403, "{status}");
        assert_eq!((status["kind"].as_str(), status["reason"].as_str()), (Some("Status"), Some("Forbidden")));
        let message = status["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("names Application argocd/grafana, which agent \"agent-1\" does not have"),
            "{message}"
        );

        agent.add("argocd", "grafana", json!({"server": "https://10.0.0.1:6443", "namespace": "monitoring"}));
        let (code, status) = ask(&cluster, &agent, &read).await;
        assert_eq!(code, 403, "an Application deploying elsewhere does not own it: {status}");
        assert!(status["message"].as_str().is_some_and(|m| m.contains("deploys to another cluster")), "{status}");

        agent.add("argocd", "grafana", json!({"name": "in-cluster", "namespace": "monitoring"}));
        let (code, secret) = ask(&cluster, &agent, &read).await;
        assert_eq!(code, 200, "{secret}");
        assert_eq!(secret["metadata"]["name"], "grafana-admin");
        // Apps in any namespace: `<namespace>_<name>`.
        cluster
            .create(
                "/api/v1/namespaces/monitoring/configmaps",
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "dash", "labels": {INSTANCE_LABEL: "team-a_grafana"}}}),
            )
            .await;
        let dash = request("GET", "", "monitoring", "configmaps", "dash");
        assert_eq!(ask(&cluster, &agent, &dash).await.0, 403, "team-a/grafana is not argocd/grafana");
        agent.add("team-a", "grafana", json!({"name": "in-cluster"}));
        assert_eq!(ask(&cluster, &agent, &dash).await.0, 200);
    }

    #[tokio::test]
    async fn a_tracking_annotation_must_name_the_object_itself() {
        let cluster = Cluster::start().await;
        let agent = agent();
        agent.add("argocd", "grafana", json!({"name": "in-cluster", "namespace": "monitoring"}));
        for (name, id) in
            [("borrowed", "grafana:/ConfigMap:monitoring/dashboards"), ("own", "grafana:/ConfigMap:monitoring/own")]
        {
            cluster
                .create(
                    "/api/v1/namespaces/monitoring/configmaps",
                    json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": name, "annotations": {TRACKING_ANNOTATION: id}}}),
                )
                .await;
        }
        let (code, status) = ask(&cluster, &agent, &request("GET", "", "monitoring", "configmaps", "borrowed")).await;
        assert_eq!(code, 403, "{status}");
        assert!(status["message"].as_str().is_some_and(|m| m.contains("names another object")), "{status}");
        let (code, own) = ask(&cluster, &agent, &request("GET", "", "monitoring", "configmaps", "own")).await;
        assert_eq!(code, 200, "{own}");
        // Writes follow the same rule.
        let mut patch = request("PATCH", "", "monitoring", "configmaps", "borrowed");
        patch.body = br#"{"data":{"k":"v"}}"#.to_vec();
        assert_eq!(ask(&cluster, &agent, &patch).await.0, 403);
        let delete = request("DELETE", "", "monitoring", "configmaps", "borrowed");
        assert_eq!(ask(&cluster, &agent, &delete).await.0, 403);
    }

    #[tokio::test]
    async fn a_create_needs_an_existing_application_owning_the_new_object() {
        let cluster = Cluster::start().await;
        let agent = agent();
        agent.add("argocd", "web", json!({"name": "in-cluster", "namespace": "monitoring"}));
        let pod = |name: &str, id: &str| {
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "monitoring", "annotations": {TRACKING_ANNOTATION: id}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
        };
        let mut create = request("POST", "", "monitoring", "pods", "");
        create.body = pod("ghost", "ghost:/Pod:monitoring/ghost").to_string().into_bytes();
        let (code, status) = ask(&cluster, &agent, &create).await;
        assert_eq!(code, 403, "{status}");
        assert!(status["message"].as_str().is_some_and(|m| m.contains("Application argocd/ghost")), "{status}");
        let (code, _) = ask(&cluster, &agent, &request("GET", "", "monitoring", "pods", "ghost")).await;
        assert_eq!(code, 404, "not created");

        create.body = pod("web-0", "web:/Pod:monitoring/web-0").to_string().into_bytes();
        let (code, created) = ask(&cluster, &agent, &create).await;
        assert_eq!(code, 200, "{created}");

        // The body's kind must be the path's resource: a Pod's identity cannot smuggle a Secret in.
        let mut smuggled = request("POST", "", "monitoring", "secrets", "");
        smuggled.body = pod("web-1", "web:/Pod:monitoring/web-1").to_string().into_bytes();
        let (code, status) = ask(&cluster, &agent, &smuggled).await;
        assert_eq!(code, 400, "{status}");
        assert!(status["message"].as_str().is_some_and(|m| m.contains("is not resource \"secrets\"")), "{status}");
        let mut elsewhere = request("POST", "", "kube-system", "pods", "");
        elsewhere.body = pod("web-2", "web:/Pod:monitoring/web-2").to_string().into_bytes();
        assert_eq!(ask(&cluster, &agent, &elsewhere).await.0, 400, "the body's namespace is not the path's");
    }

    #[tokio::test]
    async fn events_are_listed_only_for_managed_objects() {
        let cluster = Cluster::start().await;
        let agent = agent();
        agent.add("argocd", "web", json!({"name": "in-cluster", "namespace": "monitoring"}));
        cluster
            .create(
                "/api/v1/namespaces/monitoring/configmaps",
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "web", "annotations": {TRACKING_ANNOTATION: "web:/ConfigMap:monitoring/web"}}}),
            )
            .await;
        cluster
            .create(
                "/api/v1/namespaces/kube-system/configmaps",
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "coredns"}}),
            )
            .await;
        for (ns, name, subject) in
            [("monitoring", "web.1", "web"), ("monitoring", "other.1", "other"), ("kube-system", "dns.1", "coredns")]
        {
            cluster
                .create(
                    &format!("/api/v1/namespaces/{ns}/events"),
                    json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
                        "reason": "Synced", "message": "m",
                        "involvedObject": {"apiVersion": "v1", "kind": "ConfigMap", "namespace": ns, "name": subject}}),
                )
                .await;
        }
        let names = |list: &Value| -> Vec<String> {
            list["items"]
                .as_array()
                .map(|items| items.iter().filter_map(|e| e["metadata"]["name"].as_str().map(str::to_owned)).collect())
                .unwrap_or_default()
        };
        let (code, list) = ask(&cluster, &agent, &request("GET", "", "monitoring", "events", "")).await;
        assert_eq!(code, 200, "{list}");
        assert_eq!(names(&list), ["web.1"], "only the managed object's events");
        let (code, list) = ask(&cluster, &agent, &request("GET", "", "kube-system", "events", "")).await;
        assert_eq!(code, 200, "{list}");
        assert!(names(&list).is_empty(), "a namespace no Application manages anything in: {list}");
        let (_, list) = ask(&cluster, &agent, &request("GET", "", "", "events", "")).await;
        assert_eq!(names(&list), ["web.1"], "across namespaces too");
    }

    #[tokio::test]
    async fn a_crd_is_readable_only_when_an_application_of_this_agent_uses_its_kind() {
        let cluster = Cluster::start().await;
        let agent = agent();
        let read = request("GET", CRD_GROUP, "", "customresourcedefinitions", "applicationsets.argoproj.io");
        let (code, status) = ask(&cluster, &agent, &read).await;
        assert_eq!(code, 403, "{status}");
        assert!(status["message"].as_str().is_some_and(|m| m.contains("status.resources")), "{status}");
        agent.add("argocd", "appsets", json!({"name": "in-cluster"}));
        cluster
            .create(
                "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications",
                json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                    "metadata": {"name": "appsets"},
                    "spec": {"destination": {"name": "in-cluster"}},
                    "status": {"resources": [{"group": "argoproj.io", "version": "v1alpha1",
                        "kind": "ApplicationSet", "namespace": "argocd", "name": "all"}]}}),
            )
            .await;
        let (code, crd) = ask(&cluster, &agent, &read).await;
        assert_eq!(code, 200, "{crd}");
        let other = request("GET", CRD_GROUP, "", "customresourcedefinitions", "appprojects.argoproj.io");
        assert_eq!(ask(&cluster, &agent, &other).await.0, 403, "a kind no Application uses");
    }
}
