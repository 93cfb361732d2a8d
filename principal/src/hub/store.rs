//! Typed access to Argo CD objects on the hub: the store shared with the agent, in `protocol`.

pub use protocol::kube_store::*;
