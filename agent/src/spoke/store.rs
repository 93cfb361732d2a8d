//! Typed access to Argo CD objects on the spoke: the store shared with the principal, in `protocol`.

pub use protocol::kube_store::*;
