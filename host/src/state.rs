//! Services, EndpointSlices and this Node, merged into service ports with
//! endpoints as upstream's change trackers do: headless and ExternalName
//! Services skipped, the service-proxy-name label honoured, endpoints
//! de-duplicated by address:port, conditions read, locality by node name.
//! The state also remembers which Services changed since it was last asked.
//!
//! kpx's annotations are parsed when the state stores their object
//! ([`StoredSlice`], `services::StoredService`), once per change, and
//! what is wrong with them is logged then ([`annotations::report`]): a
//! pass over the state reads what was parsed, shares a Service's
//! scheduler (one `Arc`) among its ports, and logs nothing.

pub mod annotations;
mod endpoints;
mod services;
mod topology;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kpx_rules::model::{self, IpFamily, Protocol};

use crate::source::{Event, Kind, Object, ObjectRef};
use crate::wellknown::ZONE_LABEL;
pub use endpoints::StoredSlice;
use services::StoredService;
use smallvec::SmallVec;

/// `namespace/name` of a Service.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceName {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ServiceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Service ports by key, as a family's proxier sent them to its plugin.
/// Boxed: a port is about 416 bytes, and a B-tree filled in key order leaves
/// its nodes about half full (7.6 MB of nodes at 10k ports inline,
/// against about 4.9 MB boxed, in heaptrack profiles).
pub type PortMap = BTreeMap<String, Box<model::ServicePort>>;

/// A [`PortMap`] of copies of `ports`.
pub fn port_map(ports: &[model::ServicePort]) -> PortMap {
    ports.iter().map(|p| (p.key.clone(), Box::new(p.clone()))).collect()
}

/// The ports of a [`PortMap`], in key order.
pub fn ports_in(map: &PortMap) -> impl Iterator<Item = &model::ServicePort> {
    map.values().map(|p| &**p)
}

/// Each port's endpoints (address, port), by service port key, with the
/// port's protocol: upstream's EndpointsMap.
pub type EndpointsMap = BTreeMap<String, (Protocol, BTreeSet<(IpAddr, u16)>)>;

/// One Service's endpoints before a batch of changes, as upstream's
/// endpoints change tracker keeps them (the conntrack cleanup of removed
/// UDP endpoints reads the difference with the endpoints after the batch,
/// [`State::endpoints_map`] in the same sync pass). Empty for a Service
/// that had no endpoints before the batch (nothing of it can be stale),
/// which is every Service of the initial list. The endpoints after the
/// batch are not copied here (at the initial list that copy would be
/// every endpoint of every Service).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ServiceChange {
    /// When the first change of the batch arrived.
    pub previous: EndpointsMap,
}

/// What changed since the last [`State::take_changes`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    pub services: BTreeMap<ServiceName, ServiceChange>,
    pub node: bool,
    /// ServiceCIDRs changed.
    pub cluster: bool,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && !self.node && !self.cluster
    }

    /// Adds a later batch: each Service keeps its earliest `previous`.
    pub fn merge(&mut self, later: Changes) {
        for (name, change) in later.services {
            self.services.entry(name).or_insert(change);
        }
        self.node |= later.node;
        self.cluster |= later.cluster;
    }
}

/// One Service's EndpointSlices, in name order, each with its annotation
/// parsed. Nearly every Service has one, held inline: a B-tree per
/// Service was a node of eleven entries each (3.7 MB at 10k Services in
/// a heaptrack profile).
#[derive(Debug, Default)]
pub struct SliceSet(SmallVec<[(String, StoredSlice); 1]>);

impl SliceSet {
    fn insert(&mut self, name: String, slice: StoredSlice) {
        match self.0.binary_search_by(|(n, _)| n.as_str().cmp(&name)) {
            Ok(i) => self.0[i].1 = slice,
            Err(i) => self.0.insert(i, (name, slice)),
        }
    }

