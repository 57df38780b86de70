//! Per-connection choices (userspace mode, where the host relays every
//! connection and knows the exact counts): IPVS's own pickers where IPVS
//! has one (rr, wrr, lc, wlc, sed, nq, lblc, lblcr, dh, sh with its
//! fallback), the plan's slot table for mh and maglev (the endpoint every
//! other mode gives the client), a weighted draw for random.
//!
//! State (rr's turn, lblc's table, the hashing tables) is kept per service
//! port, and rebuilt when its scheduler, the candidates, their weights or
//! the parameters change. Candidates that already failed the connection
//! are taken as unavailable.

use std::collections::HashMap;

use crate::ipvs::{Lblc, Lblcr, Lc, Nq, Rr, Sed, Wlc, Wrr};
use crate::tables::{Dh, Sh, dh_table, sh_table};
use crate::{Connection, Dest, Picker, Plan};

/// What a picker was built for: the candidates, their weights, the
/// parameters.
type Fingerprint = (Vec<(std::net::IpAddr, u16, u32)>, Vec<(String, String)>);

enum Chooser {
    Picker(Box<dyn Picker + Send>),
    /// mh, maglev: the plan's table.
    Plan(Plan),
    Random,
}

struct Entry {
    name: String,
    built_for: Fingerprint,
    chooser: Chooser,
}

impl Entry {
    /// Whether it was built for this scheduler, these parameters and
    /// these candidates (compared in place: a pick allocates nothing here).
    fn fits(&self, name: &str, params: &[(String, String)], dests: &[Dest]) -> bool {
        self.name == name
            && self.built_for.1 == params
            && self.built_for.0.len() == dests.len()
            && self.built_for.0.iter().zip(dests).all(|(a, d)| *a == (d.ip, d.port, d.weight))
    }
}

/// The pickers of every service port (one scheduler each at a time).
#[derive(Default)]
pub struct Picks {
    state: HashMap<String, Entry>,
}

fn chooser(name: &str, params: &[(String, String)], dests: &[Dest]) -> Result<Chooser, String> {
    let none = |c: Chooser| {
        if params.is_empty() { Ok(c) } else { Err(format!("{name} takes no parameters ({:?} given)", params[0].0)) }
    };
    let picker = |p: Box<dyn Picker + Send>| none(Chooser::Picker(p));
    match name {
        "rr" => picker(Box::<Rr>::default()),
        "wrr" => picker(Box::<Wrr>::default()),
        "lc" => picker(Box::new(Lc)),
        "wlc" => picker(Box::new(Wlc)),
        "sed" => picker(Box::new(Sed)),
        "nq" => picker(Box::new(Nq)),
        "lblc" => picker(Box::<Lblc>::default()),
        "lblcr" => picker(Box::<Lblcr>::default()),
        "dh" => picker(Box::new(Dh { table: dh_table(dests) })),
        // A retry needs another endpoint: sh with IPVS's fallback.
        "sh" => picker(Box::new(Sh { table: sh_table(dests), fallback: true })),
        "random" => none(Chooser::Random),
        "mh" | "maglev" => Ok(Chooser::Plan(crate::plan::plan(name, params, dests)?)),
        other => Err(format!("no scheduler is named {other:?} (built in: {})", crate::NAMES.join(", "))),
    }
}

impl Picks {
    /// The candidate (an index into `dests`) for one connection, None when
    /// no candidate may take it; `failed`: indices that already failed it;
    /// `random`: a fresh random number (random's draw).
    #[allow(clippy::too_many_arguments)]
    pub fn pick(
        &mut self,
        service: &str,
        name: &str,
        params: &[(String, String)],
        dests: &[Dest],
        failed: &[u32],
        conn: Connection,
        random: u32,
    ) -> Result<Option<usize>, String> {
        if !self.state.get(service).is_some_and(|e| e.fits(name, params, dests)) {
            let built_for: Fingerprint = (dests.iter().map(|d| (d.ip, d.port, d.weight)).collect(), params.to_vec());
            let chooser = chooser(name, params, dests)?;
            self.state.insert(service.to_string(), Entry { name: name.to_string(), built_for, chooser });
        }
        // Failed candidates count as unavailable (a copy only then).
        let copied: Vec<Dest>;
        let usable: &[Dest] = if failed.is_empty() {
            dests
        } else {
            let mut v = dests.to_vec();
            for &i in failed {
                if let Some(d) = v.get_mut(i as usize) {
                    d.weight = 0;
                }
            }
            copied = v;
            &copied
        };
        let chooser = &mut self.state.get_mut(service).expect("just built").chooser;
        Ok(match chooser {
            Chooser::Picker(p) => p.pick(usable, conn),
            Chooser::Random => {
                let total: u64 = usable.iter().map(|d| u64::from(d.weight)).sum();
                if total == 0 {
                    return Ok(None);
                }
                let mut at = (u64::from(random) * total) >> 32;
                usable.iter().position(|d| {
                    let w = u64::from(d.weight);
                    if at < w {
                        true
                    } else {
                        at -= w;
                        false
                    }
                })
            }
            Chooser::Plan(Plan::Slots(table)) => {
                let first = table.candidate_of(conn.source) as usize;
                // The table's endpoint, else the next available one.
                (0..usable.len()).map(|k| (first + k) % usable.len()).find(|&i| usable[i].available())
            }
            Chooser::Plan(_) => None,
        })
    }

