//! Waiting for the machine to be quiet before a timed stretch. The kernel
//! frees a deleted namespace's rules in its own workers after `ip netns
//! delete` has returned (at 10k x 10, seconds of
//! `rhashtable_free_and_destroy` over 270k map elements), and a run
//! started at once competes with that for the two cores: the first
//! daemon's start right after a 10k x 10 measurement waited 300-600 ms
//! for it.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

/// The machine's busy time so far, all cores (user, nice, system, irq,
/// softirq: not idle, I/O wait or steal), in the kernel's ticks (USER_HZ,
/// 100 a second).
pub fn busy_ticks() -> Result<u64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("empty /proc/stat")?;
    let fields: Vec<u64> = line.split_whitespace().skip(1).map(str::parse).collect::<Result<_, _>>()?;
    if fields.len() < 8 {
        bail!("/proc/stat's cpu line has {} fields", fields.len());
    }
    Ok(fields[0] + fields[1] + fields[2] + fields[5] + fields[6])
}

/// The longest wait for a quiet machine.
pub const LIMIT: Duration = Duration::from_secs(30);

/// A window in which the machine counts as quiet when its cores were
/// busy less than a tenth of it.
const WINDOW: Duration = Duration::from_millis(300);

/// The cores `/proc/stat`'s first line sums (every online CPU, whatever
/// this process's affinity).
fn online_cores() -> Result<u64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let n =
        stat.lines().filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit)).count();
    Ok(n.max(1) as u64)
}

/// How a wait for a quiet machine ended.
#[derive(Debug, Clone, Copy)]
pub struct Settled {
    pub waited: Duration,
    /// False: `limit` was over first (a warning is printed).
    pub quiet: bool,
}

/// Waits until a [`WINDOW`] passes with the cores busy under 10 %, or
/// `limit` is over; the time waited is a window at least.
pub fn settle(limit: Duration) -> Result<Settled> {
    // Ticks in a window on every core: 30 per core at 100 a second.
    let window_ticks = online_cores()? * WINDOW.as_millis() as u64 / 10;
    let started = Instant::now();
    loop {
        let before = busy_ticks()?;
        std::thread::sleep(WINDOW);
        let busy = busy_ticks()?.saturating_sub(before);
        if busy * 10 < window_ticks {
            return Ok(Settled { waited: started.elapsed(), quiet: true });
        }
        if started.elapsed() >= limit {
            eprintln!("   warning: the machine was not quiet after {limit:?}; measuring anyway");
            return Ok(Settled { waited: started.elapsed(), quiet: false });
        }
    }
}
