//! A harness for a plugin's own unit tests, run natively with `cargo test`
//! (no WebAssembly, no kpx): states built in a line, a scheduler asked as
//! the host asks it, its answers checked as the host checks them, and a
//! backend driven through reset, apply and render.
//!
//! This is the quick loop. `kpx conformance FILE.wasm` is the full one: the
//! built component, in kpx's sandbox, under the host's checks of every rule,
//! with the conformance flows (see docs/plugins.md).
//!
//! ```
//! use kpx_sdk::testing;
//! use kpx_sdk::{Plan, ProxyMode};
//!
//! let port = testing::service_port("shop/web:http", &[("10.244.1.5", 1), ("10.244.2.5", 3)]);
//! assert_eq!(port.endpoints.len(), 2);
//! let request = testing::request("wrr", ProxyMode::Nftables, &port);
//! assert_eq!(request.candidates, [0, 1]);
//! testing::check_plan(&Plan::Weighted(vec![1, 3]), 2, ProxyMode::Nftables).unwrap();
//! assert!(testing::check_plan(&Plan::Sequence(vec![0, 2]), 2, ProxyMode::Nftables).is_err());
//! ```

use std::net::IpAddr;

use crate::scheduler::{PickRequest, Request, Scheduler};
use crate::{Backend, Change, Cluster, Endpoint, Node, Plan, Protocol, ProxyMode, ServicePort, Settings, ops};

/// A TCP service port `ns/name:port` (port 80, cluster IP 10.96.0.10)
/// whose endpoints are `(address, weight)` on 8080, all ready and all
/// candidates for cluster traffic.
pub fn service_port(key: &str, endpoints: &[(&str, u16)]) -> ServicePort {
    let (namespace, rest) = key.split_once('/').unwrap_or(("default", key));
    let (name, port_name) = rest.split_once(':').unwrap_or((rest, ""));
    let mut port = ServicePort::new(namespace, name, port_name, Protocol::Tcp, 80);
    let v6 = endpoints.first().is_some_and(|(ip, _)| ip.contains(':'));
    port.cluster_ip = Some(if v6 { "fd00:96::10" } else { "10.96.0.10" }.parse().expect("an address"));
    let eps =
        endpoints.iter().map(|(ip, weight)| Endpoint { weight: *weight, ..Endpoint::ready(parse(ip), 8080) }).collect();
    port.with_cluster_endpoints(eps)
}

fn parse(ip: &str) -> IpAddr {
    ip.parse().unwrap_or_else(|_| panic!("{ip:?} is not an IP address"))
}

/// The host's `schedule` request for every cluster candidate of `port`.
pub fn request(name: &str, mode: ProxyMode, port: &ServicePort) -> Request {
    Request {
        name: name.to_string(),
        parameters: Vec::new(),
        mode,
        port: port.clone(),
        candidates: port.cluster_endpoints.clone(),
        load: None,
    }
}

/// The host's per-connection request (userspace mode) for `port`'s
/// endpoints, from `client`, nothing open and nothing failed yet
/// (`inactive` is all 0, as the host's always is).
pub fn pick_request(name: &str, port: &ServicePort, client: &str) -> PickRequest {
    let n = port.endpoints.len();
    PickRequest {
        name: name.to_string(),
        parameters: Vec::new(),
        service: port.key.clone(),
        client: parse(client),
        destination: port.cluster_ip.expect("a cluster IP"),
        endpoints: port.endpoints.iter().map(|e| (e.ip, e.port)).collect(),
        weights: port.endpoints.iter().map(|e| u32::from(e.weight)).collect(),
        active: vec![0; n],
        inactive: vec![0; n],
        failed: Vec::new(),
        random: 0,
    }
}

/// The host's check of a plan over `n` candidates in `mode`: what kpx
/// refuses (the Service then keeps the mode's default).
pub fn check_plan(plan: &Plan, n: usize, mode: ProxyMode) -> Result<(), String> {
    plan.check(n)?;
    if !plan.runs_in(mode) {
        return Err(format!("{mode} mode cannot execute {plan:?}"));
    }
    Ok(())
}

/// Places `connections` connections from distinct clients with `S`'s
/// per-connection picks, each held open: how many each endpoint of `port`
/// took. Fails on a pick the host would refuse.
pub fn spread<S: Scheduler>(name: &str, port: &ServicePort, connections: usize) -> Result<Vec<usize>, String> {
    let mut request = pick_request(name, port, "198.18.0.1");
    let mut counts = vec![0; port.endpoints.len()];
    for i in 0..connections {
        request.client = IpAddr::from([198, 18, (i >> 8) as u8, i as u8]);
        request.random = (i as u32).wrapping_mul(2_654_435_761);
        let k = S::pick(request.clone())?.ok_or("no endpoint picked while every one may take it")? as usize;
        if k >= counts.len() || request.weights[k] == 0 {
            return Err(format!("picked {k}, which the host refuses"));
        }
        counts[k] += 1;
        request.active[k] += 1;
    }
    Ok(counts)
}

/// A backend driven natively as the host drives its instance.
pub struct BackendHarness<B: Backend> {
    pub backend: B,
}

impl<B: Backend> BackendHarness<B> {
    /// A backend for `mode` and IPv4 with kube-proxy's default settings.
    pub fn new(mode: ProxyMode) -> BackendHarness<B> {
        BackendHarness { backend: B::new(Settings::new(crate::IpFamily::V4, mode)) }
    }

    /// Replaces the state with `ports` (and a node without addresses) and
    /// renders it in full.
    pub fn reset(&mut self, ports: Vec<ServicePort>) -> Result<ops::Ruleset, String> {
        self.backend.reset(Node::default(), Cluster::default(), ports);
        self.backend.render(true)
    }

    /// Sends changes and renders what they changed.
    pub fn apply(&mut self, changes: Vec<Change>) -> Result<ops::Ruleset, String> {
        self.backend.apply(changes);
        self.backend.render(false)
    }
}
