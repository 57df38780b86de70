//! Per-connection choice of an endpoint in userspace mode: the Service's
//! scheduler component is asked for every new connection (or UDP session)
//! with the exact live counts the host keeps, after upstream's ClientIP
//! affinity; a scheduler that fails (unknown name, refusal, trap) leaves
//! the port served by round robin, by weight when its endpoints carry
//! weights (`kpx.dev/weights`, as the default a Service naming no
//! scheduler gets: wrr), logged once per reason.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kpx_rules::model::{SchedulerChoice, ServicePort, TrafficPolicy};

use super::tcp::Chooser;
use crate::runtime::{PickRequest, PickSetup, SchedulerInstance, SchedulerPlugin};

/// How long a service port stays on round robin (by weight) after its scheduler failed.
pub const BACKOFF: Duration = Duration::from_secs(10);
/// ClientIP affinity records kept per service port at most (expired ones
/// are swept first; past it, a new client is not recorded).
const MAX_STICKY: usize = 65_536;

/// upstream's userspace proxier: round robin unless the Service says otherwise.
pub const DEFAULT_SCHEDULER: &str = "rr";
/// The default for endpoints with weights (`kpx.dev/weights`).
pub const DEFAULT_WEIGHTED: &str = "wrr";

/// One component, its live instance and the pick ids it has set up (at
/// which generation of their candidates).
struct Slot {
    plugin: Arc<SchedulerPlugin>,
    instance: Option<SchedulerInstance>,
    prepared: HashMap<u32, u64>,
}

/// The scheduler components, one live instance each, shared by every
/// service port of the mode (a pick holds the lock for about 2 µs). A
/// side of a service port is set up in the component under an id once
/// per change of its candidates; a connection then crosses the boundary
/// with the client and the live counts only.
pub struct Picker {
    slots: Mutex<Vec<Slot>>,
    next_id: AtomicU32,
}

impl Picker {
    pub fn new(plugins: Vec<Arc<SchedulerPlugin>>) -> Picker {
        let slots = plugins.into_iter().map(|plugin| Slot { plugin, instance: None, prepared: HashMap::new() });
        Picker { slots: Mutex::new(slots.collect()), next_id: AtomicU32::new(1) }
    }

    /// Tries a replacement for the `index`-th component: an instance, and
    /// for each of its names a set-up and a pick over two candidates that
    /// must neither trap nor pick outside them (its own refusal is allowed:
    /// the port falls back to round robin, as at any time).
    pub fn try_replacement(plugin: &SchedulerPlugin) -> Result<SchedulerInstance, String> {
        let mut instance = plugin.instantiate().map_err(|e| e.to_string())?;
        let endpoints = [("10.0.0.1".parse().expect("an address"), 80), ("10.0.0.2".parse().expect("an address"), 80)];
        for (k, name) in instance.names().to_vec().iter().enumerate() {
            let setup = PickSetup {
                name,
                parameters: &[],
                service: "kpx/trial:p",
                destination: "10.96.0.1".parse().expect("an address"),
                endpoints: &endpoints,
                weights: &[1, 1],
            };
            let request = PickRequest {
                client: "10.1.0.1".parse().expect("an address"),
                active: &[0, 0],
                failed: &[],
                random: 7,
            };
            let id = u32::MAX - k as u32;
            let outcome = instance.prepare_picks(id, &setup).and_then(|()| instance.pick(id, &request));
            // The scheduler's own refusal is allowed; a trap or a bad pick is not.
            if let Err(e) = outcome
                && !matches!(e, crate::runtime::Error::Failed { .. })
            {
                return Err(e.to_string());
            }
            let _ = instance.forget_picks(id);
        }
        Ok(instance)
    }

    /// The `index`-th component.
    pub fn plugin(&self, index: usize) -> Option<Arc<SchedulerPlugin>> {
        self.slots.lock().expect("scheduler instances").get(index).map(|s| s.plugin.clone())
    }

    /// Switches the `index`-th component to a tried replacement: every
    /// side of every port is set up in it again at its next pick.
    pub fn replace(&self, index: usize, plugin: Arc<SchedulerPlugin>, instance: SchedulerInstance) {
        let mut slots = self.slots.lock().expect("scheduler instances");
        if let Some(slot) = slots.get_mut(index) {
            *slot = Slot { plugin, instance: Some(instance), prepared: HashMap::new() };
        }
    }

