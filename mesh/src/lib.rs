//! Mesh identity: XFCC, SPIFFE IDs and policy, trusted hops, Workload API sources, mesh profiles.
//!
//! - [`xfcc`]: Envoy's `x-forwarded-client-cert`, parsed structurally into [`xfcc::XfccElement`]s.
//! - [`spiffe`]: [`spiffe::SpiffeId`] parsing and validation per the SPIFFE spec.
//! - [`policy`]: [`policy::SpiffePolicy`], which SPIFFE IDs are agents and which agent each is.
//! - [`identity`]: from a forwarded header (XFCC or `l5d-client-id`) to an authorized agent.
//! - [`trust`]: [`trust::TrustedHops`], the addresses a forwarded header is believed from.
//! - [`profile`]: [`profile::MeshProfile`] defaults for Istio, Linkerd and Envoy.
//! - [`workload`]: SPIFFE Workload API sources (X.509-SVIDs for rustls mTLS, JWT-SVIDs and bundles).
#![forbid(unsafe_code)]

pub mod identity;
pub mod policy;
pub mod profile;
pub mod spiffe;
pub mod trust;
pub mod workload;
pub mod xfcc;

pub use identity::{IdentityError, identity_from_xfcc};
pub use policy::{AuthorizedAgent, PathPattern, PolicyConfigError, PolicyError, SpiffePolicy};
pub use profile::{IdentityHeader, MeshProfile};
pub use spiffe::{SpiffeId, SpiffeIdError, TrustDomain};
pub use trust::{Cidr, CidrError, TrustedHops};
pub use xfcc::{XfccElement, XfccError, XfccParser};
