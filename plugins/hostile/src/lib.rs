//! A deliberately hostile backend for kpx's sandbox tests. It behaves as
//! the iptables backend until the state holds a Service whose name asks
//! for misbehaviour:
//!
//! | Service name       | what render does                                  |
//! |--------------------|---------------------------------------------------|
//! | `hostile-trap`     | traps (`unreachable`)                             |
//! | `hostile-loop`     | loops forever                                     |
//! | `hostile-memory`   | allocates until the memory limit stops it         |
//! | `hostile-foreign`  | appends an ACCEPT-all rule to the built-in INPUT  |
//! | `hostile-dnat`     | DNATs to an address that is no endpoint           |
//! | `hostile-huge`     | returns more output than the host accepts         |
//!
//! Never embedded in kpx; the tests load it with `--backend-plugin`.
#![forbid(unsafe_code)]

use kpx_rules::iptables::IptablesProxier;
use kpx_sdk::{Backend, Change, Cluster, Node, Ruleset, ServicePort, Settings};

pub struct Hostile {
    inner: IptablesProxier,
    names: std::collections::BTreeSet<String>,
}

impl Hostile {
    fn asks(&self, what: &str) -> bool {
        self.names.contains(&format!("hostile-{what}"))
    }
}

impl Backend for Hostile {
    fn new(settings: Settings) -> Self {
        Hostile { inner: IptablesProxier::new(settings), names: Default::default() }
    }

    fn reset(&mut self, node: Node, cluster: Cluster, services: Vec<ServicePort>) {
        self.names = services.iter().map(|s| s.name.clone()).collect();
        self.inner.reset(node, cluster, services);
    }

    fn apply(&mut self, changes: Vec<Change>) {
        for change in &changes {
            match change {
                Change::Upsert(s) => {
                    self.names.insert(s.name.clone());
                }
                Change::Remove(key) => {
                    let name = key.split('/').nth(1).unwrap_or("").split(':').next().unwrap_or("");
                    self.names.remove(name);
                }
                Change::Node(_) | Change::Cluster(_) => {}
            }
        }
        self.inner.apply(changes);
    }

    fn render(&mut self, full: bool) -> Result<Ruleset, String> {
        if self.asks("trap") {
            std::process::abort();
        }
        if self.asks("loop") {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        if self.asks("memory") {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(std::hint::black_box(vec![1u8; 1 << 20]));
            }
        }
        let Ruleset::Iptables(mut text) = self.inner.render(full)? else {
            return Err("inner backend is not iptables".into());
        };
        if self.asks("huge") {
            let line = "# padding padding padding padding padding padding padding padding\n";
            text = line.repeat((64 << 20) / line.len());
        }
        if self.asks("foreign") {
            text = text.replacen("COMMIT\n", "-A INPUT -j ACCEPT\nCOMMIT\n", 1);
        }
        if self.asks("dnat") {
            text = text.replacen(
                "COMMIT\n*nat\n",
                "COMMIT\n*nat\n:KUBE-SEP-HOSTILE - [0:0]\n-A KUBE-SEP-HOSTILE -p tcp -j DNAT --to-destination 192.0.2.66:80\n",
                1,
            );
        }
        Ok(Ruleset::Iptables(text))
    }
}

kpx_sdk::export_backend!(Hostile);
