//! A deliberately hostile backend for kpx's sandbox tests, in both modes.
//! It behaves as the mode's built-in backend until the state holds a
//! Service named `hostile-<case>`; then its render does what the case
//! says, through the typed contract (nothing else can reach the host).
//!
//! | case        | what render does                                                     |
//! |-------------|----------------------------------------------------------------------|
//! | `trap`      | traps (`unreachable`)                                                |
//! | `loop`      | loops forever                                                        |
//! | `memory`    | allocates until the memory limit stops it                            |
//! | `huge`      | returns more output than the host copies                             |
//! | `comment`   | a comment with a quote, a newline, `;` and 300 bytes                 |
//! | `name`      | an own chain (and set) whose name is far too long                    |
//! | `scope`     | captures the node's port 22 (no Service destination)                 |
//! | `dnat`      | DNATs to 192.0.2.66:80, which is no endpoint                         |
//! | `departed`  | DNATs to an endpoint that has left the state                         |
//! | `kept`      | in partial renders, keeps what a departed endpoint had (no rewrite)  |
//! | `host`      | writes into the host's chains (INPUT / nat-prerouting) and jumps there |
//! | `interface` | matches an interface name outside the host's alphabet               |
//! | `reject`    | REJECT where the packet path is nat                                  |
//! | `affinity`  | fills a set the kernel updates, or updates a set that is no affinity set |
//! | `jumploop`  | two own chains that jump to each other (iptables: nf_tables refuses a
//! |             | reachable loop in the transaction it applies whole)                    |
//! | `keephooks` | keeps every hook and still writes rules into them (iptables)           |
//! | `empty`     | renders nothing at all: no Service is served (the host's checks confine, |
//! |             | they do not require; a hot reload's coverage trace refuses it)         |
//! | `every7`    | otherwise the built-in backend, but traps at every 7th call of an      |
//! |             | instance (reset, apply, render): a flaky plugin under load             |
//!
//! Never embedded in kpx; the tests load it with `--backend-plugin`.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kpx_rules::iptables::IptablesProxier;
use kpx_rules::ipvs::IpvsProxier;
use kpx_rules::nftables::NftablesProxier;
use kpx_sdk::ops::Ruleset;
use kpx_sdk::ops::iptables::{self as ipt, Hook, Match, Rule, Table, Target};
use kpx_sdk::ops::nftables::{self as nft, ElementWriter, HostSet, KeyType, Op, SetDecl, SetRef, VerdictKind};
use kpx_sdk::{Backend, Change, Cluster, Node, Protocol, ProxyMode, ServicePort, Settings};

enum Inner {
    Iptables(IptablesProxier),
    Nftables(NftablesProxier),
    Ipvs(IpvsProxier),
}

pub struct Hostile {
    inner: Inner,
    settings: Settings,
    node: Node,
    names: BTreeSet<String>,
    /// Each port's endpoints, and every endpoint seen since the start.
    endpoints: BTreeMap<String, Vec<(IpAddr, u16)>>,
    seen: BTreeSet<(IpAddr, u16)>,
    /// Calls of this instance (reset, apply, render), for `every7`.
    calls: u32,
}

impl Hostile {
    /// ipvs mode: a virtual server on an address no Service has
    /// (hostile-ipvs-address), a real server that is no endpoint
    /// (hostile-ipvs-real), a scheduler IPVS lacks (hostile-ipvs-scheduler),
    /// a slot table naming a real server that is not there (hostile-ipvs-slots).
    fn ipvs(&self, r: &mut kpx_sdk::ops::ipvs::Ruleset) {
        use kpx_sdk::ops::ipvs::{RealServer, VirtualServer};
        let outside = VirtualServer {
            address: IpAddr::from([8, 8, 8, 8]),
            protocol: Protocol::Udp,
            port: 53,
            scheduler: "rr".into(),
            scheduler_flags: 0,
            persistence_seconds: 0,
            reals: Vec::new(),
            slots: None,
        };
        if self.asks("ipvs-address") {
            r.services.push(outside);
        }
        if let Some(vs) = r.services.first_mut() {
            if self.asks("ipvs-real") {
                vs.reals.push(RealServer { ip: IpAddr::from([1, 1, 1, 1]), port: 443, weight: 1 });
            }
            if self.asks("ipvs-scheduler") {
                vs.scheduler = "evil".into();
            }
            if self.asks("ipvs-slots") {
                let field = kpx_sdk::HashField::Source;
                vs.slots = Some(kpx_sdk::SlotTable { field, seed: 0, rows: 1, cols: 2, slots: vec![0, 7] });
            }
        }
    }

