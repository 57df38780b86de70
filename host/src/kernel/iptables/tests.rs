//! What iptables mode writes: the generator's rules inside the host's
//! frame, rendered; checked against lines from upstream kube-proxy's own
//! tests (pkg/proxy/iptables/proxier_test.go, TestTracePacket).

use kpx_rules::backend::Backend;
use kpx_rules::iptables::IptablesProxier;
use kpx_rules::model::{Cluster, Endpoint, IpFamily, LocalTraffic, Node, Protocol, ProxyMode, ServicePort, Settings};
use kpx_rules::ops::Ruleset as AnyRuleset;
use kpx_rules::ops::iptables::{Rule, Ruleset, Table};

use super::frame::frame;
use super::parse::parse_dump;
use super::render::payload;
use super::*;

fn ep(ip: &str, port: u16) -> Endpoint {
    Endpoint::ready(ip.parse().unwrap(), port)
}

fn svc(ns: &str, name: &str, port_name: &str, ip: &str, port: u16, eps: Vec<Endpoint>) -> ServicePort {
    let mut s = ServicePort::new(ns, name, port_name, Protocol::Tcp, port).with_cluster_endpoints(eps);
    s.cluster_ip = Some(ip.parse().unwrap());
    s
}

fn settings() -> Settings {
    let mut settings = Settings::new(IpFamily::V4, ProxyMode::Iptables);
    settings.local_traffic = LocalTraffic::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]);
    settings.masquerade_random_fully = false;
    settings
}

fn render(settings: &Settings, services: Vec<ServicePort>) -> (Ruleset, String) {
    let mut p = IptablesProxier::new(settings.clone());
    p.reset(Node::default(), Cluster::default(), services);
    let AnyRuleset::Iptables(rs) = p.render(true).unwrap() else { panic!("not iptables") };
    let (text, _) = payload(&frame(settings), &rs, &[], dialect(settings), None);
    (rs, text)
}

/// upstream's expected lines (iptables-restore input, as its tests write
/// them), read as typed rules.
fn upstream(lines: &[&str]) -> Vec<Rule> {
    let text = format!("*nat\n{}\nCOMMIT\n", lines.join("\n"));
    let dump = parse_dump(&text, Dialect { family: IpFamily::V4, masquerade_mark: 0x4000 });
    let t = &dump.tables[&Table::Nat];
    let mut out = Vec::new();
    for lines in t.rules.values() {
        for l in lines {
            match l {
                parse::Line::Rule(r) => out.push(r.clone().canonical()),
                parse::Line::Foreign { text, reason } => panic!("{text}: {reason}"),
            }
        }
    }
    out
}

#[test]
fn the_generator_writes_upstreams_rules() {
    let (rs, _) = render(
        &settings(),
        vec![svc("ns4", "svc4", "p80", "172.30.0.44", 80, vec![ep("10.180.0.4", 80), ep("10.180.0.5", 80)])],
    );
    let svc_chain = "KUBE-SVC-4SW47YFZTEDKD3PK";
    let sep = "KUBE-SEP-UKSFD7AGPMPPLUHC";
    for (chain, want) in [
        (
            svc_chain,
            upstream(&[
                "-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment \"ns4/svc4:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.44 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ",
                "-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment \"ns4/svc4:p80 -> 10.180.0.4:80\" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-UKSFD7AGPMPPLUHC",
                "-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment \"ns4/svc4:p80 -> 10.180.0.5:80\" -j KUBE-SEP-C6EBXVWJJZMIWKLZ",
            ]),
        ),
        (
            sep,
            upstream(&[
                "-A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -s 10.180.0.4 -j KUBE-MARK-MASQ",
                "-A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.4:80",
            ]),
        ),
        (
            "KUBE-SERVICES",
            upstream(&[
                "-A KUBE-SERVICES -m comment --comment \"ns4/svc4:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK",
            ]),
        ),
    ] {
        let got: Vec<Rule> = rs.rules.iter().filter(|r| r.table == Table::Nat && r.chain == chain).cloned().collect();
        assert_eq!(got, want, "chain {chain}");
    }
    let f = frame(&settings());
    let host = upstream(&[
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
    ]);
    for rule in host {
        let mut rule = rule;
        if let kpx_rules::ops::iptables::Target::Jump(c) = &rule.target {
            rule.target = kpx_rules::ops::iptables::Target::HostJump(c.clone());
        }
        assert!(f.rules.contains(&rule), "the frame lacks {rule:?}");
    }
}

