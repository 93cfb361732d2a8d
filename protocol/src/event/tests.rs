use std::collections::HashMap;

use chrono::DateTime;
use prost::Message as _;
use serde_json::json;

use super::attributes::{AttributeValue, EXT_EVENT_ID, EXT_RESOURCE_ID};
use super::*;
use crate::argocd::{Application, ObjectMeta};
use crate::fuzzing::check_event_decode;
use crate::payload::{
    Payload, RedisCommandBody, RedisGet, RedisRequest, RequestSyncedResourceList, RequestUpdate, ResourceRequest,
};
use crate::pb::cloudevents::CloudEvent;
use crate::pb::cloudevents::cloud_event::cloud_event_attribute_value::Attr;
use crate::pb::cloudevents::cloud_event::{CloudEventAttributeValue, Data};

fn s(v: &str) -> CloudEventAttributeValue {
    CloudEventAttributeValue { attr: Some(Attr::CeString(v.into())) }
}

/// An event shaped as upstream's Go code sends it: no id, empty source, JSON in binary_data,
/// everything as ce_string.
fn go_style_event() -> CloudEvent {
    let attributes: HashMap<String, CloudEventAttributeValue> = [
        ("datacontenttype", s("application/json")),
        ("dataschema", s("application")),
        ("resourceid", s("guestbook_uid-1")),
        ("eventid", s("guestbook_uid-1_17")),
        ("principaluid", s("p-uid")),
        ("sentat", s("2025-03-01T10:00:00.5Z")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    CloudEvent {
        id: String::new(),
        source: String::new(),
        spec_version: "1.0".into(),
        r#type: "io.argoproj.argocd-agent.event.spec-update".into(),
        attributes,
        data: Some(Data::BinaryData(
            br#"{"metadata":{"name":"guestbook","namespace":"agent-1","uid":"uid-1","resourceVersion":"17"},"spec":{"project":"default"}}"#.as_slice().into(),
        )),
    }
}

#[test]
fn decodes_what_upstream_sends() {
    let ev = Event::from_proto(go_style_event()).unwrap();
    assert_eq!(ev.event_type, EventType::SpecUpdate);
    assert_eq!(ev.target, Target::Application);
    assert_eq!(ev.resource_id, "guestbook_uid-1");
    assert_eq!(ev.event_id, "guestbook_uid-1_17");
    assert_eq!(ev.principal_uid.as_deref(), Some("p-uid"));
    assert_eq!(ev.sent_at, Some(DateTime::from_timestamp(1_740_823_200, 500_000_000).unwrap()));
    assert!(ev.id.is_empty());
    assert!(ev.extensions.is_empty());
    let Payload::Application(app) = ev.payload().unwrap() else {
        panic!("not an application");
    };
    assert_eq!(app.spec.project.as_deref(), Some("default"));
}

#[test]
fn accepts_text_data_and_uri_typed_dataschema() {
    let mut ce = go_style_event();
    ce.data = Some(Data::TextData(r#"{"spec":{}}"#.into()));
    ce.attributes
        .insert("dataschema".into(), CloudEventAttributeValue { attr: Some(Attr::CeUri("application".into())) });
    let ev = Event::from_proto(ce).unwrap();
    assert_eq!(ev.target, Target::Application);
    assert_eq!(ev.data.as_deref(), Some(&json!({"spec": {}})));
}

#[test]
fn accepts_every_dataschema_and_sentat_form_upstream_sent() {
    let forms =
        [Attr::CeString("application".into()), Attr::CeUri("application".into()), Attr::CeUriRef("application".into())];
    for form in forms {
        let mut ce = go_style_event();
        ce.attributes.insert("dataschema".into(), CloudEventAttributeValue { attr: Some(form.clone()) });
        assert_eq!(Event::from_proto(ce).unwrap().target, Target::Application, "{form:?}");
    }
    // sentat as a ce_timestamp (sdk-go's type for a time.Time extension) is read too.
    let mut ce = go_style_event();
    ce.attributes.insert(
        "sentat".into(),
        CloudEventAttributeValue {
            attr: Some(Attr::CeTimestamp(prost_types::Timestamp { seconds: 1_740_823_200, nanos: 500_000_000 })),
        },
    );
    assert_eq!(
        Event::from_proto(ce).unwrap().sent_at,
        Some(DateTime::from_timestamp(1_740_823_200, 500_000_000).unwrap())
    );
}

#[test]
fn every_known_target_goes_out_as_ce_uri() {
    for target in Target::KNOWN {
        let ce = Event::new(EventType::Ping, target.clone(), "r", "e").to_proto();
        assert_eq!(
            ce.attributes.get("dataschema").and_then(|v| v.attr.clone()),
            Some(Attr::CeUri(target.as_str().to_owned())),
            "{target}"
        );
    }
}

#[test]
fn encodes_like_sdk_go() {
    let meta = ObjectMeta {
        name: Some("guestbook".into()),
        namespace: Some("agent-1".into()),
        uid: Some("uid-1".into()),
        resource_version: Some("17".into()),
        ..ObjectMeta::default()
    };
    let app = Application { metadata: meta.clone(), ..Application::default() };
    let mut ev =
        Event::for_object(EventType::Create, Target::Application, &meta, &app).unwrap().with_principal_uid("p-uid");
    ev.stamp_sent_at(DateTime::from_timestamp(1_740_823_200, 120_000_000).unwrap());
    ev.trace.traceparent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
    let ce = ev.to_proto();

    assert_eq!(ce.spec_version, "1.0");
    assert_eq!(ce.r#type, "io.argoproj.argocd-agent.event.create");
    assert!(!ce.id.is_empty());
    let text = |k: &str| match ce.attributes.get(k).and_then(|v| v.attr.clone()) {
        Some(Attr::CeString(s)) => s,
        other => panic!("{k}: {other:?}"),
    };
    // sdk-go v2.16.2 writes and reads dataschema only as ce_uri.
    assert_eq!(ce.attributes.get("dataschema").and_then(|v| v.attr.clone()), Some(Attr::CeUri("application".into())));
    assert_eq!(text("datacontenttype"), "application/json");
    assert_eq!(text("subject"), "agent-1/guestbook");
    assert_eq!(text("resourceid"), "guestbook_uid-1");
    assert_eq!(text("eventid"), "guestbook_uid-1_17");
    assert_eq!(text("sentat"), "2025-03-01T10:00:00.12Z");
    assert_eq!(text("principaluid"), "p-uid");
    assert!(text("traceparent").starts_with("00-"));
    let Some(Data::BinaryData(bytes)) = &ce.data else {
        panic!("data must be binary_data");
    };
    let data: serde_json::Value = serde_json::from_slice(bytes).unwrap();
    assert_eq!(data["metadata"]["name"], "guestbook");

    assert_eq!(Event::from_proto(ce).unwrap(), ev);
}

#[test]
fn ack_copies_every_extension_and_has_no_data() {
    let mut ev = Event::from_proto(go_style_event()).unwrap();
    ev.extensions.insert("custom".into(), AttributeValue::Integer(7));
    let ack = ev.processed_ack();
    assert!(ack.is_ack());
    assert_eq!(ack.event_type, EventType::Processed);
    assert_eq!(ack.resource_id, ev.resource_id);
    assert_eq!(ack.event_id, ev.event_id);
    assert_eq!(ack.principal_uid, ev.principal_uid);
    assert_eq!(ack.sent_at, ev.sent_at);
    assert_eq!(ack.extensions, ev.extensions);
    let ce = ack.to_proto();
    assert_eq!(ce.data, Some(Data::BinaryData(bytes::Bytes::new())));
    assert!(!ce.attributes.contains_key("datacontenttype"));
    let back = Event::from_proto(ce).unwrap();
    assert_eq!(back.data, None);
    assert_eq!(back.payload().unwrap(), Payload::Empty);
}

#[test]
fn unknown_types_and_targets_survive() {
    let mut ce = go_style_event();
    ce.r#type = "io.argoproj.argocd-agent.event.from-the-future".into();
    ce.attributes.insert("dataschema".into(), s("hologram"));
    ce.attributes.insert("futureext".into(), CloudEventAttributeValue { attr: Some(Attr::CeBoolean(true)) });
    let ev = Event::from_proto(ce).unwrap();
    assert_eq!(ev.event_type, EventType::Unknown("io.argoproj.argocd-agent.event.from-the-future".into()));
    assert_eq!(ev.target, Target::Unknown("hologram".into()));
    assert!(matches!(ev.payload().unwrap(), Payload::Unrecognised(Some(_))));
    let again = Event::from_proto(ev.to_proto()).unwrap();
    assert_eq!(again, ev);
    assert_eq!(again.extensions.get("futureext"), Some(&AttributeValue::Boolean(true)));
}

fn err_of(mutate: impl FnOnce(&mut CloudEvent)) -> EventError {
    let mut ce = go_style_event();
    mutate(&mut ce);
    Event::from_proto(ce).unwrap_err()
}

#[test]
fn malformed_events_are_named() {
    use EventError as E;
    assert!(matches!(err_of(|c| c.spec_version = "0.3".into()), E::BadSpecVersion { found } if found == "0.3"));
    assert!(matches!(err_of(|c| c.spec_version.clear()), E::BadSpecVersion { .. }));
    assert!(matches!(err_of(|c| c.r#type.clear()), E::MissingType));
    assert!(matches!(
        err_of(|c| {
            c.attributes.remove("dataschema");
        }),
        E::MissingAttribute { name: "dataschema" }
    ));
    assert!(matches!(
        err_of(|c| {
            c.attributes.remove(EXT_RESOURCE_ID);
        }),
        E::MissingExtension { name: "resourceid" }
    ));
    assert!(matches!(
        err_of(|c| {
            c.attributes.insert(EXT_EVENT_ID.into(), s(""));
        }),
        E::MissingExtension { name: "eventid" }
    ));
    assert!(matches!(
        err_of(|c| {
            c.attributes.insert(EXT_RESOURCE_ID.into(), CloudEventAttributeValue { attr: Some(Attr::CeInteger(3)) });
        }),
        E::AttributeType { expected: "ce_string", found: "ce_integer", .. }
    ));
    assert!(matches!(
        err_of(|c| {
            c.attributes
                .insert("x".into(), CloudEventAttributeValue { attr: None });
        }),
        E::EmptyAttribute { name } if name == "x"
    ));
    assert!(matches!(
        err_of(|c| {
            c.attributes.insert("Bad-Name".into(), s("v"));
        }),
        E::InvalidAttributeName { .. }
    ));
    assert!(matches!(
        err_of(|c| {
            c.attributes.insert("sentat".into(), s("last tuesday"));
        }),
        E::BadTimestamp { name, .. } if name == "sentat"
    ));
    assert!(matches!(
        err_of(|c| c.data = Some(Data::ProtoData(prost_types::Any::default()))),
        E::UnsupportedDataEncoding { encoding: "proto_data" }
    ));
    assert!(matches!(
        err_of(|c| {
            c.attributes.insert("datacontenttype".into(), s("application/xml"));
        }),
        E::UnsupportedContentType { .. }
    ));
    assert!(matches!(
        err_of(|c| c.data = Some(Data::BinaryData(bytes::Bytes::from_static(b"{not json")))),
        E::InvalidJson(_)
    ));
    assert!(matches!(Event::from_wire(crate::pb::eventstreamapi::Event { event: None }), Err(E::MissingCloudEvent)));

    let limits = DecodeLimits { max_data_bytes: 16, require_id: true };
    assert!(matches!(Event::from_proto_with(go_style_event(), &limits), Err(E::MissingId)));
    let mut ce = go_style_event();
    ce.id = "x".into();
    assert!(matches!(Event::from_proto_with(ce, &limits), Err(E::DataTooLarge { limit: 16, .. })));
    // Every message names what is wrong.
    assert!(
        err_of(|c| {
            c.attributes.remove(EXT_RESOURCE_ID);
        })
        .to_string()
        .contains("resourceid")
    );
}

#[test]
fn ack_ref_reads_ids_of_undecodable_events() {
    let mut ce = go_style_event();
    ce.data = Some(Data::BinaryData(bytes::Bytes::from_static(b"garbage")));
    let r = AckRef::of(&ce).unwrap();
    assert_eq!(r.resource_id, "guestbook_uid-1");
    assert_eq!(r.event_id, "guestbook_uid-1_17");
    ce.attributes.remove(EXT_RESOURCE_ID);
    assert_eq!(AckRef::of(&ce), None);
}

#[test]
fn payloads_decode_by_target_and_type() {
    let req = ResourceRequest {
        uuid: "r-1".into(),
        namespace: "shop".into(),
        name: "guestbook".into(),
        body: b"{\"a\":1}".to_vec(),
        version: "v1".into(),
        resource: "pods".into(),
        ..ResourceRequest::default()
    };
    let ev = Event::request(EventType::HttpPost, Target::Resource, "r-1").with_json(&req).unwrap();
    // Go field names, []byte as base64, omitempty honoured.
    assert_eq!(
        ev.data.as_deref(),
        Some(&json!({"uuid":"r-1","namespace":"shop","name":"guestbook","body":"eyJhIjoxfQ==",
                    "group":"","version":"v1","resource":"pods"}))
    );
    let decoded = Event::from_proto(ev.to_proto()).unwrap();
    assert_eq!(decoded.payload().unwrap(), Payload::ResourceRequest(req));

    let redis = RedisRequest {
        uuid: "q".into(),
        connection_uuid: "c".into(),
        body: RedisCommandBody { get: Some(RedisGet { key: "k".into() }), ..RedisCommandBody::default() },
    };
    let ev = Event::request(EventType::RedisRequest, Target::Redis, "q").with_json(&redis).unwrap();
    assert_eq!(ev.data.as_deref(), Some(&json!({"uuid":"q","connectionUuid":"c","body":{"get":{"key":"k"}}})));
    assert_eq!(ev.payload().unwrap(), Payload::RedisRequest(redis));

    // A nil Go []byte is `null`; a missing resource's request-update has one.
    let ru = RequestUpdate { name: "a".into(), kind: "Application".into(), ..RequestUpdate::default() };
    let ev = Event::request(EventType::RequestUpdate, Target::ResourceResync, "u").with_json(&ru).unwrap();
    assert_eq!(ev.data.as_deref(), Some(&json!({"name":"a","uid":"","kind":"Application","checksum":null})));
    let list = Event::request(EventType::RequestSyncedResourceList, Target::ResourceResync, "l");
    let list = list.clone().with_json(&json!({"checksum": "AAEC"})).unwrap();
    assert_eq!(
        list.payload().unwrap(),
        Payload::RequestSyncedResourceList(RequestSyncedResourceList::of_set(Some(vec![0, 1, 2])))
    );

    // Wrong shapes are reported with type and target.
    let bad = Event::request(EventType::RedisRequest, Target::Redis, "q").with_json(&json!({"body": 5})).unwrap();
    let err = bad.payload().unwrap_err();
    assert!(matches!(err, EventError::PayloadMismatch { .. }));
    assert!(err.to_string().contains("redis"));
    let empty = Event::request(EventType::RedisRequest, Target::Redis, "q");
    assert!(matches!(empty.payload(), Err(EventError::MissingData { .. })));
    let hb = Event::heartbeat();
    assert_eq!(hb.payload().unwrap(), Payload::Empty);
}

/// Numbers in an event's data decode to the same value after a re-encode: serde_json parses
/// floats exactly (`float_roundtrip`), as Go's encoding/json does. Found by the `event_decode` fuzz
/// target: 18447404736709551615 (above u64::MAX) read as 1.8447404736709554e19, re-encoded, then
/// read back as 1.844740473670955e19; 1.0e030 became 9.999999999999999e29, then 1e30.
#[test]
fn numbers_in_event_data_survive_a_re_encode() {
    let limits = DecodeLimits::default();
    for data in
        ["[18447404736709551615]", "[1.0e030]", "{\"x\":0.1,\"y\":-2.5e-308,\"z\":123456789012345678901234567890}"]
    {
        let mut ce = go_style_event();
        ce.data = Some(Data::TextData(data.into()));
        let bytes = crate::pb::eventstreamapi::Event { event: Some(ce) }.encode_to_vec();
        if let Err(finding) = check_event_decode(&bytes, &limits) {
            panic!("{data}: {finding}");
        }
    }
}

#[test]
fn fuzz_target_logic_over_sample_inputs() {
    let limits = DecodeLimits::default();
    let valid = crate::pb::eventstreamapi::Event { event: Some(go_style_event()) }.encode_to_vec();
    assert!(check_event_decode(&valid, &limits).unwrap().is_some());

    let inputs: Vec<Vec<u8>> = vec![
        Vec::new(),
        vec![0xff; 64],
        valid[..valid.len() / 2].to_vec(),
        b"\x0a\x00".to_vec(),
        {
            let mut ce = go_style_event();
            ce.data = Some(Data::TextData("[1e400]".into()));
            crate::pb::eventstreamapi::Event { event: Some(ce) }.encode_to_vec()
        },
        {
            let mut ce = go_style_event();
            ce.attributes.insert(
                "time".into(),
                CloudEventAttributeValue { attr: Some(Attr::CeString("2016-12-31T23:59:60Z".into())) },
            );
            crate::pb::eventstreamapi::Event { event: Some(ce) }.encode_to_vec()
        },
        {
            let mut ce = go_style_event();
            ce.attributes.insert(
                "time".into(),
                CloudEventAttributeValue { attr: Some(Attr::CeString("2016-12-31T23:59:59.123456789+05:30".into())) },
            );
            ce.attributes.insert("blob".into(), CloudEventAttributeValue { attr: Some(Attr::CeBytes(vec![1, 2, 3])) });
            ce.data = Some(Data::TextData(
                r#"{"kind":"Secret","data":{"a":"\u2028<&>"},"n":[1.5e300,-0.0,18446744073709551615]}"#.into(),
            ));
            crate::pb::eventstreamapi::Event { event: Some(ce) }.encode_to_vec()
        },
    ];
    for input in inputs {
        check_event_decode(&input, &limits).unwrap();
    }
    // Deterministic pseudo-random mutations of a valid message.
    let mut state = 0x1234_5678_u64;
    for _ in 0..2000 {
        let mut bytes = valid.clone();
        for _ in 0..3 {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let i = usize::try_from(state >> 33).unwrap() % bytes.len();
            bytes[i] ^= u8::try_from((state >> 20) & 0xff).unwrap();
        }
        check_event_decode(&bytes, &limits).unwrap();
    }
}
