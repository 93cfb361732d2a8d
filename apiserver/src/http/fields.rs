//! Which fields a field selector may name for each kind, and what each reads on an object: the
//! field label conversions and `ToSelectableFields` of kube-apiserver (`pkg/apis/core/v1/conversion.go`,
//! `pkg/registry/core/*/strategy.go`, apimachinery's `DefaultMetaV1FieldSelectorConversion` and
//! apiextensions' conversion for custom resources), so that clients such as Argo CD's Events tab
//! (`involvedObject.*` on Events) get what they would from a real cluster.

use std::borrow::Cow;

use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::resource::ResourceType;
use crate::selector::FieldSelector;

const META: &[&str] = &["metadata.name", "metadata.namespace"];
const POD: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.podIPs",
    "status.nominatedNodeName",
    // Old v1 clients' name for spec.nodeName.
    "spec.host",
];
const EVENT: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
    "metadata.namespace",
    "metadata.name",
];
const NAMESPACE: &[&str] = &["status.phase", "metadata.name"];
const SECRET: &[&str] = &["type", "metadata.namespace", "metadata.name"];
const SERVICE: &[&str] = &["metadata.namespace", "metadata.name", "spec.clusterIP", "spec.type"];
const CLUSTER_CUSTOM: &[&str] = &["metadata.name"];

/// The selectable fields of one kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Selectable {
    /// Built-in kinds without a conversion of their own (ConfigMap, Lease, CRD): name and
    /// namespace, with apimachinery's message for anything else.
    #[default]
    Meta,
    /// Custom resources: name, and namespace when namespaced.
    Custom {
        namespaced: bool,
    },
    Pod,
    Event,
    Namespace,
    Secret,
    Service,
}

impl Selectable {
    /// The selectable fields of a served type.
    pub(crate) fn of(rtype: &ResourceType) -> Self {
        match (rtype.group.as_str(), rtype.kind.as_str()) {
            ("", "Pod") => Self::Pod,
            ("", "Event") => Self::Event,
            ("", "Namespace") => Self::Namespace,
            ("", "Secret") => Self::Secret,
            ("", "Service") => Self::Service,
            ("", _) | ("coordination.k8s.io", "Lease") | ("apiextensions.k8s.io", "CustomResourceDefinition") => {
                Self::Meta
            }
            _ => Self::Custom { namespaced: rtype.namespaced },
        }
    }

    fn fields(self) -> &'static [&'static str] {
        match self {
            Self::Meta | Self::Custom { namespaced: true } => META,
            Self::Custom { namespaced: false } => CLUSTER_CUSTOM,
            Self::Pod => POD,
            Self::Event => EVENT,
            Self::Namespace => NAMESPACE,
            Self::Secret => SECRET,
            Self::Service => SERVICE,
        }
    }

    /// Refuse a selector naming a field this kind cannot select on, with kube-apiserver's 400.
    pub(crate) fn check(self, selector: &FieldSelector) -> ApiResult<()> {
        let Some(field) = selector.unsupported_field(self.fields()) else { return Ok(()) };
        Err(ApiError::bad_request(match self {
            Self::Meta => {
                format!("{field:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\"")
            }
            _ => format!("field label not supported: {field}"),
        }))
    }

    /// Whether the object passes the selector (missing fields read as `""`).
    pub(crate) fn matches(self, selector: &FieldSelector, obj: &Value) -> bool {
        selector.matches_with(|field| self.value(obj, field))
    }

    /// The value a selectable field has on an object, as kube-apiserver's `ToSelectableFields`.
    fn value<'v>(self, obj: &'v Value, field: &str) -> Cow<'v, str> {
        match (self, field) {
            (Self::Pod, "spec.host") => text(obj, "spec.nodeName"),
            (Self::Pod, "spec.hostNetwork") => {
                Cow::Borrowed(if obj.pointer("/spec/hostNetwork") == Some(&Value::Bool(true)) {
                    "true"
                } else {
                    "false"
                })
            }
            (Self::Pod, "status.podIP") => match obj.pointer("/status/podIPs/0/ip").and_then(Value::as_str) {
                Some(ip) => Cow::Borrowed(ip),
                None => text(obj, "status.podIP"),
            },
            // Accepted by the conversion but not in the pod's field set: reads as empty.
            (Self::Pod, "status.podIPs") => Cow::Borrowed(""),
            (Self::Event, "source") => match text(obj, "source.component") {
                c if c.is_empty() => text(obj, "reportingComponent"),
                c => c,
            },
            (Self::Namespace | Self::Custom { namespaced: false }, "metadata.namespace") => Cow::Borrowed(""),
            _ => text(obj, field),
        }
    }
}