#[test]
fn the_node_port_jump_is_the_last_nat_services_rule() {
    let (_, text) = render(&settings(), vec![svc("ns", "a", "", "172.30.0.1", 80, vec![ep("10.1.0.1", 80)])]);
    let nat = text.split("*nat").nth(1).unwrap();
    let last = nat.lines().rfind(|l| l.starts_with("-A KUBE-SERVICES")).unwrap();
    assert_eq!(
        last,
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
    );
    let mut v6 = Settings::new(IpFamily::V6, ProxyMode::Iptables);
    v6.masquerade_all = true;
    let (_, text) = render(&v6, vec![svc("ns", "v6", "", "fd00::10", 80, vec![ep("fd00:1::5", 8080)])]);
    assert!(text.contains("-j DNAT --to-destination [fd00:1::5]:8080"), "{text}");
    assert!(text.contains("! -d ::1/128 -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"), "{text}");
}

#[test]
fn masquerade_bit_moves_the_mark() {
    let mut s = settings();
    s.masquerade_bit = 10;
    let (_, text) = render(&s, vec![]);
    assert!(text.contains("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x400/0x400\n"), "{text}");
    assert!(text.contains("-m mark ! --mark 0x400/0x400 -j RETURN"));
    assert!(!text.contains("0x4000"));
}

#[test]
fn tcp_be_liberal_keeps_invalid_packets() {
    let mut s = settings();
    assert!(render(&s, vec![]).1.contains("-m conntrack --ctstate INVALID -j DROP"));
    s.conntrack_tcp_be_liberal = true;
    assert!(!render(&s, vec![]).1.contains("INVALID"));
}

/// Where the node has nfacct, upstream's two counters: the INVALID drop
/// counts in ct_state_invalid_dropped_pkts, and localhost node-port
/// connections in localhost_nps_accepted_pkts (IPv4, localhost node ports on).
#[test]
fn nfacct_counts_invalid_drops_and_localhost_nodeports() {
    let mut s = settings();
    let (_, text) = render(&s, vec![]);
    assert!(!text.contains("nfacct"), "no nfacct objects, no nfacct matches:\n{text}");
    s.nfacct = true;
    let (_, text) = render(&s, vec![]);
    assert!(
        text.contains("-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP\n"),
        "{text}"
    );
    assert!(
        text.contains("-A KUBE-POSTROUTING -m conntrack --ctstate DNAT -m conntrack --ctorigdst 127.0.0.0/8 -m nfacct --nfacct-name localhost_nps_accepted_pkts\n"),
        "{text}"
    );
    s.localhost_nodeports = false;
    assert!(!render(&s, vec![]).1.contains("localhost_nps_accepted_pkts"));
}

#[test]
fn localhost_nodeports_need_the_localnet_firewall_jumps() {
    let to_firewall = |s: &Settings| {
        frame(s).jumps.iter().any(|j| j.target == kpx_rules::ops::iptables::Target::HostJump("KUBE-FIREWALL".into()))
    };
    let v4 = Settings::new(IpFamily::V4, ProxyMode::Iptables);
    assert!(to_firewall(&v4));
    let mut off = v4.clone();
    off.localhost_nodeports = false;
    assert!(!to_firewall(&off));
    assert!(!to_firewall(&Settings::new(IpFamily::V6, ProxyMode::Iptables)));
}

