//! What the host writes itself in iptables mode: kube-proxy's top-level
//! chains, the jumps to them from the built-in chains, and every rule that
//! is not about one Service (upstream's names and comments). A plugin's
//! rules go between these, into the hooks.

use kpx_rules::model::{IpFamily, NodePortAddresses, Settings};
use kpx_rules::ops::CtStates;
use kpx_rules::ops::iptables::{
    AddressMatch, FIREWALL_CHAIN, HOST_CHAINS, MARK_MASQ_CHAIN, Match, Rule, Table, Target,
};

/// The host's part of the ruleset for one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Chains the host declares (flushes) on every sync.
    pub chains: Vec<(Table, &'static str)>,
    /// Rules before the plugin's (host-only chains).
    pub rules: Vec<Rule>,
    /// Rules after the plugin's: the jump to node ports, last in nat
    /// KUBE-SERVICES.
    pub trailing: Vec<Rule>,
    /// Jumps from built-in chains, kept with `iptables -C` / `-I`.
    pub jumps: Vec<Rule>,
}

/// Node ports answer on 127.0.0.1 (IPv4 with --iptables-localhost-nodeports,
/// when node ports listen on all local addresses or on a loopback range).
pub fn localhost_nodeports(settings: &Settings) -> bool {
    settings.family == IpFamily::V4
        && settings.localhost_nodeports
        && match &settings.nodeport_addresses {
            NodePortAddresses::All => true,
            NodePortAddresses::Only(cidrs) => cidrs.iter().any(|c| c.addr.is_loopback()),
        }
}

fn comment(text: &str) -> Match {
    Match::Comment(text.to_string())
}

fn new_connections() -> Match {
    Match::Conntrack { negate: false, states: CtStates::NEW }
}

fn jump(table: Table, from: &str, to: &str, matches: Vec<Match>) -> Rule {
    Rule::chain(table, from).with_all(matches).target(Target::HostJump(to.to_string()))
}

/// upstream's `iptablesJumpChains` (and `iptablesKubeletJumpChains` for
/// the localnet guard): the only rules kpx puts in built-in chains.
fn jumps(settings: &Settings) -> Vec<Rule> {
    use Table::{Filter, Nat};
    let external = || vec![new_connections(), comment("kubernetes externally-visible service portals")];
    let portals_new = || vec![new_connections(), comment("kubernetes service portals")];
    let firewall = || vec![new_connections(), comment("kubernetes load balancer firewall")];
    let mut out = vec![
        jump(Filter, "INPUT", "KUBE-EXTERNAL-SERVICES", external()),
        jump(Filter, "FORWARD", "KUBE-EXTERNAL-SERVICES", external()),
        jump(Filter, "INPUT", "KUBE-NODEPORTS", vec![comment("kubernetes health check service ports")]),
        jump(Filter, "FORWARD", "KUBE-SERVICES", portals_new()),
        jump(Filter, "OUTPUT", "KUBE-SERVICES", portals_new()),
        jump(Filter, "FORWARD", "KUBE-FORWARD", vec![comment("kubernetes forwarding rules")]),
        jump(Filter, "INPUT", "KUBE-PROXY-FIREWALL", firewall()),
        jump(Filter, "OUTPUT", "KUBE-PROXY-FIREWALL", firewall()),
        jump(Filter, "FORWARD", "KUBE-PROXY-FIREWALL", firewall()),
        jump(Nat, "OUTPUT", "KUBE-SERVICES", vec![comment("kubernetes service portals")]),
        jump(Nat, "PREROUTING", "KUBE-SERVICES", vec![comment("kubernetes service portals")]),
        jump(Nat, "POSTROUTING", "KUBE-POSTROUTING", vec![comment("kubernetes postrouting rules")]),
    ];
    if localhost_nodeports(settings) {
        out.push(jump(Filter, "INPUT", FIREWALL_CHAIN, vec![]));
        out.push(jump(Filter, "OUTPUT", FIREWALL_CHAIN, vec![]));
    }
    out
}

