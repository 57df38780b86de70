//! iptables rules as typed values (WIT `kpx:proxier/iptables`).

pub mod words;

use std::net::IpAddr;

use super::CtStates;
use crate::model::{Cidr, Protocol};

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    Nat,
    Filter,
}

impl Table {
    pub const ALL: [Table; 2] = [Table::Filter, Table::Nat];

    pub fn name(self) -> &'static str {
        match self {
            Table::Nat => "nat",
            Table::Filter => "filter",
        }
    }

    pub fn from_name(name: &str) -> Option<Table> {
        match name {
            "nat" => Some(Table::Nat),
            "filter" => Some(Table::Filter),
            _ => None,
        }
    }
}

/// The host's chains a plugin appends rules to (attachment points).
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hook {
    NatServices,
    NatNodePorts,
    FilterServices,
    FilterExternalServices,
    FilterNodePorts,
    FilterFirewall,
}

impl Hook {
    pub const ALL: [Hook; 6] = [
        Hook::NatServices,
        Hook::NatNodePorts,
        Hook::FilterServices,
        Hook::FilterExternalServices,
        Hook::FilterNodePorts,
        Hook::FilterFirewall,
    ];

    pub fn table(self) -> Table {
        match self {
            Hook::NatServices | Hook::NatNodePorts => Table::Nat,
            _ => Table::Filter,
        }
    }

    pub fn chain(self) -> &'static str {
        match self {
            Hook::NatServices | Hook::FilterServices => "KUBE-SERVICES",
            Hook::NatNodePorts | Hook::FilterNodePorts => "KUBE-NODEPORTS",
            Hook::FilterExternalServices => "KUBE-EXTERNAL-SERVICES",
            Hook::FilterFirewall => "KUBE-PROXY-FIREWALL",
        }
    }

    /// The hook a (table, chain) names, if any.
    pub fn of(table: Table, chain: &str) -> Option<Hook> {
        Hook::ALL.into_iter().find(|h| h.table() == table && h.chain() == chain)
    }
}

/// Chains the host declares and fills itself, by table (hooks included).
pub const HOST_CHAINS: &[(Table, &str)] = &[
    (Table::Nat, "KUBE-SERVICES"),
    (Table::Nat, "KUBE-NODEPORTS"),
    (Table::Nat, "KUBE-POSTROUTING"),
    (Table::Nat, "KUBE-MARK-MASQ"),
    (Table::Filter, "KUBE-SERVICES"),
    (Table::Filter, "KUBE-EXTERNAL-SERVICES"),
    (Table::Filter, "KUBE-FORWARD"),
    (Table::Filter, "KUBE-NODEPORTS"),
    (Table::Filter, "KUBE-PROXY-FIREWALL"),
];

/// Chains the host declares and fills in ipvs mode besides those above
/// (upstream's ipvs proxier; no plugin writes iptables rules there).
pub const IPVS_HOST_CHAINS: &[(Table, &str)] = &[
    (Table::Nat, "KUBE-NODE-PORT"),
    (Table::Nat, "KUBE-LOAD-BALANCER"),
    (Table::Filter, "KUBE-NODE-PORT"),
    (Table::Filter, "KUBE-SOURCE-RANGES-FIREWALL"),
    (Table::Filter, "KUBE-IPVS-FILTER"),
    (Table::Filter, "KUBE-IPVS-OUT-FILTER"),
    (Table::Nat, "KPX-IPVS-SLOTS"),
];

/// Chains the host declares and fills in userspace mode (upstream's
/// userspace proxier's, and kpx's refusal of ports without endpoints).
pub const USERSPACE_HOST_CHAINS: &[(Table, &str)] = &[
    (Table::Nat, "KUBE-PORTALS-CONTAINER"),
    (Table::Nat, "KUBE-PORTALS-HOST"),
    (Table::Nat, "KUBE-NODEPORT-CONTAINER"),
    (Table::Nat, "KUBE-NODEPORT-HOST"),
    (Table::Filter, "KUBE-NODEPORT-NON-LOCAL"),
    (Table::Filter, "KPX-PORTALS-REJECT"),
];

/// Whether a chain is one the host declares in some mode.
pub fn is_host_chain(chain: &str) -> bool {
    chain == FIREWALL_CHAIN
        || HOST_CHAINS.iter().chain(IPVS_HOST_CHAINS).chain(USERSPACE_HOST_CHAINS).any(|(_, c)| *c == chain)
}

