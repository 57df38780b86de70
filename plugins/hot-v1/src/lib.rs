//! Test-only: version 1 of the scheduler `hot`, round robin, exported
//! for kpx:proxier 0.2.0: what keeps kpx's support of 0.2.0 schedulers
//! tested (loaded, checked as spreading, replaced by a 0.4.0 version 2).
#![forbid(unsafe_code)]

const POLICY: &str = "rr";

mod hot;

kpx_sdk::export_scheduler_v0_2!(hot::Hot);
