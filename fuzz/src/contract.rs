//! Targets for what a hostile component returns: the built-in generators'
//! rules for the lab's state, edited by the fuzzer's bytes (rules and ops
//! inserted, removed, replaced; words and elements overwritten), or words
//! read whole from the bytes. Whatever the host accepts must reach the
//! kernel as exactly the typed rules it checked: iptables text that reads
//! back as those rules and no others (and a full then a partial sync's
//! payloads that apply, as a model of iptables-restore runs them, and
//! leave what the host believes), nf_tables messages that decode back to
//! the rule.

use arbitrary::{Arbitrary, Unstructured};
use kpx::kernel::iptables::frame::frame as iptables_frame;
use kpx::kernel::iptables::parse::{Line, normalize, parse_dump};
use kpx::kernel::iptables::render::payload;
use kpx::kernel::nftables::{decode, encode};
use kpx::validate::{iptables as vipt, nftables as vnft};
use kpx_rules::model::{Cidr, IpFamily, Protocol};
use kpx_rules::ops::iptables::words::{RuleWords, decode as decode_words, encode as encode_words};
use kpx_rules::ops::iptables::{Hook, Rule as IptRule, Ruleset as IptRuleset, Table};
use kpx_rules::ops::nftables::{self as nft, Op, Transaction};
use kpx_rules::trace::{Node as TraceNode, Packet};

use crate::lab::Lab;

/// The output budget words are decoded under (the host's default is
/// 256 MiB; a smaller one keeps the fuzzer's memory down).
const BUDGET: usize = 16 << 20;
/// Most edits one input makes.
const EDITS: u32 = 8;

fn family(u: &mut Unstructured) -> IpFamily {
    if u.arbitrary::<bool>().unwrap_or(false) { IpFamily::V6 } else { IpFamily::V4 }
}

fn index(u: &mut Unstructured, len: usize) -> Option<usize> {
    (len > 0).then(|| u.choose_index(len).ok()).flatten()
}

fn edits(u: &mut Unstructured) -> u32 {
    u.int_in_range(0..=EDITS).unwrap_or(0)
}

/// An iptables ruleset as words: the generator's rules edited (mode 0),
/// or words read whole from the bytes (mode 1, see [`words_from_bytes`]),
/// then words overwritten; decoded, checked, and if accepted written as
/// iptables-restore text that must read back as exactly these rules.
pub fn iptables_words(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let whole = u.arbitrary::<bool>().unwrap_or(false);
    let (lab, mut words) = if whole {
        let rest = u.bytes(u.len()).unwrap_or_default();
        let Some(w) = words_from_bytes(rest) else { return };
        (Lab::of(w.family), w)
    } else {
        let lab = Lab::of(family(&mut u));
        let mut rs = lab.iptables.clone();
        for _ in 0..edits(&mut u) {
            edit_ruleset(&mut u, &mut rs);
        }
        let w = encode_words(lab.family, &rs).unwrap_or_else(|_| encode_words(lab.family, &lab.iptables).unwrap());
        (lab, w)
    };
    for _ in 0..edits(&mut u) {
        edit_words(&mut u, &mut words);
    }
    let Ok(rs) = decode_words(&words, BUDGET) else { return };
    let again = encode_words(words.family, &rs).expect("a decoded ruleset encodes");
    assert_eq!(decode_words(&again, BUDGET).expect("its words decode"), rs, "the words codec round trip");
    let mut model = vipt::Model::default();
    let ctx = vipt::Context { plugin: "fuzz", dialect: lab.dialect(), scope: &lab.scope, model: &model, full: true };
    let Ok(checked) = vipt::check(&ctx, &rs) else { return };
    reads_back_as_checked(lab, &rs);
    // A partial sync on top: the fuzzer's rules alone.
    model.commit(checked);
    let mut partial = IptRuleset::default();
    for _ in 0..edits(&mut u) {
        edit_ruleset(&mut u, &mut partial);
    }
    let ctx = vipt::Context { plugin: "fuzz", dialect: lab.dialect(), scope: &lab.scope, model: &model, full: false };
    if vipt::check(&ctx, &partial).is_ok() {
        reads_back_as_checked(lab, &partial);
    }
    writes_apply(&mut u, lab, &rs, &partial);
}

