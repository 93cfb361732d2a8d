//! Decoding real kubectl bodies and bodies encoded with these prost messages.

use std::collections::BTreeMap;

use prost::Message as _;
use serde_json::{Value, json};

use super::config::{ConfigMap, Namespace, Secret};
use super::event::{Event, EventSeries, EventSource, ObjectReference};
use super::lease::{Lease, LeaseSpec};
use super::meta::{Condition, ObjectMeta, OwnerReference, Time};
use super::service::{
    IntOrString, LoadBalancerIngress, LoadBalancerStatus, PortStatus, Service, ServicePort, ServiceSpec, ServiceStatus,
};
use super::{CONTENT_TYPE, TypeMeta, Unknown, decode, encode, is_protobuf};

/// A request body kubectl 1.37.1 sent (`-v=9` hex dump of "Request Body"), and the JSON
/// kubectl prints for the same command with `--dry-run=client -o json`.
struct Capture {
    command: &'static str,
    hex: &'static str,
    json: &'static str,
}

const CAPTURES: &[Capture] = &[
    Capture {
        command: "kubectl create namespace foo",
        hex: "6b 38 73 00 0a 0f 0a 02 76 31 12 09 4e 61 6d 65 73 70 61 63 65 12 1b 0a 13 0a 03 66 6f 6f 12 00 1a 00 22 00 2a 00 32 00 38 00 42 00 12 00 1a 02 0a 00 1a 00 22 00",
        json: r#"{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"foo"},"spec":{},"status":{}}"#,
    },
    Capture {
        command: "kubectl create namespace bar --save-config",
        hex: "6b 38 73 00 0a 0f 0a 02 76 31 12 09 4e 61 6d 65 73 70 61 63 65 12 aa 01 0a a1 01 0a 03 62 61 72 12 00 1a 00 22 00 2a 00 32 00 38 00 42 00 62 8b 01 0a 30 6b 75 62 65 63 74 6c 2e 6b 75 62 65 72 6e 65 74 65 73 2e 69 6f 2f 6c 61 73 74 2d 61 70 70 6c 69 65 64 2d 63 6f 6e 66 69 67 75 72 61 74 69 6f 6e 12 57 7b 22 6b 69 6e 64 22 3a 22 4e 61 6d 65 73 70 61 63 65 22 2c 22 61 70 69 56 65 72 73 69 6f 6e 22 3a 22 76 31 22 2c 22 6d 65 74 61 64 61 74 61 22 3a 7b 22 6e 61 6d 65 22 3a 22 62 61 72 22 7d 2c 22 73 70 65 63 22 3a 7b 7d 2c 22 73 74 61 74 75 73 22 3a 7b 7d 7d 0a 12 00 1a 02 0a 00 1a 00 22 00",
        json: r#"{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"bar","annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{\"kind\":\"Namespace\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"bar\"},\"spec\":{},\"status\":{}}\n"}},"spec":{},"status":{}}"#,
    },
    Capture {
        command: "kubectl create secret generic s1 -n ns1 --from-literal=a=b",
        hex: "6b 38 73 00 0a 0c 0a 02 76 31 12 06 53 65 63 72 65 74 12 21 0a 15 0a 02 73 31 12 00 1a 03 6e 73 31 22 00 2a 00 32 00 38 00 42 00 12 06 0a 01 61 12 01 62 1a 00 1a 00 22 00",
        json: r#"{"kind":"Secret","apiVersion":"v1","metadata":{"name":"s1","namespace":"ns1"},"data":{"a":"Yg=="}}"#,
    },
    Capture {
        command: "kubectl create secret generic s2 -n ns1 --from-file=bin=bin.dat --type=Opaque",
        hex: "6b 38 73 00 0a 0c 0a 02 76 31 12 06 53 65 63 72 65 74 12 33 0a 15 0a 02 73 32 12 00 1a 03 6e 73 31 22 00 2a 00 32 00 38 00 42 00 12 12 0a 03 62 69 6e 12 0b 00 01 ff fe 20 62 69 6e 61 72 79 1a 06 4f 70 61 71 75 65 1a 00 22 00",
        json: r#"{"kind":"Secret","apiVersion":"v1","metadata":{"name":"s2","namespace":"ns1"},"data":{"bin":"AAH//iBiaW5hcnk="},"type":"Opaque"}"#,
    },
    Capture {
        command: "kubectl create configmap c1 -n ns1 --from-literal=a=b",
        hex: "6b 38 73 00 0a 0f 0a 02 76 31 12 09 43 6f 6e 66 69 67 4d 61 70 12 1f 0a 15 0a 02 63 31 12 00 1a 03 6e 73 31 22 00 2a 00 32 00 38 00 42 00 12 06 0a 01 61 12 01 62 1a 00 22 00",
        json: r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c1","namespace":"ns1"},"data":{"a":"b"}}"#,
    },
    Capture {
        command: "kubectl create configmap c2 -n ns1 --from-file=bin=bin.dat --from-literal=x=y",
        hex: "6b 38 73 00 0a 0f 0a 02 76 31 12 09 43 6f 6e 66 69 67 4d 61 70 12 33 0a 15 0a 02 63 32 12 00 1a 03 6e 73 31 22 00 2a 00 32 00 38 00 42 00 12 06 0a 01 78 12 01 79 1a 12 0a 03 62 69 6e 12 0b 00 01 ff fe 20 62 69 6e 61 72 79 1a 00 22 00",
        json: r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c2","namespace":"ns1"},"data":{"x":"y"},"binaryData":{"bin":"AAH//iBiaW5hcnk="}}"#,
    },
    Capture {
        command: "kubectl create service clusterip svc1 --tcp=80:8080 -n ns1",
        hex: "6b 38 73 00 0a 0d 0a 02 76 31 12 07 53 65 72 76 69 63 65 12 6f 0a 24 0a 04 73 76 63 31 12 00 1a 03 6e 73 31 22 00 2a 00 32 00 38 00 42 00 5a 0b 0a 03 61 70 70 12 04 73 76 63 31 12 43 0a 1b 0a 07 38 30 2d 38 30 38 30 12 03 54 43 50 18 50 22 07 08 00 10 90 3f 1a 00 28 00 12 0b 0a 03 61 70 70 12 04 73 76 63 31 1a 00 22 09 43 6c 75 73 74 65 72 49 50 3a 00 42 00 52 00 5a 00 60 00 68 00 1a 02 0a 00 1a 00 22 00",
        json: r#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"svc1","namespace":"ns1","labels":{"app":"svc1"}},"spec":{"ports":[{"name":"80-8080","protocol":"TCP","port":80,"targetPort":8080}],"selector":{"app":"svc1"},"type":"ClusterIP"},"status":{"loadBalancer":{}}}"#,
    },
    Capture {
        command: "kubectl create service externalname ext1 --external-name=example.com -n ns1",
        hex: "6b 38 73 00 0a 0d 0a 02 76 31 12 07 53 65 72 76 69 63 65 12 60 0a 24 0a 04 65 78 74 31 12 00 1a 03 6e 73 31 22 00 2a 00 32 00 38 00 42 00 5a 0b 0a 03 61 70 70 12 04 65 78 74 31 12 34 12 0b 0a 03 61 70 70 12 04 65 78 74 31 1a 00 22 0c 45 78 74 65 72 6e 61 6c 4e 61 6d 65 3a 00 42 00 52 0b 65 78 61 6d 70 6c 65 2e 63 6f 6d 5a 00 60 00 68 00 1a 02 0a 00 1a 00 22 00",
        json: r#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"ext1","namespace":"ns1","labels":{"app":"ext1"}},"spec":{"selector":{"app":"ext1"},"type":"ExternalName","externalName":"example.com"},"status":{"loadBalancer":{}}}"#,
    },
];

