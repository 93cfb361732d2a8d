//! The credentials seam: what the agent adds to its stream request so the principal's auth
//! layer can identify it.

use std::sync::Arc;

use tonic::metadata::{MetadataMap, MetadataValue};

/// Adds metadata (credentials) to an outgoing request; called on every (re)connect, so a
/// refreshed token is picked up.
pub type MetadataFn = Arc<dyn Fn(&mut MetadataMap) + Send + Sync>;

/// Upstream's per-RPC auth metadata key; the value is the raw JWT, no `Bearer ` prefix (§2.2).
pub const AUTHORIZATION: &str = "authorization";

/// Sets `authorization: <token>` from `token` when it returns one.
#[must_use]
pub fn bearer_token(token: impl Fn() -> Option<String> + Send + Sync + 'static) -> MetadataFn {
    Arc::new(move |md| {
        if let Some(value) = token().and_then(|t| MetadataValue::try_from(t).ok()) {
            md.insert(AUTHORIZATION, value);
        }
    })
}

/// Adds fixed ASCII headers (invalid names or values are skipped).
#[must_use]
pub fn static_headers(headers: Vec<(String, String)>) -> MetadataFn {
    Arc::new(move |md| {
        for (k, v) in &headers {
            if let (Ok(key), Ok(value)) =
                (tonic::metadata::AsciiMetadataKey::from_bytes(k.as_bytes()), MetadataValue::try_from(v.as_str()))
            {
                md.insert(key, value);
            }
        }
    })
}
