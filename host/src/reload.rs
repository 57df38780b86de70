//! Hot reload of the component files kpx runs (`--backend-plugin`,
//! `--scheduler-plugin NAME=FILE`): the sync loop polls their metadata
//! every [`POLL`]; a file whose metadata changed and then held still for
//! one more poll (so a file being written is not read half-way) is read,
//! and if its bytes differ it is compiled and linked here. The sync loop
//! then tries the component on the live state (instantiate, replay,
//! render, the host's checks) and switches to it only if every family
//! accepts it; otherwise the running component keeps serving.
//!
//! Polling rather than inotify: a Kubernetes ConfigMap or a hostPath
//! updated by a symlink swap, a file renamed into place and one written in
//! place are all seen the same way, and no thread or channel outlives the
//! loop.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};

use crate::runtime::{BackendPlugin, Runtime, SchedulerPlugin};

/// How often the files are looked at.
pub const POLL: Duration = Duration::from_secs(1);

/// Which component a file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Backend,
    /// The `index`-th scheduler component (the order they were loaded in).
    Scheduler {
        index: usize,
        name: String,
    },
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
    fn of(path: &std::path::Path) -> Option<Stamp> {
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp { dev: m.dev(), ino: m.ino(), len: m.len(), modified: m.modified().ok() })
    }
}

struct Watched {
    role: Role,
    path: PathBuf,
    /// The metadata of the bytes running now (or last refused).
    seen: Option<Stamp>,
    /// New metadata, waiting one poll to hold still.
    settling: Option<Stamp>,
    /// The running bytes' digest.
    digest: [u8; 32],
}

/// A replaced file, compiled and linked (or why not).
pub struct Replacement {
    pub role: Role,
    pub path: PathBuf,
    pub loaded: Result<Loaded, String>,
}

pub enum Loaded {
    Backend(Arc<BackendPlugin>),
    Scheduler(Arc<SchedulerPlugin>),
}

/// The component files and the runtime that compiles their replacements.
pub struct Watcher {
    runtime: Arc<Runtime>,
    files: Vec<Watched>,
    next: Instant,
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl Watcher {
    /// Watches `files` (with the roles they were loaded in); their
    /// current bytes are the running ones.
    pub fn new(runtime: Arc<Runtime>, files: Vec<(Role, PathBuf)>) -> Watcher {
        let files = files
            .into_iter()
            .map(|(role, path)| {
                let seen = Stamp::of(&path);
                let digest = std::fs::read(&path).map(|b| digest(&b)).unwrap_or_default();
                Watched { role, path, seen, settling: None, digest }
            })
            .collect();
        Watcher { runtime, files, next: Instant::now() + POLL }
    }

    /// When the next poll is due (None: nothing is watched).
    pub fn next_poll(&self) -> Option<Instant> {
        (!self.files.is_empty()).then_some(self.next)
    }

    /// Looks at every file; returns the replacements that settled.
    pub fn poll(&mut self, now: Instant) -> Vec<Replacement> {
        if now < self.next {
            return Vec::new();
        }
        self.next = now + POLL;
        let mut out = Vec::new();
        for file in &mut self.files {
            let stamp = Stamp::of(&file.path);
            if stamp == file.seen {
                file.settling = None;
                continue;
            }
            if stamp.is_none() {
                // Gone (perhaps mid-swap): the running component stays.
                continue;
            }
            if file.settling != stamp {
                file.settling = stamp;
                continue;
            }
            file.settling = None;
            file.seen = stamp;
            let loaded = match std::fs::read(&file.path) {
                Ok(bytes) if digest(&bytes) == file.digest => continue,
                Ok(bytes) => {
                    file.digest = digest(&bytes);
                    load(&self.runtime, &file.role, &file.path, &bytes)
                }
                Err(e) => Err(format!("cannot read it: {e}")),
            };
            out.push(Replacement { role: file.role.clone(), path: file.path.clone(), loaded });
        }
        out
    }
}

fn load(runtime: &Runtime, role: &Role, path: &std::path::Path, bytes: &[u8]) -> Result<Loaded, String> {
    match role {
        Role::Backend => {
            let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("plugin");
            runtime.load_backend(name, bytes).map(|p| Loaded::Backend(Arc::new(p))).map_err(|e| e.to_string())
        }
        Role::Scheduler { name, .. } => crate::app::scheduler_component(runtime, name, bytes)
            .map(|p| Loaded::Scheduler(Arc::new(p)))
            .map_err(|e| e.to_string()),
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
        let mut w = Watcher::new(runtime, vec![(role, path.clone())]);
        let mut t = Instant::now() + POLL;
        let mut poll = |w: &mut Watcher| {
            t += POLL;
            w.poll(t)
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
        let r = poll(&mut w);
        assert_eq!(r.len(), 1);
        let err = r[0].loaded.as_ref().err().expect("garbage does not load");
        assert!(err.contains("ext"), "{err}");
        assert!(poll(&mut w).is_empty(), "a refused file is not tried again until it changes");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
