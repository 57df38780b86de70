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
//! glibc also raises its mmap threshold each time a large block is freed
//! (up to 32 MiB), after which blocks of that size come from an arena,
//! where a freed one stays resident; [`keep_large_blocks_mapped`] fixes
//! the threshold at glibc's own starting value, so that large blocks (the
//! netlink batch's parts, hash tables, the plugin's output lifted into the
//! host) are mapped on their own and unmapped when freed.
//!
//! These two calls are the only unsafe code in kpx's native crates, kept
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

/// The size from which an allocation is mapped on its own: glibc's
/// initial threshold.
pub const MMAP_THRESHOLD: usize = 128 << 10;

/// Fixes glibc's mmap threshold at [`MMAP_THRESHOLD`] (this also stops
/// glibc from raising it); whether it was set. Call it first thing in
/// `main`, before threads start. Does nothing, and returns false, with
/// another C library. At 30k Services x 10 from a manifest file the
/// daemon's peak RSS went from 385 to 372 MB, the first sync no slower.
pub fn keep_large_blocks_mapped() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt takes two integers and only changes glibc's
        // own allocator parameters, under its lock.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    /// The tests read the process's resident set: one at a time.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn rss_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Memory freed on another thread's arena comes back: the process's
    /// resident set falls after the trim.
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn freed_memory_on_another_thread_is_released() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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

    /// With the threshold fixed, a large block freed goes back to the
    /// kernel at once, even after a larger one was freed (which would have
    /// raised glibc's threshold past it).
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn large_blocks_freed_leave_the_resident_set() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        assert!(super::keep_large_blocks_mapped());
        // A 16 MiB block freed: glibc would now serve blocks up to that
        // size from an arena.
        drop(std::hint::black_box(vec![1u8; 16 << 20]));
        let before = rss_kib();
        // Not zero: calloc would leave a fresh mapping's pages untouched.
        let blocks: Vec<Vec<u8>> = (0..32).map(|i| vec![i as u8 + 1; 1 << 20]).collect();
        let held = rss_kib();
        drop(std::hint::black_box(blocks));
        let after = rss_kib();
        assert!(held >= before + (28 << 10), "{before} KiB, then {held} KiB with 32 MiB held");
        assert!(after + (24 << 10) < held, "{held} KiB with 32 MiB held, {after} KiB once freed");
    }
}
