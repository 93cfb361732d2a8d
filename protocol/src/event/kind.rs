//! The event catalogue: CloudEvent `type` values and `dataschema` targets
//! (upstream's `internal/event`; docs/compatibility.md).
//!
//! Both enums parse every string: values we do not know are kept verbatim in `Unknown`, so an
//! event from a newer peer is answered and logged rather than failing to decode, and it
//! re-encodes to exactly the string it arrived with.

use std::fmt;

/// The prefix of every argocd-agent event type, followed by `.` and a suffix.
pub const TYPE_PREFIX: &str = "io.argoproj.argocd-agent.event";

/// Declares a string-backed enum with an `Unknown(String)` fallback, a wire-string table and
/// the conversions between them.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $name:ident { $( $(#[$vmeta:meta])* $variant:ident => $wire:expr, )+ }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this build does not know, kept verbatim.
            Unknown(String),
        }

        impl $name {
            /// Every known value, in catalogue order.
            pub const KNOWN: &'static [$name] = &[ $( $name::$variant, )+ ];

            /// The exact string used on the wire.
            #[must_use]
            pub fn as_str(&self) -> &str {
                match self {
                    $( $name::$variant => $wire, )+
                    $name::Unknown(s) => s.as_str(),
                }
            }

            /// Parses a wire string; never fails (unknown values become `Unknown`).
            #[must_use]
            pub fn parse(s: &str) -> Self {
                match s {
                    $( $wire => $name::$variant, )+
                    other => $name::Unknown(other.to_owned()),
                }
            }

            /// Whether this value is one of the catalogue's known values.
            #[must_use]
            pub fn is_known(&self) -> bool {
                !matches!(self, $name::Unknown(_))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self::parse(s)
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                match Self::parse(&s) {
                    $name::Unknown(_) => $name::Unknown(s),
                    known => known,
                }
            }
        }
    };
}

wire_enum! {
    /// The CloudEvent `type` of an argocd-agent event.
    ///
    /// Object and control events use `io.argoproj.argocd-agent.event.<suffix>`; resource and
    /// container-log requests use the bare HTTP method (`GET`, `POST`, ...) instead.
    EventType {
        /// `.create`: a new object (Application, AppProject, repository, GPG keys).
        Create => "io.argoproj.argocd-agent.event.create",
        /// `.delete`: an object was deleted.
        Delete => "io.argoproj.argocd-agent.event.delete",
        /// `.update`: defined upstream, not emitted.
        Update => "io.argoproj.argocd-agent.event.update",
        /// `.spec-update`: the spec (and metadata) of an object changed.
        SpecUpdate => "io.argoproj.argocd-agent.event.spec-update",
        /// `.status-update`: an Application's status changed (agent to principal, managed).
        StatusUpdate => "io.argoproj.argocd-agent.event.status-update",
        /// `.operation-update`: defined upstream, not emitted.
        OperationUpdate => "io.argoproj.argocd-agent.event.operation-update",
        /// `.set-operation`: `.operation` appeared on an Application (principal to agent).
        SetOperation => "io.argoproj.argocd-agent.event.set-operation",
        /// `.terminate-operation`: the running operation is to be terminated.
        TerminateOperation => "io.argoproj.argocd-agent.event.terminate-operation",
        /// `.error`: the agent could not apply an Application ([`crate::payload::ErrorData`]).
        Error => "io.argoproj.argocd-agent.event.error",
        /// `.processed`: the ACK; carries every extension of the acked event, no data.
        Processed => "io.argoproj.argocd-agent.event.processed",
        /// `.ping`: the agent's heartbeat (target `heartbeat`), no data.
        Ping => "io.argoproj.argocd-agent.event.ping",
        /// `.pong`: defined upstream, never emitted.
        Pong => "io.argoproj.argocd-agent.event.pong",
        /// `.get`: defined upstream, never emitted.
        Get => "io.argoproj.argocd-agent.event.get",
        /// `.response`: the answer to a resource request ([`crate::payload::ResourceResponse`]).
        Response => "io.argoproj.argocd-agent.event.response",
        /// `.redis-request` ([`crate::payload::RedisRequest`]).
        RedisRequest => "io.argoproj.argocd-agent.event.redis-request",
        /// `.redis-response` ([`crate::payload::RedisResponse`]).
        RedisResponse => "io.argoproj.argocd-agent.event.redis-response",
        /// `.request-synced-resource-list`: resync, carries the resource-set checksum.
        RequestSyncedResourceList => "io.argoproj.argocd-agent.event.request-synced-resource-list",
        /// `.response-synced-resource`: resync, one resource the source of truth tracks.
        ResponseSyncedResource => "io.argoproj.argocd-agent.event.response-synced-resource",
        /// `.request-update`: resync, asks for a resource whose spec checksum may differ.
        RequestUpdate => "io.argoproj.argocd-agent.event.request-update",
        /// `.request-resource-resync`: resync, asks the peer for `request-update`s.
        RequestResourceResync => "io.argoproj.argocd-agent.event.request-resource-resync",
        /// `.cluster-cache-info-update`: cluster cache statistics (agent to principal).
        ClusterCacheInfoUpdate => "io.argoproj.argocd-agent.event.cluster-cache-info-update",
        /// `.terminal-request`: open a web terminal session.
        TerminalRequest => "io.argoproj.argocd-agent.event.terminal-request",
        /// `GET` (resource or container-log request).
        HttpGet => "GET",
        /// `POST` (resource request).
        HttpPost => "POST",
        /// `PUT` (resource request; not supported upstream).
        HttpPut => "PUT",
        /// `PATCH` (resource request).
        HttpPatch => "PATCH",
        /// `DELETE` (resource request).
        HttpDelete => "DELETE",
        /// `HEAD` (resource request).
        HttpHead => "HEAD",
        /// `OPTIONS` (resource request).
        HttpOptions => "OPTIONS",
    }
}

