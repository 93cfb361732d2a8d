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
//! use apiserver::selector::{FieldSelector, LabelSelector};
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

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value};

/// Longest allowed label value, and longest name part of a label key.
const MAX_LABEL_NAME_LEN: usize = 63;
/// Longest allowed DNS-subdomain prefix of a label key.
const MAX_PREFIX_LEN: usize = 253;

/// The only fields this server can select on, for every kind.
const SUPPORTED_FIELDS: [&str; 2] = ["metadata.name", "metadata.namespace"];

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

// ---------------------------------------------------------------------------
// Label selectors
// ---------------------------------------------------------------------------

/// The operator of one label selector requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    /// `key=value`
    Equals,
    /// `key==value` (same meaning as [`Operator::Equals`])
    DoubleEquals,
    /// `key!=value`; also matches objects without the label.
    NotEquals,
    /// `key in (a,b)`
    In,
    /// `key notin (a,b)`; also matches objects without the label.
    NotIn,
    /// `key` alone: the label exists.
    Exists,
    /// `!key`: the label does not exist.
    DoesNotExist,
    /// `key>n`: the label's value is an integer greater than `n`.
    GreaterThan,
    /// `key<n`: the label's value is an integer less than `n`.
    LessThan,
}

/// One requirement of a label selector: a key, an operator and its values.
///
/// Values of `in` / `notin` are kept sorted and de-duplicated, as Kubernetes
/// does; the other binary operators carry exactly one value and the unary
/// ones none.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    key: String,
    operator: Operator,
    values: Vec<String>,
}

impl Requirement {
    /// Builds a validated requirement.
    ///
    /// # Errors
    ///
    /// [`SelectorError::InvalidLabelKey`] if `key` is not a qualified name,
    /// [`SelectorError::InvalidLabelValue`] if a value is not a label value
    /// (or, for `>` / `<`, not an integer), or if the number of values does not
    /// fit the operator (exactly one for `=`, `==`, `!=`, `>`, `<`; at least one
    /// for `in` / `notin`; none for exists / does-not-exist).
    pub fn new(key: &str, operator: Operator, values: Vec<String>) -> Result<Self, SelectorError> {
        let values = match operator {
            Operator::In | Operator::NotIn => values.into_iter().collect::<BTreeSet<_>>().into_iter().collect(),
            _ => values,
        };
        let requirement = Requirement { key: key.to_owned(), operator, values };
        let rendered = requirement.to_string();
        requirement.validate(&rendered)?;
        Ok(requirement)
    }

    /// The label key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The operator.
    pub fn operator(&self) -> Operator {
        self.operator
    }

