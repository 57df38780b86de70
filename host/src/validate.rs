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

/// An item's or reason's text for a log line: control characters escaped
/// (a plugin's text cannot start a line of its own in kpx's log), cut to
/// 400 bytes.
fn shorten(text: String) -> String {
    const MAX: usize = 400;
    let mut out = String::with_capacity(text.len().min(MAX) + 3);
    for c in text.chars() {
        if out.len() >= MAX {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn text_from_a_plugin_stays_on_one_line() {
        let s = super::shorten(format!("a\nb\r\u{1b}[31m{}", "x".repeat(1000)));
        assert!(s.starts_with("a\\nb\\r\\u{1b}[31m") && !s.contains('\n') && !s.contains('\u{1b}'), "{s}");
        assert!(s.len() <= 410 && s.ends_with("..."));
    }
}
