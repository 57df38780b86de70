//! `maglev`: Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast
//! and Reliable Software Network Load Balancer", NSDI'16, §3.4) as a kpx
//! scheduler component, written against kpx-sdk alone.
//!
//! Each endpoint (`ip:port`) draws an offset and a skip from two hashes of
//! its name and so a preference list over the M entries of a lookup table;
//! endpoints take turns claiming their next preferred free entry, each as
//! many times per round as its weight, until the table is full. A client
//! address hashes to an entry. When one of N endpoints goes, the others
//! keep nearly all their entries: about 1/N of clients move.
//!
//! Every mode runs the same table: the plan is a slot table of 32 x 32
//! slots over the kernel's jhash of the client address, slot `s` taking
//! entry `s mod M`; userspace mode picks from the same slots.
//!
//! It promises what the table gives: spread, weighted (weights up to 64:1
//! after their gcd), sticky and minimal-disruption; `kpx conformance`
//! checks each.

use std::collections::HashMap;
use std::sync::Mutex;

use kpx_sdk::scheduler::{PickRequest, Request, Scheduler};
use kpx_sdk::{HashField, Plan, Promise, SlotTable};

const NAME: &str = "maglev";
/// The lookup table's size: a prime, so that every skip visits every entry.
const M: usize = 1021;
/// The slot table the modes execute: 32 x 32 = 1024 slots.
const DIM: u8 = 32;
const SEED: u32 = 0x4d41_474c;
/// A weight counts at most this much (the table has M entries to share).
const MAX_WEIGHT: u32 = 64;

