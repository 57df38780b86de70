//! userspace mode: the host opens a port per side of each service port
//! (`listeners`), upstream's REDIRECT rules send the Service's traffic
//! there (`rules`, host-owned: no plugin can express them), and each new
//! connection or UDP session is relayed to an endpoint the Service's
//! scheduler component picks with the exact live counts (`balancer`),
//! after ClientIP affinity, retrying another endpoint when a dial fails
//! (`tcp`, `udp`). `proxier` is one family's sync. The relays run in a
//! tokio runtime of their own, apart from the sync loop.
//!
//! The endpoint sees the connection come from the node (the proxy's own
//! socket): a userspace proxy cannot keep the client's source address.

pub mod balancer;
pub mod budget;
pub mod listeners;
pub mod localhost;
pub mod proxier;
pub mod rules;
pub mod tcp;
pub mod udp;

pub use proxier::UserspaceProxier;

use std::sync::Arc;
use std::time::Duration;

/// The most TCP connections and UDP sessions kpx relays at once (all
/// ports together; fewer where kpx has fewer descriptors, and a share per
/// client and per port: [`budget`]): past it, a new connection is closed
/// as accepted and a new UDP client's datagram dropped. What a relay can hold in flight: two pipes of
/// [`tcp::PIPE`] for the first [`tcp::LARGE_PIPES`] relays, of the
/// kernel's 64 KiB for the others (a UDP session one 64 KiB datagram
/// buffer): about 2.5 GiB at the cap, reached only by receivers that stop
/// reading.
pub const MAX_RELAYS: usize = 16_384;

/// Where the relays run and what bounds them, shared by every listener.
#[derive(Clone)]
pub struct Relays {
    pub runtime: tokio::runtime::Handle,
    pub budget: Arc<budget::Budget>,
    /// A UDP session idle this long ends (`--udp-timeout`).
    pub udp_timeout: Duration,
    /// A TCP relay idle this long (no byte either way) ends: the kernel's
    /// timeout of an established connection's conntrack entry
    /// (`--conntrack-tcp-timeout-established`), after which a connection
    /// through the kernel's NAT would have lost its translation too.
    pub tcp_idle: Duration,
    /// The congestion control of connections to endpoints on this node
    /// ([`tcp::local_hop_congestion`]).
    pub local_hop: &'static str,
}

impl Relays {
    pub fn new(
        runtime: tokio::runtime::Handle,
        udp_timeout: Duration,
        tcp_idle: Duration,
        budget: Arc<budget::Budget>,
    ) -> Relays {
        let local_hop = tcp::local_hop_congestion_here();
        tracing::info!("userspace: connections to endpoints on this node use the {local_hop} congestion control");
        let l = budget.limits();
        tracing::info!(
            relays = l.relays,
            per_client = l.per_client,
            per_port = l.per_port,
            "userspace: relay budget (from the open-files limit, a reserve kept for the sync loop)"
        );
        Relays { runtime, budget, udp_timeout, tcp_idle, local_hop }
    }
}

/// A chooser for the relays' tests: round robin, skipping the endpoints
/// that failed the connection (upstream's default).
#[cfg(test)]
pub(crate) struct RoundRobin {
    pub endpoints: Vec<std::net::SocketAddr>,
    pub next: std::sync::Mutex<usize>,
}

#[cfg(test)]
impl RoundRobin {
    pub fn new(endpoints: Vec<std::net::SocketAddr>) -> RoundRobin {
        RoundRobin { endpoints, next: std::sync::Mutex::new(0) }
    }
}

#[cfg(test)]
impl tcp::Chooser for RoundRobin {
    fn choose(
        &self,
        _: std::net::SocketAddr,
        _: usize,
        failed: &[std::net::SocketAddr],
    ) -> Option<std::net::SocketAddr> {
        let mut next = self.next.lock().unwrap();
        for _ in 0..self.endpoints.len() {
            let e = self.endpoints[*next % self.endpoints.len()];
            *next += 1;
            if !failed.contains(&e) {
                return Some(e);
            }
        }
        None
    }
}

/// (service port, scheduler name) of every port in `ports` that names one
/// (what a scheduler replacement must keep exporting).
pub fn scheduler_users<'a>(ports: impl Iterator<Item = &'a kpx_rules::model::ServicePort>) -> Vec<(String, String)> {
    ports.filter_map(|p| Some((p.key.clone(), p.scheduler.as_ref()?.name.clone()))).collect()
}
