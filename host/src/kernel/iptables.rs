//! iptables mode's kernel side: the host's frame around the plugin's typed
//! rules, rendered as one `iptables-restore --noflush` payload per sync,
//! the jumps from built-in chains kept in place, and the kernel's chains
//! read back (iptables-save) to find stale ones.

pub mod backend;
pub mod frame;
pub mod parse;
pub mod render;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use foldhash::{HashMap, HashSet, HashSetExt};

use kpx_rules::model::{IpFamily, Settings};
use kpx_rules::ops::iptables::{Rule, Ruleset, Table, USERSPACE_HOST_CHAINS, is_host_chain, own_chain_name_problem};

use super::{Cause, Exec, Result, SyncError, Written};
use crate::syntax::iptables::{Dialect, line_args, rule_args, rule_lines};
use crate::validate::iptables::{Checked, Context, HookRules, Model, check_with_kept, hook_rules, kept_hooks};
use crate::validate::{Rejected, Scope};
use parse::{Dump, parse_dump};
use render::{HostChains, Part, payload, payload_keeping};

/// upstream's wait flag: wait 5 s for the xtables lock (the wait
/// interval, `-W`, went in v1.34: kubernetes/kubernetes#131961).
pub const WAIT: [&str; 2] = ["-w", "5"];

/// Upstream's canary chain and the tables it is in (`ipt.Monitor`).
pub const CANARY_CHAIN: &str = "KUBE-PROXY-CANARY";
const CANARY_TABLES: [&str; 3] = ["mangle", "nat", "filter"];

/// Longest line kpx writes: iptables-restore reads lines into a 10,240-byte
/// buffer, and the rest of a longer line would become a line of its own.
pub const MAX_LINE: usize = 8192;

/// Most own chains one iptables-restore run creates, fills or deletes
/// outside a sync's main payload. iptables-nft (1.8.9 here) takes time
/// quadratic in the chains one run touches: 20,000 new chains of one rule
/// and 20,000 jumps to them took 15.5 s in one run and 2 s in runs of
/// 5,000 (docs/RELIABILITY.md, "Bounds").
pub const CHAINS_PER_RUN: usize = 2_000;

/// A ruleset the host accepted, and the payloads it becomes: written in
/// order, `before`, `text`, `after`.
pub struct Prepared {
    pub checked: Checked,
    /// CPU time of the checks ([`Written::check`]).
    pub check_time: std::time::Duration,
    pub frame: frame::Frame,
    /// When a sync creates more than [`CHAINS_PER_RUN`] own chains: runs
    /// that create them empty, then fill them. No rule refers to them
    /// until `text` is written, so no packet sees them half-filled.
    pub before: Vec<String>,
    /// The main payload, one atomic run: the host's chains, the hooks and
    /// every own chain that exists already.
    pub text: String,
    /// When a sync deletes more than [`CHAINS_PER_RUN`] own chains: runs
    /// that flush, then delete them, once `text` took every jump to them
    /// away.
    pub after: Vec<String>,
    /// What the host's chains hold once `text` is written.
    pub host_chains: HostChains,
    /// The plugin's rules in each hook once `text` is written.
    pub hooks: HookRules,
}

impl Prepared {
    /// The iptables-restore runs, in the order they are written.
    pub fn runs(&self) -> impl Iterator<Item = &String> {
        self.before.iter().chain(std::iter::once(&self.text)).chain(&self.after)
    }

    /// The bytes of all the runs.
    pub fn bytes(&self) -> usize {
        self.runs().map(String::len).sum()
    }
}

/// What the last write left in the host's chains: edited in place by a
/// partial sync, and the hook rules a partial render may keep.
pub struct Previous {
    pub host_chains: HostChains,
    pub hooks: HookRules,
}

/// The host's checks of a ruleset and its rendering as one
/// iptables-restore payload (within `max_bytes`, no line past
/// [`MAX_LINE`]): everything a sync does before the kernel.
/// `previous`: what the last write left (a partial sync edits the host's
/// chains in place and leaves the hooks it keeps as they are); None
/// writes them whole.
pub fn prepare(
    ctx: &Context,
    settings: &Settings,
    ruleset: &Ruleset,
    max_bytes: usize,
    previous: Option<Previous>,
) -> std::result::Result<Prepared, Rejected> {
    prepare_in_runs(ctx, settings, ruleset, max_bytes, previous, CHAINS_PER_RUN, &Unchanged::new())
}

