//! One extension in one family: its instance, fed the same changes as the
//! family's backend, and the kernel objects its rules become.

use std::collections::BTreeMap;
use std::sync::Arc;

use kpx_rules::model::{Change, Cluster, IpFamily, Node, ProxyMode, Settings};

use kpx_rules::ops::extension::Ruleset;

use super::iptables::IptablesWriter;
use super::layout::{self, Counter, Layout};
use super::nftables::NftablesWriter;
use crate::family::Error;
use crate::kernel::iptables::backend::Backend;
use crate::kernel::{SyncError, SystemExec};
use crate::runtime::{self, ExtensionInstance, ExtensionPlugin};

/// `--extension NAME=FILE[,key=value...]`, loaded.
#[derive(Clone)]
pub struct Configured {
    pub name: String,
    /// None: its file could not be loaded at start (logged); kpx runs
    /// without it until a replacement file loads.
    pub plugin: Option<Arc<ExtensionPlugin>>,
    pub parameters: Vec<(String, String)>,
}

/// What a family feeds its extensions: its state as its backend holds it.
#[derive(Clone, Copy)]
pub struct Feed<'a> {
    pub settings: &'a Settings,
    pub node: &'a Node,
    pub cluster: &'a Cluster,
    pub ports: &'a crate::state::PortMap,
    /// Service ports plus endpoints (what scales a call's fuel).
    pub objects: usize,
}

enum Writer {
    Iptables(IptablesWriter),
    Nftables(NftablesWriter),
}

impl Writer {
    fn write(&mut self, layout: &Layout, full: bool) -> crate::kernel::Result<bool> {
        match self {
            Writer::Iptables(w) => w.write(layout, full),
            Writer::Nftables(w) => w.write(layout, full),
        }
    }

    /// Removes every object of the extension in its mode, if any.
    fn clear(&mut self) -> crate::kernel::Result<()> {
        match self {
            Writer::Iptables(w) => w.cleanup().map(|_| ()),
            Writer::Nftables(w) => w.cleanup().map(|_| ()),
        }
    }

    /// `dumps`: the family's iptables counts, read by the first
    /// extension that needs them and shared by the others.
    fn counters(&mut self, dumps: &mut Option<super::iptables::Dumps>) -> crate::kernel::Result<super::RawCounts> {
        match self {
            Writer::Iptables(w) => {
                if dumps.is_none() {
                    *dumps = Some(w.save_counts()?);
                }
                Ok(w.counters(dumps.as_ref().expect("read above")))
            }
            Writer::Nftables(w) => w.counters(),
        }
    }
}

pub struct ExtensionProxier {
    configured: Configured,
    family: IpFamily,
    instance: Option<ExtensionInstance>,
    writer: Writer,
    /// The counters of the last layout written, by id.
    counters: BTreeMap<String, Counter>,
    need_full: bool,
    /// Syncs that failed (plugin error or trap, refused rules, kernel).
    failures: u64,
    /// The counting objects as last read.
    raw: super::RawCounts,
    /// The rules of the last good render.
    last_good: Option<Ruleset>,
    /// Its objects were removed (nothing good to keep) and nothing was
    /// written since.
    cleared: bool,
    /// The settings the instance was made with: others make a new one.
    settings: Option<Settings>,
    /// After a failure: when to try again, and the wait after the next
    /// failure (1 s doubling to 1 min).
    retry_at: Option<std::time::Instant>,
    backoff: std::time::Duration,
}

const FIRST_RETRY: std::time::Duration = std::time::Duration::from_secs(1);
const MAX_RETRY: std::time::Duration = std::time::Duration::from_secs(60);

