//! Compiled components on disk, so that each plugin is compiled once per
//! kpx build and engine configuration, not at every start.
//!
//! Loading native code from disk is trusted code execution: a cache file
//! is used only if neither it nor its directory is writable by group or
//! others, and the key covers the component's bytes and the engine's
//! compatibility hash. Anything else is recompiled. kpx creates a missing
//! directory as 0700; it never changes the mode of one that exists (an
//! operator's directory that others can write is used for nothing, with a
//! warning, and components are compiled in memory).

use std::hash::{Hash, Hasher};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

fn cache_path(engine: &Engine, dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let digest = Sha256::digest(bytes);
    let mut compat = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut compat);
    let safe_name: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{safe_name}-{hex}-{:016x}.cwasm", compat.finish()))
}

/// True when `path` is owned by us and not writable by anyone else.
fn private(path: &Path) -> bool {
    let own_uid = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    match std::fs::metadata(path) {
        Ok(m) => Some(m.uid()) == own_uid && m.mode() & 0o022 == 0,
        Err(_) => false,
    }
}

#[allow(unsafe_code)]
pub fn load_or_compile(engine: &Engine, dir: &Path, name: &str, bytes: &[u8]) -> wasmtime::Result<Component> {
    let path = cache_path(engine, dir, name, bytes);
    if path.exists() && private(dir) && private(&path) {
        // SAFETY: the file was written by `store` below from this engine's
        // own `precompile_component` output (the key includes the engine's
        // compatibility hash), and only we can write to it.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(component) => return Ok(component),
            Err(e) => {
                tracing::warn!(plugin = name, path = %path.display(), "cached plugin unusable, recompiling: {e}")
            }
        }
    }
    let compiled = engine.precompile_component(bytes)?;
    match store(dir, &path, &compiled) {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            plugin = name,
            dir = %dir.display(),
            "plugin cache directory is writable by group or others: not caching (fix its mode or point --plugin-cache-dir elsewhere)"
        ),
        Err(e) => tracing::warn!(plugin = name, dir = %dir.display(), "cannot cache the compiled plugin: {e}"),
    }
    // SAFETY: `compiled` is this engine's own output from just above.
    unsafe { Component::deserialize(engine, &compiled) }
}

/// Writes the compiled component; `false` when the directory is not
/// private (nothing written, its mode left as it is).
fn store(dir: &Path, path: &Path, compiled: &[u8]) -> std::io::Result<bool> {
    if !dir.exists() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    if !private(dir) {
        return Ok(false);
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, compiled)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, path)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> Engine {
        Engine::default()
    }

    fn component() -> &'static [u8] {
        crate::runtime::builtin::get("iptables").unwrap()
    }

    #[test]
    fn an_existing_directory_keeps_its_mode_and_is_not_used_when_others_can_write() {
        let dir = std::env::temp_dir().join(format!("kpx-cache-open-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let bytes = component();
        load_or_compile(&engine(), &dir, "p", bytes).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o777, "the operator's mode stays");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing cached where others can write");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_directory_is_created_private_and_used() {
        let base = std::env::temp_dir().join(format!("kpx-cache-new-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let dir = base.join("cache");
        let bytes = component();
        load_or_compile(&engine(), &dir, "p", bytes).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "the compiled component is cached");
        load_or_compile(&engine(), &dir, "p", bytes).unwrap();
        let _ = std::fs::remove_dir_all(&base);
    }
}
