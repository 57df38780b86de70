//! A map of small `Copy` keys and values held in insertion order: the
//! keys and values in two vectors, and a hash table of their positions
//! (four bytes an entry) beside them.
//!
//! The checks look up every element a plugin returns in tables of the
//! state's facts (at 100k Services x 10, millions of them). In a hash map
//! of keys and values, each lookup lands on a random cache line of a table
//! many times the size of the cache. Here the random part is the table of
//! positions (5 bytes a slot, against 13 for a fact and its count, 29 for
//! an endpoint map's element), and a plugin returns its elements in
//! about the order the state's facts were counted in, so the keys and
//! values are read about in order. Removal moves the last entry into the
//! hole (as `swap_remove`), so positions are not stable across removals.
//!
//! Built on hashbrown's `HashTable` (the table behind std's `HashMap`)
//! rather than `indexmap`, whose entries carry their 8-byte hash and whose
//! positions are 8 bytes: twice the memory for the state's tables.

use std::hash::{BuildHasher, Hash};

use foldhash::fast::RandomState;
use hashbrown::HashTable;

#[derive(Clone)]
pub struct DenseMap<K, V> {
    /// Positions in `keys` and `values`, hashed by their key.
    index: HashTable<u32>,
    keys: Vec<K>,
    values: Vec<V>,
    hasher: RandomState,
}

impl<K, V> Default for DenseMap<K, V> {
    fn default() -> Self {
        DenseMap { index: HashTable::new(), keys: Vec::new(), values: Vec::new(), hasher: RandomState::default() }
    }
}

impl<K: std::fmt::Debug, V: std::fmt::Debug> std::fmt::Debug for DenseMap<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.keys.iter().zip(&self.values)).finish()
    }
}

impl<K: Copy + Eq + Hash, V: Copy> DenseMap<K, V> {
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn reserve(&mut self, n: usize) {
        let Self { index, keys, hasher, .. } = self;
        index.reserve(n, |&i| hasher.hash_one(keys[i as usize]));
        self.keys.reserve(n);
        self.values.reserve(n);
    }

    fn position(&self, k: &K) -> Option<usize> {
        let hash = self.hasher.hash_one(k);
        self.index.find(hash, |&i| self.keys[i as usize] == *k).map(|&i| i as usize)
    }

    pub fn contains_key(&self, k: &K) -> bool {
        self.position(k).is_some()
    }

    pub fn get(&self, k: &K) -> Option<V> {
        self.position(k).map(|i| self.values[i])
    }

    /// The key's value, inserted as `default()` when it is missing.
    pub fn get_or_insert_with(&mut self, k: K, default: impl FnOnce() -> V) -> &mut V {
        let hash = self.hasher.hash_one(k);
        let Self { index, keys, values, hasher } = self;
        let i = match index.find(hash, |&i| keys[i as usize] == k) {
            Some(&i) => i as usize,
            None => {
                let i = keys.len();
                // Positions are u32: more entries than that is more than any
                // state's facts (and than the memory of a node).
                let at = u32::try_from(i).expect("fewer than 2^32 entries");
                index.insert_unique(hash, at, |&j| hasher.hash_one(keys[j as usize]));
                keys.push(k);
                values.push(default());
                i
            }
        };
        &mut values[i]
    }

    pub fn insert(&mut self, k: K, v: V) {
        *self.get_or_insert_with(k, || v) = v;
    }

    /// Takes the key out; the last entry moves into its place.
    pub fn remove(&mut self, k: &K) -> Option<V> {
        let hash = self.hasher.hash_one(k);
        let Self { index, keys, values, hasher } = self;
        let i = index.find_entry(hash, |&i| keys[i as usize] == *k).ok()?.remove().0 as usize;
        let last = keys.len() - 1;
        if i != last {
            // The last entry's position changes to the hole's.
            let moved = hasher.hash_one(keys[last]);
            let slot = index.find_mut(moved, |&j| j as usize == last).expect("every entry is indexed");
            *slot = i as u32;
        }
        keys.swap_remove(i);
        Some(values.swap_remove(i))
    }

    /// Keeps the entries for which `keep` holds (in their order).
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &V) -> bool) {
        let mut w = 0;
        for r in 0..self.keys.len() {
            if keep(&self.keys[r], &self.values[r]) {
                self.keys.swap(w, r);
                self.values.swap(w, r);
                w += 1;
            }
        }
        if w == self.keys.len() {
            // Nothing dropped: the positions stand.
            return;
        }
        self.keys.truncate(w);
        self.values.truncate(w);
        self.reindex();
    }

    fn reindex(&mut self) {
        let Self { index, keys, hasher, .. } = self;
        index.clear();
        for (i, k) in keys.iter().enumerate() {
            index.insert_unique(hasher.hash_one(k), i as u32, |&j| hasher.hash_one(keys[j as usize]));
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.keys.iter().zip(&self.values)
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.keys.iter()
    }

    /// Empties the map, yielding its entries.
    pub fn drain(&mut self) -> impl Iterator<Item = (K, V)> + '_ {
        self.index.clear();
        self.keys.drain(..).zip(self.values.drain(..))
    }

    pub fn capacity(&self) -> usize {
        self.keys.capacity()
    }
}

impl<K: Copy + Eq + Hash, V: Copy> IntoIterator for DenseMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::iter::Zip<std::vec::IntoIter<K>, std::vec::IntoIter<V>>;
    fn into_iter(self) -> Self::IntoIter {
        self.keys.into_iter().zip(self.values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Random inserts, updates and removals, against std's map.
    #[test]
    fn behaves_as_a_map() {
        let mut d: DenseMap<[u32; 2], u32> = DenseMap::default();
        let mut m: HashMap<[u32; 2], u32> = HashMap::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for step in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = [(x % 512) as u32, (x >> 32) as u32 % 3];
            match x % 5 {
                0 | 1 => {
                    d.insert(k, step);
                    m.insert(k, step);
                }
                2 => {
                    *d.get_or_insert_with(k, || 0) += 1;
                    *m.entry(k).or_insert(0) += 1;
                }
                3 => assert_eq!(d.remove(&k), m.remove(&k)),
                _ => assert_eq!(d.get(&k), m.get(&k).copied()),
            }
            assert_eq!(d.len(), m.len());
            if step % 4096 == 0 {
                d.retain(|k, _| k[1] != 1);
                m.retain(|k, _| k[1] != 1);
            }
        }
        for (k, v) in &m {
            assert_eq!(d.get(k), Some(*v));
        }
        let mut all: Vec<_> = d.iter().map(|(k, v)| (*k, *v)).collect();
        all.sort();
        let mut want: Vec<_> = m.into_iter().collect();
        want.sort();
        assert_eq!(all, want);
    }

    #[test]
    fn entries_stay_in_the_order_they_came() {
        let mut d: DenseMap<u32, u32> = DenseMap::default();
        for k in [5, 3, 9, 1] {
            d.insert(k, k * 10);
        }
        assert_eq!(d.keys().copied().collect::<Vec<_>>(), vec![5, 3, 9, 1]);
        d.retain(|k, _| *k != 3);
        assert_eq!(d.keys().copied().collect::<Vec<_>>(), vec![5, 9, 1]);
        assert_eq!(d.remove(&5), Some(50));
        assert_eq!(d.keys().copied().collect::<Vec<_>>(), vec![1, 9]);
        assert_eq!((d.get(&1), d.get(&9), d.get(&5)), (Some(10), Some(90), None));
        assert_eq!(d.drain().count(), 2);
        assert!(d.is_empty() && d.get(&1).is_none());
    }
}
