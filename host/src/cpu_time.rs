//! The CPU time of the calling thread, for tests that compare how the
//! cost of some work grows: unlike wall time it is not charged for the
//! time other tests (or CI's other jobs) hold the cores.

use std::time::Duration;

/// CPU time this thread has used so far, to the nanosecond
/// (`CLOCK_THREAD_CPUTIME_ID`; getrusage counts in scheduler ticks).
pub fn this_thread() -> Duration {
    use nix::time::{ClockId, clock_gettime};
    Duration::from(clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).expect("clock_gettime(CLOCK_THREAD_CPUTIME_ID)"))
}

/// The CPU time `work` takes on this thread.
pub fn of<T>(work: impl FnOnce() -> T) -> (T, Duration) {
    let t = this_thread();
    let out = work();
    (out, this_thread().saturating_sub(t))
}
