//! Backpressure on token signing: how a login storm is admitted.
//!
//! Each `Authenticate` signs two tokens; with an RSA-4096 key that is ~12 ms of CPU, so 5,000
//! agents connecting at once need a minute of CPU. Before this gate every call went straight to
//! tokio's blocking pool: up to 512 threads signing at once on a few cores, which starved the
//! async workers (HTTP/2 PINGs unanswered, connections dropped) and failed calls with transport
//! errors the principal never saw, so never logged.
//!
//! Now [`SigningAdmission`] lets [`SigningLimits::concurrent`] calls sign at once (one per core by
//! default), queues up to [`SigningLimits::queue`] more (they wait for a slot, in order), and
//! refuses the rest at once with `RESOURCE_EXHAUSTED` and a retry hint: the metadata entry
//! [`RETRY_PUSHBACK_MS`] (`grpc-retry-pushback-ms`, the name gRPC's own retry design gives a
//! server's pushback), in milliseconds. The hints of successive refusals are spread over the
//! time the refused calls will take to sign (each refusal books the next free slot after the
//! queue drains), so refused agents come back in a trickle rather than as a second storm. Our
//! agent ([`crate::ClientError::retry_after`]) waits the hint, with jitter, instead of its own
//! backoff.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The metadata key of the retry hint on a `RESOURCE_EXHAUSTED` answer: milliseconds to wait
/// before calling again (gRPC's name for a server's retry pushback).
pub const RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";

/// Calls that may wait for a signing slot by default.
pub const DEFAULT_SIGNING_QUEUE: usize = 4096;

/// The shortest and longest hint given.
const MIN_HINT: Duration = Duration::from_millis(10);
const MAX_HINT: Duration = Duration::from_secs(60);

/// The first estimate of one call's signing time, before any is measured (two RS512 signatures
/// with an RSA-4096 key on this kind of machine); divided by the calls signing at once, it is
/// the first estimate of the time between two calls leaving the queue.
const INITIAL_SIGNING_TIME: Duration = Duration::from_millis(12);

/// How many calls sign at once and how many may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SigningLimits {
    /// Calls signing at once (at least one).
    pub concurrent: usize,
    /// Calls waiting for a slot; one more is refused with `RESOURCE_EXHAUSTED`.
    pub queue: usize,
}

impl Default for SigningLimits {
    /// One signing call per core, [`DEFAULT_SIGNING_QUEUE`] waiting.
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
        Self { concurrent: cores, queue: DEFAULT_SIGNING_QUEUE }
    }
}

/// A refusal: the queue is full; call again after `retry_after`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overloaded {
    /// The hint.
    pub retry_after: Duration,
    /// Calls waiting when it was refused.
    pub waiting: usize,
}

impl Overloaded {
    /// The status for the caller: `RESOURCE_EXHAUSTED`, the hint in [`RETRY_PUSHBACK_MS`].
    #[must_use]
    pub fn to_status(self) -> tonic::Status {
        let ms = u64::try_from(self.retry_after.as_millis()).unwrap_or(u64::MAX);
        let mut status = tonic::Status::resource_exhausted(format!(
            "the principal is signing as many sessions as it may ({} waiting); retry after {ms} ms",
            self.waiting
        ));
        if let Ok(value) = ms.to_string().parse() {
            status.metadata_mut().insert(RETRY_PUSHBACK_MS, value);
        }
        status
    }
}

/// The gate on token signing. Cheap to clone.
#[derive(Clone, Debug)]
pub struct SigningAdmission {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limits: SigningLimits,
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    /// Moving average of the time between two calls finishing while others waited (the rate
    /// the queue drains at, measured, so the CPU the rest of the process and the machine take
    /// is counted), in nanoseconds.
    interval_ns: AtomicU64,
    /// When the last call finished signing, if calls were waiting then.
    last_done: Mutex<Option<Instant>>,
    /// The end of the last slot promised to a refused call.
    booked_until: Mutex<Option<Instant>>,
    /// Refusals since the last summary line, and when it was written.
    summary: Mutex<Summary>,
}