/// FNV-1a, 64 bits, from `basis`, then mixed (splitmix64's finalizer):
/// endpoint names differ in a byte or two, and their offsets and skips
/// must not follow each other.
fn fnv1a(bytes: &[u8], basis: u64) -> u64 {
    let h = bytes.iter().fold(basis, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
    let h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The lookup table over endpoints named `names` with `weights`: the
/// position (among them) of each entry's endpoint.
fn lookup(names: &[String], weights: &[u32]) -> Result<Vec<u32>, String> {
    let live: Vec<usize> = (0..names.len()).filter(|&i| weights[i] > 0).collect();
    if live.is_empty() {
        return Err("no candidate has a weight".into());
    }
    let gcd = live.iter().map(|&i| weights[i]).fold(0, gcd);
    let turns: Vec<u32> = live.iter().map(|&i| (weights[i] / gcd).min(MAX_WEIGHT)).collect();
    let prefs: Vec<(usize, usize)> = live
        .iter()
        .map(|&i| {
            let offset = (fnv1a(names[i].as_bytes(), 0xcbf2_9ce4_8422_2325) % M as u64) as usize;
            let skip = (fnv1a(names[i].as_bytes(), 0x8422_2325_cbf2_9ce4) % (M as u64 - 1) + 1) as usize;
            (offset, skip)
        })
        .collect();
    let mut next = vec![0usize; live.len()];
    let mut entry = vec![u32::MAX; M];
    let mut filled = 0;
    'fill: loop {
        for (k, &i) in live.iter().enumerate() {
            for _ in 0..turns[k] {
                let (offset, skip) = prefs[k];
                let mut c = (offset + next[k] * skip) % M;
                while entry[c] != u32::MAX {
                    next[k] += 1;
                    c = (offset + next[k] * skip) % M;
                }
                entry[c] = i as u32;
                next[k] += 1;
                filled += 1;
                if filled == M {
                    break 'fill;
                }
            }
        }
    }
    Ok(entry)
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The slot table the modes execute for endpoints `names` with `weights`.
fn slots(names: &[String], weights: &[u32]) -> Result<SlotTable, String> {
    let entry = lookup(names, weights)?;
    let n = usize::from(DIM) * usize::from(DIM);
    Ok(SlotTable { field: HashField::Source, seed: SEED, rows: DIM, cols: DIM, slots: (0..n).map(|s| entry[s % M]).collect() })
}

fn no_parameters(parameters: &[(String, String)]) -> Result<(), String> {
    match parameters.first() {
        Some((key, _)) => Err(format!("{NAME} takes no parameters (got {key:?})")),
        None => Ok(()),
    }
}

/// Tables built for picks, by service port (a table is rebuilt only when
/// the port's endpoints or weights change).
type Cache = HashMap<String, (Vec<String>, Vec<u32>, SlotTable)>;
static TABLES: Mutex<Option<Cache>> = Mutex::new(None);

struct Maglev;

impl Scheduler for Maglev {
    fn names() -> Vec<String> {
        vec![NAME.to_string()]
    }

    fn promises(_: &str) -> Vec<Promise> {
        vec![Promise::Spread, Promise::Weighted, Promise::Sticky, Promise::MinimalDisruption]
    }

    fn uses_load(_: &str) -> bool {
        false
    }

    fn plan(request: Request) -> Result<Plan, String> {
        no_parameters(&request.parameters)?;
        let (mut names, mut weights) = (Vec::new(), Vec::new());
        for &i in &request.candidates {
            let e = request.port.endpoints.get(i as usize).ok_or("a candidate is no endpoint")?;
            names.push(e.host_port());
            weights.push(u32::from(e.weight));
        }
        Ok(Plan::Slots(slots(&names, &weights)?))
    }

    fn pick(request: PickRequest) -> Result<Option<u32>, String> {
        no_parameters(&request.parameters)?;
        let names: Vec<String> = request.endpoints.iter().map(|(ip, port)| match ip {
            std::net::IpAddr::V4(_) => format!("{ip}:{port}"),
            std::net::IpAddr::V6(_) => format!("[{ip}]:{port}"),
        }).collect();
        let mut cache = TABLES.lock().map_err(|_| "the tables' lock is poisoned".to_string())?;
        let cache = cache.get_or_insert_with(HashMap::new);
        let fresh = cache.get(&request.service).is_none_or(|(n, w, _)| n != &names || w != &request.weights);
        if fresh {
            let table = slots(&names, &request.weights)?;
            cache.insert(request.service.clone(), (names, request.weights.clone(), table));
        }
        let table = &cache[&request.service].2;
        // The client's slot, or the next whose endpoint has not failed it.
        let start = table.slot_of(request.client);
        let n = table.slots.len();
        Ok((0..n).map(|k| table.slots[(start + k) % n]).find(|c| !request.failed.contains(c)))
    }

    fn forget(service: &str) {
        if let Ok(mut cache) = TABLES.lock()
            && let Some(cache) = cache.as_mut()
        {
            cache.remove(service);
        }
    }
}

kpx_sdk::export_scheduler!(Maglev);

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_sdk::{ProxyMode, testing};

    fn names(n: usize) -> Vec<String> {
        (1..=n).map(|k| format!("10.244.{k}.5:8080")).collect()
    }

    #[test]
    fn the_table_shares_entries_by_weight() {
        let entry = lookup(&names(3), &[1, 1, 2]).unwrap();
        let count = |i: u32| entry.iter().filter(|&&e| e == i).count();
        assert_eq!(count(0) + count(1) + count(2), M);
        assert!(count(2) > count(0) + count(0) / 2, "{} {} {}", count(0), count(1), count(2));
        assert!(lookup(&names(2), &[0, 0]).is_err());
    }

    /// What the conformance kit measures through picks, over the table:
    /// the share of entries that change endpoint when one of four goes.
    #[test]
    fn one_endpoint_of_four_gone_moves_at_most_a_quarter_and_two_points() {
        let four = names(4);
        let before = lookup(&four, &[1; 4]).unwrap();
        for gone in 0..4 {
            let rest: Vec<String> = four.iter().enumerate().filter(|(k, _)| *k != gone).map(|(_, n)| n.clone()).collect();
            let after = lookup(&rest, &[1; 3]).unwrap();
            let moved = before.iter().zip(&after).filter(|(b, a)| four[**b as usize] != rest[**a as usize]).count();
            let share = moved as f64 / M as f64;
            eprintln!("endpoint {gone} gone: {:.1} % of entries moved", share * 100.0);
            assert!(share <= 0.27, "{share}");
        }
    }

    #[test]
    fn one_endpoint_of_five_gone_moves_about_a_fifth_of_the_entries() {
        let before = lookup(&names(5), &[1; 5]).unwrap();
        let four: Vec<String> = names(5).into_iter().skip(1).collect();
        let after = lookup(&four, &[1; 4]).unwrap();
        let moved = before.iter().zip(&after).filter(|(b, a)| **b != 0 && **b != **a + 1).count();
        let share = moved as f64 / M as f64;
        assert!(share < 0.05, "entries of staying endpoints moved: {share}");
    }

    #[test]
    fn every_mode_runs_the_plan_and_clients_stay() {
        let port = testing::service_port("shop/web:http", &[("10.244.1.5", 1), ("10.244.2.5", 1), ("10.244.3.5", 1)]);
        for mode in [ProxyMode::Iptables, ProxyMode::Nftables, ProxyMode::Ipvs] {
            testing::check_plan(&Maglev::plan(testing::request(NAME, mode, &port)).unwrap(), 3, mode).unwrap();
        }
        let request = testing::pick_request(NAME, &port, "192.0.2.7");
        let first = Maglev::pick(request.clone()).unwrap();
        assert!(first.is_some() && (0..5).all(|_| Maglev::pick(request.clone()).unwrap() == first));
        let counts = testing::spread::<Maglev>(NAME, &port, 3000).unwrap();
        assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
    }
}