fn unhex(s: &str) -> Vec<u8> {
    s.split_whitespace().map(|b| u8::from_str_radix(b, 16).unwrap_or_else(|e| panic!("bad hex {b:?}: {e}"))).collect()
}

fn ok(body: &[u8]) -> Value {
    decode(body).unwrap_or_else(|e| panic!("decode failed: {e}"))
}

fn code(body: &[u8]) -> (u16, String) {
    match decode(body) {
        Ok(v) => panic!("expected an error, got {v}"),
        Err(e) => (e.code, e.message),
    }
}

fn meta(name: &str, namespace: &str) -> Option<ObjectMeta> {
    Some(ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        creation_timestamp: Some(Time::default()),
        ..Default::default()
    })
}

#[test]
fn kubectl_bodies_decode_to_the_json_kubectl_would_send() {
    for c in CAPTURES {
        let want: Value = serde_json::from_str(c.json).unwrap_or_else(|e| panic!("{}: {e}", c.command));
        assert_eq!(ok(&unhex(c.hex)), want, "{}", c.command);
    }
}

#[test]
fn hand_decoded_namespace_vector() {
    // k8s\0 | Unknown{typeMeta{apiVersion "v1", kind "Namespace"}, raw{Namespace{
    //   metadata{name "foo", generateName "", namespace "", selfLink "", uid "", resourceVersion "",
    //   generation 0, creationTimestamp {}}, spec {}, status{phase ""}}}, contentEncoding "", contentType ""}
    let body = unhex(CAPTURES[0].hex);
    assert_eq!(&body[..4], b"k8s\0");
    let envelope = Unknown::decode(&body[4..]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(envelope.type_meta, Some(TypeMeta { api_version: Some("v1".into()), kind: Some("Namespace".into()) }));
    let ns = Namespace::decode(envelope.raw.unwrap_or_default().as_slice()).unwrap_or_else(|e| panic!("{e}"));
    let m = ns.metadata.unwrap_or_default();
    assert_eq!(m.name.as_deref(), Some("foo"));
    assert_eq!(m.generation, Some(0));
    assert_eq!(m.creation_timestamp, Some(Time::default()), "Go sends the zero time as an empty message");
    assert_eq!(ns.status.and_then(|s| s.phase).as_deref(), Some(""));
}

#[test]
fn secret_with_every_field() {
    let mut m = meta("s", "ns").unwrap_or_default();
    m.labels = BTreeMap::from([("app".into(), "web".into())]);
    m.annotations = BTreeMap::from([("note".into(), "x".into())]);
    m.finalizers = vec!["example.com/f".into()];
    m.deletion_grace_period_seconds = Some(0);
    m.generation = Some(3);
    m.creation_timestamp = Some(Time { seconds: Some(1_700_000_000), nanos: Some(5) });
    m.owner_references = vec![OwnerReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        name: Some("owner".into()),
        uid: Some("u-1".into()),
        controller: Some(false),
        block_owner_deletion: None,
    }];
    let secret = Secret {
        metadata: Some(m),
        data: BTreeMap::from([("bin".into(), vec![0, 1, 255])]),
        r#type: Some("Opaque".into()),
        string_data: BTreeMap::from([("s".into(), "text".into())]),
        immutable: Some(false),
    };
    let v = ok(&encode("v1", "Secret", &secret.encode_to_vec()));
    assert_eq!(
        v,
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {
                "name": "s", "namespace": "ns", "generation": 3,
                "creationTimestamp": "2023-11-14T22:13:20Z",
                "deletionGracePeriodSeconds": 0,
                "labels": {"app": "web"}, "annotations": {"note": "x"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "u-1", "controller": false}],
                "finalizers": ["example.com/f"],
            },
            "immutable": false,
            "data": {"bin": "AAH/"},
            "stringData": {"s": "text"},
            "type": "Opaque",
        })
    );
}

