//! Every write to the kernel goes through here. Each mode's writer lives
//! with its rendering and read-back: iptables (iptables-restore through an
//! [`Exec`], which tests replace to see exactly what is sent), nftables
//! (nf_tables netlink) and ipvs (generic netlink, ipset, iptables). Every
//! netlink socket is [`netlink`]'s.

pub mod conntrack;
pub mod exec;
pub mod interfaces;
pub mod iptables;
pub mod ipvs;
pub mod netlink;
pub mod nfacct;
pub mod nftables;
pub mod sysctl;

pub use exec::{Exec, SystemExec};

/// What a sync may write at most, unless set from the plugin output cap.
pub const DEFAULT_MAX_BYTES: usize = 256 << 20;

/// Why a kernel write or read failed. Each write is atomic (an
/// iptables-restore run, an nf_tables batch), so a failure leaves what the
/// kernel held as it was but for whole earlier steps of the same sync: the
/// iptables runs before the main one (new chains nothing jumps to yet),
/// nftables' make-before-break first step (checked additions beside what
/// was there). The sync is retried in full with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The tool could not be started (not installed?).
    #[error("cannot run {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    /// The tool did not finish in time and was killed.
    #[error("{program} did not finish in {seconds} s and was stopped")]
    Timeout { program: String, seconds: u64 },
    /// The tool exited, but a process it left running held its output
    /// open; the tool's process group was killed.
    #[error("{program} exited, but a process it started held its output open; its process group was killed")]
    OutputHeld { program: String },
    /// The tool refused: its exit status and what it said, read once by
    /// [`exec::classify`].
    #[error("{program} failed ({status}): {stderr}")]
    Failed {
        program: String,
        status: String,
        stderr: String,
        cause: Cause,
        /// What it printed before it failed (a save that fails on one
        /// table has printed the others).
        stdout: String,
    },
    /// Netlink (nf_tables, ctnetlink, nfacct, IPVS, kube-ipvs0): the
    /// kernel's own errno.
    #[error(transparent)]
    Netlink(#[from] netlink::Error),
    /// IPVS refused some of a sync's writes; the others were made.
    #[error("IPVS refused {count} of the sync's writes; the first: {first}")]
    IpvsRefused { count: usize, first: String },
    /// What the kernel gave back cannot be read.
    #[error("cannot read {what}: {reason}")]
    Unreadable { what: String, reason: String },
}

/// What a failed tool's message says, where kpx acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The object exists already (`iptables -N` of an existing chain).
    Exists,
    /// No such object (rule, chain or table).
    NotFound,
    /// Another program holds the xtables lock.
    Locked,
    Other,
}

impl Error {
    /// The tool that failed, when a tool did.
    pub fn program(&self) -> Option<&str> {
        match self {
            Error::Spawn { program, .. }
            | Error::Timeout { program, .. }
            | Error::OutputHeld { program }
            | Error::Failed { program, .. } => Some(program),
            _ => None,
        }
    }

