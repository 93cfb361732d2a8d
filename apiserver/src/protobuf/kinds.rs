//! The kinds decoded from protobuf: core/v1 Namespace, Secret, ConfigMap, Service, Event and
//! coordination.k8s.io/v1 Lease, with their JSON conversions.
//!
//! Field numbers are those of `staging/src/k8s.io/api/core/v1/generated.proto`,
//! `staging/src/k8s.io/api/coordination/v1/generated.proto` and
//! `staging/src/k8s.io/apimachinery/pkg/util/intstr/generated.proto`. JSON follows the Go types'
//! tags: `omitempty` fields are left out when empty, pointers are written whenever they were sent.

use std::collections::BTreeMap;

use serde_json::Value;

use super::meta::{Condition, ObjectMeta, Obj, Time, condition, object_meta};
use crate::error::ApiResult;

/// `core.v1.NamespaceSpec`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NamespaceSpec {
    /// `finalizers`.
    #[prost(string, repeated, tag = "1")]
    pub finalizers: Vec<String>,
}

/// `core.v1.NamespaceCondition`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NamespaceCondition {
    /// `type`.
    #[prost(string, optional, tag = "1")]
    pub r#type: Option<String>,
    /// `status`.
    #[prost(string, optional, tag = "2")]
    pub status: Option<String>,
    /// `lastTransitionTime`.
    #[prost(message, optional, tag = "4")]
    pub last_transition_time: Option<Time>,
    /// `reason`.
    #[prost(string, optional, tag = "5")]
    pub reason: Option<String>,
    /// `message`.
    #[prost(string, optional, tag = "6")]
    pub message: Option<String>,
}

/// `core.v1.NamespaceStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NamespaceStatus {
    /// `phase`.
    #[prost(string, optional, tag = "1")]
    pub phase: Option<String>,
    /// `conditions`.
    #[prost(message, repeated, tag = "2")]
    pub conditions: Vec<NamespaceCondition>,
}

/// `core.v1.Namespace`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Namespace {
    /// `metadata`.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    /// `spec`.
    #[prost(message, optional, tag = "2")]
    pub spec: Option<NamespaceSpec>,
    /// `status`.
    #[prost(message, optional, tag = "3")]
    pub status: Option<NamespaceStatus>,
}

/// `core.v1.Secret`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Secret {
    /// `metadata`.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    /// `data` (raw bytes; base64 in JSON).
    #[prost(btree_map = "string, bytes", tag = "2")]
    pub data: BTreeMap<String, Vec<u8>>,
    /// `type`.
    #[prost(string, optional, tag = "3")]
    pub r#type: Option<String>,
    /// `stringData`.
    #[prost(btree_map = "string, string", tag = "4")]
    pub string_data: BTreeMap<String, String>,
    /// `immutable`.
    #[prost(bool, optional, tag = "5")]
    pub immutable: Option<bool>,
}

/// `core.v1.ConfigMap`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ConfigMap {
    /// `metadata`.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    /// `data`.
    #[prost(btree_map = "string, string", tag = "2")]
    pub data: BTreeMap<String, String>,
    /// `binaryData` (raw bytes; base64 in JSON).
    #[prost(btree_map = "string, bytes", tag = "3")]
    pub binary_data: BTreeMap<String, Vec<u8>>,
    /// `immutable`.
    #[prost(bool, optional, tag = "4")]
    pub immutable: Option<bool>,
}

/// `util.intstr.IntOrString`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IntOrString {
    /// 0 for an int, 1 for a string.
    #[prost(int64, optional, tag = "1")]
    pub r#type: Option<i64>,
    /// `intVal`.
    #[prost(int32, optional, tag = "2")]
    pub int_val: Option<i32>,
    /// `strVal`.
    #[prost(string, optional, tag = "3")]
    pub str_val: Option<String>,
}

/// `core.v1.ServicePort`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ServicePort {
    /// `name`.
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// `protocol`.
    #[prost(string, optional, tag = "2")]
    pub protocol: Option<String>,
    /// `port`.
    #[prost(int32, optional, tag = "3")]
    pub port: Option<i32>,
    /// `targetPort`.
    #[prost(message, optional, tag = "4")]
    pub target_port: Option<IntOrString>,
    /// `nodePort`.
    #[prost(int32, optional, tag = "5")]
    pub node_port: Option<i32>,
    /// `appProtocol`.
    #[prost(string, optional, tag = "6")]
    pub app_protocol: Option<String>,
}

