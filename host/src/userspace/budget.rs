//! What the relays may hold: a budget of relays (TCP connections and UDP
//! sessions) sized from kpx's file descriptors, with a share per client
//! address and per service port, so that no client (idle connections, a
//! UDP flood from many source ports) and no Service can take what the
//! others and the sync loop need. A descriptor reserve is kept for the
//! sync loop's own tools and sockets (iptables-restore, netlink, the
//! servers): relays never use it.
//!
//! A relay over a limit is refused at once: a TCP connection is accepted
//! and closed (never left in the listener's backlog, where it would hold
//! up the port's other clients), a new UDP session's datagram dropped.
//! Refusals are counted by reason (`kpx_userspace_relays_refused_total`)
//! and logged at most once per [`LOG_EVERY`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;

/// Descriptors a TCP relay holds at most: the two sockets and two pipes
/// of two ends each (a UDP session holds one; each counts as a TCP one).
pub const DESCRIPTORS_PER_RELAY: u64 = 6;

/// The most often a refusal is logged (each is counted).
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The relays' limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Relays at once, all ports together.
    pub relays: usize,
    /// Relays one client address holds at once, over all ports.
    pub per_client: usize,
    /// Relays one service port's listener holds at once.
    pub per_port: usize,
}

impl Limits {
    /// The limits for `open_files` descriptors (kpx's RLIMIT_NOFILE): an
    /// eighth of them (at least 1,024) kept for the sync loop, the rest
    /// for relays up to [`super::MAX_RELAYS`]; a client gets an eighth of
    /// the relays, a port a quarter.
    pub fn for_descriptors(open_files: u64) -> Limits {
        let reserve = (open_files / 8).max(1024);
        let relays = (open_files.saturating_sub(reserve) / DESCRIPTORS_PER_RELAY) as usize;
        let relays = relays.clamp(16, super::MAX_RELAYS);
        Limits { relays, per_client: (relays / 8).max(4), per_port: (relays / 4).max(8) }
    }

    /// The limits for this process's open-files limit now.
    pub fn here() -> Limits {
        let (soft, _) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap_or((1024, 1024));
        Limits::for_descriptors(soft)
    }
}

/// Why a relay was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Every relay of the budget is held.
    Total,
    /// The client address holds its share.
    Client,
    /// The service port holds its share.
    Port,
}

impl Refused {
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Total => "total",
            Refused::Client => "client",
            Refused::Port => "port",
        }
    }
}

/// The refusal counters, by reason (registered by the caller).
#[derive(Debug, Clone, Default)]
pub struct Counters {
    pub total: Counter,
    pub client: Counter,
    pub port: Counter,
}

#[derive(Default)]
struct Held {
    total: usize,
    by_client: HashMap<IpAddr, usize>,
}

/// The budget every listener of a mode shares.
pub struct Budget {
    limits: Limits,
    held: Mutex<Held>,
    /// The node's addresses, by family (no client share).
    node: Mutex<[Vec<IpAddr>; 2]>,
    counters: Counters,
    started: Instant,
    /// When a refusal was last logged (milliseconds since `started`, +1).
    logged: AtomicU64,
}

/// One service port's share: what its listener holds now.
#[derive(Debug, Default)]
pub struct Port {
    held: AtomicUsize,
}

impl Port {
    pub fn new() -> Arc<Port> {
        Arc::new(Port::default())
    }

    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

/// A listener's way into the budget: the budget, and its port's share.
#[derive(Clone)]
pub struct Share {
    pub budget: Arc<Budget>,
    pub port: Arc<Port>,
}

impl Share {
    /// A place for a relay of `client` (see [`Budget::take`]).
    pub fn take(&self, client: IpAddr, what: &dyn Fn() -> String) -> Option<Ticket> {
        self.budget.take(&self.port, client, what)
    }

    /// A share of a budget of its own (tests).
    #[cfg(test)]
    pub fn unlimited() -> Share {
        let l = super::MAX_RELAYS;
        let budget = Budget::new(Limits { relays: l, per_client: l, per_port: l }, Counters::default());
        Share { budget, port: Port::new() }
    }
}

/// A relay's place in the budget, given back when dropped.
pub struct Ticket {
    budget: Arc<Budget>,
    port: Arc<Port>,
    client: IpAddr,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.port.held.fetch_sub(1, Ordering::AcqRel);
        let mut held = self.budget.held.lock().expect("relay budget");
        held.total -= 1;
        if let Some(n) = held.by_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                held.by_client.remove(&self.client);
            }
        }
    }
}

