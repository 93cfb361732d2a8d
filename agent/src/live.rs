//! Resource-proxy requests from the principal, executed against this cluster with the agent's
//! own credentials (upstream §5.1, `agent/resource.go`).
//!
//! What may be read and changed, the same rules as upstream's agent except where noted:
//! * **read** one object only if it is *managed*: it carries Argo CD's tracking annotation
//!   (`argocd.argoproj.io/tracking-id`) or instance label (`app.kubernetes.io/instance`), or an
//!   owner chain of at most 5 links leads to one; its subresources likewise. CRDs are readable
//!   without the check (Argo CD never tracks them, upstream #873);
//! * **list** only `events`, and discovery (`/apis`, `/apis/<group>`, `/api/v1`,
//!   `/apis/<group>/<version>`; upstream cannot serve `/apis/<group>`, #1001);
//! * **create** only an object that is managed by its own metadata or whose owner is (Argo CD's
//!   "create job from cronjob" action); upstream creates anything;
//! * **patch** and **delete** only managed objects; post to a subresource of a managed object.
//!
//! Requests run concurrently (bounded), never on the receive loop: a slow API call does not
//! hold up the principal's other events (upstream runs them on its single receive loop). Each
//! request is executed once even if the principal resends it, and every answer, error included,
//! carries the API server's `Status` body, so the hub's Argo CD shows the reason.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt as _;
use protocol::payload::{ApiResource, QUERY_PARAMS, ResourceRequest, ResourceResponse, status_body};
use protocol::{Event, EventType, Payload, Target};

use crate::error::InboundError;
use crate::host::Host;

/// Requests executed at once; more wait for a slot.
const CONCURRENT: usize = 16;
/// How long one request may take against this cluster before it is answered 504.
const TIMEOUT: Duration = Duration::from_secs(20);
/// How many owner links are followed to find a managed object (upstream's limit).
const OWNER_DEPTH: usize = 5;
/// Argo CD's tracking annotation (annotation-based tracking, the default since 3.0).
const TRACKING_ANNOTATION: &str = "argocd.argoproj.io/tracking-id";
/// Argo CD's default instance label (label-based tracking).
const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// Argo CD's settings ConfigMap, which names another instance label
/// (`application.instanceLabelKey`).
const ARGOCD_CM: &str = "argocd-cm";
/// How long the instance label read from `argocd-cm` is used before it is read again.
const SETTINGS_TTL: Duration = Duration::from_secs(60);