/// `core.v1.ClientIPConfig`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ClientIpConfig {
    /// `timeoutSeconds`.
    #[prost(int32, optional, tag = "1")]
    pub timeout_seconds: Option<i32>,
}

/// `core.v1.SessionAffinityConfig`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SessionAffinityConfig {
    /// `clientIP`.
    #[prost(message, optional, tag = "1")]
    pub client_ip: Option<ClientIpConfig>,
}

/// `core.v1.ServiceSpec`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ServiceSpec {
    /// `ports`.
    #[prost(message, repeated, tag = "1")]
    pub ports: Vec<ServicePort>,
    /// `selector`.
    #[prost(btree_map = "string, string", tag = "2")]
    pub selector: BTreeMap<String, String>,
    /// `clusterIP`.
    #[prost(string, optional, tag = "3")]
    pub cluster_ip: Option<String>,
    /// `type`.
    #[prost(string, optional, tag = "4")]
    pub r#type: Option<String>,
    /// `externalIPs`.
    #[prost(string, repeated, tag = "5")]
    pub external_ips: Vec<String>,
    /// `sessionAffinity`.
    #[prost(string, optional, tag = "7")]
    pub session_affinity: Option<String>,
    /// `loadBalancerIP`.
    #[prost(string, optional, tag = "8")]
    pub load_balancer_ip: Option<String>,
    /// `loadBalancerSourceRanges`.
    #[prost(string, repeated, tag = "9")]
    pub load_balancer_source_ranges: Vec<String>,
    /// `externalName`.
    #[prost(string, optional, tag = "10")]
    pub external_name: Option<String>,
    /// `externalTrafficPolicy`.
    #[prost(string, optional, tag = "11")]
    pub external_traffic_policy: Option<String>,
    /// `healthCheckNodePort`.
    #[prost(int32, optional, tag = "12")]
    pub health_check_node_port: Option<i32>,
    /// `publishNotReadyAddresses`.
    #[prost(bool, optional, tag = "13")]
    pub publish_not_ready_addresses: Option<bool>,
    /// `sessionAffinityConfig`.
    #[prost(message, optional, tag = "14")]
    pub session_affinity_config: Option<SessionAffinityConfig>,
    /// `ipFamilyPolicy`.
    #[prost(string, optional, tag = "17")]
    pub ip_family_policy: Option<String>,
    /// `clusterIPs`.
    #[prost(string, repeated, tag = "18")]
    pub cluster_ips: Vec<String>,
    /// `ipFamilies`.
    #[prost(string, repeated, tag = "19")]
    pub ip_families: Vec<String>,
    /// `allocateLoadBalancerNodePorts`.
    #[prost(bool, optional, tag = "20")]
    pub allocate_load_balancer_node_ports: Option<bool>,
    /// `loadBalancerClass`.
    #[prost(string, optional, tag = "21")]
    pub load_balancer_class: Option<String>,
    /// `internalTrafficPolicy`.
    #[prost(string, optional, tag = "22")]
    pub internal_traffic_policy: Option<String>,
    /// `trafficDistribution`.
    #[prost(string, optional, tag = "23")]
    pub traffic_distribution: Option<String>,
}

/// `core.v1.PortStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PortStatus {
    /// `port`.
    #[prost(int32, optional, tag = "1")]
    pub port: Option<i32>,
    /// `protocol`.
    #[prost(string, optional, tag = "2")]
    pub protocol: Option<String>,
    /// `error`.
    #[prost(string, optional, tag = "3")]
    pub error: Option<String>,
}

/// `core.v1.LoadBalancerIngress`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LoadBalancerIngress {
    /// `ip`.
    #[prost(string, optional, tag = "1")]
    pub ip: Option<String>,
    /// `hostname`.
    #[prost(string, optional, tag = "2")]
    pub hostname: Option<String>,
    /// `ipMode`.
    #[prost(string, optional, tag = "3")]
    pub ip_mode: Option<String>,
    /// `ports`.
    #[prost(message, repeated, tag = "4")]
    pub ports: Vec<PortStatus>,
}

/// `core.v1.LoadBalancerStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LoadBalancerStatus {
    /// `ingress`.
    #[prost(message, repeated, tag = "1")]
    pub ingress: Vec<LoadBalancerIngress>,
}

/// `core.v1.ServiceStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ServiceStatus {
    /// `loadBalancer`.
    #[prost(message, optional, tag = "1")]
    pub load_balancer: Option<LoadBalancerStatus>,
    /// `conditions`.
    #[prost(message, repeated, tag = "2")]
    pub conditions: Vec<Condition>,
}