/// Own chains the kernel holds with exactly the rules a full sync gives
/// them: the sync leaves them out of its payload (no `:CHAIN` line, no
/// rules), so a restart over 100,000 chains does not rewrite them all in
/// one run (iptables-nft's time is quadratic in the chains a run touches).
pub type Unchanged = std::collections::HashSet<(Table, String)>;

/// The ruleset's own chains that `dump` holds with the same rules, in the
/// same order, and nothing kpx does not recognise.
pub fn unchanged(dump: &Dump, ruleset: &Ruleset, d: Dialect) -> Unchanged {
    use std::collections::HashMap;
    let mut want: HashMap<(Table, &str), Vec<&Rule>> = HashMap::new();
    for r in &ruleset.rules {
        want.entry((r.table, r.chain.as_str())).or_default().push(r);
    }
    ruleset
        .chains
        .iter()
        .filter(|(t, c)| {
            let Some(table) = dump.tables.get(t) else { return false };
            // A user chain (no policy: not a base chain under that name).
            if table.chains.get(c) != Some(&None) {
                return false;
            }
            let held = table.rules.get(c).map(Vec::as_slice).unwrap_or_default();
            let want = want.get(&(*t, c.as_str())).map(Vec::as_slice).unwrap_or_default();
            held.len() == want.len()
                && held.iter().zip(want).all(|(h, w)| match h {
                    parse::Line::Rule(h) => parse::normalize(h, d) == parse::normalize(w, d),
                    parse::Line::Foreign { .. } => false,
                })
        })
        .cloned()
        .collect()
}

/// [`prepare`] with another number of chains a run before or after the
/// main payload may touch (the fuzzer's, to reach the runs with a small
/// state).
pub fn prepare_in_runs(
    ctx: &Context,
    settings: &Settings,
    ruleset: &Ruleset,
    max_bytes: usize,
    previous: Option<Previous>,
    per_run: usize,
    unchanged: &Unchanged,
) -> std::result::Result<Prepared, Rejected> {
    let (mut host_chains, hooks) = previous.map(|p| (p.host_chains, p.hooks)).unzip();
    let kept = kept_hooks(ctx, ruleset, hooks)?;
    let (checked, check_time) = crate::cpu_time::of(|| check_with_kept(ctx, ruleset, &kept));
    let checked: Checked = checked?;
    // A kept hook's chain stays as the last write left it: its lines are
    // moved over, not rendered and compared again.
    let mut kept_lines = HostChains::new();
    for hook in kept.keys() {
        let key = (hook.table(), hook.chain());
        match host_chains.as_mut().and_then(|h| h.remove(&key)) {
            Some(lines) => kept_lines.insert(key, lines),
            None => {
                return Err(Rejected {
                    plugin: ctx.plugin.to_string(),
                    at: "kept hook".into(),
                    item: format!("{} {}", key.0.name(), key.1),
                    reason: "no earlier write of it to keep".into(),
                });
            }
        };
    }
    let frame = frame::frame(settings);
    let (main, before, after) = split(ctx, ruleset, &checked.stale, per_run.max(1), unchanged);
    let stale: &[(Table, String)] = if after.is_empty() { &checked.stale } else { &[] };
    let (text, host_chains) = payload_keeping(&frame, &main, stale, ctx.dialect, host_chains.as_ref(), kept_lines);
    drop(main);
    let mut hooks = hook_rules(std::borrow::Cow::Borrowed(ruleset));
    hooks.extend(kept.into_iter().filter(|(_, rules)| !rules.is_empty()));
    let prepared = Prepared { checked, check_time, frame, before, text, after, host_chains, hooks };
    if prepared.bytes() > max_bytes {
        return Err(Rejected {
            plugin: ctx.plugin.to_string(),
            at: "rendering".into(),
            item: String::new(),
            reason: format!("the iptables-restore payload would take more than the limit of {max_bytes} bytes"),
        });
    }
    if let Some((n, line)) = prepared.runs().flat_map(|t| t.lines()).enumerate().find(|(_, l)| l.len() > MAX_LINE) {
        return Err(Rejected {
            plugin: ctx.plugin.to_string(),
            at: format!("payload line {}", n + 1),
            item: line.chars().take(200).collect(),
            reason: format!("longer than {MAX_LINE} bytes"),
        });
    }
    Ok(prepared)
}

