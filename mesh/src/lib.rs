//! Mesh identity: XFCC, SPIFFE IDs and policy, trusted hops, Workload API sources, mesh profiles.
#![forbid(unsafe_code)]
