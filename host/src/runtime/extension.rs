//! Extension components (the `extension-plugin` world): loaded, sandboxed
//! and fed like backends (same engine, limits, fuel and log budget), one
//! Store per instance. An instance sees only its own annotations.

use kpx_rules::model::{Change, Cluster, Node, ServicePort, Settings};
use kpx_rules::ops::extension::Ruleset;

use super::wit::since_v0_2_0::{self as v0_2_0};
use super::{PluginBase, PluginStats, Result, Sandbox};

/// The longest extension name: `KUBE-X-<NAME>-` plus a 10-character
/// hash fits iptables' 28-byte chain names.
pub const MAX_NAME: usize = 10;

/// Where an extension's annotations live: `ext.kpx.dev/<name>.<key>`.
pub fn annotation_prefix(name: &str) -> String {
    format!("{}{name}.", crate::state::annotations::EXTENSION_PREFIX)
}

/// Why `name` cannot name an extension: it must be [a-z][a-z0-9]*, at
/// most [`MAX_NAME`] bytes (it names chains, a table and annotations).
pub fn name_problem(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.as_bytes()[0].is_ascii_lowercase()
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    (!ok).then(|| {
        format!("extension name {name:?} must be a lower-case letter then letters or digits, at most {MAX_NAME} bytes")
    })
}

/// A loaded extension component, ready to instantiate.
pub struct ExtensionPlugin {
    pub(super) base: PluginBase,
    pub(super) pre: v0_2_0::ExtensionPre,
}

impl ExtensionPlugin {
    /// The component's label (its file name, or a test's name).
    pub fn name(&self) -> &str {
        self.base.name()
    }

    pub fn stats(&self) -> &PluginStats {
        self.base.stats()
    }

    /// A fresh instance of the extension configured as `name`, its
    /// extender constructed with the operator's parameters.
    pub fn instantiate(
        &self,
        name: &str,
        settings: &Settings,
        parameters: &[(String, String)],
    ) -> Result<ExtensionInstance> {
        let mut sandbox = self.base.sandbox();
        let made = self.pre.instantiate(&mut sandbox.store, settings, parameters);
        let bindings = self.base.instantiated(&mut sandbox, made)?;
        Ok(ExtensionInstance { sandbox, bindings, prefix: annotation_prefix(name) })
    }
}

/// One live extension instance with its extender resource.
pub struct ExtensionInstance {
    sandbox: Sandbox,
    bindings: v0_2_0::ExtensionInstance,
    prefix: String,
}

impl ExtensionInstance {
    /// Replaces the extension's whole state; the ports are borrowed, as
    /// [`super::BackendInstance::reset`]'s.
    pub fn reset<'a>(
        &mut self,
        node: &Node,
        cluster: &Cluster,
        services: impl IntoIterator<Item = &'a ServicePort>,
    ) -> Result<()> {
        let s = &mut self.sandbox;
        let services = s.refuel_for_reset(services);
        let result = self.bindings.reset(&mut s.store, &self.prefix, node, cluster, &services);
        s.check("reset", result)
    }

    /// Sends changes since the last call.
    pub fn apply(&mut self, changes: &[Change]) -> Result<()> {
        let s = &mut self.sandbox;
        s.refuel(super::changes_size(changes));
        let result = self.bindings.apply(&mut s.store, &self.prefix, changes);
        s.check("apply", result)
    }

    /// The extension's whole ruleset; `state_size` scales the fuel budget.
    pub fn render(&mut self, state_size: usize) -> Result<Ruleset> {
        let s = &mut self.sandbox;
        s.refuel(state_size);
        let result = self.bindings.render(&mut s.store);
        s.check("render", result)?.map_err(|message| s.failed("render", &message))
    }
}