/// The ruleset's main payload part, and the runs before and after it
/// (see [`Prepared`]): new own chains are created and filled before it
/// when there are more than [`CHAINS_PER_RUN`], and own chains that go
/// are deleted after it when there are more than that. Otherwise the
/// ruleset is written whole, in one run.
fn split<'r>(
    ctx: &Context,
    ruleset: &'r Ruleset,
    stale: &[(Table, String)],
    per_run: usize,
    unchanged: &Unchanged,
) -> (Part<'r>, Vec<String>, Vec<String>) {
    let mut part = Part::of(ruleset);
    if !unchanged.is_empty() {
        // Chains the kernel holds as they are wanted are not written at all.
        let unchanged: HashSet<(Table, &str)> = unchanged.iter().map(|(t, c)| (*t, c.as_str())).collect();
        part.chains.retain(|(t, c)| !unchanged.contains(&(*t, c.as_str())));
        part.rules.retain(|r| !unchanged.contains(&(r.table, r.chain.as_str())));
    }
    split_runs(ctx, part, stale, per_run)
}

/// [`split`] of what is written.
fn split_runs<'r>(
    ctx: &Context,
    ruleset: Part<'r>,
    stale: &[(Table, String)],
    per_run: usize,
) -> (Part<'r>, Vec<String>, Vec<String>) {
    let key = |(t, n): &'r (Table, String)| (*t, n.as_str());
    let mut new: Vec<(Table, &str)> =
        ruleset.chains.iter().copied().filter(|c| !ctx.model.contains(c)).map(key).collect();
    let mut seen = HashSet::new();
    new.retain(|c| seen.insert(*c));
    let mut gone: Vec<(Table, &str)> = Vec::new();
    let mut seen = HashSet::new();
    for (t, n) in ruleset.delete_chains.iter().copied().chain(stale) {
        if seen.insert((*t, n.as_str())) {
            gone.push((*t, n.as_str()));
        }
    }
    // Own chains the kernel holds that the ruleset declares again (each
    // is flushed and filled anew).
    let mut again: Vec<(Table, &str)> =
        ruleset.chains.iter().copied().filter(|c| ctx.model.contains(c)).map(key).collect();
    let mut seen = HashSet::new();
    again.retain(|c| seen.insert(*c));
    let split_again = again.len() > per_run;
    // Refilled chains may jump to new ones: with refills in runs before
    // the main one, the new chains are created (and filled) before them.
    let split_new = new.len() > per_run || (split_again && !new.is_empty());
    let split_gone = gone.len() > per_run;
    if !split_new && !split_again && !split_gone {
        return (ruleset, Vec::new(), Vec::new());
    }
    let d = ctx.dialect;
    let Part { chains, rules, delete_chains } = ruleset;
    let mut main = Part::default();
    let mut before = Vec::new();
    if split_new || split_again {
        // Moved out of the main run: new chains when there are many
        // (created empty, then filled: nothing refers to them yet), and
        // chains declared again when there are many (each flushed and
        // filled in one run, so that none is ever seen empty).
        let moved: HashSet<(Table, &str)> =
            split_new.then_some(&new).into_iter().chain(split_again.then_some(&again)).flatten().copied().collect();
        let mut fills: HashMap<(Table, &str), Vec<&Rule>> = HashMap::default();
        for rule in rules {
            match moved.get(&(rule.table, rule.chain.as_str())) {
                Some(chain) => fills.entry(*chain).or_default().push(rule),
                None => main.rules.push(rule),
            }
        }
        main.chains = chains.into_iter().filter(|c| !moved.contains(&key(c))).collect();
        if split_new {
            let fills: Vec<((Table, &str), Vec<&Rule>)> =
                new.iter().map(|c| (*c, fills.remove(c).unwrap_or_default())).collect();
            before = render::declare_payloads(&new, per_run);
            before.extend(render::fill_payloads(&fills, per_run, d));
        }
        if split_again {
            let refills: Vec<((Table, &str), Vec<&Rule>)> =
                again.iter().map(|c| (*c, fills.remove(c).unwrap_or_default())).collect();
            before.extend(render::refill_payloads(&refills, per_run, d));
        }
    } else {
        main.chains = chains;
        main.rules = rules;
    }
    let after = if split_gone {
        render::delete_payloads(&gone, per_run)
    } else {
        main.delete_chains = delete_chains;
        Vec::new()
    };
    (main, before, after)
}

pub fn dialect(settings: &Settings) -> Dialect {
    Dialect { family: settings.family, masquerade_mark: settings.masquerade_mark() }
}