    /// The values (sorted for `in` / `notin`, empty for exists / does-not-exist).
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Whether this requirement holds for the given labels.
    ///
    /// A label whose value is not a JSON string counts as present but equal to
    /// no value.
    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        let present = labels.and_then(|l| l.get(&self.key));
        let value = present.and_then(Value::as_str);
        let has_value = |v: &str| self.values.iter().any(|x| x == v);
        match self.operator {
            Operator::Equals | Operator::DoubleEquals | Operator::In => value.is_some_and(has_value),
            Operator::NotEquals | Operator::NotIn => match present {
                None => true,
                Some(_) => !value.is_some_and(has_value),
            },
            Operator::Exists => present.is_some(),
            Operator::DoesNotExist => present.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(label) = value.and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                let Some(bound) = self.values.first().and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan { label > bound } else { label < bound }
            }
        }
    }

    /// Checks the key, the value count and every value; `selector` names the
    /// text the requirement came from in error messages.
    fn validate(&self, selector: &str) -> Result<(), SelectorError> {
        validate_label_key(&self.key).map_err(|reason| SelectorError::InvalidLabelKey {
            selector: selector.to_owned(),
            key: self.key.clone(),
            reason,
        })?;
        let count_error = |reason: &str| SelectorError::InvalidLabelValue {
            selector: selector.to_owned(),
            key: self.key.clone(),
            value: self.values.join(","),
            reason: reason.to_owned(),
        };
        match self.operator {
            Operator::In | Operator::NotIn if self.values.is_empty() => {
                return Err(count_error("for 'in', 'notin' operators, values set can't be empty"));
            }
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals if self.values.len() != 1 => {
                return Err(count_error("exact-match compatibility requires one single value"));
            }
            Operator::Exists | Operator::DoesNotExist if !self.values.is_empty() => {
                return Err(count_error("values set must be empty for exists and does not exist"));
            }
            Operator::GreaterThan | Operator::LessThan => {
                if self.values.len() != 1 {
                    return Err(count_error("for 'gt', 'lt' operators, exactly one value is required"));
                }
                for value in &self.values {
                    if value.parse::<i64>().is_err() {
                        return Err(SelectorError::InvalidLabelValue {
                            selector: selector.to_owned(),
                            key: self.key.clone(),
                            value: value.clone(),
                            reason: "for 'gt', 'lt' operators, the value must be an integer".to_owned(),
                        });
                    }
                }
            }
            _ => {}
        }
        for value in &self.values {
            validate_label_value(value).map_err(|reason| SelectorError::InvalidLabelValue {
                selector: selector.to_owned(),
                key: self.key.clone(),
                value: value.clone(),
                reason,
            })?;
        }
        Ok(())
    }
}

impl fmt::Display for Requirement {
    /// Renders the requirement the way Kubernetes' `Requirement.String()` does.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.operator == Operator::DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        let op = match self.operator {
            Operator::Exists | Operator::DoesNotExist => return Ok(()),
            Operator::Equals => "=",
            Operator::DoubleEquals => "==",
            Operator::NotEquals => "!=",
            Operator::In => " in ",
            Operator::NotIn => " notin ",
            Operator::GreaterThan => ">",
            Operator::LessThan => "<",
        };
        f.write_str(op)?;
        let set = matches!(self.operator, Operator::In | Operator::NotIn);
        if set {
            f.write_str("(")?;
        }
        f.write_str(&self.values.join(","))?;
        if set {
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// A parsed label selector: requirements that must all hold (logical AND).
///
/// The empty selector (parsed from `""` or whitespace) matches everything.
/// Requirements are kept sorted by key, as Kubernetes does, so [`Display`]
/// renders the canonical form that parses back to an equal selector.
///
/// [`Display`]: fmt::Display
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses a label selector such as `app=web,tier in (a, b),!canary`.
    ///
    /// Whitespace (space, tab, CR, LF) may surround any token. The words `in`
    /// and `notin` are operators after a key but plain identifiers as keys and
    /// values, exactly as in Kubernetes.
    ///
    /// # Errors
    ///
    /// [`SelectorError::LabelSyntax`] for text that does not follow the grammar
    /// (for example an unclosed `(`, a dangling `,`, a missing operator, or a
    /// NUL byte); [`SelectorError::InvalidLabelKey`] /
    /// [`SelectorError::InvalidLabelValue`] for keys and values that are not
    /// valid label keys and values.
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        let items = lex(selector)?;
        let mut parser = Parser { selector, items, position: 0 };
        let mut requirements = parser.parse()?;
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector { requirements })
    }

    /// Builds a selector from already validated requirements (sorted by key).
    pub fn from_requirements(mut requirements: Vec<Requirement>) -> Self {
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        LabelSelector { requirements }
    }

    /// Whether every requirement holds for an object's `metadata.labels`
    /// (`None` when the object has no labels).
    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether the selector has no requirements and so matches everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }
}

impl fmt::Display for LabelSelector {
    /// Renders the canonical form: requirements sorted by key, joined by `,`,
    /// set values sorted (Kubernetes' `Selector.String()`).
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

impl FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LabelSelector::parse(s)
    }
}

// --- lexer -----------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    End,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

