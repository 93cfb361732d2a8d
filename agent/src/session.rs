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
    /// The version presented instead of ours, learnt from an upstream principal that refused
    /// ours (see [`Session::authenticate`]).
    presented_version: std::sync::Mutex<Option<String>>,
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
            presented_version: std::sync::Mutex::new(None),
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
    /// (a refused certificate) are logged each time with what to change.
    ///
    /// The version handshake: an upstream principal (v0.8.0 on) accepts only its own bare
    /// version in `AuthRequest.version` and refuses ours with `FailedPrecondition`, while ours
    /// accepts our qualified version and upstream releases. So the agent presents its own
    /// version first; when a principal refuses it as a version mismatch, the agent reads the
    /// principal's version from the unauthenticated `versionapi.Version`
    /// (`argocd-agent-<version>`), presents that (bare, as upstream's agents send it) from then
    /// on, and says so in its log. A principal of ours never takes that path.
    pub async fn authenticate(&self) -> auth::PrincipalInfo {
        let mut delay = RETRY_INITIAL;
        loop {
            let params = self.params_to_present();
            // A fresh client each attempt: the channel may have been redialled meanwhile.
            match self.credentials.authenticate(&mut self.client(), &params).await {
                Ok(info) => {
                    tracing::info!(agent = %info.agent_name, principal_version = %info.version, "authenticated to the principal");
                    return info;
                }
                Err(auth::ClientError::Refused { status, .. })
                    if status.code() == tonic::Code::FailedPrecondition
                        && self.learn_principal_version(&params).await =>
                {
                    continue;
                }
                Err(e) => {
                    crate::metrics::global().auth_failed();
                    // A login storm: the principal queues what it can sign and refuses the rest
                    // with RESOURCE_EXHAUSTED and the time to come back; wait that (with
                    // jitter) instead of our own backoff, which neither grows nor resets.
                    if let Some(hint) = e.retry_after() {
                        let wait = auth::admission::hinted_random(hint);
                        tracing::info!(error = %e, retry_in = ?wait, "authentication deferred by the principal");
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    tracing::warn!(error = %e, retry_in = ?delay, "authentication failed");
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(RETRY_MAX);
        }
    }

    /// The `AuthRequest` to send: ours, with the version learnt from the principal if any.
    fn params_to_present(&self) -> auth::AuthParams {
        let mut params = self.params.clone();
        if let Some(version) = link::lock(&self.presented_version).clone() {
            params.version = version;
        }
        params
    }

    /// After a version mismatch: reads the principal's version and, when it names a release
    /// other than the one `sent` presented, keeps it for the next attempts. Returns whether the
    /// next attempt presents another version.
    async fn learn_principal_version(&self, sent: &auth::AuthParams) -> bool {
        let channel = self.channel.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let mut client = protocol::pb::versionapi::version_client::VersionClient::new(channel);
        let asked = client.version(protocol::pb::versionapi::VersionRequest {});
        let answer = match tokio::time::timeout(RETRY_MAX, asked).await {
            Ok(Ok(answer)) => answer.into_inner().version,
            Ok(Err(status)) => {
                tracing::warn!(error = %status.message(), "version mismatch, and the principal's version cannot be read");
                return false;
            }
            Err(_) => return false,
        };
        match version_to_present(&answer) {
            Some(version) if version != sent.version => {
                tracing::info!(principal_version = %answer, presented = %version, ours = %self.params.version,
                    "the principal accepts only its own version in the handshake (upstream's rule): presenting it");
                *link::lock(&self.presented_version) = Some(version);
                true
            }
            _ => {
                tracing::warn!(principal_version = %answer, presented = %sent.version,
                    "the principal refused this agent's version and names no release to present instead");
                false
            }
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

/// What to present in `AuthRequest.version` to a principal whose `versionapi.Version` answered
/// `answer`: upstream's principal answers `argocd-agent-<version>` there and compares
/// `AuthRequest.version` with the bare `<version>` (what its own agents send). `None` when the
/// answer names no release.
fn version_to_present(answer: &str) -> Option<String> {
    let bare = answer.trim().strip_prefix(auth::version::QUALIFIED_PREFIX)?;
    bare.parse::<auth::ReleaseVersion>().is_ok().then(|| bare.to_owned())
}

#[cfg(test)]
mod version_tests {
    use super::version_to_present;

    #[test]
    fn an_upstream_principal_gets_its_own_bare_version() {
        assert_eq!(version_to_present("argocd-agent-0.10.0").as_deref(), Some("0.10.0"));
        assert_eq!(version_to_present("argocd-agent-v0.8.1").as_deref(), Some("v0.8.1"));
        assert_eq!(version_to_present("argocd-agent-99.9.9-unreleased").as_deref(), Some("99.9.9-unreleased"));
        assert_eq!(version_to_present("0.10.0"), None, "not upstream's versionapi answer");
        assert_eq!(version_to_present("argocd-agent-"), None);
        assert_eq!(version_to_present("something-else"), None);
    }
}
