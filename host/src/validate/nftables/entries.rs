//! The elements of one endpoint map as the host tracks them: each key's
//! words and the endpoint it holds (None in an overlay: deleted).
//!
//! Endpoint maps are the largest objects the host tracks (about 100k
//! elements at 10k Services x 10). An IPv4 map is held compact, 28 bytes
//! an element (a key of up to four words and the endpoint in two words),
//! against 48 for a general key and an `Option<EndpointAddr>`: 10.4 MB of
//! the host's heap at 10k x 10 in a heaptrack profile before this. A map
//! turns general, once and for good, when an element does not fit (an
//! IPv6 key or endpoint).

use foldhash::HashMap;

use super::EndpointAddr;
use crate::validate::dense::DenseMap;
use crate::validate::scope::Fact;

/// A key's canonical words (decoding refuses every other spelling of a
/// value), inline up to four words.
#[derive(Debug, Clone)]
enum Key {
    Inline(u8, [u32; 4]),
    Heap(Box<[u32]>),
}

impl Key {
    fn words(&self) -> &[u32] {
        match self {
            Key::Inline(n, w) => &w[..usize::from(*n)],
            Key::Heap(w) => w,
        }
    }
}

impl From<&[u32]> for Key {
    fn from(words: &[u32]) -> Key {
        match ShortKey::new(words) {
            Some(k) => Key::Inline(k.len, k.w),
            None => Key::Heap(words.into()),
        }
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.words() == other.words()
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.words().hash(state)
    }
}

impl std::borrow::Borrow<[u32]> for Key {
    fn borrow(&self) -> &[u32] {
        self.words()
    }
}

/// Up to four words, the rest zero, with their count: 20 bytes, no pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ShortKey {
    len: u8,
    w: [u32; 4],
}

impl ShortKey {
    fn new(words: &[u32]) -> Option<ShortKey> {
        let mut w = [0; 4];
        w.get_mut(..words.len())?.copy_from_slice(words);
        Some(ShortKey { len: words.len() as u8, w })
    }

    fn words(&self) -> &[u32] {
        &self.w[..usize::from(self.len)]
    }
}

/// Bit 16 of an endpoint's second word (past the port): an endpoint is
/// there.
const PRESENT: u32 = 1 << 16;

/// An IPv4 endpoint (or none) in two words: the scope's packing of the
/// endpoint (the address, then the port) with [`PRESENT`] set. None for
/// an IPv6 endpoint.
fn pack(e: Option<EndpointAddr>) -> Option<[u32; 2]> {
    match e {
        None => Some([0, 0]),
        Some(e) => e.pack().map(|[a, b]| [a, PRESENT | b]),
    }
}

fn unpack(w: [u32; 2]) -> Option<EndpointAddr> {
    (w[1] & PRESENT != 0).then(|| EndpointAddr::unpack([w[0], w[1] & !PRESENT]))
}

#[derive(Debug, Clone)]
enum Store {
    Compact(DenseMap<ShortKey, [u32; 2]>),
    General(HashMap<Key, Option<EndpointAddr>>),
}

#[derive(Debug, Clone)]
pub(super) struct Entries(Store);

impl Default for Entries {
    fn default() -> Entries {
        Entries(Store::Compact(DenseMap::default()))
    }
}

impl Entries {
    pub(super) fn is_empty(&self) -> bool {
        match &self.0 {
            Store::Compact(m) => m.is_empty(),
            Store::General(m) => m.is_empty(),
        }
    }

    #[cfg(test)]
    pub(super) fn is_compact(&self) -> bool {
        matches!(self.0, Store::Compact(_))
    }

    pub(super) fn reserve(&mut self, n: usize) {
        match &mut self.0 {
            Store::Compact(m) => m.reserve(n),
            Store::General(m) => m.reserve(n),
        }
    }

    /// The key's element: Some(None) when an overlay deleted it.
    pub(super) fn get(&self, key: &[u32]) -> Option<Option<EndpointAddr>> {
        match &self.0 {
            Store::Compact(m) => ShortKey::new(key).and_then(|k| m.get(&k)).map(unpack),
            Store::General(m) => m.get(key).copied(),
        }
    }

    pub(super) fn contains_key(&self, key: &[u32]) -> bool {
        self.get(key).is_some()
    }

    pub(super) fn insert(&mut self, key: &[u32], e: Option<EndpointAddr>) {
        if let Store::Compact(m) = &mut self.0 {
            if let (Some(k), Some(w)) = (ShortKey::new(key), pack(e)) {
                m.insert(k, w);
                return;
            }
            // With the room reserved for the compact map (an IPv6 map's
            // first element: its whole list was reserved for).
            let mut general = HashMap::with_capacity_and_hasher(m.capacity(), Default::default());
            general.extend(m.drain().map(|(k, w)| (Key::from(k.words()), unpack(w))));
            self.0 = Store::General(general);
        }
        if let Store::General(m) = &mut self.0 {
            m.insert(Key::from(key), e);
        }
    }