#[derive(Debug, Default)]
struct Summary {
    refused: u64,
    total: u64,
    since: Option<Instant>,
}

/// A signing slot, given back when dropped.
#[derive(Debug)]
pub struct SigningSlot {
    _permit: OwnedSemaphorePermit,
    gate: Arc<Inner>,
}

impl SigningSlot {
    /// Signing is done: gives the slot back and, when calls were waiting, records the time
    /// since the previous call finished (how fast the queue drains).
    pub fn done(self) {
        let gate = &self.gate;
        let now = Instant::now();
        // Only intervals that began and ended with calls waiting measure the drain rate; an
        // interval that began with the queue empty includes idle time.
        let busy = gate.waiting.load(Ordering::Acquire) > 0;
        let previous = std::mem::replace(&mut *lock(&gate.last_done), busy.then_some(now));
        if let Some(previous) = previous.filter(|_| busy) {
            let sample = u64::try_from(now.duration_since(previous).as_nanos()).unwrap_or(u64::MAX);
            // An exponentially weighted mean, 1/16 per sample; races only lose a sample.
            let old = gate.interval_ns.load(Ordering::Relaxed);
            let new = old - old / 16 + sample / 16;
            gate.interval_ns.store(new.max(1), Ordering::Relaxed);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Decrements the waiting count when a queued call gets its slot or is cancelled.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl SigningAdmission {
    /// A gate with `limits`.
    #[must_use]
    pub fn new(limits: SigningLimits) -> Self {
        let limits = SigningLimits { concurrent: limits.concurrent.clamp(1, Semaphore::MAX_PERMITS), ..limits };
        Self {
            inner: Arc::new(Inner {
                limits,
                slots: Arc::new(Semaphore::new(limits.concurrent)),
                waiting: AtomicUsize::new(0),
                interval_ns: AtomicU64::new(
                    u64::try_from(
                        (INITIAL_SIGNING_TIME / u32::try_from(limits.concurrent).unwrap_or(u32::MAX)).as_nanos(),
                    )
                    .unwrap_or(u64::MAX),
                ),
                last_done: Mutex::new(None),
                booked_until: Mutex::new(None),
                summary: Mutex::new(Summary::default()),
            }),
        }
    }

    /// The limits.
    #[must_use]
    pub fn limits(&self) -> SigningLimits {
        self.inner.limits
    }

    /// Calls waiting for a slot now.
    #[must_use]
    pub fn waiting(&self) -> usize {
        self.inner.waiting.load(Ordering::Acquire)
    }

    /// A slot to sign in: at once, after waiting in the queue, or [`Overloaded`] when the queue
    /// is full.
    ///
    /// # Errors
    ///
    /// [`Overloaded`] with the hint.
    pub async fn acquire(&self) -> Result<SigningSlot, Overloaded> {
        let inner = &self.inner;
        let permit = match inner.slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let queued = inner.waiting.fetch_add(1, Ordering::AcqRel);
                let waiting = Waiting(&inner.waiting);
                if queued >= inner.limits.queue {
                    drop(waiting);
                    return Err(self.refuse(queued));
                }
                let permit = inner.slots.clone().acquire_owned().await;
                drop(waiting);
                // The semaphore is never closed.
                permit.map_err(|_| self.refuse(queued))?
            }
        };
        Ok(SigningSlot { _permit: permit, gate: inner.clone() })
    }

    /// Books the next free slot after the queue drains, and returns its distance as the hint.
    fn refuse(&self, waiting: usize) -> Overloaded {
        let inner = &self.inner;
        // Half the measured interval: deliberately early. A call back too early costs one cheap
        // refusal (and a later slot); one back too late leaves the signers idle.
        let per_slot = Duration::from_nanos(inner.interval_ns.load(Ordering::Relaxed) / 2);
        let now = Instant::now();
        let drained = now + per_slot * u32::try_from(waiting).unwrap_or(u32::MAX);
        let retry_after = {
            let mut booked = lock(&inner.booked_until);
            let next = booked.filter(|b| *b > drained).unwrap_or(drained) + per_slot;
            *booked = Some(next);
            next.duration_since(now).clamp(MIN_HINT, MAX_HINT)
        };
        self.log_refusal(waiting, retry_after);
        Overloaded { retry_after, waiting }
    }

    /// One summary line per second at most: refusals since the last line, and in all.
    fn log_refusal(&self, waiting: usize, retry_after: Duration) {
        let inner = &self.inner;
        let mut summary = lock(&inner.summary);
        summary.refused += 1;
        summary.total += 1;
        let now = Instant::now();
        if summary.since.is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1)) {
            tracing::warn!(
                refused = summary.refused,
                refused_total = summary.total,
                waiting,
                concurrent = inner.limits.concurrent,
                queue = inner.limits.queue,
                last_retry_after_ms = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX),
                "authentication refused with RESOURCE_EXHAUSTED: the signing queue is full (login storm); agents \
                 retry after the hinted time"
            );
            summary.refused = 0;
            summary.since = Some(now);
        }
    }
}

