//! Typed rules: what a backend returns and what the host writes. A plugin
//! never produces kernel syntax; it builds these values (which mirror the
//! WIT types of `kpx:proxier@0.2.0`), the host checks them against the
//! state and alone renders them as iptables-restore text or nf_tables
//! netlink messages. Variants marked "host only" cannot be expressed
//! through the contract: they exist for the rules the host writes itself.

pub mod extension;
pub mod iptables;
pub mod ipvs;
pub mod nftables;

use std::fmt;

/// A backend's output for its mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ruleset {
    Iptables(iptables::Ruleset),
    Nftables(nftables::Transaction),
    Ipvs(ipvs::Ruleset),
}

impl Ruleset {
    /// Rules, chains, sets and element batches: the size a render is
    /// reported in.
    pub fn len(&self) -> usize {
        match self {
            Ruleset::Iptables(r) => r.len(),
            Ruleset::Nftables(t) => t.len(),
            Ruleset::Ipvs(r) => r.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Connection-tracking states, as a set (bits 0-6; no value has others).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CtStates(u8);

/// Through [`CtStates::from_bits`], as every value is made.
#[cfg(feature = "arbitrary")]
impl<'a> arbitrary::Arbitrary<'a> for CtStates {
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(CtStates::from_bits(u.arbitrary()?))
    }
}

impl CtStates {
    pub const INVALID: CtStates = CtStates(1);
    pub const NEW: CtStates = CtStates(1 << 1);
    pub const ESTABLISHED: CtStates = CtStates(1 << 2);
    pub const RELATED: CtStates = CtStates(1 << 3);
    pub const UNTRACKED: CtStates = CtStates(1 << 4);
    pub const SNAT: CtStates = CtStates(1 << 5);
    pub const DNAT: CtStates = CtStates(1 << 6);

    /// Every state, in the order iptables-save prints them.
    pub const ALL: [(CtStates, &'static str); 7] = [
        (CtStates::INVALID, "INVALID"),
        (CtStates::NEW, "NEW"),
        (CtStates::RELATED, "RELATED"),
        (CtStates::ESTABLISHED, "ESTABLISHED"),
        (CtStates::UNTRACKED, "UNTRACKED"),
        (CtStates::SNAT, "SNAT"),
        (CtStates::DNAT, "DNAT"),
    ];

    pub const fn empty() -> CtStates {
        CtStates(0)
    }

    pub const fn bits(self) -> u8 {
        self.0
    }

    pub const fn from_bits(bits: u8) -> CtStates {
        CtStates(bits & 0x7f)
    }

    pub const fn union(self, other: CtStates) -> CtStates {
        CtStates(self.0 | other.0)
    }

    pub fn contains(self, other: CtStates) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn intersects(self, other: CtStates) -> bool {
        self.0 & other.0 != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for CtStates {
    type Output = CtStates;
    fn bitor(self, rhs: CtStates) -> CtStates {
        self.union(rhs)
    }
}

impl fmt::Display for CtStates {
    /// iptables-save's spelling: `RELATED,ESTABLISHED`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = CtStates::ALL.iter().filter(|(s, _)| self.contains(*s)).map(|(_, n)| *n).collect();
        f.write_str(&names.join(","))
    }
}

/// Free text a plugin may put in a comment, made safe: characters outside
/// printable ASCII, `"` and `\` become `_`, and at most `max` bytes are
/// kept. Every comment the host writes goes through this.
pub fn sanitize_comment(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max));
    push_sanitized_comment(&mut out, text, max);
    out
}

/// [`sanitize_comment`], appended to `out`.
pub fn push_sanitized_comment(out: &mut String, text: &str, max: usize) {
    // Every character written is one byte: at most `max` characters.
    out.extend(text.chars().take(max).map(|c| if (' '..='~').contains(&c) && c != '"' && c != '\\' { c } else { '_' }));
}

/// Why a comment is refused, if it is: comments are printable ASCII
/// without `"` and `\`, at most `max` bytes (the host still sanitizes
/// what it writes, as a second line).
pub fn comment_problem(text: &str, max: usize) -> Option<String> {
    if !text.chars().all(|c| (' '..='~').contains(&c) && c != '"' && c != '\\') {
        return Some("a comment has printable ASCII only, without \" or \\".into());
    }
    if text.len() > max {
        return Some(format!("a comment has at most {max} bytes"));
    }
    None
}

/// upstream's `%0.10f` of `1/n`, in the kernel's units of 2^-31: the
/// probability kube-proxy gives the i-th of n endpoints (n = remaining).
pub fn probability_one_in(n: usize) -> u32 {
    let text = format!("{:.10}", 1.0 / n.max(1) as f64);
    let p: f64 = text.parse().unwrap_or(0.0);
    probability_units(p)
}

/// A probability in [0, 1] in units of 2^-31 (xt_statistic's `lround`).
pub fn probability_units(p: f64) -> u32 {
    (p.clamp(0.0, 1.0) * f64::from(1u32 << 31)).round() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_are_printable_ascii_without_quotes() {
        assert_eq!(sanitize_comment("ns/svc:p80 cluster IP", 255), "ns/svc:p80 cluster IP");
        assert_eq!(sanitize_comment("a\"b\\c\nd;é", 255), "a_b_c_d;_");
        assert_eq!(sanitize_comment(&"x".repeat(300), 255).len(), 255);
    }

    #[test]
    fn probabilities_as_upstream_writes_them() {
        // iptables-save prints 715827883 / 2^31 as 0.33333333349.
        assert_eq!(probability_one_in(3), 715_827_883);
        assert_eq!(probability_one_in(2), 1 << 30);
        assert_eq!(probability_one_in(1), 1 << 31);
    }

    #[test]
    fn ct_states_print_in_iptables_order() {
        assert_eq!((CtStates::ESTABLISHED | CtStates::RELATED).to_string(), "RELATED,ESTABLISHED");
        assert_eq!(
            (CtStates::DNAT | CtStates::ESTABLISHED | CtStates::RELATED).to_string(),
            "RELATED,ESTABLISHED,DNAT"
        );
    }
}