/// A dotted path's string (or boolean / number, as text) on the object, `""` when missing.
fn text<'v>(obj: &'v Value, path: &str) -> Cow<'v, str> {
    let mut v = obj;
    for part in path.split('.') {
        match v.get(part) {
            Some(next) => v = next,
            None => return Cow::Borrowed(""),
        }
    }
    match v {
        Value::String(s) => Cow::Borrowed(s),
        Value::Bool(b) => Cow::Owned(b.to_string()),
        Value::Number(n) => Cow::Owned(n.to_string()),
        _ => Cow::Borrowed(""),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sel(s: &str) -> FieldSelector {
        FieldSelector::parse_any_field(s).unwrap()
    }

    #[test]
    fn events_select_on_the_involved_object() {
        let ev = json!({
            "metadata": {"name": "web.1", "namespace": "prod"},
            "involvedObject": {"kind": "Pod", "name": "web", "namespace": "prod", "uid": "u-1", "apiVersion": "v1"},
            "reason": "Pulled", "type": "Normal", "reportingComponent": "kubelet",
        });
        let e = Selectable::Event;
        for ok in [
            "involvedObject.name=web,involvedObject.namespace=prod,involvedObject.uid=u-1",
            "involvedObject.kind==Pod,involvedObject.apiVersion=v1",
            "involvedObject.fieldPath=,involvedObject.resourceVersion=",
            "reason=Pulled,type!=Warning,source=kubelet,reportingComponent=kubelet",
            "metadata.name=web.1",
        ] {
            e.check(&sel(ok)).unwrap();
            assert!(e.matches(&sel(ok), &ev), "{ok}");
        }
        assert!(!e.matches(&sel("involvedObject.name!=web"), &ev));
        let mut with_source = ev.clone();
        with_source["source"] = json!({"component": "scheduler"});
        assert!(e.matches(&sel("source=scheduler"), &with_source));
        let err = e.check(&sel("involvedObject.nope=x")).unwrap_err();
        assert_eq!(err, ApiError::bad_request("field label not supported: involvedObject.nope"));
    }

    #[test]
    fn each_kind_has_its_own_fields_and_message() {
        let meta = Selectable::Meta.check(&sel("spec.nodeName=x")).unwrap_err();
        assert_eq!(
            meta.message,
            r#""spec.nodeName" is not a known field selector: only "metadata.name", "metadata.namespace""#
        );
        Selectable::Pod.check(&sel("spec.nodeName=n1,status.phase=Running")).unwrap();
        Selectable::Secret.check(&sel("type=Opaque")).unwrap();
        assert!(Selectable::Namespace.check(&sel("metadata.namespace=x")).is_err());
        assert!(Selectable::Custom { namespaced: false }.check(&sel("metadata.namespace=")).is_err());
        Selectable::Custom { namespaced: true }.check(&sel("metadata.namespace=x")).unwrap();
        let pod = json!({"spec": {"nodeName": "n1"}, "status": {"podIPs": [{"ip": "10.0.0.1"}]}});
        assert!(Selectable::Pod.matches(&sel("spec.host=n1,spec.hostNetwork=false,status.podIP=10.0.0.1"), &pod));
    }
}