    /// Counts a call; `every7` traps at every seventh of the instance.
    fn count_call(&mut self) {
        self.calls += 1;
        if self.calls.is_multiple_of(7) && self.asks("every7") {
            std::process::abort();
        }
    }

    /// A case the state asks for (a Service `hostile-<case>`), or the
    /// operator does (`--backend-param hostile=<case>`, as the
    /// conformance kit's tests do).
    fn asks(&self, what: &str) -> bool {
        self.names.contains(&format!("hostile-{what}")) || self.settings.extra("param.hostile") == Some(what)
    }

    fn departed(&self) -> Option<(IpAddr, u16)> {
        let now: BTreeSet<(IpAddr, u16)> = self.endpoints.values().flatten().copied().collect();
        self.seen.iter().find(|e| !now.contains(e)).copied()
    }

    fn track(&mut self, svc: &ServicePort) {
        let eps: Vec<(IpAddr, u16)> = svc.endpoints.iter().map(|e| (e.ip, e.port)).collect();
        self.seen.extend(eps.iter().copied());
        self.endpoints.insert(svc.key.clone(), eps);
        self.names.insert(svc.name.clone());
    }

    fn node_ip(&self) -> IpAddr {
        self.node.addresses.first().copied().unwrap_or_else(|| match self.settings.family {
            kpx_sdk::IpFamily::V4 => "192.168.100.1".parse().unwrap(),
            kpx_sdk::IpFamily::V6 => "fd00::1".parse().unwrap(),
        })
    }

    fn iptables(&self, rs: &mut ipt::Ruleset, full: bool) {
        let nat = |chain: &str| Rule::chain(Table::Nat, chain);
        if self.asks("huge") {
            let padding = "x".repeat(250);
            for _ in 0..40_000 {
                rs.push(nat("KUBE-SEP-HUGE").with(Match::comment(padding.clone())));
            }
        }
        if self.asks("comment") {
            rs.declare(Table::Nat, "KUBE-SEP-COMMENT");
            rs.push(
                nat("KUBE-SEP-COMMENT")
                    .with(Match::comment(format!("x\" -j ACCEPT\n-A INPUT -j DROP; {}", "y".repeat(300)))),
            );
        }
        if self.asks("name") {
            rs.declare(Table::Nat, &format!("KUBE-SEP-{}", "A".repeat(60)));
        }
        if self.asks("scope") {
            rs.push(
                Rule::hook(Hook::NatNodePorts)
                    .with(Match::Protocol(Protocol::Tcp))
                    .with(Match::DestinationPort(22))
                    .target(Target::Dnat("192.0.2.66".parse().unwrap(), 22)),
            );
            rs.push(
                Rule::hook(Hook::FilterNodePorts)
                    .with(Match::Protocol(Protocol::Tcp))
                    .with(Match::DestinationPort(22))
                    .target(Target::Drop),
            );
        }
        if self.asks("dnat") {
            rs.declare(Table::Nat, "KUBE-SEP-HOSTILE");
            rs.push(
                nat("KUBE-SEP-HOSTILE")
                    .with(Match::Protocol(Protocol::Tcp))
                    .target(Target::Dnat("192.0.2.66".parse().unwrap(), 80)),
            );
        }
        if self.asks("departed")
            && let Some((ip, port)) = self.departed()
        {
            rs.declare(Table::Nat, "KUBE-SEP-DEPARTED");
            rs.push(nat("KUBE-SEP-DEPARTED").with(Match::Protocol(Protocol::Tcp)).target(Target::Dnat(ip, port)));
        }
        if self.asks("kept") && !full {
            // Leave every own chain as the kernel has it: no rewrites, no deletes.
            rs.chains.retain(|(_, c)| c.starts_with("KUBE-SEP-KEPT"));
            rs.delete_chains.clear();
            rs.rules.retain(|r| Hook::of(r.table, &r.chain).is_some());
        }
        if self.asks("host") {
            rs.push(
                Rule::chain(Table::Filter, "INPUT")
                    .with(Match::Protocol(Protocol::Tcp))
                    .with(Match::DestinationPort(22))
                    .target(Target::Drop),
            );
            rs.push(Rule::hook(Hook::NatServices).target(Target::Jump("KUBE-POSTROUTING".into())));
        }
        if self.asks("interface") {
            rs.declare(Table::Nat, "KUBE-SEP-IFACE");
            rs.push(nat("KUBE-SEP-IFACE").with(Match::InInterface(ipt::InterfaceMatch {
                negate: false,
                name: "eth0\" -j ACCEPT".into(),
                prefix: false,
            })));
        }
        if self.asks("reject") {
            rs.declare(Table::Nat, "KUBE-SEP-REJECT");
            rs.push(nat("KUBE-SEP-REJECT").target(Target::Reject));
        }
        if self.asks("affinity") {
            rs.declare(Table::Nat, "KUBE-SEP-AFF");
            rs.push(nat("KUBE-SEP-AFF").with(Match::RecentSet { name: "SSH".into() }));
        }
        if self.asks("keephooks") {
            rs.kept_hooks = Hook::ALL.to_vec();
        }
        if self.asks("jumploop") {
            rs.declare(Table::Nat, "KUBE-SVC-LOOPA");
            rs.declare(Table::Nat, "KUBE-SVC-LOOPB");
            rs.push(nat("KUBE-SVC-LOOPA").jump("KUBE-SVC-LOOPB"));
            rs.push(nat("KUBE-SVC-LOOPB").jump("KUBE-SVC-LOOPA"));
        }
    }