impl ExtensionProxier {
    /// `mode` is iptables or nftables (the caller refuses the others).
    /// `backend`: the iptables tools in iptables mode.
    pub fn new(configured: Configured, family: IpFamily, mode: ProxyMode, backend: Backend) -> ExtensionProxier {
        let failures = u64::from(configured.plugin.is_none());
        let writer = match mode {
            ProxyMode::Nftables => Writer::Nftables(NftablesWriter::new(&configured.name, family)),
            _ => Writer::Iptables(
                IptablesWriter::new(&configured.name, family, Box::new(SystemExec::default())).with_backend(backend),
            ),
        };
        ExtensionProxier {
            configured,
            family,
            instance: None,
            writer,
            counters: BTreeMap::new(),
            need_full: true,
            failures,
            raw: Default::default(),
            last_good: None,
            cleared: false,
            settings: None,
            retry_at: None,
            backoff: FIRST_RETRY,
        }
    }

    pub fn name(&self) -> &str {
        &self.configured.name
    }

    /// Whether a component runs for it (false while its file has not
    /// loaded since start).
    pub fn is_loaded(&self) -> bool {
        self.configured.plugin.is_some()
    }

    /// Failed syncs since the last call.
    pub fn take_failures(&mut self) -> u64 {
        std::mem::take(&mut self.failures)
    }

    /// Feeds the changes the backend got, renders, checks and writes.
    /// A failure (or a retry not yet due, or no component loaded) keeps
    /// the last good rules, laid out again on the current state: rules for
    /// ports that left go with them, so no object acts on a destination
    /// the state no longer holds. The next try replays the state (a fresh
    /// instance after a trap).
    pub fn sync(&mut self, feed: &Feed, changes: &[Change], full: bool) -> Result<bool, Error> {
        let now = std::time::Instant::now();
        if self.retry_at.is_some_and(|at| now < at) || self.configured.plugin.is_none() {
            // The state moved (or a full sync asks): the last good rules
            // laid out again; else what was laid out stands.
            if full || !changes.is_empty() {
                self.fall_back(feed);
            }
            return Ok(false);
        }
        let result = self.program(feed, changes, full || self.need_full);
        self.need_full = result.is_err();
        if result.is_err() {
            self.failures += 1;
            self.retry_at = Some(now + self.backoff);
            self.backoff = (self.backoff * 2).min(MAX_RETRY);
            self.fall_back(feed);
        } else {
            self.retry_at = None;
            self.backoff = FIRST_RETRY;
        }
        result
    }

    /// The last good rules (none: none at all) on the current state.
    fn fall_back(&mut self, feed: &Feed) {
        let kept = self.last_good.as_ref().map_or_else(Vec::new, |r| {
            r.rules.iter().filter(|rule| feed.ports.contains_key(&rule.service)).cloned().collect()
        });
        let ruleset = Ruleset { rules: kept };
        // They passed the checks on a larger state; a smaller one leaves
        // fewer ports over the totals.
        let skipped = crate::validate::extension::check(&self.configured.name, self.family, &ruleset, feed.ports)
            .unwrap_or_default();
        let layout = layout::build(&self.configured.name, feed.settings, &ruleset, feed.ports, &skipped);
        self.counters = layout.counters.clone();
        if layout.chains.is_empty() {
            // Nothing good to keep: whatever an earlier process left goes,
            // once, and no empty objects or jumps are made for it.
            if !self.cleared {
                match self.writer.clear() {
                    Ok(()) => self.cleared = true,
                    Err(e) => {
                        tracing::warn!(extension = %self.configured.name, family = %self.family, "cannot remove its objects: {e}")
                    }
                }
            }
            return;
        }
        self.cleared = false;
        if let Err(e) = self.writer.write(&layout, false) {
            tracing::warn!(extension = %self.configured.name, family = %self.family, "cannot write the last good rules on the current state: {e}");
        }
    }

    /// When a failed extension is to be tried again.
    pub fn retry_at(&self) -> Option<std::time::Instant> {
        self.retry_at
    }

