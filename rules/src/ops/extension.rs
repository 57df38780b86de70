//! An extension's rules (`kpx:proxier/extension`): new connections to a
//! Service port, where in their path, which of them, and what happens.
//! There is nothing here to name a chain, a table or a destination: the
//! host derives the objects and the destination matches from the state.

use crate::model::Cidr;

/// Where in a new connection's path a rule applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Attachment {
    /// Before kube-proxy chooses an endpoint (every destination of the port).
    BeforeDispatch,
    /// After kube-proxy chose one (the connection was destination-NATed).
    Service,
    /// At the firewall check: the port's load-balancer IPs only.
    Firewall,
}

impl Attachment {
    pub const ALL: [Attachment; 3] = [Attachment::Firewall, Attachment::BeforeDispatch, Attachment::Service];

    /// The contract's name.
    pub fn name(self) -> &'static str {
        match self {
            Attachment::BeforeDispatch => "before-dispatch",
            Attachment::Service => "service",
            Attachment::Firewall => "firewall",
        }
    }
}

/// A token bucket: `per_second` new connections, bursts of `burst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rate {
    pub per_second: u32,
    pub burst: u32,
}

impl Rate {
    /// The largest rate and burst the host writes.
    pub const MAX: u32 = 1_000_000;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceMatch {
    pub negate: bool,
    pub cidr: Cidr,
}

/// What happens to the connections a rule matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// Nothing: the next rule is tried (with a counter, the rule counts).
    Continue,
    Drop,
    /// Refused (a TCP reset, or ICMP port unreachable); `service` only.
    Reject,
    /// Ends this extension's rules for the connection at this attachment:
    /// the port's later rules there are skipped, and the connection goes
    /// on through kube-proxy's rules (and any other extension's) as if
    /// the extension had none. It never lets a connection past anything
    /// but the extension's own rules (kpx:proxier 0.4.0).
    Accept,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rule {
    pub attachment: Attachment,
    /// A service-port key of the state.
    pub service: String,
    pub source: Option<SourceMatch>,
    pub over_rate: Option<Rate>,
    /// [a-z0-9_], 1 to [`MAX_COUNTER_NAME`] bytes.
    pub counter: Option<String>,
    pub action: Action,
}

/// The longest counter name.
pub const MAX_COUNTER_NAME: usize = 32;

/// Whether `name` may name a counter: [a-z0-9_], 1 to 32 bytes.
pub fn valid_counter_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_COUNTER_NAME
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Always an extension's whole set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    pub rules: Vec<Rule>,
}
