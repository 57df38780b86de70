//! kpx's fuzz targets: each reads bytes kpx does not control, the way kpx
//! reads them, and panics only on a broken promise (a crash, a hang shows
//! as a timeout, a property below). `cargo xtask fuzz` runs them under
//! libFuzzer with coverage; `tests/corpora.rs` runs every committed input
//! and a short seeded mutation run of each, in `cargo xtask test`.
//!
//! | target           | what it reads                                                        |
//! |------------------|----------------------------------------------------------------------|
//! | `manifests`      | a manifest file: parse, then the state built from it                 |
//! | `config`         | a `--config` KubeProxyConfiguration file, applied and validated       |
//! | `api_objects`    | Services and EndpointSlices off the API server's wire (JSON lines)   |
//! | `netlink`        | a datagram from the kernel: split, then every decoder on each message |
//! | `iptables_save`  | `iptables-save` text: the reconciler's parser, then the tracer        |
//! | `iptables_words` | a hostile component's iptables ruleset, as words                     |
//! | `nftables_ops`   | a hostile component's nftables transactions, full then partial        |
#![forbid(unsafe_code)]

mod contract;
mod lab;
mod readers;
mod restore;

pub use lab::Lab;

/// A target: its name (the corpus directory's) and its function.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, by name.
pub const TARGETS: &[Target] = &[
    ("manifests", readers::manifests),
    ("config", readers::config),
    ("api_objects", readers::api_objects),
    ("netlink", readers::netlink),
    ("iptables_save", readers::iptables_save),
    ("iptables_words", contract::iptables_words),
    ("nftables_ops", contract::nftables_ops),
];

/// The target of this name.
pub fn target(name: &str) -> Option<fn(&[u8])> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

pub use contract::{words_from_bytes, words_to_bytes};