/// The localnet guard, declared only when localhost node ports are on.
pub const FIREWALL_CHAIN: &str = "KUBE-FIREWALL";
/// The host chain that sets the masquerade mark.
pub const MARK_MASQ_CHAIN: &str = "KUBE-MARK-MASQ";

/// Prefixes of a plugin's own chains: upstream's per-service and
/// per-endpoint chains.
pub const OWN_CHAIN_PREFIXES: [&str; 5] = ["KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"];

/// iptables' longest chain name (XT_EXTENSION_MAXNAMELEN - 1).
pub const MAX_CHAIN_NAME: usize = 28;

/// Why an own chain's name is refused, if it is.
pub fn own_chain_name_problem(name: &str) -> Option<String> {
    let Some(prefix) = OWN_CHAIN_PREFIXES.iter().find(|p| name.starts_with(*p)) else {
        return Some(format!("an own chain's name starts with one of {}", OWN_CHAIN_PREFIXES.join(", ")));
    };
    let rest = &name[prefix.len()..];
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()) {
        return Some("after its prefix, an own chain's name has only A-Z and 0-9".into());
    }
    if name.len() > MAX_CHAIN_NAME {
        return Some(format!("chain names have at most {MAX_CHAIN_NAME} bytes"));
    }
    None
}

/// Why an interface name is refused, if it is.
pub fn interface_name_problem(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > 15 {
        return Some("interface names have 1 to 15 bytes".into());
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b)) {
        return Some("interface names have only A-Z, a-z, 0-9 and . _ @ -".into());
    }
    None
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AddressMatch {
    pub negate: bool,
    pub cidr: Cidr,
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InterfaceMatch {
    pub negate: bool,
    pub name: String,
    /// `NAME+`: every interface whose name starts with NAME.
    pub prefix: bool,
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HashTuple {
    Source,
    Destination,
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HashMark {
    pub tuple: HashTuple,
    pub modulus: u32,
    pub seed: u32,
}

/// Which of the packet's fields an ipset match looks up, in the set's
/// dimension order (`dst,dst,src`).
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SetDir {
    Src,
    Dst,
}

impl SetDir {
    pub fn as_str(self) -> &'static str {
        match self {
            SetDir::Src => "src",
            SetDir::Dst => "dst",
        }
    }
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Match {
    Source(AddressMatch),
    Destination(AddressMatch),
    InInterface(InterfaceMatch),
    Protocol(Protocol),
    /// `-m PROTO --dport N` (the rule's protocol).
    DestinationPort(u16),
    SourceTypeLocal {
        negate: bool,
    },
    DestinationTypeLocal {
        negate: bool,
    },
    Conntrack {
        negate: bool,
        states: CtStates,
    },
    Mark {
        negate: bool,
        value: u32,
        mask: u32,
    },
    /// Probability in units of 2^-31.
    StatisticRandom(u32),
    StatisticNth {
        every: u32,
        packet: u32,
    },
    RecentCheck {
        name: String,
        seconds: u32,
        reap: bool,
    },
    RecentSet {
        name: String,
    },
    /// `-m cluster --cluster-total-nodes TOTAL --cluster-local-node NODE
    /// --cluster-hash-seed SEED` (xt_cluster): the jhash of the
    /// connection's original source address with SEED, scaled into
    /// `0..TOTAL` ([`crate::plan::scale`]), is NODE - 1. The same hash as
    /// nftables' `jhash ip saddr mod TOTAL seed SEED`. (One value per
    /// match: iptables 1.8 refuses node masks above 32.)
    ClusterHash {
        total: u8,
        node: u8,
        seed: u32,
    },
    /// The slot a [`Target::HashMark`] chose: `-m mark --mark SLOT/SLOTMASK`.
    HashSlot(u32),
    Comment(String),
    /// Host only (ipvs mode): `-m set [!] --match-set NAME DIRS`: the
    /// packet's fields named by `dirs` are an entry of the ipset NAME.
    Set {
        negate: bool,
        name: String,
        dirs: Vec<SetDir>,
    },
    /// Host only (ipvs mode): `-m physdev [!] --physdev-is-in`: the packet
    /// came in through a bridge port.
    PhysdevIsIn {
        negate: bool,
    },
    /// Host only (ipvs mode): `-m ipvs --vproto P --vaddr A --vport N`:
    /// IPVS handles the packet for that virtual server.
    IpvsVirtual {
        address: IpAddr,
        protocol: Protocol,
        port: u16,
    },
    /// Host only: `-m nfacct --nfacct-name NAME`: counts the packet in an
    /// nfacct object (always matches).
    Nfacct(String),
    /// Host only: `-m conntrack --ctorigdst CIDR`: the connection's
    /// original destination (before DNAT) is in CIDR.
    ConntrackOriginalDestination(Cidr),
}

impl Match {
    /// iptables-save prints the IP header matches first, in this order;
    /// module matches follow in the order given.
    fn header_rank(&self) -> u8 {
        match self {
            Match::Source(_) => 0,
            Match::Destination(_) => 1,
            Match::InInterface(_) => 2,
            Match::Protocol(_) => 3,
            _ => 4,
        }
    }

    /// `-d IP/32` (or /128).
    pub fn destination_ip(ip: IpAddr) -> Match {
        Match::Destination(AddressMatch { negate: false, cidr: Cidr::host(ip) })
    }

    pub fn source_ip(ip: IpAddr) -> Match {
        Match::Source(AddressMatch { negate: false, cidr: Cidr::host(ip) })
    }

    pub fn comment(text: impl Into<String>) -> Match {
        Match::Comment(text.into())
    }
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    None,
    Accept,
    Drop,
    Reject,
    Return,
    Jump(String),
    Goto(String),
    /// `-j KUBE-MARK-MASQ`.
    MarkForMasquerade,
    Dnat(IpAddr, u16),
    HashMark(HashMark),
    /// Host only: `-j MASQUERADE [--random-fully]`.
    Masquerade {
        random_fully: bool,
    },
    /// Host only: `-j MARK --set-xmark VALUE/MASK` (mark = mark & !MASK ^ VALUE).
    SetMark {
        value: u32,
        mask: u32,
    },
    /// Host only: a jump to a host chain.
    HostJump(String),
    /// Host only (userspace mode): `-j REDIRECT --to-ports N`, to a port
    /// the host itself listens on.
    Redirect(u16),
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    pub table: Table,
    pub chain: String,
    pub matches: Vec<Match>,
    pub target: Target,
}

impl Rule {
    /// A rule in a hook.
    pub fn hook(hook: Hook) -> Rule {
        Rule { table: hook.table(), chain: hook.chain().to_string(), matches: Vec::new(), target: Target::None }
    }

    /// A rule in a chain.
    pub fn chain(table: Table, chain: &str) -> Rule {
        Rule { table, chain: chain.to_string(), matches: Vec::new(), target: Target::None }
    }

    /// Adds a match where iptables-save will print it: header matches in
    /// their fixed order before module matches, modules in the order added.
    pub fn with(mut self, m: Match) -> Rule {
        let rank = m.header_rank();
        let at = self.matches.iter().position(|x| x.header_rank() > rank).unwrap_or(self.matches.len());
        self.matches.insert(at, m);
        self
    }

    pub fn with_all(mut self, ms: impl IntoIterator<Item = Match>) -> Rule {
        for m in ms {
            self = self.with(m);
        }
        self
    }

    pub fn target(mut self, target: Target) -> Rule {
        self.target = target;
        self
    }

    pub fn jump(self, chain: &str) -> Rule {
        self.target(Target::Jump(chain.to_string()))
    }

    /// The same rule as the kernel gives it back: matches in iptables-save's
    /// order (header matches first, the rest as given), and without address
    /// matches on /0, which match everything and which iptables drops.
    pub fn canonical(mut self) -> Rule {
        self.matches
            .retain(|m| !matches!(m, Match::Source(a) | Match::Destination(a) if !a.negate && a.cidr.prefix_len == 0));
        self.matches.sort_by_key(Match::header_rank);
        self
    }

    /// The rule's protocol match, if any.
    pub fn protocol(&self) -> Option<Protocol> {
        self.matches.iter().find_map(|m| match m {
            Match::Protocol(p) => Some(*p),
            _ => None,
        })
    }
}

/// One sync's typed rules (see the WIT docs of `iptables.ruleset`).
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    pub chains: Vec<(Table, String)>,
    pub rules: Vec<Rule>,
    pub delete_chains: Vec<(Table, String)>,
    /// A partial render's hooks that keep the rules the last sync left.
    pub kept_hooks: Vec<Hook>,
}

impl Ruleset {
    /// Declares (creates or flushes) an own chain.
    pub fn declare(&mut self, table: Table, chain: &str) {
        self.chains.push((table, chain.to_string()));
    }

    pub fn push(&mut self, rule: Rule) {
        self.rules.push(rule);
    }

    pub fn delete(&mut self, table: Table, chain: &str) {
        self.delete_chains.push((table, chain.to_string()));
    }

    /// Rules plus chains: what a ruleset's size is counted in.
    pub fn len(&self) -> usize {
        self.chains.len() + self.rules.len() + self.delete_chains.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