/// A full sync of `full` and then a partial one of `partial`, as the
/// dataplane prepares them (kept hooks, in-place edits of the host's
/// chains, runs around the main payload, here of a few chains each),
/// applied to a model of iptables-restore: whatever the host accepts
/// applies without an error, and leaves the host's chains as the host
/// believes they are and each declared chain with its rules. Between the
/// two, a Service port of the lab may leave the state (or only its
/// endpoints): a kept hook's rules are then accepted exactly when they
/// would be if returned again and checked in full.
fn writes_apply(u: &mut Unstructured, lab: &Lab, full: &IptRuleset, partial: &IptRuleset) {
    use kpx::kernel::iptables::{Prepared, Previous, prepare_in_runs};
    let (d, settings) = (lab.dialect(), &lab.iptables_settings);
    let per_run = u.int_in_range(1..=8usize).unwrap_or(1);
    let frame = iptables_frame(settings);
    let mut kernel = crate::restore::Tables::default();
    let apply = |kernel: &mut crate::restore::Tables, p: &Prepared, rs: &IptRuleset| {
        if !p.before.is_empty() {
            // As the dataplane does before them (`ensure_chains`).
            for (table, chain) in &frame.chains {
                kernel.ensure(table.name(), chain);
            }
        }
        for run in p.runs() {
            if let Err(e) = kernel.apply(run) {
                panic!("an accepted write fails: {e}\n{run}");
            }
        }
        for ((table, chain), lines) in &p.host_chains {
            assert_eq!(
                kernel.chain(table.name(), chain),
                Some(lines),
                "the host's {chain} is not what the host believes"
            );
        }
        for (table, chain) in &rs.chains {
            let of_chain = rs.rules.iter().filter(|r| r.table == *table && r.chain == *chain);
            let want: Vec<String> = of_chain.flat_map(|r| kpx::syntax::iptables::rule_lines(r, d)).collect();
            assert_eq!(
                kernel.chain(table.name(), chain),
                Some(&want),
                "{} {chain} does not hold its rules",
                table.name()
            );
        }
        for (table, chain) in &rs.delete_chains {
            assert!(kernel.chain(table.name(), chain).is_none(), "{} {chain} was not deleted", table.name());
        }
    };
    // A full ruleset keeps no hook: one that says so is refused whole.
    let full = IptRuleset { kept_hooks: Vec::new(), ..full.clone() };
    let mut model = vipt::Model::default();
    let ctx = vipt::Context { plugin: "fuzz", dialect: d, scope: &lab.scope, model: &model, full: true };
    let Ok(first) = prepare_in_runs(&ctx, settings, &full, BUDGET, None, per_run, &Default::default()) else { return };
    apply(&mut kernel, &first, &full);
    model.commit(first.checked);
    let mut scope = lab.scope.clone();
    scope.forget_removed();
    if let Some(i) = index(u, lab.services.len() + 1).filter(|i| *i < lab.services.len()) {
        let port = &lab.services[i];
        scope.count(lab.family, port, false);
        if u.arbitrary::<bool>().unwrap_or(false) {
            let mut still = port.clone();
            still.endpoints.clear();
            scope.count(lab.family, &still, true);
        }
    }
    let ctx = vipt::Context { plugin: "fuzz", dialect: d, scope: &scope, model: &model, full: false };
    if let Ok(kept) = vipt::kept_hooks(&ctx, partial, Some(first.hooks.clone())) {
        let mut whole = IptRuleset { kept_hooks: Vec::new(), ..partial.clone() };
        whole.rules.extend(kept.values().flatten().cloned());
        let (fast, checked_whole) = (vipt::check_with_kept(&ctx, partial, &kept), vipt::check(&ctx, &whole));
        assert_eq!(
            fast.as_ref().err().map(|e| e.reason.clone()).is_none(),
            checked_whole.as_ref().err().map(|e| e.reason.clone()).is_none(),
            "kept hooks: checked against what left {:?}, checked whole {:?}",
            fast.err(),
            checked_whole.err()
        );
    }
    let previous = Previous { host_chains: first.host_chains, hooks: first.hooks };
    let Ok(second) = prepare_in_runs(&ctx, settings, partial, BUDGET, Some(previous), per_run, &Default::default())
    else {
        return;
    };
    apply(&mut kernel, &second, partial);
    // A restart: a full sync over what the kernel holds (the first one's
    // ruleset again, or the partial one's as a full one) leaves the own
    // chains it holds as wanted out of its runs; the kernel must still end
    // with every chain as the host believes it.
    let again = match u.int_in_range(0..=2u8).unwrap_or(0) {
        0 => full,
        1 => IptRuleset { kept_hooks: Vec::new(), ..partial.clone() },
        // One own chain's rules changed: its last one dropped.
        _ => {
            let mut rs = full;
            if let Some(at) = index(u, rs.rules.len()) {
                let (table, chain) = (rs.rules[at].table, rs.rules[at].chain.clone());
                if let Some(last) = rs.rules.iter().rposition(|r| r.table == table && r.chain == chain) {
                    rs.rules.remove(last);
                }
            }
            rs
        }
    };
    // Someone changed one own chain's rules in ways the parser must see
    // (a negated probability, a DNAT without its destination, a line it
    // does not read): that chain is not left as it is.
    if let Some(lines) = kernel.0.get_mut("nat").and_then(|t| {
        let own: Vec<String> =
            t.keys().filter(|c| c.starts_with("KUBE-SVC-") || c.starts_with("KUBE-SEP-")).cloned().collect();
        index(u, own.len()).and_then(|i| t.get_mut(&own[i]))
    }) && let Some(at) = index(u, lines.len())
    {
        let line = &mut lines[at];
        match u.int_in_range(0..=2u8).unwrap_or(0) {
            0 => *line = line.replace(" --probability ", " ! --probability "),
            1 => {
                if let Some(cut) = line.find(" --to-destination ") {
                    line.truncate(cut);
                }
            }
            _ => {
                let chain = line.split(' ').nth(1).unwrap_or_default().to_string();
                lines.push(format!("-A {chain} -m nosuchmatch -j ACCEPT"));
            }
        }
    }
    let dump = parse_dump(&kernel.save(), d);
    let unchanged = kpx::kernel::iptables::unchanged(&dump, &again, d);
    let mut model = vipt::Model::default();
    model.reset(Table::ALL.into_iter().flat_map(|t| {
        dump.chains(t)
            .filter(|c| kpx_rules::ops::iptables::own_chain_name_problem(c).is_none())
            .map(move |c| (t, c.clone()))
            .collect::<Vec<_>>()
    }));
    let ctx = vipt::Context { plugin: "fuzz", dialect: d, scope: &lab.scope, model: &model, full: true };
    let Ok(third) = prepare_in_runs(&ctx, settings, &again, BUDGET, None, per_run, &unchanged) else { return };
    for (table, chain) in &unchanged {
        let declared = format!(":{chain} ");
        let appended = format!("-A {chain} ");
        assert!(
            !third.runs().flat_map(|r| r.lines()).any(|l| l.starts_with(&declared) || l.starts_with(&appended)),
            "{} {chain} is held as wanted but written again",
            table.name()
        );
    }
    apply(&mut kernel, &third, &again);
}

