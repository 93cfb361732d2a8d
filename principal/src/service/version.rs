//! `versionapi.Version`: reports the principal's version string.

use protocol::pb::versionapi::version_server::Version;
use protocol::pb::versionapi::{VersionRequest, VersionResponse};
use tonic::{Request, Response, Status};

/// The `Version` service.
#[derive(Debug, Clone)]
pub struct VersionService {
    version: String,
}

impl VersionService {
    /// A service reporting `version`.
    #[must_use]
    pub fn new(version: impl Into<String>) -> Self {
        Self { version: version.into() }
    }
}

#[tonic::async_trait]
impl Version for VersionService {
    async fn version(&self, _request: Request<VersionRequest>) -> Result<Response<VersionResponse>, Status> {
        Ok(Response::new(VersionResponse { version: self.version.clone() }))
    }
}
