//! Hot reload of the component files kpx runs (`--backend-plugin`,
//! `--scheduler-plugin NAME=FILE`, `--extension NAME=FILE`): the sync loop
//! polls their metadata every [`POLL`]; a file whose metadata changed and
//! then held still for one more poll (so a file being written is not read
//! half-way) is read and, if its bytes differ from the running ones,
//! compiled and linked, on a thread of its own: the sync loop never reads a
//! file. The read opens without blocking (a FIFO with no writer), takes
//! only a regular file of at most [`crate::runtime::load::MAX_FILE`] as the open descriptor says
//! (after any symlink), and refuses one that grows past the size it had, or
//! that has not been read in [`READ_LIMIT`] (a file of /proc that never
//! ends): the running component stays, and the refusal is logged and
//! counted as any other (so is a component of another kind than the file's
//! flag takes, named as at start: `--extension FILE is a scheduler
//! component; ...`, and an extension that refuses its flag's parameters:
//! `--extension NAME=FILE: the component refuses its parameters: ...`).
//! The sync loop then tries the component on the live
//! state (instantiate, replay, render, the host's checks, a trace that no
//! Service loses its endpoints) and switches to it only if every family
//! accepts it; otherwise the running component keeps serving, and the same
//! bytes are tried again when the file's metadata changes (`touch`
//! retries).
//!
//! Polling rather than inotify: a Kubernetes ConfigMap or a hostPath
//! updated by a symlink swap, a file renamed into place and one written in
//! place are all seen the same way, and no thread or channel outlives the
//! loop.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant, SystemTime};

use crate::runtime::load::{LoadError, digest, extension_component, read_component, scheduler_component};
use crate::runtime::{BackendPlugin, Runtime, SchedulerPlugin};

/// How often the files are looked at.
pub const POLL: Duration = Duration::from_secs(1);

/// How long reading a replaced file may take before it is refused (a
/// local file of [`crate::runtime::load::MAX_FILE`] reads in well under a second).
pub const READ_LIMIT: Duration = Duration::from_secs(5);

/// Reads under way, those abandoned past [`READ_LIMIT`] whose threads are
/// still blocked in the kernel included; while this many are, no other
/// replacement is read (each holds a thread and a descriptor until its
/// read returns), so a file swapped again and again cannot pile them up.
pub const MAX_STUCK_READS: usize = 4;

/// Which component a file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Backend,
    /// The `index`-th scheduler component (the order they were loaded in).
    Scheduler {
        index: usize,
        name: String,
    },
    /// The `index`-th `--extension` (its configured name, and its
    /// parameters, which a replacement is asked to take).
    Extension {
        index: usize,
        name: String,
        parameters: Vec<(String, String)>,
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
    /// A replacement being read or compiled.
    job: Option<Job>,
    /// Tells this file's jobs apart (a late answer of an abandoned one is dropped).
    jobs: u64,
}

/// A replacement being read, then compiled, on a thread of its own.
struct Job {
    id: u64,
    started: Instant,
    /// Set by the thread once the file is read (compiling has no deadline).
    read: Arc<AtomicBool>,
}

/// What a job's thread found.
enum Found {
    /// The same bytes as the running ones.
    Unchanged,
    Replaced(Replacement),
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
    done_tx: Sender<(usize, u64, Found)>,
    done_rx: Receiver<(usize, u64, Found)>,
    /// Reads whose threads have not returned yet (abandoned ones included).
    stuck: Arc<AtomicUsize>,
    /// How a job reads a file ([`read_component`]; tests block it).
    reader: fn(&Path) -> std::io::Result<Vec<u8>>,
    /// Compiled replacements the sync loop could not take yet (one switch
    /// settles before the next is tried).
    deferred: Vec<Replacement>,
    /// The files' metadata being read on a thread of its own (a path on a
    /// hung network filesystem blocks a `stat`), and since when.
    stats: Option<(Receiver<Vec<Option<Stamp>>>, Instant)>,
    /// Whether the last poll found reads held back ([`MAX_STUCK_READS`]).
    held_back: bool,
}