#[test]
fn the_payload_reads_back_as_the_same_rules() {
    let s = settings();
    let (rs, text) = render(&s, vec![svc("ns4", "svc4", "p80", "172.30.0.44", 80, vec![ep("10.180.0.4", 80)])]);
    let dump = parse_dump(&text, dialect(&s));
    for rule in &rs.rules {
        let got: Vec<&Rule> = dump.rules(rule.table, &rule.chain).collect();
        assert!(got.contains(&rule), "{rule:?} not read back from\n{text}");
    }
}

/// The `-A` and `-X` lines of payloads, and the chains they declare.
fn lines_of<'a>(texts: impl IntoIterator<Item = &'a String>) -> (Vec<String>, std::collections::BTreeSet<String>) {
    let mut rules = Vec::new();
    let mut declared = std::collections::BTreeSet::new();
    for text in texts {
        for l in text.lines() {
            if l.starts_with("-A ") || l.starts_with("-X ") {
                rules.push(l.to_string());
            } else if let Some(d) = l.strip_prefix(':') {
                declared.insert(d.split(' ').next().unwrap().to_string());
            }
        }
    }
    rules.sort();
    (rules, declared)
}

#[test]
fn many_new_or_gone_chains_are_written_in_runs_around_the_main_one() {
    let s = settings();
    let n = 2 * CHAINS_PER_RUN + 1;
    let eps: Vec<Endpoint> =
        (0..n).map(|i| ep(&format!("10.{}.{}.{}", 128 + i / 65536, (i / 256) % 256, i % 256), 8080)).collect();
    let (rs, whole) = render(&s, vec![svc("ns", "big", "p", "10.96.1.5", 80, eps)]);
    let mut scope = crate::validate::Scope::default();
    scope.count(IpFamily::V4, &svc("ns", "big", "p", "10.96.1.5", 80, Vec::new()), true);
    for i in 0..n {
        let ip = format!("10.{}.{}.{}", 128 + i / 65536, (i / 256) % 256, i % 256);
        scope.endpoints.add((ip.parse().unwrap(), 8080));
    }
    let model = Model::default();
    let ctx = Context { plugin: "test", dialect: dialect(&s), scope: &scope, model: &model, full: true };
    let p = prepare(&ctx, &s, &rs, 1 << 30, None).unwrap();
    // n + 1 new chains (the endpoints' and the Service's): created in 3
    // runs, then filled (2 rules an endpoint's chain, n jumps in the
    // Service's), before the main one; nothing after.
    let fills = (3 * n).div_ceil(CHAINS_PER_RUN);
    assert!((fills..=fills + 2).contains(&(p.before.len() - 3)), "{} runs", p.before.len());
    assert!(p.after.is_empty());
    let chains_touched = |run: &String| {
        let (rules, declared) = lines_of([run]);
        let filled: std::collections::BTreeSet<&str> = rules.iter().map(|l| l.split(' ').nth(1).unwrap()).collect();
        filled.len().max(declared.len()).max(rules.len())
    };
    assert!(p.before.iter().all(|run| chains_touched(run) <= CHAINS_PER_RUN));
    assert!(!p.text.contains(":KUBE-SEP-") && !p.text.contains("-A KUBE-SEP-"), "the main run declares no new chain");
    // Together they write what the single payload writes.
    let (split_rules, split_declared) = lines_of(p.before.iter().chain([&p.text]));
    let (whole_rules, whole_declared) = lines_of([&whole]);
    assert_eq!(split_rules, whole_rules);
    assert_eq!(split_declared, whole_declared);
    // Each run creates its chains before any is filled: a fill never
    // names a chain a later run creates.
    let created: std::collections::BTreeSet<String> = lines_of(&p.before[..3]).1;
    assert!(lines_of(&p.before[3..]).0.iter().all(|l| created.contains(l.split(' ').nth(1).unwrap())));

    // The Service goes (a partial sync deleting its chains): the main run
    // first, then runs that flush, then delete, them.
    let mut model = Model::default();
    model.commit(p.checked);
    let gone = Ruleset { delete_chains: rs.chains.clone(), ..Ruleset::default() };
    let ctx = Context { plugin: "test", dialect: dialect(&s), scope: &scope, model: &model, full: false };
    let previous = Previous { host_chains: p.host_chains, hooks: p.hooks };
    let q = prepare(&ctx, &s, &gone, 1 << 30, Some(previous)).unwrap();
    assert!(q.before.is_empty());
    assert_eq!(q.after.len(), 6);
    assert!(!q.text.contains("-X "), "{}", q.text);
    let flushed = lines_of(&q.after[..3]).1;
    let deleted: std::collections::BTreeSet<String> =
        lines_of(&q.after[3..]).0.iter().map(|l| l.trim_start_matches("-X ").to_string()).collect();
    assert_eq!(flushed.len(), n + 1);
    assert_eq!(flushed, deleted);
}

