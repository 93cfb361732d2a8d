//! core/v1 Service (`staging/src/k8s.io/api/core/v1/generated.proto`) and `intstr.IntOrString`
//! (`staging/src/k8s.io/apimachinery/pkg/util/intstr/generated.proto`).

use std::collections::BTreeMap;

use serde_json::Value;

use super::meta::{Condition, Obj, ObjectMeta, condition, i, top};
use crate::error::ApiResult;

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
