//! The XFCC parser: a single forward pass over the header with byte offsets for every error.

use super::{Key, XfccElement};

/// Why an XFCC header value was rejected. Offsets are byte offsets into the header value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum XfccError {
    /// The header is longer than the parser accepts.
    #[error("x-forwarded-client-cert is {len} bytes long, more than the limit of {max}")]
    TooLong {
        /// The header's length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The header holds more elements (proxy hops) than the parser accepts.
    #[error("x-forwarded-client-cert has more than {max} elements (proxy hops)")]
    TooManyElements {
        /// The limit.
        max: usize,
    },
    /// The header is empty or only whitespace.
    #[error("x-forwarded-client-cert is empty")]
    EmptyHeader,
    /// An element between commas is empty (`,,`, a leading or a trailing `,`).
    #[error("element {index} of x-forwarded-client-cert is empty (at byte {at})")]
    EmptyElement {
        /// The element's index, from 0.
        index: usize,
        /// Where it starts.
        at: usize,
    },
    /// A pair has no key (`=value`, `;;`, a trailing `;`).
    #[error("empty key at byte {at} of x-forwarded-client-cert")]
    EmptyKey {
        /// Where the key should start.
        at: usize,
    },
    /// A key is not followed by `=`.
    #[error("key {key:?} at byte {at} of x-forwarded-client-cert has no \"=\" and no value")]
    MissingEquals {
        /// The key as written.
        key: String,
        /// Where the key starts.
        at: usize,
    },
    /// A key holds a character keys may not hold (whitespace, `"`, a control character).
    #[error("character {ch:?} at byte {at} of x-forwarded-client-cert is not allowed in a key")]
    BadKeyChar {
        /// The character.
        ch: char,
        /// Where it is.
        at: usize,
    },
    /// A quoted value has no closing quote.
    #[error("unterminated quote: the value starting at byte {at} of x-forwarded-client-cert has no closing '\"'")]
    UnterminatedQuote {
        /// Where the opening quote is.
        at: usize,
    },
    /// Something other than `;`, `,` or the end follows a closing quote.
    #[error("character {ch:?} at byte {at} of x-forwarded-client-cert follows a closing quote; expected ';' or ','")]
    UnexpectedAfterQuote {
        /// The character.
        ch: char,
        /// Where it is.
        at: usize,
    },
    /// A single-valued key (`Hash`, `Cert`, `Chain`, `Subject`) appears twice in one element.
    #[error("key {key:?} appears twice in element {element} (again at byte {at}); only By, URI and DNS may repeat")]
    DuplicateKey {
        /// The key as written the second time.
        key: String,
        /// The element's index, from 0.
        element: usize,
        /// Where the second occurrence starts.
        at: usize,
    },
    /// A key Envoy does not define, rejected by a [strict](XfccParser::strict) parser.
    #[error(
        "unknown key {key:?} at byte {at} of x-forwarded-client-cert (Envoy defines By, Hash, Cert, Chain, Subject, URI, DNS)"
    )]
    UnknownKey {
        /// The key as written.
        key: String,
        /// Where it starts.
        at: usize,
    },
    /// A `Cert` or `Chain` value does not percent-decode to UTF-8 text.
    #[error("the {key} value at byte {at} of x-forwarded-client-cert does not percent-decode to UTF-8 PEM")]
    BadPercentEncoding {
        /// The key as written.
        key: String,
        /// Where the key starts.
        at: usize,
    },
}

/// Parses XFCC header values, within limits against hostile input.
///
/// The default accepts headers up to [`DEFAULT_MAX_LEN`](Self::DEFAULT_MAX_LEN) bytes and
/// [`DEFAULT_MAX_ELEMENTS`](Self::DEFAULT_MAX_ELEMENTS) elements and keeps unknown keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XfccParser {
    max_len: usize,
    max_elements: usize,
    reject_unknown_keys: bool,
}

impl Default for XfccParser {
    fn default() -> Self {
        Self { max_len: Self::DEFAULT_MAX_LEN, max_elements: Self::DEFAULT_MAX_ELEMENTS, reject_unknown_keys: false }
    }
}

impl XfccParser {
    /// Default header length limit: 64 KiB, a little above Envoy's default
    /// `max_request_headers_kb` (60 KiB) for all headers together, so it only bites on input no
    /// Envoy would have forwarded. A URL-encoded leaf PEM is 2–4 KiB.
    pub const DEFAULT_MAX_LEN: usize = 64 * 1024;
    /// Default element limit: one element per proxy hop; real paths have one to three.
    pub const DEFAULT_MAX_ELEMENTS: usize = 32;

    /// A parser that rejects keys Envoy does not define ([`XfccError::UnknownKey`]).
    #[must_use]
    pub fn strict() -> Self {
        Self { reject_unknown_keys: true, ..Self::default() }
    }

    /// Sets the header length limit, in bytes.
    #[must_use]
    pub fn with_max_len(self, max_len: usize) -> Self {
        Self { max_len, ..self }
    }

    /// Sets the element (proxy hop) limit.
    #[must_use]
    pub fn with_max_elements(self, max_elements: usize) -> Self {
        Self { max_elements, ..self }
    }

