//! `encoding/json.Marshal` of Go's unstructured values (`map[string]interface{}` and friends),
//! byte for byte, so checksums over JSON agree with upstream.
//!
//! What Go does and this reproduces:
//! * object keys sorted by their UTF-8 bytes, no whitespace;
//! * strings escaped with HTML safety on: `"` `\\` `\n` `\r` `\t` `\b` `\f` (Go >= 1.22) as
//!   two-character escapes, other control characters, `<`, `>`, `&`, U+2028 and U+2029 as
//!   `\u00XX` / `\u20XX` with lower-case hex;
//! * integers as decimal (Kubernetes' unstructured decoder keeps them as `int64`; larger
//!   numbers become `float64`);
//! * floats in the shortest form that round-trips, `%f`-style unless the magnitude is below
//!   1e-6 or at least 1e21, where it is `%e` with the exponent's leading zero dropped
//!   (`1e-7`, `1e+21`).

use serde_json::{Number, Value};

/// Marshals `value` exactly as Go's `json.Marshal` would marshal its unstructured equivalent.
#[must_use]
pub fn marshal(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(out, k);
                out.push(b':');
                write_value(out, v);
            }
            out.push(b'}');
        }
    }
}

fn write_number(out: &mut Vec<u8>, n: &Number) {
    if let Some(i) = n.as_i64() {
        out.extend_from_slice(i.to_string().as_bytes());
    } else if let Some(f) = n.as_f64() {
        // u64 above i64::MAX lands here too: Kubernetes decodes it as float64.
        out.extend_from_slice(format_float(f).as_bytes());
    }
}

/// Go's `strconv.AppendFloat(f, 'f' or 'e', -1, 64)` as `encoding/json` chooses and cleans it.
#[must_use]
pub fn format_float(f: f64) -> String {
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        // Rust's `{:e}` is shortest-round-trip like Go's -1 precision, but writes the
        // exponent bare ("1e21", "1e-7"); Go writes "1e+21" and, after its cleanup, "1e-7".
        let s = format!("{f:e}");
        match s.split_once('e') {
            Some((mantissa, exp)) if !exp.starts_with('-') => format!("{mantissa}e+{exp}"),
            _ => s,
        }
    } else {
        // Shortest round-trip digits, positional notation: what Go's 'f' with -1 gives.
        format!("{f}")
    }
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '\u{2028}' => out.extend_from_slice(b"\\u2028"),
            '\u{2029}' => out.extend_from_slice(b"\\u2029"),
            c if (c as u32) < 0x20 || c == '<' || c == '>' || c == '&' => {
                let b = c as u32;
                out.extend_from_slice(b"\\u00");
                out.push(HEX[((b >> 4) & 0xf) as usize]);
                out.push(HEX[(b & 0xf) as usize]);
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn m(v: &Value) -> String {
        String::from_utf8(marshal(v)).unwrap()
    }

    #[test]
    fn keys_are_sorted_bytewise_and_output_is_compact() {
        let v = json!({"b": 1, "a": {"z": [true, null], "Z": "x"}, "_": false});
        assert_eq!(m(&v), r#"{"_":false,"a":{"Z":"x","z":[true,null]},"b":1}"#);
    }

    #[test]
    fn strings_are_escaped_like_go() {
        let v = json!("<a href=\"x\">&\u{1}\u{8}\u{c}\n\r\t\\\u{7f}\u{2028}\u{2029}é</a>");
        assert_eq!(
            m(&v),
            "\"\\u003ca href=\\\"x\\\"\\u003e\\u0026\\u0001\\b\\f\\n\\r\\t\\\\\u{7f}\\u2028\\u2029é\\u003c/a\\u003e\""
        );
    }

    #[test]
    fn floats_are_formatted_like_go() {
        assert_eq!(format_float(1.0), "1");
        assert_eq!(format_float(-0.0), "-0");
        assert_eq!(format_float(0.1), "0.1");
        assert_eq!(format_float(1.5e-7), "1.5e-7");
        assert_eq!(format_float(1e-6), "0.000001");
        assert_eq!(format_float(1e20), "100000000000000000000");
        assert_eq!(format_float(1e21), "1e+21");
        assert_eq!(format_float(-1.25e300), "-1.25e+300");
        assert_eq!(format_float(123_456.789), "123456.789");
        // Values below checked against Go 1.27's json.Marshal.
        assert_eq!(format_float(5e-324), "5e-324");
        assert_eq!(format_float(f64::MAX), "1.7976931348623157e+308");
        assert_eq!(format_float(0.000_001_234), "0.000001234");
        assert_eq!(format_float(1.234_567_890_123_456_8e20), "123456789012345680000");
        let big = json!(18_446_744_073_709_551_615_u64);
        assert_eq!(m(&big), "18446744073709552000");
        assert_eq!(m(&json!(-42)), "-42");
    }
}
