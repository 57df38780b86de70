//! Which services contribute each element of the table, the state a
//! partial render works from.
//!
//! Every (set, key) is held once, in a slot of `entries`; the hash index
//! holds only slot numbers, and a service remembers the slots it
//! contributes to rather than a copy of its elements. Contributors are
//! sorted by service key and the first one's data is what the kernel
//! holds; the first is kept inline, since most elements have exactly one.
//! At 10k Services x 10 endpoints (about 270k elements) this is what most
//! of the plugin's linear memory holds after a full render, so its size
//! per element is the figure to watch.

use std::hash::{BuildHasher, Hash, Hasher};

use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

use super::elements::{Elem, ElemData, Set, Text, Words};

/// One contributor: a service key and the data it wants for the element.
type Contributor = (Text, Option<ElemData>);

/// A key as an entry holds it: inline up to six words (every IPv4 key,
/// IPv6 service keys), boxed past that (IPv6 firewall keys). An inline
/// twelve-word key was half of an entry (52 of 108 bytes in WebAssembly).
#[derive(Debug)]
enum Key {
    Short(Words<6>),
    Long(Box<Words>),
}

impl Key {
    fn new(key: &Words) -> Key {
        let words = key.as_slice();
        if words.len() <= 6 { Key::Short(Words::from_slice(words)) } else { Key::Long(Box::new(*key)) }
    }

    fn as_slice(&self) -> &[u32] {
        match self {
            Key::Short(k) => k.as_slice(),
            Key::Long(k) => k.as_slice(),
        }
    }

    fn words(&self) -> Words {
        match self {
            Key::Short(k) => Words::from_slice(k.as_slice()),
            Key::Long(k) => **k,
        }
    }
}

#[derive(Debug)]
struct Entry {
    set: Set,
    key: Key,
    /// The contributor whose data the kernel holds (the smallest key).
    first: Contributor,
    /// The others, sorted by service key.
    rest: Vec<Contributor>,
}

/// Slots per chunk of `Slots`.
const CHUNK: usize = 4096;

/// Slot → its element (None for a free slot), in fixed-size chunks: the
/// storage grows a chunk at a time, with no reallocation that would hold
/// the old and the new copy at once (at 270k elements a doubling vector
/// would reserve 524k slots and copy them on the way).
#[derive(Debug, Default)]
struct Slots {
    chunks: Vec<Vec<Option<Entry>>>,
    len: usize,
}

impl Slots {
    fn get(&self, slot: u32) -> Option<&Entry> {
        let slot = slot as usize;
        self.chunks.get(slot / CHUNK)?.get(slot % CHUNK)?.as_ref()
    }

    fn get_mut(&mut self, slot: u32) -> Option<&mut Option<Entry>> {
        let slot = slot as usize;
        self.chunks.get_mut(slot / CHUNK)?.get_mut(slot % CHUNK)
    }

    fn push(&mut self, entry: Entry) -> u32 {
        let slot = u32::try_from(self.len).expect("fewer than 2^32 elements");
        if self.len.is_multiple_of(CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        self.chunks.last_mut().expect("a chunk with room").push(Some(entry));
        self.len += 1;
        slot
    }

    fn clear(&mut self) {
        self.chunks.clear();
        self.len = 0;
    }
}

/// (set, key) → the services contributing it. Slots are reused once
/// their last contributor withdraws.
#[derive(Debug, Default)]
pub struct Registry {
    entries: Slots,
    free: Vec<u32>,
    index: HashTable<u32>,
}

fn hash_of(set: &Set, key: &[u32]) -> u64 {
    let mut h = FxBuildHasher.build_hasher();
    set.hash(&mut h);
    key.hash(&mut h);
    h.finish()
}

impl Registry {
    pub fn clear(&mut self) {
        self.entries.clear();
        self.free.clear();
        self.index.clear();
    }

    /// Room in the index for `n` elements in all without growing.
    pub fn reserve(&mut self, n: usize) {
        let entries = &self.entries;
        self.index.reserve(n, |&slot| Self::hash_slot(entries, slot));
    }

