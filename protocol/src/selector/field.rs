//! Field selectors: `field=value`, `field==value`, `field!=value` joined by `,`, with `\` escapes
//! (`k8s.io/apimachinery/pkg/fields/selector.go`).

use std::fmt;
use std::str::FromStr;

use serde_json::Value;

use super::SelectorError;

/// The only fields this server can select on, for every kind.
const SUPPORTED_FIELDS: [&str; 2] = ["metadata.name", "metadata.namespace"];

/// The operator of one field selector requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FieldOperator {
    /// `field=value` or `field==value`
    Equals,
    /// `field!=value`
    NotEquals,
}

/// One requirement of a field selector.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FieldRequirement {
    pub(super) field: String,
    pub(super) operator: FieldOperator,
    pub(super) value: String,
}

impl FieldRequirement {
    /// The field, e.g. `metadata.name`.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The operator.
    pub fn operator(&self) -> FieldOperator {
        self.operator
    }

    /// The unescaped value.
    pub fn value(&self) -> &str {
        &self.value
    }

    fn matches(&self, obj: &Value) -> bool {
        let actual = field_value(obj, &self.field);
        match self.operator {
            FieldOperator::Equals => actual == self.value,
            FieldOperator::NotEquals => actual != self.value,
        }
    }
}

impl fmt::Display for FieldRequirement {
    /// Renders `field=value` / `field!=value` with `\`, `,` and `=` escaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.field)?;
        f.write_str(match self.operator {
            FieldOperator::Equals => "=",
            FieldOperator::NotEquals => "!=",
        })?;
        f.write_str(&escape_field_value(&self.value))
    }
}

/// A parsed field selector: `field=value`, `field==value` and `field!=value`
/// terms joined by `,`, all of which must hold.
///
/// Only `metadata.name` and `metadata.namespace` are supported (for every
/// kind). Values may escape `\`, `,` and `=` with a backslash. The empty
/// selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct FieldSelector {
    pub(super) requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses a field selector such as `metadata.name=web,metadata.namespace!=kube-system`.
    ///
    /// As in Kubernetes, whitespace is not trimmed: `metadata.name = x` names
    /// the field `"metadata.name "`, which is unsupported.
    ///
    /// # Errors
    ///
    /// [`SelectorError::FieldSyntax`] for a term without `=`, `==` or `!=`;
    /// [`SelectorError::FieldValue`] for an invalid escape sequence or an
    /// unescaped `,` / `=` in a value; [`SelectorError::UnsupportedField`] for
    /// any field other than `metadata.name` and `metadata.namespace`.
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        let parsed = Self::parse_any_field(selector)?;
        if let Some(unsupported) = parsed.unsupported_field(&SUPPORTED_FIELDS) {
            return Err(SelectorError::UnsupportedField { field: unsupported.to_owned() });
        }
        Ok(parsed)
    }

    /// Parses a field selector without checking which fields it names: for a server that knows
    /// per kind which fields are selectable (kube-apiserver's field label conversions), which then
    /// checks them with [`FieldSelector::unsupported_field`] and matches with
    /// [`FieldSelector::matches_with`].
    ///
    /// # Errors
    ///
    /// [`SelectorError::FieldSyntax`] and [`SelectorError::FieldValue`] as [`FieldSelector::parse`].
    pub fn parse_any_field(selector: &str) -> Result<Self, SelectorError> {
        let mut terms = split_field_terms(selector);
        terms.sort_unstable();
        let mut requirements = Vec::with_capacity(terms.len());
        for term in terms.into_iter().filter(|t| !t.is_empty()) {
            let Some((field, operator, raw_value)) = split_field_term(term) else {
                return Err(SelectorError::FieldSyntax { selector: selector.to_owned(), term: term.to_owned() });
            };
            let value = unescape_field_value(raw_value).map_err(|reason| SelectorError::FieldValue {
                selector: selector.to_owned(),
                term: term.to_owned(),
                reason,
            })?;
            requirements.push(FieldRequirement { field: field.to_owned(), operator, value });
        }
        requirements.sort();
        requirements.dedup();
        Ok(FieldSelector { requirements })
    }

    /// Whether every requirement holds for the object. A missing
    /// `metadata.namespace` (cluster-scoped objects) or `metadata.name`
    /// reads as the empty string, as in Kubernetes.
    pub fn matches(&self, obj: &Value) -> bool {
        self.requirements.iter().all(|r| r.matches(obj))
    }

    /// Whether every requirement holds, reading each field's value with `value` (which answers
    /// `""` for a field the object does not have, as Kubernetes' `fields.Set`).
    pub fn matches_with<'v>(&self, mut value: impl FnMut(&str) -> std::borrow::Cow<'v, str>) -> bool {
        self.requirements.iter().all(|r| {
            let actual = value(&r.field);
            match r.operator {
                FieldOperator::Equals => actual == r.value.as_str(),
                FieldOperator::NotEquals => actual != r.value.as_str(),
            }
        })
    }

    /// The first field (in canonical order) that is not in `supported`, if any.
    pub fn unsupported_field(&self, supported: &[&str]) -> Option<&str> {
        self.requirements.iter().map(|r| r.field.as_str()).find(|f| !supported.contains(f))
    }

    /// Whether the selector has no requirements and so matches everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, in canonical order.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// The value `field` must equal for the selector to match, if the
    /// selector has an `=` requirement on it (useful to narrow a list to one
    /// name or namespace before matching).
    pub fn exact_match(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.field == field && r.operator == FieldOperator::Equals)
            .map(|r| r.value.as_str())
    }
}

