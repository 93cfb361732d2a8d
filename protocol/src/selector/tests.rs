//! Label and field selectors against Kubernetes' own behaviour, and properties of both parsers.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on unexpected results

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::*;

fn labels(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

fn sel(s: &str) -> LabelSelector {
    match LabelSelector::parse(s) {
        Ok(sel) => sel,
        Err(e) => panic!("{s:?} should parse: {e}"),
    }
}

fn m(s: &str, l: &Value) -> bool {
    sel(s).matches(l.as_object())
}

#[test]
fn empty_selectors_match_everything() {
    for s in ["", "   ", "\t\n"] {
        let parsed = sel(s);
        assert!(parsed.is_empty());
        assert!(parsed.matches(None));
        assert_eq!(parsed.to_string(), "");
    }
    let f = FieldSelector::parse("").unwrap();
    assert!(f.is_empty());
    assert!(f.matches(&json!({})));
    assert!(FieldSelector::parse(",,").unwrap().is_empty());
}

#[test]
fn equality_operators() {
    let l = json!({"app": "web", "tier": "fe", "empty": ""});
    assert!(m("app=web", &l));
    assert!(m("app==web", &l));
    assert!(!m("app=api", &l));
    assert!(m("app!=api", &l));
    assert!(!m("app!=web", &l));
    assert!(m("empty=", &l));
    assert!(m("empty==", &l));
    assert!(!m("app=", &l));
    assert!(m("app!=", &l));
    assert!(!m("missing=", &l), "= requires the key to exist, even for an empty value");
}

#[test]
fn set_operators() {
    let l = json!({"app": "web", "env": "prod"});
    assert!(m("app in (web,api)", &l));
    assert!(m("app in (api, web)", &l));
    assert!(!m("app in (api)", &l));
    assert!(m("app notin (api,db)", &l));
    assert!(!m("app notin (web)", &l));
    assert!(!m("missing in (a)", &l));
    assert!(m("env in (prod),app in (web)", &l));
    // `()` is the set holding the empty value.
    assert_eq!(sel("x in ()").requirements()[0].values(), [""]);
    assert_eq!(sel("x in (,a)").requirements()[0].values(), ["", "a"]);
    assert_eq!(sel("x in (a,)").requirements()[0].values(), ["", "a"]);
    assert_eq!(sel("x in (a,,b)").requirements()[0].values(), ["", "a", "b"]);
    assert_eq!(sel("x in (b,a,b)").requirements()[0].values(), ["a", "b"]);
}

#[test]
fn exists_and_does_not_exist() {
    let l = json!({"app": "web"});
    assert!(m("app", &l));
    assert!(!m("db", &l));
    assert!(m("!db", &l));
    assert!(!m("!app", &l));
    assert!(m("! db", &l), "whitespace after ! is tolerated");
    assert!(!m("app", &Value::Null));
    assert!(sel("!app").matches(None));
}

#[test]
fn negative_operators_match_objects_without_the_label() {
    assert!(sel("app!=web").matches(None));
    assert!(sel("app notin (web)").matches(None));
    assert!(sel("app!=web").matches(Some(&labels(json!({"other": "x"})))));
    assert!(!sel("app=web").matches(None));
    assert!(!sel("app in (web)").matches(None));
    assert!(!sel("app").matches(None));
}

#[test]
fn greater_and_less_than() {
    let l = json!({"replicas": "3", "name": "x"});
    assert!(m("replicas>2", &l));
    assert!(!m("replicas>3", &l));
    assert!(m("replicas<4", &l));
    assert!(!m("name>1", &l), "non-integer label values never match");
    assert!(!m("missing<4", &l));
    assert!(matches!(LabelSelector::parse("replicas>abc"), Err(SelectorError::InvalidLabelValue { .. })));
}

#[test]
fn non_string_label_values_are_present_but_unequal() {
    let l = json!({"n": 1});
    assert!(m("n", &l));
    assert!(!m("n=1", &l));
    assert!(m("n!=1", &l));
    assert!(m("n notin (1)", &l));
}

#[test]
fn combinations_are_anded_and_sorted_by_key() {
    let l = json!({"app": "web", "tier": "fe"});
    assert!(m("tier=fe,app=web,!canary", &l));
    assert!(!m("tier=fe,app=api", &l));
    assert_eq!(sel("tier=fe,app in (b,a),!canary").to_string(), "app in (a,b),!canary,tier=fe");
}

#[test]
fn whitespace_is_tolerated_like_kubernetes() {
    let canonical = sel("app=web,tier in (a,b),!x");
    for s in ["  app = web ,tier in(a,b) , ! x ", "app=web,\ttier\nin\r(a , b),!x", "app= web,tier in (  a,b  ),!x"] {
        assert_eq!(sel(s), canonical, "{s:?}");
    }
    // kube-rs' form-encoded '+' arrives decoded as spaces.
    assert_eq!(sel("app in (a,b)"), sel("app  in  ( a , b )"));
}

#[test]
fn in_and_notin_are_identifiers_as_keys_and_values() {
    let l = json!({"in": "notin", "notin": "in"});
    assert!(m("in=notin", &l));
    assert!(m("in in (notin)", &l));
    assert!(m("notin notin (x)", &l));
    assert!(m("notin", &l));
    assert!(m("x=in", &json!({"x": "in"})));
}

#[test]
fn prefixed_keys() {
    let l = json!({"app.kubernetes.io/name": "web", "example.com/Tier": "FE_1.0"});
    assert!(m("app.kubernetes.io/name=web", &l));
    assert!(m("example.com/Tier in (FE_1.0)", &l));
}

fn syntax_error(s: &str) -> (usize, String) {
    match LabelSelector::parse(s) {
        Err(SelectorError::LabelSyntax { position, message, .. }) => (position, message),
        other => panic!("{s:?}: expected a syntax error, got {other:?}"),
    }
}

#[test]
fn syntax_errors_say_where_and_what() {
    let (pos, msg) = syntax_error("app in (a");
    assert_eq!(pos, 9);
    assert!(msg.contains("end of string") && msg.contains("')'"), "{msg}");
    let err = LabelSelector::parse("app in (a").unwrap_err().to_string();
    assert!(err.starts_with("invalid label selector \"app in (a\": at byte 9: found end of string"), "{err}");

    for s in [
        "app in",         // no value list
        "app in a",       // no '('
        "app in (a b)",   // missing comma
        "app notin",      // no value list
        "app in (=)",     // operator inside list
        ",",              // leading comma
        "app,",           // trailing comma
        "app,,b",         // empty requirement
        "=a",             // missing key
        "app=a=b",        // two operators
        "app web",        // missing operator
        "app=(a)",        // set value after =
        "!app=a",         // operator after !key
        "!",              // bare !
        "!!a",            // double !
        "app in (a))",    // extra paren
        "app in (a),(b)", // stray list
        ")",
        "a==,=b",
    ] {
        syntax_error(s);
    }
}

#[test]
fn invalid_keys_and_values() {
    let long = "a".repeat(64);
    let long_value = format!("k={long}");
    let long_prefix = format!("{}/k", "a".repeat(254));
    for s in [
        long.as_str(),
        "-app",
        "app-",
        "a b=c x",
        "ap$p=1",
        "Example.com/x",
        "/x",
        "a/",
        "a/b/c",
        "a..b/c",
        long_prefix.as_str(),
        "ключ=1",
    ] {
        let err = LabelSelector::parse(s);
        assert!(
            matches!(err, Err(SelectorError::InvalidLabelKey { .. }) | Err(SelectorError::LabelSyntax { .. })),
            "{s:?}: {err:?}"
        );
    }
    assert!(matches!(LabelSelector::parse(&long), Err(SelectorError::InvalidLabelKey { .. })));
    let msg = LabelSelector::parse(&long).unwrap_err().to_string();
    assert!(msg.contains("no more than 63 characters"), "{msg}");
    for s in [long_value.as_str(), "k=-a", "k in (a,b-)", "k!=a/b", "k=ü"] {
        assert!(matches!(LabelSelector::parse(s), Err(SelectorError::InvalidLabelValue { .. })), "{s:?}");
    }
    // 63 characters is fine.
    sel(&"a".repeat(63));
    sel(&format!("k={}", "b".repeat(63)));
    sel(&format!("{}/{}", "a".repeat(253), "n".repeat(63)));
}

#[test]
fn nul_bytes_are_rejected() {
    assert!(matches!(LabelSelector::parse("a\0,b"), Err(SelectorError::LabelSyntax { position: 1, .. })));
    assert!(matches!(LabelSelector::parse("a=b\0"), Err(SelectorError::LabelSyntax { .. })));
}

#[test]
fn requirement_new_validates() {
    assert!(Requirement::new("app", Operator::In, vec![]).is_err());
    assert!(Requirement::new("app", Operator::Equals, vec!["a".into(), "b".into()]).is_err());
    assert!(Requirement::new("app", Operator::Exists, vec!["a".into()]).is_err());
    assert!(Requirement::new("app", Operator::GreaterThan, vec!["x".into()]).is_err());
    assert!(Requirement::new("-", Operator::Exists, vec![]).is_err());
    let r = Requirement::new("app", Operator::NotIn, vec!["b".into(), "a".into(), "b".into()]).unwrap();
    assert_eq!(r.values(), ["a", "b"]);
    assert_eq!(r.to_string(), "app notin (a,b)");
}

// --- field selectors ---

fn pod() -> Value {
    json!({"metadata": {"name": "web-1", "namespace": "prod"}})
}

fn fsel(s: &str) -> FieldSelector {
    match FieldSelector::parse(s) {
        Ok(f) => f,
        Err(e) => panic!("{s:?} should parse: {e}"),
    }
}

#[test]
fn field_selector_operators() {
    let p = pod();
    assert!(fsel("metadata.name=web-1").matches(&p));
    assert!(fsel("metadata.name==web-1").matches(&p));
    assert!(!fsel("metadata.name=web-2").matches(&p));
    assert!(fsel("metadata.name!=web-2").matches(&p));
    assert!(!fsel("metadata.name!=web-1").matches(&p));
    assert!(fsel("metadata.namespace=prod,metadata.name=web-1").matches(&p));
    assert!(!fsel("metadata.namespace=prod,metadata.name=x").matches(&p));
    assert_eq!(fsel("metadata.namespace=prod,metadata.name=web-1").exact_match("metadata.name"), Some("web-1"));
    assert_eq!(fsel("metadata.name!=a").exact_match("metadata.name"), None);
}

#[test]
fn field_selector_missing_namespace_reads_empty() {
    let ns = json!({"metadata": {"name": "default"}});
    assert!(fsel("metadata.namespace=").matches(&ns));
    assert!(fsel("metadata.namespace!=prod").matches(&ns));
    assert!(!fsel("metadata.name=x").matches(&json!(null)));
}

#[test]
fn field_selector_escapes() {
    let obj = json!({"metadata": {"name": "a,b=c\\d"}});
    let f = fsel(r"metadata.name=a\,b\=c\\d");
    assert_eq!(f.requirements()[0].value(), "a,b=c\\d");
    assert!(f.matches(&obj));
    assert_eq!(f.to_string(), r"metadata.name=a\,b\=c\\d");
    assert_eq!(fsel(&f.to_string()), f);
    for bad in [r"metadata.name=a\x", r"metadata.name=a\", "metadata.name=a=b", "metadata.name==a=b"] {
        assert!(matches!(FieldSelector::parse(bad), Err(SelectorError::FieldValue { .. })), "{bad:?}");
    }
}

#[test]
fn field_selector_errors() {
    let err = FieldSelector::parse("spec.nodeName=n1").unwrap_err();
    assert_eq!(err, SelectorError::UnsupportedField { field: "spec.nodeName".into() });
    assert_eq!(err.to_string(), "field label not supported: spec.nodeName");
    assert!(matches!(FieldSelector::parse("metadata.name"), Err(SelectorError::FieldSyntax { .. })));
    assert!(matches!(
        FieldSelector::parse("metadata.name=a,status.phase=Running"),
        Err(SelectorError::UnsupportedField { .. })
    ));
    // Whitespace is not trimmed, as in Kubernetes.
    assert!(matches!(FieldSelector::parse("metadata.name = a"), Err(SelectorError::UnsupportedField { .. })));
    assert!(matches!(FieldSelector::parse("=a"), Err(SelectorError::UnsupportedField { .. })));
}

#[test]
fn any_field_parses_and_matches_with_a_lookup() {
    let f = FieldSelector::parse_any_field("involvedObject.name=web,reason!=Failed").unwrap();
    assert_eq!(f.unsupported_field(&["involvedObject.name", "reason"]), None);
    assert_eq!(f.unsupported_field(&["reason"]), Some("involvedObject.name"));
    let obj = json!({"involvedObject": {"name": "web"}, "reason": "Pulled"});
    let lookup = |field: &str| {
        let mut v = &obj;
        for part in field.split('.') {
            v = &v[part];
        }
        std::borrow::Cow::Borrowed(v.as_str().unwrap_or(""))
    };
    assert!(f.matches_with(lookup));
    assert!(!FieldSelector::parse_any_field("reason=Failed").unwrap().matches_with(lookup));
    assert!(matches!(FieldSelector::parse_any_field("reason"), Err(SelectorError::FieldSyntax { .. })));
    // `parse` still takes only the metadata fields.
    assert!(matches!(FieldSelector::parse("reason=x"), Err(SelectorError::UnsupportedField { .. })));
}

// --- properties ---

fn name_part() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9]",
        "[a-zA-Z0-9][-a-zA-Z0-9_.]{0,61}[a-zA-Z0-9]",
        Just("in".to_owned()),
        Just("notin".to_owned()),
    ]
}