    /// A fresh id for one side of a service port.
    fn new_id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The scheduler's pick; Err with the reason when no component
    /// implements the name, or it refused, trapped or ran out of fuel (a
    /// trapped instance is replaced at the next pick, and set up again).
    /// `built_in`: only the built-in component (a Service that names no
    /// scheduler gets kube-proxy's default, whatever other components
    /// export).
    pub fn pick(
        &self,
        id: u32,
        generation: u64,
        setup: &PickSetup,
        request: &PickRequest,
        built_in: bool,
    ) -> Result<Option<u32>, String> {
        let mut slots = self.slots.lock().expect("scheduler instances");
        for slot in slots.iter_mut() {
            if built_in && slot.plugin.name() != crate::runtime::BUILT_IN_SCHEDULERS {
                continue;
            }
            if slot.instance.is_none() {
                match slot.plugin.instantiate() {
                    Ok(instance) => {
                        slot.instance = Some(instance);
                        slot.prepared.clear();
                    }
                    Err(e) => {
                        tracing::debug!("scheduler component {}: {e}", slot.plugin.name());
                        continue;
                    }
                }
            }
            let Some(instance) = slot.instance.as_mut() else { continue };
            if !instance.names().iter().any(|n| n == setup.name) {
                continue;
            }
            let result = match slot.prepared.get(&id) {
                Some(g) if *g == generation => instance.pick(id, request),
                _ => instance.prepare_picks(id, setup).and_then(|()| {
                    slot.prepared.insert(id, generation);
                    instance.pick(id, request)
                }),
            };
            return result.map_err(|e| {
                if e.needs_fresh_instance() {
                    slot.instance = None;
                }
                e.to_string()
            });
        }
        Err(format!("no scheduler is named {:?}", setup.name))
    }

    /// The component may forget `id`.
    fn forget(&self, id: u32) {
        let mut slots = self.slots.lock().expect("scheduler instances");
        for slot in slots.iter_mut() {
            if slot.prepared.remove(&id).is_some()
                && let Some(instance) = slot.instance.as_mut()
                && instance.forget_picks(id).is_err_and(|e| e.needs_fresh_instance())
            {
                slot.instance = None;
            }
        }
    }
}

/// Which of a service port's traffic a listener serves: to its cluster IP
/// (internalTrafficPolicy's endpoints), to its node port, external IPs
/// and load-balancer IPs (externalTrafficPolicy's), or, under a Local
/// external policy, the node's and local pods' traffic to those external
/// addresses, which upstream short-circuits to the cluster endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    Internal,
    External,
    Cluster,
}

impl Side {
    pub const ALL: [Side; 3] = [Side::Internal, Side::External, Side::Cluster];
}

/// The candidates of one side.
#[derive(Default)]
struct Candidates {
    /// The key the scheduler keeps this side's state under.
    service: String,
    endpoints: Vec<(IpAddr, u16)>,
    weights: Vec<u32>,
}

struct Inner {
    /// The Service's scheduler (its one copy, shared with its ports).
    choice: Arc<SchedulerChoice>,
    /// The Service names no scheduler: the default, from the built-in
    /// component.
    default_choice: bool,
    destination: IpAddr,
    internal: Candidates,
    external: Candidates,
    cluster: Candidates,
    /// Connections and sessions open per endpoint.
    active: HashMap<SocketAddr, u32>,
    /// The endpoints on this node (`nodeName`), whichever side, sorted.
    on_node: Vec<SocketAddr>,
    /// ClientIP affinity's timeout, if on.
    affinity: Option<Duration>,
    sticky: HashMap<IpAddr, (SocketAddr, Instant)>,
    /// The last failure logged (one line per new reason).
    warned: Option<String>,
    /// Round robin's turn when the scheduler fails ([`by_weight`]).
    turn: usize,
    /// After a scheduler failure, round robin until then: a failing (or
    /// hostile) component is asked again once per [`BACKOFF`], not per
    /// connection.
    fallback_until: Option<Instant>,
    random: u32,
    /// Bumped at every update: the component sets the sides up again.
    generation: u64,
}

/// One service port's choice of endpoints, shared by its listeners.
pub struct Balancer {
    key: String,
    picker: Arc<Picker>,
    /// Each side's pick id in the component (`Side::ALL`'s order).
    ids: [u32; 3],
    inner: Mutex<Inner>,
}

