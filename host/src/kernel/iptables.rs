//! iptables: one `iptables-restore --noflush` per sync, the fixed jumps
//! from built-in chains kept in place, and the kernel's KUBE- chains read
//! back for validation and cleanup.

use std::collections::{BTreeMap, BTreeSet};

use kpx_rules::iptables::{FILTER_CHAINS, JUMPS, Jump, LOCALNET_JUMPS, NAT_CHAINS, SERVICE_CHAIN_PREFIXES};
use kpx_rules::model::IpFamily;

use super::{Error, Exec, Result};

/// upstream's wait flags: wait 5 s for the xtables lock, polling every 100 ms.
const WAIT: [&str; 4] = ["-w", "5", "-W", "100000"];

pub struct IptablesKernel {
    family: IpFamily,
    exec: Box<dyn Exec>,
}

impl IptablesKernel {
    pub fn new(family: IpFamily, exec: Box<dyn Exec>) -> IptablesKernel {
        IptablesKernel { family, exec }
    }

    /// The executor, for the node's other kernel reads.
    pub fn exec(&self) -> &dyn Exec {
        self.exec.as_ref()
    }

    fn tool(&self, base: &str) -> String {
        match self.family {
            IpFamily::V4 => base.to_string(),
            IpFamily::V6 => base.replacen("iptables", "ip6tables", 1),
        }
    }

    /// Creates the top-level chains and the jumps to them from the built-in
    /// chains (upstream's `iptablesJumpChains`), where missing.
    pub fn ensure_jumps(&self, jumps: &[Jump]) -> Result<()> {
        let iptables = self.tool("iptables");
        let mut created = BTreeSet::new();
        for jump in jumps {
            if created.insert((jump.table, jump.to)) {
                match self.exec.run(&iptables, &[WAIT[0], WAIT[1], "-t", jump.table, "-N", jump.to], None) {
                    Ok(_) => {}
                    Err(Error::Failed { stderr, .. }) if stderr.contains("exists") => {}
                    Err(e) => return Err(e),
                }
            }
            let mut rule: Vec<&str> = Vec::with_capacity(jump.matches.len() + 8);
            rule.extend([WAIT[0], WAIT[1], "-t", jump.table, "-C", jump.from]);
            rule.extend(jump.matches);
            rule.extend(["-j", jump.to]);
            if self.exec.run(&iptables, &rule, None).is_err() {
                rule[4] = "-I";
                self.exec.run(&iptables, &rule, None)?;
            }
        }
        Ok(())
    }

    /// `--cleanup`: unlinks every jump kube-proxy keeps in built-in chains,
    /// then flushes and deletes the chains kube-proxy (and kpx) create.
    /// Chains of other software are left alone. Returns the chains removed.
    pub fn cleanup(&self) -> Result<usize> {
        let iptables = self.tool("iptables");
        for jump in JUMPS.iter().chain(LOCALNET_JUMPS) {
            let mut rule: Vec<&str> = vec![WAIT[0], WAIT[1], "-t", jump.table, "-D", jump.from];
            rule.extend(jump.matches);
            rule.extend(["-j", jump.to]);
            // Delete every copy; stop at the first "no such rule".
            for _ in 0..16 {
                if self.exec.run(&iptables, &rule, None).is_err() {
                    break;
                }
            }
        }
        let ours = |table: &str, chain: &str| {
            SERVICE_CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p))
                || chain == "KUBE-FIREWALL"
                || match table {
                    "nat" => NAT_CHAINS.contains(&chain),
                    _ => FILTER_CHAINS.contains(&chain),
                }
        };
        let mut payload = String::new();
        let mut removed = 0;
        for (table, chains) in self.kube_chains()? {
            let mine: Vec<&String> = chains.iter().filter(|c| ours(&table, c)).collect();
            if mine.is_empty() {
                continue;
            }
            removed += mine.len();
            payload.push_str(&format!("*{table}\n"));
            for chain in &mine {
                payload.push_str(&format!(":{chain} - [0:0]\n"));
            }
            for chain in &mine {
                payload.push_str(&format!("-X {chain}\n"));
            }
            payload.push_str("COMMIT\n");
        }
        if !payload.is_empty() {
            self.apply(&payload)?;
        }
        Ok(removed)
    }

    /// Writes a payload in one atomic `iptables-restore --noflush`.
    pub fn apply(&self, payload: &str) -> Result<()> {
        let mut args = WAIT.to_vec();
        args.extend(["--noflush", "--counters"]);
        self.exec.run(&self.tool("iptables-restore"), &args, Some(payload.as_bytes()))?;
        Ok(())
    }

    /// The KUBE- chains the kernel holds, by table.
    pub fn kube_chains(&self) -> Result<BTreeMap<String, BTreeSet<String>>> {
        let mut out = BTreeMap::new();
        for table in ["filter", "nat"] {
            let dump = self.exec.run(&self.tool("iptables-save"), &["-t", table], None)?;
            let chains = dump
                .lines()
                .filter_map(|l| l.strip_prefix(':'))
                .filter_map(|l| l.split_whitespace().next())
                .filter(|c| c.starts_with("KUBE-"))
                .map(str::to_string)
                .collect();
            out.insert(table.to_string(), chains);
        }
        Ok(out)
    }
}

