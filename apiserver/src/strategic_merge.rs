//! Kubernetes strategic merge patch (`application/strategic-merge-patch+json`)
//! for the built-in kinds this server serves, following
//! `k8s.io/apimachinery/pkg/util/strategicpatch` (`StrategicMergeMapPatch`).
//!
//! The patch works like a JSON merge patch (RFC 7386: `null` deletes a key,
//! objects merge recursively, anything else replaces) except for:
//!
//! * lists whose field has a patch merge key in the Kubernetes API types
//!   (`spec.containers` by `name`, container `ports` by `containerPort`,
//!   `metadata.ownerReferences` by `uid`, ...): elements are merged by that key,
//!   elements not named in the patch are kept;
//! * primitive lists with `patchStrategy: merge` (`metadata.finalizers`):
//!   merged as a set union;
//! * the directives `$patch: replace | delete | merge` (on objects and on
//!   elements of merging lists), `$deleteFromPrimitiveList/<field>`,
//!   `$setElementOrder/<field>` and `$retainKeys`.
//!
//! Without `$setElementOrder`, the merged list is ordered the way Kubernetes
//! orders it: elements named in the patch follow the patch's order and come
//! before existing elements, except that an existing element stays in front
//! of a patched element that it preceded in the original list. (So a patch
//! that only adds finalizer `c` to `[a, b]` yields `[c, a, b]`, as on a real
//! cluster; `kubectl apply` always sends `$setElementOrder`, which decides.)
//!
//! Values that are taken over rather than merged (a new field, a value of
//! another type, an atomic list, a new element of a merging list) are cleaned
//! as Kubernetes cleans them: `null` map values are dropped, and so is any map
//! carrying `$patch`; directives nested in them are not interpreted. Other `$`
//! keys in them are dropped as well (a real server's typed decode drops them),
//! so the result never contains directive keys.
//!
//! ```
//! use serde_json::json;
//!
//! let pod = json!({"metadata": {"name": "p", "finalizers": ["a", "b"]},
//!                  "spec": {"containers": [{"name": "app", "image": "nginx:1"}]}});
//! let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]},
//!                    "spec": {"containers": [{"name": "app", "image": "nginx:2"}]}});
//! let patched = apiserver::strategic_merge::apply(&pod, &patch, "Pod").unwrap();
//! assert_eq!(patched["metadata"]["finalizers"], json!(["b"]));
//! assert_eq!(patched["spec"]["containers"], json!([{"name": "app", "image": "nginx:2"}]));
//! ```

use std::collections::{HashMap, HashSet};
use std::fmt;

use serde_json::{Map, Value};

/// The kinds whose patch strategies this module knows.
pub const SUPPORTED_KINDS: [&str; 7] = ["Namespace", "Secret", "ConfigMap", "Pod", "Event", "Service", "Lease"];

/// How deeply patches may nest; deeper ones are refused instead of risking the stack.
pub const MAX_DEPTH: usize = 128;

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList";
const SET_ELEMENT_ORDER: &str = "$setElementOrder";

/// Why a strategic merge patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StrategicMergeError {
    /// The kind has no known patch strategies (for example a custom resource).
    #[error(
        "strategic merge patch is not supported for kind {kind:?}: send the patch as \
         application/merge-patch+json or application/json-patch+json instead"
    )]
    UnsupportedKind {
        /// The kind that was asked for.
        kind: String,
    },
    /// The patch document is not a JSON object.
    #[error("invalid strategic merge patch: the patch must be a JSON object, not {found}")]
    PatchNotObject {
        /// What the patch is instead (e.g. "a list").
        found: &'static str,
    },
    /// The object being patched is not a JSON object.
    #[error("cannot apply the strategic merge patch: the existing object must be a JSON object, not {found}")]
    OriginalNotObject {
        /// What the object is instead.
        found: &'static str,
    },
    /// An element of a list that merges by key lacks that key.
    #[error(
        "invalid strategic merge patch at {path}: the element has no merge key {key:?}; \
         every element of {list} must carry its {key:?} field"
    )]
    MissingMergeKey {
        /// Where the element is, e.g. `spec.containers[1]`.
        path: String,
        /// The list, e.g. `spec.containers`.
        list: String,
        /// The merge key, e.g. `name`.
        key: String,
    },
    /// A directive is malformed, or a value has a type the patch cannot merge.
    #[error("invalid strategic merge patch at {path}: {reason}")]
    InvalidPatch {
        /// Where the problem is, e.g. `metadata.$retainKeys`.
        path: String,
        /// What is wrong and what is expected instead.
        reason: String,
    },
    /// The patch nests deeper than [`MAX_DEPTH`].
    #[error("invalid strategic merge patch at {path}: it nests deeper than {max} levels", max = MAX_DEPTH)]
    TooDeep {
        /// Where the limit was hit.
        path: String,
    },
}

/// Whether [`apply`] knows the patch strategies of `kind` (a `kind` such as `Pod`).
pub fn is_supported_kind(kind: &str) -> bool {
    SUPPORTED_KINDS.contains(&kind)
}

/// Applies a strategic merge patch to `original`, an object of kind `kind`.
///
/// Both documents must be JSON objects; `original` is not modified.
///
/// # Errors
///
/// * [`StrategicMergeError::UnsupportedKind`] if `kind` is not one of
///   [`SUPPORTED_KINDS`] (the caller should answer 415 Unsupported Media Type);
/// * [`StrategicMergeError::PatchNotObject`] / [`StrategicMergeError::OriginalNotObject`]
///   if either document is not an object;
/// * [`StrategicMergeError::MissingMergeKey`] if an element of a list that
///   merges by key (in the patch, or in the object when the patch touches that
///   list) lacks the key;
/// * [`StrategicMergeError::InvalidPatch`] for a directive with a wrong type or
///   value (`$patch: bogus`, `$retainKeys: "x"`, `$setElementOrder/f` that is
///   not a list or contradicts the order of the patch list, ...), an unknown
///   `$`-directive, or list elements of mixed types in a merging list;
/// * [`StrategicMergeError::TooDeep`] if the patch nests deeper than [`MAX_DEPTH`].
pub fn apply(original: &Value, patch: &Value, kind: &str) -> Result<Value, StrategicMergeError> {
    if !is_supported_kind(kind) {
        return Err(StrategicMergeError::UnsupportedKind { kind: kind.to_owned() });
    }
    let Value::Object(patch) = patch else {
        return Err(StrategicMergeError::PatchNotObject { found: json_type(patch) });
    };
    let Value::Object(original) = original else {
        return Err(StrategicMergeError::OriginalNotObject { found: json_type(original) });
    };
    let merger = Merger { kind };
    merger.merge_map(original.clone(), patch, &Path::ROOT).map(Value::Object)
}

// ---------------------------------------------------------------------------
// Patch metadata (the patchStrategy / patchMergeKey tags of the API types)
// ---------------------------------------------------------------------------

/// How a list field is patched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListStrategy {
    /// No patch strategy: the patch's list replaces the old one.
    Atomic,
    /// `patchStrategy: merge` with `patchMergeKey`: objects merged by that key.
    MergeByKey(&'static str),
    /// `patchStrategy: merge` on a list of primitives: set union.
    MergePrimitives,
}

