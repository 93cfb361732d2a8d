//! SPIFFE IDs (`spiffe/spiffe` `standards/SPIFFE-ID.md`): `spiffe://<trust-domain>/<path>`.
//!
//! Validation follows the spec and go-spiffe: the scheme is exactly `spiffe://`; the trust domain
//! is `[a-z0-9._-]`, non-empty, at most 255 bytes; the path is `/`-separated segments of
//! `[a-zA-Z0-9._-]`, none empty, `.` or `..`, no trailing `/`, no percent-encoding; no userinfo,
//! port, query or fragment (their delimiters are not allowed characters); at most 2048 bytes.

use std::fmt;
use std::str::FromStr;

/// Why a string is not a valid SPIFFE ID or trust domain; worded like the spec.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpiffeIdError {
    /// The input is empty.
    #[error("cannot be empty")]
    Empty,
    /// The input does not start with `spiffe://`.
    #[error("scheme is missing or invalid: a SPIFFE ID starts with \"spiffe://\"")]
    WrongScheme,
    /// Nothing between `spiffe://` and the path.
    #[error("trust domain is missing")]
    MissingTrustDomain,
    /// A trust domain character outside `[a-z0-9._-]`.
    #[error(
        "trust domain characters are limited to lowercase letters, numbers, dots, dashes, and underscores \
         (found {ch:?} at byte {at})"
    )]
    BadTrustDomainChar {
        /// The character.
        ch: char,
        /// Its byte offset in the input.
        at: usize,
    },
    /// The trust domain is longer than the spec allows.
    #[error("trust domain is {len} bytes long, more than the maximum of {max}")]
    TrustDomainTooLong {
        /// Its length in bytes.
        len: usize,
        /// The maximum, [`TrustDomain::MAX_LEN`].
        max: usize,
    },
    /// A path segment character outside `[a-zA-Z0-9._-]`.
    #[error(
        "path segment characters are limited to letters, numbers, dots, dashes, and underscores \
         (found {ch:?} at byte {at})"
    )]
    BadPathSegmentChar {
        /// The character.
        ch: char,
        /// Its byte offset in the input.
        at: usize,
    },
    /// An empty path segment (`//`).
    #[error("path cannot contain empty segments (at byte {at})")]
    EmptySegment {
        /// Byte offset of the segment in the input.
        at: usize,
    },
    /// A `.` or `..` path segment.
    #[error("path cannot contain dot segments (at byte {at})")]
    DotSegment {
        /// Byte offset of the segment in the input.
        at: usize,
    },
    /// The path ends with `/`.
    #[error("path cannot have a trailing slash")]
    TrailingSlash,
    /// The ID is longer than implementations must support.
    #[error("SPIFFE ID is {len} bytes long, more than the maximum of {max}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The maximum, [`SpiffeId::MAX_LEN`].
        max: usize,
    },
}

// === TrustDomain ===

/// A SPIFFE trust domain name, such as `cluster.local`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrustDomain(String);

impl TrustDomain {
    /// The longest trust domain name, in bytes.
    pub const MAX_LEN: usize = 255;

    /// Validates a trust domain name (without scheme).
    ///
    /// # Errors
    ///
    /// [`SpiffeIdError::MissingTrustDomain`], [`SpiffeIdError::BadTrustDomainChar`] or
    /// [`SpiffeIdError::TrustDomainTooLong`].
    pub fn new(name: &str) -> Result<Self, SpiffeIdError> {
        validate_trust_domain(name, 0)?;
        Ok(Self(name.to_owned()))
    }

    /// For names known to be valid at compile time (profile defaults; checked by a test).
    pub(crate) fn from_static(name: &'static str) -> Self {
        Self(name.to_owned())
    }

    /// The name as a string slice.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TrustDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for TrustDomain {
    type Err = SpiffeIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

fn validate_trust_domain(name: &str, offset: usize) -> Result<(), SpiffeIdError> {
    if name.is_empty() {
        return Err(SpiffeIdError::MissingTrustDomain);
    }
    if let Some((i, ch)) = name.char_indices().find(|&(_, c)| !is_trust_domain_char(c)) {
        return Err(SpiffeIdError::BadTrustDomainChar { ch, at: offset + i });
    }
    if name.len() > TrustDomain::MAX_LEN {
        return Err(SpiffeIdError::TrustDomainTooLong { len: name.len(), max: TrustDomain::MAX_LEN });
    }
    Ok(())
}

fn is_trust_domain_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | '_')
}

