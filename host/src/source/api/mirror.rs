//! One kind's objects as last reported, so that a relist becomes the
//! difference: applies for what changed, deletes for what vanished, and
//! nothing for the rest.

use std::collections::{HashMap, HashSet};

use kube::runtime::watcher::Event as WatchEvent;

use crate::source::{Event, Kind, Object, ObjectRef};

#[derive(Debug)]
pub struct Mirror {
    kind: Kind,
    /// Reported objects and their resource versions.
    reported: HashMap<ObjectRef, String>,
    /// During a relist: what it has listed so far.
    relisting: Option<HashSet<ObjectRef>>,
    /// A first list has completed.
    listed: bool,
}

fn resource_version(o: &Object) -> String {
    let meta = match o {
        Object::Service(o) => &o.metadata,
        Object::EndpointSlice(o) => &o.metadata,
        Object::Node(o) => &o.metadata,
        Object::ServiceCidr(o) => &o.metadata,
    };
    meta.resource_version.clone().unwrap_or_default()
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

    fn apply(&mut self, o: Object) -> Option<Event> {
        let key = o.object_ref();
        let rv = resource_version(&o);
        // An unchanged version is the same object: a relist re-reads it.
        if !rv.is_empty() && self.reported.get(&key) == Some(&rv) {
            return None;
        }
        self.reported.insert(key, rv);
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
            WatchEvent::Delete(o) => {
                let key = o.object_ref();
                match self.reported.remove(&key) {
                    Some(_) => vec![Event::Delete(key)],
                    None => Vec::new(),
                }
            }
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

    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn svc(name: &str, rv: &str) -> Object {
        Object::Service(Arc::new(Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        }))
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
    fn a_kind_not_served_counts_as_listed_and_empty() {
        let mut m = Mirror::new(Kind::ServiceCidr);
        assert!(m.not_served().is_empty());
        assert!(m.listed());
    }
}
