//! Access: who may use the principal's agent-facing services. [`authz`] is the one
//! authorization layer (a typed [`authz::Permit`] per call); [`blocklist`] is the operator's list
//! of refused agents it consults.

pub mod authz;
pub mod blocklist;
