//! The plugin output cap holds *before* the host copies the output: a
//! component that returns far more than the limit makes the host allocate
//! about the limit, not the output. A counting allocator (this test binary
//! only) measures what the calling thread allocates during `render`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use kpx::runtime::{Error, Limits, Runtime};
use kpx_rules::model::{Cluster, IpFamily, Node, Protocol, ProxyMode, ServicePort, Settings};

struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn add(delta: isize) {
    // `try_with`: nothing to count once the thread's locals are gone.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes allocated on this thread while `f` runs, above what was live before.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, isize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, PEAK.with(Cell::get) - base)
}

#[test]
fn a_huge_output_is_refused_before_the_host_allocates_it() {
    let bytes = std::fs::read(format!("{}/kpx_plugin_hostile.wasm", env!("KPX_TEST_PLUGIN_DIR"))).unwrap();
    const LIMIT: u64 = 1 << 20;
    let mut svc = ServicePort::new("t", "hostile-huge", "", Protocol::Tcp, 80);
    svc.cluster_ip = Some("10.96.0.1".parse().unwrap());
    for mode in [ProxyMode::Iptables, ProxyMode::Nftables] {
        // What the output weighs once in the host: with a cap far above it.
        let roomy = Runtime::new(Limits { max_output_bytes: 1 << 30, ..Limits::default() }, None).unwrap();
        let plugin = roomy.load_backend("hostile", &bytes).unwrap();
        let mut instance = plugin.instantiate(&Settings::new(IpFamily::V4, mode)).unwrap();
        instance.reset(&Node::default(), &Cluster::default(), &[svc.clone()]).unwrap();
        let (result, whole) = peak_during(|| instance.render(true, 1));
        assert!(result.is_ok(), "{mode}: the huge output fits a 1 GiB cap: {:?}", result.err());
        assert!(whole > 8 * LIMIT as isize, "{mode}: the output weighs {whole} bytes in the host");

        let tight = Runtime::new(Limits { max_output_bytes: LIMIT, ..Limits::default() }, None).unwrap();
        let plugin = tight.load_backend("hostile", &bytes).unwrap();
        let mut instance = plugin.instantiate(&Settings::new(IpFamily::V4, mode)).unwrap();
        instance.reset(&Node::default(), &Cluster::default(), &[svc.clone()]).unwrap();
        let (result, capped) = peak_during(|| instance.render(true, 1));
        assert!(matches!(result, Err(Error::OutputTooLarge { .. })), "{mode}: {:?}", result.err());
        println!("{mode}: output {whole} bytes in the host uncapped; {capped} bytes allocated with a {LIMIT}-byte cap");
        assert!(capped < 2 * LIMIT as isize, "{mode}: {capped} bytes allocated for a {LIMIT}-byte cap");
    }
}
