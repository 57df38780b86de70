//! The objects, their resource versions and the change history that
//! watches replay: what etcd and the watch cache are to a real API server.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde_json::{Value, json};

/// A kind the server serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Resource {
    /// "" for the core group.
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
}

impl Resource {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.to_string() } else { format!("{}/{}", self.group, self.version) }
    }
}

pub const SERVICES: Resource =
    Resource { group: "", version: "v1", plural: "services", kind: "Service", namespaced: true };
pub const ENDPOINT_SLICES: Resource = Resource {
    group: "discovery.k8s.io",
    version: "v1",
    plural: "endpointslices",
    kind: "EndpointSlice",
    namespaced: true,
};
pub const NODES: Resource = Resource { group: "", version: "v1", plural: "nodes", kind: "Node", namespaced: false };
pub const SERVICE_CIDRS: Resource = Resource {
    group: "networking.k8s.io",
    version: "v1",
    plural: "servicecidrs",
    kind: "ServiceCIDR",
    namespaced: false,
};

/// The kinds kpx reads.
pub const RESOURCES: [Resource; 4] = [SERVICES, ENDPOINT_SLICES, NODES, SERVICE_CIDRS];

/// Store key: resource, namespace ("" when cluster-scoped), name.
pub type Key = (Resource, String, String);

/// One change: `old` is None for a creation, `new` None for a deletion.
#[derive(Debug, Clone)]
pub struct Change {
    pub rv: u64,
    pub resource: Resource,
    pub old: Option<Value>,
    pub new: Option<Value>,
}

/// An object the store refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub String);

#[derive(Debug)]
pub struct Store {
    pub rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Change>,
    /// Watches from a resource version below this get 410 Gone.
    pub oldest: u64,
    /// Changes kept for watches to replay (older ones are compacted).
    pub history_limit: usize,
    uids: u64,
    /// Remaining pages of paginated lists: token id -> (rv, items left).
    pages: HashMap<u64, (u64, Vec<Value>)>,
    next_page: u64,
}

impl Default for Store {
    fn default() -> Store {
        Store {
            rv: 1,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            oldest: 1,
            history_limit: 10_000,
            uids: 0,
            pages: HashMap::new(),
            next_page: 0,
        }
    }
}

fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object.get("metadata")?.get(field)?.as_str()
}

