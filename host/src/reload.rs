//! Hot reload of the component files kpx runs (`--backend-plugin`,
//! `--scheduler-plugin NAME=FILE`): the sync loop polls their metadata
//! every [`POLL`]; a file whose metadata changed and then held still for
//! one more poll (so a file being written is not read half-way) is read
//! (a regular file, at most [`MAX_FILE`]), and if its bytes differ from the
//! running ones it is compiled and linked on a thread of its own. The sync
//! loop then tries the component on the live state (instantiate, replay,
//! render, the host's checks, a trace that no Service loses its endpoints)
//! and switches to it only if every family accepts it; otherwise the
//! running component keeps serving, and the same bytes are tried again
//! when the file's metadata changes (`touch` retries).
//!
//! Polling rather than inotify: a Kubernetes ConfigMap or a hostPath
//! updated by a symlink swap, a file renamed into place and one written in
//! place are all seen the same way, and no thread or channel outlives the
//! loop.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};

use crate::runtime::{BackendPlugin, Runtime, SchedulerPlugin};

/// How often the files are looked at.
pub const POLL: Duration = Duration::from_secs(1);

/// The largest component file kpx reads (a replacement larger than this is
/// refused unread).
pub const MAX_FILE: u64 = 64 << 20;

/// Which component a file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Backend,
    /// The `index`-th scheduler component (the order they were loaded in).
    Scheduler {
        index: usize,
        name: String,
    },
    /// The `index`-th `--extension` (its configured name).
    Extension {
        index: usize,
        name: String,
    },
}

impl Role {
    /// How logs and `kpx_plugin_reloads` name it: `backend`,
    /// `scheduler:NAME`, `extension:NAME`.
    pub fn label(&self) -> String {
        match self {
            Role::Backend => "backend".to_string(),
            Role::Scheduler { name, .. } => format!("scheduler:{name}"),
            Role::Extension { name, .. } => format!("extension:{name}"),
        }
    }
}

/// A file's metadata, as far as telling a replacement goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp { dev: m.dev(), ino: m.ino(), len: m.len(), modified: m.modified().ok() })
    }
}

struct Watched {
    role: Role,
    path: PathBuf,
    /// The metadata last acted on (read, or found unchanged in content).
    seen: Option<Stamp>,
    /// New metadata, waiting one poll to hold still.
    settling: Option<Stamp>,
    /// The digest of the bytes running now.
    running: [u8; 32],
    /// A replacement being compiled.
    compiling: bool,
}

/// A replaced file, compiled and linked (or why not).
pub struct Replacement {
    pub role: Role,
    pub path: PathBuf,
    /// The replacement's bytes' digest ([`Watcher::applied`] takes it back).
    pub digest: [u8; 32],
    pub loaded: Result<Loaded, String>,
}

/// A compiled and linked replacement, of its role's kind.
pub enum Loaded {
    Backend(Arc<BackendPlugin>),
    Scheduler(Arc<SchedulerPlugin>),
    Extension(Arc<crate::runtime::ExtensionPlugin>),
}

impl Loaded {
    /// "a backend", "a scheduler", "an extension".
    pub fn kind(&self) -> &'static str {
        match self {
            Loaded::Backend(_) => "a backend",
            Loaded::Scheduler(_) => "a scheduler",
            Loaded::Extension(_) => "an extension",
        }
    }
}

/// The component files and the runtime that compiles their replacements
/// (on a thread of their own: compiling a large component does not hold up
/// the sync loop).
pub struct Watcher {
    runtime: Arc<Runtime>,
    files: Vec<Watched>,
    next: Instant,
    done_tx: Sender<(usize, Replacement)>,
    done_rx: Receiver<(usize, Replacement)>,
    /// Compiled replacements the sync loop could not take yet (one switch
    /// settles before the next is tried).
    deferred: Vec<Replacement>,
}