/// The same Service rendered again with one endpoint more (its n + 1
/// chains declared again, one new) in a partial sync: the chains are
/// flushed and filled in runs of their own, each run holding whole
/// chains (declared and filled together, so none is seen empty between
/// runs), no run over the limit, and the new chain created before any
/// run jumps to it.
#[test]
fn many_chains_declared_again_are_refilled_in_runs_of_whole_chains() {
    let s = settings();
    let n = 2 * CHAINS_PER_RUN + 1;
    let ip = |i: usize| format!("10.{}.{}.{}", 128 + i / 65536, (i / 256) % 256, i % 256);
    let eps = |count: usize| -> Vec<Endpoint> { (0..count).map(|i| ep(&ip(i), 8080)).collect() };
    let (rs, _) = render(&s, vec![svc("ns", "big", "p", "10.96.1.5", 80, eps(n))]);
    let (grown, whole) = render(&s, vec![svc("ns", "big", "p", "10.96.1.5", 80, eps(n + 1))]);
    let mut scope = crate::validate::Scope::default();
    scope.count(IpFamily::V4, &svc("ns", "big", "p", "10.96.1.5", 80, Vec::new()), true);
    for i in 0..=n {
        scope.endpoints.add((ip(i).parse().unwrap(), 8080));
    }
    let model = Model::default();
    let ctx = Context { plugin: "test", dialect: dialect(&s), scope: &scope, model: &model, full: true };
    let p = prepare(&ctx, &s, &rs, 1 << 30, None).unwrap();
    let mut model = Model::default();
    model.commit(p.checked);
    let ctx = Context { plugin: "test", dialect: dialect(&s), scope: &scope, model: &model, full: false };
    let previous = Previous { host_chains: p.host_chains, hooks: p.hooks };
    let q = prepare(&ctx, &s, &grown, 1 << 30, Some(previous)).unwrap();
    assert!(q.after.is_empty());
    assert!(q.before.len() >= 3, "{} runs", q.before.len());
    let created: std::collections::BTreeSet<String> =
        rs.chains.iter().map(|(_, c)| c.clone()).collect::<std::collections::BTreeSet<_>>();
    let new_chain = grown.chains.iter().map(|(_, c)| c.clone()).find(|c| !created.contains(c)).expect("a new chain");
    let declared_in = q.before.iter().position(|run| run.contains(&format!(":{new_chain} - "))).expect("created");
    let jumped_in = q.before.iter().position(|run| run.contains(&format!("-j {new_chain}")));
    assert!(
        jumped_in.is_none_or(|j| declared_in < j),
        "{new_chain} created in run {declared_in}, jumped to in {jumped_in:?}"
    );
    // The new chain's runs (created, then filled), then the refills.
    for run in &q.before[declared_in + 2..] {
        let (rules, declared) = lines_of([run]);
        let filled: std::collections::BTreeSet<String> =
            rules.iter().map(|l| l.split(' ').nth(1).unwrap().to_string()).collect();
        assert!(filled.is_subset(&declared), "a refill run fills only the chains it flushes");
        assert!(declared.len() <= CHAINS_PER_RUN);
    }
    assert!(!q.text.contains(":KUBE-SEP-"), "the main run declares none of them");
    // Together they write the own chains as the single payload does (the
    // host's chains are edited in place: left out).
    let own = |(rules, declared): (Vec<String>, std::collections::BTreeSet<String>)| {
        let is_own = |c: &str| c.starts_with("KUBE-SEP-") || c.starts_with("KUBE-SVC-");
        let rules: Vec<String> = rules.into_iter().filter(|l| is_own(l.split(' ').nth(1).unwrap_or(""))).collect();
        let declared: std::collections::BTreeSet<String> = declared.into_iter().filter(|c| is_own(c)).collect();
        (rules, declared)
    };
    let (split_rules, split_declared) = own(lines_of(q.before.iter().chain([&q.text])));
    let (whole_rules, whole_declared) = own(lines_of([&whole]));
    assert!(split_rules == whole_rules, "{} rules written in runs, {} whole", split_rules.len(), whole_rules.len());
    assert!(split_declared == whole_declared, "{} declared, {}", split_declared.len(), whole_declared.len());
}