/// What the kernel would hold after a sync writes `ruleset`: the frame and
/// the plugin's rules rendered and read back as iptables-save gives them,
/// with the jumps from built-in chains where `iptables -I` leaves them
/// (the last inserted first). The tracer's input for conformance tests.
pub fn trace_tables(
    settings: &Settings,
    ruleset: &Ruleset,
) -> std::result::Result<kpx_rules::trace::iptables::Tables, String> {
    let d = dialect(settings);
    let frame = frame::frame(settings);
    let dump = parse_dump(&payload(&frame, ruleset, &[], d, None).0, d);
    let mut tables = dump.tracer_tables(d).map_err(|e| e.to_string())?;
    for jump in &frame.jumps {
        tables.insert_first(jump.clone());
    }
    Ok(tables)
}

/// The iptables tools of one family.
pub struct IptablesKernel {
    family: IpFamily,
    backend: backend::Backend,
    exec: Box<dyn Exec>,
}

impl IptablesKernel {
    /// The tools on PATH ([`backend::Backend::System`]).
    pub fn new(family: IpFamily, exec: Box<dyn Exec>) -> IptablesKernel {
        IptablesKernel { family, backend: backend::Backend::System, exec }
    }

    /// The tools of `backend` instead.
    pub fn with_backend(mut self, backend: backend::Backend) -> IptablesKernel {
        self.backend = backend;
        self
    }

    /// The executor, for the node's other kernel reads.
    pub fn exec(&self) -> &dyn Exec {
        self.exec.as_ref()
    }

    fn tool(&self, base: &str) -> String {
        self.backend.tool(self.family, base)
    }

    /// Creates the top-level chains and the jumps to them from the built-in
    /// chains (upstream's `iptablesJumpChains`), where missing.
    pub fn ensure_jumps(&self, jumps: &[Rule], d: Dialect) -> Result<()> {
        let jumps: Vec<(&Rule, &str)> = jumps
            .iter()
            .filter_map(|j| match &j.target {
                kpx_rules::ops::iptables::Target::HostJump(to) => Some((j, to.as_str())),
                _ => None,
            })
            .collect();
        // Usually all there (every full sync after the first): one process.
        if self.holds_all(jumps.iter().map(|(j, _)| *j), d)? {
            return Ok(());
        }
        // A first start: none of the chains exists yet, so neither does a
        // jump; one restore makes them all.
        if self.create_with_jumps(&jumps, d)? {
            return Ok(());
        }
        // Some there, some not: chain by chain, jump by jump.
        let iptables = self.tool("iptables");
        let mut created = BTreeSet::new();
        for (jump, to) in jumps {
            if created.insert((jump.table, to)) {
                self.new_chain(jump.table.name(), to)?;
            }
            let spec = rule_args(jump, d);
            let mut args: Vec<&str> = vec![WAIT[0], WAIT[1], "-t", jump.table.name(), "-C", &jump.chain];
            args.extend(spec.iter().map(String::as_str));
            if self.exec.run(&iptables, &args, None).is_err() {
                args[4] = "-I";
                self.exec.run(&iptables, &args, None)?;
            }
        }
        Ok(())
    }

    /// Creates a chain where missing, empty (`iptables -N`; an existing
    /// one is left as it is).
    fn new_chain(&self, table: &str, chain: &str) -> Result<()> {
        match self.exec.run(&self.tool("iptables"), &[WAIT[0], WAIT[1], "-t", table, "-N", chain], None) {
            Err(e) if e.cause() != Cause::Exists => Err(e),
            _ => Ok(()),
        }
    }

    /// Creates each of `chains` where missing, empty.
    pub fn ensure_chains(&self, chains: &[(Table, &str)]) -> Result<()> {
        chains.iter().try_for_each(|(table, chain)| self.new_chain(table.name(), chain))
    }

    /// Creates upstream's canary chain, `KUBE-PROXY-CANARY`, in the mangle,
    /// nat and filter tables where missing: empty chains nothing jumps to,
    /// whose loss says someone deleted kube-proxy's chains.
    pub fn ensure_canaries(&self) -> Result<()> {
        CANARY_TABLES.iter().try_for_each(|table| self.new_chain(table, CANARY_CHAIN))
    }

