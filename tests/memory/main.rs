//! What a plugin's output costs the host in memory, measured by a counting
//! allocator (this test binary only) on the calling thread:
//! - the output cap holds *before* the host copies the output: a component
//!   that returns far more than the limit makes the host allocate about
//!   the limit, not the output;
//! - checking and encoding elements takes a few times their words, not the
//!   45x the red team measured (a set name and a typed key per element);
//! - a refused operation is named without formatting it whole;
//! - the netlink batch is held to the byte budget however few words name
//!   long chains.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use kpx::kernel::netlink::nfnl::Batch;
use kpx::kernel::nftables::messages;
use kpx::runtime::{Error, Limits, Runtime};
use kpx::validate::Scope;
use kpx::validate::nftables::{Context, Model, check};
use kpx_rules::model::{Cluster, Endpoint, IpFamily, Node, Protocol, ProxyMode, ServicePort, Settings};
use kpx_rules::ops::nftables::{
    DataType, ElementWriter, HostSet, KeyType, Op, SetDecl, SetRef, Transaction, VerdictKind,
};

struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn add(delta: isize) {
    // `try_with`: nothing to count once the thread's locals are gone.
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

/// Bytes allocated on this thread while `f` runs, above what was live before.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, isize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, PEAK.with(Cell::get) - base)
}

#[test]
fn a_huge_output_is_refused_before_the_host_allocates_it() {
    let bytes = std::fs::read(format!("{}/kpx_plugin_hostile.wasm", env!("KPX_TEST_PLUGIN_DIR"))).unwrap();
    const LIMIT: u64 = 1 << 20;
    let mut svc = ServicePort::new("t", "hostile-huge", "", Protocol::Tcp, 80);
    svc.cluster_ip = Some("10.96.0.1".parse().unwrap());
    for mode in [ProxyMode::Iptables, ProxyMode::Nftables] {
        // What the output weighs once in the host: with a cap far above it.
        let roomy = Runtime::new(Limits { max_output_bytes: 1 << 30, ..Limits::default() }, None).unwrap();
        let plugin = roomy.load_backend("hostile", &bytes).unwrap();
        let mut instance = plugin.instantiate(&Settings::new(IpFamily::V4, mode)).unwrap();
        instance.reset(&Node::default(), &Cluster::default(), &[svc.clone()]).unwrap();
        let (result, whole) = peak_during(|| instance.render(true, 1));
        assert!(result.is_ok(), "{mode}: the huge output fits a 1 GiB cap: {:?}", result.err());
        assert!(whole > 8 * LIMIT as isize, "{mode}: the output weighs {whole} bytes in the host");

        let tight = Runtime::new(Limits { max_output_bytes: LIMIT, ..Limits::default() }, None).unwrap();
        let plugin = tight.load_backend("hostile", &bytes).unwrap();
        let mut instance = plugin.instantiate(&Settings::new(IpFamily::V4, mode)).unwrap();
        instance.reset(&Node::default(), &Cluster::default(), &[svc.clone()]).unwrap();
        let (result, capped) = peak_during(|| instance.render(true, 1));
        assert!(matches!(result, Err(Error::OutputTooLarge { .. })), "{mode}: {:?}", result.err());
        println!("{mode}: output {whole} bytes in the host uncapped; {capped} bytes allocated with a {LIMIT}-byte cap");
        assert!(capped < 2 * LIMIT as isize, "{mode}: {capped} bytes allocated for a {LIMIT}-byte cap");
    }
}

/// A state with one Service (10.96.0.10:80/tcp) and its endpoint 10.1.0.5:8080.
fn scope() -> Scope {
    let mut p = ServicePort::new("ns", "web", "", Protocol::Tcp, 80)
        .with_cluster_endpoints(vec![Endpoint::ready("10.1.0.5".parse().unwrap(), 8080)]);
    p.cluster_ip = Some("10.96.0.10".parse().unwrap());
    let mut s = Scope::default();
    s.count(IpFamily::V4, &p, true);
    s
}

fn long_name(prefix: &str) -> String {
    format!("{prefix}{}", "x".repeat(199 - prefix.len()))
}

