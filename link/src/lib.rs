//! The peer half of the protocol, written once for both sides.
//!
//! The principal (one peer per agent) and the agent (one peer: the principal) run the same
//! machinery around the delivery engine of [`protocol::outbox`], and `tests::loadgen` runs it for
//! thousands of simulated agents:
//!
//! * [`mailbox`]: the per-peer outbox shell: push, ACK, reject, what is due now, and which
//!   stream may take it (one attached sender at a time; a replaced stream takes nothing);
//! * [`send`]: the send loop: drains the mailbox onto a stream, with the heartbeat and the
//!   oversize policy;
//! * [`recv`]: the receive side: the next message of a stream (or why there is none), how a
//!   message is classified (ACK, event, undecodable) and which answer each gets;
//! * [`watch`]: the watch -> index driver (`apply` / `delete`, and on every re-list the
//!   deletions the gap hid), used by every Kubernetes watcher of both sides;
//! * [`copies`]: the owner's version of every copy a side keeps in line, and the deletions it
//!   asked for (what to revert, what to recreate, what to let go);
//! * [`known`]: the last version of each object a side has seen or sent.
//!
//! Policies are documented where they live and summarised in `docs/reliability.md`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod copies;
pub mod known;
pub mod mailbox;
pub mod recv;
pub mod send;
#[doc(hidden)]
pub mod testing;
pub mod watch;

use std::sync::{Mutex, MutexGuard, PoisonError};

pub use copies::{Copies, Gone};
pub use known::Known;
pub use mailbox::{Attachment, Mailbox};
pub use recv::{Inbound, Next, Retryable};
pub use send::{SendHooks, SendOptions};
pub use watch::Index;

/// Locks a mutex, recovering the data if a panicking thread poisoned it (every state guarded
/// here is left consistent between statements).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