    /// Forgets the service ports not in `keep` (they left the state).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.state.retain(|service, _| keep(service));
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    fn dests(weights: &[u32]) -> Vec<Dest> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| Dest::new(format!("10.244.{}.5", i + 1).parse().unwrap(), 8080, w))
            .collect()
    }

    fn conn(client: &str) -> Connection {
        Connection { source: client.parse().unwrap(), destination: "10.96.0.10".parse().unwrap() }
    }

    #[test]
    fn rr_turns_and_skips_what_failed() {
        let mut p = Picks::default();
        let d = dests(&[1, 1, 1]);
        let picks: Vec<Option<usize>> =
            (0..6).map(|_| p.pick("ns/a:80", "rr", &[], &d, &[], conn("192.0.2.1"), 0).unwrap()).collect();
        assert_eq!(picks, [Some(0), Some(1), Some(2), Some(0), Some(1), Some(2)]);
        // The next would be 0; 0 failed this connection: 1.
        assert_eq!(p.pick("ns/a:80", "rr", &[], &d, &[0], conn("192.0.2.1"), 0).unwrap(), Some(1));
        assert_eq!(p.pick("ns/a:80", "rr", &[], &d, &[0, 1, 2], conn("192.0.2.1"), 0).unwrap(), None);
    }

    #[test]
    fn lc_takes_the_exact_counts() {
        let mut p = Picks::default();
        let mut d = dests(&[1, 1, 1]);
        d[0].active = 3;
        d[1].active = 1;
        d[2].active = 2;
        assert_eq!(p.pick("ns/a:80", "lc", &[], &d, &[], conn("192.0.2.1"), 0).unwrap(), Some(1));
        d[1].active = 4;
        assert_eq!(p.pick("ns/a:80", "lc", &[], &d, &[], conn("192.0.2.1"), 0).unwrap(), Some(2));
    }

    #[test]
    fn maglev_picks_the_plans_endpoint() {
        let mut p = Picks::default();
        let d = dests(&[1, 1, 1, 1]);
        let Plan::Slots(table) = crate::plan::plan("maglev", &[], &d).unwrap() else { panic!() };
        for i in 1..50u8 {
            let client = IpAddr::from([192, 0, 2, i]);
            let c = Connection { source: client, destination: "10.96.0.10".parse().unwrap() };
            let got = p.pick("ns/m:80", "maglev", &[], &d, &[], c, 0).unwrap();
            assert_eq!(got, Some(table.candidate_of(client) as usize), "client {client}");
        }
    }

    #[test]
    fn random_draws_by_weight_and_bad_names_are_refused() {
        let mut p = Picks::default();
        let d = dests(&[3, 1]);
        let mut counts = [0usize; 2];
        for k in 0..1000u32 {
            let random = k.wrapping_mul(2_654_435_761);
            counts[p.pick("ns/r:80", "random", &[], &d, &[], conn("192.0.2.1"), random).unwrap().unwrap()] += 1;
        }
        assert!((700..=800).contains(&counts[0]), "3:1 gave {counts:?}");
        assert!(p.pick("ns/r:80", "nope", &[], &d, &[], conn("192.0.2.1"), 0).unwrap_err().contains("nope"));
        let bad = [("x".to_string(), "1".to_string())];
        assert!(p.pick("ns/r:80", "rr", &bad, &d, &[], conn("192.0.2.1"), 0).is_err());
    }
}
