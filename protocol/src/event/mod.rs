//! The typed event envelope and the event catalogue.
//!
//! * [`kind`] holds [`EventType`] and [`Target`] with their exact wire strings;
//! * [`envelope`] holds [`Event`], its constructors and payload access;
//! * [`attributes`] holds attribute values, extension names and timestamp formats;
//! * [`convert`] converts to and from the protobuf CloudEvent;
//! * [`data`] holds [`JsonData`], the payload shared by every copy of an event;
//! * [`error`] holds [`EventError`].

pub mod attributes;
pub mod convert;
pub mod data;
pub mod envelope;
pub mod error;
pub mod kind;

pub use attributes::{AttributeValue, TraceContext};
pub use convert::{AckRef, DecodeLimits};
pub use data::JsonData;
pub use envelope::{Event, new_uuid};
pub use error::EventError;
pub use kind::{EventType, TYPE_PREFIX, Target};

#[cfg(test)]
mod tests;