#[test]
fn config_map_immutable_and_binary() {
    let cm = ConfigMap {
        metadata: meta("c", "ns"),
        data: BTreeMap::from([("k".into(), "v".into())]),
        binary_data: BTreeMap::from([("b".into(), b"hi".to_vec())]),
        immutable: Some(true),
    };
    let v = ok(&encode("v1", "ConfigMap", &cm.encode_to_vec()));
    assert_eq!(
        v,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"},
               "immutable": true, "data": {"k": "v"}, "binaryData": {"b": "aGk="}})
    );
}

#[test]
fn service_spec_pointers_and_status() {
    let svc = Service {
        metadata: meta("svc", "ns"),
        spec: Some(ServiceSpec {
            ports: vec![ServicePort {
                name: Some("http".into()),
                protocol: Some("TCP".into()),
                port: Some(80),
                target_port: Some(IntOrString { r#type: Some(1), int_val: Some(0), str_val: Some("web".into()) }),
                node_port: Some(0),
                app_protocol: Some("http".into()),
            }],
            cluster_ip: Some("None".into()),
            cluster_ips: vec!["None".into()],
            r#type: Some("ClusterIP".into()),
            ip_families: vec!["IPv4".into()],
            ip_family_policy: Some("SingleStack".into()),
            internal_traffic_policy: Some("Cluster".into()),
            publish_not_ready_addresses: Some(false),
            ..Default::default()
        }),
        status: Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: vec![LoadBalancerIngress {
                    ip: Some("10.0.0.1".into()),
                    hostname: Some(String::new()),
                    ip_mode: Some("VIP".into()),
                    ports: vec![PortStatus { port: Some(80), protocol: Some("TCP".into()), error: None }],
                }],
            }),
            conditions: vec![Condition {
                r#type: Some("Ready".into()),
                status: Some("True".into()),
                observed_generation: Some(2),
                last_transition_time: Some(Time { seconds: Some(0), nanos: None }),
                reason: Some("Ok".into()),
                message: Some(String::new()),
            }],
        }),
    };
    let v = ok(&encode("v1", "Service", &svc.encode_to_vec()));
    assert_eq!(
        v["spec"],
        json!({
            "ports": [{"name": "http", "protocol": "TCP", "appProtocol": "http", "port": 80, "targetPort": "web"}],
            "clusterIP": "None", "clusterIPs": ["None"], "type": "ClusterIP", "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster",
        })
    );
    assert_eq!(
        v["status"],
        json!({
            "loadBalancer": {"ingress": [{"ip": "10.0.0.1", "ipMode": "VIP", "ports": [{"port": 80, "protocol": "TCP"}]}]},
            "conditions": [{"type": "Ready", "status": "True", "observedGeneration": 2,
                            "lastTransitionTime": "1970-01-01T00:00:00Z", "reason": "Ok", "message": ""}],
        })
    );
}

