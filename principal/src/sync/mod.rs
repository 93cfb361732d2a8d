//! The sync core: how Applications, AppProjects, repository secrets and GPG keys travel between
//! the hub and its agents. It reads bottom-up:
//!
//! * [`rules`]: pure copy rules (what an agent's copy or the hub's copy looks like, what belongs
//!   to which agent, what changed);
//! * the indexes (`digest`, `index`, `projects`, `shipped`): the caches the watchers keep and
//!   the periodic resync digests read;
//! * [`hub`]: the shared state (configuration, stores, indexes, peers, the write fence);
//! * [`route`]: what a hub change sends to agents and what an agent's event changes on the hub,
//!   per mode and kind;
//! * [`watch`]: the hub watchers that drive the routes;
//! * [`resync`]: the resync protocol (on connect, on request, periodic);
//! * [`inbound`]: the hub-write router: an agent's event to the route that applies it.
//!
//! The wings (the proxies, Leases, cross-hub HA, registration) live beside this folder, import
//! from it, and are never imported by it.

pub mod rules;

mod digest;
mod index;
mod projects;
mod shipped;

pub mod hub;

pub mod route;

pub mod watch;

pub mod resync;

pub mod inbound;

#[doc(hidden)]
pub mod bench;

#[cfg(test)]
mod tests;