/// The iptables-restore payload of an accepted ruleset, read as the
/// reconciler reads `iptables-save`: every rule is there, and no line is
/// there that the frame and the ruleset did not ask for.
fn reads_back_as_checked(lab: &Lab, rs: &IptRuleset) {
    let d = lab.dialect();
    let frame = iptables_frame(&lab.iptables_settings);
    let (text, _) = payload(&frame, rs, &[], d, None);
    let dump = parse_dump(&text, d);
    for r in &rs.rules {
        assert!(
            dump.rules(r.table, &r.chain).any(|x| *x == normalize(r, d)),
            "accepted {r:?} does not read back from\n{text}"
        );
    }
    let mut want: std::collections::BTreeMap<(Table, &str), usize> = Default::default();
    for r in frame.rules.iter().chain(&rs.rules).chain(&frame.trailing) {
        *want.entry((r.table, r.chain.as_str())).or_default() += 1;
    }
    for (table, t) in &dump.tables {
        for (chain, lines) in &t.rules {
            for line in lines {
                assert!(matches!(line, Line::Rule(_)), "the host wrote a line it does not read back: {line:?}\n{text}");
            }
            let wanted = want.get(&(*table, chain.as_str())).copied().unwrap_or(0);
            assert_eq!(lines.len(), wanted, "{table:?} {chain}: {} lines for {wanted} rules\n{text}", lines.len());
        }
    }
}