#[test]
fn event_and_lease_micro_times() {
    let reference = ObjectReference {
        kind: Some("Pod".into()),
        namespace: Some("ns".into()),
        name: Some("p".into()),
        field_path: Some(String::new()),
        ..Default::default()
    };
    let event = Event {
        metadata: meta("p.1", "ns"),
        involved_object: Some(reference),
        reason: Some("Started".into()),
        message: Some("started".into()),
        source: Some(EventSource { component: Some("kubelet".into()), host: None }),
        first_timestamp: Some(Time { seconds: Some(1_700_000_000), nanos: Some(0) }),
        last_timestamp: Some(Time::default()),
        count: Some(2),
        r#type: Some("Normal".into()),
        event_time: Some(Time { seconds: Some(1_700_000_000), nanos: Some(123_456_789) }),
        series: Some(EventSeries { count: Some(2), last_observed_time: None }),
        action: None,
        related: None,
        reporting_component: Some("kubelet".into()),
        reporting_instance: None,
    };
    let v = ok(&encode("v1", "Event", &event.encode_to_vec()));
    assert_eq!(
        v,
        json!({
            "apiVersion": "v1", "kind": "Event", "metadata": {"name": "p.1", "namespace": "ns"},
            "involvedObject": {"kind": "Pod", "namespace": "ns", "name": "p"},
            "reason": "Started", "message": "started", "source": {"component": "kubelet"},
            "firstTimestamp": "2023-11-14T22:13:20Z", "count": 2, "type": "Normal",
            "eventTime": "2023-11-14T22:13:20.123456Z", "series": {"count": 2},
            "reportingComponent": "kubelet",
        })
    );

    let lease = Lease {
        metadata: meta("leader", "kube-system"),
        spec: Some(LeaseSpec {
            holder_identity: Some("me".into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(Time { seconds: Some(1_700_000_000), nanos: Some(1_000) }),
            renew_time: Some(Time { seconds: Some(1_700_000_001), nanos: None }),
            lease_transitions: Some(0),
            strategy: None,
            preferred_holder: None,
        }),
    };
    let v = ok(&encode("coordination.k8s.io/v1", "Lease", &lease.encode_to_vec()));
    assert_eq!(
        v,
        json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "leader", "namespace": "kube-system"},
            "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15,
                     "acquireTime": "2023-11-14T22:13:20.000001Z", "renewTime": "2023-11-14T22:13:21.000000Z",
                     "leaseTransitions": 0},
        })
    );
}

