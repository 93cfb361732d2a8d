//! Parses arbitrary UTF-8 as a label selector and as a field selector.
//!
//! Neither parser may panic; whatever parses must render (`Display`) to text
//! that parses back to an equal selector, and matching must not panic.
#![no_main]

use apiserver::selector::{FieldSelector, LabelSelector};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let object = json!({
        "metadata": {"name": "web-1", "namespace": "prod", "labels": {"app": "web", "tier": "fe", "n": "3"}}
    });

    if let Ok(selector) = LabelSelector::parse(text) {
        let rendered = selector.to_string();
        match LabelSelector::parse(&rendered) {
            Ok(reparsed) => assert_eq!(reparsed, selector, "label selector {text:?} rendered as {rendered:?}"),
            Err(e) => panic!("label selector {text:?} rendered as {rendered:?}, which does not parse: {e}"),
        }
        let _ = selector.matches(object["metadata"]["labels"].as_object());
        let _ = selector.matches(None);
    }

    if let Ok(selector) = FieldSelector::parse(text) {
        let rendered = selector.to_string();
        match FieldSelector::parse(&rendered) {
            Ok(reparsed) => assert_eq!(reparsed, selector, "field selector {text:?} rendered as {rendered:?}"),
            Err(e) => panic!("field selector {text:?} rendered as {rendered:?}, which does not parse: {e}"),
        }
        let _ = selector.matches(&object);
    }
});