    /// How many elements are held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.index.len()
    }

    fn hash_slot(entries: &Slots, slot: u32) -> u64 {
        match entries.get(slot) {
            Some(e) => hash_of(&e.set, e.key.as_slice()),
            // The index holds only occupied slots.
            None => 0,
        }
    }

    /// The slot holding (set, key), whose hash is `hash`.
    fn find(&self, hash: u64, set: &Set, key: &Words) -> Option<u32> {
        let entries = &self.entries;
        self.index
            .find(hash, |&slot| entries.get(slot).is_some_and(|e| e.key.as_slice() == key.as_slice() && e.set == *set))
            .copied()
    }

    /// Records `service` as a contributor of `e` (replacing its data if it
    /// already is one). Returns the element's slot, and whether `service`
    /// is now the first contributor (the one whose element the kernel holds).
    pub fn contribute(&mut self, e: &Elem, service: &Text) -> (u32, bool) {
        let hash = hash_of(&e.set, e.key.as_slice());
        let Some(slot) = self.find(hash, &e.set, &e.key) else {
            let entry = Entry {
                set: e.set.clone(),
                key: Key::new(&e.key),
                first: (service.clone(), e.data.clone()),
                rest: Vec::new(),
            };
            let slot = match self.free.pop() {
                Some(slot) => {
                    *self.entries.get_mut(slot).expect("a freed slot exists") = Some(entry);
                    slot
                }
                None => self.entries.push(entry),
            };
            let entries = &self.entries;
            self.index.insert_unique(hash, slot, |&s| Self::hash_slot(entries, s));
            return (slot, true);
        };
        let entry = self.entries.get_mut(slot).and_then(Option::as_mut).expect("indexed slots are occupied");
        let first = match entry.first.0.as_ref().cmp(service.as_ref()) {
            std::cmp::Ordering::Equal => {
                entry.first.1 = e.data.clone();
                true
            }
            std::cmp::Ordering::Greater => {
                let old = std::mem::replace(&mut entry.first, (service.clone(), e.data.clone()));
                entry.rest.insert(0, old);
                true
            }
            std::cmp::Ordering::Less => {
                match entry.rest.binary_search_by(|(k, _)| k.as_ref().cmp(service.as_ref())) {
                    Ok(i) => entry.rest[i].1 = e.data.clone(),
                    Err(i) => entry.rest.insert(i, (service.clone(), e.data.clone())),
                }
                false
            }
        };
        (slot, first)
    }

    /// Removes `service` from the contributors of the element in `slot`
    /// (nothing if it is not one); the slot is freed with its last one.
    pub fn withdraw(&mut self, slot: u32, service: &Text) {
        let Some(place) = self.entries.get_mut(slot) else {
            return;
        };
        let Some(entry) = place else {
            return;
        };
        if entry.first.0 == *service {
            if entry.rest.is_empty() {
                let hash = hash_of(&entry.set, entry.key.as_slice());
                if let Ok(found) = self.index.find_entry(hash, |&s| s == slot) {
                    found.remove();
                }
                *place = None;
                self.free.push(slot);
            } else {
                entry.first = entry.rest.remove(0);
            }
        } else {
            entry.rest.retain(|(k, _)| k != service);
        }
    }

    /// The element in `slot`, if the slot is occupied.
    pub fn element(&self, slot: u32) -> Option<(&Set, Words)> {
        self.entries.get(slot).map(|e| (&e.set, e.key.words()))
    }

