//! `cargo xtask demo [ARGS]`: builds kpx and runs `kpx demo [ARGS]` — kpx
//! on the embedded default (examples/demo's manifests) in network
//! namespaces, with real traffic (see host/src/demo.rs).

use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::{cargo, setup};

pub fn run(args: &[String]) -> Result<()> {
    setup::prerequisites()?;
    cargo(&["build", "-p", "kpx-host"])?;
    let kpx = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("target/debug/kpx");
    let status = std::process::Command::new(&kpx).arg("demo").args(args).status().context("run kpx demo")?;
    if !status.success() {
        bail!("kpx demo failed");
    }
    Ok(())
}
