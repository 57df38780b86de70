//! Test-only: version 2 of the scheduler `hot`, maglev (the same source
//! as version 1 but for the policy).
#![forbid(unsafe_code)]

const POLICY: &str = "maglev";

#[path = "../../hot-v1/src/hot.rs"]
mod hot;
