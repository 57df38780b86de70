//! An extension's nftables objects: the table `kpx-<name>` of the
//! instance's family, which the host declares and hooks, and in it only
//! what the layout says. Written as one netlink batch per change; counters
//! and rate limits are named objects kept across batches (see layout.rs).
//!
//! Accept is `return` from the port chain: each base chain jumps to its
//! attachment's chain, which goes (`goto`) to the port chain, so a return
//! there comes back to the base chain, past the port's later rules, and
//! the base chain ends (its policy accepts). That is iptables' RETURN
//! (extension/iptables.rs), the same meaning in both modes. `accept`
//! would do the same today (a base chain here holds only its jump, and
//! an accept ends only this table's base chain: the packet still meets
//! every other base chain of the hook, kube-proxy's and other
//! extensions' tables included), but return says what is meant and stays
//! right if a base chain ever holds more than its jump.

use foldhash::HashSet;

use kpx_rules::model::IpFamily;
use kpx_rules::ops::extension::{Action, Attachment};
use kpx_rules::ops::nftables::{BaseChain, ChainKind, NfHook};

use super::layout::{Destination, Layout, Test};
use crate::kernel::nftables::NftablesKernel;
use crate::kernel::nftables::encode::{self, Condition, Object, TableRule, TableVerdict};
use crate::kernel::nftables::netlink::{Batch, Message};
use crate::kernel::nftables::sys::{NFT_OBJECT_COUNTER, NFT_OBJECT_LIMIT};

/// nftables' dstnat and filter priorities.
const DSTNAT: i32 = -100;
const FILTER: i32 = 0;

/// The table of extension `name`.
pub fn table_name(name: &str) -> String {
    format!("kpx-{name}")
}

/// An attachment's regular chain and the base chains that jump to it.
fn hooks(a: Attachment) -> (&'static str, &'static [BaseChain]) {
    const fn base(name: &'static str, hook: NfHook, priority: i32) -> BaseChain {
        BaseChain { name, kind: ChainKind::Filter, hook, priority }
    }
    // Before kube-proxy's firewall check (dstnat - 10) and its DNAT
    // (dstnat); the service hooks come after DNAT, just before filter.
    const FIREWALL: &[BaseChain] = &[
        base("firewall-prerouting", NfHook::Prerouting, DSTNAT - 11),
        base("firewall-output", NfHook::Output, DSTNAT - 11),
    ];
    const DISPATCH: &[BaseChain] = &[
        base("dispatch-prerouting", NfHook::Prerouting, DSTNAT - 1),
        base("dispatch-output", NfHook::Output, DSTNAT - 1),
    ];
    const SERVICE: &[BaseChain] = &[
        base("service-input", NfHook::Input, FILTER - 1),
        base("service-forward", NfHook::Forward, FILTER - 1),
        base("service-output", NfHook::Output, FILTER - 1),
    ];
    match a {
        Attachment::Firewall => ("firewall", FIREWALL),
        Attachment::BeforeDispatch => ("dispatch", DISPATCH),
        Attachment::Service => ("service", SERVICE),
    }
}

fn port_chain(id: &str) -> String {
    format!("p-{id}")
}

fn counter_object(id: &str) -> String {
    format!("c-{id}")
}

fn limit_object(id: &str) -> String {
    format!("l-{id}")
}

/// What a batch left in the table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Written {
    pub layout: Layout,
    /// Every chain, base chains included, each once, in the order written.
    chains: Vec<String>,
    /// Counter and limit objects with their kinds, each once.
    objects: Vec<(String, u32)>,
}

impl Written {
    /// What the kernel holds (an earlier process's table): its layout
    /// unknown, so the next write rewrites every chain, keeping the
    /// objects it still names (and their counts and buckets).
    pub fn held(chains: Vec<String>, objects: Vec<(String, u32)>) -> Written {
        Written { layout: Layout::default(), chains, objects }
    }
}

