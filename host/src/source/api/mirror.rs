//! One kind's objects as last reported, so that a relist becomes the
//! difference: applies for what changed, deletes for what vanished, and
//! nothing for the rest. "Changed" compares content, not resource
//! versions (an etcd restore reuses them), and after stripping: a Node's
//! status heartbeat, dropped on arrival, changes nothing.

use std::collections::{HashMap, HashSet};

use kube::runtime::watcher::Event as WatchEvent;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::source::{Event, Kind, Object, ObjectRef};

#[derive(Debug)]
pub struct Mirror {
    kind: Kind,
    /// Reported objects (shared with the state).
    reported: HashMap<ObjectRef, Object>,
    /// During a relist: what it has listed so far.
    relisting: Option<HashSet<ObjectRef>>,
    /// A first list has completed.
    listed: bool,
}

/// The metadata a stripped object keeps, resource version aside.
fn same_meta(a: &ObjectMeta, b: &ObjectMeta) -> bool {
    a.name == b.name
        && a.namespace == b.namespace
        && a.labels == b.labels
        && a.annotations == b.annotations
        && a.deletion_timestamp == b.deletion_timestamp
}

/// Equal content, whatever the resource versions.
fn same(a: &Object, b: &Object) -> bool {
    match (a, b) {
        (Object::Service(a), Object::Service(b)) => {
            let (m, n) = (&a.metadata, &b.metadata);
            m.name == n.name
                && m.namespace == n.namespace
                && m.other_proxy == n.other_proxy
                && m.annotations == n.annotations
                && a.spec == b.spec
                && a.ingress == b.ingress
        }
        (Object::EndpointSlice(a), Object::EndpointSlice(b)) => {
            a.meta.name == b.meta.name
                && a.meta.namespace == b.meta.namespace
                && a.meta.service_name == b.meta.service_name
                && a.meta.headless == b.meta.headless
                && a.meta.annotations == b.meta.annotations
                && a.address_type == b.address_type
                && a.endpoints == b.endpoints
                && a.ports == b.ports
        }
        (Object::Node(a), Object::Node(b)) => {
            same_meta(&a.metadata, &b.metadata) && a.spec == b.spec && a.status == b.status
        }
        (Object::ServiceCidr(a), Object::ServiceCidr(b)) => {
            same_meta(&a.metadata, &b.metadata) && a.spec == b.spec && a.status == b.status
        }
        _ => false,
    }
}

