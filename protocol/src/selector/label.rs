//! Label selectors: `key`, `!key`, `key=value`, `key!=value`, `key in (..)`, `key notin (..)`,
//! `key>n`, `key<n`, joined by `,` (`k8s.io/apimachinery/pkg/labels/selector.go`).

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value};

use super::SelectorError;

/// Longest allowed label value, and longest name part of a label key.
const MAX_LABEL_NAME_LEN: usize = 63;
/// Longest allowed DNS-subdomain prefix of a label key.
const MAX_PREFIX_LEN: usize = 253;

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