/// The strategy of the list at `fields` (field names from the object root,
/// list indices left out) in an object of `kind`, from k8s.io/api/core/v1 types.go.
fn list_strategy(kind: &str, fields: &[&str]) -> ListStrategy {
    use ListStrategy::{Atomic, MergeByKey, MergePrimitives};
    match fields {
        ["metadata", "ownerReferences"] => return MergeByKey("uid"),
        ["metadata", "finalizers"] => return MergePrimitives,
        _ => {}
    }
    match (kind, fields) {
        ("Pod", ["spec", "initContainers" | "containers" | "ephemeralContainers"]) => MergeByKey("name"),
        ("Pod", ["spec", "initContainers" | "containers" | "ephemeralContainers", field]) => match *field {
            "ports" => MergeByKey("containerPort"),
            "env" => MergeByKey("name"),
            "volumeMounts" => MergeByKey("mountPath"),
            "volumeDevices" => MergeByKey("devicePath"),
            _ => Atomic,
        },
        // volumes and resourceClaims are also `retainKeys`; `$retainKeys` is honoured anywhere.
        (
            "Pod",
            ["spec", "volumes" | "imagePullSecrets" | "schedulingGates" | "resourceClaims" | "evictionResponders"],
        ) => MergeByKey("name"),
        ("Pod", ["spec", "hostAliases"]) => MergeByKey("ip"),
        ("Pod", ["spec", "topologySpreadConstraints"]) => MergeByKey("topologyKey"),
        ("Pod", ["status", "podIPs" | "hostIPs"]) => MergeByKey("ip"),
        ("Pod", ["status", "resourceClaimStatuses"]) => MergeByKey("name"),
        ("Pod" | "Namespace" | "Service", ["status", "conditions"]) => MergeByKey("type"),
        ("Service", ["spec", "ports"]) => MergeByKey("port"),
        _ => Atomic,
    }
}

// ---------------------------------------------------------------------------
// Paths (for the schema lookup and for error messages)
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Segment<'a> {
    Field(&'a str),
    Index(usize),
}

/// Where in the document the merge is; a linked list on the stack.
#[derive(Debug, Clone, Copy)]
struct Path<'a> {
    parent: Option<&'a Path<'a>>,
    segment: Option<Segment<'a>>,
    depth: usize,
}

impl<'a> Path<'a> {
    const ROOT: Path<'static> = Path { parent: None, segment: None, depth: 0 };

    fn field(&'a self, name: &'a str) -> Path<'a> {
        Path { parent: Some(self), segment: Some(Segment::Field(name)), depth: self.depth + 1 }
    }

    fn index(&'a self, index: usize) -> Path<'a> {
        Path { parent: Some(self), segment: Some(Segment::Index(index)), depth: self.depth + 1 }
    }

    fn segments(&self) -> Vec<Segment<'a>> {
        let mut out = Vec::with_capacity(self.depth);
        let mut node = Some(self);
        while let Some(n) = node {
            if let Some(s) = n.segment {
                out.push(s);
            }
            node = n.parent;
        }
        out.reverse();
        out
    }

    /// Field names from the root, list indices left out.
    fn fields(&self) -> Vec<&'a str> {
        self.segments()
            .into_iter()
            .filter_map(|s| match s {
                Segment::Field(f) => Some(f),
                Segment::Index(_) => None,
            })
            .collect()
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let segments = self.segments();
        if segments.is_empty() {
            return f.write_str("the top level");
        }
        for (i, segment) in segments.into_iter().enumerate() {
            match segment {
                Segment::Field(name) if i == 0 => f.write_str(name)?,
                Segment::Field(name) => write!(f, ".{name}")?,
                Segment::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}

fn invalid(path: &Path<'_>, reason: impl Into<String>) -> StrategicMergeError {
    StrategicMergeError::InvalidPatch { path: path.to_string(), reason: reason.into() }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

// ---------------------------------------------------------------------------
// Value identity for merge keys and primitive lists
// ---------------------------------------------------------------------------

/// A hashable identity of a JSON value: numbers compare by value (`1` equals
/// `1.0`, as after Kubernetes' JSON decoding), composites by their JSON text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Null,
    Bool(bool),
    Int(i128),
    Float(u64),
    Str(String),
    Composite(String),
}

fn key_of(value: &Value) -> Key {
    match value {
        Value::Null => Key::Null,
        Value::Bool(b) => Key::Bool(*b),
        Value::String(s) => Key::Str(s.clone()),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Key::Int(i128::from(i))
            } else if let Some(u) = n.as_u64() {
                Key::Int(i128::from(u))
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                if f.fract() == 0.0 && f.abs() < 1e30 {
                    // Exact: integral and far inside i128's range.
                    #[allow(clippy::cast_possible_truncation)]
                    let i = f as i128;
                    Key::Int(i)
                } else {
                    Key::Float(f.to_bits())
                }
            }
        }
        Value::Array(_) | Value::Object(_) => Key::Composite(value.to_string()),
    }
}

/// The identity of a list element: its merge key's value, or the element
/// itself in a primitive list. `None` for an object without the merge key.
fn element_key(element: &Value, merge_key: Option<&str>) -> Option<Key> {
    match merge_key {
        Some(k) => element.get(k).map(key_of),
        None => Some(key_of(element)),
    }
}

/// First position of each identity in `list`.
fn first_positions(list: &[Value], merge_key: Option<&str>) -> HashMap<Key, usize> {
    let mut positions = HashMap::with_capacity(list.len());
    for (i, element) in list.iter().enumerate() {
        if let Some(key) = element_key(element, merge_key) {
            positions.entry(key).or_insert(i);
        }
    }
    positions
}

/// A merged list element with its rank in the list that orders the patched
/// elements (the patch list or `$setElementOrder`) and in the original list.
#[derive(Debug)]
struct Ranked {
    value: Value,
    patch_rank: Option<usize>,
    original_rank: Option<usize>,
}

/// Orders merged elements the way Kubernetes' `normalizeElementOrder` does:
/// patched elements in patch order, the other ("server-only") elements in
/// their original order, interleaved so that a server-only element goes first
/// only when it preceded the next patched element in the original list.
fn order_elements(elements: Vec<Ranked>) -> Vec<Value> {
    let total = elements.len();
    let (mut patched, mut server_only): (Vec<Ranked>, Vec<Ranked>) =
        elements.into_iter().partition(|e| e.patch_rank.is_some());
    patched.sort_by_key(|e| e.patch_rank);
    server_only.sort_by_key(|e| e.original_rank.unwrap_or(usize::MAX));
    let mut left = server_only.into_iter().peekable();
    let mut right = patched.into_iter().peekable();
    let mut out = Vec::with_capacity(total);
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => matches!((l.original_rank, r.original_rank), (Some(a), Some(b)) if a < b),
        };
        let next = if take_left { left.next() } else { right.next() };
        if let Some(element) = next {
            out.push(element.value);
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The merge
// ---------------------------------------------------------------------------

#[derive(Debug)]
struct Merger<'k> {
    kind: &'k str,
}

