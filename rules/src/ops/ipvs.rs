//! IPVS virtual servers as typed values (ipvs mode): what a backend
//! returns, what the host checks and reconciles the kernel's table to.

use std::net::IpAddr;

use crate::model::Protocol;
use crate::plan::SlotTable;

/// One real server of a virtual server.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RealServer {
    pub ip: IpAddr,
    pub port: u16,
    /// 0 takes no new connections.
    pub weight: u32,
}

/// One virtual server.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VirtualServer {
    pub address: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
    pub scheduler: String,
    /// IP_VS_SVC_F_SCHED1..3 as bits 0..2.
    pub scheduler_flags: u8,
    /// ClientIP affinity: persistence in seconds (0: none).
    pub persistence_seconds: u32,
    pub reals: Vec<RealServer>,
    /// A slot table over the source address, slots naming positions in
    /// `reals`, that the host executes (firewall marks).
    pub slots: Option<SlotTable>,
}

/// The whole table the backend wants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    pub services: Vec<VirtualServer>,
}

impl Ruleset {
    pub fn len(&self) -> usize {
        self.services.len() + self.services.iter().map(|s| s.reals.len()).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }
}