pub fn resource_version(object: &Value) -> u64 {
    meta_str(object, "resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0)
}

impl Store {
    /// The object's key, or why it cannot be stored.
    pub fn key(resource: Resource, object: &Value) -> Result<Key, Invalid> {
        let name = meta_str(object, "name").filter(|n| !n.is_empty());
        let name = name.ok_or_else(|| Invalid(format!("{} without metadata.name", resource.kind)))?;
        let ns = meta_str(object, "namespace").unwrap_or("");
        if resource.namespaced == ns.is_empty() {
            let what = if resource.namespaced { "needs" } else { "takes no" };
            return Err(Invalid(format!("{} {name} {what} metadata.namespace", resource.kind)));
        }
        Ok((resource, ns.to_string(), name.to_string()))
    }

    /// Creates or replaces an object; returns its new resource version.
    pub fn apply(&mut self, resource: Resource, mut object: Value) -> Result<u64, Invalid> {
        let key = Store::key(resource, &object)?;
        self.rv += 1;
        let old = self.objects.get(&key).cloned();
        let uid = match old.as_ref().and_then(|o| meta_str(o, "uid")) {
            Some(uid) => uid.to_string(),
            None => {
                self.uids += 1;
                format!("00000000-0000-4000-8000-{:012}", self.uids)
            }
        };
        let obj = object.as_object_mut().ok_or_else(|| Invalid("an object must be a JSON map".into()))?;
        obj.insert("apiVersion".into(), json!(resource.api_version()));
        obj.insert("kind".into(), json!(resource.kind));
        let meta = obj.entry("metadata").or_insert_with(|| json!({}));
        let meta = meta.as_object_mut().ok_or_else(|| Invalid("metadata must be a map".into()))?;
        meta.insert("resourceVersion".into(), json!(self.rv.to_string()));
        meta.insert("uid".into(), json!(uid));
        meta.entry("creationTimestamp").or_insert_with(|| json!("2026-01-01T00:00:00Z"));
        self.objects.insert(key, object.clone());
        self.record(Change { rv: self.rv, resource, old, new: Some(object) });
        Ok(self.rv)
    }

    /// Deletes an object; its resource version, or None if there was none.
    pub fn delete(&mut self, resource: Resource, namespace: &str, name: &str) -> Option<u64> {
        let mut old = self.objects.remove(&(resource, namespace.to_string(), name.to_string()))?;
        self.rv += 1;
        // A deleted object is reported with the deletion's resource version.
        if let Some(meta) = old.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), json!(self.rv.to_string()));
        }
        self.record(Change { rv: self.rv, resource, old: Some(old), new: None });
        Some(self.rv)
    }

    fn record(&mut self, change: Change) {
        self.history.push_back(change);
        while self.history.len() > self.history_limit {
            if let Some(c) = self.history.pop_front() {
                self.oldest = c.rv;
            }
        }
    }

    /// Forgets every change so far: a watch from any earlier resource
    /// version gets 410 Gone, as after an etcd compaction.
    pub fn compact(&mut self) {
        self.history.clear();
        self.oldest = self.rv;
        self.pages.clear();
    }

    pub fn get(&self, resource: Resource, namespace: &str, name: &str) -> Option<&Value> {
        self.objects.get(&(resource, namespace.to_string(), name.to_string()))
    }

    /// The objects of a resource (in one namespace if given), in key order.
    pub fn list(&self, resource: Resource, namespace: Option<&str>) -> impl Iterator<Item = &Value> {
        self.objects
            .iter()
            .filter(move |((r, ns, _), _)| *r == resource && namespace.is_none_or(|n| n == ns))
            .map(|(_, v)| v)
    }

    /// Changes after `rv`, or None when some of them were compacted.
    pub fn changes_after(&self, rv: u64) -> Option<impl Iterator<Item = &Change>> {
        if rv < self.oldest {
            return None;
        }
        Some(self.history.iter().filter(move |c| c.rv > rv))
    }

    /// Keeps the rest of a list for a continue token.
    pub fn keep_pages(&mut self, rest: Vec<Value>) -> String {
        self.next_page += 1;
        self.pages.insert(self.next_page, (self.rv, rest));
        if self.pages.len() > 64 {
            let oldest = *self.pages.keys().min().unwrap_or(&0);
            self.pages.remove(&oldest);
        }
        format!("{}:{}", self.rv, self.next_page)
    }

    /// The rest of a list by its continue token (None: expired).
    pub fn take_pages(&mut self, token: &str) -> Option<(u64, Vec<Value>)> {
        let id: u64 = token.split_once(':')?.1.parse().ok()?;
        self.pages.remove(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {}})
    }

    #[test]
    fn versions_history_and_compaction() {
        let mut s = Store::default();
        let a = s.apply(SERVICES, svc("a")).unwrap();
        let b = s.apply(SERVICES, svc("b")).unwrap();
        assert!(b > a);
        let gone = s.delete(SERVICES, "ns", "a").unwrap();
        assert!(gone > b);
        let after_a: Vec<u64> = s.changes_after(a).unwrap().map(|c| c.rv).collect();
        assert_eq!(after_a, vec![b, gone]);
        let deleted = s.changes_after(b).unwrap().next().unwrap();
        assert!(deleted.new.is_none());
        assert_eq!(resource_version(deleted.old.as_ref().unwrap()), gone);
        s.compact();
        assert!(s.changes_after(a).is_none());
        assert_eq!(s.changes_after(gone).unwrap().count(), 0);
        assert_eq!(s.list(SERVICES, None).count(), 1);
        assert_eq!(s.delete(SERVICES, "ns", "a"), None);
    }

    #[test]
    fn objects_are_checked_and_stamped() {
        let mut s = Store::default();
        assert!(s.apply(NODES, json!({"metadata": {"name": "n", "namespace": "x"}})).is_err());
        assert!(s.apply(SERVICES, json!({"metadata": {"name": "n"}})).is_err());
        assert!(s.apply(SERVICES, json!({"metadata": {}})).is_err());
        s.apply(NODES, json!({"metadata": {"name": "n"}})).unwrap();
        let n = s.get(NODES, "", "n").unwrap();
        assert_eq!(n["kind"], "Node");
        assert_eq!(n["apiVersion"], "v1");
        let uid = n["metadata"]["uid"].clone();
        s.apply(NODES, json!({"metadata": {"name": "n", "labels": {"a": "b"}}})).unwrap();
        assert_eq!(s.get(NODES, "", "n").unwrap()["metadata"]["uid"], uid, "a replaced object keeps its uid");
    }
}
