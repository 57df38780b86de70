//! Extensions: vendors' additions to the proxy's behaviour, run beside a
//! rule mode's backend. An extension component returns what it wants
//! done to new connections to Service ports (`kpx_rules::ops::extension`);
//! the host checks it ([`crate::validate::extension`]), lays it out
//! ([`layout`]) and writes it in objects of the extension's own
//! ([`iptables`], [`nftables`]), then reads its counters for /metrics.

pub mod iptables;
pub mod layout;
pub mod nftables;
pub mod proxier;

pub use proxier::{Configured, ExtensionProxier};
