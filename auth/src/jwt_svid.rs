//! The agent's side of `spiffe:jwt`: a JWT-SVID for the principal's audience, fetched from the
//! agent's own SPIFFE Workload API and kept fresh in the background, so the synchronous
//! metadata hooks (stream open, `Authenticate`, `RefreshToken`) always have a current one.
//!
//! JWT-SVIDs are short-lived (SPIRE's default is 5 minutes): a new one is fetched when half of
//! the current one's lifetime has passed, and failures are retried with backoff while the
//! current one is still valid. An expired SVID is never sent.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use mesh::workload::{FetchedJwtSvid, JwtIdentity, WorkloadError};
use tokio::task::JoinHandle;
use tonic::metadata::MetadataValue;

use crate::client::CallMetadata;
use crate::method::spiffe_jwt::SpiffeJwtAuthenticator;

/// Shortest pause between fetches.
const MIN_REFRESH: Duration = Duration::from_secs(1);
/// First and longest pause after a failed fetch.
const RETRY_INITIAL: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

#[derive(Clone)]
struct Current {
    token: String,
    expires_at: SystemTime,
}

/// A JWT-SVID for one audience, refreshed in the background until dropped.
pub struct JwtSvidSource {
    audience: String,
    current: Arc<RwLock<Option<Current>>>,
    task: JoinHandle<()>,
}

impl fmt::Debug for JwtSvidSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtSvidSource")
            .field("audience", &self.audience)
            .field("expires_at", &self.read().as_ref().map(|c| c.expires_at))
            .finish_non_exhaustive()
    }
}

impl Drop for JwtSvidSource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl JwtSvidSource {
    /// Fetches the first JWT-SVID for `audience` from `identity` and starts refreshing it.
    ///
    /// # Errors
    ///
    /// The Workload API error when the first fetch fails (the agent cannot authenticate).
    pub async fn start(identity: JwtIdentity, audience: impl Into<String>) -> Result<Self, WorkloadError> {
        let audience = audience.into();
        let first = identity.fetch_svid(&audience).await?;
        let current = Arc::new(RwLock::new(Some(current_of(&first))));
        let task = tokio::spawn(refresh_loop(identity, audience.clone(), current.clone(), first.expires_at()));
        Ok(Self { audience, current, task })
    }

    /// The current JWT-SVID, unless it has expired and no new one could be fetched.
    #[must_use]
    pub fn token(&self) -> Option<String> {
        self.read().as_ref().filter(|c| c.expires_at > SystemTime::now()).map(|c| c.token.clone())
    }

    /// Metadata that presents the current JWT-SVID in `x-spiffe-jwt-svid` (for
    /// [`crate::Credentials::with_call_metadata`] and the agent's stream).
    #[must_use]
    pub fn call_metadata(self: &Arc<Self>) -> CallMetadata {
        let this = self.clone();
        Arc::new(move |md| {
            if let Some(value) = this.token().and_then(|t| MetadataValue::try_from(t).ok()) {
                md.insert(SpiffeJwtAuthenticator::HEADER, value);
            }
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Option<Current>> {
        self.current.read().unwrap_or_else(PoisonError::into_inner)
    }
}

fn current_of(svid: &FetchedJwtSvid) -> Current {
    Current { token: svid.token().to_owned(), expires_at: svid.expires_at() }
}

/// Half of what is left of a lifetime ending at `expires_at`, at least [`MIN_REFRESH`].
fn refresh_after(expires_at: SystemTime) -> Duration {
    expires_at.duration_since(SystemTime::now()).map_or(MIN_REFRESH, |left| (left / 2).max(MIN_REFRESH))
}

async fn refresh_loop(
    identity: JwtIdentity,
    audience: String,
    current: Arc<RwLock<Option<Current>>>,
    mut expires_at: SystemTime,
) {
    let mut retry = RETRY_INITIAL;
    let mut wait = refresh_after(expires_at);
    loop {
        tokio::time::sleep(wait).await;
        match identity.fetch_svid(&audience).await {
            Ok(svid) => {
                expires_at = svid.expires_at();
                *current.write().unwrap_or_else(PoisonError::into_inner) = Some(current_of(&svid));
                tracing::debug!(%audience, "JWT-SVID refreshed");
                retry = RETRY_INITIAL;
                wait = refresh_after(expires_at);
            }
            Err(error) => {
                tracing::warn!(%error, %audience, ?retry, "cannot fetch a JWT-SVID from the Workload API; retrying");
                wait = retry;
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refreshes_at_half_life_never_below_the_floor() {
        let in_ten = SystemTime::now() + Duration::from_secs(10);
        let after = refresh_after(in_ten);
        assert!(after <= Duration::from_secs(5) && after >= Duration::from_secs(4), "{after:?}");
        assert_eq!(refresh_after(SystemTime::now() - Duration::from_secs(1)), MIN_REFRESH);
        assert_eq!(refresh_after(SystemTime::now() + Duration::from_millis(100)), MIN_REFRESH);
    }
}
