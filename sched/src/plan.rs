//! Plans from schedulers: what the iptables and nftables modes execute.
//!
//! | scheduler | plan |
//! |---|---|
//! | random | weighted: the weights |
//! | rr, wrr | sequence: one cycle of IPVS's picks from a fresh state |
//! | lc, wlc, sed, nq | weighted: the candidates tied at IPVS's least cost under the measured load |
//! | lblc, lblcr | slots over the destination: each slot a new destination address under the load |
//! | dh, sh | slots over the destination / source: IPVS's 256 buckets |
//! | mh, maglev | slots over the source: the permutation table |

use kpx_rules::model::ProxyMode;
use kpx_rules::plan::{HashField, KernelPlan, MAX_SEQUENCE, MAX_SLOT_DIM, MAX_WEIGHT_SUM, Plan, SlotTable};

use crate::ipvs::{self, Cost, Lblc, Lblcr, Rr, Wrr};
use crate::params::Params;
use crate::tables::{self, Table};
use crate::{Connection, Dest, Picker};

/// The default seed of slot tables (any fixed value: every node must
/// build the same table).
pub const DEFAULT_SEED: u32 = 0x6b70_7821;

/// A plan for `mode` (ipvs: the kernel's own scheduler; the others: see
/// the table above).
pub fn plan_for(mode: ProxyMode, name: &str, params: &[(String, String)], dests: &[Dest]) -> Result<Plan, String> {
    if mode != ProxyMode::Ipvs {
        return plan(name, params, dests);
    }
    if dests.is_empty() {
        return Err("no candidates".into());
    }
    let p = |known: &[&str]| Params::new(name, params, known);
    let flags = match name {
        // The same slot table as in the other modes, which the host
        // executes with firewall marks: one client reaches the same
        // endpoint in every mode (not the kernel's own mh).
        "mh" | "maglev" => return plan(name, params, dests),
        "sh" => {
            let params = p(&["fallback", "port"])?;
            u8::from(params.flag("fallback")?) | (u8::from(params.flag("port")?) << 1)
        }
        "rr" | "wrr" | "lc" | "wlc" | "sed" | "nq" | "dh" | "lblc" | "lblcr" => {
            p(&[])?;
            0
        }
        "random" => {
            return Err(format!(
                "{name} is not an IPVS scheduler: ipvs mode cannot execute it (the iptables and nftables modes can)"
            ));
        }
        other => return Err(format!("no scheduler is named {other:?} (built in: {})", crate::NAMES.join(", "))),
    };
    Ok(Plan::Kernel(KernelPlan {
        scheduler: name.to_string(),
        weights: dests.iter().map(|d| d.weight).collect(),
        flags,
    }))
}

/// A plan for `dests` (the candidates, in order) from the scheduler
/// `name` with `params`, for the iptables and nftables modes.
pub fn plan(name: &str, params: &[(String, String)], dests: &[Dest]) -> Result<Plan, String> {
    if dests.is_empty() {
        return Err("no candidates".into());
    }
    if !dests.iter().any(Dest::available) {
        return Err("no candidate has a positive weight".into());
    }
    let p = |known: &[&str]| Params::new(name, params, known);
    let seed = |p: &Params| p.number("seed", DEFAULT_SEED, |_| true, "a 32-bit number");
    match name {
        "random" => {
            p(&[])?;
            Ok(Plan::Weighted(scale_weights(&dests.iter().map(|d| d.weight).collect::<Vec<_>>())))
        }
        "rr" => {
            p(&[])?;
            // rr ignores weights but 0: each available endpoint once per turn.
            let available = dests.iter().filter(|d| d.available()).count();
            if available > MAX_SEQUENCE {
                return Ok(Plan::Weighted(dests.iter().map(|d| u32::from(d.available())).collect()));
            }
            let mut rr = Rr::default();
            Ok(Plan::Sequence(
                (0..available).filter_map(|_| rr.pick(dests, any_connection())).map(|i| i as u32).collect(),
            ))
        }
        "wrr" => {
            p(&[])?;
            let gcd = ipvs::weight_gcd(dests);
            let total: u64 = dests.iter().filter(|d| d.available()).map(|d| u64::from(d.weight / gcd)).sum();
            if total as usize > MAX_SEQUENCE {
                // Too long a cycle to rotate through: the same shares, at random.
                return Ok(Plan::Weighted(scale_weights(&dests.iter().map(|d| d.weight).collect::<Vec<_>>())));
            }
            let mut wrr = Wrr::default();
            let picks = (0..total).filter_map(|_| wrr.pick(dests, any_connection())).map(|i| i as u32).collect();
            Ok(Plan::Sequence(picks))
        }
        "lc" | "wlc" | "sed" | "nq" => {
            p(&[])?;
            Ok(Plan::Weighted(scale_weights(&least_set(name, dests))))
        }
        "lblc" | "lblcr" => {
            let params = p(&["seed"])?;
            let mut picker: Box<dyn Picker> =
                if name == "lblc" { Box::new(Lblc::default()) } else { Box::new(Lblcr::default()) };
            Ok(Plan::Slots(locality_slots(picker.as_mut(), dests, seed(&params)?)))
        }
        "dh" => {
            let params = p(&["seed"])?;
            Ok(Plan::Slots(slot_table(HashField::Destination, &tables::dh_table(dests), dests, seed(&params)?)))
        }
        "sh" => {
            let params = p(&["seed"])?;
            Ok(Plan::Slots(slot_table(HashField::Source, &tables::sh_table(dests), dests, seed(&params)?)))
        }
        "mh" => {
            let params = p(&["seed", "table-size"])?;
            let size = params.number("table-size", 251, |n| [251, 509, 1021].contains(&n), "251, 509 or 1021")?;
            if dests.len() > size as usize {
                return Err(format!("mh: {} endpoints do not fit a table of {size} (table-size)", dests.len()));
            }
            let table = tables::mh_table(dests, size as usize, seed(&params)?);
            Ok(Plan::Slots(slot_table(HashField::Source, &table, dests, seed(&params)?)))
        }
        "maglev" => {
            let params = p(&["seed", "table-size"])?;
            let size = params.number(
                "table-size",
                1021,
                |n| tables::is_prime(n) && n as usize >= dests.len() && n <= 1021,
                "a prime from the number of endpoints up to 1021",
            )?;
            if dests.len() > size as usize {
                return Err(format!("maglev: {} endpoints do not fit a table of {size} (table-size)", dests.len()));
            }
            let table = tables::maglev_table(dests, size as usize, seed(&params)?);
            Ok(Plan::Slots(slot_table(HashField::Source, &table, dests, seed(&params)?)))
        }
        other => Err(format!("no scheduler is named {other:?} (built in: {})", crate::NAMES.join(", "))),
    }
}