fn key() -> impl Strategy<Value = String> {
    (proptest::option::of("[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?(\\.[a-z0-9]{1,5}){0,2}"), name_part()).prop_map(
        |(prefix, name)| match prefix {
            Some(p) => format!("{p}/{name}"),
            None => name,
        },
    )
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), name_part()]
}

fn requirement() -> impl Strategy<Value = Requirement> {
    let op = prop_oneof![
        Just(Operator::Equals),
        Just(Operator::DoubleEquals),
        Just(Operator::NotEquals),
        Just(Operator::In),
        Just(Operator::NotIn),
        Just(Operator::Exists),
        Just(Operator::DoesNotExist),
        Just(Operator::GreaterThan),
        Just(Operator::LessThan),
    ];
    (key(), op, proptest::collection::vec(value(), 1..4), 0u32..100_000).prop_map(|(k, op, values, n)| {
        let values = match op {
            Operator::Exists | Operator::DoesNotExist => vec![],
            Operator::GreaterThan | Operator::LessThan => vec![n.to_string()],
            Operator::In | Operator::NotIn => values,
            _ => values.into_iter().take(1).collect(),
        };
        match Requirement::new(&k, op, values) {
            Ok(r) => r,
            Err(e) => panic!("generated requirement must be valid: {e}"),
        }
    })
}