    fn remove(&mut self, name: &str) {
        if let Ok(i) = self.0.binary_search_by(|(n, _)| n.as_str().cmp(name)) {
            self.0.remove(i);
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The slices in name order.
    pub fn values(&self) -> impl Iterator<Item = &StoredSlice> {
        self.0.iter().map(|(_, s)| s)
    }
}

#[derive(Debug)]
pub struct State {
    node_name: String,
    /// Services this proxy handles (others are never stored), each with
    /// its annotations parsed.
    services: BTreeMap<ServiceName, StoredService>,
    /// EndpointSlices by owning Service, then by slice name.
    slices: BTreeMap<ServiceName, SliceSet>,
    /// Which Service each stored slice (namespace, name) belongs to.
    slice_owner: BTreeMap<(String, String), ServiceName>,
    node: Option<Arc<Node>>,
    /// ServiceCIDR objects by name.
    service_cidrs: BTreeMap<String, Vec<model::Cidr>>,
    changes: Changes,
    synced: bool,
    /// The `AllowServiceExternalIPs` feature gate: off, Services'
    /// externalIPs are left out of every service port.
    external_ips: bool,
    /// Lines logged about annotations: one per annotation with problems,
    /// per change of its object.
    annotation_warnings: usize,
}

impl State {
    pub fn new(node_name: impl Into<String>) -> State {
        State {
            node_name: node_name.into(),
            services: BTreeMap::new(),
            slices: BTreeMap::new(),
            slice_owner: BTreeMap::new(),
            node: None,
            service_cidrs: BTreeMap::new(),
            changes: Changes::default(),
            synced: false,
            external_ips: true,
            annotation_warnings: 0,
        }
    }

    /// Whether Services' `spec.externalIPs` are programmed (the
    /// `AllowServiceExternalIPs` feature gate; upstream's
    /// `ServicePort.ExternalIPs()` is empty when it is off, in every mode).
    pub fn allow_external_ips(mut self, allowed: bool) -> State {
        self.external_ips = allowed;
        self
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// True once the source has listed everything.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// How many lines about annotations' problems the state has logged:
    /// one per annotation with problems, each time its object changes
    /// (never at a pass).
    pub fn annotation_warnings(&self) -> usize {
        self.annotation_warnings
    }

    /// Applies one source event; true if it changed what a proxier sees.
    pub fn apply(&mut self, event: Event) -> bool {
        match event {
            Event::Synced => {
                let first = !self.synced;
                self.synced = true;
                first
            }
            Event::Apply(Object::Service(svc)) => {
                let name = service_name(&svc.metadata);
                if services::should_skip(&svc) {
                    return self.remove_service(&name);
                }
                self.touch(&name);
                // Its annotations are parsed here, once per change.
                let (stored, problems) = StoredService::new(svc);
                self.annotation_warnings += annotations::report(Kind::Service, &name, &problems);
                self.services.insert(name, stored);
                true
            }
            Event::Apply(Object::EndpointSlice(slice)) => {
                let ns = slice.meta.namespace.clone();
                let slice_name = slice.meta.name.clone();
                let mut changed = self.remove_slice(&ns, &slice_name);
                let owner = slice.meta.service_name.clone().unwrap_or_default();
                if owner.is_empty() || slice.meta.headless {
                    return changed;
                }
                let svc = ServiceName { namespace: ns.clone(), name: owner };
                self.touch(&svc);
                // Its annotation is parsed here, once per change.
                let (stored, problems) = StoredSlice::new(slice);
                self.annotation_warnings +=
                    annotations::report(Kind::EndpointSlice, &format_args!("{ns}/{slice_name}"), &problems);
                self.slice_owner.insert((ns, slice_name.clone()), svc.clone());
                self.slices.entry(svc.clone()).or_default().insert(slice_name, stored);
                changed = true;
                changed
            }
            Event::Apply(Object::Node(node)) => {
                if node.metadata.name.as_deref() != Some(self.node_name.as_str()) {
                    return false;
                }
                let old_labels = self.node.as_ref().and_then(|n| n.metadata.labels.clone());
                if old_labels != node.metadata.labels {
                    // Topology may change for every Service (upstream: a full sync).
                    let names: Vec<ServiceName> = self.services.keys().cloned().collect();
                    for name in &names {
                        self.touch(name);
                    }
                }
                self.node = Some(node);
                self.changes.node = true;
                true
            }
            Event::Apply(Object::ServiceCidr(cidr)) => {
                let name = cidr.metadata.name.clone().unwrap_or_default();
                let cidrs =
                    cidr.spec.iter().flat_map(|s| s.cidrs.iter().flatten()).filter_map(|c| c.parse().ok()).collect();
                self.service_cidrs.insert(name, cidrs);
                self.changes.cluster = true;
                true
            }
            Event::Delete(r) => self.delete(&r),
        }
    }

    fn delete(&mut self, r: &ObjectRef) -> bool {
        match r.kind {
            Kind::Service => {
                let name = ServiceName { namespace: r.namespace.clone(), name: r.name.clone() };
                self.remove_service(&name)
            }
            Kind::EndpointSlice => self.remove_slice(&r.namespace, &r.name),
            Kind::Node if r.name == self.node_name => {
                self.node = None;
                self.changes.node = true;
                true
            }
            Kind::Node => false,
            Kind::ServiceCidr => {
                let removed = self.service_cidrs.remove(&r.name).is_some();
                self.changes.cluster |= removed;
                removed
            }
        }
    }

    fn remove_service(&mut self, name: &ServiceName) -> bool {
        if self.services.contains_key(name) {
            self.touch(name);
            self.services.remove(name);
            return true;
        }
        false
    }

    /// Records that a Service is about to change, with its endpoints as
    /// they are before the first change of this batch.
    fn touch(&mut self, name: &ServiceName) {
        if !self.changes.services.contains_key(name) {
            // Before the initial list is complete nothing is programmed.
            let previous = if self.synced { self.endpoints_map(name) } else { EndpointsMap::new() };
            self.changes.services.insert(name.clone(), ServiceChange { previous });
        }
    }

    /// The endpoints of every port of a Service, both families.
    pub fn endpoints_map(&self, name: &ServiceName) -> EndpointsMap {
        let mut out = EndpointsMap::new();
        for family in [IpFamily::V4, IpFamily::V6] {
            for port in self.service_ports(family, name) {
                let entry = out.entry(port.key.clone()).or_insert_with(|| (port.protocol, BTreeSet::new()));
                entry.1.extend(port.endpoints.iter().map(|e| (e.ip, e.port)));
            }
        }
        out
    }

    fn remove_slice(&mut self, namespace: &str, slice_name: &str) -> bool {
        let Some(owner) = self.slice_owner.get(&(namespace.to_string(), slice_name.to_string())).cloned() else {
            return false;
        };
        self.touch(&owner);
        self.slice_owner.remove(&(namespace.to_string(), slice_name.to_string()));
        if let Some(slices) = self.slices.get_mut(&owner) {
            slices.remove(slice_name);
            if slices.is_empty() {
                self.slices.remove(&owner);
            }
        }
        true
    }

    /// What changed since the last call; resets the record.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// The service ports of one Service for one family (none if the Service
    /// is gone, skipped, or has no cluster IP of that family).
    pub fn service_ports(&self, family: IpFamily, name: &ServiceName) -> Vec<model::ServicePort> {
        let Some(svc) = self.services.get(name) else {
            return Vec::new();
        };
        let slices = self.slices.get(name);
        let zone = self.zone();
        services::service_ports(
            svc,
            family,
            self.external_ips,
            |port| endpoints::for_port(slices, family, port, &self.node_name),
            |svc_port, eps| topology::categorize(svc_port, eps, &self.node_name, &zone),
        )
    }

    /// This node's topology zone label ("" when unknown).
    fn zone(&self) -> String {
        let labels = self.node.as_ref().and_then(|n| n.metadata.labels.as_ref());
        labels.and_then(|l| l.get(ZONE_LABEL)).cloned().unwrap_or_default()
    }

    /// Names of every Service stored.
    pub fn service_names(&self) -> impl Iterator<Item = &ServiceName> {
        self.services.keys()
    }

    /// Cluster-wide facts for one family (ServiceCIDRs).
    pub fn cluster(&self, family: IpFamily) -> model::Cluster {
        let mut service_cidrs: Vec<model::Cidr> =
            self.service_cidrs.values().flatten().filter(|c| c.family() == family).copied().collect();
        service_cidrs.sort_by_key(|c| (c.addr, c.prefix_len));
        service_cidrs.dedup();
        model::Cluster { service_cidrs }
    }

    /// Service ports of a Service (any family) with endpoints but none
    /// this node may use under a Local policy: (internal, external), as
    /// upstream's `sync_proxy_rules_no_local_endpoints_total` counts them.
    pub fn no_local_endpoints(&self, name: &ServiceName, family: IpFamily) -> (usize, usize) {
        let (mut internal, mut external) = (0, 0);
        for port in self.service_ports(family, name) {
            let Some(v) = port.view(family) else { continue };
            if v.has_endpoints && v.local_endpoints.is_empty() {
                internal += usize::from(v.internal_local);
                external += usize::from(v.externally_accessible && v.external_local);
            }
        }
        (internal, external)
    }

    /// The Node object, once seen.
    pub fn node_object(&self) -> Option<&Node> {
        self.node.as_deref()
    }

    /// Each Service with `externalTrafficPolicy: Local` and a health-check
    /// node port: that port and its ready endpoints on this node (distinct
    /// addresses, as upstream's `LocalReadyEndpoints` counts them).
    pub fn health_checks(&self) -> BTreeMap<ServiceName, (u16, usize)> {
        let mut out = BTreeMap::new();
        for (name, svc) in &self.services {
            let Some(spec) = &svc.object.spec else { continue };
            let port = spec.health_check_node_port.unwrap_or(0);
            if spec.external_traffic_policy != model::TrafficPolicy::Local || !(1..=65535).contains(&port) {
                continue;
            }
            let mut local: BTreeSet<IpAddr> = BTreeSet::new();
            for slice in self.slices.get(name).into_iter().flat_map(|s| s.values()) {
                for ep in &slice.object.endpoints {
                    if ep.ready().unwrap_or(true) && ep.node_name() == Some(self.node_name.as_str()) {
                        local.extend(ep.address);
                    }
                }
            }
            out.insert(name.clone(), (port as u16, local.len()));
        }
        out
    }

    /// This node as one family sees it.
    pub fn node(&self, family: IpFamily) -> model::Node {
        services::node_model(self.node.as_deref(), &self.node_name, family)
    }
}

fn service_name(meta: &crate::source::service::ServiceMeta) -> ServiceName {
    ServiceName { namespace: meta.namespace.clone().unwrap_or_default(), name: meta.name.clone().unwrap_or_default() }
}

#[cfg(test)]
mod tests;