/// One edit of a typed ruleset.
fn edit_ruleset(u: &mut Unstructured, rs: &mut IptRuleset) {
    let Ok(kind) = u.int_in_range(0..=6u8) else { return };
    match kind {
        0 => {
            if let Ok(r) = IptRule::arbitrary(u) {
                let at = index(u, rs.rules.len() + 1).unwrap_or(0);
                rs.rules.insert(at, r);
            }
        }
        1 => {
            if let Some(i) = index(u, rs.rules.len()) {
                rs.rules.remove(i);
            }
        }
        2 => {
            if let Some(i) = index(u, rs.rules.len())
                && let Ok(t) = u.arbitrary()
            {
                rs.rules[i].target = t;
            }
        }
        3 => {
            if let Some(i) = index(u, rs.rules.len())
                && let Ok(m) = u.arbitrary()
            {
                let r = &mut rs.rules[i];
                match index(u, r.matches.len()) {
                    Some(j) if u.arbitrary::<bool>().unwrap_or(false) => r.matches[j] = m,
                    _ => r.matches.push(m),
                }
            }
        }
        4 => match u.int_in_range(0..=2u8).unwrap_or(0) {
            0 => {
                if let Ok(c) = u.arbitrary() {
                    rs.chains.push(c);
                }
            }
            1 => {
                if let Ok(c) = u.arbitrary() {
                    rs.delete_chains.push(c);
                }
            }
            _ => {
                if let Ok(h) = u.arbitrary::<Hook>() {
                    rs.kept_hooks.push(h);
                }
            }
        },
        5 => {
            if let Some(i) = index(u, rs.chains.len()) {
                let c = rs.chains.remove(i);
                if u.arbitrary::<bool>().unwrap_or(false) {
                    rs.delete_chains.push(c);
                }
            }
        }
        _ => {
            // A rule moved into another chain the ruleset names.
            if let (Some(i), Some(c)) = (index(u, rs.rules.len()), index(u, rs.chains.len())) {
                let (table, chain) = rs.chains[c].clone();
                let mut r = rs.rules[i].clone();
                (r.table, r.chain) = (table, chain);
                rs.rules.push(r);
            }
        }
    }
}

/// One edit of the words themselves.
fn edit_words(u: &mut Unstructured, w: &mut RuleWords) {
    let Ok(kind) = u.int_in_range(0..=6u8) else { return };
    let value: u32 = u.arbitrary().unwrap_or(0);
    let list = match kind {
        0..=2 => &mut w.words,
        3 => &mut w.text_ends,
        4 => &mut w.rule_ends,
        5 => &mut w.chains,
        _ => {
            let mut bytes = std::mem::take(&mut w.text).into_bytes();
            if let Some(i) = index(u, bytes.len()) {
                bytes[i] = value as u8;
            }
            w.text = String::from_utf8_lossy(&bytes).into_owned();
            return;
        }
    };
    match (kind, index(u, list.len())) {
        (1, Some(i)) => list.insert(i, value),
        (2, Some(i)) => {
            list.remove(i);
        }
        (_, Some(i)) => list[i] = value,
        (_, None) => list.push(value),
    }
}

/// Words from bytes: a family byte (0 IPv4), the text (a u32 length, then
/// UTF-8, lossily), then text-ends, chains, delete-chains, rule-ends and
/// words (each a u32 count, then u32s; little-endian), then kept hooks
/// (a byte each). Counts are cut to the bytes there are.
pub fn words_from_bytes(data: &[u8]) -> Option<RuleWords> {
    let mut r = Reader(data);
    let family = if r.byte()? == 0 { IpFamily::V4 } else { IpFamily::V6 };
    let n = r.u32()? as usize;
    let text = String::from_utf8_lossy(r.take(n.min(r.0.len()))).into_owned();
    let mut lists: [Vec<u32>; 5] = Default::default();
    for list in &mut lists {
        let n = (r.u32().unwrap_or(0) as usize).min(r.0.len() / 4);
        *list = (0..n).filter_map(|_| r.u32()).collect();
    }
    let kept_hooks = r.0.iter().map(|b| Hook::ALL[usize::from(*b) % Hook::ALL.len()]).collect();
    let [text_ends, chains, delete_chains, rule_ends, words] = lists;
    Some(RuleWords { family, text, text_ends, chains, delete_chains, kept_hooks, rule_ends, words })
}

