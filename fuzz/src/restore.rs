//! A model of `iptables-restore --noflush` for the lines kpx writes, to
//! run a sync's payloads against what earlier ones left: `:CHAIN` creates
//! or flushes a chain, `-A` appends, `-I CHAIN N` inserts at rule N, `-D`
//! deletes the first rule of that exact text, `-X` deletes a chain that
//! is empty and that no rule jumps to; a jump needs its chain to exist. A
//! table's section is committed whole or not at all, as the tool does.
//! Built-in chains (upper-case names without `-`, as INPUT) hold nothing
//! here: kpx's jumps from them are not part of a payload.

use std::collections::BTreeMap;

/// Each table's chains, each chain's rule lines as `-A CHAIN ...`.
#[derive(Debug, Clone, Default)]
pub struct Tables(pub BTreeMap<String, BTreeMap<String, Vec<String>>>);

fn built_in(chain: &str) -> bool {
    !chain.contains('-')
}

/// The chain a rule line jumps or goes to, if it names one of the
/// table's (`-j X` / `-g X` where X is not a target of its own).
fn jump_of(line: &str) -> Option<&str> {
    let words: Vec<&str> = line.split(' ').collect();
    let at = words.iter().position(|w| *w == "-j" || *w == "-g")?;
    let to = *words.get(at + 1)?;
    (to.starts_with("KUBE-") || to.starts_with("KPX-")).then_some(to)
}

impl Tables {
    /// Applies one payload; an error names the line the tool would refuse
    /// (the state is then as before that table's section).
    pub fn apply(&mut self, payload: &str) -> Result<(), String> {
        let mut section: Option<(String, BTreeMap<String, Vec<String>>)> = None;
        for (n, line) in payload.lines().enumerate() {
            let fail = |why: &str| Err(format!("line {}: {why}: {line}", n + 1));
            if let Some(table) = line.strip_prefix('*') {
                let chains = self.0.get(table).cloned().unwrap_or_default();
                section = Some((table.to_string(), chains));
                continue;
            }
            let Some((table, chains)) = section.as_mut() else { return fail("outside a table") };
            if line == "COMMIT" {
                for (chain, rules) in chains.iter() {
                    for rule in rules {
                        if let Some(to) = jump_of(rule)
                            && !chains.contains_key(to)
                        {
                            return Err(format!("{table} {chain}: a jump to {to}, which is not a chain: {rule}"));
                        }
                    }
                }
                let (table, chains) = section.take().expect("in a section");
                self.0.insert(table, chains);
                continue;
            }
            if let Some(decl) = line.strip_prefix(':') {
                let chain = decl.split(' ').next().unwrap_or_default();
                chains.insert(chain.to_string(), Vec::new());
                continue;
            }
            let words: Vec<&str> = line.splitn(3, ' ').collect();
            let (op, chain) = (words[0], words.get(1).copied().unwrap_or_default());
            if built_in(chain) {
                return fail("a rule in a built-in chain");
            }
            let rest = words.get(2).copied().unwrap_or_default();
            match op {
                "-A" => match chains.get_mut(chain) {
                    Some(rules) => rules.push(line.to_string()),
                    None => return fail("no such chain"),
                },
                "-D" => {
                    let text = format!("-A {chain} {rest}");
                    let Some(rules) = chains.get_mut(chain) else { return fail("no such chain") };
                    let Some(at) = rules.iter().position(|r| *r == text) else { return fail("no such rule") };
                    rules.remove(at);
                }
                "-I" => {
                    let Some((at, spec)) = rest.split_once(' ') else { return fail("no rule number") };
                    let Ok(at) = at.parse::<usize>() else { return fail("no rule number") };
                    let Some(rules) = chains.get_mut(chain) else { return fail("no such chain") };
                    if at == 0 || at > rules.len() + 1 {
                        return fail("rule number out of range");
                    }
                    rules.insert(at - 1, format!("-A {chain} {spec}"));
                }
                "-X" => {
                    match chains.get(chain) {
                        None => return fail("no such chain"),
                        Some(rules) if !rules.is_empty() => return fail("the chain is not empty"),
                        Some(_) => {}
                    }
                    if chains.values().flatten().any(|r| jump_of(r) == Some(chain)) {
                        return fail("a rule still jumps to the chain");
                    }
                    chains.remove(chain);
                }
                _ => return fail("an unknown command"),
            }
        }
        match section {
            Some((table, _)) => Err(format!("table {table} not committed")),
            None => Ok(()),
        }
    }

    /// What `iptables-save` prints of the tables (no counters).
    pub fn save(&self) -> String {
        let mut out = String::new();
        for (table, chains) in &self.0 {
            out.push_str(&format!("*{table}\n"));
            for chain in chains.keys() {
                out.push_str(&format!(":{chain} - [0:0]\n"));
            }
            for line in chains.values().flatten() {
                out.push_str(line);
                out.push('\n');
            }
            out.push_str("COMMIT\n");
        }
        out
    }

    /// Creates a chain where missing (`iptables -N`, which never flushes).
    pub fn ensure(&mut self, table: &str, chain: &str) {
        self.0.entry(table.to_string()).or_default().entry(chain.to_string()).or_default();
    }

    pub fn chain(&self, table: &str, chain: &str) -> Option<&Vec<String>> {
        self.0.get(table)?.get(chain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_refuses_what_iptables_restore_refuses() {
        let mut t = Tables::default();
        t.apply("*nat\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-A - [0:0]\n-A KUBE-SVC-A -j KUBE-SEP-A\nCOMMIT\n").unwrap();
        let before = t.0.clone();
        for bad in [
            "*nat\n-D KUBE-SVC-A -j KUBE-SEP-B\nCOMMIT\n",
            "*nat\n:KUBE-SEP-A - [0:0]\n-X KUBE-SEP-A\nCOMMIT\n",
            "*nat\n-A KUBE-SVC-A -j KUBE-SEP-B\nCOMMIT\n",
            "*nat\n-I KUBE-SVC-A 3 -j KUBE-SEP-A\nCOMMIT\n",
            "*nat\n-A PREROUTING -j KUBE-SVC-A\nCOMMIT\n",
            "*nat\n-A KUBE-SVC-A -j ACCEPT\n",
        ] {
            assert!(t.apply(bad).is_err(), "{bad}");
            assert_eq!(t.0, before, "a refused section changes nothing: {bad}");
        }
        t.apply("*nat\n-I KUBE-SVC-A 1 -j RETURN\n-D KUBE-SVC-A -j KUBE-SEP-A\n:KUBE-SEP-A - [0:0]\n-X KUBE-SEP-A\nCOMMIT\n")
            .unwrap();
        assert_eq!(t.chain("nat", "KUBE-SVC-A").unwrap(), &vec!["-A KUBE-SVC-A -j RETURN".to_string()]);
        assert!(t.chain("nat", "KUBE-SEP-A").is_none());
    }
}