    /// What of the host's own rules the kernel lost since they were
    /// written, if anything: a canary chain (someone deleted chains), or
    /// one of `rules` (someone flushed chains: the jumps from built-in
    /// chains, the frame's rules, a hook's first rule), all looked up in
    /// one `iptables-restore` ([`IptablesKernel::lost_rules`]). Four
    /// processes while nothing is lost; run once per sync period.
    pub fn lost(&self, rules: &[&Rule], d: Dialect) -> Result<Option<String>> {
        let iptables = self.tool("iptables");
        for table in CANARY_TABLES {
            if let Err(e) = self.exec.run(&iptables, &[WAIT[0], WAIT[1], "-t", table, "-S", CANARY_CHAIN], None) {
                return match e.cause() {
                    Cause::Locked => Err(e),
                    _ => Ok(Some(format!("the {table} table's {CANARY_CHAIN} chain is gone"))),
                };
            }
        }
        self.lost_rules(rules, d)
    }

    /// Which of `rules`, if any, the kernel no longer holds:
    /// [`IptablesKernel::lost`] without the canary chains (ipvs mode has
    /// none, as upstream's ipvs proxier).
    pub fn lost_rules(&self, rules: &[&Rule], d: Dialect) -> Result<Option<String>> {
        if self.holds_all(rules.iter().copied(), d)? {
            return Ok(None);
        }
        // Which one: `iptables -C` each line (a hash mark is two), in order.
        let iptables = self.tool("iptables");
        for rule in rules {
            for line in rule_lines(rule, d) {
                let spec = line_args(&line);
                let mut args: Vec<&str> = vec![WAIT[0], WAIT[1], "-t", rule.table.name(), "-C", &rule.chain];
                args.extend(spec.iter().map(String::as_str));
                if let Err(e) = self.exec.run(&iptables, &args, None) {
                    return match e.cause() {
                        Cause::Locked => Err(e),
                        _ => Ok(Some(format!(
                            "a rule of {} {} is gone: {}",
                            rule.table.name(),
                            rule.chain,
                            spec.join(" ")
                        ))),
                    };
                }
            }
        }
        Ok(None)
    }

    /// The chains `jumps` lead to (`-N`) and the jumps (`-I`, in order) in
    /// one `iptables-restore --noflush`. Each table's part is atomic: it
    /// fails, writing nothing of that table, where one of its chains
    /// exists already (and only then could one of its jumps exist), so no
    /// jump is ever doubled. True when every part was written; on false
    /// the caller adds what is missing one by one (a part written before
    /// the failing one is then found there).
    fn create_with_jumps(&self, jumps: &[(&Rule, &str)], d: Dialect) -> Result<bool> {
        let mut chains: BTreeMap<&'static str, BTreeSet<&str>> = BTreeMap::new();
        for (jump, to) in jumps {
            chains.entry(jump.table.name()).or_default().insert(to);
        }
        let script = restore_script(jumps.iter().map(|(j, _)| *j), "-I", d, |table| {
            chains.get(table).into_iter().flatten().map(|c| format!("-N {c}\n")).collect()
        });
        self.restore_succeeds("creating the chains and jumps at once", &script)
    }

