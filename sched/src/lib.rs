//! kpx-sched: load-balancing policy, I/O-free, built natively and for
//! WebAssembly (the built-in scheduler component links it).
//!
//! Two layers:
//! - [`ipvs`] and [`tables`]: the per-connection rules of Linux IPVS's
//!   schedulers (net/netfilter/ipvs/ip_vs_*.c), and maglev (NSDI'16), as
//!   pickers that choose one destination for one connection;
//! - [`plan`]: a [`Plan`] a mode executes for every connection, derived
//!   from those pickers (a rotation is one cycle of rr/wrr, a slot table
//!   is the scheduler's table, a weighted choice is the next picks of a
//!   least-connection scheduler under the measured load).

pub mod ipvs;
pub mod params;
pub mod pick;
pub mod plan;
pub mod tables;

use std::net::IpAddr;

pub use kpx_rules::plan::{HashField, Plan, SlotTable};

/// One destination (an endpoint) as a scheduler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dest {
    pub ip: IpAddr,
    pub port: u16,
    /// 0: takes no new connections.
    pub weight: u32,
    /// IPVS's active (established) connections.
    pub active: u32,
    /// IPVS's inactive (other) connections.
    pub inactive: u32,
    /// IPVS's IP_VS_DEST_F_OVERLOAD (the upper threshold is reached).
    pub overloaded: bool,
}

impl Dest {
    pub fn new(ip: IpAddr, port: u16, weight: u32) -> Dest {
        Dest { ip, port, weight, active: 0, inactive: 0, overloaded: false }
    }

    /// IPVS's `ip_vs_dest_conn_overhead`: active connections cost 256
    /// inactive ones.
    pub fn overhead(&self) -> u64 {
        (u64::from(self.active) << 8) + u64::from(self.inactive)
    }

    /// Takes new connections: a positive weight and not overloaded.
    pub fn available(&self) -> bool {
        self.weight > 0 && !self.overloaded
    }

    /// `ip:port`, the name hashing schedulers key a destination by.
    pub fn name(&self) -> String {
        kpx_rules::model::join_host_port(&self.ip, self.port)
    }
}

/// What one connection looks like to a scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connection {
    pub source: IpAddr,
    pub destination: IpAddr,
}

/// Chooses a destination for each new connection, as IPVS does.
pub trait Picker {
    /// An index into `dests`, or None when IPVS would find no destination.
    fn pick(&mut self, dests: &[Dest], conn: Connection) -> Option<usize>;
}

/// The built-in schedulers, as the annotation names them.
pub const NAMES: [&str; 13] =
    ["rr", "wrr", "lc", "wlc", "sed", "nq", "dh", "sh", "lblc", "lblcr", "mh", "random", "maglev"];

/// Whether a scheduler plans from live load.
pub fn uses_load(name: &str) -> bool {
    matches!(name, "lc" | "wlc" | "sed" | "nq" | "lblc" | "lblcr")
}
