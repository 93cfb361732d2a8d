//! `argocd-agent apiserver`: the embedded API server as a process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

/// Flags of `argocd-agent apiserver`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory that holds the objects and the bearer token (the only state).
    #[arg(long, env = "ARGOCD_AGENT_APISERVER_DATA_DIR")]
    data_dir: PathBuf,
    /// Address to listen on; port 0 picks a free port (read it from the kubeconfig).
    #[arg(long, default_value = "127.0.0.1:6443", env = "ARGOCD_AGENT_APISERVER_LISTEN")]
    listen: SocketAddr,
    /// Write a kubeconfig for this server here once it is listening.
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
    /// Events kept for resuming watches; older resourceVersions get 410 Gone.
    #[arg(long, default_value_t = apiserver::DEFAULT_WATCH_HISTORY)]
    watch_history: usize,
    /// Seconds between bookmarks on watches that allow them.
    #[arg(long, default_value_t = apiserver::DEFAULT_BOOKMARK_INTERVAL.as_secs())]
    bookmark_interval: u64,
    /// Run a simulated node: each Pod's container command (and args) runs as a local process on
    /// this machine, as this server's user, so Pods reach Running and `kubectl logs` and
    /// `kubectl exec` work. No images, networking, probes or volumes. For tests and the quickstart
    /// only: never turn it on for a server anything else can reach.
    #[arg(long, env = "ARGOCD_AGENT_APISERVER_SIMULATE_PODS")]
    simulate_pods: bool,
    /// Log level (RUST_LOG syntax).
    #[arg(long, default_value = "info", env = "ARGOCD_AGENT_LOG_LEVEL")]
    log_level: String,
    /// Log format: text or json.
    #[arg(long, default_value = "text", value_parser = ["text", "json"], env = "ARGOCD_AGENT_LOG_FORMAT")]
    log_format: String,
}

/// Run until SIGINT or SIGTERM (or the parent's exit, see [`crate::runtime::signals`]).
///
/// # Errors
/// The server cannot start or the kubeconfig cannot be written.
pub fn run(args: Args) -> anyhow::Result<()> {
    crate::runtime::logging::init(&args.log_level, args.log_format == "json");
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    rt.block_on(async move {
        // Before anything announces the process, so an early SIGTERM still stops it cleanly.
        let mut stop = crate::runtime::signals::install();
        let mut cfg = apiserver::Config::new(&args.data_dir);
        cfg.listen = args.listen;
        cfg.watch_history = args.watch_history;
        cfg.bookmark_interval = Duration::from_secs(args.bookmark_interval.max(1));
        cfg.simulate_pods = args.simulate_pods;
        let server = apiserver::ApiServer::start(cfg).await.context("cannot start the embedded API server")?;
        if let Some(path) = &args.kubeconfig_out {
            server
                .write_kubeconfig(path)
                .with_context(|| format!("cannot write --kubeconfig-out {}", path.display()))?;
            tracing::info!(kubeconfig = %path.display(), "kubeconfig written");
        }
        println!("embedded API server listening on {}", server.url());
        stop.recv().await;
        tracing::info!("shutting down");
        server.shutdown().await;
        Ok(())
    })
}