/// A full sync over a kernel that holds the own chains as wanted (kpx
/// restarted) leaves them out of its runs; one changed by someone else,
/// or holding a line kpx does not read, is written again.
#[test]
fn a_full_sync_leaves_own_chains_held_as_wanted() {
    let s = settings();
    let d = dialect(&s);
    let services = vec![svc("ns", "web", "p", "10.96.0.10", 80, vec![ep("10.1.0.5", 8080), ep("10.1.0.6", 8080)])];
    let (rs, whole) = render(&s, services.clone());
    let sep: Vec<&(Table, String)> = rs.chains.iter().filter(|(_, c)| c.starts_with("KUBE-SEP-")).collect();
    assert_eq!(sep.len(), 2);
    // The kernel holds what one full sync wrote: every own chain as wanted.
    let held = parse_dump(&whole, d);
    let all = unchanged(&held, &rs, d);
    assert_eq!(all.len(), rs.chains.len(), "{all:?}");
    // One endpoint chain edited by hand, one with a foreign line.
    let (edited, foreign) = (&sep[0].1, &sep[1].1);
    let mut lines: Vec<String> = Vec::new();
    let mut done = false;
    for l in whole.lines() {
        if !done && l.starts_with(&format!("-A {edited} ")) {
            lines.push(l.replacen(&format!("-A {edited} "), &format!("-A {edited} -s 192.0.2.1/32 "), 1));
            done = true;
        } else {
            lines.push(l.to_string());
        }
    }
    assert!(done, "{edited} has a rule:\n{whole}");
    // The foreign line, last in nat.
    let at = lines.iter().rposition(|l| l == "COMMIT").expect("nat's COMMIT");
    lines.insert(at, format!("-A {foreign} -m nosuchmatch -j ACCEPT"));
    let text = lines.join("\n") + "\n";
    let held = parse_dump(&text, d);
    let some = unchanged(&held, &rs, d);
    assert!(!some.contains(&(Table::Nat, edited.clone())) && !some.contains(&(Table::Nat, foreign.clone())));
    assert_eq!(some.len(), rs.chains.len() - 2);
    // The full sync's runs write those two and the host's chains, none
    // of the others.
    let mut scope = crate::validate::Scope::default();
    for p in &services {
        scope.count(IpFamily::V4, p, true);
    }
    let model = Model::default();
    let ctx = Context { plugin: "test", dialect: d, scope: &scope, model: &model, full: true };
    let p = prepare_in_runs(&ctx, &s, &rs, 1 << 30, None, CHAINS_PER_RUN, &some).unwrap();
    for (_, chain) in &rs.chains {
        let declared = p.text.contains(&format!(":{chain} - [0:0]"));
        let filled = p.text.contains(&format!("-A {chain} "));
        let changed = chain == edited || chain == foreign;
        assert_eq!((declared, filled), (changed, changed), "{chain}:\n{}", p.text);
    }
    assert!(p.text.contains(":KUBE-SERVICES - [0:0]"), "the host's chains are written whole");
}