impl Merger<'_> {
    fn check_depth(&self, path: &Path<'_>) -> Result<(), StrategicMergeError> {
        if path.depth > MAX_DEPTH {
            return Err(StrategicMergeError::TooDeep { path: path.to_string() });
        }
        Ok(())
    }

    /// Merges `patch` into the object `original` (Kubernetes' `mergeMap`).
    fn merge_map(
        &self,
        original: Map<String, Value>,
        patch: &Map<String, Value>,
        path: &Path<'_>,
    ) -> Result<Map<String, Value>, StrategicMergeError> {
        self.check_depth(path)?;
        if let Some(directive) = patch.get(DIRECTIVE) {
            match directive.as_str() {
                Some("replace") => return clean_fields(patch, path),
                Some("delete") => return Ok(Map::new()),
                Some("merge") => {}
                _ => {
                    return Err(invalid(
                        &path.field(DIRECTIVE),
                        format!(
                            "unknown patch directive {directive}; $patch must be \"replace\", \"delete\" or \"merge\""
                        ),
                    ));
                }
            }
        }
        self.merge_map_fields(original, patch, path)
    }

    /// The body of [`Merger::merge_map`] once a `$patch` directive is dealt with.
    fn merge_map_fields(
        &self,
        mut original: Map<String, Value>,
        patch: &Map<String, Value>,
        path: &Path<'_>,
    ) -> Result<Map<String, Value>, StrategicMergeError> {
        if let Some(retain) = patch.get(RETAIN_KEYS) {
            apply_retain_keys(&mut original, patch, retain, &path.field(RETAIN_KEYS))?;
        }

        // `$setElementOrder/<field>` merges and orders its list first.
        let mut ordered: HashSet<&str> = HashSet::new();
        for (key, value) in patch {
            if let Some(rest) = key.strip_prefix(SET_ELEMENT_ORDER) {
                let directive_path = path.field(key);
                let field = directive_field(rest, key, &directive_path)?;
                if self.apply_set_element_order(&mut original, patch, field, value, path, &directive_path)? {
                    ordered.insert(field);
                }
            }
        }

        for (key, value) in patch {
            if key == DIRECTIVE || key == RETAIN_KEYS || key.starts_with(SET_ELEMENT_ORDER) {
                continue;
            }
            if let Some(rest) = key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
                let directive_path = path.field(key);
                let field = directive_field(rest, key, &directive_path)?;
                self.delete_from_primitive_list(&mut original, field, value, path, &directive_path)?;
                continue;
            }
            if key.starts_with('$') {
                return Err(invalid(
                    &path.field(key),
                    format!(
                        "unknown directive {key:?}; supported are $patch, $retainKeys, \
                         $setElementOrder/<field> and $deleteFromPrimitiveList/<field>"
                    ),
                ));
            }
            if ordered.contains(key.as_str()) {
                continue;
            }
            let child = path.field(key);
            if value.is_null() {
                original.shift_remove(key);
                continue;
            }
            match (original.get_mut(key), value) {
                (Some(Value::Object(old)), Value::Object(new)) => {
                    let old = std::mem::take(old);
                    let merged = self.merge_map(old, new, &child)?;
                    original.insert(key.clone(), Value::Object(merged));
                }
                (Some(Value::Array(old)), Value::Array(new)) => {
                    let old = std::mem::take(old);
                    let merged = self.merge_list(old, new, &child)?;
                    original.insert(key.clone(), Value::Array(merged));
                }
                // Added, or replacing a value of another type: taken over, cleaned.
                _ => match clean(value, &child)? {
                    Some(cleaned) => {
                        original.insert(key.clone(), cleaned);
                    }
                    None => {
                        original.shift_remove(key);
                    }
                },
            }
        }
        Ok(original)
    }

    /// Merges the list `patch` into `original` according to the field's strategy.
    fn merge_list(
        &self,
        original: Vec<Value>,
        patch: &[Value],
        path: &Path<'_>,
    ) -> Result<Vec<Value>, StrategicMergeError> {
        self.check_depth(path)?;
        match list_strategy(self.kind, &path.fields()) {
            ListStrategy::Atomic => clean_list(patch, path),
            ListStrategy::MergePrimitives => merge_primitive_list(original, patch, path),
            ListStrategy::MergeByKey(merge_key) => self.merge_keyed_list(original, patch, merge_key, path),
        }
    }

    /// Merges a list of objects by `merge_key` (Kubernetes' `mergeSlice` for maps).
    fn merge_keyed_list(
        &self,
        original: Vec<Value>,
        patch: &[Value],
        merge_key: &str,
        path: &Path<'_>,
    ) -> Result<Vec<Value>, StrategicMergeError> {
        if original.is_empty() && patch.is_empty() {
            return Ok(original);
        }
        if let Some((i, element)) = original.iter().enumerate().find(|(_, e)| !e.is_object()) {
            return Err(invalid(
                path,
                format!(
                    "the existing list holds {} at index {i}, but its elements are merged by {merge_key:?} and must be objects",
                    json_type(element)
                ),
            ));
        }

        let mut working = original;
        let mut replace = false;
        let mut regular: Vec<(usize, &Map<String, Value>)> = Vec::new();
        for (i, element) in patch.iter().enumerate() {
            let element_path = path.index(i);
            let Value::Object(map) = element else {
                return Err(invalid(
                    &element_path,
                    format!(
                        "the element is {}, but this list merges objects by {merge_key:?}; \
                         send objects (use $deleteFromPrimitiveList only for lists of strings)",
                        json_type(element)
                    ),
                ));
            };
            let require_key = || {
                map.get(merge_key).ok_or_else(|| StrategicMergeError::MissingMergeKey {
                    path: element_path.to_string(),
                    list: path.to_string(),
                    key: merge_key.to_owned(),
                })
            };
            match map.get(DIRECTIVE) {
                None => {
                    require_key()?;
                    regular.push((i, map));
                }
                Some(directive) => match directive.as_str() {
                    Some("delete") => {
                        let doomed = key_of(require_key()?);
                        working.retain(|w| w.get(merge_key).map(key_of).as_ref() != Some(&doomed));
                    }
                    Some("replace") => replace = true,
                    Some("merge") => {
                        require_key()?;
                        regular.push((i, map));
                    }
                    _ => {
                        return Err(invalid(
                            &element_path.field(DIRECTIVE),
                            format!(
                                "unknown patch directive {directive} on a list element; \
                                 $patch must be \"delete\", \"replace\" or \"merge\""
                            ),
                        ));
                    }
                },
            }
        }

        if replace {
            return regular.into_iter().map(|(i, map)| clean_fields(map, &path.index(i)).map(Value::Object)).collect();
        }

        let original_positions = first_positions(&working, Some(merge_key));
        let mut patch_positions: HashMap<Key, usize> = HashMap::with_capacity(regular.len());
        let mut index: HashMap<Key, usize> = HashMap::with_capacity(working.len() + regular.len());
        let mut keys: Vec<Option<Key>> = Vec::with_capacity(working.len() + regular.len());
        for (position, element) in working.iter().enumerate() {
            let key = element.get(merge_key).map(key_of);
            if let Some(k) = &key {
                index.entry(k.clone()).or_insert(position);
            }
            keys.push(key);
        }
        let original_len = working.len();
        for (rank, (i, map)) in regular.into_iter().enumerate() {
            let Some(key_value) = map.get(merge_key) else { continue };
            let key = key_of(key_value);
            patch_positions.entry(key.clone()).or_insert(rank);
            let element_path = path.index(i);
            match index.get(&key) {
                Some(&position) => {
                    let old = match working.get_mut(position) {
                        Some(Value::Object(old)) => std::mem::take(old),
                        _ => Map::new(),
                    };
                    let merged = self.merge_map(old, map, &element_path)?;
                    if let Some(slot) = working.get_mut(position) {
                        *slot = Value::Object(merged);
                    }
                }
                None => {
                    let added = clean_fields(map, &element_path)?;
                    index.insert(key.clone(), working.len());
                    keys.push(Some(key));
                    working.push(Value::Object(added));
                }
            }
        }

        let ranked = working
            .into_iter()
            .zip(keys)
            .enumerate()
            .map(|(position, (value, key))| {
                let (patch_rank, original_rank) = match &key {
                    Some(k) => (patch_positions.get(k).copied(), original_positions.get(k).copied()),
                    // Elements without their key (only possible in a malformed stored
                    // object) cannot be patched; they keep their place.
                    None => (None, (position < original_len).then_some(position)),
                };
                Ranked { value, patch_rank, original_rank }
            })
            .collect();
        Ok(order_elements(ranked))
    }

    /// Handles `$setElementOrder/<field>`: merges the field's list (if the
    /// patch has one) and orders the result by the directive. Returns whether
    /// the field was handled (and so must be skipped by the main loop).
    fn apply_set_element_order(
        &self,
        original: &mut Map<String, Value>,
        patch: &Map<String, Value>,
        field: &str,
        order: &Value,
        path: &Path<'_>,
        directive_path: &Path<'_>,
    ) -> Result<bool, StrategicMergeError> {
        let Value::Array(order) = order else {
            return Err(invalid(
                directive_path,
                format!("$setElementOrder/{field} must be a list, not {}", json_type(order)),
            ));
        };
        let list_path = path.field(field);
        let merge_key = match list_strategy(self.kind, &list_path.fields()) {
            // Lists without a merge strategy are replaced wholesale; there is nothing to order.
            ListStrategy::Atomic => return Ok(false),
            ListStrategy::MergeByKey(k) => Some(k),
            ListStrategy::MergePrimitives => None,
        };
        for (i, element) in order.iter().enumerate() {
            let element_path = directive_path.index(i);
            match merge_key {
                Some(k) => {
                    if !element.is_object() {
                        return Err(invalid(
                            &element_path,
                            format!(
                                "elements of $setElementOrder/{field} must be objects holding {k:?}, not {}",
                                json_type(element)
                            ),
                        ));
                    }
                    if element.get(k).is_none() {
                        return Err(StrategicMergeError::MissingMergeKey {
                            path: element_path.to_string(),
                            list: directive_path.to_string(),
                            key: k.to_owned(),
                        });
                    }
                }
                None => {
                    if !matches!(element, Value::String(_) | Value::Number(_) | Value::Bool(_)) {
                        return Err(invalid(
                            &element_path,
                            format!(
                                "elements of $setElementOrder/{field} must be strings, numbers or booleans, not {}",
                                json_type(element)
                            ),
                        ));
                    }
                }
            }
        }
        let patch_list = match patch.get(field) {
            None => None,
            Some(Value::Array(list)) => Some(list.as_slice()),
            Some(other) => {
                return Err(invalid(
                    &list_path,
                    format!("must be a list when $setElementOrder/{field} is given, not {}", json_type(other)),
                ));
            }
        };
        if let Some(patch_list) = patch_list {
            validate_against_order(patch_list, order, merge_key, &list_path, field)?;
        }

        let original_list = match original.get_mut(field) {
            Some(Value::Array(list)) => Some(std::mem::take(list)),
            _ => None,
        };
        let original_positions = original_list.as_deref().map(|l| first_positions(l, merge_key)).unwrap_or_default();
        let merged = match (original_list, patch_list) {
            (Some(old), Some(new)) => self.merge_list(old, new, &list_path)?,
            (Some(old), None) => old,
            (None, Some(new)) => clean_list(new, &list_path)?,
            (None, None) => return Ok(true),
        };
        let order_positions = first_positions(order, merge_key);
        let ranked = merged
            .into_iter()
            .map(|value| {
                let key = element_key(&value, merge_key);
                let patch_rank = key.as_ref().and_then(|k| order_positions.get(k).copied());
                let original_rank = key.as_ref().and_then(|k| original_positions.get(k).copied());
                Ranked { value, patch_rank, original_rank }
            })
            .collect();
        original.insert(field.to_owned(), Value::Array(order_elements(ranked)));
        Ok(true)
    }

    /// Handles `$deleteFromPrimitiveList/<field>`: removes the listed values.
    fn delete_from_primitive_list(
        &self,
        original: &mut Map<String, Value>,
        field: &str,
        doomed: &Value,
        path: &Path<'_>,
        directive_path: &Path<'_>,
    ) -> Result<(), StrategicMergeError> {
        let expectation = format!("$deleteFromPrimitiveList/{field} must be a list of strings, numbers or booleans");
        let Value::Array(doomed) = doomed else {
            return Err(invalid(directive_path, format!("{expectation}, not {}", json_type(doomed))));
        };
        if let Some(bad) = doomed.iter().find(|v| !matches!(v, Value::String(_) | Value::Number(_) | Value::Bool(_))) {
            return Err(invalid(directive_path, format!("{expectation}; it holds {}", json_type(bad))));
        }
        if let ListStrategy::MergeByKey(k) = list_strategy(self.kind, &path.field(field).fields()) {
            return Err(invalid(
                directive_path,
                format!(
                    "{field} is a list of objects merged by {k:?}; delete its elements with \
                     {{\"{k}\": <value>, \"$patch\": \"delete\"}} instead"
                ),
            ));
        }
        if let Some(Value::Array(list)) = original.get_mut(field) {
            let doomed: HashSet<Key> = doomed.iter().map(key_of).collect();
            list.retain(|v| !doomed.contains(&key_of(v)));
        }
        Ok(())
    }
}

