//! Bindings for kpx:proxier@0.4.0 (wit/since_v0.4.0): the scheduler world
//! with `promises`, the extension world with `accept` and
//! `check-parameters`. Their other types are 0.2.0's, bound to 0.2.0's
//! Rust types; the one import, 0.2.0's log, is linked with 0.2.0's.

pub mod extension;
pub mod scheduler;

/// The contract version these bindings implement.
pub const VERSION: &str = "0.4.0";
