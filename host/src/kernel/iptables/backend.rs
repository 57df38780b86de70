//! Which iptables kpx runs: nf_tables-backed (`iptables-nft`) or legacy
//! (`iptables-legacy`), chosen as kube-proxy's image chooses, so that
//! kpx's rules land beside kubelet's and the CNI's.
//!
//! Upstream's image (kubernetes/release `images/build/distroless-iptables`
//! at f618b2a3) installs kubernetes-sigs/iptables-wrappers tag v2
//! (e139a115), whose first iptables call decides for the container:
//!
//! 1. kubelet's marker chain (`KUBE-IPTABLES-HINT`, or the older
//!    `KUBE-KUBELET-CANARY`) in nft's `mangle` table, IPv4 or IPv6 → nft;
//! 2. the marker anywhere in legacy's tables → legacy (the whole dump:
//!    `iptables-legacy-save -t mangle` would create the table);
//! 3. more rules in legacy's tables than in nft's → legacy;
//! 4. otherwise (a tie, none at all) → nft.
//!
//! The tools' exit codes and messages are ignored there, a failed dump
//! counting as empty; so here. kpx decides once at start, in-process (the
//! wrapper's `update-alternatives` switch is the image's business, and kpx
//! names its tools itself), and logs the decision with its reason.

use kpx_rules::model::IpFamily;

use crate::kernel::{Error, Exec};

/// The iptables binaries kpx runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// `iptables`, `iptables-save`, `iptables-restore` as found on PATH:
    /// whatever the node's alternatives point them at.
    #[default]
    System,
    /// `iptables-nft`, `iptables-nft-save`, `iptables-nft-restore`.
    Nft,
    /// `iptables-legacy`, `iptables-legacy-save`, `iptables-legacy-restore`.
    Legacy,
}