    /// The data in the kernel for (set, key): None if absent.
    pub fn effective(&self, set: &Set, key: &Words) -> Option<Option<ElemData>> {
        let slot = self.find(hash_of(set, key.as_slice()), set, key)?;
        self.entries.get(slot).map(|e| e.first.1.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::nftables::{HostSet, VerdictKind};
    use std::sync::Arc;

    fn elem(port: u32, verdict: VerdictKind) -> Elem {
        Elem {
            set: Set::Host(HostSet::ServiceIps),
            key: Words::new().push(0x0a00_0001).push(6).push(port),
            data: Some(ElemData::Verdict(verdict, None)),
        }
    }

    #[test]
    fn the_first_contributor_by_key_is_effective_and_the_next_one_takes_over() {
        let mut r = Registry::default();
        let (a, b): (Text, Text) = (Arc::from("ns/a"), Arc::from("ns/b"));
        let e = elem(80, VerdictKind::Drop);
        let (slot, first) = r.contribute(&e, &b);
        assert!(first);
        // "ns/a" sorts first: it takes over, with its own data.
        let (same, first) = r.contribute(&elem(80, VerdictKind::Accept), &a);
        assert_eq!((same, first), (slot, true));
        assert_eq!(r.effective(&e.set, &e.key), Some(Some(ElemData::Verdict(VerdictKind::Accept, None))));
        // "ns/b" again: not first, its data replaced, still one element.
        assert_eq!(r.contribute(&elem(80, VerdictKind::Reject), &b), (slot, false));
        assert_eq!(r.len(), 1);
        r.withdraw(slot, &a);
        assert_eq!(r.effective(&e.set, &e.key), Some(Some(ElemData::Verdict(VerdictKind::Reject, None))));
        // Withdrawing a non-contributor changes nothing.
        r.withdraw(slot, &a);
        assert_eq!(r.len(), 1);
        r.withdraw(slot, &b);
        assert_eq!(r.effective(&e.set, &e.key), None);
        assert_eq!(r.len(), 0);
        assert_eq!(r.element(slot), None);
        // A freed slot is reused, and withdrawing from it by a stale
        // contributor is a no-op.
        let (again, first) = r.contribute(&elem(443, VerdictKind::Drop), &b);
        assert_eq!((again, first), (slot, true));
        r.withdraw(slot, &a);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn long_and_short_keys_are_told_apart() {
        let mut r = Registry::default();
        let s: Text = Arc::from("ns/s");
        let set = Set::Host(HostSet::ServiceIps);
        let key = |n: u32| (0..n).fold(Words::new(), |k, w| k.push(w + 1));
        // Keys of 1 to 12 words, each a prefix of the next: all distinct.
        let slots: Vec<u32> =
            (1..=12).map(|n| r.contribute(&Elem { set: set.clone(), key: key(n), data: None }, &s).0).collect();
        assert_eq!(r.len(), 12);
        for (n, &slot) in (1..=12).zip(&slots) {
            assert_eq!(r.element(slot), Some((&set, key(n))));
            assert_eq!(r.effective(&set, &key(n)), Some(None));
        }
        // The same long key again is the same element.
        assert_eq!(r.contribute(&Elem { set: set.clone(), key: key(12), data: None }, &s).0, slots[11]);
        r.withdraw(slots[11], &s);
        assert_eq!(r.effective(&set, &key(12)), None);
        assert_eq!(r.effective(&set, &key(11)), Some(None));
    }

    #[test]
    fn elements_survive_the_index_growing() {
        let mut r = Registry::default();
        let s: Text = Arc::from("ns/s");
        let slots: Vec<u32> = (0..5000).map(|p| r.contribute(&elem(p, VerdictKind::Drop), &s).0).collect();
        for (p, &slot) in slots.iter().enumerate() {
            let e = elem(p as u32, VerdictKind::Drop);
            assert_eq!(r.element(slot), Some((&e.set, e.key)));
            assert_eq!(r.effective(&e.set, &e.key), Some(e.data.clone()));
        }
        for &slot in slots.iter().step_by(2) {
            r.withdraw(slot, &s);
        }
        assert_eq!(r.len(), 2500);
        for p in 0..5000u32 {
            let e = elem(p, VerdictKind::Drop);
            assert_eq!(r.effective(&e.set, &e.key).is_some(), p % 2 == 1, "port {p}");
        }
    }
}
