//! What one IP family's sync returns, whatever its proxier: a [`Report`]
//! or an [`Error`]. Below every kind of proxier (the rule modes' in sync/,
//! userspace mode's, the extensions'), which all return them.

use kpx_rules::model::IpFamily;

use crate::kernel::SyncError;
use crate::runtime;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The plugin failed; recovered by a full sync (with a fresh instance
    /// if it trapped or its output was too large).
    #[error(transparent)]
    Plugin(#[from] runtime::Error),
    /// The ruleset was refused or the kernel write failed: nothing
    /// written; full resync.
    #[error("{family}: {source}")]
    Sync { family: IpFamily, source: SyncError },
}

/// What one sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub full: bool,
    pub changes: usize,
    pub bytes: usize,
    /// The host's own work before the plugin: the state's changes
    /// collected into service ports, the node's addresses read.
    pub host: std::time::Duration,
    /// Time in the plugin: a new instance given the whole state (the
    /// first sync, and after a trap), or the changes; and the render.
    pub plugin: std::time::Duration,
    /// The host's checks of the ruleset and its rendering into the
    /// kernel's syntax or messages, and its record of what was written.
    pub check: std::time::Duration,
    /// The kernel's part: reads and writes.
    pub kernel: std::time::Duration,
    /// CPU time of the sync thread in the host's checks, and in the
    /// kernel's reads and writes (`kernel::Written::check`, `kernel_cpu`).
    pub check_cpu: std::time::Duration,
    pub kernel_cpu: std::time::Duration,
    /// Extensions' syncs after the write.
    pub extensions: std::time::Duration,
    /// iptables mode: the rules kube-proxy owns now, (filter, nat).
    pub iptables_rules: Option<(usize, usize)>,
    /// iptables mode: the rules this sync wrote, (filter, nat).
    pub iptables_written: Option<(usize, usize)>,
    /// Kernel transactions of the rule write (nftables: 2 when made
    /// before broken).
    pub steps: u8,
    /// nftables mode: the cleanup after the write failed.
    pub cleanup_failed: bool,
}
