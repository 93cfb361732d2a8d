//! Retry timing: exponential backoff with jitter, and the poison limit.

use std::fmt;
use std::time::Duration;

/// Upstream's first retry delay for an un-ACKed event (`event_writer.go:132-138`).
pub const DEFAULT_INITIAL_DELAY: Duration = Duration::from_secs(5);
/// Upstream's backoff factor.
pub const DEFAULT_FACTOR: u32 = 4;
/// Upstream's delay cap (before jitter).
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(120);
/// Upstream's jitter: up to 100 % extra on top of each delay.
pub const DEFAULT_JITTER: f64 = 1.0;
/// Transmissions after which an un-ACKed event is parked (about 36-72 minutes with the
/// default delays). Upstream retries forever (`math.MaxInt`).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 20;

/// When to retransmit an un-ACKed event, and when to give up on it.
///
/// The delay before retry `n` (after the `n`-th transmission, `n >= 1`) is
/// `d = min(initial * factor^(n-1), max_delay)` plus `d * jitter * u` with `u` in `[0, 1)` from
/// the outbox's [`JitterSource`], as Kubernetes' `wait.Backoff` computes it.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Delay after the first transmission.
    pub initial: Duration,
    /// Growth per transmission.
    pub factor: u32,
    /// Cap on the delay before jitter.
    pub max_delay: Duration,
    /// Jitter ratio; clamped to `[0, 10]`, non-finite values count as 0.
    pub jitter: f64,
    /// Transmissions before an un-ACKed event is parked (see the module docs); at least 1.
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial: DEFAULT_INITIAL_DELAY,
            factor: DEFAULT_FACTOR,
            max_delay: DEFAULT_MAX_DELAY,
            jitter: DEFAULT_JITTER,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }
}

impl RetryPolicy {
    /// The delay before jitter after transmission number `attempt` (1-based).
    #[must_use]
    pub fn base_delay(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1);
        let factor = u128::from(self.factor.max(1));
        let mut nanos = self.initial.as_nanos();
        let cap = self.max_delay.as_nanos();
        for _ in 0..exp {
            if nanos >= cap {
                break;
            }
            nanos = nanos.saturating_mul(factor);
        }
        duration_from_nanos(nanos.min(cap))
    }

    /// The delay after transmission number `attempt`, with jitter `unit` in `[0, 1)`.
    #[must_use]
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let base = self.base_delay(attempt);
        let ratio = if self.jitter.is_finite() { self.jitter.clamp(0.0, 10.0) } else { 0.0 };
        let unit = if unit.is_finite() { unit.clamp(0.0, 1.0) } else { 0.0 };
        // Float to integer casts saturate; no panic is possible here.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let extra = (base.as_nanos() as f64 * ratio * unit) as u128;
        duration_from_nanos(base.as_nanos().saturating_add(extra))
    }

    /// `max_attempts`, at least 1.
    #[must_use]
    pub fn attempt_limit(&self) -> u32 {
        self.max_attempts.max(1)
    }
}

fn duration_from_nanos(nanos: u128) -> Duration {
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// Supplies the jitter unit `u` in `[0, 1)` for each retry delay. Inject one to make timing
/// deterministic in tests, or use [`SeededJitter`].
pub trait JitterSource: Send + fmt::Debug {
    /// The next value in `[0, 1)`.
    fn next_unit(&mut self) -> f64;
}

/// No jitter: always 0.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoJitter;

impl JitterSource for NoJitter {
    fn next_unit(&mut self) -> f64 {
        0.0
    }
}

/// A deterministic jitter stream (SplitMix64) from a seed.
#[derive(Debug, Clone)]
pub struct SeededJitter {
    state: u64,
}

impl SeededJitter {
    /// A stream starting at `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }
}

impl JitterSource for SeededJitter {
    fn next_unit(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // 53 random bits scaled into [0, 1).
        #[allow(clippy::cast_precision_loss)]
        let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
        unit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_by_factor_and_caps() {
        let p = RetryPolicy::default();
        let secs = |n| p.base_delay(n).as_secs();
        assert_eq!([secs(1), secs(2), secs(3), secs(4), secs(5)], [5, 20, 80, 120, 120]);
        assert_eq!(p.base_delay(u32::MAX), Duration::from_secs(120));
        assert_eq!(p.delay(1, 0.0), Duration::from_secs(5));
        assert_eq!(p.delay(1, 0.5), Duration::from_millis(7500));
        assert_eq!(p.delay(4, 0.5), Duration::from_secs(180));
    }

    #[test]
    fn silly_values_do_not_panic() {
        let p = RetryPolicy {
            initial: Duration::MAX,
            factor: u32::MAX,
            max_delay: Duration::MAX,
            jitter: f64::INFINITY,
            max_attempts: 0,
        };
        let _ = p.delay(u32::MAX, f64::NAN);
        let _ = p.delay(3, 1.0);
        assert_eq!(p.attempt_limit(), 1);
    }

    #[test]
    fn seeded_jitter_is_deterministic_and_in_range() {
        let mut a = SeededJitter::new(42);
        let mut b = SeededJitter::new(42);
        for _ in 0..1000 {
            let u = a.next_unit();
            assert!((0.0..1.0).contains(&u));
            assert_eq!(u.to_bits(), b.next_unit().to_bits());
        }
    }
}