/// A component file's SHA-256: what tells a replacement from the running bytes.
pub fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl Watcher {
    /// Watches `files`: each with its role and the digest of the bytes
    /// kpx loaded from it (a change since then is a replacement).
    pub fn new(runtime: Arc<Runtime>, files: Vec<(Role, PathBuf, [u8; 32])>) -> Watcher {
        let files = files
            .into_iter()
            .map(|(role, path, running)| Watched { role, path, seen: None, settling: None, running, compiling: false })
            .collect();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        Watcher { runtime, files, next: Instant::now(), done_tx, done_rx, deferred: Vec::new() }
    }

    /// When the next poll is due (None: nothing is watched).
    pub fn next_poll(&self) -> Option<Instant> {
        (!self.files.is_empty()).then_some(self.next)
    }

    /// Hands a replacement back until the next poll (a switch is settling).
    pub fn defer(&mut self, replacement: Replacement) {
        self.deferred.push(replacement);
    }

    /// The sync loop switched to a replacement: its bytes are the running ones.
    pub fn applied(&mut self, role: &Role, digest: [u8; 32]) {
        if let Some(file) = self.files.iter_mut().find(|f| &f.role == role) {
            file.running = digest;
        }
    }

    /// Looks at every file, starts compiling those whose replacement
    /// settled, and returns the compiled ones.
    pub fn poll(&mut self, now: Instant) -> Vec<Replacement> {
        let mut out = std::mem::take(&mut self.deferred);
        while let Ok((i, replacement)) = self.done_rx.try_recv() {
            self.files[i].compiling = false;
            out.push(replacement);
        }
        if now < self.next {
            return out;
        }
        self.next = now + POLL;
        for (i, file) in self.files.iter_mut().enumerate() {
            if file.compiling {
                continue;
            }
            let stamp = Stamp::of(&file.path);
            if stamp.is_none() || stamp == file.seen {
                // Unchanged, or gone (perhaps mid-swap): the running component stays.
                file.settling = None;
                continue;
            }
            if file.settling != stamp {
                file.settling = stamp;
                continue;
            }
            file.settling = None;
            file.seen = stamp;
            let bytes = match read(&file.path) {
                Ok(bytes) => bytes,
                Err(why) => {
                    let (role, path) = (file.role.clone(), file.path.clone());
                    out.push(Replacement { role, path, digest: [0; 32], loaded: Err(why) });
                    continue;
                }
            };
            let digest = digest(&bytes);
            if digest == file.running {
                continue;
            }
            file.compiling = true;
            let (runtime, role, path, done) =
                (self.runtime.clone(), file.role.clone(), file.path.clone(), self.done_tx.clone());
            let spawned = std::thread::Builder::new().name("reload".into()).spawn(move || {
                let loaded = load(&runtime, &role, &path, &bytes);
                let _ = done.send((i, Replacement { role, path, digest, loaded }));
            });
            if let Err(e) = spawned {
                file.compiling = false;
                let (role, path) = (file.role.clone(), file.path.clone());
                out.push(Replacement { role, path, digest, loaded: Err(format!("cannot start compiling it: {e}")) });
            }
        }
        out
    }
}

/// A regular file's bytes, up to [`MAX_FILE`].
fn read(path: &Path) -> Result<Vec<u8>, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > MAX_FILE {
        return Err(format!("{} bytes, more than the {MAX_FILE} a component may have", meta.len()));
    }
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(format!("more than the {MAX_FILE} bytes a component may have"));
    }
    Ok(bytes)
}

fn load(runtime: &Runtime, role: &Role, path: &Path, bytes: &[u8]) -> Result<Loaded, String> {
    match role {
        Role::Backend => {
            let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("plugin");
            runtime.load_backend(name, bytes).map(|p| Loaded::Backend(Arc::new(p))).map_err(|e| e.to_string())
        }
        Role::Scheduler { name, .. } => crate::app::scheduler_component(runtime, name, bytes)
            .map(|p| Loaded::Scheduler(Arc::new(p)))
            .map_err(|e| e.to_string()),
        Role::Extension { .. } => {
            let label = path.file_stem().and_then(|s| s.to_str()).unwrap_or("extension");
            runtime.load_extension(label, bytes).map(|p| Loaded::Extension(Arc::new(p))).map_err(|e| e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{Limits, builtin};

    #[test]
    fn a_replaced_file_is_loaded_once_it_holds_still_and_only_if_its_bytes_changed() {
        let dir = std::env::temp_dir().join(format!("kpx-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sched.wasm");
        let schedulers = builtin::get("schedulers").unwrap();
        std::fs::write(&path, schedulers).unwrap();
        let runtime = Arc::new(Runtime::new(Limits::default(), None).unwrap());
        let role = Role::Scheduler { index: 0, name: "ext".into() };
        let mut w = Watcher::new(runtime, vec![(role, path.clone(), digest(schedulers))]);
        let mut t = Instant::now() + POLL;
        let mut poll = |w: &mut Watcher| {
            t += POLL;
            let out = w.poll(t);
            // Let a compile started by this poll finish before the next.
            std::thread::sleep(Duration::from_millis(200));
            out
        };
        assert!(poll(&mut w).is_empty(), "nothing changed");
        // The same bytes written again: the metadata changes, nothing loads.
        std::fs::write(&path, schedulers).unwrap();
        assert!(poll(&mut w).is_empty() && poll(&mut w).is_empty());
        // New bytes renamed into place: seen, settled one poll later, loaded.
        let tmp = dir.join("sched.tmp");
        std::fs::write(&tmp, b"not a component").unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        assert!(poll(&mut w).is_empty(), "settling");
        assert!(poll(&mut w).is_empty(), "compiling");
        let r = poll(&mut w);
        assert_eq!(r.len(), 1);
        let err = r[0].loaded.as_ref().err().expect("garbage does not load");
        assert!(err.contains("ext"), "{err}");
        assert!(poll(&mut w).is_empty(), "a refused file is not tried again until it changes");
        // Touched: the same refused bytes are tried again.
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(SystemTime::now() + Duration::from_secs(5)).unwrap();
        let _ = (poll(&mut w), poll(&mut w));
        assert_eq!(poll(&mut w).len(), 1, "retried after a touch");
        // Not a regular file: refused unread.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let _ = poll(&mut w);
        let r = poll(&mut w);
        assert!(r.len() == 1 && r[0].loaded.as_ref().err().is_some_and(|e| e.contains("not a regular file")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