/// The batch that takes the table from `previous` (None: there is no
/// table) to `layout`.
pub fn messages(table: &str, family: IpFamily, layout: &Layout, previous: Option<&Written>) -> (Vec<Message>, Written) {
    let comment = format!("rules of kpx extension {}", table.trim_start_matches("kpx-"));
    let mut out = vec![encode::add_table_in(table, &comment)];
    let mut written = Written { layout: layout.clone(), ..Default::default() };
    if let Some(p) = previous {
        out.extend(p.chains.iter().map(|c| encode::flush_chain_in(table, c)));
    }
    let mut rules = Vec::new();
    for (attachment, entries) in &layout.entries {
        let (chain, bases) = hooks(*attachment);
        written.chains.push(chain.to_string());
        for b in bases {
            written.chains.push(b.name.to_string());
            out.push(encode::add_base_chain_in(table, b));
            let mut conditions = vec![Condition::New];
            if *attachment == Attachment::Service {
                conditions.push(Condition::Dnat);
            }
            // The node's own connections are seen on output; looped back
            // to it they would be seen (and counted) again.
            if matches!(b.hook, NfHook::Prerouting | NfHook::Input) {
                conditions.push(Condition::NotFromLoopback);
            }
            rules.push(TableRule {
                chain: b.name.to_string(),
                conditions,
                objects: vec![],
                verdict: TableVerdict::Jump(chain.to_string()),
                comment: None,
            });
        }
        let mut exempted = false;
        for e in entries {
            // Entries are sorted: addresses first, then node ports, before
            // which another Service's address on the node port's number
            // returns.
            if !exempted && matches!(e.destination, Destination::NodePort { .. }) {
                exempted = true;
                for (ip, proto, port) in layout.exempt.get(attachment).into_iter().flatten() {
                    rules.push(TableRule {
                        chain: chain.to_string(),
                        conditions: vec![
                            Condition::Destination { negate: false, cidr: kpx_rules::model::Cidr::host(*ip) },
                            Condition::Protocol(*proto),
                            Condition::Port(*port),
                        ],
                        objects: vec![],
                        verdict: TableVerdict::Return,
                        comment: None,
                    });
                }
            }
            let service = &layout.chains[&e.chain].service;
            let to = |mut conditions: Vec<Condition>| TableRule {
                chain: chain.to_string(),
                conditions: {
                    conditions.push(Condition::Protocol(e.protocol));
                    if *attachment != Attachment::Service {
                        conditions.push(Condition::Port(e.port));
                    } else {
                        conditions.push(Condition::OriginalPort(e.port));
                    }
                    conditions
                },
                objects: vec![],
                // A goto: one port chain per connection, even where two
                // ports share a destination.
                verdict: TableVerdict::Goto(port_chain(&e.chain)),
                comment: Some(service.clone()),
            };
            for tests in e.tests(*attachment) {
                rules.push(to(tests
                    .into_iter()
                    .map(|t| match t {
                        Test::Destination { negate, cidr } => Condition::Destination { negate, cidr },
                        Test::Local => Condition::LocalDestination,
                        Test::OriginalDestination(c) => Condition::OriginalDestination(c),
                    })
                    .collect()));
            }
        }
    }
    for (id, limit) in &layout.limits {
        let name = limit_object(id);
        out.push(encode::add_object(
            table,
            &name,
            Object::LimitOver { per_second: limit.per_second, burst: limit.burst },
        ));
        written.objects.push((name, NFT_OBJECT_LIMIT));
    }
    for id in layout.counters.keys() {
        let name = counter_object(id);
        out.push(encode::add_object(table, &name, Object::Counter));
        written.objects.push((name, NFT_OBJECT_COUNTER));
    }
    for (id, chain) in &layout.chains {
        let name = port_chain(id);
        written.chains.push(name.clone());
        for r in &chain.rules {
            let mut conditions = Vec::new();
            if let Some(s) = r.source {
                conditions.push(Condition::Source { negate: s.negate, cidr: s.cidr });
            }
            let mut objects = Vec::new();
            objects.extend(r.limit.iter().map(|l| (NFT_OBJECT_LIMIT, limit_object(l))));
            objects.extend(r.counter.iter().map(|c| (NFT_OBJECT_COUNTER, counter_object(c))));
            let verdict = match r.action {
                Action::Continue => TableVerdict::Continue,
                // Out of the extension's chains (the module's doc says why).
                Action::Accept => TableVerdict::Return,
                Action::Drop => TableVerdict::Drop,
                // A reset for TCP: not rate limited as ICMP errors are
                // (only the port's packets enter its chain).
                Action::Reject if chain.protocol == kpx_rules::model::Protocol::Tcp => TableVerdict::RejectTcpReset,
                Action::Reject => TableVerdict::Reject,
            };
            if verdict == TableVerdict::RejectTcpReset {
                // As nft itself writes `reject with tcp reset`: after a
                // TCP match (so that `nft list ruleset | nft -f` reads
                // the same rule back).
                conditions.push(Condition::Protocol(kpx_rules::model::Protocol::Tcp));
            }
            rules.push(TableRule { chain: name.clone(), conditions, objects, verdict, comment: None });
        }
    }
    // Chains before the rules that jump to them; base chains were added above.
    for c in &written.chains {
        if !hooks_base(c) {
            out.push(encode::add_chain_in(table, c));
        }
    }
    out.extend(rules.iter().map(|r| encode::add_table_rule(table, family, r)));
    if let Some(p) = previous {
        // Flushed above, so nothing refers to them any more.
        // Hashed sets of the names written: the cost is the two lists'.
        let chains: HashSet<&str> = written.chains.iter().map(String::as_str).collect();
        for c in p.chains.iter().filter(|c| !chains.contains(c.as_str())) {
            out.push(encode::delete_chain_in(table, c));
        }
        let objects: HashSet<&str> = written.objects.iter().map(|(o, _)| o.as_str()).collect();
        for (o, kind) in p.objects.iter().filter(|(o, _)| !objects.contains(o.as_str())) {
            out.push(encode::delete_object(table, o, *kind));
        }
    }
    (out, written)
}