impl Default for SigningAdmission {
    fn default() -> Self {
        Self::new(SigningLimits::default())
    }
}

/// The retry hint on a status, if it carries one ([`RETRY_PUSHBACK_MS`]).
#[must_use]
pub fn retry_hint(status: &tonic::Status) -> Option<Duration> {
    let ms = status.metadata().get(RETRY_PUSHBACK_MS)?.to_str().ok()?.trim().parse::<u64>().ok()?;
    Some(Duration::from_millis(ms))
}

/// Jitter added to a principal's retry hint: the wait is the hint scaled by a random factor in
/// `[1, 1 + HINT_JITTER)`, never shorter than asked.
pub const HINT_JITTER: f64 = 0.2;

/// The wait before calling again after a retry hint: at least `hint`, spread by [`HINT_JITTER`]
/// with the jitter unit `u` in `[0, 1)`, so callers handed the same hint do not return together.
#[must_use]
pub fn hinted(hint: Duration, u: f64) -> Duration {
    hint.mul_f64(1.0 + HINT_JITTER * u.clamp(0.0, 1.0))
}

/// [`hinted`] with a random jitter unit: what a caller handed a retry hint waits.
#[must_use]
pub fn hinted_random(hint: Duration) -> Duration {
    hinted(hint, jitter_unit())
}

/// A random jitter unit in `[0, 1)` for [`hinted`] (0 if the system's random source fails).
#[must_use]
fn jitter_unit() -> f64 {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 4];
    match ring::rand::SystemRandom::new().fill(&mut bytes) {
        Ok(()) => f64::from(u32::from_le_bytes(bytes)) / (f64::from(u32::MAX) + 1.0),
        Err(_) => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_is_waited_at_least_and_spread() {
        let hint = Duration::from_millis(1500);
        assert_eq!(hinted(hint, 0.0), hint);
        assert_eq!(hinted(hint, 0.5), Duration::from_millis(1650));
        for _ in 0..100 {
            let u = jitter_unit();
            assert!((0.0..1.0).contains(&u), "{u}");
            let wait = hinted(hint, u);
            assert!(wait >= hint && wait < Duration::from_millis(1801), "{wait:?}");
            let wait = hinted_random(hint);
            assert!(wait >= hint && wait < Duration::from_millis(1801), "{wait:?}");
        }
    }

    #[tokio::test]
    async fn over_the_queue_is_refused_with_spread_hints() {
        let gate = SigningAdmission::new(SigningLimits { concurrent: 1, queue: 1 });
        let first = gate.acquire().await.unwrap();
        let queued = tokio::spawn({
            let gate = gate.clone();
            async move { gate.acquire().await.map(SigningSlot::done) }
        });
        while gate.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        let a = gate.acquire().await.unwrap_err();
        let b = gate.acquire().await.unwrap_err();
        assert!(b.retry_after > a.retry_after, "later refusals get later slots: {a:?} {b:?}");
        let status = a.to_status();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        let ms = u64::try_from(a.retry_after.as_millis()).unwrap();
        assert_eq!(retry_hint(&status), Some(Duration::from_millis(ms)));
        first.done();
        queued.await.unwrap().unwrap();
        assert_eq!(gate.waiting(), 0);
    }
}