#[derive(Debug, Clone, Copy)]
struct Item<'a> {
    token: Token,
    literal: &'a str,
    position: usize,
}

impl Item<'_> {
    /// How the item reads in an error message.
    fn describe(&self) -> String {
        if self.token == Token::End { "end of string".to_owned() } else { format!("'{}'", self.literal) }
    }
}

fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special_symbol(b: u8) -> bool {
    matches!(b, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

/// Splits the selector into tokens, ending with one [`Token::End`].
fn lex(selector: &str) -> Result<Vec<Item<'_>>, SelectorError> {
    let bytes = selector.as_bytes();
    let mut items = Vec::new();
    let mut pos = 0;
    loop {
        while pos < bytes.len() && is_whitespace(bytes[pos]) {
            pos += 1;
        }
        let Some(&b) = bytes.get(pos) else {
            items.push(Item { token: Token::End, literal: "", position: pos });
            return Ok(items);
        };
        if b == 0 {
            // Kubernetes' lexer silently stops at a NUL byte and ignores the rest;
            // refusing is safer than selecting on a truncated selector.
            return Err(SelectorError::LabelSyntax {
                selector: selector.to_owned(),
                position: pos,
                message: "found a NUL byte, which is not allowed in a selector".to_owned(),
            });
        }
        let start = pos;
        let token = if is_special_symbol(b) {
            let two = bytes.get(pos..pos + 2);
            let (token, len) = match (b, two) {
                (b'!', Some(b"!=")) => (Token::NotEquals, 2),
                (b'=', Some(b"==")) => (Token::DoubleEquals, 2),
                (b'!', _) => (Token::DoesNotExist, 1),
                (b'=', _) => (Token::Equals, 1),
                (b'(', _) => (Token::OpenPar, 1),
                (b')', _) => (Token::ClosedPar, 1),
                (b',', _) => (Token::Comma, 1),
                (b'>', _) => (Token::GreaterThan, 1),
                _ => (Token::LessThan, 1),
            };
            pos += len;
            token
        } else {
            while pos < bytes.len() && !is_special_symbol(bytes[pos]) && !is_whitespace(bytes[pos]) && bytes[pos] != 0 {
                pos += 1;
            }
            match &selector[start..pos] {
                "in" => Token::In,
                "notin" => Token::NotIn,
                _ => Token::Identifier,
            }
        };
        // Token boundaries are ASCII bytes, so the slice is on char boundaries.
        items.push(Item { token, literal: &selector[start..pos], position: start });
    }
}

// --- parser ----------------------------------------------------------------

/// Whether `in` / `notin` are read as operators or as plain identifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

#[derive(Debug)]
struct Parser<'a> {
    selector: &'a str,
    items: Vec<Item<'a>>,
    position: usize,
}

