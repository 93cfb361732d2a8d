//! The agent's session with the principal: authenticate (retrying with backoff), keep the
//! tokens fresh for as long as the agent runs, and refresh at once when the principal refuses
//! the stream's session (expired, revoked, blocklisted), authenticating again when the refresh
//! is refused too. The connection reads the current access token on every (re)connect
//! ([`Session::stream_credentials`]), so it never holds a stale one.
//!
//! With TLS that is reloaded ([`crate::AgentTls::Reloading`]: a reissued client certificate), the
//! session moves to a new connection as soon as the configuration changes and authenticates
//! again there, so its tokens are bound to the certificate the next stream will present (the
//! principal binds each token to the certificate it was issued over). The live stream carries on
//! with its session until that ends, then reconnects with the new certificate and token.

use std::sync::Arc;
use std::time::Duration;

use protocol::pb::authapi::authentication_client::AuthenticationClient;
use tokio::sync::{Notify, watch};
use tonic::transport::Channel;

use crate::transport::AgentTls;

use crate::credentials::MetadataFn;

/// First and longest pause between authentication attempts.
const RETRY_INITIAL: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The agent's credentials with the principal, and what keeps them valid.
pub struct Session {
    channel: std::sync::Mutex<Channel>,
    /// How to dial the principal again when the TLS configuration is reloaded.
    redial: Option<Redial>,
    credentials: Arc<auth::Credentials>,
    params: auth::AuthParams,
    /// Notified by the connection when the principal refuses the stream's session.
    renew: Arc<Notify>,
    /// gzip on the `Authentication` calls (`--enable-compression`, as upstream's agent).
    compression: bool,
    /// How a redial reaches the principal (`--enable-websocket`).
    wire: crate::transport::Wire,
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
        Self {
            channel: std::sync::Mutex::new(channel),
            redial: None,
            credentials: Arc::new(credentials),
            params,
            renew: Arc::new(Notify::new()),
            compression: false,
            wire: crate::transport::Wire::Http2,
        }
    }

    /// The same session, moving to a new connection to `addr` (with `keepalive`) whenever `tls`
    /// is [`AgentTls::Reloading`] and its configuration changes (see the module docs). Other
    /// TLS never changes, and this is a no-op.
    #[must_use]
    pub fn redialing(mut self, addr: &str, tls: &AgentTls, keepalive: Option<std::time::Duration>) -> Self {
        if let AgentTls::Reloading { config, .. } = tls {
            self.redial = Some(Redial { addr: addr.to_owned(), tls: tls.clone(), keepalive, changes: config.clone() });
        }
        self
    }

    /// The same session with its `Authentication` calls gzip-compressed when `on`
    /// (`--enable-compression`: upstream's agent compresses every call).
    #[must_use]
    pub fn with_compression(mut self, on: bool) -> Self {
        self.compression = on;
        self
    }

    /// The same session, redialling over `wire` (the wire its channel was made with).
    #[must_use]
    pub fn over(mut self, wire: crate::transport::Wire) -> Self {
        self.wire = wire;
        self
    }

    fn client(&self) -> AuthenticationClient<Channel> {
        let channel = self.channel.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        crate::compression::auth_client(channel, self.compression)
    }

    /// Authenticates, retrying with backoff until it succeeds. Errors that retrying cannot fix
    /// (a refused certificate, a version mismatch) are logged each time with what to change.
    pub async fn authenticate(&self) -> auth::PrincipalInfo {
        let mut delay = RETRY_INITIAL;
        loop {
            // A fresh client each attempt: the channel may have been redialled meanwhile.
            match self.credentials.authenticate(&mut self.client(), &self.params).await {
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

    /// Moves the session to a new connection made with the current TLS configuration.
    fn redial(&self, redial: &Redial) {
        match crate::transport::lazy_channel_over(&redial.addr, Some(&redial.tls), redial.keepalive, self.wire) {
            Ok(channel) => *self.channel.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = channel,
            Err(e) => tracing::warn!(error = %e, "cannot redial the principal; the session keeps its connection"),
        }
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
    /// restarted with another key), authenticates again. When the TLS configuration is reloaded,
    /// authenticates again on a new connection (see the module docs).
    pub(crate) async fn keep(&self) {
        let mut changes = self.redial.as_ref().map(|r| r.changes.clone());
        loop {
            let mut client = self.client();
            let outcome = tokio::select! {
                e = self.credentials.keep_fresh(&mut client) => Outcome::Ended(e),
                // The principal refused the stream's session: refresh now rather than when due.
                () = self.renew.notified() => match self.credentials.refresh(&mut client).await {
                    Ok(()) => {
                        tracing::info!("the principal refused the session; refreshed it");
                        continue;
                    }
                    Err(e) => Outcome::Ended(e),
                },
                () = tls_changed(&mut changes) => Outcome::TlsChanged,
            };
            match outcome {
                Outcome::Ended(e) => tracing::warn!(error = %e, "session ended; authenticating again"),
                Outcome::TlsChanged => {
                    tracing::info!("TLS configuration reloaded: authenticating again on a new connection");
                    if let Some(redial) = &self.redial {
                        self.redial(redial);
                    }
                }
            }
            self.authenticate().await;
        }
    }
}

/// How [`Session::keep`]'s wait ended.
enum Outcome {
    Ended(auth::ClientError),
    TlsChanged,
}

/// What [`Session::redialing`] keeps.
struct Redial {
    addr: String,
    tls: AgentTls,
    keepalive: Option<std::time::Duration>,
    changes: watch::Receiver<Arc<rustls::ClientConfig>>,
}

/// Resolves when the watched TLS configuration changes; never without one (or once its sender
/// is gone).
async fn tls_changed(changes: &mut Option<watch::Receiver<Arc<rustls::ClientConfig>>>) {
    if let Some(rx) = changes.as_mut()
        && rx.changed().await.is_ok()
    {
        return;
    }
    *changes = None;
    std::future::pending::<()>().await;
}