proptest! {
    #[test]
    fn label_parse_never_panics(s in any::<String>()) {
        let _ = LabelSelector::parse(&s);
    }

    #[test]
    fn label_parse_never_panics_on_selector_alphabet(s in "[a-z!=(), \t<>/.\\-_0-9]{0,40}") {
        if let Ok(parsed) = LabelSelector::parse(&s) {
            // Whatever parses renders to text that parses back to the same selector.
            prop_assert_eq!(LabelSelector::parse(&parsed.to_string()), Ok(parsed));
        }
    }

    #[test]
    fn field_parse_never_panics(s in any::<String>()) {
        let _ = FieldSelector::parse(&s);
    }

    #[test]
    fn field_parse_on_selector_alphabet_round_trips(s in "(metadata\\.(name|namespace)(=|==|!=)[a-z\\\\,=]{0,6},?){0,3}") {
        if let Ok(parsed) = FieldSelector::parse(&s) {
            prop_assert_eq!(FieldSelector::parse(&parsed.to_string()), Ok(parsed));
        }
    }

    #[test]
    fn label_selector_round_trips_through_display(reqs in proptest::collection::vec(requirement(), 0..6)) {
        let selector = LabelSelector::from_requirements(reqs);
        let text = selector.to_string();
        prop_assert_eq!(LabelSelector::parse(&text), Ok(selector.clone()), "rendered as {:?}", text);
    }

    #[test]
    fn field_selector_round_trips_through_display(
        terms in proptest::collection::vec((any::<bool>(), any::<bool>(), "\\PC{0,8}"), 0..4)
    ) {
        let requirements: Vec<FieldRequirement> = terms
            .into_iter()
            .map(|(ns, eq, value)| FieldRequirement {
                field: if ns { "metadata.namespace" } else { "metadata.name" }.to_owned(),
                operator: if eq { FieldOperator::Equals } else { FieldOperator::NotEquals },
                value,
            })
            .collect();
        let mut canonical = requirements.clone();
        canonical.sort();
        canonical.dedup();
        let selector = FieldSelector { requirements: canonical };
        let text = selector.to_string();
        prop_assert_eq!(FieldSelector::parse(&text), Ok(selector), "rendered as {:?}", text);
    }

    #[test]
    fn equality_selector_from_labels_matches_them(
        set in proptest::collection::btree_map(key(), value(), 0..5)
    ) {
        let reqs = set
            .iter()
            .map(|(k, v)| Requirement::new(k, Operator::Equals, vec![v.clone()]))
            .collect::<Result<Vec<_>, _>>();
        let selector = LabelSelector::from_requirements(reqs.map_err(|e| TestCaseError::fail(e.to_string()))?);
        let labels: Map<String, Value> = set.into_iter().map(|(k, v)| (k, Value::String(v))).collect();
        prop_assert!(selector.matches(Some(&labels)));
    }
}
