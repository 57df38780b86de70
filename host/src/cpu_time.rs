//! The CPU time of the calling thread: the checks' share of a sync
//! ([`crate::kernel::Written::check`]), and tests that compare how the
//! cost of some work grows. Unlike wall time it is not charged for the
//! time other threads (or CI's other jobs) hold the cores.

use std::time::Duration;

/// CPU time this thread has used so far, to the nanosecond
/// (`CLOCK_THREAD_CPUTIME_ID`; getrusage counts in scheduler ticks).
pub fn this_thread() -> Duration {
    use nix::time::{ClockId, clock_gettime};
    // Linux has the clock since 2.6.12: zero where it would not answer.
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).map(Duration::from).unwrap_or_default()
}

/// The CPU time `work` takes on this thread.
pub fn of<T>(work: impl FnOnce() -> T) -> (T, Duration) {
    let t = this_thread();
    let out = work();
    (out, this_thread().saturating_sub(t))
}

/// Wall time and this thread's CPU time, spent since a [`Span`] began.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spent {
    pub wall: Duration,
    pub cpu: Duration,
}

impl std::ops::AddAssign for Spent {
    fn add_assign(&mut self, other: Spent) {
        self.wall += other.wall;
        self.cpu += other.cpu;
    }
}

/// A start of both clocks.
pub struct Span {
    wall: std::time::Instant,
    cpu: Duration,
}

impl Span {
    pub fn start() -> Span {
        Span { wall: std::time::Instant::now(), cpu: this_thread() }
    }

    pub fn elapsed(&self) -> Spent {
        Spent { wall: self.wall.elapsed(), cpu: this_thread().saturating_sub(self.cpu) }
    }
}
