//! `--manifests PATH`: ordinary Kubernetes YAML or JSON (a file, or a
//! directory of them; multi-document files and `kind: List` allowed),
//! watched with inotify (the notify crate): a change re-reads only the
//! files it names, so edits, new files and deletions apply at once and an
//! idle source does nothing. A full poll runs every [`FULL_POLL`] as a
//! safety net, and whenever inotify cannot say what changed (its queue
//! overflowed, a directory moved, a ConfigMap volume swapped its `..data`
//! link); where inotify is unavailable, kpx polls every [`POLL_INTERVAL`].
//! An invalid object is logged (warn) with its file, kind, namespace/name
//! and why, counted (`kpx_objects_refused_total`), and left out; every
//! valid object still applies. Services and EndpointSlices are held to
//! the API server's own validation, which no API server applies here
//! (`parse.rs`).

mod parse;
mod yaml;

pub use parse::{ParseError, parse_documents};

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::{Duration, SystemTime};

use super::{Event, Object, ObjectRef, Refusals};
use smallvec::SmallVec;

/// How often the files are checked without inotify, and while the first
/// complete read is awaited.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// How often everything is re-checked even with inotify.
pub const FULL_POLL: Duration = Duration::from_secs(60);
/// A change is read once its files have been quiet this long (a writer
/// that truncates and then writes, or an editor that moves the old file
/// away before writing the new one, is seen once, finished), or at once
/// when every file it touched was renamed into place ([`Settling`])...
const QUIET: Duration = Duration::from_millis(100);
/// ...or after this long, however busy they stay.
const MOST_SETTLE: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The path cannot be read at start; kpx exits (a later failure is
    /// logged and the last good objects are kept).
    #[error("cannot read manifests at {path}: {source}")]
    Unreadable { path: PathBuf, source: std::io::Error },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One file as last read.
#[derive(Debug)]
struct FileState {
    /// Its path, shared by the definitions it holds.
    path: Arc<Path>,
    stamp: Stamp,
    objects: Vec<Object>,
}

/// What the source holds of one object: one entry per object, its
/// reference held once (at 10k Services, two maps keyed by reference and a
/// map of definitions per object took 16 MB).
#[derive(Debug, Default)]
struct Held {
    /// Its definitions by file, in path order (and file order within one
    /// file): the first is the one that counts. Nearly every object has
    /// one, held inline (a `Vec` was one more allocation per object, 2.6 MB
    /// at 10k Services in a heaptrack profile).
    defs: SmallVec<[(Arc<Path>, Object); 1]>,
    /// What was last reported, until a delete is reported.
    reported: Option<Object>,
}

/// The manifest source: current files, and the objects last reported.
#[derive(Debug)]
pub struct ManifestSource {
    root: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    /// Each object's definitions and what was reported of it.
    objects: BTreeMap<ObjectRef, Held>,
    /// Files read or dropped since the last diff, with the objects they
    /// defined before: only their objects are compared again.
    touched: BTreeMap<PathBuf, Vec<ObjectRef>>,
    /// The last poll read every file it listed (or kept its last good
    /// objects): what was reported is the whole state.
    complete: bool,
    /// Where refused objects are counted.
    refusals: Refusals,
}

impl ManifestSource {
    pub fn new(root: impl Into<PathBuf>) -> Result<ManifestSource> {
        let root = root.into();
        std::fs::metadata(&root).map_err(|source| Error::Unreadable { path: root.clone(), source })?;
        Ok(ManifestSource {
            root,
            files: BTreeMap::new(),
            objects: BTreeMap::new(),
            touched: BTreeMap::new(),
            complete: false,
            refusals: Refusals::default(),
        })
    }

    /// The source, counting the objects it refuses in `refusals`.
    pub fn counting(self, refusals: Refusals) -> ManifestSource {
        ManifestSource { refusals, ..self }
    }

    /// Files to read: the path itself, or the YAML/JSON files under it
    /// (hidden entries skipped, as Kubernetes ConfigMap mounts use `..data`).
    fn list_files(&self) -> std::io::Result<Vec<PathBuf>> {
        if !std::fs::metadata(&self.root)?.is_dir() {
            return Ok(vec![self.root.clone()]);
        }
        let mut out = Vec::new();
        let mut dirs = vec![self.root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir)? {
                let path = entry?.path();
                let hidden = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.'));
                if hidden {
                    continue;
                }
                match std::fs::metadata(&path) {
                    Ok(m) if m.is_dir() => dirs.push(path),
                    // A manifest that cannot be looked at now (a dangling
                    // link while a ConfigMap volume swaps its files) is
                    // listed: poll keeps its last good objects.
                    _ if is_manifest(&path) => out.push(path),
                    _ => {}
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// Re-reads changed files and returns the events that bring a consumer
    /// from the last reported objects to the current ones. A listing that
    /// fails changes nothing (the last good objects stay); a file never
    /// read before that cannot be read now leaves the poll incomplete.
    pub fn poll(&mut self) -> std::io::Result<Vec<Event>> {
        let files = self.list_files()?;
        self.complete = true;
        let mut changed = false;
        let listed: std::collections::HashSet<&PathBuf> = files.iter().collect();
        let gone: Vec<PathBuf> = self.files.keys().filter(|p| !listed.contains(p)).cloned().collect();
        drop(listed);
        for path in gone {
            changed |= self.drop_file(&path);
        }
        for path in files {
            changed |= self.read(path, false);
        }
        // Files a refresh read before it asked for this poll count too.
        if !changed && self.touched.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self.diff())
    }

    /// Re-reads the manifest files among `paths` (what inotify named):
    /// changed ones are read again, vanished ones dropped, other files
    /// ignored. A directory, a hidden entry (a ConfigMap volume's `..data`
    /// swap) or a vanished directory asks for a full poll instead (None).
    pub fn refresh(&mut self, paths: &[PathBuf]) -> Option<Vec<Event>> {
        let root_is_file = self.root_is_file();
        let mut changed = false;
        let paths: Vec<PathBuf> = paths.iter().map(|p| self.keyed(p)).collect();
        for path in &paths {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if root_is_file {
                // The watch is on the file's directory: the file counts, and
                // a ConfigMap volume's `..data` swap behind it.
                if path == &self.root {
                    changed |= self.refresh_file(path);
                } else if name.starts_with("..") {
                    return None;
                }
                continue;
            }
            let under = path.strip_prefix(&self.root).ok()?;
            let names: Vec<&str> = under.components().filter_map(|c| c.as_os_str().to_str()).collect();
            // `..data` and its timestamped directories: a ConfigMap swap.
            if names.iter().any(|n| n.starts_with("..")) {
                return None;
            }
            // Other hidden entries (editor swap files) are not manifests.
            if names.iter().any(|n| n.starts_with('.')) {
                continue;
            }
            let is_dir = std::fs::symlink_metadata(path)
                .is_ok_and(|m| m.is_dir() || m.file_type().is_symlink() && path.is_dir());
            if is_dir || self.holds_below(path) {
                return None;
            }
            if is_manifest(path) {
                changed |= self.refresh_file(path);
            }
        }
        Some(if changed { self.diff() } else { Vec::new() })
    }

    /// Whether files under `dir` are held (a directory that vanished).
    fn holds_below(&self, dir: &Path) -> bool {
        use std::ops::Bound;
        self.files
            .range::<Path, _>((Bound::Excluded(dir), Bound::Unbounded))
            .next()
            .is_some_and(|(f, _)| f.starts_with(dir))
    }

    /// One manifest file named by inotify: read again, or dropped if gone.
    fn refresh_file(&mut self, path: &Path) -> bool {
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.drop_file(path),
            _ => self.read(path.to_path_buf(), true),
        }
    }

    /// Forgets a file that is gone; whether it was held.
    fn drop_file(&mut self, path: &Path) -> bool {
        if !self.files.contains_key(path) {
            return false;
        }
        self.touch(path);
        self.files.remove(path);
        true
    }

    /// Notes the objects `path` defined before it changes (once per diff).
    fn touch(&mut self, path: &Path) {
        if !self.touched.contains_key(path) {
            let before = self.files.get(path).map(|f| f.objects.iter().map(Object::object_ref).collect());
            self.touched.insert(path.to_path_buf(), before.unwrap_or_default());
        }
    }

    fn root_is_file(&self) -> bool {
        std::fs::metadata(&self.root).is_ok_and(|m| m.is_file())
    }

    /// Reads one listed file if its stamp changed (always when `named`:
    /// inotify said so, and a same-size edit within the clock's
    /// granularity keeps the stamp); whether it changed.
    fn read(&mut self, path: PathBuf, named: bool) -> bool {
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) => {
                self.unreadable(&path, &e);
                return false;
            }
        };
        let stamp = stamp(&meta);
        if !named && self.files.get(&path).is_some_and(|f| f.stamp == stamp) {
            return false;
        }
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) => {
                self.unreadable(&path, &e);
                return false;
            }
        };
        let (mut objects, errors) = parse_documents(&text);
        self.touch(&path);
        let previous = self.files.remove(&path).map(|f| f.objects).unwrap_or_default();
        keep_last_good(&mut objects, &errors, previous);
        for err in errors {
            tracing::warn!(file = %path.display(), "rejected: {err}");
            self.refusals.count(err.kind);
        }
        self.files.insert(path.clone(), FileState { path: path.into(), stamp, objects });
        true
    }

    /// A listed file that cannot be read now keeps its last good objects;
    /// one never read leaves the poll incomplete.
    fn unreadable(&mut self, path: &Path, e: &std::io::Error) {
        tracing::error!(file = %path.display(), error = %e, "cannot read manifest file; keeping its last good objects");
        self.complete &= self.files.contains_key(path);
    }

    /// Whether the last poll read everything it listed.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    fn diff(&mut self) -> Vec<Event> {
        let touched = std::mem::take(&mut self.touched);
        // The objects the touched files defined before and define now,
        // collected before the index below allocates its keys: this set is
        // freed at the end, and at the first read (every object) its keys
        // among the index's would leave a freed hole in every page.
        let mut affected: BTreeSet<ObjectRef> = BTreeSet::new();
        for (path, before) in &touched {
            affected.extend(before.iter().cloned());
            let Some(file) = self.files.get(path) else { continue };
            affected.extend(file.objects.iter().map(Object::object_ref));
        }
        for (path, before) in touched {
            for r in before {
                if let Some(held) = self.objects.get_mut(&r) {
                    held.defs.retain(|(p, _)| **p != *path);
                }
            }
            let Some(file) = self.files.get(&path) else { continue };
            for object in &file.objects {
                let r = object.object_ref();
                let held = match self.objects.get_mut(&r) {
                    Some(held) => held,
                    None => self.objects.entry(r).or_default(),
                };
                match held.defs.binary_search_by(|(p, _)| (**p).cmp(&*path)) {
                    Ok(_) => {
                        let r = object.object_ref();
                        tracing::warn!(file = %path.display(), object = %r, "rejected: {r}: already defined earlier in the same file");
                        self.refusals.count(Some(r.kind));
                    }
                    Err(at) => held.defs.insert(at, (file.path.clone(), object.clone())),
                }
            }
        }
        let (mut deletes, mut applies) = (Vec::new(), Vec::new());
        for r in affected {
            let Some(held) = self.objects.get_mut(&r) else { continue };
            let Some((first, object)) = held.defs.first() else {
                if held.reported.is_some() {
                    deletes.push(Event::Delete(r.clone()));
                }
                self.objects.remove(&r);
                continue;
            };
            for (path, _) in &held.defs[1..] {
                tracing::warn!(file = %path.display(), object = %r, "rejected: {r}: already defined in {}", first.display());
                self.refusals.count(Some(r.kind));
            }
            // Objects of unchanged files are the very copies reported.
            let same = held.reported.as_ref().is_some_and(|old| old.same_copy(object) || old == object);
            if !same {
                held.reported = Some(object.clone());
                applies.push(Event::Apply(object.clone()));
            }
        }
        deletes.extend(applies);
        deletes
    }

    /// Reports the initial objects, then `Synced`, then changes as they
    /// happen, until the receiver is gone. `Synced` waits until every file
    /// has been listed and read: a failed listing is never the empty state.
    pub fn run(self, tx: Sender<Event>) {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_time().build() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("cannot start the manifest source's runtime: {e}");
                return;
            }
        };
        runtime.block_on(self.watch(tx));
    }

    async fn watch(mut self, tx: Sender<Event>) {
        // Watch first, so that nothing written during the first read is missed.
        let (notes_tx, mut notes) = tokio::sync::mpsc::unbounded_channel::<notify::Result<notify::Event>>();
        let mut watcher = self.watcher(notes_tx.clone());
        let mut root_id = file_id(&self.root);
        let began = std::time::Instant::now();
        loop {
            match self.poll() {
                Ok(_) if self.complete => break,
                Ok(_) => {
                    tracing::error!(path = %self.root.display(), "not every manifest could be read; nothing is programmed until they can")
                }
                Err(e) => {
                    tracing::error!(path = %self.root.display(), error = %e, "cannot list manifests; nothing is programmed until they can be")
                }
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        tracing::info!(
            path = %self.root.display(),
            files = self.files.len(),
            objects = self.objects.values().filter(|h| h.reported.is_some()).count(),
            elapsed_ms = began.elapsed().as_millis() as u64,
            "read the manifests"
        );
        let initial: Vec<Event> =
            self.objects.values().filter_map(|h| h.reported.clone()).map(Event::Apply).chain([Event::Synced]).collect();
        // The first read's text, parse trees and diff are freed in this
        // thread's and the parsers' malloc arenas, which the sync thread
        // does not allocate from: given back before the first sync builds
        // its ruleset.
        kpx_heap::release_free_memory();
        if !send(&tx, initial) {
            return;
        }
        let every = if watcher.is_some() { FULL_POLL } else { POLL_INTERVAL };
        let mut full = tokio::time::interval(every);
        full.reset();
        loop {
            let events = tokio::select! {
                note = notes.recv(), if watcher.is_some() => {
                    let (batch, fast) = self.settle(note, &mut notes).await;
                    let mut events = self.apply_notes(batch);
                    // A change read at once that deletes waits out QUIET all
                    // the same: a writer renaming several files into place
                    // may be moving the object to another of them.
                    // Events already compared are never dropped: an error
                    // after them is logged and they are sent.
                    let began = tokio::time::Instant::now();
                    while fast
                        && began.elapsed() < MOST_SETTLE
                        && events.as_ref().is_ok_and(|e| e.iter().any(|e| matches!(e, Event::Delete(_))))
                    {
                        let Ok(note) = tokio::time::timeout(QUIET, notes.recv()).await else { break };
                        let (more, _) = self.settle(note, &mut notes).await;
                        match (&mut events, self.apply_notes(more)) {
                            (Ok(events), Ok(more)) => events.extend(more),
                            (_, Err(e)) => {
                                tracing::error!(path = %self.root.display(), error = %e, "cannot list manifests; keeping the last good objects");
                                break;
                            }
                            (Err(_), Ok(_)) => {}
                        }
                    }
                    events
                }
                _ = full.tick() => self.poll(),
            };
            // The root replaced (moved away and made again, a link
            // re-pointed): the watch is on the old one; watch the new.
            let now_id = file_id(&self.root);
            if now_id != root_id {
                tracing::info!(path = %self.root.display(), "the manifest root was replaced; watching the new one");
                watcher = self.watcher(notes_tx.clone());
                root_id = now_id;
            }
            match events {
                Ok(events) => {
                    if !send(&tx, events) {
                        return;
                    }
                }
                Err(e) => {
                    tracing::error!(path = %self.root.display(), error = %e, "cannot list manifests; keeping the last good objects")
                }
            }
        }
    }

    /// The notes of one change, from its first: those already queued,
    /// then more until the change has settled ([`Settling`]), or QUIET
    /// passes without one, or MOST_SETTLE in all; and whether it settled
    /// without waiting.
    async fn settle(
        &self,
        first: Option<notify::Result<notify::Event>>,
        notes: &mut tokio::sync::mpsc::UnboundedReceiver<notify::Result<notify::Event>>,
    ) -> (Vec<Option<notify::Result<notify::Event>>>, bool) {
        let held = |p: &Path| self.holds(p);
        let mut settling = Settling::default();
        settling.note(&first, held);
        let mut batch = vec![first];
        while let Ok(n) = notes.try_recv() {
            let n = Some(n);
            settling.note(&n, held);
            batch.push(n);
        }
        if settling.finished() {
            return (batch, true);
        }
        let began = tokio::time::Instant::now();
        while !settling.finished() && began.elapsed() < MOST_SETTLE {
            match tokio::time::timeout(QUIET, notes.recv()).await {
                Ok(n) => {
                    settling.note(&n, held);
                    batch.push(n);
                }
                Err(_) => break,
            }
        }
        (batch, false)
    }

    /// Reads what a change's notes name (everything, when they say notes
    /// were lost or name a directory) and returns the events.
    fn apply_notes(&mut self, batch: Vec<Option<notify::Result<notify::Event>>>) -> std::io::Result<Vec<Event>> {
        let mut paths = Vec::new();
        let mut rescan = false;
        for n in batch {
            match n {
                // Opens and reads (kpx's own among them) change nothing.
                Some(Ok(e)) if matches!(e.kind, notify::EventKind::Access(_)) => {}
                Some(Ok(e)) => {
                    rescan |= e.need_rescan();
                    paths.extend(e.paths);
                }
                Some(Err(e)) => {
                    tracing::warn!(path = %self.root.display(), "inotify: {e}; re-reading every manifest");
                    rescan = true;
                }
                None => rescan = true,
            }
        }
        if rescan {
            return self.poll();
        }
        paths.sort();
        paths.dedup();
        match self.refresh(&paths) {
            Some(events) => Ok(events),
            None => self.poll(),
        }
    }

    /// Whether `path` (as inotify names it) is a file the source holds,
    /// or a directory it holds files below.
    fn holds(&self, path: &Path) -> bool {
        let path = self.keyed(path);
        self.files.contains_key(&path) || self.holds_below(&path)
    }

    /// A path inotify named (from the watched directory as the kernel
    /// resolved it) as the files are keyed: under the root as given.
    fn keyed(&self, path: &Path) -> PathBuf {
        let canonical = std::fs::canonicalize(&self.root).ok();
        let absolute = std::path::absolute(&self.root).ok();
        [canonical.as_ref(), absolute.as_ref()]
            .into_iter()
            .flatten()
            .find_map(|base| path.strip_prefix(base).ok())
            .map_or_else(
                || path.to_path_buf(),
                |rest| if rest.as_os_str().is_empty() { self.root.clone() } else { self.root.join(rest) },
            )
    }

    /// An inotify watch on the root (its directory, when it names a
    /// file), or None (then the source polls).
    fn watcher(
        &self,
        notes: tokio::sync::mpsc::UnboundedSender<notify::Result<notify::Event>>,
    ) -> Option<notify::RecommendedWatcher> {
        use notify::Watcher;
        let (path, mode) = if self.root_is_file() {
            (
                self.root.parent().map(Path::to_path_buf).unwrap_or_else(|| ".".into()),
                notify::RecursiveMode::NonRecursive,
            )
        } else {
            (self.root.clone(), notify::RecursiveMode::Recursive)
        };
        let made = notify::recommended_watcher(move |n| {
            let _ = notes.send(n);
        })
        .and_then(|mut w| w.watch(&path, mode).map(|()| w));
        match made {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(path = %path.display(), "cannot watch the manifests with inotify ({e}); polling every {POLL_INTERVAL:?}");
                None
            }
        }
    }
}