    /// Whether the kernel holds every one of `rules`, in one
    /// `iptables-restore --noflush` of `-C` lines (it fails at the first
    /// one missing, and writes nothing): one process where an `iptables
    /// -C` per rule took one each (about twenty per sync period, each
    /// reading the table's chains). False on any failure but the lock's,
    /// so that callers look rule by rule.
    fn holds_all<'r>(&self, rules: impl Iterator<Item = &'r Rule>, d: Dialect) -> Result<bool> {
        let script = restore_script(rules, "-C", d, |_| String::new());
        self.restore_succeeds("checking the host's rules at once", &script)
    }

    /// Runs `script` through `iptables-restore --noflush`: false when it
    /// failed (logged at debug level: the callers then go rule by rule),
    /// an error only when the xtables lock stayed taken.
    fn restore_succeeds(&self, what: &str, script: &str) -> Result<bool> {
        if script.is_empty() {
            return Ok(true);
        }
        // iptables-restore reads a longer line as two (a hook's first
        // rule may be a plugin's, checked for this when it was written):
        // such a script goes the argv way, rule by rule, and never here.
        if script.lines().any(|l| l.len() > MAX_LINE) {
            return Ok(false);
        }
        let mut args = WAIT.to_vec();
        args.push("--noflush");
        match self.exec.run(&self.tool("iptables-restore"), &args, Some(script.as_bytes())) {
            Ok(_) => Ok(true),
            Err(e) if e.cause() == Cause::Locked => Err(e),
            Err(e) => {
                tracing::debug!(family = %self.family, "{what} failed, so one by one: {e}");
                Ok(false)
            }
        }
    }

    /// `--cleanup`: unlinks every jump to the chains kube-proxy (and kpx)
    /// create, then flushes and deletes them, in every mode's names.
    /// Chains of other software are left alone. Returns the chains
    /// removed.
    pub fn cleanup(&self) -> Result<usize> {
        let removed = self.remove(removable)?;
        // The canary where it is: one save of every table that exists, as
        // `iptables-legacy -t mangle` would create the table.
        let all = self.exec.run(&self.tool("iptables-save"), &[], None)?;
        let iptables = self.tool("iptables");
        let mut table = "";
        for line in all.lines() {
            if let Some(t) = line.strip_prefix('*') {
                table = t.trim();
            } else if line.strip_prefix(':').and_then(|l| l.split_whitespace().next()) == Some(CANARY_CHAIN) {
                // Gone meanwhile (or someone's rule in it): nothing to do.
                let _ = self.exec.run(&iptables, &[WAIT[0], WAIT[1], "-t", table, "-X", CANARY_CHAIN], None);
            }
        }
        Ok(removed)
    }

    /// Whether these tools' tables hold a chain kube-proxy (or kpx) makes.
    /// Read with one save of every table, naming none: `iptables-legacy
    /// -t TABLE` would create the table.
    pub fn holds_own_chains(&self) -> Result<bool> {
        let text = self.exec.run(&self.tool("iptables-save"), &[], None)?;
        Ok(text.lines().filter_map(|l| l.strip_prefix(':')?.split_whitespace().next()).any(removable))
    }

    /// At the start of userspace mode: what the iptables and ipvs modes
    /// left (upstream cleans the other modes' leftovers too); userspace
    /// mode's own chains stay.
    pub fn remove_rule_modes(&self) -> Result<usize> {
        let userspace = |c: &str| USERSPACE_HOST_CHAINS.iter().any(|(_, u)| *u == c);
        self.remove(|c| removable(c) && !userspace(c))
    }

    /// At the start of the other modes: what userspace mode left.
    pub fn remove_userspace(&self) -> Result<usize> {
        self.remove(|c| USERSPACE_HOST_CHAINS.iter().any(|(_, u)| *u == c))
    }

    /// Deletes the chains `ours` names, with every rule of another chain
    /// that jumps to one of them (as the kernel holds it, whichever
    /// release of kube-proxy or kpx wrote it), in one restore per family.
    fn remove(&self, ours: impl Fn(&str) -> bool) -> Result<usize> {
        let (mut removed, mut text) = (0, String::new());
        // One save of the tables that exist (`iptables-legacy-save -t nat`
        // would create nat where there is none).
        let all = self.exec.run(&self.tool("iptables-save"), &[], None)?;
        for table in Table::ALL {
            let Some(save) = table_section(&all, table.name()) else { continue };
            let mine: Vec<&str> = save
                .lines()
                .filter_map(|l| l.strip_prefix(':')?.split_whitespace().next())
                .filter(|c| ours(c))
                .collect();
            if mine.is_empty() {
                continue;
            }
            removed += mine.len();
            text.push_str(&format!("*{}\n", table.name()));
            for rule in save.lines().filter_map(|l| l.strip_prefix("-A ")) {
                let chain = rule.split_whitespace().next().unwrap_or("");
                if !ours(chain) && jump_target(rule).is_some_and(&ours) {
                    text.push_str(&format!("-D {rule}\n"));
                }
            }
            for chain in &mine {
                text.push_str(&format!(":{chain} - [0:0]\n"));
            }
            for chain in &mine {
                text.push_str(&format!("-X {chain}\n"));
            }
            text.push_str("COMMIT\n");
        }
        if !text.is_empty() {
            self.apply(&text)?;
        }
        Ok(removed)
    }

    /// Writes a payload in one atomic `iptables-restore --noflush`.
    pub fn apply(&self, payload: &str) -> Result<()> {
        tracing::trace!(family = %self.family, bytes = payload.len(), "iptables-restore payload:\n{payload}");
        let mut args = WAIT.to_vec();
        args.extend(["--noflush", "--counters"]);
        self.exec.run(&self.tool("iptables-restore"), &args, Some(payload.as_bytes()))?;
        Ok(())
    }

    /// The nat and filter tables as iptables-save prints them.
    pub fn save(&self) -> Result<String> {
        let mut out = String::new();
        for table in Table::ALL {
            out.push_str(&self.exec.run(&self.tool("iptables-save"), &["-t", table.name()], None)?);
        }
        Ok(out)
    }

    /// The kernel's rules, read back as typed rules.
    pub fn dump(&self, d: Dialect) -> Result<Dump> {
        Ok(parse_dump(&self.save()?, d))
    }
}