    pub fn cause(&self) -> Cause {
        match self {
            Error::Failed { cause, .. } => *cause,
            Error::Netlink(e) if e.is_exists() => Cause::Exists,
            Error::Netlink(e) if e.is_not_found() => Cause::NotFound,
            _ => Cause::Other,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a sync wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The ruleset broke a confinement rule: nothing written; full resync.
    #[error(transparent)]
    Rejected(#[from] crate::validate::Rejected),
    /// The kernel refused or could not be read: nothing written; full resync.
    #[error(transparent)]
    Kernel(#[from] Error),
    /// The plugin returned rules for another mode: nothing written; full resync.
    #[error("plugin {plugin} returned {got} rules in {want} mode")]
    WrongMode { plugin: String, got: &'static str, want: &'static str },
    /// A partial sync would fill a set past its size: nothing written; the
    /// caller writes a full sync instead.
    #[error(transparent)]
    Overfull(#[from] nftables::sizing::Overfull),
}

impl From<netlink::Error> for SyncError {
    fn from(e: netlink::Error) -> Self {
        SyncError::Kernel(e.into())
    }
}

/// What one sync wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub bytes: usize,
    /// Time spent in the kernel's reads and writes (the programs that
    /// make them included); the rest of the sync's time is the host's.
    pub kernel: std::time::Duration,
    /// CPU time of the host's checks of the plugin's ruleset, on the
    /// thread that made them: the part of the host's time the checks take
    /// (the growth tests hold it linear apart from the rendering's).
    pub check: std::time::Duration,
    /// CPU time of the sync's thread in the kernel's reads and writes
    /// (`kernel`'s share of it): nf_tables' work on a netlink batch is
    /// done in the sending thread; iptables' in its tools, not counted here.
    pub kernel_cpu: std::time::Duration,
    /// iptables and ipvs modes: the iptables rules kube-proxy owns now,
    /// (filter, nat).
    pub iptables_rules: Option<(usize, usize)>,
    /// iptables mode: the rules this sync wrote, (filter, nat).
    pub iptables_written: Option<(usize, usize)>,
    /// Kernel transactions the sync took (nftables: 2 when made before
    /// broken, [`nftables::steps`]; else 1).
    pub steps: u8,
    /// nftables mode: the cleanup after the write failed (the objects of
    /// what is no longer wanted stay; upstream's
    /// `nftables_cleanup_failures_total`).
    pub cleanup_failed: bool,
}

/// What a sync's kernel side reads of the state besides the plugin's
/// ruleset: what the ruleset may refer to, and what the host writes itself.
#[derive(Clone, Copy)]
pub struct StateView<'a> {
    pub cluster: &'a kpx_rules::model::Cluster,
    /// The destinations and endpoints a plugin's rules may name.
    pub scope: &'a crate::validate::Scope,
    /// The service ports the plugin holds, by key (ipvs mode's ipsets).
    pub ports: &'a crate::state::PortMap,
    /// ipvs mode: the node's own addresses (kube-ipvs0's and link-local
    /// ones left out), read once per sync; never bound to kube-ipvs0.
    pub local_addresses: &'a [std::net::IpAddr],
}

/// The running mode's kernel side (one per family, made once: the
/// variants' sizes do not matter).
#[allow(clippy::large_enum_variant)]
pub enum Dataplane {
    Iptables(iptables::IptablesDataplane),
    Nftables(nftables::NftablesDataplane),
    Ipvs(ipvs::dataplane::IpvsDataplane),
}

impl Dataplane {
    /// What the kernel lost of the host's own rules since they were
    /// written (upstream's canary, extended to flushed chains), if
    /// anything: checked once per sync period, and a loss makes the next
    /// sync full.
    pub fn lost(
        &mut self,
        settings: &kpx_rules::model::Settings,
        cluster: &kpx_rules::model::Cluster,
    ) -> Result<Option<String>> {
        match self {
            Dataplane::Iptables(d) => d.lost(settings),
            Dataplane::Nftables(d) => d.lost(settings, cluster),
            Dataplane::Ipvs(d) => d.lost(settings),
        }
    }

    /// What the last sync found gone of what the one before left, and put
    /// back without a full sync (ipvs mode's partial syncs reconcile with
    /// the kernel), once.
    pub fn take_repaired(&mut self) -> Option<String> {
        match self {
            Dataplane::Ipvs(d) => d.take_repaired(),
            Dataplane::Iptables(_) | Dataplane::Nftables(_) => None,
        }
    }

    /// The most bytes one sync may write to the kernel.
    pub fn with_max_bytes(self, max_bytes: usize) -> Dataplane {
        match self {
            Dataplane::Iptables(d) => Dataplane::Iptables(d.with_max_bytes(max_bytes)),
            Dataplane::Nftables(d) => Dataplane::Nftables(d.with_max_bytes(max_bytes)),
            Dataplane::Ipvs(d) => Dataplane::Ipvs(d),
        }
    }

    /// Whether a full sync would write `ruleset` (the host's checks and
    /// its rendering), nothing written: a replacement component's trial.
    pub fn check(
        &self,
        plugin: &str,
        settings: &kpx_rules::model::Settings,
        state: StateView<'_>,
        ruleset: &kpx_rules::ops::Ruleset,
    ) -> std::result::Result<(), SyncError> {
        use kpx_rules::ops::Ruleset;
        match (self, ruleset) {
            (Dataplane::Iptables(d), Ruleset::Iptables(r)) => d.check(plugin, settings, r, state.scope),
            (Dataplane::Nftables(d), Ruleset::Nftables(t)) => d.check(plugin, settings, t, state.scope),
            (Dataplane::Ipvs(_), Ruleset::Ipvs(r)) => Ok(ipvs::dataplane::check(plugin, settings, r, state.scope)?),
            (d, r) => Err(SyncError::WrongMode { plugin: plugin.into(), got: ruleset_kind(r), want: d.kind() }),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Dataplane::Iptables(_) => "iptables",
            Dataplane::Nftables(_) => "nftables",
            Dataplane::Ipvs(_) => "ipvs",
        }
    }

    /// Checks a plugin's ruleset, writes it with the host's own objects,
    /// and remembers what was written.
    pub fn sync(
        &mut self,
        plugin: &str,
        settings: &kpx_rules::model::Settings,
        state: StateView<'_>,
        ruleset: &kpx_rules::ops::Ruleset,
        full: bool,
    ) -> std::result::Result<Written, SyncError> {
        use kpx_rules::ops::Ruleset;
        let StateView { cluster, scope, .. } = state;
        match (self, ruleset) {
            (Dataplane::Iptables(d), Ruleset::Iptables(r)) => d.sync(plugin, settings, r, full, scope),
            (Dataplane::Nftables(d), Ruleset::Nftables(t)) => d.sync(plugin, settings, cluster, t, full, scope),
            (Dataplane::Ipvs(d), Ruleset::Ipvs(r)) => d.sync(plugin, settings, r, state, full),
            (d, r) => Err(SyncError::WrongMode { plugin: plugin.into(), got: ruleset_kind(r), want: d.kind() }),
        }
    }
}

fn ruleset_kind(r: &kpx_rules::ops::Ruleset) -> &'static str {
    match r {
        kpx_rules::ops::Ruleset::Iptables(_) => "iptables",
        kpx_rules::ops::Ruleset::Nftables(_) => "nftables",
        kpx_rules::ops::Ruleset::Ipvs(_) => "ipvs",
    }
}
