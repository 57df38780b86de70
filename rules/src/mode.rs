//! The proxy modes kpx runs. Below the model and the plans, which both
//! name them.

use std::fmt;

/// The proxy modes kpx runs (`--proxy-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProxyMode {
    Iptables,
    Nftables,
    Ipvs,
    /// The host relays each connection itself (a listener per service
    /// port); no backend is instantiated, schedulers pick per connection.
    Userspace,
}

impl ProxyMode {
    pub const ALL: [ProxyMode; 4] = [ProxyMode::Iptables, ProxyMode::Nftables, ProxyMode::Ipvs, ProxyMode::Userspace];

    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Iptables => "iptables",
            ProxyMode::Nftables => "nftables",
            ProxyMode::Ipvs => "ipvs",
            ProxyMode::Userspace => "userspace",
        }
    }
}

impl fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ProxyMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ProxyMode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| format!("unknown proxy mode {s:?}: want one of iptables, nftables, ipvs"))
    }
}
