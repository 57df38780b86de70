//! Test-only: version 2 of the scheduler `hot`, maglev, exported for
//! kpx:proxier 0.4.0 (the same source as version 1 but for the policy
//! and the contract).
#![forbid(unsafe_code)]

const POLICY: &str = "maglev";

#[path = "../../hot-v1/src/hot.rs"]
mod hot;

kpx_sdk::export_scheduler!(hot::Hot);