/// A patch value that is taken over rather than merged (the field is new,
/// has another type, or is an atomic list), cleaned the way Kubernetes does:
/// `null` map values are discarded and a map carrying `$patch` is dropped
/// altogether (`discardNullValuesFromPatch` and `removeDirectives`); other
/// `$` keys are dropped too, as the typed decode on a real server drops them.
/// `None` means the value itself is dropped.
fn clean(value: &Value, path: &Path<'_>) -> Result<Option<Value>, StrategicMergeError> {
    if path.depth > MAX_DEPTH {
        return Err(StrategicMergeError::TooDeep { path: path.to_string() });
    }
    Ok(match value {
        Value::Object(map) if map.get(DIRECTIVE).is_some_and(|d| !d.is_null()) => None,
        Value::Object(map) => Some(Value::Object(clean_fields(map, path)?)),
        Value::Array(list) => Some(Value::Array(clean_list(list, path)?)),
        other => Some(other.clone()),
    })
}

/// [`clean`] for the fields of an object (its own `$patch` is ignored).
fn clean_fields(map: &Map<String, Value>, path: &Path<'_>) -> Result<Map<String, Value>, StrategicMergeError> {
    let mut out = Map::new();
    for (key, value) in map {
        if value.is_null() || key.starts_with('$') {
            continue;
        }
        if let Some(cleaned) = clean(value, &path.field(key))? {
            out.insert(key.clone(), cleaned);
        }
    }
    Ok(out)
}

/// [`clean`] for the elements of a list; elements carrying `$patch` are dropped.
fn clean_list(list: &[Value], path: &Path<'_>) -> Result<Vec<Value>, StrategicMergeError> {
    let mut out = Vec::with_capacity(list.len());
    for (i, element) in list.iter().enumerate() {
        if let Some(cleaned) = clean(element, &path.index(i))? {
            out.push(cleaned);
        }
    }
    Ok(out)
}

