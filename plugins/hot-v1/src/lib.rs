//! Test-only: version 1 of the scheduler `hot`, round robin.
#![forbid(unsafe_code)]

const POLICY: &str = "rr";

mod hot;