impl Drop for Balancer {
    fn drop(&mut self) {
        for id in self.ids {
            self.picker.forget(id);
        }
    }
}

impl Inner {
    fn side(&self, side: Side) -> &Candidates {
        match side {
            Side::Internal => &self.internal,
            Side::External => &self.external,
            Side::Cluster => &self.cluster,
        }
    }
}

fn side_of(port: &ServicePort, policy: TrafficPolicy, service: String) -> Candidates {
    let which = if policy == TrafficPolicy::Local { &port.local_endpoints } else { &port.cluster_endpoints };
    let endpoints = which.iter().filter_map(|&i| port.endpoints.get(i as usize)).map(|e| (e.ip, e.port)).collect();
    let weights = which.iter().filter_map(|&i| port.endpoints.get(i as usize)).map(|e| u32::from(e.weight)).collect();
    Candidates { service, endpoints, weights }
}

impl Balancer {
    pub fn new(port: &ServicePort, picker: Arc<Picker>) -> Balancer {
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.subsec_nanos());
        let inner = Inner {
            choice: Arc::new(SchedulerChoice { name: DEFAULT_SCHEDULER.into(), parameters: Vec::new() }),
            default_choice: true,
            destination: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            internal: Candidates::default(),
            external: Candidates::default(),
            cluster: Candidates::default(),
            active: HashMap::new(),
            on_node: Vec::new(),
            affinity: None,
            sticky: HashMap::new(),
            warned: None,
            turn: 0,
            fallback_until: None,
            random: seed | 1,
            generation: 0,
        };
        let ids = [picker.new_id(), picker.new_id(), picker.new_id()];
        let balancer = Balancer { key: port.key.clone(), picker, ids, inner: Mutex::new(inner) };
        balancer.update(port);
        balancer
    }

    /// Takes the port's current endpoints, policies, affinity and
    /// scheduler; affinity to an endpoint that is no longer a candidate
    /// is dropped, open connections keep their counts.
    pub fn update(&self, port: &ServicePort) {
        let mut inner = self.inner.lock().expect("balancer");
        inner.generation += 1;
        inner.fallback_until = None;
        let weighted = port.endpoints.iter().any(|e| e.weight != 1);
        inner.default_choice = port.scheduler.is_none();
        inner.choice = port.scheduler.clone().unwrap_or_else(|| {
            Arc::new(SchedulerChoice {
                name: if weighted { DEFAULT_WEIGHTED } else { DEFAULT_SCHEDULER }.into(),
                parameters: Vec::new(),
            })
        });
        let unspecified = if port.endpoints.first().is_some_and(|e| e.ip.is_ipv6()) {
            IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
        };
        inner.destination = port.cluster_ip.unwrap_or(unspecified);
        // Both families' ports share the component (and a key): each keeps
        // its own state.
        let v6 = port.cluster_ip.or(port.endpoints.first().map(|e| e.ip)).is_some_and(|ip| ip.is_ipv6());
        let key = if v6 { format!("{} (IPv6)", port.key) } else { port.key.clone() };
        inner.internal = side_of(port, port.internal_traffic_policy, key.clone());
        let mut external = side_of(port, port.external_traffic_policy, key.clone());
        let mut cluster = side_of(port, TrafficPolicy::Cluster, key.clone());
        // Another candidate list: the scheduler keeps its turn apart.
        if external.endpoints != inner.internal.endpoints {
            external.service = format!("{key} (external)");
        }
        if cluster.endpoints != inner.internal.endpoints {
            cluster.service = format!("{key} (cluster)");
        }
        inner.external = external;
        inner.cluster = cluster;
        inner.on_node =
            port.endpoints.iter().filter(|e| e.conditions.is_local).map(|e| SocketAddr::new(e.ip, e.port)).collect();
        inner.on_node.sort_unstable();
        inner.affinity =
            (port.affinity_timeout_seconds > 0).then(|| Duration::from_secs(u64::from(port.affinity_timeout_seconds)));
        let Inner { sticky, internal, external, cluster, affinity, .. } = &mut *inner;
        let candidate = |e: &SocketAddr| {
            [&internal.endpoints, &external.endpoints, &cluster.endpoints]
                .iter()
                .any(|c| c.contains(&(e.ip(), e.port())))
        };
        if affinity.is_none() {
            sticky.clear();
        } else {
            sticky.retain(|_, (e, _)| candidate(e));
        }
    }

    /// Whether `side` has any endpoint to choose (else its traffic is
    /// refused by the host's rules).
    pub fn has_candidates(&self, side: Side) -> bool {
        !self.inner.lock().expect("balancer").side(side).endpoints.is_empty()
    }

    /// Connections and sessions open per endpoint now.
    #[cfg(test)]
    pub fn active(&self) -> HashMap<SocketAddr, u32> {
        self.inner.lock().expect("balancer").active.clone()
    }

    fn choose(&self, side: Side, client: SocketAddr, attempt: usize, failed: &[SocketAddr]) -> Option<SocketAddr> {
        let mut guard = self.inner.lock().expect("balancer");
        let inner = &mut *guard;
        let now = Instant::now();
        let candidates = match side {
            Side::Internal => &inner.internal,
            Side::External => &inner.external,
            Side::Cluster => &inner.cluster,
        };
        if candidates.endpoints.is_empty() {
            return None;
        }
        let is_candidate = |e: &SocketAddr| candidates.endpoints.contains(&(e.ip(), e.port()));
        if let Some(timeout) = inner.affinity
            && attempt == 0
            && let Some((endpoint, last)) = inner.sticky.get_mut(&client.ip())
            && now.duration_since(*last) < timeout
            && is_candidate(endpoint)
        {
            *last = now;
            let endpoint = *endpoint;
            *inner.active.entry(endpoint).or_default() += 1;
            return Some(endpoint);
        }
        let addr = |(ip, port): &(IpAddr, u16)| SocketAddr::new(*ip, *port);
        let active: Vec<u32> =
            candidates.endpoints.iter().map(|e| inner.active.get(&addr(e)).copied().unwrap_or(0)).collect();
        let failed_at: Vec<u32> = candidates
            .endpoints
            .iter()
            .enumerate()
            .filter(|(_, e)| failed.contains(&addr(e)))
            .map(|(i, _)| i as u32)
            .collect();
        // xorshift32: the scheduler's random number (it has no source).
        let mut r = inner.random;
        r ^= r << 13;
        r ^= r >> 17;
        r ^= r << 5;
        inner.random = r;
        let setup = PickSetup {
            name: &inner.choice.name,
            parameters: &inner.choice.parameters,
            service: &candidates.service,
            destination: inner.destination,
            endpoints: &candidates.endpoints,
            weights: &candidates.weights,
        };
        let request = PickRequest { client: client.ip(), active: &active, failed: &failed_at, random: r };
        let asked = match inner.fallback_until {
            Some(until) if now < until => Err(None),
            _ => self
                .picker
                .pick(self.ids[side as usize], inner.generation, &setup, &request, inner.default_choice)
                .map_err(Some),
        };
        // A weight of 0 takes no new connections: the host holds a
        // scheduler to it (the runtime has already refused picks outside
        // the candidates and among the failed ones).
        let asked = asked.and_then(|picked| match picked {
            Some(i) if candidates.weights.get(i as usize) == Some(&0) => {
                Err(Some(format!("picked candidate {i}, whose weight is 0")))
            }
            other => Ok(other),
        });
        let picked = match asked {
            Ok(Some(i)) => Some(addr(&candidates.endpoints[i as usize])),
            Ok(None) => None,
            Err(why) => {
                if let Some(why) = why {
                    inner.fallback_until = Some(now + BACKOFF);
                    let how = if candidates.weights.iter().any(|w| *w != 1) {
                        "round robin by weight (kpx.dev/weights)"
                    } else {
                        "round robin"
                    };
                    let message = format!("scheduler {}: {why}; {how} for {} s", inner.choice.name, BACKOFF.as_secs());
                    if inner.warned.as_ref() != Some(&message) {
                        tracing::warn!(service = %self.key, "{message}");
                        inner.warned = Some(message);
                    }
                }
                let open: Vec<(SocketAddr, u32)> = candidates
                    .endpoints
                    .iter()
                    .zip(&candidates.weights)
                    .filter(|(_, w)| **w > 0)
                    .map(|(e, w)| (addr(e), *w))
                    .filter(|(e, _)| !failed.contains(e))
                    .collect();
                let pick = by_weight(&open, inner.turn);
                inner.turn = inner.turn.wrapping_add(1);
                pick
            }
        };
        let endpoint = picked?;
        if let Some(timeout) = inner.affinity {
            if inner.sticky.len() >= MAX_STICKY {
                inner.sticky.retain(|_, (_, last)| now.duration_since(*last) < timeout);
            }
            if inner.sticky.len() < MAX_STICKY {
                inner.sticky.insert(client.ip(), (endpoint, now));
            }
        }
        *inner.active.entry(endpoint).or_default() += 1;
        Some(endpoint)
    }

    /// Whether `endpoint` is on this node (its `nodeName` is this node's).
    fn on_this_node(&self, endpoint: SocketAddr) -> bool {
        self.inner.lock().expect("balancer").on_node.binary_search(&endpoint).is_ok()
    }

    fn release(&self, endpoint: SocketAddr) {
        let mut inner = self.inner.lock().expect("balancer");
        if let Some(n) = inner.active.get_mut(&endpoint) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                inner.active.remove(&endpoint);
            }
        }
    }
}