/// How long a poll waits for the files' metadata before it lets the sync
/// loop go on (the answer is taken at a later poll).
pub const STAT_WAIT: Duration = Duration::from_millis(100);

impl Watcher {
    /// Watches `files`: each with its role and the digest of the bytes
    /// kpx loaded from it (a change since then is a replacement).
    pub fn new(runtime: Arc<Runtime>, files: Vec<(Role, PathBuf, [u8; 32])>) -> Watcher {
        let files = files
            .into_iter()
            .map(|(role, path, running)| Watched {
                role,
                path,
                seen: None,
                settling: None,
                running,
                job: None,
                jobs: 0,
            })
            .collect();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        Watcher {
            runtime,
            files,
            next: Instant::now(),
            done_tx,
            done_rx,
            stuck: Arc::new(AtomicUsize::new(0)),
            reader: read_component,
            deferred: Vec::new(),
            stats: None,
            held_back: false,
        }
    }

    /// Reads files with `reader` (tests: one that blocks).
    #[cfg(test)]
    fn with_reader(mut self, reader: fn(&Path) -> std::io::Result<Vec<u8>>) -> Watcher {
        self.reader = reader;
        self
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

    /// Looks at every file, starts reading and compiling those whose
    /// replacement settled, refuses reads past [`READ_LIMIT`], and returns
    /// the compiled (or refused) replacements. Never blocks.
    pub fn poll(&mut self, now: Instant) -> Vec<Replacement> {
        let mut out = std::mem::take(&mut self.deferred);
        while let Ok((i, id, found)) = self.done_rx.try_recv() {
            let file = &mut self.files[i];
            if file.job.as_ref().is_some_and(|j| j.id == id) {
                file.job = None;
                if let Found::Replaced(replacement) = found {
                    out.push(replacement);
                }
            }
        }
        for file in &mut self.files {
            let Some(job) = &file.job else { continue };
            if job.read.load(Ordering::Acquire) || now.saturating_duration_since(job.started) < READ_LIMIT {
                continue;
            }
            // Abandoned: its thread stays blocked until the read returns,
            // counted in `stuck`, and then drops what it read.
            file.job = None;
            let why = format!(
                "not read in {} s (a file that never ends, or a device?); the running component stays",
                READ_LIMIT.as_secs()
            );
            out.push(Replacement {
                role: file.role.clone(),
                path: file.path.clone(),
                digest: [0; 32],
                loaded: Err(why),
            });
        }
        if now < self.next {
            return out;
        }
        self.next = now + POLL;
        let Some(stamps) = self.stamps(now) else { return out };
        let stuck = self.stuck.load(Ordering::Acquire);
        if (stuck >= MAX_STUCK_READS) != self.held_back {
            self.held_back = !self.held_back;
            if self.held_back {
                tracing::warn!("{stuck} component file reads have not returned: no replacement is read until one does");
            } else {
                tracing::info!("component file reads returned: replacements are read again");
            }
        }
        for ((i, file), stamp) in self.files.iter_mut().enumerate().zip(stamps) {
            if file.job.is_some() {
                continue;
            }
            if stamp.is_none() || stamp == file.seen {
                // Unchanged, or gone (perhaps mid-swap): the running component stays.
                file.settling = None;
                continue;
            }
            if file.settling != stamp {
                file.settling = stamp;
                continue;
            }
            let stuck = self.stuck.load(Ordering::Acquire);
            if stuck >= MAX_STUCK_READS {
                // Left unseen: tried again once a stuck read returns.
                file.settling = None;
                continue;
            }
            file.settling = None;
            file.seen = stamp;
            file.jobs += 1;
            let job = Job { id: file.jobs, started: now, read: Arc::new(AtomicBool::new(false)) };
            let (id, read_flag) = (job.id, job.read.clone());
            let (runtime, role, path, done) =
                (self.runtime.clone(), file.role.clone(), file.path.clone(), self.done_tx.clone());
            let (running, reader, stuck) = (file.running, self.reader, self.stuck.clone());
            // Counted until its read returns (at once, in the usual case).
            self.stuck.fetch_add(1, Ordering::AcqRel);
            let spawned = std::thread::Builder::new().name("reload".into()).spawn(move || {
                let bytes = reader(&path);
                read_flag.store(true, Ordering::Release);
                stuck.fetch_sub(1, Ordering::AcqRel);
                let found = match bytes {
                    Err(e) => {
                        let loaded = Err(format!("cannot read it: {e}"));
                        Found::Replaced(Replacement { role, path, digest: [0; 32], loaded })
                    }
                    Ok(bytes) => {
                        let digest = digest(&bytes);
                        if digest == running {
                            Found::Unchanged
                        } else {
                            let loaded = load(&runtime, &role, &path, &bytes);
                            Found::Replaced(Replacement { role, path, digest, loaded })
                        }
                    }
                };
                let _ = done.send((i, id, found));
            });
            match spawned {
                Ok(_) => file.job = Some(job),
                Err(e) => {
                    self.stuck.fetch_sub(1, Ordering::AcqRel);
                    let (role, path) = (file.role.clone(), file.path.clone());
                    out.push(Replacement {
                        role,
                        path,
                        digest: [0; 32],
                        loaded: Err(format!("cannot start reading it: {e}")),
                    });
                }
            }
        }
        out
    }
}

impl Watcher {
    /// The files' metadata, read on a thread of its own and waited for at
    /// most [`STAT_WAIT`]; None while it has not come (a later poll takes
    /// it; no second thread is started meanwhile).
    fn stamps(&mut self, now: Instant) -> Option<Vec<Option<Stamp>>> {
        if self.stats.is_none() {
            let paths: Vec<PathBuf> = self.files.iter().map(|f| f.path.clone()).collect();
            let (tx, rx) = std::sync::mpsc::channel();
            let spawned = std::thread::Builder::new().name("reload-stat".into()).spawn(move || {
                let _ = tx.send(paths.iter().map(|p| Stamp::of(p)).collect());
            });
            if let Err(e) = spawned {
                tracing::warn!("cannot look at the component files: {e}");
                return None;
            }
            self.stats = Some((rx, now));
        }
        let (rx, since) = self.stats.as_ref()?;
        match rx.recv_timeout(STAT_WAIT) {
            Ok(stamps) => {
                self.stats = None;
                Some(stamps)
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let waited = now.saturating_duration_since(*since);
                if waited >= READ_LIMIT && waited < READ_LIMIT + POLL {
                    tracing::warn!(
                        "looking at the component files has taken {} s (a hung filesystem?): replacements wait",
                        waited.as_secs()
                    );
                }
                None
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                self.stats = None;
                None
            }
        }
    }
}

/// A replacement's bytes compiled and linked as its role's kind; a
/// component of another kind is refused naming its flag, its file and
/// both kinds, as at start, and so is an extension that refuses the
/// flag's parameters, with its reason.
fn load(runtime: &Runtime, role: &Role, path: &Path, bytes: &[u8]) -> Result<Loaded, String> {
    let refused = |e: LoadError| e.of_file(path).to_string();
    match role {
        Role::Backend => {
            let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("plugin");
            runtime.load_backend(name, bytes).map(|p| Loaded::Backend(Arc::new(p))).map_err(|e| refused(e.into()))
        }
        Role::Scheduler { name, .. } => {
            scheduler_component(runtime, name, bytes).map(|p| Loaded::Scheduler(Arc::new(p))).map_err(refused)
        }
        Role::Extension { name, parameters, .. } => extension_component(runtime, name, path, parameters, bytes)
            .map(|p| Loaded::Extension(Arc::new(p)))
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
        let _ = (poll(&mut w), poll(&mut w));
        let r = poll(&mut w);
        assert!(r.len() == 1 && r[0].loaded.as_ref().err().is_some_and(|e| e.contains("not a regular file")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A replacement of another kind than its role's is refused naming
    /// the flag, the file and both kinds, as at start.
    #[test]
    fn a_replacement_of_the_wrong_kind_is_refused_naming_flag_file_and_kinds() {
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        let path = Path::new("/k/vendor.wasm");
        let refused = |role: Role, bytes: &[u8]| match load(&runtime, &role, path, bytes) {
            Ok(loaded) => panic!("{} loaded for {}", loaded.kind(), role.label()),
            Err(e) => e,
        };
        let (scheduler, backend) = (builtin::get("schedulers").unwrap(), builtin::get("iptables").unwrap());
        let extension = Role::Extension { index: 0, name: "vendor".into(), parameters: vec![] };
        assert_eq!(
            refused(extension, scheduler),
            "--extension /k/vendor.wasm is a scheduler component; --extension takes an extension component"
        );
        assert_eq!(
            refused(Role::Scheduler { index: 0, name: "mine".into() }, backend),
            "--scheduler-plugin /k/vendor.wasm is a backend component; --scheduler-plugin takes a scheduler component"
        );
        assert_eq!(
            refused(Role::Backend, scheduler),
            "--backend-plugin /k/vendor.wasm is a scheduler component; --backend-plugin takes a backend component"
        );
        assert!(matches!(load(&runtime, &Role::Backend, path, backend), Ok(Loaded::Backend(_))));
        // An extension that refuses the flag's parameters, with its reason.
        let probe = std::fs::read(format!("{}/kpx_plugin_ext_probe.wasm", env!("KPX_TEST_PLUGIN_DIR"))).unwrap();
        let parameters = vec![("do".to_string(), "nonsense".to_string())];
        let err = refused(Role::Extension { index: 0, name: "vendor".into(), parameters }, &probe);
        let said = "--extension vendor=/k/vendor.wasm: the component refuses its parameters: ";
        assert!(err.starts_with(said) && err.contains("do=nonsense"), "want {said:?} and do=nonsense: {err}");
    }

    /// A read that does not return (as one in the kernel's syslog_print
    /// did) is abandoned after READ_LIMIT and refused; the watcher never
    /// waits on it, and reads stuck at once are bounded.
    #[test]
    fn a_read_that_does_not_return_is_refused_after_the_limit() {
        fn blocked(_: &Path) -> std::io::Result<Vec<u8>> {
            std::thread::sleep(Duration::from_secs(2));
            Err(std::io::Error::other("woke up"))
        }
        let dir = std::env::temp_dir().join(format!("kpx-reload-stuck-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let runtime = Arc::new(Runtime::new(Limits::default(), None).unwrap());
        let files: Vec<_> = (0..MAX_STUCK_READS + 1)
            .map(|i| {
                let path = dir.join(format!("s{i}.wasm"));
                std::fs::write(&path, b"x").unwrap();
                (Role::Scheduler { index: i, name: format!("s{i}") }, path, [0; 32])
            })
            .collect();
        let mut w = Watcher::new(runtime, files).with_reader(blocked);
        let t = Instant::now();
        assert!(w.poll(t).is_empty(), "settling");
        let t0 = Instant::now();
        assert!(w.poll(t + POLL).is_empty(), "reading");
        assert!(t0.elapsed() < Duration::from_millis(500), "the poll does not wait for the read");
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(w.stuck.load(Ordering::Acquire), MAX_STUCK_READS, "no more reads at once than the bound");
        let r = w.poll(t + POLL + READ_LIMIT + Duration::from_millis(1));
        assert_eq!(r.len(), MAX_STUCK_READS, "each stuck read refused");
        assert!(r.iter().all(|r| r.loaded.as_ref().err().is_some_and(|e| e.contains("not read in 5 s"))));
        // Once the blocked reads return, their late answers are dropped.
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(w.stuck.load(Ordering::Acquire), 0);
        let late = w.poll(t + POLL + READ_LIMIT + Duration::from_millis(2));
        assert!(late.is_empty(), "late answers of abandoned reads are dropped");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
