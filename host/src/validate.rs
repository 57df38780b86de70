//! The host's check of every typed ruleset before it reaches the kernel.
//! A sandbox stops a plugin from touching the host; this stops it from
//! asking the host to write a harmful rule. The checks are on typed
//! values (the host alone renders them as kernel syntax), against the
//! state the host sent ([`Scope`]) and what earlier syncs left in the
//! kernel (each mode's `Model`). docs/SECURITY.md lists every rule.

mod dense;
pub mod extension;
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

/// Most bytes of an item or reason in a refusal.
const MAX_ITEM: usize = 400;

/// An item's or reason's text for a log line: at most 400 bytes, on one
/// line ([`crate::runtime::one_line`]).
fn shorten(text: String) -> String {
    crate::runtime::one_line(&text, MAX_ITEM)
}

/// [`shorten`] of a value's `Debug` form, formatting no more of it than is
/// shown (an operation may hold millions of words).
fn shorten_debug(value: &impl std::fmt::Debug) -> String {
    struct Head(String);
    impl std::fmt::Write for Head {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let room = (MAX_ITEM + 1).saturating_sub(self.0.len());
            let mut take = s.len().min(room);
            while !s.is_char_boundary(take) {
                take -= 1;
            }
            self.0.push_str(&s[..take]);
            if take < s.len() { Err(std::fmt::Error) } else { Ok(()) }
        }
    }
    let mut head = Head(String::new());
    let _ = std::fmt::write(&mut head, format_args!("{value:?}"));
    shorten(head.0)
}
#[cfg(test)]
mod tests {
    #[test]
    fn a_huge_item_is_formatted_no_further_than_shown() {
        let words: Vec<u32> = (0..5_000_000).collect();
        let t = std::time::Instant::now();
        let s = super::shorten_debug(&words);
        assert!(s.starts_with("[0, 1, 2") && s.ends_with("...") && s.len() <= 410, "{s}");
        assert!(t.elapsed() < std::time::Duration::from_millis(100), "formatting took {:?}", t.elapsed());
    }

    #[test]
    fn text_from_a_plugin_stays_on_one_line() {
        let s = super::shorten(format!("a\nb\r\u{1b}[31m{}", "x".repeat(1000)));
        assert!(s.starts_with("a\\nb\\r\\u{1b}[31m") && !s.contains('\n') && !s.contains('\u{1b}'), "{s}");
        assert!(s.len() <= 410 && s.ends_with("..."));
    }
}
