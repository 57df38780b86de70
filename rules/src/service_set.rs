//! The service ports a generator holds, keyed as upstream keys them, and
//! which of them changed since the generator last rendered.

use std::collections::{BTreeMap, BTreeSet, btree_map};

use crate::model::ServicePort;

#[derive(Debug, Default)]
pub struct ServiceSet {
    ports: BTreeMap<String, ServicePort>,
    /// Keys upserted or removed since the last [`ServiceSet::take_changed`]
    /// or [`ServiceSet::clear_changed`].
    changed: BTreeSet<String>,
    /// Every key of `ports` counts as changed too (after a reset, or
    /// [`ServiceSet::mark_all_changed`]), without a copy of each key until
    /// [`ServiceSet::take_changed`] needs them: a full render after a reset
    /// only clears them (at 10k ports, copying and ordering the keys was
    /// a tenth of a WebAssembly generator's reset).
    all_changed: bool,
}

impl ServiceSet {
    /// Replaces every port; the old keys and the new ones count as changed.
    pub fn replace(&mut self, services: Vec<ServicePort>) {
        let new = services.into_iter().map(|s| (s.key.clone(), s)).collect();
        let old = std::mem::replace(&mut self.ports, new);
        // The new keys count through `all_changed`; the removed ones are listed.
        self.changed.extend(old.into_keys().filter(|k| !self.ports.contains_key(k)));
        self.all_changed = true;
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
        self.all_changed = true;
    }

    /// The keys changed since the last call, ports since removed included.
    pub fn take_changed(&mut self) -> BTreeSet<String> {
        let mut changed = std::mem::take(&mut self.changed);
        if std::mem::take(&mut self.all_changed) {
            changed.extend(self.ports.keys().cloned());
        }
        changed
    }

    /// Forgets what changed (a full render, which rewrites everything).
    pub fn clear_changed(&mut self) {
        self.changed.clear();
        self.all_changed = false;
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
    fn replaces_before_a_take_keep_every_key_old_and_new() {
        let mut set = ServiceSet::default();
        set.replace(vec![port("a"), port("b")]);
        set.replace(vec![port("b"), port("c")]);
        set.upsert(port("d"));
        set.remove("ns/c".into());
        assert_eq!(set.take_changed().into_iter().collect::<Vec<_>>(), ["ns/a", "ns/b", "ns/c", "ns/d"]);
        set.mark_all_changed();
        assert_eq!(set.take_changed().into_iter().collect::<Vec<_>>(), ["ns/b", "ns/d"]);
        // A full render forgets them all, the listed and the implied.
        set.replace(vec![port("e")]);
        set.clear_changed();
        assert!(set.take_changed().is_empty());
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
