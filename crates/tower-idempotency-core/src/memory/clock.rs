//! The store's clock: compact [`Tick`]s on tokio's clock, mapped back to instants and
//! wall-clock times.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// A point on the store's clock: nanoseconds since the store was created, or
/// [`Tick::NEVER`]. Eight bytes where an `Option<Instant>` takes sixteen, and it maps back
/// onto the same instant and wall-clock time exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Tick(pub(super) u64);

impl Tick {
    pub(super) const NEVER: Tick = Tick(u64::MAX);

    pub(super) fn is_never(self) -> bool {
        self == Self::NEVER
    }

    /// Whether this is a real point at or before `now`.
    pub(super) fn has_passed(self, now: Tick) -> bool {
        !self.is_never() && self <= now
    }
}

/// The store's monotonic clock and its mapping onto wall-clock timestamps, from a single
/// reading taken when the store was created.
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock {
    pub(super) instant: Instant,
    pub(super) system: SystemTime,
}

impl Clock {
    pub(super) fn now() -> Self {
        Self {
            instant: Instant::now(),
            system: SystemTime::now(),
        }
    }

    /// `at` as a tick; saturates 584 years on, far past any span the store computes.
    pub(super) fn tick(&self, at: Instant) -> Tick {
        let since = at.saturating_duration_since(self.instant).as_nanos();
        Tick(
            u64::try_from(since)
                .unwrap_or(u64::MAX - 1)
                .min(u64::MAX - 1),
        )
    }

    pub(super) fn now_tick(&self) -> Tick {
        self.tick(Instant::now())
    }

    /// `now + by`, saturating far in the future instead of overflowing on huge durations.
    pub(super) fn later(&self, now: Tick, by: Duration) -> Tick {
        let by = u64::try_from(by.min(FAR).as_nanos()).unwrap_or(u64::MAX);
        Tick(now.0.saturating_add(by).min(u64::MAX - 1))
    }

    pub(super) fn instant(&self, tick: Tick) -> Option<Instant> {
        (!tick.is_never()).then(|| self.instant + Duration::from_nanos(tick.0))
    }

    pub(super) fn system_time(&self, tick: Tick) -> Option<SystemTime> {
        (!tick.is_never()).then(|| {
            self.system
                .checked_add(Duration::from_nanos(tick.0))
                .unwrap_or(self.system)
        })
    }
}

/// Longest span the store adds to a time (100 years): anything longer counts as "forever"
/// and keeps the arithmetic far from overflow.
pub(super) const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `now + by` on tokio's clock, saturating far in the future instead of overflowing.
pub(super) fn later(now: Instant, by: Duration) -> Instant {
    now.checked_add(by.min(FAR)).unwrap_or(now)
}
