//! Which agent is calling: authenticators, session tokens, the tower auth layer.
#![forbid(unsafe_code)]