/// The bytes [`words_from_bytes`] reads back as `w` (seeds).
pub fn words_to_bytes(w: &RuleWords) -> Vec<u8> {
    let mut out = vec![u8::from(w.family == IpFamily::V6)];
    out.extend((w.text.len() as u32).to_le_bytes());
    out.extend(w.text.as_bytes());
    for list in [&w.text_ends, &w.chains, &w.delete_chains, &w.rule_ends, &w.words] {
        out.extend((list.len() as u32).to_le_bytes());
        out.extend(list.iter().flat_map(|v| v.to_le_bytes()));
    }
    out.extend(w.kept_hooks.iter().map(|h| Hook::ALL.iter().position(|x| x == h).unwrap_or(0) as u8));
    out
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }
    fn byte(&mut self) -> Option<u8> {
        self.take(1).first().copied()
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).try_into().ok().map(u32::from_le_bytes)
    }
}

/// nftables transactions: the generator's full one edited, checked as a
/// full sync; if accepted, every rule encodes to a message that decodes
/// back to it, the tracer follows packets through it, and a second
/// transaction of the fuzzer's ops is checked as a partial sync on top.
pub fn nftables_ops(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let lab = Lab::of(family(&mut u));
    let mut tx = lab.nftables.clone();
    for _ in 0..edits(&mut u) {
        edit_ops(&mut u, &mut tx.ops);
    }
    let mut model = vnft::Model::default();
    let ctx = vnft::Context { plugin: "fuzz", family: lab.family, scope: &lab.scope, model: &model, full: true };
    let Ok(checked) = vnft::check(&ctx, &tx) else { return };
    encodes_as_checked(lab, &tx);
    traces(lab, &tx);
    model.commit(checked);
    // A partial sync: one of the generator's, or none, edited.
    let mut partial = match u.int_in_range(0..=lab.nftables_partials.len()).unwrap_or(0) {
        0 => Transaction::default(),
        i => lab.nftables_partials[i - 1].clone(),
    };
    for _ in 0..edits(&mut u) {
        edit_ops(&mut u, &mut partial.ops);
    }
    let ctx = vnft::Context { plugin: "fuzz", family: lab.family, scope: &lab.scope, model: &model, full: false };
    if vnft::check(&ctx, &partial).is_ok() {
        encodes_as_checked(lab, &partial);
        two_steps_agree(lab, &tx, &partial);
    }
}

/// The table after the frame and `ops`, as the tracer models it.
fn table(lab: &Lab, ops: &[Op]) -> Option<kpx_rules::trace::nftables::Model> {
    let mut model = kpx_rules::trace::nftables::Model::new(lab.family, lab.masquerade_mark());
    let frame = kpx::kernel::nftables::frame::frame(&lab.nftables_settings, &Default::default());
    model.apply(&Transaction { ops: frame }).ok()?;
    model.apply(&Transaction { ops: ops.to_vec() }).ok()?;
    Some(model)
}

/// Applies `ops` as the kernel would refuse them: a rule or element that
/// names a chain or set not there, an element added under a key its set
/// holds. Err names the first such op.
fn apply_strict(model: &mut kpx_rules::trace::nftables::Model, ops: &[Op]) -> Result<(), String> {
    for op in ops {
        match op {
            Op::AddRule(r) => {
                let refs_ok = match &r.verdict {
                    nft::Verdict::Jump(c) | nft::Verdict::Goto(c) => model.chains.contains_key(c),
                    nft::Verdict::DnatMap { map, .. } | nft::Verdict::Vmap { map, .. } => {
                        model.sets.contains_key(map.name())
                    }
                    _ => true,
                };
                let lookups_ok = r.matches.iter().all(|m| match m {
                    nft::Match::Lookup { set, .. } => model.sets.contains_key(set.name()),
                    _ => true,
                });
                if !model.chains.contains_key(&r.chain) || !refs_ok || !lookups_ok {
                    return Err(format!("{op:?} names what is not there"));
                }
            }
            Op::AddElements(e) => {
                let Some((decl, held)) = model.sets.get(e.set.name()) else {
                    return Err(format!("{op:?}: no set"));
                };
                if !e.chains.iter().all(|c| model.chains.contains_key(c)) {
                    return Err(format!("{op:?}: a chain not there"));
                }
                let new = nft::decode_elements(decl, model.family, e).map_err(|d| d.to_string())?;
                if new.iter().any(|n| held.iter().any(|h| h.key == n.key)) {
                    return Err(format!("{op:?}: a key already held"));
                }
            }
            _ => {}
        }
        model.apply_op(op).map_err(|e| format!("{op:?}: {e:?}"))?;
    }
    Ok(())
}

