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

/// Why `path` is not private to kpx (None: it is a `dir`ectory or a
/// regular file as asked, owned by kpx's user and writable by no one else).
fn not_private(path: &Path, dir: bool) -> Option<String> {
    let own_uid = nix::unistd::geteuid().as_raw();
    let m = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => return Some(format!("cannot look at it: {e}")),
    };
    let (kind, want) = (m.file_type(), if dir { "a directory" } else { "a regular file" });
    if (dir && !kind.is_dir()) || (!dir && !kind.is_file()) {
        return Some(format!("not {want}"));
    }
    if m.uid() != own_uid {
        return Some(format!("owned by uid {}, not kpx's uid {own_uid}", m.uid()));
    }
    if m.mode() & 0o022 != 0 {
        return Some(format!("mode {:04o}: writable by group or others", m.mode() & 0o7777));
    }
    None
}

fn private(path: &Path, dir: bool) -> bool {
    not_private(path, dir).is_none()
}

#[allow(unsafe_code)]
pub fn load_or_compile(engine: &Engine, dir: &Path, name: &str, bytes: &[u8]) -> wasmtime::Result<Component> {
    let path = cache_path(engine, dir, name, bytes);
    if path.exists() && private(dir, true) && private(&path, false) {
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
        Ok(None) => {}
        Ok(Some(why)) => tracing::warn!(
            plugin = name,
            dir = %dir.display(),
            "plugin cache directory is {why}: not caching (fix it or point --plugin-cache-dir elsewhere)"
        ),
        Err(e) => tracing::warn!(plugin = name, dir = %dir.display(), "cannot cache the compiled plugin: {e}"),
    }
    // SAFETY: `compiled` is this engine's own output from just above.
    unsafe { Component::deserialize(engine, &compiled) }
}

/// Writes the compiled component; `Some(why)` when the directory is not
/// private (nothing written, its mode left as it is).
fn store(dir: &Path, path: &Path, compiled: &[u8]) -> std::io::Result<Option<String>> {
    if !dir.exists() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    if let Some(why) = not_private(dir, true) {
        return Ok(Some(why));
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, compiled)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, path)?;
    Ok(None)
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
    fn what_is_not_private_is_named() {
        let base = std::env::temp_dir().join(format!("kpx-cache-why-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o775)).unwrap();
        assert_eq!(not_private(&open, true).unwrap(), "mode 0775: writable by group or others");
        let theirs = base.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        // (Giving it away takes root, as CI runs.)
        if std::os::unix::fs::chown(&theirs, Some(65534), None).is_ok() {
            let why = not_private(&theirs, true).unwrap();
            assert!(why.starts_with("owned by uid 65534, not kpx's uid"), "{why}");
        }
        let file = base.join("file");
        std::fs::write(&file, b"").unwrap();
        assert_eq!(not_private(&file, true).unwrap(), "not a directory");
        assert_eq!(not_private(&open, false).unwrap(), "not a regular file");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(not_private(&open, true), None);
        let _ = std::fs::remove_dir_all(&base);
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