/// The agent's side of the resource proxy.
pub(crate) struct Live {
    client: kube::Client,
    /// Where Argo CD's `argocd-cm` is (the agent's namespace).
    namespace: String,
    slots: Arc<tokio::sync::Semaphore>,
    seen: Mutex<crate::recent::RecentIds>,
    /// The instance label of label-based tracking, and when it was read.
    instance_label: Mutex<Option<(std::time::Instant, Arc<str>)>>,
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
            instance_label: Mutex::default(),
        }
    }

    /// The label Argo CD tracks resources by in label-based tracking: `argocd-cm`'s
    /// `application.instanceLabelKey` in the agent's namespace, else Argo CD's default
    /// (`app.kubernetes.io/instance`; also when `argocd-cm` cannot be read). Read at most once
    /// a minute.
    async fn instance_label(&self) -> Arc<str> {
        if let Some((at, label)) = link::lock(&self.instance_label).as_ref()
            && at.elapsed() < SETTINGS_TTL
        {
            return label.clone();
        }
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(self.client.clone(), &self.namespace);
        let read = tokio::time::timeout(TIMEOUT, api.get_opt(ARGOCD_CM)).await;
        let label: Arc<str> = match read {
            Ok(Ok(cm)) => Arc::from(instance_label_of(cm.as_ref())),
            Ok(Err(error)) => {
                tracing::debug!(%error, "cannot read argocd-cm; Argo CD's default instance label applies");
                Arc::from(INSTANCE_LABEL)
            }
            Err(_) => Arc::from(INSTANCE_LABEL),
        };
        *link::lock(&self.instance_label) = Some((std::time::Instant::now(), label.clone()));
        label
    }

    /// Whether request `uuid` arrives for the first time (remembering it).
    fn first_time(&self, uuid: &str) -> bool {
        link::lock(&self.seen).first_time(uuid)
    }

    /// The client for this cluster (the agent's own credentials).
    pub(crate) fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Whether pod `namespace/name` is *managed* by the rules reads follow (tracked, or an
    /// owner chain to a tracked object): `Ok`, or the HTTP code and `Status` body refusing it
    /// (404 and the like as the API server gave them). For terminals ([`crate::terminal`]).
    pub(crate) async fn managed_pod(&self, namespace: &str, name: &str) -> Result<(), (u16, String)> {
        let req = ResourceRequest {
            version: "v1".to_owned(),
            namespace: namespace.to_owned(),
            resource: "pods".to_owned(),
            name: name.to_owned(),
            subresource: "exec".to_owned(),
            ..ResourceRequest::default()
        };
        let label = self.instance_label().await;
        let found =
            tokio::time::timeout(TIMEOUT, managed_parent(&self.client, &label, &req, &ApiResource::of(&req))).await;
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
            let label = live.instance_label().await;
            match tokio::time::timeout(TIMEOUT, execute(&live.client, &label, &req)).await {
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

async fn execute(client: &kube::Client, label: &str, req: &ResourceRequest) -> Answer {
    match run(client, label, req).await {
        Ok(answer) => answer,
        Err(error) => Answer::failure(503, &format!("cannot reach this cluster's API server: {error}")),
    }
}

async fn run(client: &kube::Client, label: &str, req: &ResourceRequest) -> Result<Answer, kube::Error> {
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
            send(client, "GET", &path, &query, Vec::new(), None).await
        }
        "GET" if req.group == "apiextensions.k8s.io" && req.resource == "customresourcedefinitions" => {
            send(client, "GET", &path, &query, Vec::new(), None).await
        }
        "GET" => {
            let parent = match managed_parent(client, label, req, &target).await? {
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
            let Ok(object) = serde_json::from_slice::<serde_json::Value>(&req.body) else {
                return Ok(Answer::failure(400, "the body of a create is not a JSON object"));
            };
            if !tracked(&object, label)
                && !owner_managed(client, label, &object, req.namespace.as_str(), OWNER_DEPTH).await?
            {
                return Ok(Answer::forbidden(
                    req,
                    "only an object tracked by an Argo CD Application, or owned by one it tracks, can be created",
                ));
            }
            send(client, "POST", &path, &query, req.body.clone(), Some("application/json")).await
        }
        "POST" | "PATCH" | "DELETE" => {
            if let Err(refusal) = managed_parent(client, label, req, &target).await? {
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
    client: &kube::Client,
    label: &str,
    req: &ResourceRequest,
    target: &ApiResource,
) -> Result<Result<Answer, Answer>, kube::Error> {
    let parent = ApiResource { subresource: String::new(), ..target.clone() };
    let path = match parent.path() {
        Ok(p) => p,
        Err(e) => return Ok(Err(Answer::failure(400, &e.to_string()))),
    };
    let answer = send(client, "GET", &path, "", Vec::new(), None).await?;
    if answer.status != 200 {
        return Ok(Err(answer));
    }
    let Ok(object) = serde_json::from_str::<serde_json::Value>(&answer.body) else {
        return Ok(Err(Answer::failure(502, "the API server's answer is not JSON")));
    };
    if tracked(&object, label) || owner_managed(client, label, &object, &req.namespace, OWNER_DEPTH).await? {
        return Ok(Ok(answer));
    }
    Ok(Err(Answer::forbidden(
        req,
        "not managed by an Argo CD Application on this cluster (no tracking annotation or label, nor an owner that has one)",
    )))
}

/// Whether `object` carries Argo CD's tracking annotation or instance label `label`.
fn tracked(object: &serde_json::Value, label: &str) -> bool {
    let meta = &object["metadata"];
    meta["annotations"].get(TRACKING_ANNOTATION).is_some() || meta["labels"].get(label).is_some()
}

/// The instance label `argocd-cm` names (`application.instanceLabelKey`), or Argo CD's default.
fn instance_label_of(cm: Option<&k8s_openapi::api::core::v1::ConfigMap>) -> &str {
    cm.and_then(|cm| cm.data.as_ref())
        .and_then(|d| d.get("application.instanceLabelKey"))
        .map(|k| k.trim())
        .filter(|k| !k.is_empty())
        .unwrap_or(INSTANCE_LABEL)
}

/// Whether an owner of `object` (within `depth` links) is tracked.
async fn owner_managed(
    client: &kube::Client,
    label: &str,
    object: &serde_json::Value,
    namespace: &str,
    depth: usize,
) -> Result<bool, kube::Error> {
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
        let Some((plural, namespaced)) = resolve(client, api_version, kind).await? else {
            continue;
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
        let Ok(path) = target.path() else { continue };
        let answer = send(client, "GET", &path, "", Vec::new(), None).await?;
        if answer.status != 200 {
            continue;
        }
        let Ok(parent) = serde_json::from_str::<serde_json::Value>(&answer.body) else { continue };
        if tracked(&parent, label) || Box::pin(owner_managed(client, label, &parent, namespace, depth - 1)).await? {
            return Ok(true);
        }
    }
    Ok(false)
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
mod tests {
    use super::*;

    #[test]
    fn tracking_is_the_annotation_or_the_instance_label() {
        assert!(tracked(
            &serde_json::json!({"metadata":{"annotations":{TRACKING_ANNOTATION:"gb:apps/Deployment:gb/ui"}}}),
            INSTANCE_LABEL
        ));
        assert!(tracked(&serde_json::json!({"metadata":{"labels":{INSTANCE_LABEL:"gb"}}}), INSTANCE_LABEL));
        assert!(!tracked(&serde_json::json!({"metadata":{"labels":{"app":"gb"}}}), INSTANCE_LABEL));
        assert!(tracked(&serde_json::json!({"metadata":{"labels":{"app":"gb"}}}), "app"), "a custom instance label");
        assert!(!tracked(&serde_json::json!({"kind":"Pod"}), INSTANCE_LABEL));
        let cm = |data: serde_json::Value| -> k8s_openapi::api::core::v1::ConfigMap {
            serde_json::from_value(serde_json::json!({"metadata": {"name": ARGOCD_CM}, "data": data}))
                .expect("a ConfigMap")
        };
        assert_eq!(
            instance_label_of(Some(&cm(
                serde_json::json!({"application.instanceLabelKey": "argocd.argoproj.io/instance"})
            ))),
            "argocd.argoproj.io/instance"
        );
        assert_eq!(
            instance_label_of(Some(&cm(serde_json::json!({"application.instanceLabelKey": " "})))),
            INSTANCE_LABEL
        );
        assert_eq!(instance_label_of(Some(&cm(serde_json::json!({})))), INSTANCE_LABEL);
        assert_eq!(instance_label_of(None), INSTANCE_LABEL);
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
}
