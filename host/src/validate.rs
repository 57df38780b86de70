//! The host's check of every typed ruleset before it reaches the kernel.
//! A sandbox stops a plugin from touching the host; this stops it from
//! asking the host to write a harmful rule. The checks are on typed
//! values (the host alone renders them as kernel syntax), against the
//! state the host sent ([`Scope`]) and what earlier syncs left in the
//! kernel (each mode's `Model`). docs/SECURITY.md lists every rule.

pub mod iptables;
pub mod nftables;
pub mod scope;

pub use scope::{Counted, Destination, EndpointAddr, Scope};

/// A refused ruleset: nothing of it is written; the sync is retried in
/// full (and refused again while the plugin asks for the same thing).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugin {plugin}: ruleset refused at {at}: {reason}: {item}")]
pub struct Rejected {
    pub plugin: String,
    /// Which item: "rule 12", "operation 3", "element 7 of operation 5".
    pub at: String,
    /// The item, as the host would write it (or its typed form).
    pub item: String,
    pub reason: String,
}

/// Cuts an item's text for a log line.
fn shorten(mut text: String) -> String {
    const MAX: usize = 400;
    if text.len() > MAX {
        let mut cut = MAX;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    text
}
