//! Scratch directories for the commands that run kpx in namespaces
//! (`kpx demo`, `kpx conformance --kernel`).

use std::path::PathBuf;

/// A fresh directory `kpx-TAG-PID-NANOS` under the temp dir with an empty
/// `manifests` folder in it: (directory, manifests). Created here, never
/// reused: a name someone else made first is an error, not a directory to
/// write into (these commands run as root in a shared /tmp).
pub fn fresh_dir(tag: &str) -> Result<(PathBuf, PathBuf), String> {
    let unique = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("kpx-{tag}-{}-{unique}", std::process::id()));
    let manifests = dir.join("manifests");
    let io = |e: std::io::Error| format!("{}: {e}", dir.display());
    std::fs::create_dir(&dir).map_err(io)?;
    std::fs::create_dir(&manifests).map_err(io)?;
    Ok((dir, manifests))
}