#[test]
fn checking_and_encoding_elements_takes_a_bounded_multiple_of_their_words() {
    const N: u32 = 500_000;
    let name = long_name("m");
    let map = SetDecl {
        name: name.clone(),
        key: vec![KeyType::Integer],
        data: Some(DataType::Endpoint),
        interval: false,
        timeout_seconds: None,
        comment: None,
    };
    let mut w = ElementWriter::new(IpFamily::V4, SetRef::Own(name));
    for i in 0..N {
        w.word(i).endpoint("10.1.0.5".parse().unwrap(), 8080);
    }
    let tx = Transaction { ops: vec![Op::AddSet(map.clone()), Op::AddElements(w.finish())] };
    let words = 3 * 4 * N as isize;
    let scope = scope();
    let model = Model::default();
    let (checked, checking) = peak_during(|| {
        check(&Context { plugin: "t", family: IpFamily::V4, scope: &scope, model: &model, full: true }, &tx)
    });
    let checked = checked.expect("accepted");
    let mut model = Model::default();
    let ((), committing) = peak_during(|| model.commit(checked));
    let decls = |_: &SetRef| Some(map.clone());
    let (encoded, encoding) = peak_during(|| {
        let mut batch = Batch::new();
        let (sizes, hints) = (Default::default(), Default::default());
        let sets = kpx::kernel::nftables::Sets { decls: &decls, sizes: &sizes, hints: &hints };
        messages(&mut batch, IpFamily::V4, 0x4000, &tx.ops, &sets, usize::MAX).map(|()| batch)
    });
    let netlink = encoded.expect("encoded").bytes();
    println!(
        "{N} elements, {words} bytes of words: check {checking} bytes, model {committing}, netlink {netlink} ({encoding} allocated)"
    );
    // About 100 bytes an element (a hash table entry with the key inline):
    // under 10x the words of the smallest element there is (12 bytes);
    // the model takes the table over without a copy.
    assert!(checking < 10 * words, "the check took {checking} bytes for {words} bytes of words");
    assert!(committing < 1 << 20, "committing took {committing} bytes");
    assert!(encoding < 4 * words, "encoding took {encoding} bytes for {words} bytes of words");
}

#[test]
fn a_refused_operation_is_named_without_formatting_it_whole() {
    let mut w = ElementWriter::new(IpFamily::V4, SetRef::Host(HostSet::ClusterIps));
    for i in 0..4_000_000u32 {
        w.word(0x0a60_0000 + (i % 1000));
    }
    let tx = Transaction { ops: vec![Op::AddElements(w.finish())] };
    let (scope, model) = (scope(), Model::default());
    let (result, peak) = peak_during(|| {
        check(&Context { plugin: "t", family: IpFamily::V4, scope: &scope, model: &model, full: true }, &tx)
    });
    let err = result.expect_err("10.96.0.0 is no cluster IP of the state");
    println!("refused 16 MB of words with {peak} bytes allocated: {err}");
    assert!(peak < 1 << 20, "{peak} bytes allocated to refuse it");
}

#[test]
fn the_netlink_batch_is_held_to_the_byte_budget() {
    // Elements of a few words each, every one naming a 199-byte chain.
    const N: u32 = 200_000;
    const BUDGET: usize = 4 << 20;
    let chain = long_name("c");
    let map = SetDecl {
        name: "v".into(),
        key: vec![KeyType::Integer],
        data: Some(DataType::Verdict),
        interval: false,
        timeout_seconds: None,
        comment: None,
    };
    let mut w = ElementWriter::new(IpFamily::V4, SetRef::Own("v".into()));
    for i in 0..N {
        w.word(i).verdict(VerdictKind::Goto, Some(&chain));
    }
    let ops = vec![Op::AddElements(w.finish())];
    let decls = |_: &SetRef| Some(map.clone());
    let (sizes, hints) = (Default::default(), Default::default());
    let sets = kpx::kernel::nftables::Sets { decls: &decls, sizes: &sizes, hints: &hints };
    let (result, peak) = peak_during(|| messages(&mut Batch::new(), IpFamily::V4, 0x4000, &ops, &sets, BUDGET));
    let err = result.expect_err("over the budget");
    println!("{N} goto elements: refused ({err}) with {peak} bytes allocated");
    assert!(err.contains("more than the limit"), "{err}");
    assert!(peak < 2 * BUDGET as isize, "{peak} bytes allocated for a {BUDGET}-byte budget");
}
