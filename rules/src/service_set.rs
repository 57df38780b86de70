//! The service ports a generator holds, keyed as upstream keys them, and
//! which of them changed since the generator last rendered.

use std::collections::{BTreeMap, BTreeSet, btree_map};

use crate::model::ServicePort;

#[derive(Debug, Default)]
pub struct ServiceSet {
    ports: BTreeMap<String, ServicePort>,
    /// Keys upserted or removed since the last [`ServiceSet::take_changed`].
    changed: BTreeSet<String>,
}

impl ServiceSet {
    /// Replaces every port; the old keys and the new ones count as changed.
    pub fn replace(&mut self, services: Vec<ServicePort>) {
        self.changed.extend(std::mem::take(&mut self.ports).into_keys());
        self.ports = services.into_iter().map(|s| (s.key.clone(), s)).collect();
        self.changed.extend(self.ports.keys().cloned());
    }

    pub fn upsert(&mut self, svc: ServicePort) {
        self.changed.insert(svc.key.clone());
        self.ports.insert(svc.key.clone(), svc);
    }

    pub fn remove(&mut self, key: String) {
        self.ports.remove(&key);
        self.changed.insert(key);
    }

    /// Marks every port changed (node facts they all depend on moved).
    pub fn mark_all_changed(&mut self) {
        self.changed.extend(self.ports.keys().cloned());
    }

    /// The keys changed since the last call, ports since removed included.
    pub fn take_changed(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.changed)
    }

    pub fn get(&self, key: &str) -> Option<&ServicePort> {
        self.ports.get(key)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.ports.contains_key(key)
    }

    /// Ports in key order.
    pub fn iter(&self) -> btree_map::Iter<'_, String, ServicePort> {
        self.ports.iter()
    }

    pub fn values(&self) -> btree_map::Values<'_, String, ServicePort> {
        self.ports.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    fn port(name: &str) -> ServicePort {
        ServicePort::new("ns", name, "", Protocol::Tcp, 80)
    }

    #[test]
    fn replace_counts_old_and_new_keys_as_changed() {
        let mut set = ServiceSet::default();
        set.replace(vec![port("a"), port("b")]);
        assert_eq!(set.take_changed().into_iter().collect::<Vec<_>>(), ["ns/a", "ns/b"]);
        set.replace(vec![port("c")]);
        assert_eq!(set.take_changed().into_iter().collect::<Vec<_>>(), ["ns/a", "ns/b", "ns/c"]);
        assert!(set.take_changed().is_empty());
        assert_eq!(set.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["ns/c"]);
    }

    #[test]
    fn a_removed_key_stays_changed_until_taken() {
        let mut set = ServiceSet::default();
        set.upsert(port("a"));
        set.take_changed();
        set.remove("ns/a".into());
        assert!(!set.contains("ns/a"));
        assert_eq!(set.take_changed().into_iter().collect::<Vec<_>>(), ["ns/a"]);
    }
}
