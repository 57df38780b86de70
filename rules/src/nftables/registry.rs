//! Which services contribute each element of the table, the state a
//! partial render works from.
//!
//! Every (set, key) is held once, in a slot of `entries`; the hash index
//! holds only slot numbers, and a service remembers the slots it
//! contributes to rather than a copy of its elements. Contributors are
//! sorted by service key and the first one's data is what the kernel
//! holds; the first is kept inline, since most elements have exactly one,
//! and sets are numbered, so an entry is 48 bytes in WebAssembly.
//! At 10k Services x 10 endpoints (about 270k elements) this is what most
//! of the plugin's linear memory holds after a full render, so its size
//! per element is the figure to watch.

use std::hash::{BuildHasher, Hash, Hasher};

use hashbrown::HashTable;
use rustc_hash::{FxBuildHasher, FxHashMap};

use super::elements::{Elem, ElemData, EndpointWords, Set, Text, Words};
use crate::ops::nftables::VerdictKind;

/// A set as an entry holds it: its index in `Registry::sets`.
type SetId = u32;

/// One contributor: a service key and the data it wants for the element.
type Contributor = (Text, Data);

/// A key as an entry holds it: inline up to four words (every IPv4 key
/// but a firewall-allow one), boxed past that. 20 bytes in WebAssembly.
#[derive(Debug)]
enum Key {
    Short(u8, [u32; 4]),
    Long(Box<Words>),
}

impl Key {
    fn new(key: &Words) -> Key {
        let words = key.as_slice();
        if words.len() <= 4 {
            let mut w = [0; 4];
            w[..words.len()].copy_from_slice(words);
            Key::Short(words.len() as u8, w)
        } else {
            Key::Long(Box::new(*key))
        }
    }

    fn as_slice(&self) -> &[u32] {
        match self {
            Key::Short(n, w) => &w[..usize::from(*n)],
            Key::Long(k) => k.as_slice(),
        }
    }

    fn words(&self) -> Words {
        Words::from_slice(self.as_slice())
    }
}

/// An element's data as an entry holds it: an IPv4 endpoint (address and
/// port, two words) inline, a longer one boxed. 12 bytes in WebAssembly,
/// against 28 for an `Option<ElemData>`.
#[derive(Debug, PartialEq, Eq)]
enum Data {
    None,
    Endpoint2([u32; 2]),
    Endpoint(Box<EndpointWords>),
    Verdict(VerdictKind, Option<Text>),
}

impl Data {
    fn new(data: &Option<ElemData>) -> Data {
        match data {
            None => Data::None,
            Some(ElemData::Endpoint(w)) => match w.as_slice() {
                &[a, b] => Data::Endpoint2([a, b]),
                _ => Data::Endpoint(Box::new(*w)),
            },
            Some(ElemData::Verdict(kind, chain)) => Data::Verdict(*kind, chain.clone()),
        }
    }

    fn get(&self) -> Option<ElemData> {
        match self {
            Data::None => None,
            Data::Endpoint2(w) => Some(ElemData::Endpoint(Words::from_slice(w))),
            Data::Endpoint(w) => Some(ElemData::Endpoint(**w)),
            Data::Verdict(kind, chain) => Some(ElemData::Verdict(*kind, chain.clone())),
        }
    }
}

/// One element: 48 bytes in WebAssembly (92 with the set, the key and the
/// data as the generator's own types, and the others in a `Vec`), and
/// about 270k of them at 10k Services x 10.
#[derive(Debug)]
struct Entry {
    key: Key,
    set: SetId,
    /// The contributor whose data the kernel holds (the smallest key).
    first: Contributor,
    /// The others, sorted by service key (most elements have none).
    // Boxed: 4 bytes in every entry, against 12 for the `Vec` itself.
    #[allow(clippy::box_collection)]
    rest: Option<Box<Vec<Contributor>>>,
}

#[cfg(target_pointer_width = "32")]
const _: () = assert!(std::mem::size_of::<Option<Entry>>() <= 48);

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

/// The sets elements go to, each numbered once (a few dozen: the host's
/// sets and the endpoint and affinity maps).
#[derive(Debug, Default)]
struct Sets {
    sets: Vec<Set>,
    ids: FxHashMap<Set, SetId>,
    /// The set of the last lookup: elements come in runs of one set.
    last: Option<(Set, SetId)>,
}

impl Sets {
    fn id(&mut self, set: &Set) -> SetId {
        if let Some((s, id)) = &self.last
            && s == set
        {
            return *id;
        }
        let id = match self.ids.get(set) {
            Some(&id) => id,
            None => {
                let id = SetId::try_from(self.sets.len()).expect("fewer than 2^32 sets");
                self.sets.push(set.clone());
                self.ids.insert(set.clone(), id);
                id
            }
        };
        self.last = Some((set.clone(), id));
        id
    }

    /// The set's id, if it has one (no element is in a set without).
    fn find(&self, set: &Set) -> Option<SetId> {
        match &self.last {
            Some((s, id)) if s == set => Some(*id),
            _ => self.ids.get(set).copied(),
        }
    }

    fn get(&self, id: SetId) -> &Set {
        &self.sets[id as usize]
    }

    fn clear(&mut self) {
        self.sets.clear();
        self.ids.clear();
        self.last = None;
    }
}

