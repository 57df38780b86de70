//! Builds the plugin crates for wasm32-unknown-unknown as components (the
//! toolchain's `wasm-component-ld` is the linker, so they import nothing but
//! kpx's own interfaces) and embeds the built-in ones in the kpx binary.
//!
//! The nested cargo uses its own target directory (target/wasm-plugins), so
//! it never waits on the outer build's lock and stays cached across profiles.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Built-in plugins, embedded in kpx: (crate, name used by --proxy-mode).
const BUILT_IN: &[(&str, &str)] = &[
    ("kpx-plugin-iptables", "iptables"),
    ("kpx-plugin-nftables", "nftables"),
    ("kpx-plugin-ipvs", "ipvs"),
    ("kpx-plugin-schedulers", "schedulers"),
];
/// Plugins built for tests only, and the extension examples (loaded from
/// disk with --backend-plugin, --scheduler-plugin or --extension).
const TEST_ONLY: &[&str] = &[
    "kpx-plugin-hostile",
    "kpx-plugin-nftables-v0-2",
    "kpx-plugin-first",
    "kpx-plugin-wasi-probe",
    "kpx-plugin-hot-v1",
    "kpx-plugin-hot-v2",
    "kpx-plugin-ext-probe",
    "kpx-plugin-ext-v0-2",
    "kpx-example-ratelimit",
    "kpx-example-conncount",
];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest_dir.parent().unwrap().to_path_buf();
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let target_dir = workspace.join("target").join("wasm-plugins");

    for dir in [
        "wit",
        "rules/src",
        "rules/Cargo.toml",
        "sched/src",
        "sched/Cargo.toml",
        "sdk/src",
        "sdk/Cargo.toml",
        "plugins",
        "examples/ratelimit",
        "examples/conncount",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", workspace.join(dir).display());
    }

    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = String::from_utf8(
        Command::new(&rustc).arg("--print").arg("sysroot").output().expect("run rustc --print sysroot").stdout,
    )
    .unwrap();
    let sysroot = PathBuf::from(sysroot.trim());
    let host = env::var("HOST").unwrap();
    let tools = sysroot.join("lib/rustlib").join(&host).join("bin");
    let component_ld = tools.join("wasm-component-ld");
    let wasm_ld = tools.join("gcc-ld").join("wasm-ld");
    if !sysroot.join("lib/rustlib/wasm32-unknown-unknown").exists() {
        panic!(
            "the wasm32-unknown-unknown target is missing: run `rustup target add wasm32-unknown-unknown` \
             (`cargo xtask test` and `cargo xtask demo` do it for you)"
        );
    }
    for tool in [&component_ld, &wasm_ld] {
        assert!(tool.exists(), "{} is missing from the Rust toolchain", tool.display());
    }

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&workspace)
        .args(["build", "--release", "--target", "wasm32-unknown-unknown", "--target-dir"])
        .arg(&target_dir)
        .args(["--config", "profile.release.debug=false"])
        // Plugins are small and hot: whole-program optimisation pays.
        .args(["--config", "profile.release.lto=true", "--config", "profile.release.codegen-units=1"]);
    for (krate, _) in BUILT_IN {
        cmd.args(["-p", krate]);
    }
    for krate in TEST_ONLY {
        cmd.args(["-p", krate]);
    }
    for var in
        ["CARGO_ENCODED_RUSTFLAGS", "RUSTFLAGS", "CARGO_BUILD_RUSTFLAGS", "CARGO_TARGET_DIR", "CARGO_BUILD_TARGET"]
    {
        cmd.env_remove(var);
    }
    cmd.env("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER", &component_ld)
        .env("RUSTFLAGS", format!("-Clink-arg=--wasm-ld-path={}", wasm_ld.display()));
    let status = cmd.status().expect("run the nested cargo build of the plugins");
    assert!(status.success(), "building the WebAssembly plugins failed");

    let built = target_dir.join("wasm32-unknown-unknown").join("release");
    let mut embedded =
        String::from("/// Built-in plugins: (name, component bytes).\npub const BUILT_IN: &[(&str, &[u8])] = &[\n");
    for (krate, name) in BUILT_IN {
        let file = built.join(format!("{}.wasm", krate.replace('-', "_")));
        let dest = out_dir.join(format!("{name}.wasm"));
        copy(&file, &dest);
        embedded.push_str(&format!("    ({name:?}, include_bytes!({:?})),\n", dest.display().to_string()));
    }
    embedded.push_str("];\n");
    std::fs::write(out_dir.join("builtin_plugins.rs"), embedded).unwrap();
    println!("cargo:rustc-env=KPX_TEST_PLUGIN_DIR={}", built.display());
    embed_conformance_cases(&workspace.join("tests").join("cases"), &out_dir);
}

/// The conformance cases ship inside the binary (`kpx conformance`).
fn embed_conformance_cases(dir: &Path, out_dir: &Path) {
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut out =
        String::from("/// The conformance cases: (file name, text).\npub const CASES: &[(&str, &str)] = &[\n");
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        out.push_str(&format!("    ({name:?}, include_str!({:?})),\n", file.display().to_string()));
    }
    out.push_str("];\n");
    std::fs::write(out_dir.join("conformance_cases.rs"), out).unwrap();
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
}