/// A listener's view of its service port's balancer.
pub struct SideChooser {
    pub balancer: Arc<Balancer>,
    pub side: Side,
}

impl Chooser for SideChooser {
    fn choose(&self, client: SocketAddr, attempt: usize, failed: &[SocketAddr]) -> Option<SocketAddr> {
        self.balancer.choose(self.side, client, attempt, failed)
    }

    fn release(&self, endpoint: SocketAddr) {
        self.balancer.release(endpoint);
    }

    fn on_this_node(&self, endpoint: SocketAddr) -> bool {
        self.balancer.on_this_node(endpoint)
    }
}

/// The `turn`-th pick of a round robin by weight over `open` (endpoints
/// whose weight is more than 0): each round gives every endpoint its
/// weight over the weights' greatest common divisor, in order; equal
/// weights are plain round robin. None when nothing is open.
fn by_weight(open: &[(SocketAddr, u32)], turn: usize) -> Option<SocketAddr> {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    let divisor = open.iter().fold(0, |g, (_, w)| gcd(g, u64::from(*w)));
    if divisor == 0 {
        return None;
    }
    let round: u64 = open.iter().map(|(_, w)| u64::from(*w) / divisor).sum();
    let mut at = turn as u64 % round;
    for (endpoint, weight) in open {
        let share = u64::from(*weight) / divisor;
        if at < share {
            return Some(*endpoint);
        }
        at -= share;
    }
    None
}

