//! The backend a mode's generator is, in plain Rust.

use crate::model::{Change, Cluster, Node, ServicePort, Settings};

/// What a backend does: the Rust shape of the WIT `proxier` resource.
/// Plugins implement it (through kpx-sdk); the benchmark runs it natively.
pub trait Backend {
    fn new(settings: Settings) -> Self
    where
        Self: Sized;
    fn reset(&mut self, node: Node, cluster: Cluster, services: Vec<ServicePort>);
    fn apply(&mut self, changes: Vec<Change>);
    fn render(&mut self, full: bool) -> Result<crate::ops::Ruleset, String>;
}