#[test]
fn every_supported_kind_decodes_an_empty_object() {
    for (api_version, kind) in super::SUPPORTED {
        let v = ok(&encode(api_version, kind, &[]));
        assert_eq!(v, json!({"apiVersion": api_version, "kind": kind, "metadata": {}}), "{api_version} {kind}");
    }
}

#[test]
fn malformed_bodies_are_400_with_a_reason() {
    let (c, m) = code(b"{\"kind\":\"Namespace\"}");
    assert_eq!(c, 400);
    assert!(m.contains("k8s\\0"), "{m}");

    let (c, m) = code(b"k8s\0\x0a\x0f\x0a");
    assert_eq!(c, 400);
    assert!(m.contains("runtime.Unknown"), "{m}");

    let (c, m) = code(&encode("v1", "Secret", &[0x0a, 0x05, 0x0a]));
    assert_eq!(c, 400);
    assert!(m.contains("v1 Secret"), "{m}");

    // name = 0xff: not UTF-8.
    let (c, m) = code(&encode("v1", "ConfigMap", &[0x0a, 0x03, 0x0a, 0x01, 0xff]));
    assert_eq!(c, 400);
    assert!(m.contains("v1 ConfigMap") && m.contains("UTF-8"), "{m}");

    let bad_time = Namespace {
        metadata: Some(ObjectMeta {
            creation_timestamp: Some(Time { seconds: Some(i64::MAX), nanos: None }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let (c, m) = code(&encode("v1", "Namespace", &bad_time.encode_to_vec()));
    assert_eq!(c, 400);
    assert!(m.contains("metadata.creationTimestamp"), "{m}");

    let bad_nanos = Lease {
        spec: Some(LeaseSpec { renew_time: Some(Time { seconds: Some(1), nanos: Some(-1) }), ..Default::default() }),
        ..Default::default()
    };
    let (c, m) = code(&encode("coordination.k8s.io/v1", "Lease", &bad_nanos.encode_to_vec()));
    assert_eq!(c, 400);
    assert!(m.contains("spec.renewTime"), "{m}");
}

#[test]
fn unsupported_kinds_and_encodings_are_415_asking_for_json() {
    let (c, m) = code(&encode("v1", "Pod", &[]));
    assert_eq!(c, 415);
    assert!(m.contains("v1 Pod") && m.contains("application/json"), "{m}");

    let (c, _) = code(&encode("apps/v1", "Deployment", &[]));
    assert_eq!(c, 415);

    // An empty envelope names no kind: nothing to decode it as.
    let (c, m) = code(b"k8s\0");
    assert_eq!(c, 415);
    assert!(m.contains("names no apiVersion and kind") && m.contains("application/json"), "{m}");
    let (c, _) = code(&encode("", "Secret", &[]));
    assert_eq!(c, 415);

    let mut gz = Unknown::decode(&encode("v1", "Secret", &[])[4..]).unwrap_or_else(|e| panic!("{e}"));
    gz.content_encoding = Some("gzip".into());
    let (c, m) = code(&[b"k8s\0".as_slice(), &gz.encode_to_vec()].concat());
    assert_eq!(c, 415);
    assert!(m.contains("gzip"), "{m}");

    let mut js = gz.clone();
    js.content_encoding = None;
    js.content_type = Some("application/json".into());
    let (c, _) = code(&[b"k8s\0".as_slice(), &js.encode_to_vec()].concat());
    assert_eq!(c, 415);
}

#[test]
fn content_type_detection_and_decode_body_dispatch() {
    assert!(is_protobuf(CONTENT_TYPE));
    assert!(is_protobuf("application/vnd.kubernetes.protobuf; charset=binary"));
    assert!(!is_protobuf("application/json"));
    assert!(!is_protobuf("application/vnd.kubernetes.protobuf+json"));
    let body = unhex(CAPTURES[2].hex);
    let v = crate::prepare::decode_body(&body, CONTENT_TYPE).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v["data"]["a"], "Yg==");
    let other = crate::prepare::decode_body(b"{}", "application/cbor");
    assert_eq!(other.err().map(|e| e.code), Some(415));
}

#[test]
fn arbitrary_bytes_never_panic() {
    // A cheap, deterministic stand-in for the fuzz target: mutate real bodies byte by byte.
    for c in CAPTURES {
        let body = unhex(c.hex);
        for i in 0..body.len() {
            for delta in [1u8, 0x7f, 0x80, 0xff] {
                let mut b = body.clone();
                b[i] = b[i].wrapping_add(delta);
                let _ = decode(&b);
                let _ = decode(&b[..i]);
            }
        }
    }
}

mod delete_options {
    use prost::Message as _;
    use serde_json::json;

    use super::super::options::{DeleteOptions, KIND, Preconditions, delete_options_json};
    use super::super::{MAGIC, encode};
    use crate::prepare::delete_options;

    /// `metav1.DeleteOptions{Preconditions: &{UID: "u"}, PropagationPolicy: &Background,
    /// DryRun: ["All"]}` as client-go's core/v1 typed client encodes it (hand-written bytes).
    const CLIENT_GO: &[u8] = b"k8s\0\x0a\x13\x0a\x02v1\x12\x0dDeleteOptions\x12\x16\x12\x03\x0a\x01u\x22\x0aBackground\x2a\x03All\x1a\x00\x22\x00";

    #[test]
    fn client_go_bodies_decode() {
        let v = delete_options_json(CLIENT_GO).unwrap();
        assert_eq!(v, json!({"preconditions": {"uid": "u"}, "propagationPolicy": "Background", "dryRun": ["All"]}));
        let pre = delete_options(CLIENT_GO, "application/vnd.kubernetes.protobuf").unwrap();
        assert_eq!((pre.uid.as_deref(), pre.dry_run), (Some("u"), Some(true)));
        // An empty DeleteOptions{} (what every client-go Delete sends by default), in any group.
        for av in ["v1", "coordination.k8s.io/v1", "meta.k8s.io/v1", ""] {
            let pre = delete_options(&encode(av, KIND, &[]), "application/vnd.kubernetes.protobuf").unwrap();
            assert_eq!((pre.uid, pre.dry_run), (None, Some(false)));
        }
        // The same fields encoded with these prost messages.
        let o = DeleteOptions {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions { uid: None, resource_version: Some("7".into()) }),
            orphan_dependents: None,
            propagation_policy: Some("Foreground".into()),
            dry_run: vec![],
            ignore_store_read_error_with_cluster_breaking_potential: None,
        };
        let v = delete_options_json(&encode("v1", KIND, &o.encode_to_vec())).unwrap();
        assert_eq!(
            v,
            json!({"gracePeriodSeconds": 0, "preconditions": {"resourceVersion": "7"}, "propagationPolicy": "Foreground"})
        );
    }

    #[test]
    fn bad_bodies_are_400_and_bad_options_422() {
        let pb = "application/vnd.kubernetes.protobuf";
        for body in [
            b"{}".to_vec(),
            MAGIC.to_vec(),
            [MAGIC.as_slice(), b"\xff\xff"].concat(),
            encode("v1", "Secret", &[]),
            encode("v1", KIND, &[0x12, 0x05]),
        ] {
            assert_eq!(delete_options(&body, pb).err().map(|e| e.code), Some(400), "{body:?}");
        }
        let invalid = |o: DeleteOptions| delete_options(&encode("v1", KIND, &o.encode_to_vec()), pb).err();
        let e = invalid(DeleteOptions { propagation_policy: Some("Sideways".into()), ..Default::default() }).unwrap();
        assert_eq!((e.code, e.details.map(|d| d.causes[0].0.clone())), (422, Some("propagationPolicy".into())));
        let e = invalid(DeleteOptions {
            orphan_dependents: Some(true),
            propagation_policy: Some("Orphan".into()),
            ..Default::default()
        });
        assert_eq!(e.map(|e| e.code), Some(422));
        let e = invalid(DeleteOptions { dry_run: vec!["Some".into()], ..Default::default() });
        assert_eq!(e.map(|e| e.code), Some(422));
        // JSON bodies are checked alike; a body without dryRun says "not a dry run".
        assert_eq!(delete_options(br#"{"dryRun":"All"}"#, "application/json").err().map(|e| e.code), Some(400));
        assert_eq!(delete_options(br#"{}"#, "application/json").unwrap().dry_run, Some(false));
        assert_eq!(delete_options(b"", "application/json").unwrap().dry_run, None);
    }
}
