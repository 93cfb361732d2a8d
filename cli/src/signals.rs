//! Waiting for the signals that stop a process.
//!
//! Install the handlers with [`install`] before the process announces itself (e.g. prints the
//! address it listens on): a supervisor may send SIGTERM as soon as it sees that line, and a
//! signal that arrives before its handler exists kills the process without a clean shutdown.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// Installed SIGINT and SIGTERM handlers.
#[derive(Debug)]
pub struct Stop {
    interrupt: Option<Signal>,
    terminate: Option<Signal>,
}

/// Installs the SIGINT and SIGTERM handlers now. A handler that cannot be installed is logged
/// and that signal is not awaited (the process can still be killed).
pub fn install() -> Stop {
    let handler = |kind: SignalKind, name: &str| match signal(kind) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot install the {name} handler");
            None
        }
    };
    Stop {
        interrupt: handler(SignalKind::interrupt(), "SIGINT"),
        terminate: handler(SignalKind::terminate(), "SIGTERM"),
    }
}

impl Stop {
    /// Resolves on the next SIGINT (Ctrl-C) or SIGTERM.
    pub async fn recv(&mut self) {
        async fn next(s: Option<&mut Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
        tokio::select! {
            () = next(self.interrupt.as_mut()) => {}
            () = next(self.terminate.as_mut()) => {}
        }
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM, with handlers installed when first polled.
pub async fn wait() {
    install().recv().await;
}
