//! `argocd-agent-loadgen`: N simulated agents in one process against a running principal (see
//! `tests::loadgen`). The principal must run `--insecure-plaintext --auth xfcc:` (each agent
//! forwards its own `x-forwarded-client-cert`, as a mesh sidecar on loopback would).
//!
//! ```text
//! argocd-agent-loadgen --server http://127.0.0.1:8443 [--agents 1000] [--first 1]
//!     [--mode managed|autonomous] [--heartbeat 30] [--keepalive 30] [--status-interval 0]
//!     [--ramp 0] [--trust-domain cluster.local] [--sa-namespace agents] [--duration 0]
//!     [--streams-per-connection 1]
//! ```
//!
//! Durations are in seconds (0 = off; `--duration 0` = until Ctrl-C). Prints the counters every
//! 5 s. Each agent holds one TCP connection (raise `ulimit -n` above the agent count), unless
//! `--streams-per-connection K` (K > 1) puts K agents' streams on one HTTP/2 connection, as a
//! principal's Envoy sidecar multiplexes them upstream: each call still carries its agent's own
//! `x-forwarded-client-cert`, and each agent keeps its own session, stream and reconnects.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tests::loadgen::{LoadConfig, LoadGen};

const USAGE: &str = "usage: argocd-agent-loadgen --server http://127.0.0.1:PORT [--agents N] [--first N] \
    [--mode managed|autonomous] [--heartbeat SECS] [--keepalive SECS] [--status-interval SECS] [--ramp SECS] \
    [--trust-domain TD] [--sa-namespace NS] [--duration SECS] [--streams-per-connection K]";

fn secs(v: &str, flag: &str) -> anyhow::Result<Option<Duration>> {
    let s: f64 = v.parse().with_context(|| format!("{flag} {v:?}: seconds expected"))?;
    Ok((s > 0.0).then(|| Duration::from_secs_f64(s)))
}

fn parse(args: &[String]) -> anyhow::Result<(LoadConfig, Option<Duration>)> {
    let mut config = LoadConfig::new("", 1000);
    let mut duration = None;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = it.next().with_context(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--server" => config.principal_addr = value.clone(),
            "--agents" => config.agents = value.parse().context("--agents")?,
            "--first" => config.first = value.parse().context("--first")?,
            "--mode" => config.mode = value.parse().map_err(|_| anyhow::anyhow!("--mode: managed or autonomous"))?,
            "--heartbeat" => config.heartbeat = secs(value, flag)?,
            "--keepalive" => config.keepalive = secs(value, flag)?,
            "--status-interval" => config.status_interval = secs(value, flag)?,
            "--ramp" => config.ramp = secs(value, flag)?.unwrap_or_default(),
            "--trust-domain" => config.trust_domain = value.clone(),
            "--sa-namespace" => config.sa_namespace = value.clone(),
            "--duration" => duration = secs(value, flag)?,
            "--streams-per-connection" => {
                config.streams_per_connection = value.parse().context("--streams-per-connection: a count expected")?;
                if config.streams_per_connection == 0 {
                    bail!("--streams-per-connection must be at least 1 (1: one connection per agent)");
                }
            }
            _ => bail!("unknown flag {flag}\n{USAGE}"),
        }
    }
    if config.principal_addr.is_empty() {
        bail!("--server is required\n{USAGE}");
    }
    Ok((config, duration))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (config, duration) = parse(&args)?;
    let n = config.agents;
    println!(
        "loadgen: {n} {} agents (agent-{}..) -> {} on {} HTTP/2 connections, heartbeat {:?}, status updates {:?}",
        config.mode,
        config.first,
        config.principal_addr,
        config.connections(),
        config.heartbeat,
        config.status_interval
    );
    let started = Instant::now();
    let load = LoadGen::start(config);
    let stop = async {
        match duration {
            Some(d) => tokio::time::sleep(d).await,
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    tokio::pin!(stop);
    let mut all_resynced = false;
    let mut report = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            () = &mut stop => break,
            _ = report.tick() => {
                let s = load.snapshot();
                println!("{:>7.1}s {s:?}", started.elapsed().as_secs_f64());
                if !all_resynced && load.resynced_since(started) == n {
                    all_resynced = true;
                    println!("all {n} agents connected and resynced after {:.1}s", started.elapsed().as_secs_f64());
                }
            }
        }
    }
    load.stop().await;
    println!("stopped: {:?}", Instant::now().duration_since(started));
    Ok(())
}