    fn nftables(&self, tx: &mut nft::Transaction, full: bool) {
        let family = self.settings.family;
        if self.asks("huge") {
            let mut w = ElementWriter::new(family, SetRef::Own("huge".into()));
            for i in 0..4_000_000u32 {
                w.word(i);
            }
            tx.push(Op::AddSet(SetDecl {
                name: "huge".into(),
                key: vec![KeyType::Integer],
                data: None,
                interval: false,
                timeout_seconds: None,
                comment: None,
            }));
            tx.push(Op::AddElements(w.finish()));
        }
        if self.asks("comment") {
            tx.push(Op::AddChain("comment".into()));
            tx.push(Op::AddRule(
                nft::Rule::new("comment").comment(&format!("x\" ; flush ruleset\n# {}", "y".repeat(300))),
            ));
        }
        if self.asks("name") {
            tx.push(Op::AddChain(format!("c{}", "a".repeat(300))));
        }
        if self.asks("scope") {
            // The node's ssh port, dispatched to this plugin's chain.
            let mut w = ElementWriter::new(family, SetRef::Host(HostSet::ServiceIps));
            w.address(self.node_ip()).protocol(Protocol::Tcp).word(22).verdict(VerdictKind::Goto, Some("cluster-ip"));
            tx.push(Op::AddElements(w.finish()));
        }
        if self.asks("dnat") {
            tx.push(Op::AddChain("hostile".into()));
            tx.push(Op::AddRule(
                nft::Rule::new("hostile")
                    .with(nft::Match::Protocol { negate: false, protocol: Protocol::Tcp })
                    .verdict(nft::Verdict::Dnat("192.0.2.66".parse().unwrap(), 80)),
            ));
        }
        if self.asks("departed")
            && let Some((ip, port)) = self.departed()
        {
            tx.push(Op::AddChain("departed".into()));
            tx.push(Op::AddRule(
                nft::Rule::new("departed")
                    .with(nft::Match::Protocol { negate: false, protocol: Protocol::Tcp })
                    .verdict(nft::Verdict::Dnat(ip, port)),
            ));
        }
        if self.asks("kept") && !full {
            // Never delete an element: departed endpoints stay in the maps.
            tx.ops.retain(|op| !matches!(op, Op::DeleteElements(_)));
            tx.ops.retain(|op| !matches!(op, Op::AddElements(e) if matches!(e.set, SetRef::Own(_))));
        }
        if self.asks("host") {
            tx.push(Op::AddRule(nft::Rule::new("nat-prerouting").verdict(nft::Verdict::Drop)));
            tx.push(Op::AddChain("filter-input".into()));
        }
        if self.asks("interface") {
            tx.push(Op::AddChain("iface".into()));
            tx.push(Op::AddRule(nft::Rule::new("iface").with(nft::Match::InInterface {
                negate: false,
                name: "eth0\" accept".into(),
                prefix: false,
            })));
        }
        if self.asks("reject") {
            tx.push(Op::AddChain("rejecting".into()));
            tx.push(Op::AddRule(nft::Rule::new("rejecting").verdict(nft::Verdict::Reject)));
        }
        if self.asks("affinity") {
            tx.push(Op::AddChain("aff".into()));
            tx.push(Op::AddRule(
                nft::Rule::new("aff").statement(nft::Statement::AffinityUpdate("affinity-internal".into())),
            ));
        }
    }
}