/// Whether `c` may appear in a SPIFFE ID path segment (`[a-zA-Z0-9._-]`).
#[must_use]
pub fn is_path_segment_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')
}

// === SpiffeId ===

/// A valid SPIFFE ID: a trust domain and a path (empty, or `/`-separated segments).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpiffeId {
    trust_domain: TrustDomain,
    path: String,
}

impl SpiffeId {
    /// The longest SPIFFE ID, in bytes: the spec requires support up to 2048 bytes, and we accept
    /// no more.
    pub const MAX_LEN: usize = 2048;
    const SCHEME: &'static str = "spiffe://";

    /// Parses and validates a SPIFFE ID.
    ///
    /// # Errors
    ///
    /// [`SpiffeIdError`] naming the first rule the input breaks (and where).
    pub fn parse(id: &str) -> Result<Self, SpiffeIdError> {
        if id.is_empty() {
            return Err(SpiffeIdError::Empty);
        }
        if id.len() > Self::MAX_LEN {
            return Err(SpiffeIdError::TooLong { len: id.len(), max: Self::MAX_LEN });
        }
        let rest = id.strip_prefix(Self::SCHEME).ok_or(SpiffeIdError::WrongScheme)?;
        let offset = Self::SCHEME.len();
        let (td, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
        validate_trust_domain(td, offset)?;
        validate_path(path, offset + td.len())?;
        Ok(Self { trust_domain: TrustDomain(td.to_owned()), path: path.to_owned() })
    }

    /// Builds a SPIFFE ID from a trust domain and path segments (`["ns", "argocd", "sa", "x"]`).
    ///
    /// # Errors
    ///
    /// [`SpiffeIdError`] for a bad segment (one holding `/` included) or an ID longer than
    /// [`Self::MAX_LEN`].
    pub fn from_segments<'s>(
        trust_domain: &TrustDomain,
        segments: impl IntoIterator<Item = &'s str>,
    ) -> Result<Self, SpiffeIdError> {
        let mut id = format!("{}{}", Self::SCHEME, trust_domain);
        for segment in segments {
            // A '/' would silently split one segment into two; reject it where it is.
            if let Some(i) = segment.find('/') {
                return Err(SpiffeIdError::BadPathSegmentChar { ch: '/', at: id.len() + 1 + i });
            }
            id.push('/');
            id.push_str(segment);
        }
        Self::parse(&id)
    }

    /// The trust domain.
    #[must_use]
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.trust_domain
    }

    /// The path: empty, or starting with `/`.
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The path segments, in order (none for a trust domain's own ID).
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.path.split('/').skip(1)
    }

    /// The form Istio's `AuthorizationPolicy` `principals` use: the ID without `spiffe://`.
    #[must_use]
    pub fn istio_principal(&self) -> String {
        format!("{}{}", self.trust_domain, self.path)
    }
}

fn validate_path(path: &str, offset: usize) -> Result<(), SpiffeIdError> {
    if path.is_empty() {
        return Ok(());
    }
    // Segment offsets: `path` starts with '/', each segment follows its '/'.
    let mut at = offset;
    let mut segments = path.split('/').skip(1).peekable();
    while let Some(segment) = segments.next() {
        at += 1;
        if segment.is_empty() {
            return Err(if segments.peek().is_none() {
                SpiffeIdError::TrailingSlash
            } else {
                SpiffeIdError::EmptySegment { at }
            });
        }
        if let Some((i, ch)) = segment.char_indices().find(|&(_, c)| !is_path_segment_char(c)) {
            return Err(SpiffeIdError::BadPathSegmentChar { ch, at: at + i });
        }
        if segment == "." || segment == ".." {
            return Err(SpiffeIdError::DotSegment { at });
        }
        at += segment.len();
    }
    Ok(())
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{}", Self::SCHEME, self.trust_domain, self.path)
    }
}

impl FromStr for SpiffeId {
    type Err = SpiffeIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}
