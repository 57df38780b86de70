//! Every write to the kernel goes through here: each writer runs its tool
//! through an [`Exec`], which tests replace to see exactly what is sent.

pub mod conntrack;
pub mod exec;
pub mod interfaces;
pub mod iptables;
pub mod nftables;
pub mod sysctl;

pub use exec::{Exec, SystemExec};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The tool could not be started (not installed?): the sync fails and
    /// is retried in full.
    #[error("cannot run {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    /// The tool refused the change: nothing of it applied (iptables-restore
    /// and nft are atomic per call); retried as a full sync.
    #[error("{program} failed ({status}): {stderr}")]
    Failed { program: String, status: String, stderr: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The kernel writer of the running mode.
pub enum Dataplane {
    Iptables(iptables::IptablesKernel),
    Nftables(nftables::NftablesKernel),
}

impl Dataplane {
    pub fn exec(&self) -> &dyn Exec {
        match self {
            Dataplane::Iptables(k) => k.exec(),
            Dataplane::Nftables(k) => k.exec(),
        }
    }
}