impl Backend {
    /// `base` (`iptables`, `iptables-save` or `iptables-restore`) of this
    /// backend for `family`: `ip6tables-nft-restore` for (Nft, V6).
    pub fn tool(self, family: IpFamily, base: &str) -> String {
        let infix = match self {
            Backend::System => "",
            Backend::Nft => "-nft",
            Backend::Legacy => "-legacy",
        };
        let rest = base.strip_prefix("iptables").unwrap_or(base);
        let stem = match family {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        };
        if base.starts_with("iptables") { format!("{stem}{infix}{rest}") } else { base.to_string() }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Backend::System => "system",
            Backend::Nft => "nft",
            Backend::Legacy => "legacy",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the node's tables hold, as the wrapper reads them: each text is
/// the IPv4 dump followed by the IPv6 one.
#[derive(Debug, Default)]
pub struct Dumps {
    /// `iptables-nft-save -t mangle`.
    pub nft_mangle: String,
    /// `iptables-legacy-save` (every table that exists).
    pub legacy: String,
    /// `iptables-nft-save` (every table).
    pub nft: String,
}

/// The backend the dumps call for, and why (for the log).
pub fn decide(dumps: &Dumps) -> (Backend, String) {
    if let Some(chain) = marker(&dumps.nft_mangle) {
        return (Backend::Nft, format!("kubelet's {chain} chain is in iptables-nft's mangle table"));
    }
    if let Some(chain) = marker(&dumps.legacy) {
        return (Backend::Legacy, format!("kubelet's {chain} chain is in iptables-legacy's tables"));
    }
    let (legacy, nft) = (rules(&dumps.legacy), rules(&dumps.nft));
    if legacy > nft {
        (
            Backend::Legacy,
            format!("no kubelet marker chain; iptables-legacy holds more rules ({legacy}) than iptables-nft ({nft})"),
        )
    } else {
        (
            Backend::Nft,
            format!(
                "no kubelet marker chain; iptables-legacy holds no more rules ({legacy}) than iptables-nft ({nft})"
            ),
        )
    }
}

/// kubelet's marker chain declared in a save dump (a line starting
/// `:KUBE-IPTABLES-HINT` or `:KUBE-KUBELET-CANARY`, as the wrapper's
/// pattern reads).
fn marker(dump: &str) -> Option<&'static str> {
    dump.lines().find_map(|l| {
        ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"]
            .into_iter()
            .find(|m| l.strip_prefix(':').is_some_and(|rest| rest.starts_with(m)))
    })
}

/// The rules in a save dump (its lines starting with `-`).
fn rules(dump: &str) -> usize {
    dump.lines().filter(|l| l.starts_with('-')).count()
}

/// Reads the node's tables with both backends and [`decide`]s. When this
/// node does not have both backends' tools, the iptables on PATH is all
/// there is to use: [`Backend::System`].
pub fn detect(exec: &dyn Exec) -> (Backend, String) {
    let mut dumps = Dumps::default();
    for family in [IpFamily::V4, IpFamily::V6] {
        for (backend, args, into) in [
            (Backend::Nft, &["-t", "mangle"][..], &mut dumps.nft_mangle),
            (Backend::Legacy, &[][..], &mut dumps.legacy),
            (Backend::Nft, &[][..], &mut dumps.nft),
        ] {
            let tool = backend.tool(family, "iptables-save");
            match exec.run(&tool, args, None) {
                Ok(text) => into.push_str(&text),
                // The wrapper requires both backends; without them there
                // is nothing to choose between.
                Err(Error::Spawn { .. }) if family == IpFamily::V4 => {
                    return (Backend::System, format!("{tool} cannot be run: using iptables as found on PATH"));
                }
                // Best effort, as the wrapper (`… || true`): what a failed
                // dump printed still counts.
                Err(Error::Failed { stdout, .. }) => into.push_str(&stdout),
                Err(_) => {}
            }
        }
    }
    decide(&dumps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_are_named_per_backend_and_family() {
        assert_eq!(Backend::System.tool(IpFamily::V4, "iptables"), "iptables");
        assert_eq!(Backend::System.tool(IpFamily::V6, "iptables-save"), "ip6tables-save");
        assert_eq!(Backend::Nft.tool(IpFamily::V4, "iptables-restore"), "iptables-nft-restore");
        assert_eq!(Backend::Nft.tool(IpFamily::V6, "iptables"), "ip6tables-nft");
        assert_eq!(Backend::Legacy.tool(IpFamily::V4, "iptables-save"), "iptables-legacy-save");
        assert_eq!(Backend::Legacy.tool(IpFamily::V6, "iptables-restore"), "ip6tables-legacy-restore");
    }

    const HINT: &str = "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n";
    const CANARY: &str = "*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n";
    const TWO_RULES: &str = "*filter\n:BAD-1 - [0:0]\n:BAD-2 - [0:0]\n-A BAD-1 -j ACCEPT\n-A BAD-2 -j DROP\nCOMMIT\n";

    /// iptables-wrappers' own acceptance case (test/test.sh): the marker
    /// in one backend beats a rule majority in the other, both ways.
    #[test]
    fn the_marker_beats_a_rule_majority() {
        let legacy = Dumps { legacy: HINT.into(), nft: TWO_RULES.into(), ..Default::default() };
        assert_eq!(decide(&legacy).0, Backend::Legacy, "{}", decide(&legacy).1);
        let nft = Dumps { nft_mangle: HINT.into(), nft: HINT.into(), legacy: TWO_RULES.into() };
        assert_eq!(decide(&nft).0, Backend::Nft);
        assert!(decide(&nft).1.contains("KUBE-IPTABLES-HINT"), "{}", decide(&nft).1);
        // The older marker counts the same, IPv6's too.
        let v6 = Dumps { legacy: format!("{TWO_RULES}{CANARY}"), ..Default::default() };
        assert_eq!(
            decide(&v6),
            (Backend::Legacy, "kubelet's KUBE-KUBELET-CANARY chain is in iptables-legacy's tables".into())
        );
        // nft's marker wins when both have one (nft is looked at first).
        let both = Dumps { nft_mangle: HINT.into(), legacy: HINT.into(), nft: HINT.into() };
        assert_eq!(decide(&both).0, Backend::Nft);
    }

    #[test]
    fn without_a_marker_the_rules_decide_and_a_tie_is_nft() {
        let legacy = Dumps { legacy: TWO_RULES.into(), ..Default::default() };
        assert_eq!(decide(&legacy).0, Backend::Legacy);
        let tie = Dumps { legacy: TWO_RULES.into(), nft: TWO_RULES.into(), ..Default::default() };
        assert_eq!(decide(&tie).0, Backend::Nft);
        assert_eq!(decide(&Dumps::default()).0, Backend::Nft, "an empty node: nft");
        // A marker's name inside a rule is no marker.
        let in_rule = Dumps {
            legacy: "-A X -m comment --comment \":KUBE-IPTABLES-HINT\" -j ACCEPT\n".into(),
            ..Default::default()
        };
        assert_eq!(
            decide(&in_rule),
            (
                Backend::Legacy,
                "no kubelet marker chain; iptables-legacy holds more rules (1) than iptables-nft (0)".into()
            )
        );
    }

    /// A node with iptables but not both backends' tools (a distribution
    /// with only `iptables`): the one on PATH.
    #[test]
    fn without_both_backends_the_iptables_on_path() {
        struct Missing;
        impl Exec for Missing {
            fn run(&self, program: &str, _: &[&str], _: Option<&[u8]>) -> crate::kernel::Result<String> {
                if program.contains("legacy") {
                    return Err(Error::Spawn { program: program.into(), source: std::io::ErrorKind::NotFound.into() });
                }
                Ok(HINT.into())
            }
        }
        let (backend, why) = detect(&Missing);
        assert_eq!(backend, Backend::System);
        assert!(why.starts_with("iptables-legacy-save cannot be run"), "{why}");
    }

    /// A dump that fails after printing (one table nft cannot read) still
    /// counts what it printed, as the wrapper's `… || true` does.
    #[test]
    fn a_failed_dump_counts_what_it_printed() {
        struct Failing;
        impl Exec for Failing {
            fn run(&self, program: &str, args: &[&str], _: Option<&[u8]>) -> crate::kernel::Result<String> {
                match (program, args.is_empty()) {
                    ("iptables-legacy-save", true) => Err(Error::Failed {
                        program: program.into(),
                        status: "exit status: 1".into(),
                        stderr: "table `raw' is incompatible".into(),
                        cause: crate::kernel::Cause::Other,
                        stdout: TWO_RULES.into(),
                    }),
                    _ => Ok(String::new()),
                }
            }
        }
        let (backend, why) = detect(&Failing);
        assert_eq!(backend, Backend::Legacy, "{why}");
    }
}