/// The frame for these settings.
pub fn frame(settings: &Settings) -> Frame {
    use Table::{Filter, Nat};
    let mark = settings.masquerade_mark();
    let mut chains: Vec<(Table, &'static str)> = HOST_CHAINS.to_vec();
    let mut rules = Vec::new();
    if localhost_nodeports(settings) {
        chains.push((Filter, FIREWALL_CHAIN));
        rules.push(
            Rule::chain(Filter, FIREWALL_CHAIN)
                .with(comment("block incoming localnet connections"))
                .with(Match::Destination(AddressMatch { negate: false, cidr: "127.0.0.0/8".parse().expect("cidr") }))
                .with(Match::Source(AddressMatch { negate: true, cidr: "127.0.0.0/8".parse().expect("cidr") }))
                .with(Match::Conntrack {
                    negate: true,
                    states: CtStates::RELATED | CtStates::ESTABLISHED | CtStates::DNAT,
                })
                .target(Target::Drop),
        );
    }
    if !settings.conntrack_tcp_be_liberal {
        let mut drop =
            Rule::chain(Filter, "KUBE-FORWARD").with(Match::Conntrack { negate: false, states: CtStates::INVALID });
        if settings.nfacct {
            drop = drop.with(Match::Nfacct(crate::kernel::nfacct::CT_STATE_INVALID_DROPPED.to_string()));
        }
        rules.push(drop.target(Target::Drop));
    }
    rules.push(
        Rule::chain(Filter, "KUBE-FORWARD")
            .with(comment("kubernetes forwarding rules"))
            .with(Match::Mark { negate: false, value: mark, mask: mark })
            .target(Target::Accept),
    );
    rules.push(
        Rule::chain(Filter, "KUBE-FORWARD")
            .with(comment("kubernetes forwarding conntrack rule"))
            .with(Match::Conntrack { negate: false, states: CtStates::RELATED | CtStates::ESTABLISHED })
            .target(Target::Accept),
    );
    if settings.nfacct && localhost_nodeports(settings) {
        // upstream counts localhost node-port connections with a copy of
        // each node-port rule for 127.0.0.0/8; the host counts the same
        // connections here: DNATed from a loopback destination (only a
        // node port does that), first packets only (the nat table's).
        rules.push(
            Rule::chain(Nat, "KUBE-POSTROUTING")
                .with(Match::Conntrack { negate: false, states: CtStates::DNAT })
                .with(Match::ConntrackOriginalDestination("127.0.0.0/8".parse().expect("cidr")))
                .with(Match::Nfacct(crate::kernel::nfacct::LOCALHOST_NODEPORTS_ACCEPTED.to_string())),
        );
    }
    rules.push(
        Rule::chain(Nat, "KUBE-POSTROUTING")
            .with(Match::Mark { negate: true, value: mark, mask: mark })
            .target(Target::Return),
    );
    rules.push(Rule::chain(Nat, "KUBE-POSTROUTING").target(Target::SetMark { value: mark, mask: 0 }));
    rules.push(
        Rule::chain(Nat, "KUBE-POSTROUTING")
            .with(comment("kubernetes service traffic requiring SNAT"))
            .target(Target::Masquerade { random_fully: settings.masquerade_random_fully }),
    );
    rules.push(Rule::chain(Nat, MARK_MASQ_CHAIN).target(Target::SetMark { value: mark, mask: mark }));
    Frame { chains, rules, trailing: nodeports_jump(settings), jumps: jumps(settings) }
}

/// The last rules of nat KUBE-SERVICES: node ports on local addresses
/// (or on the addresses --nodeport-addresses resolved to).
fn nodeports_jump(settings: &Settings) -> Vec<Rule> {
    let comment = || comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain");
    let to = || Target::HostJump("KUBE-NODEPORTS".to_string());
    let family = settings.family;
    let NodePortAddresses::Only(only) = &settings.nodeport_addresses else {
        let except = match family {
            IpFamily::V6 => Some("::1/128"),
            IpFamily::V4 if !localhost_nodeports(settings) => Some("127.0.0.0/8"),
            IpFamily::V4 => None,
        };
        let mut rule = Rule::chain(Table::Nat, "KUBE-SERVICES")
            .with(comment())
            .with(Match::DestinationTypeLocal { negate: false });
        if let Some(except) = except {
            rule = rule.with(Match::Destination(AddressMatch { negate: true, cidr: except.parse().expect("cidr") }));
        }
        return vec![rule.target(to())];
    };
    only.iter()
        .filter(|c| c.family() == family)
        .filter(|c| !c.addr.is_loopback() || localhost_nodeports(settings))
        .map(|c| {
            Rule::chain(Table::Nat, "KUBE-SERVICES").with(comment()).with(Match::destination_ip(c.addr)).target(to())
        })
        .collect()
}