#[cfg(test)]
mod tests {
    use kpx_rules::model::{Endpoint, Protocol};

    use super::*;
    use crate::runtime::{Limits, Runtime, builtin};

    fn picker() -> Arc<Picker> {
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        let plugin = runtime.load_scheduler("schedulers", builtin::get("schedulers").unwrap()).unwrap();
        Arc::new(Picker::new(vec![Arc::new(plugin)]))
    }

    fn port(endpoints: &[&str]) -> ServicePort {
        let eps = endpoints.iter().map(|ip| Endpoint::ready(ip.parse().unwrap(), 8080)).collect();
        let mut p = ServicePort::new("ns", "web", "http", Protocol::Tcp, 80).with_cluster_endpoints(eps);
        p.cluster_ip = Some("10.96.0.10".parse().unwrap());
        p
    }

    fn client(n: u8) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, n)), 40000)
    }

    fn ep(ip: &str) -> SocketAddr {
        SocketAddr::new(ip.parse().unwrap(), 8080)
    }

    #[test]
    fn round_robin_by_default_with_exact_counts() {
        let b = Balancer::new(&port(&["10.1.0.1", "10.1.0.2"]), picker());
        let picks: Vec<SocketAddr> = (0..4).map(|_| b.choose(Side::Internal, client(1), 0, &[]).unwrap()).collect();
        assert_eq!(picks, [ep("10.1.0.1"), ep("10.1.0.2"), ep("10.1.0.1"), ep("10.1.0.2")]);
        assert_eq!(b.active()[&ep("10.1.0.1")], 2);
        b.release(ep("10.1.0.1"));
        b.release(ep("10.1.0.1"));
        assert!(!b.active().contains_key(&ep("10.1.0.1")));
        // A failed endpoint is not offered again for that connection.
        let again = b.choose(Side::Internal, client(1), 1, &[ep("10.1.0.1")]).unwrap();
        assert_eq!(again, ep("10.1.0.2"));
    }

    #[test]
    fn least_connection_reads_the_live_counts() {
        let mut p = port(&["10.1.0.1", "10.1.0.2", "10.1.0.3"]);
        p.scheduler = Some(Arc::new(SchedulerChoice { name: "lc".into(), parameters: Vec::new() }));
        let b = Balancer::new(&p, picker());
        let first: Vec<SocketAddr> = (0..3).map(|_| b.choose(Side::Internal, client(1), 0, &[]).unwrap()).collect();
        let mut sorted = first.clone();
        sorted.sort();
        assert_eq!(sorted, [ep("10.1.0.1"), ep("10.1.0.2"), ep("10.1.0.3")], "one each: {first:?}");
        b.release(ep("10.1.0.2"));
        assert_eq!(b.choose(Side::Internal, client(1), 0, &[]).unwrap(), ep("10.1.0.2"), "the only idle one");
    }

    #[test]
    fn affinity_sticks_until_its_timeout_and_drops_gone_endpoints() {
        let mut p = port(&["10.1.0.1", "10.1.0.2"]);
        p.affinity_timeout_seconds = 3600;
        let b = Balancer::new(&p, picker());
        let first = b.choose(Side::Internal, client(1), 0, &[]).unwrap();
        for _ in 0..5 {
            assert_eq!(b.choose(Side::Internal, client(1), 0, &[]).unwrap(), first);
        }
        assert_ne!(b.choose(Side::Internal, client(2), 0, &[]).unwrap(), first, "another client, the next turn");
        // The endpoint goes: the client moves to the other one.
        let other = if first == ep("10.1.0.1") { "10.1.0.2" } else { "10.1.0.1" };
        b.update(&port(&[other]).tap_affinity(3600));
        assert_eq!(b.choose(Side::Internal, client(1), 0, &[]).unwrap(), ep(other));
    }

    #[test]
    fn local_external_policy_chooses_among_local_endpoints_only() {
        let mut local = Endpoint::ready("10.1.0.2".parse().unwrap(), 8080);
        local.conditions.is_local = true;
        let mut p = port(&["10.1.0.1"]);
        p.endpoints.push(local);
        p.cluster_endpoints = vec![0, 1];
        p.local_endpoints = vec![1];
        p.external_traffic_policy = TrafficPolicy::Local;
        let b = Balancer::new(&p, picker());
        for _ in 0..4 {
            assert_eq!(b.choose(Side::External, client(1), 0, &[]).unwrap(), ep("10.1.0.2"));
        }
        let internal: std::collections::BTreeSet<SocketAddr> =
            (0..4).map(|_| b.choose(Side::Internal, client(1), 0, &[]).unwrap()).collect();
        assert_eq!(internal.len(), 2);
    }

    #[test]
    fn endpoints_on_this_node_are_known_through_updates() {
        let mut p = port(&["10.1.0.1", "10.1.0.2"]);
        p.endpoints[1].conditions.is_local = true;
        let b = Balancer::new(&p, picker());
        assert!(!b.on_this_node(ep("10.1.0.1")));
        assert!(b.on_this_node(ep("10.1.0.2")));
        // Another port of the same address is another endpoint.
        assert!(!b.on_this_node(SocketAddr::new("10.1.0.2".parse().unwrap(), 8081)));
        p.endpoints[1].conditions.is_local = false;
        p.endpoints[0].conditions.is_local = true;
        b.update(&p);
        assert!(b.on_this_node(ep("10.1.0.1")));
        assert!(!b.on_this_node(ep("10.1.0.2")));
        // Known whichever side uses it, or none.
        p.cluster_endpoints = vec![1];
        b.update(&p);
        assert!(b.on_this_node(ep("10.1.0.1")));
    }

    #[test]
    fn an_unknown_scheduler_falls_back_to_round_robin() {
        let mut p = port(&["10.1.0.1", "10.1.0.2"]);
        p.scheduler = Some(Arc::new(SchedulerChoice { name: "nope".into(), parameters: Vec::new() }));
        let b = Balancer::new(&p, picker());
        let picks: std::collections::BTreeSet<SocketAddr> =
            (0..4).map(|_| b.choose(Side::Internal, client(1), 0, &[]).unwrap()).collect();
        assert_eq!(picks.len(), 2);
        assert!(b.choose(Side::Internal, client(1), 1, &[ep("10.1.0.1"), ep("10.1.0.2")]).is_none());
        let empty = Balancer::new(&port(&[]), picker());
        assert!(empty.choose(Side::Internal, client(1), 0, &[]).is_none());
        assert!(!empty.has_candidates(Side::Internal));
    }

    /// A Service whose scheduler fails is served as one that names none:
    /// by weight when its endpoints carry weights (3:1 here), exactly.
    #[test]
    fn a_failing_scheduler_falls_back_to_round_robin_by_weight() {
        let mut p = port(&["10.1.0.1", "10.1.0.2"]);
        p.endpoints[0].weight = 3;
        p.scheduler = Some(Arc::new(SchedulerChoice { name: "nope".into(), parameters: Vec::new() }));
        let b = Balancer::new(&p, picker());
        let picks: Vec<SocketAddr> = (0..8).map(|_| b.choose(Side::Internal, client(1), 0, &[]).unwrap()).collect();
        let first = picks.iter().filter(|e| **e == ep("10.1.0.1")).count();
        assert_eq!((first, picks.len() - first), (6, 2), "{picks:?}");
        // A failed endpoint is skipped; weight 0 takes nothing.
        assert_eq!(b.choose(Side::Internal, client(1), 1, &[ep("10.1.0.1")]), Some(ep("10.1.0.2")));
        p.endpoints[1].weight = 0;
        b.update(&p);
        assert!((0..4).all(|_| b.choose(Side::Internal, client(1), 0, &[]) == Some(ep("10.1.0.1"))));
    }

    #[test]
    fn round_robin_by_weight_gives_each_endpoint_its_share_in_order() {
        let (a, b, c) = (ep("10.1.0.1"), ep("10.1.0.2"), ep("10.1.0.3"));
        let round = |open: &[(SocketAddr, u32)], n: usize| (0..n).map(|t| by_weight(open, t)).collect::<Vec<_>>();
        assert_eq!(round(&[(a, 3), (b, 1)], 8), [a, a, a, b, a, a, a, b].map(Some));
        // Equal weights, whatever they are: plain round robin.
        assert_eq!(round(&[(a, 2), (b, 2), (c, 2)], 6), [a, b, c, a, b, c].map(Some));
        assert_eq!(round(&[(a, 4), (b, 2)], 3), [a, a, b].map(Some));
        assert_eq!(by_weight(&[], 5), None);
    }

    /// Another component exporting rr is asked only by Services that name
    /// rr; one that names nothing gets the built-in default.
    #[test]
    fn defaults_come_from_the_built_in_component_only() {
        use std::sync::atomic::Ordering::Relaxed;
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        let bytes = builtin::get("schedulers").unwrap();
        let external = Arc::new(runtime.load_scheduler("ext", bytes).unwrap());
        let built_in = Arc::new(runtime.load_scheduler(crate::runtime::BUILT_IN_SCHEDULERS, bytes).unwrap());
        let picker = Arc::new(Picker::new(vec![external.clone(), built_in.clone()]));
        let b = Balancer::new(&port(&["10.1.0.1", "10.1.0.2"]), picker.clone());
        b.choose(Side::Internal, client(1), 0, &[]).unwrap();
        assert_eq!((external.stats().instances.load(Relaxed), built_in.stats().instances.load(Relaxed)), (0, 1));
        let mut named = port(&["10.1.0.1", "10.1.0.2"]);
        named.scheduler = Some(Arc::new(SchedulerChoice { name: "rr".into(), parameters: Vec::new() }));
        let b = Balancer::new(&named, picker);
        b.choose(Side::Internal, client(1), 0, &[]).unwrap();
        assert_eq!(external.stats().instances.load(Relaxed), 1, "a Service that names rr gets the first component's");
    }

    trait TapAffinity {
        fn tap_affinity(self, seconds: u32) -> Self;
    }

    impl TapAffinity for ServicePort {
        fn tap_affinity(mut self, seconds: u32) -> Self {
            self.affinity_timeout_seconds = seconds;
            self
        }
    }
}