/// Chains with their rules in order, sets with their elements as sets.
type Contents = (Vec<(String, Vec<nft::Rule>)>, Vec<(String, nft::SetDecl, Vec<nft::Element>)>);

fn contents(model: &kpx_rules::trace::nftables::Model) -> Contents {
    let chains = model.chains.iter().map(|(n, c)| (n.clone(), c.rules.clone())).collect();
    let sets = model
        .sets
        .iter()
        .map(|(n, (d, e))| {
            let mut e = e.clone();
            e.sort();
            e.dedup();
            (n.clone(), d.clone(), e)
        })
        .collect();
    (chains, sets)
}

/// An accepted partial sync written in two steps (`steps::split_partial`)
/// leaves what one step leaves, and where one step applies cleanly on the
/// table the full sync left, so do both steps. And a full sync's first
/// step (`Held::first_of_full`, the full sync recorded) applies cleanly
/// on that table.
fn two_steps_agree(lab: &Lab, full: &Transaction, partial: &Transaction) {
    use kpx::kernel::nftables::steps;
    let Some(before) = table(lab, &full.ops) else { return };
    let decl_of = |s: &nft::SetRef| match s {
        nft::SetRef::Host(h) => Some(h.declaration()),
        nft::SetRef::Own(n) => before.sets.get(n).map(|(d, _)| d.clone()).or_else(|| {
            partial.ops.iter().find_map(|op| match op {
                Op::AddSet(d) if &d.name == n => Some(d.clone()),
                _ => None,
            })
        }),
    };
    if let Some((first, rest)) = steps::split_partial(lab.family, &partial.ops, &decl_of) {
        let mut one = before.clone();
        if apply_strict(&mut one, &partial.ops).is_ok() {
            let mut two = before.clone();
            apply_strict(&mut two, &first).unwrap_or_else(|e| panic!("first step: {e}\nfirst {first:?}"));
            apply_strict(&mut two, &rest).unwrap_or_else(|e| panic!("second step: {e}\nrest {rest:?}"));
            assert!(contents(&one) == contents(&two), "two steps leave another table: first {first:?} rest {rest:?}");
        }
    }
    // A full sync again, with the same ops: its first step is empty.
    let frame = kpx::kernel::nftables::frame::frame(&lab.nftables_settings, &Default::default());
    let mut held = steps::Held::default();
    held.record(lab.family, &[&frame, &full.ops], &decl_of, true);
    let chains: std::collections::HashSet<&str> = before.chains.keys().map(String::as_str).collect();
    let sets: std::collections::HashSet<&str> = before.sets.keys().map(String::as_str).collect();
    let none = std::collections::HashSet::new();
    let again = held.first_of_full(lab.family, &[&frame, &full.ops], &decl_of, &chains, &sets, &none);
    assert!(again.is_empty(), "the same full sync again adds first {again:?}");
    // The partial's ops as the next full sync (what it adds on top of the
    // table): its first step applies cleanly.
    let mut next = full.ops.clone();
    next.extend(
        partial
            .ops
            .iter()
            .filter(|op| matches!(op, Op::AddChain(_) | Op::AddSet(_) | Op::AddRule(_) | Op::AddElements(_)))
            .cloned(),
    );
    let first = held.first_of_full(lab.family, &[&frame, &next], &decl_of, &chains, &sets, &none);
    let mut two = before.clone();
    if let Err(e) = apply_strict(&mut two, &first) {
        panic!("a full sync's first step: {e}\nfirst {first:?}");
    }
}