impl Mirror {
    pub fn new(kind: Kind) -> Mirror {
        Mirror { kind, reported: HashMap::new(), relisting: None, listed: false }
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Its first list has completed (or the server does not serve the kind).
    pub fn listed(&self) -> bool {
        self.listed
    }

    /// Whether any object of the kind is held.
    pub fn holds_any(&self) -> bool {
        !self.reported.is_empty()
    }

    fn apply(&mut self, o: Object) -> Option<Event> {
        let key = o.object_ref();
        if self.reported.get(&key).is_some_and(|old| same(old, &o)) {
            return None;
        }
        self.reported.insert(key, o.clone());
        Some(Event::Apply(o))
    }

    /// What one watch event changes.
    pub fn on(&mut self, event: WatchEvent<Object>) -> Vec<Event> {
        match event {
            WatchEvent::Init => {
                self.relisting = Some(HashSet::new());
                Vec::new()
            }
            WatchEvent::InitApply(o) => {
                if let Some(seen) = &mut self.relisting {
                    seen.insert(o.object_ref());
                }
                self.apply(o).into_iter().collect()
            }
            WatchEvent::InitDone => {
                self.listed = true;
                let Some(seen) = self.relisting.take() else { return Vec::new() };
                let mut gone: Vec<ObjectRef> = self.reported.keys().filter(|k| !seen.contains(k)).cloned().collect();
                gone.sort();
                for k in &gone {
                    self.reported.remove(k);
                }
                gone.into_iter().map(Event::Delete).collect()
            }
            WatchEvent::Apply(o) => self.apply(o).into_iter().collect(),
            WatchEvent::Delete(o) => self.delete(o.object_ref()),
        }
    }

    /// An object is gone: deleted, if it was reported.
    pub fn delete(&mut self, key: ObjectRef) -> Vec<Event> {
        match self.reported.remove(&key) {
            Some(_) => vec![Event::Delete(key)],
            None => Vec::new(),
        }
    }

    /// An object listed that could not be read: the relist under way
    /// counts it as listed, so that the version last reported stays
    /// (as a manifest's last good version does).
    pub fn keep(&mut self, key: ObjectRef) {
        if let Some(seen) = &mut self.relisting {
            seen.insert(key);
        }
    }

    /// The server does not serve the kind: it has no objects.
    pub fn not_served(&mut self) -> Vec<Event> {
        self.on(WatchEvent::Init);
        self.on(WatchEvent::InitDone)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    /// A Service whose content is its port (a resource version per write).
    fn svc(name: &str, rv: &str) -> Object {
        svc_port(name, rv, rv.parse().unwrap())
    }

    fn svc_port(name: &str, rv: &str, port: i32) -> Object {
        Object::Service(Arc::new(crate::source::Service::from(Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(vec![ServicePort { port, ..Default::default() }]),
                ..Default::default()
            }),
            ..Default::default()
        })))
    }

    fn resource_version(o: &Object) -> String {
        match o {
            Object::Service(s) => s.metadata.resource_version.clone().unwrap_or_default(),
            _ => String::new(),
        }
    }

    fn names(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                Event::Apply(o) => format!("apply {} {}", o.object_ref().name, resource_version(o)),
                Event::Delete(r) => format!("delete {}", r.name),
                Event::Synced => "synced".into(),
            })
            .collect()
    }

    fn list(m: &mut Mirror, objects: Vec<Object>) -> Vec<String> {
        let mut out = m.on(WatchEvent::Init);
        for o in objects {
            out.extend(m.on(WatchEvent::InitApply(o)));
        }
        out.extend(m.on(WatchEvent::InitDone));
        names(&out)
    }

    #[test]
    fn a_relist_reports_only_the_difference() {
        let mut m = Mirror::new(Kind::Service);
        assert!(!m.listed());
        assert_eq!(
            list(&mut m, vec![svc("a", "1"), svc("b", "2"), svc("c", "3")]),
            ["apply a 1", "apply b 2", "apply c 3"]
        );
        assert!(m.listed());
        // b changed and c vanished while the watch was down; a is as it was.
        assert_eq!(list(&mut m, vec![svc("a", "1"), svc("b", "7")]), ["apply b 7", "delete c"]);
        // Nothing changed: nothing is reported.
        assert_eq!(list(&mut m, vec![svc("a", "1"), svc("b", "7")]), Vec::<String>::new());
        // An empty relist deletes only what was reported.
        assert_eq!(list(&mut m, vec![]), ["delete a", "delete b"]);
    }

    #[test]
    fn watch_events_pass_through_once() {
        let mut m = Mirror::new(Kind::Service);
        list(&mut m, vec![]);
        assert_eq!(names(&m.on(WatchEvent::Apply(svc("a", "4")))), ["apply a 4"]);
        assert_eq!(names(&m.on(WatchEvent::Apply(svc("a", "4")))), Vec::<String>::new());
        assert_eq!(names(&m.on(WatchEvent::Apply(svc("a", "5")))), ["apply a 5"]);
        assert_eq!(names(&m.on(WatchEvent::Delete(svc("a", "6")))), ["delete a"]);
        assert_eq!(names(&m.on(WatchEvent::Delete(svc("a", "6")))), Vec::<String>::new());
    }

    #[test]
    fn content_decides_not_the_resource_version() {
        let mut m = Mirror::new(Kind::Service);
        list(&mut m, vec![svc_port("a", "10", 80)]);
        // A new version with the same content (a field kpx drops changed): nothing.
        assert_eq!(names(&m.on(WatchEvent::Apply(svc_port("a", "11", 80)))), Vec::<String>::new());
        // The same version with other content (etcd restored to an older
        // revision, then written again): applied.
        assert_eq!(names(&m.on(WatchEvent::Apply(svc_port("a", "11", 81)))), ["apply a 11"]);
        assert_eq!(list(&mut m, vec![svc_port("a", "11", 82)]), ["apply a 11"]);
    }

    /// An object kept (listed, but unreadable) stays through the relist;
    /// outside a relist keeping changes nothing, and a delete deletes once.
    #[test]
    fn a_kept_object_stays_through_a_relist() {
        let mut m = Mirror::new(Kind::Service);
        list(&mut m, vec![svc("a", "1"), svc("b", "2")]);
        let mut out = m.on(WatchEvent::Init);
        out.extend(m.on(WatchEvent::InitApply(svc("a", "1"))));
        m.keep(svc("b", "3").object_ref());
        out.extend(m.on(WatchEvent::InitDone));
        assert_eq!(names(&out), Vec::<String>::new());
        m.keep(svc("c", "4").object_ref());
        assert_eq!(list(&mut m, vec![svc("a", "1"), svc("b", "2")]), Vec::<String>::new());
        assert_eq!(names(&m.delete(svc("b", "5").object_ref())), ["delete b"]);
        assert_eq!(names(&m.delete(svc("b", "5").object_ref())), Vec::<String>::new());
    }

    #[test]
    fn a_kind_not_served_counts_as_listed_and_empty() {
        let mut m = Mirror::new(Kind::ServiceCidr);
        assert!(m.not_served().is_empty());
        assert!(m.listed());
    }
}