/// What tells a file's versions apart without reading it: modification
/// and change times, size, and inode (a link re-pointed to another file).
type Stamp = (SystemTime, i64, i64, u64, u64);

fn stamp(meta: &std::fs::Metadata) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    (meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), meta.ctime(), meta.ctime_nsec(), meta.len(), meta.ino())
}

/// Device and inode of a path (following links), to see it replaced.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Sends events in order; false when the receiver is gone.
fn send(tx: &Sender<Event>, events: Vec<Event>) -> bool {
    events.into_iter().all(|e| tx.send(e).is_ok())
}

/// Bad input must not undo what is programmed: an object whose document
/// is now invalid keeps its last good version, and when the file is no
/// longer valid YAML every object it held before and not now is kept.
fn keep_last_good(objects: &mut Vec<Object>, errors: &[ParseError], previous: Vec<Object>) {
    let unreadable = errors.iter().any(|e| e.object_ref.is_none());
    let parsed: std::collections::BTreeSet<ObjectRef> = objects.iter().map(Object::object_ref).collect();
    for old in previous {
        let r = old.object_ref();
        if parsed.contains(&r) {
            continue;
        }
        if unreadable || errors.iter().any(|e| e.object_ref.as_ref() == Some(&r)) {
            tracing::warn!(object = %r, "keeping the last good version of the object");
            objects.push(old);
        }
    }
}