    pub(super) fn remove(&mut self, key: &[u32]) {
        match &mut self.0 {
            Store::Compact(m) => {
                if let Some(k) = ShortKey::new(key) {
                    m.remove(&k);
                }
            }
            Store::General(m) => {
                m.remove(key);
            }
        }
    }

    /// Drops the deleted elements (an overlay's, moving into the model).
    pub(super) fn retain_present(&mut self) {
        match &mut self.0 {
            Store::Compact(m) => m.retain(|_, w| unpack(*w).is_some()),
            Store::General(m) => m.retain(|_, e| e.is_some()),
        }
    }

    /// Every element with its key's words.
    pub(super) fn iter(&self) -> Box<dyn Iterator<Item = (&[u32], Option<EndpointAddr>)> + '_> {
        match &self.0 {
            Store::Compact(m) => Box::new(m.iter().map(|(k, w)| (k.words(), unpack(*w)))),
            Store::General(m) => Box::new(m.iter().map(|(k, e)| (k.words(), *e))),
        }
    }

    /// Empties the map, returning the endpoints its elements held.
    pub(super) fn take_endpoints(&mut self) -> Vec<EndpointAddr> {
        match &mut self.0 {
            Store::Compact(m) => m.drain().filter_map(|(_, w)| unpack(w)).collect(),
            Store::General(m) => m.drain().filter_map(|(_, e)| e).collect(),
        }
    }

    /// Applies an overlay's elements to `self`: each present one is set,
    /// each deleted one removed.
    pub(super) fn apply(&mut self, overlay: Entries) {
        match overlay.0 {
            Store::Compact(o) => {
                for (k, w) in o {
                    match unpack(w) {
                        Some(e) => self.insert(k.words(), Some(e)),
                        None => self.remove(k.words()),
                    }
                }
            }
            Store::General(o) => {
                for (k, e) in o {
                    match e {
                        Some(_) => self.insert(k.words(), e),
                        None => self.remove(k.words()),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(s: &str, port: u16) -> Option<EndpointAddr> {
        Some((s.parse().unwrap(), port))
    }

    #[test]
    fn keys_of_each_length_and_endpoints_come_back_as_they_went_in() {
        let mut m = Entries::default();
        // Keys that are prefixes of each other, or differ by a trailing
        // zero, are distinct elements.
        let keys: [&[u32]; 5] = [&[], &[0], &[0, 0], &[1, 2, 3], &[1, 2, 3, 0]];
        for (i, k) in keys.iter().enumerate() {
            m.insert(k, ep("10.0.0.1", i as u16));
        }
        m.insert(&[9], None);
        m.insert(&[8], ep("10.0.0.2", 0));
        m.insert(&[7], ep("10.0.0.3", 65535));
        assert!(m.is_compact());
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(m.get(k), Some(ep("10.0.0.1", i as u16)), "{k:?}");
        }
        assert_eq!(m.get(&[9]), Some(None));
        assert_eq!(m.get(&[8]), Some(ep("10.0.0.2", 0)));
        assert_eq!(m.get(&[7]), Some(ep("10.0.0.3", 65535)));
        assert_eq!(m.get(&[1, 2]), None);
        assert_eq!(m.get(&[1, 2, 3, 0, 0]), None);
        // An IPv6 endpoint, then a five-word key: general from then on,
        // with every element kept.
        m.insert(&[6], ep("fd00::1", 80));
        assert!(!m.is_compact());
        m.insert(&[1, 2, 3, 4, 5], ep("10.0.0.4", 81));
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(m.get(k), Some(ep("10.0.0.1", i as u16)), "{k:?}");
        }
        assert_eq!(m.get(&[9]), Some(None));
        assert_eq!(m.get(&[6]), Some(ep("fd00::1", 80)));
        assert_eq!(m.get(&[1, 2, 3, 4, 5]), Some(ep("10.0.0.4", 81)));
        assert_eq!(m.iter().count(), 10);
        m.retain_present();
        assert_eq!(m.iter().count(), 9);
        assert_eq!(m.take_endpoints().len(), 9);
        assert!(m.is_empty());
    }

    #[test]
    fn an_overlay_sets_and_removes() {
        let mut model = Entries::default();
        model.insert(&[1], ep("10.0.0.1", 80));
        model.insert(&[2], ep("10.0.0.2", 80));
        let mut overlay = Entries::default();
        overlay.insert(&[1], None);
        overlay.insert(&[3], ep("10.0.0.3", 80));
        model.apply(overlay);
        assert_eq!(
            (model.get(&[1]), model.get(&[2]), model.get(&[3])),
            (None, Some(ep("10.0.0.2", 80)), Some(ep("10.0.0.3", 80)))
        );
        let mut overlay = Entries::default();
        overlay.insert(&[2], ep("fd00::2", 80));
        model.apply(overlay);
        assert!(!model.is_compact());
        assert_eq!(model.get(&[2]), Some(ep("fd00::2", 80)));
        assert_eq!(model.get(&[3]), Some(ep("10.0.0.3", 80)));
    }
}
