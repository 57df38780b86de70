//! What `words::decode` allocates, measured by a counting allocator (this
//! test binary only: kpx-rules' lib forbids unsafe code). The host's
//! output limit holds "before anything larger is allocated"
//! (`Limits::max_output_bytes`): the words are at most the limit
//! (wasmtime's hostcall fuel) and `decode` gets what is left of it as its
//! budget, so decoding words of B bytes with a budget of B may not
//! allocate much more than B, whatever lengths the plugin wrote. These
//! tests hold it to 2 B, as tests/memory holds the 0.2.0 path. (A red-team
//! review found each of these reservations taken from a plugin's length
//! before any check: 64 Mi rule ends, within the default limit, asked
//! for 5.5 GiB at once, and where that allocation fails Rust aborts kpx.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use kpx_rules::model::IpFamily;
use kpx_rules::ops::iptables::words::{RuleWords, chain, decode, matches, target};
use kpx_rules::ops::iptables::{Match, Rule};

struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn add(delta: isize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Peak bytes allocated on this thread while `f` runs, above what was live before.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, isize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, PEAK.with(Cell::get) - base)
}

fn empty() -> RuleWords {
    RuleWords {
        family: IpFamily::V4,
        text: String::new(),
        text_ends: vec![],
        chains: vec![],
        delete_chains: vec![],
        kept_hooks: vec![],
        rule_ends: vec![],
        words: vec![],
    }
}

fn input_bytes(w: &RuleWords) -> usize {
    w.text.len() + 4 * (w.text_ends.len() + w.chains.len() + w.delete_chains.len() + w.rule_ends.len() + w.words.len())
}

/// Rule ends alone (rule 0 empty, refused at once) reserve no rules past the budget.
#[test]
fn rule_ends_reserve_no_rules_past_the_budget() {
    let mut w = empty();
    w.rule_ends = vec![0; 1 << 20];
    let budget = input_bytes(&w);
    let (result, peak) = peak_during(|| decode(&w, budget));
    let err = result.expect_err("rule 0 is empty");
    println!("{} bytes of rule-ends, budget {budget}: refused ({err}) after allocating {peak} bytes", input_bytes(&w));
    assert!(peak < 2 * budget as isize, "{peak} bytes allocated for a {budget}-byte budget");
}

/// Nor do chain pairs, refused at the first.
#[test]
fn chain_pairs_reserve_nothing_past_the_budget() {
    let mut w = empty();
    w.chains = vec![u32::MAX; 4 << 20];
    let budget = input_bytes(&w);
    let (result, peak) = peak_during(|| decode(&w, budget));
    let err = result.expect_err("table 4294967295");
    println!("{} bytes of chains, budget {budget}: refused ({err}) after allocating {peak} bytes", input_bytes(&w));
    assert!(peak < 2 * budget as isize, "{peak} bytes allocated for a {budget}-byte budget");
}

/// Nor does one long rule whose first match is refused.
#[test]
fn a_long_rule_reserves_no_matches_past_the_budget() {
    let mut w = empty();
    w.words = vec![chain::OWN_NAT + 99; 2 << 20];
    w.words[0] = 0; // nat KUBE-SERVICES
    w.words[1] = target::ACCEPT;
    w.rule_ends = vec![w.words.len() as u32];
    let budget = input_bytes(&w);
    let (result, peak) = peak_during(|| decode(&w, budget));
    let err = result.expect_err("match 105");
    println!("{} bytes of words, budget {budget}: refused ({err}) after allocating {peak} bytes", input_bytes(&w));
    assert!(peak < 2 * budget as isize, "{peak} bytes allocated for a {budget}-byte budget");
}

/// A rule holds the room it was charged for: 255 IPv6 source matches a
/// rule (seven words each) are 255 matches' room, not the words' count.
#[test]
fn decoded_rules_hold_what_they_were_charged() {
    let mut w = empty();
    w.family = IpFamily::V6;
    let mut rule = vec![0, target::ACCEPT];
    for _ in 0..255 {
        rule.extend([matches::SOURCE, 0, 128, 0xfd00_0000, 0, 0, 1]);
    }
    const RULES: usize = 2_000;
    for _ in 0..RULES {
        w.words.extend_from_slice(&rule);
        w.rule_ends.push(w.words.len() as u32);
    }
    // What decode charges: per rule, the Rule, its hook's name and its matches.
    let charged = RULES * (size_of::<Rule>() + "KUBE-SERVICES".len() + 255 * size_of::<Match>());
    let (result, peak) = peak_during(|| decode(&w, charged).map(|rs| rs.rules.len()));
    assert_eq!(result, Ok(RULES), "the budget fits exactly");
    println!("budget {charged}: the decoded rules took {peak} bytes");
    assert!(peak < charged as isize * 3 / 2, "{peak} bytes held for a {charged}-byte budget");
}
