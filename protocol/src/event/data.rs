//! An event's JSON payload, shared: [`JsonData`] holds the parsed value and, made on first use,
//! its encoding, behind one reference count. One hub change sent to N agents is serialised
//! once, and the N events, their retransmission copies in the outboxes, and the protobuf
//! messages on the wire all share that value and those bytes (cloning is a counter increment,
//! dropping the last copy frees it once).

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde_json::Value;

/// The JSON payload of an event: a value, and its encoding made once on first use.
#[derive(Clone)]
pub struct JsonData(Arc<Inner>);

struct Inner {
    value: Value,
    encoded: OnceLock<Bytes>,
}

impl JsonData {
    /// The payload `value`.
    #[must_use]
    pub fn new(value: Value) -> Self {
        Self(Arc::new(Inner { value, encoded: OnceLock::new() }))
    }

    /// The value.
    #[must_use]
    pub fn value(&self) -> &Value {
        &self.0.value
    }

    /// The value as JSON bytes (`serde_json`'s compact form), encoded on the first call and
    /// shared by every copy of this payload from then on.
    #[must_use]
    pub fn encoded(&self) -> Bytes {
        self.0.encoded.get_or_init(|| Bytes::from(self.0.value.to_string().into_bytes())).clone()
    }

    /// The value, owned: moved out when this is the only copy, cloned otherwise.
    #[must_use]
    pub fn into_value(self) -> Value {
        match Arc::try_unwrap(self.0) {
            Ok(inner) => inner.value,
            Err(shared) => shared.value.clone(),
        }
    }

    /// Whether `self` and `other` are the same shared payload (not merely equal values).
    #[must_use]
    pub fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Deref for JsonData {
    type Target = Value;

    fn deref(&self) -> &Value {
        &self.0.value
    }
}

impl From<Value> for JsonData {
    fn from(value: Value) -> Self {
        Self::new(value)
    }
}

impl PartialEq for JsonData {
    fn eq(&self, other: &Self) -> bool {
        self.ptr_eq(other) || self.0.value == other.0.value
    }
}

impl PartialEq<Value> for JsonData {
    fn eq(&self, other: &Value) -> bool {
        self.0.value == *other
    }
}

impl fmt::Debug for JsonData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0.value, f)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn copies_share_one_encoding_made_once() {
        let data = JsonData::new(json!({"spec": {"description": "x"}, "a": [1, 2]}));
        let copy = data.clone();
        let first = data.encoded();
        let second = copy.encoded();
        assert_eq!(first, second);
        assert_eq!(first.as_ptr(), second.as_ptr(), "the copy reuses the bytes, not a second encoding");
        assert_eq!(serde_json::from_slice::<Value>(&first).expect("valid JSON"), *data.value());
    }

    #[test]
    fn encoding_is_serde_jsons_compact_form_with_key_order_kept() {
        let data = JsonData::new(json!({"z": 1, "a": {"y": "é\"", "b": null}}));
        assert_eq!(std::str::from_utf8(&data.encoded()).expect("UTF-8"), r#"{"z":1,"a":{"y":"é\"","b":null}}"#);
        assert_eq!(data.encoded(), serde_json::to_vec(data.value()).expect("encodes"));
    }

    #[test]
    fn the_value_moves_out_of_the_last_copy() {
        let data = JsonData::new(json!({"k": "v"}));
        let copy = data.clone();
        assert_eq!(copy.into_value(), json!({"k": "v"}), "cloned while another copy lives");
        assert_eq!(data.into_value(), json!({"k": "v"}));
    }
}