impl<'a> Parser<'a> {
    fn item(&self, index: usize, context: Context) -> Item<'a> {
        let fallback = Item { token: Token::End, literal: "", position: self.selector.len() };
        let mut item = self.items.get(index).or(self.items.last()).copied().unwrap_or(fallback);
        if context == Context::Values && matches!(item.token, Token::In | Token::NotIn) {
            item.token = Token::Identifier;
        }
        item
    }

    fn lookahead(&self, context: Context) -> Item<'a> {
        self.item(self.position, context)
    }

    fn consume(&mut self, context: Context) -> Item<'a> {
        let item = self.item(self.position, context);
        if self.position + 1 < self.items.len() {
            self.position += 1;
        }
        item
    }

    fn syntax_error(&self, item: Item<'_>, expected: &str) -> SelectorError {
        SelectorError::LabelSyntax {
            selector: self.selector.to_owned(),
            position: item.position,
            message: format!("found {}, expected {expected}", item.describe()),
        }
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut requirements = Vec::new();
        loop {
            let item = self.lookahead(Context::Values);
            match item.token {
                Token::Identifier | Token::DoesNotExist => {
                    requirements.push(self.parse_requirement()?);
                    let next = self.consume(Context::Values);
                    match next.token {
                        Token::End => return Ok(requirements),
                        Token::Comma => {
                            let after = self.lookahead(Context::Values);
                            if !matches!(after.token, Token::Identifier | Token::DoesNotExist) {
                                return Err(self.syntax_error(after, "a key or '!key' after ','"));
                            }
                        }
                        _ => return Err(self.syntax_error(next, "',' or end of string")),
                    }
                }
                Token::End => return Ok(requirements),
                _ => return Err(self.syntax_error(item, "'!', a key, or end of string")),
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<Requirement, SelectorError> {
        let mut item = self.consume(Context::Values);
        let negated = item.token == Token::DoesNotExist;
        if negated {
            item = self.consume(Context::Values);
        }
        if item.token != Token::Identifier {
            return Err(self.syntax_error(item, "a label key"));
        }
        let key = item.literal;
        validate_label_key(key).map_err(|reason| SelectorError::InvalidLabelKey {
            selector: self.selector.to_owned(),
            key: key.to_owned(),
            reason,
        })?;
        let next = self.lookahead(Context::Values);
        let unary = if negated {
            Some(Operator::DoesNotExist)
        } else if matches!(next.token, Token::End | Token::Comma) {
            Some(Operator::Exists)
        } else {
            None
        };
        let requirement = if let Some(operator) = unary {
            Requirement { key: key.to_owned(), operator, values: Vec::new() }
        } else {
            let op_item = self.consume(Context::KeyAndOperator);
            let operator = match op_item.token {
                Token::In => Operator::In,
                Token::NotIn => Operator::NotIn,
                Token::Equals => Operator::Equals,
                Token::DoubleEquals => Operator::DoubleEquals,
                Token::NotEquals => Operator::NotEquals,
                Token::GreaterThan => Operator::GreaterThan,
                Token::LessThan => Operator::LessThan,
                _ => {
                    return Err(self.syntax_error(
                        op_item,
                        "an operator after the key: in, notin, =, ==, !=, >, <, or ',' / end of string",
                    ));
                }
            };
            let values = if matches!(operator, Operator::In | Operator::NotIn) {
                self.parse_values()?
            } else {
                vec![self.parse_exact_value()?]
            };
            Requirement { key: key.to_owned(), operator, values }
        };
        requirement.validate(self.selector)?;
        Ok(requirement)
    }

    /// Parses `(a,b,...)`; the result is sorted and de-duplicated.
    fn parse_values(&mut self) -> Result<Vec<String>, SelectorError> {
        let open = self.consume(Context::Values);
        if open.token != Token::OpenPar {
            return Err(self.syntax_error(open, "'(' to start the value list"));
        }
        let first = self.lookahead(Context::Values);
        match first.token {
            Token::Identifier | Token::Comma => {
                let values = self.parse_identifiers_list()?;
                let close = self.consume(Context::Values);
                if close.token != Token::ClosedPar {
                    return Err(self.syntax_error(close, "')' to close the value list"));
                }
                Ok(values.into_iter().map(str::to_owned).collect())
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                Ok(vec![String::new()])
            }
            _ => Err(self.syntax_error(first, "a value, ',' or ')'")),
        }
    }

    /// Parses a possibly empty, comma separated list of possibly empty values
    /// up to (not including) the closing parenthesis.
    fn parse_identifiers_list(&mut self) -> Result<BTreeSet<&'a str>, SelectorError> {
        let mut values = BTreeSet::new();
        loop {
            let item = self.consume(Context::Values);
            match item.token {
                Token::Identifier => {
                    values.insert(item.literal);
                    let next = self.lookahead(Context::Values);
                    match next.token {
                        Token::Comma => {}
                        Token::ClosedPar => return Ok(values),
                        _ => return Err(self.syntax_error(next, "',' or ')'")),
                    }
                }
                Token::Comma => {
                    if values.is_empty() {
                        values.insert("");
                    }
                    let next = self.lookahead(Context::Values);
                    if next.token == Token::ClosedPar {
                        values.insert("");
                        return Ok(values);
                    }
                    if next.token == Token::Comma {
                        self.consume(Context::Values);
                        values.insert("");
                    }
                }
                _ => return Err(self.syntax_error(item, "a value or ','")),
            }
        }
    }

    /// Parses the single value after `=`, `==`, `!=`, `>` or `<` (may be empty).
    fn parse_exact_value(&mut self) -> Result<String, SelectorError> {
        let next = self.lookahead(Context::Values);
        if matches!(next.token, Token::End | Token::Comma) {
            return Ok(String::new());
        }
        let item = self.consume(Context::Values);
        if item.token == Token::Identifier {
            Ok(item.literal.to_owned())
        } else {
            Err(self.syntax_error(item, "a value"))
        }
    }
}

// --- validation ------------------------------------------------------------

const QUALIFIED_NAME_RULE: &str = "must consist of alphanumeric characters, '-', '_' or '.', \
     and must start and end with an alphanumeric character (e.g. 'MyName', or 'my.name', or '123-abc', \
     regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

const DNS_SUBDOMAIN_RULE: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric \
     characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', \
     regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

const LABEL_VALUE_RULE: &str = "a valid label must be an empty string or consist of alphanumeric characters, \
     '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue', or 'my_value', \
     or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*`
fn is_dns1123_subdomain(s: &str) -> bool {
    let is_lower_alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    s.split('.').all(|label| {
        let b = label.as_bytes();
        match (b.first(), b.last()) {
            (Some(first), Some(last)) => {
                is_lower_alnum(first) && is_lower_alnum(last) && b.iter().all(|c| is_lower_alnum(c) || *c == b'-')
            }
            _ => false,
        }
    })
}

/// Validates a label key like Kubernetes' `IsQualifiedName`; the error names
/// every rule the key breaks.
fn validate_label_key(key: &str) -> Result<(), String> {
    let mut errors = Vec::new();
    let parts: Vec<&str> = key.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_owned());
            } else if prefix.len() > MAX_PREFIX_LEN {
                errors.push(format!("prefix part must be no more than {MAX_PREFIX_LEN} characters"));
            } else if !is_dns1123_subdomain(prefix) {
                errors.push(format!("prefix part {DNS_SUBDOMAIN_RULE}"));
            }
            *name
        }
        _ => {
            return Err(format!(
                "a qualified name {QUALIFIED_NAME_RULE} with an optional DNS subdomain prefix and '/' \
                 (e.g. 'example.com/MyName'); it must contain at most one '/'"
            ));
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else if name.len() > MAX_LABEL_NAME_LEN {
        errors.push(format!("name part must be no more than {MAX_LABEL_NAME_LEN} characters"));
    }
    if !name.is_empty() && !is_qualified_name_part(name) {
        errors.push(format!("name part {QUALIFIED_NAME_RULE}"));
    }
    if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
}

/// Validates a label value like Kubernetes' `IsValidLabelValue`.
fn validate_label_value(value: &str) -> Result<(), String> {
    if value.len() > MAX_LABEL_NAME_LEN {
        return Err(format!("must be no more than {MAX_LABEL_NAME_LEN} characters"));
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        return Err(LABEL_VALUE_RULE.to_owned());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Field selectors
// ---------------------------------------------------------------------------

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
    field: String,
    operator: FieldOperator,
    value: String,
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
    requirements: Vec<FieldRequirement>,
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
        if let Some(unsupported) = requirements.iter().find(|r| !SUPPORTED_FIELDS.contains(&r.field.as_str())) {
            return Err(SelectorError::UnsupportedField { field: unsupported.field.clone() });
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on unexpected results
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

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
        for s in ["  app = web ,tier in(a,b) , ! x ", "app=web,\ttier\nin\r(a , b),!x", "app= web,tier in (  a,b  ),!x"]
        {
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
}