/// Whether a change's notes show it finished: every path that could hold
/// manifests was last renamed into place (an atomic replacement: the
/// file is whole the moment it has its name), so it is read at once
/// rather than after [`QUIET`]. A path written or created may be a
/// writer midway, and a held file or directory removed or renamed away
/// an editor or a swap midway: those wait, and so does a change whose
/// notes were lost.
#[derive(Debug, Default)]
struct Settling {
    unsettled: std::collections::HashSet<PathBuf>,
    blind: bool,
}

impl Settling {
    /// `held`: whether the source holds a path (a file, or files below a
    /// directory): one going away cannot be looked at any more.
    fn note(&mut self, note: &Option<notify::Result<notify::Event>>, held: impl Fn(&Path) -> bool) {
        use notify::EventKind;
        use notify::event::{ModifyKind, RenameMode};
        let Some(Ok(e)) = note else {
            self.blind = true;
            return;
        };
        match e.kind {
            EventKind::Access(_) => {}
            EventKind::Modify(ModifyKind::Name(RenameMode::To)) => {
                for p in &e.paths {
                    self.unsettled.remove(p);
                }
            }
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
                if let [from, to] = e.paths.as_slice() {
                    self.unsettled.remove(to);
                    if could_hold_manifests(from) || held(from) {
                        self.unsettled.insert(from.clone());
                    }
                } else {
                    self.blind = true;
                }
            }
            EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_)) => {
                self.blind |= e.need_rescan();
                self.unsettled.extend(e.paths.iter().filter(|p| could_hold_manifests(p) || held(p)).cloned());
            }
            _ => {
                self.blind |= e.need_rescan();
                self.unsettled.extend(e.paths.iter().filter(|p| could_hold_manifests(p)).cloned());
            }
        }
    }

    fn finished(&self) -> bool {
        !self.blind && self.unsettled.is_empty()
    }
}

/// A manifest file, or what may be a directory of them (no extension, a
/// ConfigMap volume's `..data`); not a writer's temporary file or an
/// editor's swap file, whose comings and goings change nothing.
fn could_hold_manifests(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    is_manifest(path)
        || name.starts_with("..")
        || (!name.starts_with('.') && path.extension().is_none())
        || path.is_dir()
}

fn is_manifest(path: &Path) -> bool {
    matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json"))
}

#[cfg(test)]
mod tests;
