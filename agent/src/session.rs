//! The agent's session with the principal: authenticate (retrying with backoff), keep the
//! tokens fresh for as long as the agent runs, and refresh at once when the principal refuses
//! the stream's session (expired, revoked, blocklisted), authenticating again when the refresh
//! is refused too. The connection reads the current access token on every (re)connect
//! ([`Session::stream_credentials`]), so it never holds a stale one.

use std::sync::Arc;
use std::time::Duration;

use protocol::pb::authapi::authentication_client::AuthenticationClient;
use tokio::sync::Notify;
use tonic::transport::Channel;

use crate::credentials::MetadataFn;

/// First and longest pause between authentication attempts.
const RETRY_INITIAL: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The agent's credentials with the principal, and what keeps them valid.
pub struct Session {
    channel: Channel,
    credentials: Arc<auth::Credentials>,
    params: auth::AuthParams,
    /// Notified by the connection when the principal refuses the stream's session.
    renew: Arc<Notify>,
    /// gzip on the `Authentication` calls (`--enable-compression`, as upstream's agent).
    compression: bool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("method", &self.params.method).finish_non_exhaustive()
    }
}

impl Session {
    /// A session authenticating with `params` through `channel` (the `Authentication` service
    /// of the principal), holding its tokens in `credentials`.
    #[must_use]
    pub fn new(channel: Channel, credentials: auth::Credentials, params: auth::AuthParams) -> Self {
        Self { channel, credentials: Arc::new(credentials), params, renew: Arc::new(Notify::new()), compression: false }
    }

    /// The same session with its `Authentication` calls gzip-compressed when `on`
    /// (`--enable-compression`: upstream's agent compresses every call).
    #[must_use]
    pub fn with_compression(mut self, on: bool) -> Self {
        self.compression = on;
        self
    }

    fn client(&self) -> AuthenticationClient<Channel> {
        crate::compression::auth_client(self.channel.clone(), self.compression)
    }

    /// Authenticates, retrying with backoff until it succeeds. Errors that retrying cannot fix
    /// (a refused certificate, a version mismatch) are logged each time with what to change.
    pub async fn authenticate(&self) -> auth::PrincipalInfo {
        authenticate(&mut self.client(), &self.credentials, &self.params).await
    }

    /// What every stream request carries: the current access token, then `extra` (e.g. a
    /// JWT-SVID) when given.
    #[must_use]
    pub fn stream_credentials(&self, extra: Option<auth::CallMetadata>) -> MetadataFn {
        let credentials = self.credentials.clone();
        let bearer = crate::credentials::bearer_token(move || credentials.access_token());
        match extra {
            None => bearer,
            Some(extra) => Arc::new(move |md: &mut tonic::metadata::MetadataMap| {
                bearer(md);
                extra(md);
            }),
        }
    }

    /// Where the connection reports a refused session.
    pub(crate) fn renew(&self) -> Arc<Notify> {
        self.renew.clone()
    }

    /// Keeps the session fresh until dropped; when it ends (refresh refused, the principal
    /// restarted with another key), authenticates again.
    pub(crate) async fn keep(&self) {
        let mut client = self.client();
        loop {
            let e = tokio::select! {
                e = self.credentials.keep_fresh(&mut client) => e,
                // The principal refused the stream's session: refresh now rather than when due.
                () = self.renew.notified() => match self.credentials.refresh(&mut client).await {
                    Ok(()) => {
                        tracing::info!("the principal refused the session; refreshed it");
                        continue;
                    }
                    Err(e) => e,
                },
            };
            tracing::warn!(error = %e, "session ended; authenticating again");
            authenticate(&mut client, &self.credentials, &self.params).await;
        }
    }
}

async fn authenticate(
    client: &mut AuthenticationClient<Channel>,
    credentials: &auth::Credentials,
    params: &auth::AuthParams,
) -> auth::PrincipalInfo {
    let mut delay = RETRY_INITIAL;
    loop {
        match credentials.authenticate(client, params).await {
            Ok(info) => {
                tracing::info!(agent = %info.agent_name, principal_version = %info.version, "authenticated to the principal");
                return info;
            }
            Err(e) => {
                crate::metrics::global().auth_failed();
                tracing::warn!(error = %e, retry_in = ?delay, "authentication failed");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(RETRY_MAX);
    }
}