fn hooks_base(chain: &str) -> bool {
    Attachment::ALL.iter().any(|a| hooks(*a).1.iter().any(|b| b.name == chain))
}

/// One extension's table in one family.
pub struct NftablesWriter {
    table: String,
    kernel: NftablesKernel,
    written: Option<Written>,
}

impl NftablesWriter {
    pub fn new(extension: &str, family: IpFamily) -> NftablesWriter {
        NftablesWriter { table: table_name(extension), kernel: NftablesKernel::new(family), written: None }
    }

    /// Writes `layout` unless it is what the table holds already; `full`
    /// reads the table back first and rewrites every chain (the counters
    /// and limits it still names are kept, with their state).
    pub fn write(&mut self, layout: &Layout, full: bool) -> crate::kernel::Result<bool> {
        if !full && self.written.as_ref().is_some_and(|w| &w.layout == layout) {
            return Ok(false);
        }
        let previous = match (&self.written, full) {
            (Some(w), false) => Some(w.clone()),
            _ => self.kernel.table_contents(&self.table)?.map(|t| Written::held(t.chains, t.objects)),
        };
        let (batch, written) = messages(&self.table, self.kernel.family(), layout, previous.as_ref());
        // A failed batch changed nothing: what was written stays (its
        // counters are still read).
        self.kernel.apply(&mut batch.into_iter().collect())?;
        self.written = Some(written);
        Ok(true)
    }

    /// Packets per counter object: object name to (counter id, packets).
    pub fn counters(&mut self) -> crate::kernel::Result<super::RawCounts> {
        Ok(self
            .kernel
            .counters(&self.table)?
            .into_iter()
            .filter_map(|(name, packets)| {
                let id = name.strip_prefix("c-")?.to_string();
                Some((name, (id, packets)))
            })
            .collect())
    }