/// (set, key) → the services contributing it. Slots are reused once
/// their last contributor withdraws.
#[derive(Debug, Default)]
pub struct Registry {
    entries: Slots,
    free: Vec<u32>,
    index: HashTable<u32>,
    sets: Sets,
}

fn hash_of(set: SetId, key: &[u32]) -> u64 {
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
        self.sets.clear();
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
            Some(e) => hash_of(e.set, e.key.as_slice()),
            // The index holds only occupied slots.
            None => 0,
        }
    }

    /// The slot holding (set, key), whose hash is `hash`.
    fn find(&self, hash: u64, set: SetId, key: &Words) -> Option<u32> {
        let entries = &self.entries;
        self.index
            .find(hash, |&slot| entries.get(slot).is_some_and(|e| e.set == set && e.key.as_slice() == key.as_slice()))
            .copied()
    }

    /// Records `service` as a contributor of `e` (replacing its data if it
    /// already is one). Returns the element's slot, and whether `service`
    /// is now the first contributor (the one whose element the kernel holds).
    pub fn contribute(&mut self, e: &Elem, service: &Text) -> (u32, bool) {
        let set = self.sets.id(&e.set);
        let hash = hash_of(set, e.key.as_slice());
        let Some(slot) = self.find(hash, set, &e.key) else {
            let entry = Entry { key: Key::new(&e.key), set, first: (service.clone(), Data::new(&e.data)), rest: None };
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
                entry.first.1 = Data::new(&e.data);
                true
            }
            std::cmp::Ordering::Greater => {
                let old = std::mem::replace(&mut entry.first, (service.clone(), Data::new(&e.data)));
                entry.rest.get_or_insert_default().insert(0, old);
                true
            }
            std::cmp::Ordering::Less => {
                let rest = entry.rest.get_or_insert_default();
                match rest.binary_search_by(|(k, _)| k.as_ref().cmp(service.as_ref())) {
                    Ok(i) => rest[i].1 = Data::new(&e.data),
                    Err(i) => rest.insert(i, (service.clone(), Data::new(&e.data))),
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
            match entry.rest.as_mut().filter(|r| !r.is_empty()) {
                Some(rest) => {
                    entry.first = rest.remove(0);
                    if rest.is_empty() {
                        entry.rest = None;
                    }
                }
                None => {
                    let hash = hash_of(entry.set, entry.key.as_slice());
                    if let Ok(found) = self.index.find_entry(hash, |&s| s == slot) {
                        found.remove();
                    }
                    *place = None;
                    self.free.push(slot);
                }
            }
        } else if let Some(rest) = entry.rest.as_mut() {
            rest.retain(|(k, _)| k != service);
            if rest.is_empty() {
                entry.rest = None;
            }
        }
    }

    /// The element in `slot`, if the slot is occupied.
    pub fn element(&self, slot: u32) -> Option<(&Set, Words)> {
        self.entries.get(slot).map(|e| (self.sets.get(e.set), e.key.words()))
    }

    /// The data in the kernel for (set, key): None if absent.
    pub fn effective(&self, set: &Set, key: &Words) -> Option<Option<ElemData>> {
        let set = self.sets.find(set)?;
        let slot = self.find(hash_of(set, key.as_slice()), set, key)?;
        self.entries.get(slot).map(|e| e.first.1.get())
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
    fn data_comes_back_as_it_went_in() {
        let mut r = Registry::default();
        let s: Text = Arc::from("ns/s");
        let set = Set::Own(Arc::from("internal-tcp-1"));
        let v4 = ElemData::Endpoint(Words::new().push(0x0a00_0001).push(80));
        let v6 = ElemData::Endpoint((0..5).fold(Words::new(), |w, i| w.push(i + 7)));
        let goto = ElemData::Verdict(VerdictKind::Goto, Some(Arc::from("cluster-ip")));
        for (i, data) in [Some(v4), Some(v6), Some(goto), None].into_iter().enumerate() {
            let key = Words::new().push(i as u32);
            let (slot, _) = r.contribute(&Elem { set: set.clone(), key, data: data.clone() }, &s);
            assert_eq!(r.effective(&set, &key), Some(data));
            assert_eq!(r.element(slot), Some((&set, key)));
        }
        // A set no element went to holds nothing.
        assert_eq!(r.effective(&Set::Own(Arc::from("other")), &Words::new().push(0)), None);
    }

    #[test]
    fn a_second_contributor_leaving_keeps_the_first() {
        let mut r = Registry::default();
        let (a, b, c): (Text, Text, Text) = (Arc::from("ns/a"), Arc::from("ns/b"), Arc::from("ns/c"));
        let e = elem(80, VerdictKind::Drop);
        let (slot, _) = r.contribute(&e, &a);
        r.contribute(&elem(80, VerdictKind::Accept), &c);
        r.contribute(&elem(80, VerdictKind::Reject), &b);
        r.withdraw(slot, &b);
        assert_eq!(r.effective(&e.set, &e.key), Some(e.data.clone()));
        r.withdraw(slot, &a);
        assert_eq!(r.effective(&e.set, &e.key), Some(Some(ElemData::Verdict(VerdictKind::Accept, None))));
        r.withdraw(slot, &c);
        assert_eq!(r.effective(&e.set, &e.key), None);
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
