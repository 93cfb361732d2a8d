//! A login storm admitted by backpressure (issue 34 item 3): `LOGIN_STORM_AGENTS` (200) agents
//! call `Authenticate` at once against the spawned `argocd-agent principal` (mesh mode,
//! `--insecure-plaintext --auth xfcc:`) whose signing gate lets one call sign at a time with
//! four waiting (`--auth-signing-concurrency 1 --auth-signing-queue 4`). The rest are refused
//! with `RESOURCE_EXHAUSTED` and a retry hint (`grpc-retry-pushback-ms`); the agents (simulated
//! by `tests::loadgen`, which waits the hint as `agent::session` does) come back after it.
//!
//! Asserted, on outcomes only (no timings; 2 noisy cores):
//! - every agent ends authenticated, subscribed and resynced;
//! - every failed `Authenticate` was such a deferral, with a hint: no other error;
//! - the principal counted exactly those refusals on `/metrics`
//!   (`argocd_principal_auth_failures_total{method="xfcc",reason="overloaded"}`), and logged them
//!   in its once-a-second summary line;
//! - with the default RSA-4096 key (signing ~12 ms per call: far slower than 200 agents arrive)
//!   there were refusals; with ES256 (well under a millisecond) there may be none.
//!
//! Run: `cargo build -p cli && cargo test -p tests --test login_storm`.

use std::time::{Duration, Instant};

use tests::loadgen::{LoadConfig, LoadGen};
use tests::loadhub::{LoadHub, LoadPrincipal, progress};

const DEFERRED: &str = "ResourceExhausted with a retry hint";

fn agents() -> usize {
    std::env::var("LOGIN_STORM_AGENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(200)
}

async fn storm(key_type: &str) -> anyhow::Result<()> {
    let hub = LoadHub::start_with_key_type(key_type).await?;
    let flags = ["--auth-signing-concurrency", "1", "--auth-signing-queue", "4"];
    let (principal, _) = LoadPrincipal::start_with(&hub, &hub.keys[0], 0, Instant::now(), &flags)?;
    let n = agents();
    let started = Instant::now();
    let load = LoadGen::start(LoadConfig::new(principal.addr(), n));
    let resynced = load.wait_all_resynced(started, Duration::from_secs(300), progress("login storm", n)).await;
    let snapshot = load.snapshot();
    let failures = load.auth_failures();
    load.stop().await;
    let took = resynced?;

    let deferred = failures.get(DEFERRED).copied().unwrap_or(0);
    println!(
        "{key_type}: {n} agents in {:.2} s; {} authentications, {deferred} deferred with a hint; failures {failures:?}",
        took.as_secs_f64(),
        snapshot.authenticated
    );
    assert!(
        failures.keys().all(|cause| cause == DEFERRED),
        "every failed Authenticate is a RESOURCE_EXHAUSTED deferral with a retry hint: {failures:?}"
    );
    assert_eq!(snapshot.auth_failed, deferred, "{snapshot:?}");
    assert_eq!(snapshot.authenticated, n as u64, "each agent authenticated once: {snapshot:?}");
    assert_eq!(snapshot.subscribe_refused, 0, "{snapshot:?}");
    assert_eq!(snapshot.dial_failed, 0, "{snapshot:?}");

    let counted = principal.metric_sum("argocd_principal_auth_failures_total", "reason=\"overloaded\"").await?;
    assert_eq!(counted, deferred as f64, "the principal counts every deferral by reason on /metrics");
    let all_refusals = principal.metric_sum("argocd_principal_auth_failures_total", "").await?;
    assert_eq!(all_refusals, counted, "no refusal for another reason");
    let log = principal.process.stderr();
    if deferred > 0 {
        assert!(
            log.contains("authentication refused with RESOURCE_EXHAUSTED"),
            "the principal logs its refusals (once a second, with counts)"
        );
    }
    if key_type == "rsa" {
        assert!(deferred > 0, "RSA-4096 signs ~12 ms a call: {n} simultaneous calls overflow a queue of 4");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_storm_is_admitted_with_the_default_rsa_key() -> anyhow::Result<()> {
    storm("rsa").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_storm_is_admitted_with_an_es256_key() -> anyhow::Result<()> {
    storm("ecdsa-p256").await
}