impl EventType {
    /// Whether this type is a bare HTTP method (resource and container-log requests).
    #[must_use]
    pub fn is_http_method(&self) -> bool {
        matches!(
            self,
            Self::HttpGet
                | Self::HttpPost
                | Self::HttpPut
                | Self::HttpPatch
                | Self::HttpDelete
                | Self::HttpHead
                | Self::HttpOptions
        )
    }

    /// The part after [`TYPE_PREFIX`] and its dot, if this type carries the prefix.
    #[must_use]
    pub fn suffix(&self) -> Option<&str> {
        self.as_str().strip_prefix(TYPE_PREFIX).and_then(|rest| rest.strip_prefix('.'))
    }
}

wire_enum! {
    /// The event target, carried in the CloudEvent `dataschema` attribute. Receivers route on
    /// this alone (upstream `internal/event/targets/targets.go`).
    Target {
        /// `application`: an Argo CD Application.
        Application => "application",
        /// `appproject`: an Argo CD AppProject.
        AppProject => "appproject",
        /// `applicationset`: an ApplicationSet (only between HA principals).
        ApplicationSet => "applicationset",
        /// `repository`: a repository secret (a `corev1.Secret`, credentials included).
        Repository => "repository",
        /// `gpgkey`: the `argocd-gpg-keys-cm` ConfigMap.
        GpgKey => "gpgkey",
        /// `resource`: a resource-proxy request or response.
        Resource => "resource",
        /// `containerlog`: a container log request.
        ContainerLog => "containerlog",
        /// `terminal`: a web terminal request.
        Terminal => "terminal",
        /// `redis`: a redis-proxy request or response.
        Redis => "redis",
        /// `resourceResync`: the resync protocol (§4.13).
        ResourceResync => "resourceResync",
        /// `clusterCacheInfoUpdate`: cluster cache statistics.
        ClusterCacheInfoUpdate => "clusterCacheInfoUpdate",
        /// `heartbeat`: the agent's ping.
        Heartbeat => "heartbeat",
        /// `eventProcessed`: an ACK.
        EventProcessed => "eventProcessed",
        /// `error`: defined in upstream's target list; the `.error` event itself travels with
        /// target `application`.
        Error => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_types_round_trip_through_their_wire_strings() {
        for t in EventType::KNOWN {
            assert_eq!(&EventType::parse(t.as_str()), t);
            assert!(t.is_known());
        }
        for t in Target::KNOWN {
            assert_eq!(&Target::parse(t.as_str()), t);
        }
    }

    #[test]
    fn unknown_values_are_kept_verbatim() {
        let t = EventType::parse("io.argoproj.argocd-agent.event.frobnicate");
        assert_eq!(t, EventType::Unknown("io.argoproj.argocd-agent.event.frobnicate".into()));
        assert_eq!(t.as_str(), "io.argoproj.argocd-agent.event.frobnicate");
        assert_eq!(t.suffix(), Some("frobnicate"));
        assert_eq!(Target::from("somethingNew".to_owned()), Target::Unknown("somethingNew".into()));
        // Case matters on the wire.
        assert_eq!(EventType::parse("get"), EventType::Unknown("get".into()));
        assert_eq!(Target::parse("Application"), Target::Unknown("Application".into()));
    }

    #[test]
    fn catalogue_strings_match_upstream() {
        assert_eq!(EventType::SpecUpdate.as_str(), "io.argoproj.argocd-agent.event.spec-update");
        assert_eq!(EventType::Processed.suffix(), Some("processed"));
        assert_eq!(EventType::HttpGet.suffix(), None);
        assert!(EventType::HttpPatch.is_http_method());
        assert_eq!(Target::ResourceResync.as_str(), "resourceResync");
        assert_eq!(Target::EventProcessed.as_str(), "eventProcessed");
        assert_eq!(Target::ClusterCacheInfoUpdate.as_str(), "clusterCacheInfoUpdate");
        assert_eq!(EventType::from(String::from("DELETE")), EventType::HttpDelete);
    }
}