    /// Parses a header value into its elements, oldest first (the last one was added by the
    /// nearest proxy).
    ///
    /// # Errors
    ///
    /// [`XfccError`]: a limit exceeded, or a syntax error with the byte offset where it is.
    pub fn parse(&self, header: &str) -> Result<Vec<XfccElement>, XfccError> {
        if header.len() > self.max_len {
            return Err(XfccError::TooLong { len: header.len(), max: self.max_len });
        }
        let mut cur = Cursor { s: header, pos: 0 };
        cur.skip_ows();
        if cur.peek().is_none() {
            return Err(XfccError::EmptyHeader);
        }
        let mut elements = Vec::new();
        loop {
            if elements.len() == self.max_elements {
                return Err(XfccError::TooManyElements { max: self.max_elements });
            }
            let element = self.parse_element(&mut cur, elements.len())?;
            elements.push(element);
            // parse_element stops only at the end or at a ','.
            if cur.bump().is_none() {
                return Ok(elements);
            }
        }
    }

    fn parse_element(&self, cur: &mut Cursor<'_>, index: usize) -> Result<XfccElement, XfccError> {
        let mut element = XfccElement::default();
        let mut pairs = 0usize;
        loop {
            cur.skip_ows();
            let key_at = cur.pos;
            let key = cur.take_while(|c| !matches!(c, '=' | ';' | ',' | '"') && !is_ows(c) && !c.is_control());
            cur.skip_ows();
            match cur.peek() {
                Some('=') if !key.is_empty() => {}
                None | Some(',') if key.is_empty() && pairs == 0 => {
                    return Err(XfccError::EmptyElement { index, at: key_at });
                }
                None | Some('=' | ';' | ',') if key.is_empty() => return Err(XfccError::EmptyKey { at: key_at }),
                None | Some(';' | ',') => return Err(XfccError::MissingEquals { key: key.to_owned(), at: key_at }),
                Some(ch) => return Err(XfccError::BadKeyChar { ch, at: cur.pos }),
            }
            cur.bump();
            cur.skip_ows();
            let value = if cur.peek() == Some('"') {
                let value = cur.quoted()?;
                cur.skip_ows();
                match cur.peek() {
                    None | Some(';' | ',') => {}
                    Some(ch) => return Err(XfccError::UnexpectedAfterQuote { ch, at: cur.pos }),
                }
                value
            } else {
                cur.take_while(|c| c != ';' && c != ',').trim_end_matches(is_ows).to_owned()
            };
            self.store(&mut element, index, key, key_at, value)?;
            pairs += 1;
            if cur.peek() != Some(';') {
                return Ok(element);
            }
            cur.bump();
        }
    }

    fn store(
        &self,
        element: &mut XfccElement,
        index: usize,
        key: &str,
        at: usize,
        value: String,
    ) -> Result<(), XfccError> {
        let single = |slot: &mut Option<String>, value: String| {
            if slot.is_some() {
                return Err(XfccError::DuplicateKey { key: key.to_owned(), element: index, at });
            }
            *slot = Some(value);
            Ok(())
        };
        let decoded = |value: &str| {
            percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .map(std::borrow::Cow::into_owned)
                .map_err(|_| XfccError::BadPercentEncoding { key: key.to_owned(), at })
        };
        match Key::lookup(key) {
            Some(Key::By) => element.by.push(value),
            Some(Key::Uri) => element.uris.push(value),
            Some(Key::Dns) => element.dns.push(value),
            Some(Key::Hash) => single(&mut element.hash, value)?,
            Some(Key::Subject) => single(&mut element.subject, value)?,
            Some(Key::Cert) => single(&mut element.cert, decoded(&value)?)?,
            Some(Key::Chain) => single(&mut element.chain, decoded(&value)?)?,
            None if self.reject_unknown_keys => return Err(XfccError::UnknownKey { key: key.to_owned(), at }),
            None => element.unknown.push((key.to_owned(), value)),
        }
        Ok(())
    }
}

/// Optional whitespace, as HTTP defines it (space and horizontal tab).
pub(crate) fn is_ows(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// A position in the header; `pos` always sits on a char boundary because it only moves by
/// whole chars, and every access goes through `str::get`, so no input can make it panic.
struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn rest(&self) -> &'a str {
        self.s.get(self.pos..).unwrap_or_default()
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn take_while(&mut self, keep: impl Fn(char) -> bool) -> &'a str {
        let rest = self.rest();
        let len = rest.find(|c| !keep(c)).unwrap_or(rest.len());
        self.pos += len;
        rest.get(..len).unwrap_or_default()
    }

    fn skip_ows(&mut self) {
        self.take_while(is_ows);
    }

    /// Reads a quoted value; the cursor is on the opening quote.
    fn quoted(&mut self) -> Result<String, XfccError> {
        let open = self.pos;
        self.bump();
        let mut value = String::new();
        loop {
            match self.bump() {
                None => return Err(XfccError::UnterminatedQuote { at: open }),
                Some('"') => return Ok(value),
                Some('\\') => match self.peek() {
                    Some(c @ ('"' | '\\')) => {
                        self.bump();
                        value.push(c);
                    }
                    _ => value.push('\\'),
                },
                Some(c) => value.push(c),
            }
        }
    }
}