/// Records the programs it is asked to run; every run succeeds.
struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Exec for Recorder {
    fn run(&self, program: &str, _args: &[&str], _stdin: Option<&[u8]>) -> Result<String> {
        self.0.lock().unwrap().push(program.to_string());
        Ok(String::new())
    }
}

/// iptables-restore would read a line over its buffer as two: a rule that
/// renders longer than [`MAX_LINE`] is checked with `iptables -C` (its
/// words as arguments), never in the batched restore.
#[test]
fn an_over_long_rule_is_never_checked_through_iptables_restore() {
    use kpx_rules::ops::iptables::{AddressMatch, Match, Target};
    let runs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kernel = IptablesKernel::new(IpFamily::V4, Box::new(Recorder(runs.clone())));
    let d = dialect(&settings());
    let short = Rule::chain(Table::Nat, "KUBE-SVC-X").with(Match::comment("short")).target(Target::Return);
    let mut long = Rule::chain(Table::Nat, "KUBE-SVC-X");
    for i in 0..600 {
        let cidr = format!("10.{}.{}.0/24", i / 256, i % 256).parse().unwrap();
        long = long.with(Match::Destination(AddressMatch { negate: false, cidr }));
    }
    let long = long.target(Target::Return);
    assert!(rule_lines(&long, d)[0].len() > MAX_LINE);
    assert_eq!(kernel.lost_rules(&[&short], d).unwrap(), None);
    assert_eq!(*runs.lock().unwrap(), ["iptables-restore"], "a short rule: one restore");
    runs.lock().unwrap().clear();
    assert_eq!(kernel.lost_rules(&[&short, &long], d).unwrap(), None);
    assert_eq!(*runs.lock().unwrap(), ["iptables", "iptables"], "with an over-long rule: iptables -C each");
}

/// The removal of kube-proxy's chains finds jumps by their target, read
/// as iptables-save quotes words: a `-j` inside a comment is no jump.
#[test]
fn a_jump_target_is_read_past_quoted_comments() {
    use super::jump_target;
    assert_eq!(
        jump_target("OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"),
        Some("KUBE-SERVICES")
    );
    assert_eq!(
        jump_target("MYCHAIN -m comment --comment \"allow -j KUBE-SERVICES traffic\" -j ACCEPT"),
        Some("ACCEPT")
    );
    assert_eq!(jump_target("X -m comment --comment \"a \\\" -j Y\" -g KUBE-SVC-ABC"), Some("KUBE-SVC-ABC"));
    assert_eq!(jump_target("INPUT -s 192.0.2.1/32"), None);
    assert_eq!(jump_target("X -m comment --comment \"unterminated -j Y"), None);
    // The localnet guard is kubelet's too: never removed as kube-proxy's.
    assert!(!super::removable("KUBE-FIREWALL"));
    assert!(super::removable("KUBE-SERVICES") && super::removable("KUBE-SVC-ABCDEFGHIJKLMNOP"));
    assert!(!super::removable("KUBE-IPTABLES-HINT") && !super::removable("KUBE-KUBELET-CANARY"));
}

#[test]
fn a_tables_section_of_a_whole_dump() {
    let dump = "# Generated\n*mangle\n:KUBE-SERVICES - [0:0]\nCOMMIT\n*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n";
    assert_eq!(
        super::table_section(dump, "nat"),
        Some("*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j KUBE-SERVICES")
    );
    assert_eq!(super::table_section(dump, "filter"), Some("*filter\n:INPUT ACCEPT [0:0]"));
    assert_eq!(super::table_section(dump, "raw"), None);
    assert_eq!(super::table_section("*nat\nCOMMIT\n", "nat"), Some("*nat"));
}