impl Budget {
    pub fn new(limits: Limits, counters: Counters) -> Arc<Budget> {
        Arc::new(Budget {
            limits,
            held: Mutex::default(),
            node: Mutex::default(),
            counters,
            started: Instant::now(),
            logged: AtomicU64::new(0),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The node's addresses of `family` now (read at every sync).
    pub fn unshared(&self, family: kpx_rules::model::IpFamily, addresses: &[IpAddr]) {
        let i = usize::from(family == kpx_rules::model::IpFamily::V6);
        let mut node = self.node.lock().expect("relay budget");
        let of_family: Vec<IpAddr> =
            addresses.iter().copied().filter(|a| kpx_rules::model::IpFamily::of(a) == family).collect();
        if node[i] != of_family {
            node[i] = of_family;
        }
    }

    /// Whether `client` has a share of its own (not loopback, not the node's).
    fn shared(&self, client: IpAddr) -> bool {
        !client.is_loopback() && !self.node.lock().expect("relay budget").iter().flatten().any(|a| *a == client)
    }

    /// Relays held now, all ports together.
    pub fn held(&self) -> usize {
        self.held.lock().expect("relay budget").total
    }

    /// A place for a relay of `client` on `port`, or why not (counted and,
    /// now and then, logged with `what` names the port).
    pub fn take(self: &Arc<Self>, port: &Arc<Port>, client: IpAddr, what: &dyn Fn() -> String) -> Option<Ticket> {
        let client = client.to_canonical();
        let shared = self.shared(client);
        let refused = {
            let mut held = self.held.lock().expect("relay budget");
            let of_client = held.by_client.get(&client).copied().unwrap_or(0);
            if held.total >= self.limits.relays {
                Some(Refused::Total)
            } else if shared && of_client >= self.limits.per_client {
                Some(Refused::Client)
            } else if port.held() >= self.limits.per_port {
                Some(Refused::Port)
            } else {
                held.total += 1;
                *held.by_client.entry(client).or_insert(0) += 1;
                port.held.fetch_add(1, Ordering::AcqRel);
                None
            }
        };
        let Some(why) = refused else {
            return Some(Ticket { budget: Arc::clone(self), port: Arc::clone(port), client });
        };
        match why {
            Refused::Total => self.counters.total.inc(),
            Refused::Client => self.counters.client.inc(),
            Refused::Port => self.counters.port.inc(),
        };
        self.log(why, client, what);
        None
    }

    fn log(&self, why: Refused, client: IpAddr, what: &dyn Fn() -> String) {
        let now = self.started.elapsed().as_millis() as u64 + 1;
        let last = self.logged.load(Ordering::Relaxed);
        if last != 0 && now < last + LOG_EVERY.as_millis() as u64 {
            return;
        }
        if self.logged.compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return;
        }
        let l = self.limits;
        let limit = match why {
            Refused::Total => format!("all {} relays are held", l.relays),
            Refused::Client => format!("{client} holds its {} relays", l.per_client),
            Refused::Port => format!("the port holds its {} relays", l.per_port),
        };
        tracing::warn!(
            reason = why.as_str(),
            "userspace: a relay for {client} to {} refused: {limit} (counted in kpx_userspace_relays_refused_total; logged at most every {} s)",
            what(),
            LOG_EVERY.as_secs()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_keep_a_reserve_and_shares() {
        let l = Limits::for_descriptors(20_000);
        // 2,500 kept; 17,500 / 6.
        assert_eq!(l, Limits { relays: 2_916, per_client: 364, per_port: 729 });
        assert_eq!(Limits::for_descriptors(1 << 20).relays, crate::userspace::MAX_RELAYS);
        assert_eq!(Limits::for_descriptors(1024).relays, 16, "a floor where descriptors are few");
    }

    #[test]
    fn a_client_and_a_port_get_their_share_and_give_it_back() {
        let counters = Counters::default();
        let budget = Budget::new(Limits { relays: 10, per_client: 3, per_port: 5 }, counters.clone());
        let (a, b) = (Port::new(), Port::new());
        let greedy: IpAddr = "10.0.0.1".parse().unwrap();
        let name = || "test".to_string();
        let held: Vec<Ticket> = (0..5).filter_map(|_| budget.take(&a, greedy, &name)).collect();
        assert_eq!(held.len(), 3, "the client's share");
        assert_eq!(counters.client.get(), 2);
        // IPv4-mapped is the same client.
        assert!(budget.take(&a, "::ffff:10.0.0.1".parse().unwrap(), &name).is_none());
        let others: Vec<Ticket> =
            (2..10).filter_map(|i| budget.take(&a, format!("10.0.1.{i}").parse().unwrap(), &name)).collect();
        assert_eq!(others.len(), 2, "the port's share (5)");
        assert_eq!(counters.port.get(), 6);
        let more: Vec<Ticket> =
            (2..10).filter_map(|i| budget.take(&b, format!("10.0.2.{i}").parse().unwrap(), &name)).collect();
        assert_eq!(more.len(), 5, "another port: the rest of the total");
        assert!(counters.total.get() >= 1);
        assert_eq!(budget.held(), 10);
        drop(held);
        assert_eq!((budget.held(), a.held()), (7, 2));
        assert!(budget.take(&a, greedy, &name).is_some(), "given back");
    }

    /// Loopback and the node's own addresses have no client share.
    #[test]
    fn the_nodes_own_clients_have_no_share_of_their_own() {
        let budget = Budget::new(Limits { relays: 100, per_client: 2, per_port: 100 }, Counters::default());
        let port = Port::new();
        let name = || "test".to_string();
        let node: IpAddr = "192.168.0.2".parse().unwrap();
        budget.unshared(kpx_rules::model::IpFamily::V4, &[node, "fd00::2".parse().unwrap()]);
        let held: Vec<Ticket> = (0..10)
            .flat_map(|_| [budget.take(&port, node, &name), budget.take(&port, "127.0.0.1".parse().unwrap(), &name)])
            .flatten()
            .collect();
        assert_eq!(held.len(), 20, "neither is held to 2");
        let other: IpAddr = "192.168.0.3".parse().unwrap();
        let others: Vec<Ticket> = (0..5).filter_map(|_| budget.take(&port, other, &name)).collect();
        assert_eq!(others.len(), 2);
        // The node's address moved: the old one is a client like others.
        budget.unshared(kpx_rules::model::IpFamily::V4, &["192.168.0.9".parse().unwrap()]);
        assert!(budget.take(&port, node, &name).is_none());
    }
}