    fn program(&mut self, feed: &Feed, changes: &[Change], full: bool) -> Result<bool, Error> {
        let Feed { settings, node, cluster, ports, objects } = *feed;
        let Some(plugin) = self.configured.plugin.clone() else { return Ok(false) };
        let mut full = full;
        if self.settings.as_ref() != Some(settings) {
            // Constructed with settings, as a backend's proxier is: new
            // settings, a new instance.
            self.instance = None;
            self.settings = Some(settings.clone());
            full = true;
        }
        if self.instance.is_none() {
            self.instance = Some(plugin.instantiate(&self.configured.name, settings, &self.configured.parameters)?);
        }
        // A full sync replays the state: the changes of a sync that failed
        // before this extension ran are in it.
        if full {
            self.call(|i| i.reset(node, cluster, crate::state::ports_in(ports)))?;
        } else if !changes.is_empty() {
            self.call(|i| i.apply(changes))?;
        }
        let ruleset = self.call(|i| i.render(objects))?;
        let family = self.family;
        let sync_err = |source: SyncError| Error::Sync { family, source };
        let skipped = crate::validate::extension::check(plugin.name(), family, &ruleset, ports)
            .map_err(|e| sync_err(e.into()))?;
        for (port, why) in &skipped {
            tracing::warn!(extension = %self.configured.name, family = %family, service = %port, "the rules for this port are left out: {why}");
        }
        let layout = layout::build(&self.configured.name, settings, &ruleset, ports, &skipped);
        // Set first: a write that fails after the restore (a jump) still
        // leaves these counters to read.
        self.counters = layout.counters.clone();
        let wrote = self.writer.write(&layout, full).map_err(|e| sync_err(e.into()))?;
        self.last_good = Some(ruleset);
        self.cleared = false;
        Ok(wrote)
    }

    /// A call into the instance; a trap (or oversized output) drops it.
    fn call<T>(&mut self, f: impl FnOnce(&mut ExtensionInstance) -> runtime::Result<T>) -> runtime::Result<T> {
        let instance = self.instance.as_mut().expect("instantiated before any call");
        let result = f(instance);
        if let Err(e) = &result
            && e.needs_fresh_instance()
        {
            self.instance = None;
        }
        result
    }

    /// A replacement component's trial on the state given: instantiated
    /// with this extension's name and parameters, the state replayed, its
    /// rules rendered and checked. Nothing is written.
    pub fn try_replacement(&self, plugin: &Arc<ExtensionPlugin>, feed: &Feed) -> Result<ExtensionInstance, Error> {
        let Feed { settings, node, cluster, ports, objects } = *feed;
        let c = &self.configured;
        let mut instance = plugin.instantiate(&c.name, settings, &c.parameters)?;
        instance.reset(node, cluster, crate::state::ports_in(ports))?;
        let ruleset = instance.render(objects)?;
        crate::validate::extension::check(plugin.name(), self.family, &ruleset, ports)
            .map_err(|e| Error::Sync { family: self.family, source: e.into() })?;
        Ok(instance)
    }

    /// Runs `plugin` from now on, with a tried instance; the next sync
    /// writes its rules.
    pub fn switch(&mut self, plugin: Arc<ExtensionPlugin>, instance: ExtensionInstance) {
        self.configured.plugin = Some(plugin);
        self.instance = Some(instance);
        self.need_full = true;
        // The old component's backoff is not the new one's.
        self.retry_at = None;
        self.backoff = FIRST_RETRY;
    }

    /// (service port, counter, packets counted since the last call) of
    /// every counter the rules name; `dumps` as [`Writer::counters`]
    /// shares them. A failed read counts nothing new (and is logged).
    pub fn counted(&mut self, dumps: &mut Option<super::iptables::Dumps>) -> Vec<(String, String, u64)> {
        let new = match self.writer.counters(dumps) {
            Ok(raw) => super::advance(&mut self.raw, raw),
            Err(e) => {
                tracing::warn!(extension = %self.configured.name, family = %self.family, "cannot read the counters: {e}");
                BTreeMap::new()
            }
        };
        self.counters
            .iter()
            .map(|(id, c)| (c.service.clone(), c.name.clone(), new.get(id).copied().unwrap_or(0)))
            .collect()
    }
}
