//! TLS material reloaded while the process runs: certificates and CAs from files or Secrets are
//! re-read every `--tls-reload-interval`, and a changed set becomes the configuration of the next
//! handshakes. Established connections, and the agents' streams on them, carry on. Upstream reads
//! them once at start, so every rotation (cert-manager renews every few weeks) is a restart and
//! a reconnect storm (upstream #1057).
//!
//! Material that does not build is never served: a certificate whose new key is not written yet
//! (rustls checks that the key matches the certificate), PEM cut short, a CA that cannot be a
//! trust anchor. The reason is logged, once per distinct reason, and the previous configuration
//! stays in force until a later read builds.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// `--tls-reload-interval` unless given.
pub const DEFAULT_INTERVAL: &str = "30s";

/// `--tls-reload-interval`: `None` when `0` (off).
///
/// # Errors
/// The text is not a duration.
pub fn interval(text: &str) -> anyhow::Result<Option<Duration>> {
    use anyhow::Context as _;
    let d = crate::flags::parse_duration(text).with_context(|| format!("--tls-reload-interval {text:?}"))?;
    Ok(Some(d).filter(|d| !d.is_zero()))
}

/// Publishes `initial` (built from `material`) and, every `every` until `cancel` fires or no
/// receiver is left, reads the material again with `load`; when it differs from the last that
/// built, publishes what `build` makes of it. `what` names the configuration in logs.
pub fn spawn<T, L, F, B>(
    what: &'static str,
    every: Option<Duration>,
    material: Vec<String>,
    initial: T,
    mut load: L,
    build: B,
    cancel: CancellationToken,
) -> watch::Receiver<T>
where
    T: Send + Sync + 'static,
    L: FnMut() -> F + Send + 'static,
    F: Future<Output = anyhow::Result<Vec<String>>> + Send,
    B: Fn(&[String]) -> anyhow::Result<T> + Send + 'static,
{
    let (tx, rx) = watch::channel(initial);
    let Some(every) = every else { return rx };
    tokio::spawn(async move {
        let mut current = material;
        let mut last_error = String::new();
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = cancel.cancelled() => return,
                () = tx.closed() => return,
            }
            let built = match load().await {
                Ok(read) if read == current => continue,
                Ok(read) => build(&read).map(|config| (read, config)),
                Err(e) => Err(e),
            };
            match built {
                Ok((read, config)) => {
                    current = read;
                    last_error.clear();
                    tx.send_replace(config);
                    tracing::info!(what, "TLS material changed: new connections use the reloaded configuration");
                }
                Err(e) => {
                    let reason = format!("{e:#}");
                    if reason != last_error {
                        tracing::warn!(what, error = %reason, "cannot reload the TLS material; the previous configuration stays in force");
                        last_error = reason;
                    }
                }
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Material that fails to build is skipped; the next that builds replaces the configuration.
    #[tokio::test]
    async fn publishes_each_change_that_builds_and_keeps_the_last_good_one_otherwise() {
        let source = Arc::new(Mutex::new(vec!["a".to_owned()]));
        let reads = Arc::new(AtomicUsize::new(0));
        let load = {
            let (source, reads) = (source.clone(), reads.clone());
            move || {
                let read = source.lock().map(|s| s.clone()).unwrap_or_default();
                reads.fetch_add(1, Ordering::SeqCst);
                async move { Ok(read) }
            }
        };
        let build = |m: &[String]| {
            anyhow::ensure!(!m[0].contains("half"), "key does not match the certificate");
            Ok(m[0].clone())
        };
        let cancel = CancellationToken::new();
        let every = Some(Duration::from_millis(5));
        let mut rx = spawn("test", every, vec!["a".into()], "a".to_owned(), load, build, cancel.clone());
        let set = |v: &str| *source.lock().expect("lock") = vec![v.to_owned()];

        set("half-written");
        let seen = reads.load(Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while reads.load(Ordering::SeqCst) < seen + 3 {
            assert!(tokio::time::Instant::now() < deadline, "the material is read again");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(*rx.borrow_and_update(), "a", "a configuration that does not build is never published");
        set("b");
        tokio::time::timeout(Duration::from_secs(30), rx.changed()).await.expect("in time").expect("published");
        assert_eq!(*rx.borrow_and_update(), "b");
        cancel.cancel();
    }

    #[test]
    fn zero_turns_reloading_off() {
        assert_eq!(interval("0").ok(), Some(None));
        assert_eq!(interval("30s").ok(), Some(Some(Duration::from_secs(30))));
        assert!(interval("soon").is_err());
    }
}