/// An `iptables-restore` script that gives each line of `rules` (each
/// `-A CHAIN ...`, a hash mark two) as `command CHAIN ...`, a table's
/// lines after what `head` gives that table; empty for no rules.
fn restore_script<'r>(
    rules: impl Iterator<Item = &'r Rule>,
    command: &str,
    d: Dialect,
    head: impl Fn(&str) -> String,
) -> String {
    let mut by_table: BTreeMap<&'static str, String> = BTreeMap::new();
    for rule in rules {
        let text = by_table.entry(rule.table.name()).or_default();
        for line in rule_lines(rule, d) {
            text.push_str(command);
            text.push_str(line.strip_prefix("-A").unwrap_or(&line));
            text.push('\n');
        }
    }
    by_table.iter().map(|(table, lines)| format!("*{table}\n{}{lines}COMMIT\n", head(table))).collect()
}

/// One table's part of an iptables-save dump (from `*table` to its
/// `COMMIT`), if the dump has it.
fn table_section<'a>(dump: &'a str, table: &str) -> Option<&'a str> {
    let head = format!("*{table}\n");
    let start = if dump.starts_with(&head) { 0 } else { dump.find(&format!("\n{head}"))? + 1 };
    let rest = &dump[start..];
    Some(rest.find("\nCOMMIT").map_or(rest, |end| &rest[..end]))
}

/// The chains kpx removes as kube-proxy's (`--cleanup`, another mode's or
/// backend's leftovers): its own and the host's, but not `KUBE-FIREWALL`,
/// the localnet guard kubelet makes too, which upstream's cleanup leaves
/// (`iptablesKubeletJumpChains`: kubelet would not make it again, and
/// localhost services would be open to the node's neighbours).
fn removable(chain: &str) -> bool {
    chain != kpx_rules::ops::iptables::FIREWALL_CHAIN
        && (own_chain_name_problem(chain).is_none() || is_host_chain(chain))
}

/// The chain an iptables-save rule line jumps or goes to (`-j`/`-g`),
/// its words read as iptables-save quotes them (a comment's `"… -j X …"`
/// is one word).
fn jump_target(rule: &str) -> Option<&str> {
    let mut words = Vec::new();
    let (bytes, mut i) = (rule.as_bytes(), 0);
    while i < bytes.len() {
        if bytes[i] == b' ' {
            i += 1;
            continue;
        }
        let start = i;
        if bytes[i] == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else {
            while i < bytes.len() && bytes[i] != b' ' {
                i += 1;
            }
        }
        words.push(&rule[start..i.min(rule.len())]);
    }
    let at = words.iter().position(|w| *w == "-j" || *w == "-g")?;
    words.get(at + 1).copied()
}

/// The rules an iptables-restore payload appends or inserts, (filter, nat).
pub fn rules_in(payload: &str) -> (usize, usize) {
    let (mut filter, mut nat, mut table) = (0, 0, "");
    for line in payload.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.trim();
        } else if line.starts_with("-A ") || line.starts_with("-I ") {
            match table {
                "filter" => filter += 1,
                "nat" => nat += 1,
                _ => {}
            }
        }
    }
    (filter, nat)
}

/// iptables mode for one family: checks, renders and writes each sync,
/// and remembers what it wrote.
pub struct IptablesDataplane {
    kernel: IptablesKernel,
    model: Model,
    max_bytes: usize,
    /// What the host's chains hold, as the last write left them, and
    /// the plugin's rules among them by hook; None after a failed write
    /// or a refused ruleset (the next sync is full and writes them whole).
    written: Option<Previous>,
}

impl IptablesDataplane {
    pub fn new(kernel: IptablesKernel) -> IptablesDataplane {
        IptablesDataplane { kernel, model: Model::default(), max_bytes: super::DEFAULT_MAX_BYTES, written: None }
    }

    /// The most bytes a sync may write (the plugin output cap).
    pub fn with_max_bytes(mut self, max_bytes: usize) -> IptablesDataplane {
        self.max_bytes = max_bytes;
        self
    }

