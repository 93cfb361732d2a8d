//! Waiting for what stops a process: SIGINT, SIGTERM, or the death of the parent that asked
//! for it.
//!
//! Install the handlers with [`install`] before the process announces itself (e.g. prints the
//! address it listens on): a supervisor may send SIGTERM as soon as it sees that line, and a
//! signal that arrives before its handler exists kills the process without a clean shutdown.
//!
//! Exiting with the parent: a parent that sets [`EXIT_WITH_PARENT_ENV`] and gives the child the
//! read end of a pipe as stdin (keeping the write end, close-on-exec, to itself) gets a child
//! that shuts down when that pipe reaches end-of-file. The kernel closes the write end however
//! the parent ends, SIGKILL and the OOM killer included, so the child cannot outlive it. This is
//! how `argocd-agent quickstart` ties its API servers, principal and agents to itself. The
//! shutdown takes the same path as SIGTERM; if it has not finished within [`PARENT_GONE_GRACE`]
//! the process exits anyway.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;

/// Set (to any value) by a parent whose pipe is this process's stdin: the process shuts down
/// when the pipe closes, i.e. when the parent exits, however it exits.
pub const EXIT_WITH_PARENT_ENV: &str = "ARGOCD_AGENT_EXIT_WITH_PARENT";

/// How long the graceful shutdown may take after the parent is gone before the process exits
/// regardless (no parent is left to wait for it or to kill it).
pub const PARENT_GONE_GRACE: Duration = Duration::from_secs(10);

/// Installed SIGINT and SIGTERM handlers, and the parent's pipe when one is watched.
#[derive(Debug)]
pub struct Stop {
    interrupt: Option<Signal>,
    terminate: Option<Signal>,
    parent_gone: Option<watch::Receiver<bool>>,
}

/// Installs the SIGINT and SIGTERM handlers now, and starts watching the parent's pipe when
/// [`EXIT_WITH_PARENT_ENV`] is set. A handler that cannot be installed is logged and that signal
/// is not awaited (the process can still be killed).
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
        parent_gone: parent_watch(),
    }
}

impl Stop {
    /// Resolves on the next SIGINT (Ctrl-C) or SIGTERM, or once the parent is gone (then on
    /// every call).
    pub async fn recv(&mut self) {
        async fn next(s: Option<&mut Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
        async fn gone(w: Option<&mut watch::Receiver<bool>>) {
            // An error means the watcher thread is gone without seeing end-of-file: keep
            // waiting for the signals.
            if let Some(w) = w
                && w.wait_for(|gone| *gone).await.is_ok()
            {
                return;
            }
            std::future::pending::<()>().await;
        }
        tokio::select! {
            () = next(self.interrupt.as_mut()) => {}
            () = next(self.terminate.as_mut()) => {}
            () = gone(self.parent_gone.as_mut()) => {}
        }
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM, or when the parent is gone, with handlers installed
/// when first polled.
pub async fn wait() {
    install().recv().await;
}

/// The parent-pipe watcher, started once per process on first use; `None` when not asked for or
/// stdin is not a pipe.
fn parent_watch() -> Option<watch::Receiver<bool>> {
    static WATCH: OnceLock<Option<watch::Receiver<bool>>> = OnceLock::new();
    WATCH.get_or_init(start_parent_watch).clone()
}

fn start_parent_watch() -> Option<watch::Receiver<bool>> {
    std::env::var_os(EXIT_WITH_PARENT_ENV)?;
    if !stdin_is_pipe() {
        // Reading a terminal or /dev/null would stop the process for the wrong reason.
        tracing::warn!("{EXIT_WITH_PARENT_ENV} is set but stdin is not a pipe: not watching for the parent's exit");
        return None;
    }
    let (tx, rx) = watch::channel(false);
    let spawned = std::thread::Builder::new().name("parent-watch".into()).spawn(move || {
        // A plain thread, not a runtime task: a blocking read would hold up the runtime's
        // shutdown, and this thread must not.
        if let Err(e) = read_to_eof() {
            tracing::warn!(error = %e, "cannot read the parent's pipe on stdin: not watching for the parent's exit");
            return;
        }
        tracing::warn!("the parent process is gone (its pipe on stdin closed): shutting down");
        tx.send_replace(true);
        std::thread::sleep(PARENT_GONE_GRACE);
        eprintln!("argocd-agent: the parent process is gone and shutdown took over {PARENT_GONE_GRACE:?}: exiting");
        std::process::exit(1);
    });
    match spawned {
        Ok(_) => Some(rx),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the parent-pipe watcher: not watching for the parent's exit");
            None
        }
    }
}

fn stdin_is_pipe() -> bool {
    use std::os::fd::AsFd as _;
    use std::os::unix::fs::FileTypeExt as _;
    let Ok(fd) = std::io::stdin().as_fd().try_clone_to_owned() else { return false };
    std::fs::File::from(fd).metadata().is_ok_and(|m| m.file_type().is_fifo() || m.file_type().is_socket())
}

/// Read (and ignore) stdin until end-of-file; `io::copy` retries interrupted reads.
fn read_to_eof() -> std::io::Result<()> {
    std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink()).map(drop)
}