/// Weights reduced by their gcd and, when they sum past what a mode can
/// hold, scaled down (a positive weight keeps at least 1).
pub fn scale_weights(weights: &[u32]) -> Vec<u32> {
    let gcd = weights.iter().copied().filter(|&w| w > 0).fold(0, ipvs::gcd).max(1);
    let w: Vec<u32> = weights.iter().map(|&x| x / gcd).collect();
    let sum: u64 = w.iter().map(|&x| u64::from(x)).sum();
    if sum <= u64::from(MAX_WEIGHT_SUM) || w.iter().all(|&x| x == w[0]) {
        return w;
    }
    let positive = w.iter().filter(|&&x| x > 0).count() as u64;
    if positive >= u64::from(MAX_WEIGHT_SUM) {
        // Too many endpoints to weigh: equal shares among the positive ones.
        return w.iter().map(|&x| u32::from(x > 0)).collect();
    }
    let budget = u64::from(MAX_WEIGHT_SUM) - positive;
    w.iter().map(|&x| if x == 0 { 0 } else { 1 + (u64::from(x) * budget / sum) as u32 }).collect()
}

/// A placeholder connection for schedulers that do not read addresses.
fn any_connection() -> Connection {
    let ip = std::net::IpAddr::from([0, 0, 0, 0]);
    Connection { source: ip, destination: ip }
}

/// Where IPVS sends the next connection under the measured load: the
/// candidates tied at the scheduler's least cost, each with its weight
/// (lc: 1, weights aside). The plan holds until the next measurement,
/// so a burst between two measurements goes where the kernel would send
/// its first connection.
fn least_set(name: &str, dests: &[Dest]) -> Vec<u32> {
    let cost = match name {
        "lc" => Cost::Lc,
        "wlc" => Cost::Wlc,
        _ => Cost::Sed,
    };
    // nq: the idle ones first, all tied; else sed's.
    let idle_first = name == "nq" && dests.iter().any(|d| d.available() && d.active == 0);
    let candidate = |d: &Dest| d.available() && (!idle_first || d.active == 0);
    let pool: Vec<Dest> = dests.iter().filter(|d| candidate(d)).cloned().collect();
    let Some(best) = ipvs::least(&pool, |d, l| idle_first || cost.less(d, l)).map(|i| &pool[i]) else {
        return vec![0; dests.len()];
    };
    // Tied with the least: not more costly than it.
    dests
        .iter()
        .map(|d| match (candidate(d) && (idle_first || !cost.less(best, d)), cost) {
            (false, _) => 0,
            (true, Cost::Lc) => 1,
            (true, _) => d.weight,
        })
        .collect()
}

