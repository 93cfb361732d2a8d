//! Event routing per agent mode: what a hub change sends to an agent, and what an agent's
//! event changes on the hub. The copies themselves are [`super::rules`].

pub mod autonomous;
pub mod gpg;
pub mod managed;
pub mod project;
pub mod repository;
