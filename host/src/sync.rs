//! The sync loop: applies source events to the state and runs the family
//! proxiers with upstream's bounded frequency — at least `min_period`
//! between syncs, at least one per `sync_period`, a full render every
//! [`FULL_SYNC_PERIOD`], and a failed sync retried (in full) with backoff.

pub mod family;

pub use family::FamilyProxier;

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::source::Event;
use crate::state::{Changes, State};

/// upstream's `proxyutil.FullSyncPeriod`.
pub const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Copy)]
pub struct Periods {
    pub min: Duration,
    pub max: Duration,
}

/// When the next sync is due.
#[derive(Debug)]
struct Schedule {
    periods: Periods,
    last_end: Option<Instant>,
    last_full: Option<Instant>,
    pending: bool,
    retry_at: Option<Instant>,
    retry_delay: Duration,
}

impl Schedule {
    fn new(periods: Periods) -> Schedule {
        Schedule {
            periods,
            last_end: None,
            last_full: None,
            pending: true,
            retry_at: None,
            retry_delay: Self::first_retry(periods),
        }
    }

    fn first_retry(periods: Periods) -> Duration {
        periods.min.max(Duration::from_secs(1)).min(periods.max)
    }

    fn next(&self, now: Instant) -> Instant {
        let Some(end) = self.last_end else { return now };
        let earliest = end + self.periods.min;
        let mut due = end + self.periods.max;
        if self.pending {
            due = due.min(earliest.max(now));
        }
        if let Some(retry) = self.retry_at {
            due = due.min(retry.max(earliest));
        }
        due
    }

    fn wants_full(&self, now: Instant) -> bool {
        self.last_full.is_none_or(|t| now.duration_since(t) >= FULL_SYNC_PERIOD)
    }

    fn done(&mut self, now: Instant, ok: bool, full: bool) {
        self.last_end = Some(now);
        self.pending = false;
        if ok {
            self.retry_at = None;
            self.retry_delay = Self::first_retry(self.periods);
            if full {
                self.last_full = Some(now);
            }
        } else {
            self.retry_at = Some(now + self.retry_delay);
            self.retry_delay = (self.retry_delay * 2).min(self.periods.max);
        }
    }
}

/// Runs until the source's sender is dropped (the source stopped).
pub fn run(mut state: State, events: Receiver<Event>, mut proxiers: Vec<FamilyProxier>, periods: Periods) {
    let mut schedule = Schedule::new(periods);
    let mut changes = Changes::default();
    loop {
        let received = if state.is_synced() {
            let now = Instant::now();
            events.recv_timeout(schedule.next(now).saturating_duration_since(now))
        } else {
            events.recv().map_err(|_| RecvTimeoutError::Disconnected)
        };
        match received {
            Ok(event) => {
                schedule.pending |= state.apply(event);
                while let Ok(event) = events.try_recv() {
                    schedule.pending |= state.apply(event);
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {}
        }
        let start = Instant::now();
        changes.merge(state.take_changes());
        let full = schedule.wants_full(start);
        let mut ok = true;
        for proxier in &mut proxiers {
            match proxier.sync(&state, &changes, full) {
                Ok(report) => tracing::info!(
                    family = %proxier.family(),
                    full = report.full,
                    changes = report.changes,
                    bytes = report.bytes,
                    elapsed_ms = start.elapsed().as_millis() as u64,
                    "synced rules"
                ),
                Err(e) => {
                    ok = false;
                    tracing::error!(family = %proxier.family(), "sync failed, keeping the last good rules: {e}");
                }
            }
        }
        // A failed pass keeps its changes (with their earliest `previous`)
        // for the retry; the families that synced apply them again, which
        // changes nothing.
        if ok {
            changes = Changes::default();
        }
        schedule.done(Instant::now(), ok, full);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_honours_min_and_max_periods_and_backs_off() {
        let periods = Periods { min: Duration::from_secs(1), max: Duration::from_secs(30) };
        let mut s = Schedule::new(periods);
        let t0 = Instant::now();
        assert_eq!(s.next(t0), t0, "first sync at once");
        s.done(t0, true, true);
        assert_eq!(s.next(t0), t0 + Duration::from_secs(30), "idle: periodic sync");
        s.pending = true;
        assert_eq!(s.next(t0), t0 + Duration::from_secs(1), "change: not before min period");
        let later = t0 + Duration::from_secs(5);
        assert_eq!(s.next(later), later, "change long after the last sync: at once");
        s.done(later, false, false);
        assert_eq!(s.next(later), later + Duration::from_secs(1), "retry");
        s.done(later, false, false);
        assert_eq!(s.next(later), later + Duration::from_secs(2), "backoff doubles");
        assert!(!s.wants_full(later));
        assert!(s.wants_full(t0 + FULL_SYNC_PERIOD));
    }
}
