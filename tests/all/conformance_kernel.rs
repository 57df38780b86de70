//! The conformance suite in the real kernel, through
//! `kpx::conformance::kernel` (the code `kpx conformance --kernel` runs):
//! each case in its own namespaces with kpx running in the node one, real
//! packets for every flow. nftables mode goes through the command itself.

use kpx::conformance::Report;
use kpx::conformance::kernel::{self, SINK_LISTENER};
use kpx_netlab::Lab;

use crate::support::{KPX, plugin_cache};
use kpx::conformance::cases::Case;

/// Whether namespaces can be built here; as root they must be.
pub fn lab_available(what: &str) -> bool {
    match Lab::new() {
        Ok(_) => true,
        Err(kpx_netlab::Error::Unavailable(why)) if nix::unistd::geteuid().is_root() => {
            panic!("{what}: running as root, yet namespaces cannot be built: {why}")
        }
        Err(e) => {
            eprintln!("SKIPPED {what}: {e}");
            false
        }
    }
}

/// The report's figures and failures; fails the test on any failure.
fn judge(report: &Report, mode: &str, min_passed: usize) {
    let passed: usize = report.rows.iter().map(|r| r.passed).sum();
    let skipped: Vec<String> =
        report.rows.iter().flat_map(|r| r.skipped.iter().map(move |s| format!("{}: {s}", r.feature))).collect();
    for s in &skipped {
        eprintln!("  {s}");
    }
    // "ipvs:" lines of the guest's console are shown by the host.
    eprintln!(
        "{}conformance (kernel, {mode}): {passed} flows passed, {} traced only, {} failed",
        if mode == "ipvs" { "ipvs: " } else { "" },
        skipped.len(),
        report.failures()
    );
    assert!(report.failures() == 0, "\n{}", report.failure_lines().join("\n"));
    assert!(passed >= min_passed, "only {passed} flows passed in the kernel");
}

fn run(mode: &str) {
    if !lab_available(&format!("conformance in the kernel ({mode})")) {
        return;
    }
    let mut report = Report::default();
    kernel::flows(&mut report, std::path::Path::new(KPX), mode, &["--plugin-cache-dir".into(), plugin_cache()]);
    judge(&report, mode, 60);
}

#[test]
fn iptables_mode_passes_every_case_in_the_kernel() {
    run("iptables");
}

/// Through `kpx conformance --kernel`, as a plugin author runs it.
#[test]
fn nftables_mode_passes_every_case_in_the_kernel() {
    if !lab_available("conformance in the kernel (nftables)") {
        return;
    }
    let out = std::process::Command::new(KPX)
        .args(["conformance", "--kernel", "--plugin-cache-dir", &plugin_cache(), "builtin:nftables"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kpx conformance --kernel builtin:nftables failed");
    let kernel_flows: usize = text
        .lines()
        .filter(|l| l.starts_with("flows (kernel)"))
        .filter_map(|l| l.split_whitespace().rev().nth(3).and_then(|n| n.parse::<usize>().ok()))
        .sum();
    assert!(kernel_flows >= 60, "only {kernel_flows} flows passed in the kernel:\n{text}");
}

/// userspace mode relays every connection itself: the endpoint sees the
/// node, and where the mode differs by nature the case says so
/// (`expect_userspace`).
#[test]
fn userspace_mode_passes_every_case_in_the_kernel() {
    run("userspace");
}

/// ipvs mode needs a kernel with ip_vs: inside the qemu guest here (kpx
/// and its compiled plugins copied in; the cases are inside kpx).
#[test]
fn ipvs_mode_passes_every_case_in_the_kernel() {
    let name = "conformance_kernel::ipvs_mode_passes_every_case_in_the_kernel";
    crate::ipvs::kpx_where_ipvs_is(name, &[], || run("ipvs"));
}

/// The runner itself: with no rules at all, a flow that must be dropped is
/// answered (by the listener behind it) and so fails, and an ACCEPT passes.
#[test]
fn the_kernel_runner_tells_drop_from_accept() {
    if !lab_available("the_kernel_runner_tells_drop_from_accept") {
        return;
    }
    let case = Case::all().into_iter().find(|c| c.label().starts_with("23-")).expect("the ServiceCIDR case");
    let lab = kernel::build(&case, "nftables").unwrap();
    let drop = case.flows.iter().find(|f| f.expected("nftables") == "DROP").expect("a DROP flow");
    let err = kernel::check_flow(&case, &lab, drop, "nftables").unwrap_err();
    // Answered by the listener behind the destination, which a DROP must not be.
    assert!(err.contains(&format!("server: {SINK_LISTENER:?}")), "{err}");
    let mut accepted = drop.clone();
    accepted.expect = "ACCEPT".into();
    accepted.expect_nftables = None;
    kernel::check_flow(&case, &lab, &accepted, "nftables").unwrap();
}