/// lblc/lblcr as slots over the destination address: each of 256 slots
/// stands for a destination address seen for the first time, in turn,
/// under the measured load plus the slots assigned before it.
fn locality_slots(picker: &mut dyn Picker, dests: &[Dest], seed: u32) -> SlotTable {
    let mut load = dests.to_vec();
    let table: Table = (0..tables::BUCKETS)
        .map(|slot| {
            let dst = std::net::IpAddr::from((slot as u32).to_be_bytes());
            let i = picker.pick(&load, Connection { source: dst, destination: dst })?;
            load[i].active += 1;
            Some(i)
        })
        .collect();
    slot_table(HashField::Destination, &table, dests, seed)
}

/// A table of `size` entries as a plan's slots: up to 32 in one row;
/// larger ones in rows of 32 (at most 32 rows), slot i holding entry
/// i mod size. Entries with no destination (or an unavailable one) take
/// the next available entry's.
pub fn slot_table(field: HashField, table: &Table, dests: &[Dest], seed: u32) -> SlotTable {
    let size = table.len();
    let max = usize::from(MAX_SLOT_DIM);
    let (rows, cols) = if size <= max { (1, size) } else { (size.div_ceil(max).min(max), max) };
    let usable = |e: &Option<usize>| e.filter(|&i| dests[i].available());
    let fallback = table.iter().find_map(usable).unwrap_or(0);
    let slots = (0..rows * cols)
        .map(|s| {
            let i = s % size;
            (0..size).find_map(|k| usable(&table[(i + k) % size])).unwrap_or(fallback) as u32
        })
        .collect();
    SlotTable { field, seed, rows: rows as u8, cols: cols as u8, slots }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn dests(weights: &[u32]) -> Vec<Dest> {
        let ip = |i: usize| IpAddr::from((0x0a00_0001u32 + i as u32).to_be_bytes());
        weights.iter().enumerate().map(|(i, &w)| Dest::new(ip(i), 80, w)).collect()
    }

    #[test]
    fn rotations() {
        assert_eq!(plan("rr", &[], &dests(&[1, 0, 1])), Ok(Plan::Sequence(vec![0, 2])));
        // rr ignores weights (but 0): a third each.
        assert_eq!(plan("rr", &[], &dests(&[2, 1, 1])), Ok(Plan::Sequence(vec![0, 1, 2])));
        // Past 1024 endpoints: uniform among the available.
        let mut many = vec![1; 1500];
        many[3] = 0;
        let Ok(Plan::Weighted(w)) = plan("rr", &[], &dests(&many)) else { panic!() };
        assert_eq!((w.len(), w[3], w.iter().sum::<u32>()), (1500, 0, 1499));
        assert_eq!(plan("wrr", &[], &dests(&[3, 1])), Ok(Plan::Sequence(vec![0, 0, 0, 1])));
        assert_eq!(plan("wrr", &[], &dests(&[4, 2])), Ok(Plan::Sequence(vec![0, 0, 1])));
        // A cycle longer than a mode can rotate through: the same shares at random.
        assert_eq!(plan("wrr", &[], &dests(&[1000, 1001])), Ok(Plan::Weighted(vec![1000, 1001])));
    }

    #[test]
    fn least_connection_plans_follow_the_load() {
        let mut d = dests(&[1, 1, 1]);
        d[0].active = 5;
        d[1].active = 5;
        // New connections go to the idle one.
        assert_eq!(plan("lc", &[], &d), Ok(Plan::Weighted(vec![0, 0, 1])));
        assert_eq!(plan("nq", &[], &d), Ok(Plan::Weighted(vec![0, 0, 1])));
        assert_eq!(plan("sed", &[], &d), Ok(Plan::Weighted(vec![0, 0, 1])));
        assert_eq!(plan("wlc", &[], &d), Ok(Plan::Weighted(vec![0, 0, 1])));
        // lc counts an active connection as 256 inactive ones.
        d[2].inactive = 1279;
        assert_eq!(plan("lc", &[], &d), Ok(Plan::Weighted(vec![0, 0, 1])));
        d[2].inactive = 1280;
        assert_eq!(plan("lc", &[], &d), Ok(Plan::Weighted(vec![1, 1, 1])));
        d[2].inactive = 1281;
        assert_eq!(plan("lc", &[], &d), Ok(Plan::Weighted(vec![1, 1, 0])));
        // Idle, weights 3:1: wlc shares 3:1; sed sends to the heavier
        // until (a+1)/3 exceeds (b+1)/1; nq to every idle one.
        assert_eq!(plan("wlc", &[], &dests(&[3, 1])), Ok(Plan::Weighted(vec![3, 1])));
        assert_eq!(plan("sed", &[], &dests(&[3, 1])), Ok(Plan::Weighted(vec![1, 0])));
        assert_eq!(plan("nq", &[], &dests(&[3, 1])), Ok(Plan::Weighted(vec![3, 1])));
        let mut d = dests(&[3, 1]);
        d[0].active = 2;
        // sed: (2+1)/3 = 1 ties (0+1)/1 = 1.
        assert_eq!(plan("sed", &[], &d), Ok(Plan::Weighted(vec![3, 1])));
        // Weight 0 is never a candidate, however idle.
        let d = dests(&[0, 1]);
        assert_eq!(plan("lc", &[], &d), Ok(Plan::Weighted(vec![0, 1])));
    }

    #[test]
    fn slot_plans() {
        let Ok(Plan::Slots(t)) = plan("sh", &[], &dests(&[1, 1])) else { panic!() };
        assert_eq!((t.rows, t.cols, t.field), (8, 32, HashField::Source));
        let Ok(Plan::Slots(t)) = plan("dh", &[], &dests(&[1, 0, 1])) else { panic!() };
        assert_eq!(t.field, HashField::Destination);
        assert!(t.slots.iter().all(|&s| s != 1), "weight 0 holds no slot");
        let Ok(Plan::Slots(t)) = plan("maglev", &[("table-size".into(), "31".into())], &dests(&[1, 1])) else {
            panic!()
        };
        assert_eq!((t.rows, t.cols), (1, 31));
        let Ok(Plan::Slots(t)) = plan("mh", &[], &dests(&[1, 1, 1])) else { panic!() };
        assert_eq!((t.rows, t.cols), (8, 32));
        assert!(Plan::Slots(t).check(3).is_ok());
        let Ok(Plan::Slots(t)) = plan("maglev", &[], &dests(&[1, 1, 1])) else { panic!() };
        assert_eq!((t.rows, t.cols), (32, 32), "maglev's default table has 1021 entries");
    }

    #[test]
    fn ipvs_mode_plans_the_kernels_scheduler() {
        let d = dests(&[3, 0, 1]);
        let k =
            |s: &str, w: Vec<u32>, f: u8| Ok(Plan::Kernel(KernelPlan { scheduler: s.into(), weights: w, flags: f }));
        assert_eq!(plan_for(ProxyMode::Ipvs, "wrr", &[], &d), k("wrr", vec![3, 0, 1], 0));
        let fallback = [("fallback".to_string(), "true".to_string())];
        assert_eq!(plan_for(ProxyMode::Ipvs, "sh", &fallback, &d), k("sh", vec![3, 0, 1], 1));
        let e = plan_for(ProxyMode::Ipvs, "random", &[], &d).unwrap_err();
        assert!(e.contains("random is not an IPVS scheduler") && e.contains("ipvs mode"), "{e}");
        // mh and maglev: the very table the other modes run.
        for name in ["mh", "maglev"] {
            let ipvs = plan_for(ProxyMode::Ipvs, name, &[], &d).unwrap();
            assert!(matches!(ipvs, Plan::Slots(_)), "{name}: {ipvs:?}");
            assert_eq!(Ok(ipvs), plan_for(ProxyMode::Nftables, name, &[], &d), "{name}");
        }
        assert!(plan_for(ProxyMode::Ipvs, "rr", &fallback, &d).is_err());
        // The other modes take their own plans, and refuse what only IPVS does.
        assert!(matches!(plan_for(ProxyMode::Nftables, "sh", &[], &d), Ok(Plan::Slots(_))));
        assert!(plan_for(ProxyMode::Nftables, "sh", &fallback, &d).unwrap_err().contains("\"fallback\""));
    }

    #[test]
    fn bad_names_and_parameters_say_what_is_wrong() {
        let e = plan("nope", &[], &dests(&[1])).unwrap_err();
        assert!(e.contains("\"nope\"") && e.contains("maglev"), "{e}");
        let e = plan("rr", &[("seed".into(), "1".into())], &dests(&[1])).unwrap_err();
        assert!(e.contains("rr has no parameter \"seed\""), "{e}");
        let e = plan("maglev", &[("table-size".into(), "1024".into())], &dests(&[1])).unwrap_err();
        assert!(e.contains("table-size=\"1024\""), "{e}");
        assert!(plan("rr", &[], &dests(&[0, 0])).unwrap_err().contains("positive weight"));
    }

    #[test]
    fn weights_scale_into_what_modes_hold() {
        assert_eq!(scale_weights(&[6, 3, 0]), vec![2, 1, 0]);
        let big = scale_weights(&[65535, 1, 30000]);
        assert!(big.iter().map(|&w| u64::from(w)).sum::<u64>() <= u64::from(MAX_WEIGHT_SUM));
        assert!(big[1] >= 1 && big[0] > big[2]);
        assert_eq!(scale_weights(&[7; 5000]), vec![1; 5000]);
        let mut many: Vec<u32> = (0..5000).map(|i| 1 + i % 3).collect();
        many[0] = 0;
        let scaled = scale_weights(&many);
        assert_eq!((scaled[0], scaled[1], scaled.iter().sum::<u32>()), (0, 1, 4999));
    }
}
