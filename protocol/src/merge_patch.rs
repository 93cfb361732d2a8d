//! JSON merge patches (RFC 7386) computed from two versions of a document, so a writer that
//! knows the current object can send only what changed, in one request.

use serde_json::{Map, Value};

/// The merge patch that turns `old` into `new`: members of `new` that differ, `null` for
/// members of `old` that `new` lacks, recursively through objects; anything else is replaced
/// whole (arrays included, as RFC 7386 does). `None` when the two are equal.
///
/// A `null` inside `new` comes out as a removal: merge patches cannot store a `null`, and
/// Kubernetes treats a null field as an absent one.
#[must_use]
pub fn diff(old: &Value, new: &Value) -> Option<Value> {
    if old == new {
        return None;
    }
    let (Value::Object(o), Value::Object(n)) = (old, new) else { return Some(new.clone()) };
    let mut out = Map::new();
    for (k, ov) in o {
        match n.get(k) {
            None => {
                out.insert(k.clone(), Value::Null);
            }
            Some(nv) => {
                if let Some(d) = diff(ov, nv) {
                    out.insert(k.clone(), d);
                }
            }
        }
    }
    for (k, nv) in n {
        if !o.contains_key(k) {
            out.insert(k.clone(), nv.clone());
        }
    }
    Some(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::diff;

    /// RFC 7386 section 2, the reference algorithm.
    fn merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
        let serde_json::Value::Object(p) = patch else {
            *target = patch.clone();
            return;
        };
        if !target.is_object() {
            *target = json!({});
        }
        let t = target.as_object_mut().expect("made an object above");
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        }
    }

    #[test]
    fn changes_removals_and_additions_of_an_application_status() {
        let old = json!({"sync": {"status": "Synced", "revision": "a"}, "health": {"status": "Healthy", "message": "ok"}, "resources": [1, 2]});
        let new = json!({"sync": {"status": "OutOfSync", "revision": "a"}, "health": {"status": "Healthy"}, "resources": [1], "reconciledAt": "now"});
        let patch = diff(&old, &new).expect("they differ");
        assert_eq!(
            patch,
            json!({"sync": {"status": "OutOfSync"}, "health": {"message": null}, "resources": [1], "reconciledAt": "now"})
        );
        let mut doc = old;
        merge(&mut doc, &patch);
        assert_eq!(doc, new);
    }

    #[test]
    fn equal_documents_need_no_patch_and_absent_ones_are_removed_or_replaced() {
        assert_eq!(diff(&json!({"a": 1}), &json!({"a": 1})), None);
        assert_eq!(diff(&json!({"a": 1}), &serde_json::Value::Null), Some(serde_json::Value::Null));
        assert_eq!(diff(&serde_json::Value::Null, &json!({"a": 1})), Some(json!({"a": 1})));
        assert_eq!(diff(&json!([1]), &json!({"a": 1})), Some(json!({"a": 1})));
    }

    fn leaf() -> impl Strategy<Value = serde_json::Value> {
        prop_oneof![
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            "[a-z]{0,4}".prop_map(serde_json::Value::from),
        ]
    }

    /// Documents without nulls (a merge patch cannot carry one), keys from a small set so that
    /// old and new overlap.
    fn doc() -> impl Strategy<Value = serde_json::Value> {
        leaf().prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(serde_json::Value::from),
                prop::collection::btree_map("[abc]", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn applying_the_diff_to_old_gives_new(old in doc(), new in doc()) {
            let mut patched = old.clone();
            if let Some(patch) = diff(&old, &new) {
                merge(&mut patched, &patch);
            }
            prop_assert_eq!(patched, new);
        }
    }
}
