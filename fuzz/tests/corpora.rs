//! The fuzz targets in `cargo xtask test`: every committed input (the
//! corpus libFuzzer grew, and the inputs that once broke kpx under
//! fuzz/regressions/) and then a short seeded mutation run of each
//! target: a smoke run, not a search (`cargo xtask fuzz` searches).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long each target's mutation run lasts.
const SMOKE: Duration = Duration::from_secs(2);

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else { continue };
        for path in entries.filter_map(Result::ok).map(|e| e.path()) {
            out.push((path.clone(), std::fs::read(&path).expect("read an input")));
        }
    }
    out.sort();
    out
}

/// xorshift64*: the same mutations on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
}

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, other: &[u8]) {
    const INTERESTING: [u8; 8] = [0, 1, 0x7f, 0x80, 0xff, b'"', b'\n', b' '];
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(input.len() + 1);
        match rng.below(6) {
            0 if at < input.len() => input[at] ^= 1 << rng.below(8),
            1 if at < input.len() => input[at] = INTERESTING[rng.below(INTERESTING.len())],
            2 => {
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                input.splice(at..at, bytes);
            }
            3 if at < input.len() => {
                let end = (at + 1 + rng.below(16)).min(input.len());
                input.drain(at..end);
            }
            4 if at < input.len() => {
                let end = (at + 1 + rng.below(32)).min(input.len());
                let copy = input[at..end].to_vec();
                let to = rng.below(input.len() + 1);
                input.splice(to..to, copy);
            }
            _ if !other.is_empty() => {
                let from = rng.below(other.len());
                let end = (from + 1 + rng.below(64)).min(other.len());
                input.splice(at..at, other[from..end].iter().copied());
            }
            _ => input.push(rng.next() as u8),
        }
    }
}

fn run_one(name: &str, what: &str, run: fn(&[u8]), input: &[u8]) {
    if let Err(e) = catch_unwind(AssertUnwindSafe(|| run(input))) {
        let why = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
        let keep = std::env::temp_dir().join(format!("kpx-fuzz-{name}-failure"));
        let _ = std::fs::write(&keep, input);
        panic!("{name}: {what} fails ({}); the input is in {}", why.unwrap_or_default(), keep.display());
    }
}

fn smoke(name: &str) {
    let run = kpx_fuzz::target(name).expect("a target");
    let corpus = inputs(name);
    assert!(!corpus.is_empty(), "{name}: no committed inputs under fuzz/corpus/{name}");
    for (path, input) in &corpus {
        run_one(name, &path.display().to_string(), run, input);
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ name.len() as u64);
    let (start, mut runs) = (Instant::now(), 0u64);
    while start.elapsed() < SMOKE {
        let mut input = corpus[rng.below(corpus.len())].1.clone();
        let other = &corpus[rng.below(corpus.len())].1;
        mutate(&mut rng, &mut input, other);
        run_one(name, &format!("mutation {runs}"), run, &input);
        runs += 1;
    }
    eprintln!("{name}: {} committed inputs, {runs} mutations in {:?}", corpus.len(), start.elapsed());
}

macro_rules! targets {
    ($($name:ident),*) => {
        $(#[test] fn $name() { smoke(stringify!($name)); })*

        /// Every target has its test here.
        #[test]
        fn every_target_is_tested() {
            let tested = [$(stringify!($name)),*];
            for (name, _) in kpx_fuzz::TARGETS {
                assert!(tested.contains(name), "no test for target {name}");
            }
        }
    };
}

targets!(manifests, config, api_objects, netlink, iptables_save, iptables_words, nftables_ops);

/// The contract targets start from rules the host accepts: an edit the
/// fuzzer makes is tried against the checks from a state that passes
/// them, so the properties after acceptance are reached.
#[test]
fn the_labs_generator_rules_are_accepted() {
    use kpx::validate::{iptables as vipt, nftables as vnft};
    use kpx_rules::model::IpFamily;
    for family in [IpFamily::V4, IpFamily::V6] {
        let lab = kpx_fuzz::Lab::of(family);
        assert!(lab.iptables.rules.len() > 10 && lab.nftables.ops.len() > 10, "the generators render the lab's state");
        let model = vipt::Model::default();
        let ctx = vipt::Context { plugin: "lab", dialect: lab.dialect(), scope: &lab.scope, model: &model, full: true };
        if let Err(e) = vipt::check(&ctx, &lab.iptables) {
            panic!("{family:?} iptables: {e}");
        }
        let model = vnft::Model::default();
        let ctx = vnft::Context { plugin: "lab", family, scope: &lab.scope, model: &model, full: true };
        if let Err(e) = vnft::check(&ctx, &lab.nftables) {
            panic!("{family:?} nftables: {e}");
        }
    }
}

/// The netlink target's seeds reach the element decoder: a set's
/// declaration, then its elements, decode to elements (a review found
/// the decoder unreachable when sets and elements were read from the
/// same message).
#[test]
fn the_netlink_seeds_reach_the_element_decoder() {
    use kpx::kernel::netlink;
    use kpx::kernel::nftables::decode;
    use kpx_rules::model::IpFamily;
    for (family, name) in [(IpFamily::V4, "seed-generator-v4"), (IpFamily::V6, "seed-generator-v6")] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/netlink").join(name);
        let data = std::fs::read(&path).expect("the seed");
        let (mut decl, mut decoded) = (None, 0);
        for (_, _, _, payload) in netlink::split_replies(&data).expect("the seed splits") {
            let attrs = &payload[4..];
            if let Some(d) = &decl
                && let Ok(elements) = decode::elements(family, d, attrs)
            {
                decoded += elements.len();
            }
            if let Ok(info) = decode::set(attrs) {
                decl = decode::declaration(family, &info).ok();
            }
        }
        assert!(decoded > 0, "{name}: no element decoded");
    }
}
