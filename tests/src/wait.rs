//! Polling with deadlines: the only way tests wait for something to happen (no fixed sleeps).
//!
//! Intervals start small and back off (5 ms doubling up to 100 ms), so a condition that is already
//! true costs nothing and a slow machine is not hammered.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::bail;

/// Deadline for anything a test waits for: generous, for two busy cores.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

const FIRST_INTERVAL: Duration = Duration::from_millis(5);
const MAX_INTERVAL: Duration = Duration::from_millis(100);

/// A deadline plus a backoff, for hand-written polling loops:
///
/// ```ignore
/// let mut poll = Poller::new(DEFAULT_TIMEOUT, "the lease to be renewed");
/// while !renewed().await {
///     poll.tick().await?; // Err once the deadline has passed
/// }
/// ```
#[derive(Debug)]
pub struct Poller {
    what: String,
    timeout: Duration,
    deadline: Instant,
    interval: Duration,
    attempts: u64,
}

impl Poller {
    /// A poller that expires `timeout` from now; `what` names the awaited condition in errors.
    #[must_use]
    pub fn new(timeout: Duration, what: impl Into<String>) -> Self {
        Self { what: what.into(), timeout, deadline: Instant::now() + timeout, interval: FIRST_INTERVAL, attempts: 0 }
    }

    /// Whether the deadline has passed.
    #[must_use]
    pub fn expired(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// Time left before the deadline.
    #[must_use]
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    fn next_sleep(&mut self) -> anyhow::Result<Duration> {
        self.attempts += 1;
        let left = self.remaining();
        if left.is_zero() {
            bail!("timed out after {:?} ({} checks) waiting for {}", self.timeout, self.attempts, self.what);
        }
        let sleep = self.interval.min(left);
        self.interval = (self.interval * 2).min(MAX_INTERVAL);
        Ok(sleep)
    }

    /// Sleep until the next check (async).
    ///
    /// # Errors
    /// The deadline has passed.
    pub async fn tick(&mut self) -> anyhow::Result<()> {
        let sleep = self.next_sleep()?;
        tokio::time::sleep(sleep).await;
        Ok(())
    }

    /// Sleep until the next check (blocking the thread).
    ///
    /// # Errors
    /// The deadline has passed.
    pub fn tick_blocking(&mut self) -> anyhow::Result<()> {
        let sleep = self.next_sleep()?;
        std::thread::sleep(sleep);
        Ok(())
    }
}

/// Block until `condition` is true, checking until `timeout` has passed.
///
/// # Errors
/// The condition stayed false until the deadline.
pub fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) -> anyhow::Result<()> {
    wait_for(timeout, what, || Ok(condition().then_some(())))
}

/// Block until `check` gives a value: `Ok(Some(v))` is done, `Ok(None)` is "not yet", and `Err`
/// stops waiting at once (something went wrong that waiting cannot fix, e.g. a process died).
///
/// # Errors
/// `check` failed, or gave nothing until the deadline.
pub fn wait_for<T>(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let mut poll = Poller::new(timeout, what);
    loop {
        if let Some(v) = check()? {
            return Ok(v);
        }
        poll.tick_blocking()?;
    }
}

/// Async [`wait_until`]: await `condition()` until it is true or `timeout` has passed.
///
/// # Errors
/// The condition stayed false until the deadline.
pub async fn wait_until_async<F, Fut>(timeout: Duration, what: &str, mut condition: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let mut poll = Poller::new(timeout, what);
    while !condition().await {
        poll.tick().await?;
    }
    Ok(())
}

/// Async [`wait_for`].
///
/// # Errors
/// `check` failed, or gave nothing until the deadline.
pub async fn wait_for_async<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let mut poll = Poller::new(timeout, what);
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        poll.tick().await?;
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn true_condition_returns_at_once() {
        let start = Instant::now();
        assert!(wait_until(Duration::from_secs(5), "true", || true).is_ok());
        assert!(start.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn false_condition_times_out_naming_it() {
        let err = wait_until(Duration::from_millis(50), "the impossible", || false).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("the impossible")));
    }

    #[test]
    fn error_stops_waiting() {
        let mut calls = 0;
        let r: anyhow::Result<()> = wait_for(Duration::from_secs(5), "x", || {
            calls += 1;
            bail!("broken")
        });
        assert!(r.is_err());
        assert_eq!(calls, 1);
    }

    #[test]
    fn condition_becoming_true_is_seen() {
        let mut n = 0;
        let got = wait_for(Duration::from_secs(5), "n to reach 3", || {
            n += 1;
            Ok((n >= 3).then_some(n))
        });
        assert_eq!(got.ok(), Some(3));
    }
}