    /// Deletes the table (`--cleanup`); false when there was none.
    pub fn cleanup(&mut self) -> crate::kernel::Result<bool> {
        self.written = None;
        if !self.kernel.has_table(&self.table)? {
            return Ok(false);
        }
        self.kernel.apply(&mut Batch::from_iter([encode::delete_table_in(&self.table)]))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extension::layout::build;
    use kpx_rules::model::{ProxyMode, ServicePort, Settings};
    use kpx_rules::ops::extension::{Rate, Rule, Ruleset, SourceMatch};
    use std::collections::BTreeMap;

    fn layout(counter: &str) -> Layout {
        let mut p = ServicePort::new("ns", "web", "", kpx_rules::model::Protocol::Tcp, 80);
        p.cluster_ip = Some("10.96.0.10".parse().unwrap());
        let ports = BTreeMap::from([(p.key.clone(), Box::new(p))]);
        let rule = Rule {
            attachment: Attachment::BeforeDispatch,
            service: "ns/web".into(),
            source: None,
            over_rate: Some(Rate { per_second: 5, burst: 5 }),
            counter: Some(counter.into()),
            action: Action::Drop,
        };
        let settings = Settings::new(IpFamily::V4, ProxyMode::Nftables);
        build("x", &settings, &Ruleset { rules: vec![rule] }, &ports, &Default::default())
    }

    fn whats(batch: &[Message]) -> Vec<String> {
        batch.iter().map(|m| m.what.clone()).collect()
    }

    #[test]
    fn a_rewrite_keeps_the_objects_it_still_names_and_deletes_the_rest() {
        let (first, written) = messages("kpx-x", IpFamily::V4, &layout("a"), None);
        let first = whats(&first);
        assert_eq!(first[0], "add table kpx-x");
        assert!(!first.iter().any(|w| w.starts_with("flush") || w.starts_with("delete")), "{first:?}");
        assert_eq!(first.iter().filter(|w| w.starts_with("add object")).count(), 2, "a limit and a counter: {first:?}");

        // The counter renamed: the old one deleted after the chains are
        // flushed (nothing refers to it then), the limit kept as it was
        // (re-adding an existing object leaves its state alone).
        let (next, _) = messages("kpx-x", IpFamily::V4, &layout("b"), Some(&written));
        let next = whats(&next);
        let flushed = next.iter().rposition(|w| w.starts_with("flush chain")).unwrap();
        let deleted = next.iter().position(|w| w.starts_with("delete object")).unwrap();
        assert!(flushed < deleted, "{next:?}");
        assert_eq!(next.iter().filter(|w| w.starts_with("delete object")).count(), 1, "{next:?}");
        assert!(!next.iter().any(|w| w.starts_with("delete chain")), "{next:?}");

        // What an earlier process left, read back: every chain flushed,
        // objects not named any more deleted, the named ones kept.
        let held = Written::held(
            vec!["dispatch".into(), "old-chain".into()],
            vec![("c-OLD".into(), NFT_OBJECT_COUNTER), ("l-OLD".into(), NFT_OBJECT_LIMIT)],
        );
        let (adopt, _) = messages("kpx-x", IpFamily::V4, &layout("a"), Some(&held));
        let adopt = whats(&adopt);
        for want in ["flush chain old-chain", "delete chain old-chain", "delete object c-OLD", "delete object l-OLD"] {
            assert!(adopt.iter().any(|w| w == want), "{want}: {adopt:?}");
        }
        assert!(!adopt.iter().any(|w| w == "delete chain dispatch"), "{adopt:?}");
    }

    /// An accept is a return from the port chain (with its counter when
    /// counted), never an accept: back in the base chain, which ends
    /// there, the packet goes on to every later base chain of the hook.
    #[test]
    fn an_accept_is_a_return_from_the_port_chain() {
        let mut p = ServicePort::new("ns", "web", "", kpx_rules::model::Protocol::Tcp, 80);
        p.cluster_ip = Some("10.96.0.10".parse().unwrap());
        let ports = BTreeMap::from([(p.key.clone(), Box::new(p))]);
        let cidr: kpx_rules::model::Cidr = "192.0.2.0/24".parse().unwrap();
        let rule = |counter: Option<&str>| Rule {
            attachment: Attachment::BeforeDispatch,
            service: "ns/web".into(),
            source: Some(SourceMatch { negate: false, cidr }),
            over_rate: None,
            counter: counter.map(String::from),
            action: Action::Accept,
        };
        let settings = Settings::new(IpFamily::V4, ProxyMode::Nftables);
        let rules = Ruleset { rules: vec![rule(None), rule(Some("accepted"))] };
        let layout = build("x", &settings, &rules, &ports, &Default::default());
        let (batch, _) = messages("kpx-x", IpFamily::V4, &layout, None);
        let chain = port_chain(layout.chains.keys().next().unwrap());
        let counter = counter_object(layout.counters.keys().next().unwrap());
        let want = |objects: Vec<(u32, String)>| {
            let conditions = vec![Condition::Source { negate: false, cidr }];
            let r =
                TableRule { chain: chain.clone(), conditions, objects, verdict: TableVerdict::Return, comment: None };
            encode::add_table_rule("kpx-x", IpFamily::V4, &r).attrs.buf
        };
        let written: Vec<&Vec<u8>> =
            batch.iter().filter(|m| m.what == format!("add rule to chain {chain}")).map(|m| &m.attrs.buf).collect();
        assert_eq!(written, [&want(vec![]), &want(vec![(NFT_OBJECT_COUNTER, counter)])]);
    }
}
