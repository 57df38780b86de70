//! Component files to plugins: a file's bytes read as kpx reads them, at
//! start and on reload; compiled and checked as the kind its flag takes;
//! and what refuses one, in the words both give (`--extension FILE is a
//! scheduler component; ...`). kpx's start (app) and hot reload (reload)
//! load through here.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use kpx_rules::model::ProxyMode;
use sha2::{Digest as _, Sha256};

use crate::runtime::{self, ExtensionPlugin, Kind, Runtime, SchedulerPlugin};

/// The largest component file kpx reads (a replacement larger than this is
/// refused unread).
pub const MAX_FILE: u64 = 64 << 20;

/// A component file's SHA-256.
pub type Digest = [u8; 32];

/// Why a component file cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The backend plugin cannot be loaded; kpx exits.
    #[error(transparent)]
    Plugin(#[from] runtime::Error),
    /// The plugin file cannot be read; kpx exits.
    #[error("cannot read plugin {path}: {source}")]
    PluginFile { path: String, source: std::io::Error },
    /// No built-in plugin for the mode; kpx exits.
    #[error("no built-in backend for mode {0}")]
    NoBuiltIn(ProxyMode),
    /// `--extension` in a mode that has no rules of its own for it.
    #[error("--extension {name}: extensions attach to the iptables and nftables modes, not {mode}")]
    ExtensionMode { name: String, mode: ProxyMode },
    /// A component file given to the flag of another kind (a scheduler
    /// given to `--extension`): kpx exits at start; a replacement file of
    /// the wrong kind is refused, and the running component stays.
    #[error(
        "{} {} is {} component; {} takes {} component",
        expected.flag(),
        path.display(),
        found.with_article(),
        expected.flag(),
        expected.with_article()
    )]
    WrongKind { path: PathBuf, found: Kind, expected: Kind },
    /// An extension refused its `--extension` parameters when it was
    /// loaded (its `check-parameters`): kpx exits at start, before it
    /// writes a rule; a replaced file that refuses them is refused, and
    /// the running component stays.
    #[error("--extension {name}={}: the component refuses its parameters: {message}", path.display())]
    ExtensionParameters { name: String, path: PathBuf, message: String },
}

impl LoadError {
    /// This error, of the component file at `path`: a component of the
    /// wrong kind is said as such, naming the flag, the file and both kinds.
    pub fn of_file(self, path: &Path) -> LoadError {
        match self {
            LoadError::Plugin(runtime::Error::WrongKind { found, expected, .. }) => {
                LoadError::WrongKind { path: path.to_path_buf(), found, expected }
            }
            other => other,
        }
    }
}

/// A component file's SHA-256: what tells a replacement from the running bytes.
pub fn digest(bytes: &[u8]) -> Digest {
    Sha256::digest(bytes).into()
}

/// A component file's bytes, as kpx reads them at start and on reload:
/// looked at first (only a regular file is opened), opened without
/// blocking (a FIFO swapped in does not hold the open), checked again on
/// the open descriptor (after any symlink: a regular file of at most
/// [`MAX_FILE`] bytes), and read to the size it had (a
/// file that yields more, as /proc's files do, is refused: it may never end).
pub fn read_component(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind};
    // Looked at before it is opened (opening a device runs its driver),
    // and again on the descriptor (it may have been swapped in between).
    let before = std::fs::metadata(path)?;
    let file = if before.is_file() {
        Some(std::fs::File::options().read(true).custom_flags(nix::libc::O_NONBLOCK).open(path)?)
    } else {
        None
    };
    let meta = match &file {
        Some(f) => f.metadata()?,
        None => before,
    };
    let kind = meta.file_type();
    if !kind.is_file() {
        use std::os::unix::fs::FileTypeExt;
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_dir() {
            "a directory"
        } else {
            "something else"
        };
        return Err(Error::new(ErrorKind::InvalidInput, format!("not a regular file but {what}")));
    }
    let len = meta.len();
    if len > MAX_FILE {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("{len} bytes, more than the {MAX_FILE} a component may have"),
        ));
    }
    let file = file.ok_or_else(|| Error::other("not a regular file"))?;
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(len + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > len {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("it grew past the {len} bytes it had when opened (a file that never ends?)"),
        ));
    }
    Ok(bytes)
}

/// The component of `--extension NAME=PATH,PARAMETERS` from its bytes,
/// at start or for a replaced file: compiled (or from the cache), and the
/// operator's parameters put to it (`check-parameters`), so that the
/// component refuses a mistake in the flag at once rather than at every
/// render. A component of another kind, or one that refuses its
/// parameters, names the flag and the file.
pub fn extension_component(
    runtime: &Runtime,
    name: &str,
    path: &Path,
    parameters: &[(String, String)],
    bytes: &[u8],
) -> Result<ExtensionPlugin, LoadError> {
    let label = path.file_stem().and_then(|s| s.to_str()).unwrap_or(name);
    let plugin = runtime.load_extension(label, bytes).map_err(|e| LoadError::from(e).of_file(path))?;
    match plugin.check_parameters(parameters) {
        Ok(()) => Ok(plugin),
        Err(runtime::Error::ParametersRefused { message, .. }) => {
            Err(LoadError::ExtensionParameters { name: name.to_string(), path: path.to_path_buf(), message })
        }
        // A trap (a `parse().unwrap()` on a bad value) or exhausted fuel
        // is no answer either: were it a file to wait for, an allow-list
        // would start open.
        Err(other) => Err(LoadError::ExtensionParameters {
            name: name.to_string(),
            path: path.to_path_buf(),
            message: format!("check-parameters failed: {other}"),
        }),
    }
}

/// A scheduler component from its bytes: compiled (or from the cache),
/// instantiated once, and its names checked.
pub fn scheduler_component(runtime: &Runtime, name: &str, bytes: &[u8]) -> Result<SchedulerPlugin, LoadError> {
    let plugin = runtime.load_scheduler(name, bytes)?;
    let names = plugin.instantiate()?.names().to_vec();
    if let Some(problem) = runtime::scheduler::load_problem(&names) {
        return Err(LoadError::Plugin(runtime::Error::Load { plugin: name.to_string(), message: problem }));
    }
    tracing::info!(plugin = %name, contract = plugin.version(), "scheduler component: {names:?}");
    Ok(plugin)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn files_that_would_block_or_never_end_are_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("kpx-reload-block-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // A FIFO nobody writes, directly and behind a symlink: opening it
        // for reading would block; it is refused at once.
        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let link = dir.join("link.wasm");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        for path in [&fifo, &link] {
            let t0 = Instant::now();
            let err = read_component(path).unwrap_err().to_string();
            assert!(err.contains("not a regular file but a FIFO"), "{err}");
            assert!(t0.elapsed() < Duration::from_secs(1));
        }
        // /proc's files say 0 bytes and yield more: they may never end.
        let err = read_component(Path::new("/proc/self/status")).unwrap_err().to_string();
        assert!(err.contains("grew past the 0 bytes"), "{err}");
        // /proc/kmsg (root only) blocks a reader until the kernel logs:
        // opened without blocking, it ends at once either way.
        if std::fs::File::open("/proc/kmsg").is_ok() {
            let t0 = Instant::now();
            assert!(read_component(Path::new("/proc/kmsg")).is_err());
            assert!(t0.elapsed() < Duration::from_secs(1));
        }
        let dev = read_component(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(dev.contains("a device"), "{dev}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