/// `$setElementOrder/x` / `$deleteFromPrimitiveList/x`: the `x` after the prefix.
fn directive_field<'k>(rest: &'k str, key: &str, path: &Path<'_>) -> Result<&'k str, StrategicMergeError> {
    match rest.strip_prefix('/') {
        Some(field) if !field.is_empty() => Ok(field),
        _ => {
            let prefix = key.get(..key.len() - rest.len()).unwrap_or(key);
            Err(invalid(path, format!("malformed directive {key:?}; write it as {prefix}/<field>")))
        }
    }
}

/// Applies `$retainKeys`: checks the patch only sets listed keys, then drops
/// every key of `original` that is not listed.
fn apply_retain_keys(
    original: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    retain: &Value,
    path: &Path<'_>,
) -> Result<(), StrategicMergeError> {
    let expectation = "$retainKeys must be a list of field names";
    let Value::Array(list) = retain else {
        return Err(invalid(path, format!("{expectation}, not {}", json_type(retain))));
    };
    let mut keep: HashSet<&str> = HashSet::with_capacity(list.len());
    for value in list {
        let Value::String(name) = value else {
            return Err(invalid(path, format!("{expectation}; it holds {}", json_type(value))));
        };
        keep.insert(name);
    }
    if let Some(key) =
        patch.iter().find_map(|(k, v)| (!v.is_null() && !k.starts_with('$') && !keep.contains(k.as_str())).then_some(k))
    {
        return Err(invalid(
            path,
            format!("the patch sets {key:?}, which $retainKeys does not list; add it to $retainKeys"),
        ));
    }
    original.retain(|k, _| keep.contains(k.as_str()));
    Ok(())
}

/// Checks that the patch list names its elements in the same relative order
/// as `$setElementOrder` (Kubernetes' `validatePatchWithSetOrderList`).
fn validate_against_order(
    patch_list: &[Value],
    order: &[Value],
    merge_key: Option<&str>,
    list_path: &Path<'_>,
    field: &str,
) -> Result<(), StrategicMergeError> {
    if order.is_empty() || patch_list.is_empty() {
        return Ok(());
    }
    let kept: Vec<(usize, &Value)> = patch_list
        .iter()
        .enumerate()
        .filter(|(_, v)| merge_key.is_none() || v.get(DIRECTIVE).and_then(Value::as_str) != Some("delete"))
        .collect();
    let (mut p, mut s) = (0, 0);
    while let (Some(&(i, element)), Some(expected)) = (kept.get(p), order.get(s)) {
        if merge_key.is_some() && element.get(DIRECTIVE).is_some() {
            p += 1;
            continue;
        }
        let same = match merge_key {
            Some(k) => {
                let Some(value) = element.get(k) else {
                    return Err(StrategicMergeError::MissingMergeKey {
                        path: list_path.index(i).to_string(),
                        list: list_path.to_string(),
                        key: k.to_owned(),
                    });
                };
                expected.get(k).map(key_of) == Some(key_of(value))
            }
            None => key_of(element) == key_of(expected),
        };
        if same {
            p += 1;
        }
        s += 1;
    }
    if p < kept.len() {
        return Err(invalid(
            list_path,
            format!(
                "the elements of the patch list are not in the order of $setElementOrder/{field} \
                 (or are missing from it); list every patched element there, in the same order"
            ),
        ));
    }
    Ok(())
}