/// Updates the known chains with what a written payload created and deleted.
pub fn track_chains(chains: &mut BTreeMap<String, BTreeSet<String>>, payload: &str) {
    let mut table = String::new();
    for line in payload.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = name.to_string();
        } else if let Some(decl) = line.strip_prefix(':') {
            let chain = decl.split_whitespace().next().unwrap_or_default();
            chains.entry(table.clone()).or_default().insert(chain.to_string());
        } else if let Some(chain) = line.strip_prefix("-X ") {
            chains.entry(table.clone()).or_default().remove(chain.trim());
        }
    }
}

/// Adds flush-and-delete lines for per-service chains the kernel holds but
/// `payload` no longer declares (left from an earlier instance or run).
pub fn with_stale_chains_removed(payload: &str, kernel: &BTreeMap<String, BTreeSet<String>>) -> String {
    let mut out = String::with_capacity(payload.len() + 256);
    let mut table = String::new();
    let mut declared = BTreeSet::new();
    for line in payload.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = name.to_string();
            declared.clear();
        } else if let Some(decl) = line.strip_prefix(':') {
            declared.insert(decl.split_whitespace().next().unwrap_or("").to_string());
        } else if line == "COMMIT" {
            let stale: Vec<&String> = kernel
                .get(&table)
                .into_iter()
                .flatten()
                .filter(|c| SERVICE_CHAIN_PREFIXES.iter().any(|p| c.starts_with(p)) && !declared.contains(*c))
                .collect();
            for chain in &stale {
                out.push_str(&format!(":{chain} - [0:0]\n"));
            }
            for chain in &stale {
                out.push_str(&format!("-X {chain}\n"));
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn tracks_created_and_deleted_chains() {
        let mut chains = Default::default();
        track_chains(
            &mut chains,
            "*nat\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-X KUBE-B\nCOMMIT\n*filter\n:KUBE-C - [0:0]\nCOMMIT\n",
        );
        assert_eq!(chains["nat"].iter().collect::<Vec<_>>(), ["KUBE-A"]);
        assert_eq!(chains["filter"].iter().collect::<Vec<_>>(), ["KUBE-C"]);
    }

    /// Records calls; `-C` checks fail, so every jump is inserted.
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<String>>>);

    impl Exec for Recorder {
        fn run(&self, program: &str, args: &[&str], _stdin: Option<&[u8]>) -> Result<String> {
            self.0.lock().unwrap().push(format!("{program} {}", args.join(" ")));
            if args.contains(&"-C") {
                return Err(Error::Failed { program: program.into(), status: "1".into(), stderr: "no rule".into() });
            }
            Ok(":KUBE-SVC-STALE - [0:0]\n:KUBE-SERVICES - [0:0]\n:FOREIGN - [0:0]\n".into())
        }
    }

    #[test]
    fn ensures_each_jump_once_with_upstream_comments() {
        let rec = Recorder::default();
        IptablesKernel::new(IpFamily::V6, Box::new(rec.clone())).ensure_jumps(kpx_rules::iptables::JUMPS).unwrap();
        let calls = rec.0.lock().unwrap();
        assert!(calls.iter().all(|c| c.starts_with("ip6tables -w 5 ")));
        assert!(
            calls.contains(
                &"ip6tables -w 5 -t nat -I PREROUTING -m comment --comment kubernetes service portals -j KUBE-SERVICES"
                    .to_string()
            )
        );
        assert_eq!(calls.iter().filter(|c| c.contains(" -N KUBE-SERVICES")).count(), 2, "nat and filter");
    }

    #[test]
    fn stale_service_chains_are_flushed_and_deleted() {
        let rec = Recorder::default();
        let kernel = IptablesKernel::new(IpFamily::V4, Box::new(rec)).kube_chains().unwrap();
        assert!(kernel["nat"].contains("KUBE-SVC-STALE") && !kernel["nat"].contains("FOREIGN"));
        let out = with_stale_chains_removed("*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n", &kernel);
        assert_eq!(out, "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-STALE - [0:0]\n-X KUBE-SVC-STALE\nCOMMIT\n");
    }
}
