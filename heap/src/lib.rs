//! Gives the C heap's free pages back to the kernel.
//!
//! glibc keeps one malloc arena per thread that allocates (up to eight
//! per core), and memory freed in one arena is reused only by the threads
//! that allocate from it. The API source lists every Service and
//! EndpointSlice on its own thread: at 30k Services x 10 the response, its
//! parsed objects and their conversion are tens of MB, freed once the
//! list is read but still resident in that thread's arena while the sync
//! thread builds the first ruleset in another (the daemon's peak RSS was
//! 425 MiB through list/watch against 376 from a manifest file). glibc's
//! `malloc_trim` releases the free pages of every arena.
//!
//! The only unsafe code in kpx's native crates is this one call, kept
//! apart so that the host crate can deny unsafe code.

/// Releases the free pages of every malloc arena to the kernel (glibc's
/// `malloc_trim(0)`); whether any were released. Does nothing, and returns
/// false, with another C library.
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes no pointers and touches only glibc's
        // own arenas, each under its lock; it is safe to call from any
        // thread at any time.
        unsafe { libc::malloc_trim(0) != 0 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    /// Memory freed on another thread's arena comes back: the process's
    /// resident set falls after the trim.
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn freed_memory_on_another_thread_is_released() {
        fn rss_kib() -> u64 {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        }
        // Many small allocations (below the mmap threshold, so they live
        // in the thread's arena), touched, then freed but one in 64 (so
        // the arena's top cannot simply shrink).
        std::thread::spawn(|| {
            let blocks: Vec<Vec<u8>> = (0..200_000).map(|i| vec![i as u8; 512]).collect();
            let kept: Vec<Vec<u8>> = blocks.into_iter().step_by(64).collect();
            std::mem::forget(kept);
        })
        .join()
        .unwrap();
        let before = rss_kib();
        assert!(super::release_free_memory());
        let after = rss_kib();
        assert!(after + 50_000 < before, "resident {before} KiB before the trim, {after} KiB after");
    }
}
