//! `meta.k8s.io/v1` Tables, as kubectl asks for them: name, CRD printer columns and age.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::object::meta_str;
use crate::resource::ResourceType;

/// A simple JSONPath (`.a.b.c`, as CRD printer columns use) evaluated on an object.
fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    path.trim_start_matches('.').split('.').filter(|s| !s.is_empty()).try_fold(obj, |v, seg| v.get(seg))
}

/// Age as kubectl prints it.
fn age(created: &str) -> String {
    let Ok(t) = chrono::DateTime::parse_from_rfc3339(created) else { return "<unknown>".into() };
    let secs = (chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_seconds().max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    match () {
        () if secs < 120 => format!("{secs}s"),
        () if m < 10 && secs % 60 != 0 => format!("{m}m{}s", secs % 60),
        () if h < 3 => format!("{m}m"),
        () if h < 48 => format!("{h}h"),
        () => format!("{d}d"),
    }
}

fn columns(rtype: &ResourceType) -> Vec<Value> {
    let mut cols = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name of the object", "priority": 0}),
    ];
    if rtype.is_namespace() {
        cols.push(json!({"name": "Status", "type": "string", "format": "", "description": "Phase", "priority": 0}));
    }
    for (name, _) in &rtype.printer_columns {
        cols.push(json!({"name": name, "type": "string", "format": "", "description": "", "priority": 0}));
    }
    cols.push(
        json!({"name": "Age", "type": "string", "format": "", "description": "Time since creation", "priority": 0}),
    );
    cols
}

/// One Table row for an object.
pub(crate) fn row(rtype: &ResourceType, obj: &Value) -> Value {
    let mut cells = vec![json!(meta_str(obj, "name"))];
    if rtype.is_namespace() {
        cells.push(obj["status"]["phase"].clone());
    }
    for (_, path) in &rtype.printer_columns {
        cells.push(json_path(obj, path).cloned().unwrap_or(Value::Null));
    }
    cells.push(json!(age(meta_str(obj, "creationTimestamp"))));
    json!({
        "cells": cells,
        "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"].clone()},
    })
}

/// A Table of objects, with or without its column definitions.
pub(crate) fn table_value(
    rtype: &ResourceType,
    objs: &[Arc<Value>],
    rv: &str,
    cont: Option<&str>,
    with_columns: bool,
) -> Value {
    let mut meta = json!({"resourceVersion": rv});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": if with_columns { columns(rtype) } else { vec![] },
        "rows": objs.iter().map(|o| row(rtype, o)).collect::<Vec<_>>(),
    })
}

/// A Table as bytes.
pub(crate) fn table(rtype: &ResourceType, objs: &[Arc<Value>], rv: &str, cont: Option<&str>) -> Vec<u8> {
    serde_json::to_vec(&table_value(rtype, objs, rv, cont, true)).unwrap_or_default()
}