/// `core.v1.Service`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Service {
    /// `metadata`.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    /// `spec`.
    #[prost(message, optional, tag = "2")]
    pub spec: Option<ServiceSpec>,
    /// `status`.
    #[prost(message, optional, tag = "3")]
    pub status: Option<ServiceStatus>,
}

/// `core.v1.ObjectReference`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ObjectReference {
    /// `kind`.
    #[prost(string, optional, tag = "1")]
    pub kind: Option<String>,
    /// `namespace`.
    #[prost(string, optional, tag = "2")]
    pub namespace: Option<String>,
    /// `name`.
    #[prost(string, optional, tag = "3")]
    pub name: Option<String>,
    /// `uid`.
    #[prost(string, optional, tag = "4")]
    pub uid: Option<String>,
    /// `apiVersion`.
    #[prost(string, optional, tag = "5")]
    pub api_version: Option<String>,
    /// `resourceVersion`.
    #[prost(string, optional, tag = "6")]
    pub resource_version: Option<String>,
    /// `fieldPath`.
    #[prost(string, optional, tag = "7")]
    pub field_path: Option<String>,
}

/// `core.v1.EventSource`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EventSource {
    /// `component`.
    #[prost(string, optional, tag = "1")]
    pub component: Option<String>,
    /// `host`.
    #[prost(string, optional, tag = "2")]
    pub host: Option<String>,
}

/// `core.v1.EventSeries`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EventSeries {
    /// `count`.
    #[prost(int32, optional, tag = "1")]
    pub count: Option<i32>,
    /// `lastObservedTime` (a MicroTime).
    #[prost(message, optional, tag = "2")]
    pub last_observed_time: Option<Time>,
}

/// `core.v1.Event`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// `metadata`.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    /// `involvedObject`.
    #[prost(message, optional, tag = "2")]
    pub involved_object: Option<ObjectReference>,
    /// `reason`.
    #[prost(string, optional, tag = "3")]
    pub reason: Option<String>,
    /// `message`.
    #[prost(string, optional, tag = "4")]
    pub message: Option<String>,
    /// `source`.
    #[prost(message, optional, tag = "5")]
    pub source: Option<EventSource>,
    /// `firstTimestamp`.
    #[prost(message, optional, tag = "6")]
    pub first_timestamp: Option<Time>,
    /// `lastTimestamp`.
    #[prost(message, optional, tag = "7")]
    pub last_timestamp: Option<Time>,
    /// `count`.
    #[prost(int32, optional, tag = "8")]
    pub count: Option<i32>,
    /// `type`.
    #[prost(string, optional, tag = "9")]
    pub r#type: Option<String>,
    /// `eventTime` (a MicroTime).
    #[prost(message, optional, tag = "10")]
    pub event_time: Option<Time>,
    /// `series`.
    #[prost(message, optional, tag = "11")]
    pub series: Option<EventSeries>,
    /// `action`.
    #[prost(string, optional, tag = "12")]
    pub action: Option<String>,
    /// `related`.
    #[prost(message, optional, tag = "13")]
    pub related: Option<ObjectReference>,
    /// `reportingComponent`.
    #[prost(string, optional, tag = "14")]
    pub reporting_component: Option<String>,
    /// `reportingInstance`.
    #[prost(string, optional, tag = "15")]
    pub reporting_instance: Option<String>,
}

/// `coordination.v1.LeaseSpec`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseSpec {
    /// `holderIdentity`.
    #[prost(string, optional, tag = "1")]
    pub holder_identity: Option<String>,
    /// `leaseDurationSeconds`.
    #[prost(int32, optional, tag = "2")]
    pub lease_duration_seconds: Option<i32>,
    /// `acquireTime` (a MicroTime).
    #[prost(message, optional, tag = "3")]
    pub acquire_time: Option<Time>,
    /// `renewTime` (a MicroTime).
    #[prost(message, optional, tag = "4")]
    pub renew_time: Option<Time>,
    /// `leaseTransitions`.
    #[prost(int32, optional, tag = "5")]
    pub lease_transitions: Option<i32>,
    /// `strategy`.
    #[prost(string, optional, tag = "6")]
    pub strategy: Option<String>,
    /// `preferredHolder`.
    #[prost(string, optional, tag = "7")]
    pub preferred_holder: Option<String>,
}

/// `coordination.v1.Lease`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Lease {
    /// `metadata`.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    /// `spec`.
    #[prost(message, optional, tag = "2")]
    pub spec: Option<LeaseSpec>,
}