impl fmt::Display for FieldSelector {
    /// Renders the canonical form, which parses back to an equal selector.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, requirement) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            fmt::Display::fmt(requirement, f)?;
        }
        Ok(())
    }
}

impl FromStr for FieldSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FieldSelector::parse(s)
    }
}

/// The string a supported field has on the object; missing reads as `""`.
fn field_value<'v>(obj: &'v Value, field: &str) -> &'v str {
    let key = match field {
        "metadata.name" => "name",
        "metadata.namespace" => "namespace",
        _ => return "",
    };
    obj.get("metadata").and_then(|m| m.get(key)).and_then(Value::as_str).unwrap_or("")
}

/// Splits on commas that are not escaped with a backslash (escapes are kept).
fn split_field_terms(selector: &str) -> Vec<&str> {
    if selector.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, b) in selector.bytes().enumerate() {
        if escaped {
            escaped = false;
        } else if b == b'\\' {
            escaped = true;
        } else if b == b',' {
            terms.push(&selector[start..i]);
            start = i + 1;
        }
    }
    terms.push(&selector[start..]);
    terms
}

/// Splits a term at the first operator (`!=`, then `==`, then `=` at each position).
fn split_field_term(term: &str) -> Option<(&str, FieldOperator, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for (op, operator) in
            [("!=", FieldOperator::NotEquals), ("==", FieldOperator::Equals), ("=", FieldOperator::Equals)]
        {
            if let Some(value) = rest.strip_prefix(op) {
                return Some((&term[..i], operator, value));
            }
        }
    }
    None
}

/// Resolves `\\`, `\,` and `\=`; rejects other escapes and bare `,` / `=`.
fn unescape_field_value(raw: &str) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(other) => {
                    return Err(format!(
                        "invalid escape sequence \\{other} in value; only \\\\, \\, and \\= are allowed"
                    ));
                }
                None => {
                    return Err("invalid escape sequence: the value ends with a lone '\\'; write \\\\ for a backslash"
                        .to_owned());
                }
            },
            ',' | '=' => {
                return Err(format!("unescaped character {c:?} in value; write \\{c} to select on a literal {c:?}"));
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

/// Escapes `\`, `,` and `=` with a backslash (Kubernetes' `fields.EscapeValue`).
fn escape_field_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
