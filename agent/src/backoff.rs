//! Reconnect timing: exponential backoff with full-range jitter.

use std::time::Duration;

/// Default first reconnect delay.
pub const DEFAULT_INITIAL: Duration = Duration::from_secs(1);
/// Default growth per failed attempt (upstream's Authenticate retry uses 1.2; we grow faster
/// and cap lower so a restarted principal sees a quick return without a thundering herd).
pub const DEFAULT_FACTOR: f64 = 2.0;
/// Default longest delay.
pub const DEFAULT_MAX: Duration = Duration::from_secs(30);
/// Default jitter: each delay is scaled by a random factor in `[1 - jitter/2, 1 + jitter/2)`.
pub const DEFAULT_JITTER: f64 = 0.5;

/// Reconnect backoff settings.
#[derive(Debug, Clone, PartialEq)]
pub struct BackoffConfig {
    /// Delay before the first retry.
    pub initial: Duration,
    /// Growth per attempt (values below 1 count as 1).
    pub factor: f64,
    /// Cap before jitter.
    pub max: Duration,
    /// Jitter ratio in `[0, 1]`.
    pub jitter: f64,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self { initial: DEFAULT_INITIAL, factor: DEFAULT_FACTOR, max: DEFAULT_MAX, jitter: DEFAULT_JITTER }
    }
}

impl BackoffConfig {
    /// The delay before retry `attempt` (1-based), with jitter unit `u` in `[0, 1)`.
    #[must_use]
    pub fn delay(&self, attempt: u32, u: f64) -> Duration {
        let exp = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX).min(64);
        let base = self.initial.as_secs_f64() * self.factor.max(1.0).powi(exp);
        let capped = base.min(self.max.as_secs_f64());
        let jitter = self.jitter.clamp(0.0, 1.0);
        let scaled = capped * (1.0 - jitter / 2.0 + jitter * u.clamp(0.0, 1.0));
        Duration::try_from_secs_f64(scaled).unwrap_or(self.max)
    }

    /// The delay before retry `attempt` with random jitter.
    #[must_use]
    pub fn delay_random(&self, attempt: u32) -> Duration {
        self.delay(attempt, rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_caps() {
        let b = BackoffConfig { jitter: 0.0, ..BackoffConfig::default() };
        assert_eq!(b.delay(1, 0.3), Duration::from_secs(1));
        assert_eq!(b.delay(3, 0.3), Duration::from_secs(4));
        assert_eq!(b.delay(100, 0.3), Duration::from_secs(30));
        let j = BackoffConfig::default();
        assert_eq!(j.delay(1, 0.0), Duration::from_millis(750));
        assert!(j.delay(u32::MAX, 0.99) <= Duration::from_secs(45));
    }
}
