//! The libFuzzer driver: `KPX_FUZZ_TARGET` names the target (one
//! instrumented binary serves them all). `cargo xtask fuzz` builds and
//! runs it.
#![no_main]

use std::sync::OnceLock;

/// The target, looked up once (libFuzzer calls in with bytes alone).
static TARGET: OnceLock<fn(&[u8])> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let run = TARGET.get_or_init(|| {
        let name = std::env::var("KPX_FUZZ_TARGET").unwrap_or_default();
        kpx_fuzz::target(&name).unwrap_or_else(|| {
            let names: Vec<_> = kpx_fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
            panic!("KPX_FUZZ_TARGET={name:?}: not a target (one of {})", names.join(", "))
        })
    });
    run(data);
});