/// Merges a list of primitives as a set union (Kubernetes' `mergeSlice` for scalars).
fn merge_primitive_list(
    original: Vec<Value>,
    patch: &[Value],
    path: &Path<'_>,
) -> Result<Vec<Value>, StrategicMergeError> {
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    let mut element_type: Option<&'static str> = None;
    for element in original.iter().chain(patch) {
        let found = json_type(element);
        match element {
            Value::String(_) | Value::Number(_) | Value::Bool(_) => {}
            Value::Object(_) => {
                return Err(invalid(
                    path,
                    "this list merges strings as a set and has no merge key for objects; send strings",
                ));
            }
            Value::Null | Value::Array(_) => {
                return Err(invalid(path, format!("the list merges strings as a set and cannot hold {found}")));
            }
        }
        match element_type {
            None => element_type = Some(found),
            Some(t) if t != found => {
                return Err(invalid(path, format!("list element types are not identical: {t} and {found}")));
            }
            Some(_) => {}
        }
    }
    let original_positions = first_positions(&original, None);
    let patch_positions = first_positions(patch, None);
    let mut seen: HashSet<Key> = HashSet::with_capacity(original.len() + patch.len());
    let mut ranked = Vec::with_capacity(original.len() + patch.len());
    for value in original.into_iter().chain(patch.iter().cloned()) {
        let key = key_of(&value);
        if seen.contains(&key) {
            continue;
        }
        let patch_rank = patch_positions.get(&key).copied();
        let original_rank = original_positions.get(&key).copied();
        seen.insert(key);
        ranked.push(Ranked { value, patch_rank, original_rank });
    }
    Ok(order_elements(ranked))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on unexpected results
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn ok(original: &Value, patch: &Value, kind: &str) -> Value {
        match apply(original, patch, kind) {
            Ok(v) => v,
            Err(e) => panic!("patch {patch} should apply: {e}"),
        }
    }

    fn err(original: &Value, patch: &Value, kind: &str) -> StrategicMergeError {
        match apply(original, patch, kind) {
            Ok(v) => panic!("patch {patch} should fail, got {v}"),
            Err(e) => e,
        }
    }

    fn pod() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web",
                "namespace": "default",
                "labels": {"app": "web"},
                "finalizers": ["a", "b", "c"],
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "u1", "controller": true}
                ]
            },
            "spec": {
                "containers": [
                    {
                        "name": "app",
                        "image": "nginx:1",
                        "args": ["--a", "--b"],
                        "env": [{"name": "A", "value": "1"}],
                        "ports": [{"containerPort": 80, "protocol": "TCP"}],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]
                    },
                    {"name": "sidecar", "image": "envoy:1"}
                ],
                "volumes": [{"name": "data", "emptyDir": {}}],
                "tolerations": [{"key": "k1", "operator": "Exists"}]
            },
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "Ready", "status": "False"},
                    {"type": "Initialized", "status": "True"}
                ]
            }
        })
    }

    #[test]
    fn kubectl_apply_adds_a_label_and_an_env_var() {
        // What `kubectl apply` sends after a label and an env var were added to the manifest.
        let patch = json!({
            "metadata": {
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}\n"},
                "labels": {"tier": "frontend"}
            },
            "spec": {
                "$setElementOrder/containers": [{"name": "app"}, {"name": "sidecar"}],
                "containers": [{
                    "$setElementOrder/env": [{"name": "A"}, {"name": "B"}],
                    "env": [{"name": "B", "value": "2"}],
                    "name": "app"
                }]
            }
        });
        let out = ok(&pod(), &patch, "Pod");
        assert_eq!(out["metadata"]["labels"], json!({"app": "web", "tier": "frontend"}));
        assert_eq!(out["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"], "{}\n");
        let containers = out["spec"]["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 2);
        assert_eq!(containers[0]["name"], "app");
        assert_eq!(containers[0]["image"], "nginx:1");
        assert_eq!(containers[0]["env"], json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]));
        assert_eq!(containers[1], json!({"name": "sidecar", "image": "envoy:1"}));
        assert!(!out.to_string().contains('$'), "no directive may leak: {out}");
    }

    #[test]
    fn set_element_order_reorders_containers() {
        let patch = json!({"spec": {"$setElementOrder/containers": [{"name": "sidecar"}, {"name": "app"}]}});
        let out = ok(&pod(), &patch, "Pod");
        let names: Vec<&str> =
            out["spec"]["containers"].as_array().unwrap().iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names, ["sidecar", "app"]);
        assert_eq!(out["spec"]["containers"][1]["image"], "nginx:1");
    }

    #[test]
    fn set_element_order_keeps_server_only_elements_in_place() {
        // A sidecar injected by the server (not in the user's manifest) keeps its place.
        let original = json!({"spec": {"containers": [{"name": "a"}, {"name": "injected"}, {"name": "c"}]}});
        let patch = json!({"spec": {
            "$setElementOrder/containers": [{"name": "c"}, {"name": "a"}, {"name": "d"}],
            "containers": [{"name": "d", "image": "x"}]
        }});
        let out = ok(&original, &patch, "Pod");
        let names: Vec<&str> =
            out["spec"]["containers"].as_array().unwrap().iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names, ["injected", "c", "a", "d"]);
    }

    #[test]
    fn patch_delete_removes_a_container() {
        let patch = json!({"spec": {
            "$setElementOrder/containers": [{"name": "app"}],
            "containers": [{"$patch": "delete", "name": "sidecar"}]
        }});
        let out = ok(&pod(), &patch, "Pod");
        assert_eq!(out["spec"]["containers"].as_array().unwrap().len(), 1);
        assert_eq!(out["spec"]["containers"][0]["name"], "app");
    }

    #[test]
    fn delete_from_primitive_list_removes_a_finalizer() {
        let patch = json!({"metadata": {
            "$deleteFromPrimitiveList/finalizers": ["b"],
            "$setElementOrder/finalizers": ["a", "c"]
        }});
        let out = ok(&pod(), &patch, "Pod");
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "c"]));
        // Without the order directive, and for a finalizer that is not there.
        let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["c", "zzz"]}});
        assert_eq!(ok(&pod(), &patch, "Pod")["metadata"]["finalizers"], json!(["a", "b"]));
        // Deleting from a list that does not exist is a no-op.
        let ns = json!({"metadata": {"name": "n"}});
        let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}});
        assert_eq!(ok(&ns, &patch, "Namespace"), ns);
    }

    #[test]
    fn finalizers_merge_as_a_set_like_kubernetes() {
        let original = json!({"metadata": {"finalizers": ["a", "b"]}});
        let out = ok(&original, &json!({"metadata": {"finalizers": ["c"]}}), "ConfigMap");
        assert_eq!(out["metadata"]["finalizers"], json!(["c", "a", "b"]), "new items go first, as on a real cluster");
        let out = ok(&original, &json!({"metadata": {"finalizers": ["b", "c"]}}), "ConfigMap");
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "c"]));
        let out = ok(&original, &json!({"metadata": {"finalizers": ["a", "a"]}}), "Secret");
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b"]));
        let patch = json!({"metadata": {"$setElementOrder/finalizers": ["a", "b", "c"], "finalizers": ["c"]}});
        assert_eq!(ok(&original, &patch, "Secret")["metadata"]["finalizers"], json!(["a", "b", "c"]));
        // Added to an object without finalizers: taken over as sent, as Kubernetes does.
        let out = ok(&json!({"metadata": {}}), &json!({"metadata": {"finalizers": ["x", "y"]}}), "Lease");
        assert_eq!(out["metadata"]["finalizers"], json!(["x", "y"]));
    }

    #[test]
    fn owner_references_merge_by_uid() {
        let patch = json!({"metadata": {"ownerReferences": [
            {"uid": "u1", "blockOwnerDeletion": true},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u2"}
        ]}});
        let out = ok(&pod(), &patch, "Pod");
        let refs = out["metadata"]["ownerReferences"].as_array().unwrap();
        assert_eq!(refs.len(), 2);
        assert_eq!(refs[0]["uid"], "u1");
        assert_eq!(refs[0]["name"], "web-1");
        assert_eq!(refs[0]["blockOwnerDeletion"], true);
        assert_eq!(refs[1]["uid"], "u2");
    }

    #[test]
    fn container_ports_mounts_and_env_merge_by_their_keys() {
        let patch = json!({"spec": {"containers": [{
            "name": "app",
            "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 443}],
            "volumeMounts": [{"mountPath": "/data", "readOnly": true}],
            "env": [{"name": "A", "value": null, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
        }]}});
        let out = ok(&pod(), &patch, "Pod");
        let app = &out["spec"]["containers"][0];
        assert_eq!(
            app["ports"],
            json!([{"containerPort": 80, "protocol": "TCP", "name": "http"}, {"containerPort": 443}])
        );
        assert_eq!(app["volumeMounts"], json!([{"name": "data", "mountPath": "/data", "readOnly": true}]));
        assert_eq!(app["env"], json!([{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]));
        assert_eq!(app["args"], json!(["--a", "--b"]));
    }

    #[test]
    fn new_list_elements_without_set_element_order_go_first() {
        let patch = json!({"spec": {"containers": [{"name": "debug", "image": "busybox"}]}});
        let out = ok(&pod(), &patch, "Pod");
        let names: Vec<&str> =
            out["spec"]["containers"].as_array().unwrap().iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names, ["debug", "app", "sidecar"]);
    }

    #[test]
    fn atomic_lists_are_replaced() {
        let patch = json!({"spec": {
            "tolerations": [{"key": "k2", "operator": "Equal", "value": "v"}],
            "containers": [{"name": "app", "args": ["--c"]}]
        }});
        let out = ok(&pod(), &patch, "Pod");
        assert_eq!(out["spec"]["tolerations"], json!([{"key": "k2", "operator": "Equal", "value": "v"}]));
        assert_eq!(out["spec"]["containers"][0]["args"], json!(["--c"]));
    }

    #[test]
    fn json_merge_patch_semantics_for_maps() {
        let cm = json!({"metadata": {"name": "c", "labels": {"a": "1", "b": "2"}}, "data": {"k": "v", "old": "x"}});
        let patch = json!({"metadata": {"labels": {"a": null, "c": "3"}}, "data": {"old": null, "new": "y"}});
        let out = ok(&cm, &patch, "ConfigMap");
        assert_eq!(
            out,
            json!({"metadata": {"name": "c", "labels": {"b": "2", "c": "3"}}, "data": {"k": "v", "new": "y"}})
        );
        // null for a missing key is ignored; a scalar replaces an object and vice versa.
        let out = ok(&cm, &json!({"missing": null, "data": "flat"}), "ConfigMap");
        assert_eq!(out["data"], "flat");
        assert!(out.get("missing").is_none());
        let out = ok(&json!({"data": "flat"}), &json!({"data": {"k": "v", "gone": null}}), "ConfigMap");
        assert_eq!(out["data"], json!({"k": "v"}));
    }

    #[test]
    fn map_directives() {
        let cm = json!({"metadata": {"name": "c", "labels": {"a": "1", "b": "2"}}});
        let replaced = ok(&cm, &json!({"metadata": {"labels": {"$patch": "replace", "z": "9"}}}), "ConfigMap");
        assert_eq!(replaced["metadata"]["labels"], json!({"z": "9"}));
        let deleted = ok(&cm, &json!({"metadata": {"labels": {"$patch": "delete"}}}), "ConfigMap");
        assert_eq!(deleted["metadata"]["labels"], json!({}));
        let merged = ok(&cm, &json!({"metadata": {"labels": {"$patch": "merge", "c": "3"}}}), "ConfigMap");
        assert_eq!(merged["metadata"]["labels"], json!({"a": "1", "b": "2", "c": "3"}));
        let whole = ok(&cm, &json!({"$patch": "replace", "metadata": {"name": "d"}}), "ConfigMap");
        assert_eq!(whole, json!({"metadata": {"name": "d"}}));
    }

    #[test]
    fn list_replace_directive() {
        let patch = json!({"spec": {"containers": [{"$patch": "replace"}, {"name": "only", "image": "x"}]}});
        let out = ok(&pod(), &patch, "Pod");
        assert_eq!(out["spec"]["containers"], json!([{"name": "only", "image": "x"}]));
    }

    #[test]
    fn list_element_merge_directive_is_a_plain_merge() {
        let patch = json!({"spec": {"containers": [{"$patch": "merge", "name": "sidecar", "image": "envoy:2"}]}});
        let out = ok(&pod(), &patch, "Pod");
        assert_eq!(out["spec"]["containers"][1], json!({"name": "sidecar", "image": "envoy:2"}));
    }

    #[test]
    fn retain_keys_on_a_volume() {
        // What kubectl apply sends when a volume's source changes from emptyDir to hostPath.
        let patch = json!({"spec": {
            "$setElementOrder/volumes": [{"name": "data"}],
            "volumes": [{"$retainKeys": ["hostPath", "name"], "hostPath": {"path": "/srv"}, "name": "data"}]
        }});
        let out = ok(&pod(), &patch, "Pod");
        assert_eq!(out["spec"]["volumes"], json!([{"name": "data", "hostPath": {"path": "/srv"}}]));
    }

    #[test]
    fn conditions_merge_by_type() {
        let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let out = ok(&pod(), &patch, "Pod");
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "Initialized", "status": "True"}])
        );
        let ns = json!({"metadata": {"name": "n"}, "status": {"phase": "Active", "conditions": [{"type": "A", "status": "True"}]}});
        let out = ok(&ns, &json!({"status": {"conditions": [{"type": "B", "status": "False"}]}}), "Namespace");
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "B", "status": "False"}, {"type": "A", "status": "True"}])
        );
    }

    #[test]
    fn service_ports_merge_by_port() {
        let svc = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 443, "targetPort": 8443}]}});
        let patch = json!({"spec": {
            "$setElementOrder/ports": [{"port": 80}, {"port": 443}],
            "ports": [{"port": 443, "targetPort": 9443}]
        }});
        let out = ok(&svc, &patch, "Service");
        assert_eq!(out["spec"]["ports"], json!([{"port": 80, "targetPort": 8080}, {"port": 443, "targetPort": 9443}]));
        // Service has no container lists: a "containers" list there is atomic.
        let out = ok(
            &json!({"spec": {"containers": [{"name": "a"}]}}),
            &json!({"spec": {"containers": [{"x": 1}]}}),
            "Service",
        );
        assert_eq!(out["spec"]["containers"], json!([{"x": 1}]));
    }

    #[test]
    fn lease_and_event_patch_like_merge_patch() {
        let lease = json!({"spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}});
        let out =
            ok(&lease, &json!({"spec": {"holderIdentity": "b", "renewTime": "2024-01-01T00:00:00.000000Z"}}), "Lease");
        assert_eq!(out["spec"]["holderIdentity"], "b");
        assert_eq!(out["spec"]["leaseDurationSeconds"], 15);
        let event = json!({"count": 1, "series": {"count": 2}});
        assert_eq!(ok(&event, &json!({"count": 2}), "Event")["count"], 2);
    }

    #[test]
    fn new_values_are_cleaned_of_nulls_and_directives() {
        let patch =
            json!({"spec": {"containers": [{"name": "new", "image": null, "env": [{"name": "X", "value": null}]}]}});
        let out = ok(&pod(), &patch, "Pod");
        assert_eq!(out["spec"]["containers"][0], json!({"name": "new", "env": [{"name": "X"}]}));
        // A new map carrying $patch is dropped altogether (Kubernetes' removeDirectives).
        let out = ok(&json!({}), &json!({"metadata": {"labels": {"$patch": "replace", "a": "b"}}}), "Pod");
        assert_eq!(out, json!({"metadata": {}}));
        // Nested directives in new values are not interpreted: $setElementOrder is dropped,
        // elements carrying $patch are dropped.
        let patch = json!({"spec": {"containers": [{
            "name": "new",
            "$setElementOrder/env": [{"name": "B"}, {"name": "A"}],
            "env": [{"name": "A"}, {"name": "B"}, {"name": "C", "$patch": "delete"}]
        }]}});
        let out = ok(&json!({"spec": {"containers": []}}), &patch, "Pod");
        assert_eq!(out["spec"]["containers"], json!([{"name": "new", "env": [{"name": "A"}, {"name": "B"}]}]));
        // A value of another type is replaced the same way.
        let out = ok(&json!({"data": "flat"}), &json!({"data": {"k": "v", "gone": null, "$x": 1}}), "ConfigMap");
        assert_eq!(out, json!({"data": {"k": "v"}}));
    }

    #[test]
    fn unsupported_kinds_and_non_object_documents() {
        let e = err(&pod(), &json!({}), "Widget");
        assert_eq!(e, StrategicMergeError::UnsupportedKind { kind: "Widget".into() });
        assert!(e.to_string().contains("application/merge-patch+json"), "{e}");
        assert!(matches!(err(&pod(), &json!([1]), "Pod"), StrategicMergeError::PatchNotObject { found: "a list" }));
        assert!(matches!(err(&pod(), &json!(null), "Pod"), StrategicMergeError::PatchNotObject { .. }));
        assert!(matches!(err(&json!("x"), &json!({}), "Pod"), StrategicMergeError::OriginalNotObject { .. }));
        assert!(is_supported_kind("Pod") && !is_supported_kind("pod"));
    }

    #[test]
    fn malformed_patches_are_rejected_with_a_location() {
        let e = err(&pod(), &json!({"spec": {"containers": [{"image": "x"}]}}), "Pod");
        assert_eq!(
            e,
            StrategicMergeError::MissingMergeKey {
                path: "spec.containers[0]".into(),
                list: "spec.containers".into(),
                key: "name".into()
            }
        );
        assert!(e.to_string().contains("spec.containers[0]"), "{e}");
        let e = err(&pod(), &json!({"spec": {"containers": [{"name": "app", "env": [{"value": "1"}]}]}}), "Pod");
        assert!(
            matches!(&e, StrategicMergeError::MissingMergeKey { path, .. } if path == "spec.containers[0].env[0]"),
            "{e}"
        );
        let cases = [
            json!({"metadata": {"$patch": "bogus"}}),
            json!({"metadata": {"$patch": 1}}),
            json!({"spec": {"containers": [{"name": "app", "$patch": "explode"}]}}),
            json!({"spec": {"containers": ["app"]}}),
            json!({"metadata": {"$retainKeys": "name"}}),
            json!({"metadata": {"$retainKeys": [1]}}),
            json!({"metadata": {"$retainKeys": ["name"], "labels": {"x": "y"}}}),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}}),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [{"a": 1}]}}),
            json!({"metadata": {"$deleteFromPrimitiveList/ownerReferences": ["u1"]}}),
            json!({"metadata": {"$deleteFromPrimitiveList": ["a"]}}),
            json!({"metadata": {"$setElementOrder/": ["a"]}}),
            json!({"spec": {"$setElementOrder/containers": {"name": "app"}}}),
            json!({"spec": {"$setElementOrder/containers": [{"image": "x"}]}}),
            json!({"spec": {"$setElementOrder/containers": ["app"]}}),
            json!({"spec": {"$setElementOrder/containers": [{"name": "app"}], "containers": {"name": "app"}}}),
            json!({"spec": {"$setElementOrder/containers": [{"name": "app"}], "containers": [{"name": "zzz"}]}}),
            json!({"spec": {"$setElementOrder/containers": [{"name": "app"}, {"name": "b"}], "containers": [{"name": "b"}, {"name": "app"}]}}),
            json!({"metadata": {"$setElementOrder/finalizers": [["a"]]}}),
            json!({"metadata": {"finalizers": [1]}}),
            json!({"metadata": {"finalizers": [null]}}),
            json!({"metadata": {"finalizers": [{"name": "a"}]}}),
            json!({"metadata": {"$unknown": 1}}),
        ];
        for patch in cases {
            let e = err(&pod(), &patch, "Pod");
            assert!(
                matches!(e, StrategicMergeError::InvalidPatch { .. } | StrategicMergeError::MissingMergeKey { .. }),
                "{patch}: {e:?}"
            );
        }
        let e = err(&pod(), &json!({"metadata": {"$retainKeys": ["name"], "labels": {"x": "y"}}}), "Pod");
        assert_eq!(
            e.to_string(),
            "invalid strategic merge patch at metadata.$retainKeys: the patch sets \"labels\", which $retainKeys does not list; add it to $retainKeys"
        );
    }

    #[test]
    fn malformed_existing_lists_are_reported_not_panicked_on() {
        let original = json!({"spec": {"containers": ["not-an-object"]}});
        let e = err(&original, &json!({"spec": {"containers": [{"name": "a"}]}}), "Pod");
        assert!(matches!(e, StrategicMergeError::InvalidPatch { .. }), "{e:?}");
        // Existing elements without their key are kept where they are.
        let original = json!({"spec": {"containers": [{"image": "keyless"}, {"name": "a"}]}});
        let out = ok(&original, &json!({"spec": {"containers": [{"name": "a", "image": "x"}]}}), "Pod");
        assert_eq!(out["spec"]["containers"], json!([{"image": "keyless"}, {"name": "a", "image": "x"}]));
    }

    #[test]
    fn numbers_compare_by_value_in_merge_keys() {
        let svc = json!({"spec": {"ports": [{"port": 80, "name": "http"}]}});
        let out = ok(&svc, &json!({"spec": {"ports": [{"port": 80.0, "targetPort": 8080}]}}), "Service");
        assert_eq!(out["spec"]["ports"].as_array().map(Vec::len), Some(1));
        assert_eq!(out["spec"]["ports"][0]["targetPort"], 8080);
    }

    #[test]
    fn deep_patches_are_refused() {
        let mut patch = json!("leaf");
        for _ in 0..(MAX_DEPTH + 5) {
            patch = json!({ "a": patch });
        }
        assert!(matches!(err(&json!({}), &patch, "ConfigMap"), StrategicMergeError::TooDeep { .. }));
    }

    // --- properties ---

    /// RFC 7386 JSON merge patch, the reference for patches without lists or directives.
    fn merge_patch(target: &Value, patch: &Value) -> Value {
        let Value::Object(p) = patch else { return patch.clone() };
        let mut out = match target {
            Value::Object(t) => t.clone(),
            _ => Map::new(),
        };
        for (k, v) in p {
            if v.is_null() {
                out.shift_remove(k);
            } else {
                let merged = merge_patch(out.get(k).unwrap_or(&Value::Null), v);
                out.insert(k.clone(), merged);
            }
        }
        Value::Object(out)
    }

    fn key_name() -> impl Strategy<Value = String> {
        prop_oneof![
            6 => prop::sample::select(vec![
                "metadata", "spec", "status", "labels", "finalizers", "ownerReferences", "uid", "containers",
                "initContainers", "env", "ports", "containerPort", "port", "name", "type", "conditions", "volumes",
                "data", "value",
            ]).prop_map(str::to_owned),
            3 => prop::sample::select(vec![
                "$patch", "$retainKeys", "$setElementOrder/containers", "$setElementOrder/finalizers",
                "$setElementOrder/env", "$deleteFromPrimitiveList/finalizers", "$deleteFromPrimitiveList/args",
                "$setElementOrder", "$x",
            ]).prop_map(str::to_owned),
            1 => "[a-z]{1,3}",
        ]
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-3i64..100).prop_map(Value::from),
            prop::sample::select(vec!["a", "b", "app", "delete", "replace", "merge", "name", "Ready"])
                .prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec((key_name(), inner), 0..6)
                    .prop_map(|kvs| Value::Object(kvs.into_iter().collect())),
            ]
        })
    }

    fn plain_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-3i64..100).prop_map(Value::from),
            "[a-z]{0,3}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 5, |inner| {
            prop::collection::vec(("[a-z]{1,2}", inner), 0..5).prop_map(|kvs| Value::Object(kvs.into_iter().collect()))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn apply_never_panics(
            original in arb_json(),
            patch in arb_json(),
            kind in prop::sample::select(vec!["Pod", "Namespace", "Service", "ConfigMap", "Widget"]),
        ) {
            if let Ok(out) = apply(&original, &patch, kind) {
                prop_assert!(out.is_object());
            }
        }

        #[test]
        fn apply_never_panics_on_object_documents(
            original in prop::collection::vec((key_name(), arb_json()), 0..6),
            patch in prop::collection::vec((key_name(), arb_json()), 0..6),
        ) {
            let original = Value::Object(original.into_iter().collect());
            let patch = Value::Object(patch.into_iter().collect());
            let _ = apply(&original, &patch, "Pod");
        }

        #[test]
        fn without_lists_or_directives_it_is_a_json_merge_patch(
            original in plain_json(),
            patch in plain_json(),
        ) {
            prop_assume!(original.is_object() && patch.is_object());
            let expected = merge_patch(&original, &patch);
            prop_assert_eq!(apply(&original, &patch, "ConfigMap"), Ok(expected));
        }

        #[test]
        fn finalizer_merge_is_a_duplicate_free_union(
            old in prop::collection::vec("[a-e]", 0..6),
            add in prop::collection::vec("[a-e]", 0..6),
            remove in prop::collection::vec("[a-e]", 0..3),
        ) {
            let original = json!({"metadata": {"finalizers": old}});
            let patch = json!({"metadata": {"finalizers": add, "$deleteFromPrimitiveList/finalizers": remove}});
            let out = apply(&original, &patch, "Pod").map_err(|e| TestCaseError::fail(e.to_string()))?;
            let got: Vec<String> = out["metadata"]["finalizers"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
                .unwrap_or_default();
            let unique: HashSet<&String> = got.iter().collect();
            prop_assert_eq!(unique.len(), got.len());
            for f in old.iter().chain(&add) {
                prop_assert_eq!(got.contains(f), !remove.contains(f), "{} in {:?}", f, got);
            }
        }
    }
}
