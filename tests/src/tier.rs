//! Two tiers of long runs. The per-change suite (`scripts/test`, CI) runs every behaviour at the
//! smallest size that still catches a regression; `scripts/soak` sets `TESTS_SOAK=1` and runs the
//! same tests at their long sizes (10 minutes of chaos, 100,000-update bursts, ...). Every test
//! that has two sizes reads them through [`size`], so the two tiers cannot drift apart and a run
//! prints which tier it is in. An explicit variable (`CONSISTENCY_DURATION`, `BURST_UPDATES`, ...)
//! still wins over both.

/// The variable that selects the soak tier.
pub const SOAK_VAR: &str = "TESTS_SOAK";

/// Whether this run is the soak tier (`TESTS_SOAK=1`).
#[must_use]
pub fn soak() -> bool {
    std::env::var(SOAK_VAR).is_ok_and(|v| v.trim() == "1")
}

/// `per_change` in the per-change suite, `soak` under `TESTS_SOAK=1`.
#[must_use]
pub fn size<T>(per_change: T, soak: T) -> T {
    if self::soak() { soak } else { per_change }
}

/// The tier's name, for the figures a long test prints.
#[must_use]
pub fn name() -> &'static str {
    if soak() { "soak" } else { "per-change" }
}
