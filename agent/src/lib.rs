//! The spoke side: connection lifecycle, inbound handlers, spoke watchers, resync.
#![forbid(unsafe_code)]