/// Each accepted rule's NEWRULE message decodes back to the rule (its
/// prefixes at their network address, its comment as the host writes it).
fn encodes_as_checked(lab: &Lab, tx: &Transaction) {
    let mark = lab.masquerade_mark();
    for op in &tx.ops {
        let Op::AddRule(rule) = op else { continue };
        let msg = encode::add_rule(lab.family, mark, rule).unwrap_or_else(|e| panic!("accepted {rule:?}: {e}"));
        let (chain, back) = decode::rule(lab.family, mark, &msg.attrs.buf);
        assert_eq!(chain, rule.chain);
        let mut want = rule.clone();
        for m in &mut want.matches {
            if let nft::Match::Address { cidr, .. } = m {
                *cidr = Cidr { addr: cidr.network(), prefix_len: cidr.prefix_len };
            }
        }
        want.comment = want.comment.map(|c| kpx_rules::ops::sanitize_comment(&c, kpx::syntax::nftables::MAX_COMMENT));
        assert_eq!(back.unwrap_or_else(|e| panic!("accepted {rule:?}: {e}")), want);
    }
}

/// The tracer's model of the frame and the transaction, and packets to
/// the lab's first Service from the node and from outside.
fn traces(lab: &Lab, tx: &Transaction) {
    let mut model = kpx_rules::trace::nftables::Model::new(lab.family, lab.masquerade_mark());
    let frame = kpx::kernel::nftables::frame::frame(&lab.nftables_settings, &Default::default());
    if model.apply(&Transaction { ops: frame }).is_err() || model.apply(tx).is_err() {
        return;
    }
    let node = TraceNode { local_addresses: lab.node.addresses.clone() };
    for src in [lab.node.addresses[0], lab.ip(30)] {
        let packet = Packet {
            src,
            dst: lab.ip(1),
            dport: 1,
            protocol: Protocol::Tcp,
            from_node: src == lab.node.addresses[0],
            in_interface: None,
        };
        let _ = kpx_rules::trace::nftables::trace_nftables(&model, &node, &packet);
    }
}

/// One edit of a list of operations.
fn edit_ops(u: &mut Unstructured, ops: &mut Vec<Op>) {
    let Ok(kind) = u.int_in_range(0..=5u8) else { return };
    match kind {
        0 => {
            if let Ok(op) = Op::arbitrary(u) {
                let at = index(u, ops.len() + 1).unwrap_or(0);
                ops.insert(at, op);
            }
        }
        1 => {
            if let Some(i) = index(u, ops.len()) {
                ops.remove(i);
            }
        }
        2 => {
            if let Some(i) = index(u, ops.len())
                && let Ok(op) = Op::arbitrary(u)
            {
                ops[i] = op;
            }
        }
        3 => {
            if let Some(i) = index(u, ops.len()) {
                let op = ops[i].clone();
                let at = index(u, ops.len() + 1).unwrap_or(0);
                ops.insert(at, op);
            }
        }
        4 => {
            // An element word overwritten, added or cut.
            let Some(i) = index(u, ops.len()) else { return };
            let (Op::AddElements(e) | Op::DeleteElements(e)) = &mut ops[i] else { return };
            let value: u32 = u.arbitrary().unwrap_or(0);
            match index(u, e.words.len()) {
                Some(j) if u.arbitrary::<bool>().unwrap_or(false) => e.words[j] = value,
                Some(j) => e.words.truncate(j),
                None => e.words.push(value),
            }
        }
        _ => {
            // A rule's match, statement or verdict replaced.
            let Some(i) = index(u, ops.len()) else { return };
            let Op::AddRule(r) = &mut ops[i] else { return };
            match u.int_in_range(0..=2u8).unwrap_or(0) {
                0 => {
                    if let Ok(m) = u.arbitrary() {
                        match index(u, r.matches.len()) {
                            Some(j) => r.matches[j] = m,
                            None => r.matches.push(m),
                        }
                    }
                }
                1 => {
                    if let Ok(s) = u.arbitrary() {
                        r.statements.push(s);
                    }
                }
                _ => {
                    if let Ok(v) = u.arbitrary() {
                        r.verdict = v;
                    }
                }
            }
        }
    }
}
