//! Session tokens: what `Authenticate` hands out and every other call must carry.
//!
//! * [`keys`]: the RSA signing key (PEM, generated);
//! * [`token`]: token kinds, claims, lifetimes;
//! * [`issuer`]: signing and verifying (RS512, injectable clock);
//! * [`authority`]: [`Sessions`], which ties methods, tokens and transport bindings together.

pub mod authority;
pub mod issuer;
pub mod keys;
pub mod token;

pub use authority::{Sessions, VerifiedRefresh};
pub use issuer::{
    AccessLifetimeOutOfRange, Clock, ManualClock, SessionIssuer, SystemClock, TokenLifetimes, VerifiedToken,
};
pub use keys::{KeyError, SigningKey};
pub use token::{Claims, IssuedTokens, RefreshedTokens, TokenKind};
