//! Waiting for the signals that stop a process.

/// Resolves on SIGINT (Ctrl-C) or SIGTERM. If a handler cannot be installed, that signal is
/// not awaited (the process can still be killed), and the failure is logged.
pub async fn wait() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot install the SIGTERM handler");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        r = tokio::signal::ctrl_c() => if let Err(e) = r { tracing::warn!(error = %e, "cannot wait for Ctrl-C") },
        () = term => {}
    }
}