/// The top of every object: apiVersion, kind, metadata (always an object, as the JSON path expects).
fn top(api_version: &str, kind: &str, meta: Option<&ObjectMeta>) -> ApiResult<Obj> {
    let mut o = Obj::new();
    o.set("apiVersion", Value::from(api_version)).set("kind", Value::from(kind));
    let meta = match meta {
        Some(m) => object_meta(m)?,
        None => Value::Object(serde_json::Map::new()),
    };
    o.set("metadata", meta);
    Ok(o)
}

fn i(v: Option<i32>) -> Option<i64> {
    v.map(i64::from)
}

/// Namespace as JSON.
///
/// # Errors
/// 400 for an invalid timestamp.
pub fn namespace_json(ns: &Namespace, api_version: &str, kind: &str) -> ApiResult<Value> {
    let mut o = top(api_version, kind, ns.metadata.as_ref())?;
    o.msg("spec", ns.spec.as_ref(), |s| {
        let mut o = Obj::new();
        o.strs("finalizers", &s.finalizers);
        Ok(o.build())
    })?;
    o.msg("status", ns.status.as_ref(), |s| {
        let mut o = Obj::new();
        o.str("phase", &s.phase).msgs("conditions", &s.conditions, |c| {
            let mut o = Obj::new();
            o.req_str("type", &c.r#type).req_str("status", &c.status);
            o.time("lastTransitionTime", c.last_transition_time.as_ref(), "status.conditions", false)?
                .str("reason", &c.reason)
                .str("message", &c.message);
            Ok(o.build())
        })?;
        Ok(o.build())
    })?;
    Ok(o.build())
}

/// Secret as JSON: `data` values become base64 strings.
///
/// # Errors
/// 400 for an invalid timestamp.
pub fn secret_json(s: &Secret, api_version: &str, kind: &str) -> ApiResult<Value> {
    let mut o = top(api_version, kind, s.metadata.as_ref())?;
    o.ptr_bool("immutable", s.immutable)
        .bytes_map("data", &s.data)
        .str_map("stringData", &s.string_data)
        .str("type", &s.r#type);
    Ok(o.build())
}

/// ConfigMap as JSON: `binaryData` values become base64 strings.
///
/// # Errors
/// 400 for an invalid timestamp.
pub fn config_map_json(c: &ConfigMap, api_version: &str, kind: &str) -> ApiResult<Value> {
    let mut o = top(api_version, kind, c.metadata.as_ref())?;
    o.ptr_bool("immutable", c.immutable).str_map("data", &c.data).bytes_map("binaryData", &c.binary_data);
    Ok(o.build())
}

fn int_or_string(v: &IntOrString) -> Value {
    if v.r#type == Some(1) {
        Value::from(v.str_val.clone().unwrap_or_default())
    } else {
        Value::from(v.int_val.unwrap_or_default())
    }
}

fn service_spec(s: &ServiceSpec) -> ApiResult<Value> {
    let mut o = Obj::new();
    o.msgs("ports", &s.ports, |p| {
        let mut o = Obj::new();
        o.str("name", &p.name)
            .str("protocol", &p.protocol)
            .ptr_str("appProtocol", &p.app_protocol)
            .req_int("port", i(p.port));
        if let Some(t) = &p.target_port {
            o.set("targetPort", int_or_string(t));
        }
        o.int("nodePort", i(p.node_port));
        Ok(o.build())
    })?
    .str_map("selector", &s.selector)
    .str("clusterIP", &s.cluster_ip)
    .strs("clusterIPs", &s.cluster_ips)
    .str("type", &s.r#type)
    .strs("externalIPs", &s.external_ips)
    .str("sessionAffinity", &s.session_affinity)
    .str("loadBalancerIP", &s.load_balancer_ip)
    .strs("loadBalancerSourceRanges", &s.load_balancer_source_ranges)
    .str("externalName", &s.external_name)
    .str("externalTrafficPolicy", &s.external_traffic_policy)
    .int("healthCheckNodePort", i(s.health_check_node_port))
    .bool("publishNotReadyAddresses", s.publish_not_ready_addresses)
    .msg("sessionAffinityConfig", s.session_affinity_config.as_ref(), |c| {
        let mut o = Obj::new();
        o.msg("clientIP", c.client_ip.as_ref(), |ip| {
            let mut o = Obj::new();
            o.ptr_int("timeoutSeconds", i(ip.timeout_seconds));
            Ok(o.build())
        })?;
        Ok(o.build())
    })?
    .strs("ipFamilies", &s.ip_families)
    .ptr_str("ipFamilyPolicy", &s.ip_family_policy)
    .ptr_bool("allocateLoadBalancerNodePorts", s.allocate_load_balancer_node_ports)
    .ptr_str("loadBalancerClass", &s.load_balancer_class)
    .ptr_str("internalTrafficPolicy", &s.internal_traffic_policy)
    .ptr_str("trafficDistribution", &s.traffic_distribution);
    Ok(o.build())
}

fn service_status(s: &ServiceStatus) -> ApiResult<Value> {
    let mut o = Obj::new();
    o.msg("loadBalancer", s.load_balancer.as_ref(), |lb| {
        let mut o = Obj::new();
        o.msgs("ingress", &lb.ingress, |ing| {
            let mut o = Obj::new();
            o.str("ip", &ing.ip).str("hostname", &ing.hostname).ptr_str("ipMode", &ing.ip_mode).msgs(
                "ports",
                &ing.ports,
                |p| {
                    let mut o = Obj::new();
                    o.req_int("port", i(p.port)).req_str("protocol", &p.protocol).ptr_str("error", &p.error);
                    Ok(o.build())
                },
            )?;
            Ok(o.build())
        })?;
        Ok(o.build())
    })?
    .msgs("conditions", &s.conditions, |c| condition(c, "status.conditions"))?;
    Ok(o.build())
}

/// Service as JSON.
///
/// # Errors
/// 400 for an invalid timestamp.
pub fn service_json(s: &Service, api_version: &str, kind: &str) -> ApiResult<Value> {
    let mut o = top(api_version, kind, s.metadata.as_ref())?;
    o.msg("spec", s.spec.as_ref(), service_spec)?.msg("status", s.status.as_ref(), service_status)?;
    Ok(o.build())
}

fn object_reference(r: &ObjectReference) -> ApiResult<Value> {
    let mut o = Obj::new();
    o.str("kind", &r.kind)
        .str("namespace", &r.namespace)
        .str("name", &r.name)
        .str("uid", &r.uid)
        .str("apiVersion", &r.api_version)
        .str("resourceVersion", &r.resource_version)
        .str("fieldPath", &r.field_path);
    Ok(o.build())
}

/// Event (core/v1) as JSON.
///
/// # Errors
/// 400 for an invalid timestamp.
pub fn event_json(e: &Event, api_version: &str, kind: &str) -> ApiResult<Value> {
    let mut o = top(api_version, kind, e.metadata.as_ref())?;
    o.msg("involvedObject", e.involved_object.as_ref(), object_reference)?
        .str("reason", &e.reason)
        .str("message", &e.message)
        .msg("source", e.source.as_ref(), |s| {
            let mut o = Obj::new();
            o.str("component", &s.component).str("host", &s.host);
            Ok(o.build())
        })?
        .time("firstTimestamp", e.first_timestamp.as_ref(), "firstTimestamp", false)?
        .time("lastTimestamp", e.last_timestamp.as_ref(), "lastTimestamp", false)?
        .int("count", i(e.count))
        .str("type", &e.r#type)
        .time("eventTime", e.event_time.as_ref(), "eventTime", true)?
        .msg("series", e.series.as_ref(), |s| {
            let mut o = Obj::new();
            o.req_int("count", i(s.count));
            o.time("lastObservedTime", s.last_observed_time.as_ref(), "series.lastObservedTime", true)?;
            Ok(o.build())
        })?
        .str("action", &e.action)
        .msg("related", e.related.as_ref(), object_reference)?
        .req_str("reportingComponent", &e.reporting_component)
        .req_str("reportingInstance", &e.reporting_instance);
    Ok(o.build())
}

/// Lease as JSON.
///
/// # Errors
/// 400 for an invalid timestamp.
pub fn lease_json(l: &Lease, api_version: &str, kind: &str) -> ApiResult<Value> {
    let mut o = top(api_version, kind, l.metadata.as_ref())?;
    o.msg("spec", l.spec.as_ref(), |s| {
        let mut o = Obj::new();
        o.ptr_str("holderIdentity", &s.holder_identity).ptr_int("leaseDurationSeconds", i(s.lease_duration_seconds));
        o.time("acquireTime", s.acquire_time.as_ref(), "spec.acquireTime", true)?
            .time("renewTime", s.renew_time.as_ref(), "spec.renewTime", true)?
            .ptr_int("leaseTransitions", i(s.lease_transitions))
            .ptr_str("strategy", &s.strategy)
            .ptr_str("preferredHolder", &s.preferred_holder);
        Ok(o.build())
    })?;
    Ok(o.build())
}