impl Backend for Hostile {
    fn new(settings: Settings) -> Self {
        let inner = match settings.mode {
            // userspace mode instantiates no backend.
            ProxyMode::Iptables | ProxyMode::Userspace => Inner::Iptables(IptablesProxier::new(settings.clone())),
            ProxyMode::Nftables => Inner::Nftables(NftablesProxier::new(settings.clone())),
            ProxyMode::Ipvs => Inner::Ipvs(IpvsProxier::new(settings.clone())),
        };
        Hostile {
            inner,
            settings,
            node: Node::default(),
            names: Default::default(),
            endpoints: Default::default(),
            seen: Default::default(),
            calls: 0,
        }
    }

    fn reset(&mut self, node: Node, cluster: Cluster, services: Vec<ServicePort>) {
        self.count_call();
        self.names.clear();
        self.endpoints.clear();
        for s in &services {
            self.track(s);
        }
        self.node = node.clone();
        match &mut self.inner {
            Inner::Iptables(p) => p.reset(node, cluster, services),
            Inner::Nftables(p) => p.reset(node, cluster, services),
            Inner::Ipvs(p) => p.reset(node, cluster, services),
        }
    }

    fn apply(&mut self, changes: Vec<Change>) {
        self.count_call();
        for change in &changes {
            match change {
                Change::Upsert(s) => self.track(s),
                Change::Remove(key) => {
                    self.endpoints.remove(key);
                    let name = key.split('/').nth(1).unwrap_or("").split(':').next().unwrap_or("");
                    if !self.endpoints.keys().any(|k| k.split('/').nth(1).unwrap_or("").split(':').next() == Some(name))
                    {
                        self.names.remove(name);
                    }
                }
                Change::Node(n) => self.node = n.clone(),
                Change::Cluster(_) => {}
            }
        }
        match &mut self.inner {
            Inner::Iptables(p) => p.apply(changes),
            Inner::Nftables(p) => p.apply(changes),
            Inner::Ipvs(p) => p.apply(changes),
        }
    }

    fn render(&mut self, full: bool) -> Result<Ruleset, String> {
        self.count_call();
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
        let mut out = match &mut self.inner {
            Inner::Iptables(p) => p.render(full)?,
            Inner::Nftables(p) => p.render(full)?,
            Inner::Ipvs(p) => p.render(full)?,
        };
        if self.asks("empty") {
            return Ok(match out {
                Ruleset::Iptables(_) => Ruleset::Iptables(Default::default()),
                Ruleset::Nftables(_) => Ruleset::Nftables(Default::default()),
                Ruleset::Ipvs(_) => Ruleset::Ipvs(Default::default()),
            });
        }
        match &mut out {
            Ruleset::Iptables(rs) => self.iptables(rs, full),
            Ruleset::Nftables(tx) => self.nftables(tx, full),
            Ruleset::Ipvs(r) => self.ipvs(r),
        }
        Ok(out)
    }
}

kpx_sdk::export_backend!(Hostile);
