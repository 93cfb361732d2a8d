//! Kubernetes label and field selectors, parsed and matched the way the real
//! API server does it (`k8s.io/apimachinery/pkg/labels/selector.go` and
//! `k8s.io/apimachinery/pkg/fields/selector.go`).
//!
//! Both parsers take untrusted query-string text (already percent/form
//! decoded by the caller) and never panic: every malformed input yields a
//! [`SelectorError`] whose message names the selector, the offending part and
//! what was expected instead.
//!
//! ```
//! use protocol::selector::{FieldSelector, LabelSelector};
//! use serde_json::json;
//!
//! let labels = LabelSelector::parse("app in (web, api), tier != db, !canary").unwrap();
//! let pod = json!({"metadata": {"name": "p", "namespace": "ns", "labels": {"app": "web"}}});
//! assert!(labels.matches(pod["metadata"]["labels"].as_object()));
//! assert_eq!(labels.to_string(), "app in (api,web),!canary,tier!=db");
//!
//! let fields = FieldSelector::parse("metadata.namespace=ns,metadata.name!=other").unwrap();
//! assert!(fields.matches(&pod));
//! ```

mod field;
mod label;
#[cfg(test)]
mod tests;

pub use field::{FieldOperator, FieldRequirement, FieldSelector};
pub use label::{LabelSelector, Operator, Requirement};

/// Why a label or field selector could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectorError {
    /// The label selector does not follow the selector grammar
    /// (`key`, `!key`, `key=value`, `key!=value`, `key in (a,b)`, ... joined by `,`).
    #[error("invalid label selector {selector:?}: at byte {position}: {message}")]
    LabelSyntax {
        /// The whole selector text.
        selector: String,
        /// Byte offset of the offending token.
        position: usize,
        /// What was found and what was expected instead.
        message: String,
    },
    /// A label key is not a valid qualified name.
    #[error("invalid label selector {selector:?}: invalid label key {key:?}: {reason}")]
    InvalidLabelKey {
        /// The whole selector text (or the rendered requirement).
        selector: String,
        /// The rejected key.
        key: String,
        /// Which rule the key breaks.
        reason: String,
    },
    /// A value is not a valid label value (or not an integer for `>` / `<`).
    #[error("invalid label selector {selector:?}: invalid value {value:?} for label {key:?}: {reason}")]
    InvalidLabelValue {
        /// The whole selector text (or the rendered requirement).
        selector: String,
        /// The key the value belongs to.
        key: String,
        /// The rejected value.
        value: String,
        /// Which rule the value breaks.
        reason: String,
    },
    /// A field selector term has no `=`, `==` or `!=` operator.
    #[error(
        "invalid field selector {selector:?}: can't understand {term:?}; \
         expected <field>=<value>, <field>==<value> or <field>!=<value>"
    )]
    FieldSyntax {
        /// The whole selector text.
        selector: String,
        /// The term that could not be split.
        term: String,
    },
    /// A field selector value has a bad escape or an unescaped `,` / `=`.
    #[error("invalid field selector {selector:?}: in {term:?}: {reason}")]
    FieldValue {
        /// The whole selector text.
        selector: String,
        /// The offending term.
        term: String,
        /// What is wrong with its value and how to write it instead.
        reason: String,
    },
    /// The field selector names a field this server cannot select on.
    #[error("field label not supported: {field}")]
    UnsupportedField {
        /// The unsupported field, e.g. `spec.nodeName`.
        field: String,
    },
}