    pub fn kernel(&self) -> &IptablesKernel {
        &self.kernel
    }

    /// Whether a full sync would write `ruleset`: the host's checks and
    /// the rendering, against what earlier syncs left, nothing written
    /// (a replacement component's trial).
    pub fn check(&self, plugin: &str, settings: &Settings, ruleset: &Ruleset, scope: &Scope) -> Result<(), SyncError> {
        let ctx = Context { plugin, dialect: dialect(settings), scope, model: &self.model, full: true };
        prepare(&ctx, settings, ruleset, self.max_bytes, None)?;
        Ok(())
    }

    /// What the kernel lost of the host's own rules since the last write
    /// (see [`IptablesKernel::lost`]); None before the first one.
    pub fn lost(&self, settings: &Settings) -> Result<Option<String>> {
        let Some(previous) = &self.written else { return Ok(None) };
        let frame = frame::frame(settings);
        let first_of_hooks = previous.hooks.values().filter_map(|rules| rules.first());
        let rules: Vec<&Rule> =
            frame.jumps.iter().chain(&frame.rules).chain(&frame.trailing).chain(first_of_hooks).collect();
        self.kernel.lost(&rules, dialect(settings))
    }

    /// One sync: on a full one, the kernel's own chains are read back
    /// first and every one the ruleset does not declare is deleted.
    pub fn sync(
        &mut self,
        plugin: &str,
        settings: &Settings,
        ruleset: &Ruleset,
        full: bool,
        scope: &Scope,
    ) -> Result<Written, SyncError> {
        let d = dialect(settings);
        let mut kernel = crate::cpu_time::Spent::default();
        let mut unchanged = Unchanged::new();
        if full {
            let t = crate::cpu_time::Span::start();
            let dump = self.kernel.dump(d)?;
            kernel += t.elapsed();
            unchanged = self::unchanged(&dump, ruleset, d);
            if !unchanged.is_empty() {
                tracing::debug!(family = %settings.family, chains = unchanged.len(), "a full sync leaves own chains the kernel holds as wanted");
            }
            let own = Table::ALL.into_iter().flat_map(|t| {
                dump.chains(t)
                    .filter(|c| own_chain_name_problem(c).is_none())
                    .map(move |c| (t, c.clone()))
                    .collect::<Vec<_>>()
            });
            self.model.reset(own);
        }
        let ctx = Context { plugin, dialect: d, scope, model: &self.model, full };
        // A full sync writes the host's chains whole; a partial one edits
        // what the last write left.
        // Taken: a refused ruleset or a failed write makes the next sync full.
        let previous = self.written.take().filter(|_| !full);
        let prepared = prepare_in_runs(&ctx, settings, ruleset, self.max_bytes, previous, CHAINS_PER_RUN, &unchanged)?;
        let t = crate::cpu_time::Span::start();
        if full {
            self.kernel.ensure_canaries()?;
            self.kernel.ensure_jumps(&prepared.frame.jumps, d)?;
        }
        if !prepared.before.is_empty() {
            // The runs before the main one fill own chains that may jump
            // to the host's (KUBE-MARK-MASQ), which a first sync has not
            // created yet.
            self.kernel.ensure_chains(&prepared.frame.chains)?;
        }
        for run in prepared.runs() {
            self.kernel.apply(run)?;
        }
        let bytes = prepared.bytes();
        let written = prepared.runs().fold((0, 0), |(f, n), run| {
            let (a, b) = rules_in(run);
            (f + a, n + b)
        });
        let Prepared { checked, check_time, frame, host_chains, hooks, .. } = prepared;
        kernel += t.elapsed();
        self.model.commit(checked);
        // The host's chains hold the frame's rules and the plugin's hook
        // rules; own chains keep theirs.
        let mut counts = [0usize; 2];
        for r in frame.rules.iter().chain(frame.trailing.iter()).chain(hooks.values().flatten()) {
            counts[usize::from(r.table == Table::Nat)] += 1;
        }
        self.written = Some(Previous { host_chains, hooks });
        let rules = (counts[0] + self.model.rules(Table::Filter), counts[1] + self.model.rules(Table::Nat));
        Ok(Written {
            bytes,
            kernel: kernel.wall,
            check: check_time,
            kernel_cpu: kernel.cpu,
            iptables_rules: Some(rules),
            iptables_written: Some(written),
            steps: 1,
            cleanup_failed: false,
        })
    }
}
