//! Extension components (the `extension-plugin` world, of contract 0.2.0
//! or 0.4.0, chosen by the version the component declares): loaded,
//! sandboxed and fed like backends (same engine, limits, fuel and log
//! budget), one Store per instance. An instance sees only its own
//! annotations. A 0.4.0 component may also accept (end its own rules for
//! a connection) and refuse its parameters when it is loaded
//! ([`ExtensionPlugin::check_parameters`]).

use kpx_rules::model::{Change, Cluster, Node, ServicePort, Settings};
use kpx_rules::ops::extension::Ruleset;
use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::wit::since_v0_2_0::{self as v0_2_0};
use super::wit::since_v0_4_0::{self, extension as v0_4_0};
use super::{Error, PluginBase, PluginState, PluginStats, Result, Sandbox};

/// The longest extension name: `KUBE-X-<NAME>-` plus a 10-character
/// hash fits iptables' 28-byte chain names.
pub const MAX_NAME: usize = 10;

/// Where an extension's annotations live: `ext.kpx.dev/<name>.<key>`.
pub fn annotation_prefix(name: &str) -> String {
    format!("{}{name}.", crate::wellknown::EXTENSION_PREFIX)
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

/// A linked extension component of a known contract version.
pub(super) enum ExtensionPre {
    V0_2_0(v0_2_0::ExtensionPre),
    V0_4_0(v0_4_0::Pre),
}

impl ExtensionPre {
    /// The typed pre-instance of a component built for `version` (one of
    /// [`super::SUPPORTED`]); Err says why it is no extension of that
    /// version.
    pub(super) fn new(version: &str, pre: InstancePre<PluginState>) -> Result<ExtensionPre, String> {
        let typed = match version {
            v0_2_0::VERSION => v0_2_0::ExtensionPre::new(pre).map(ExtensionPre::V0_2_0),
            since_v0_4_0::VERSION => v0_4_0::Pre::new(pre).map(ExtensionPre::V0_4_0),
            other => {
                return Err(format!(
                    "not an extension component: it is built for kpx:proxier {other}, which has no extension world \
                     (extensions are built for {} or {})",
                    v0_2_0::VERSION,
                    since_v0_4_0::VERSION
                ));
            }
        };
        typed.map_err(|e| {
            format!(
                "not an extension component (the extension-plugin world exports kpx:proxier/extension@{version}): {e:#}"
            )
        })
    }
}

/// A live extender of a known contract version.
enum Bindings {
    V0_2_0(v0_2_0::ExtensionInstance),
    V0_4_0(v0_4_0::Instance),
}

impl Bindings {
    fn reset(
        &self,
        store: &mut Store<PluginState>,
        prefix: &str,
        node: &Node,
        cluster: &Cluster,
        services: &[&ServicePort],
    ) -> wasmtime::Result<()> {
        match self {
            Bindings::V0_2_0(i) => i.reset(store, prefix, node, cluster, services),
            Bindings::V0_4_0(i) => i.reset(store, prefix, node, cluster, services),
        }
    }

    fn apply(&self, store: &mut Store<PluginState>, prefix: &str, changes: &[Change]) -> wasmtime::Result<()> {
        match self {
            Bindings::V0_2_0(i) => i.apply(store, prefix, changes),
            Bindings::V0_4_0(i) => i.apply(store, prefix, changes),
        }
    }

    fn render(&self, store: &mut Store<PluginState>) -> wasmtime::Result<Result<Ruleset, String>> {
        match self {
            Bindings::V0_2_0(i) => i.render(store),
            Bindings::V0_4_0(i) => i.render(store),
        }
    }
}

/// A loaded extension component, ready to instantiate.
pub struct ExtensionPlugin {
    pub(super) base: PluginBase,
    pub(super) pre: ExtensionPre,
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
        let made = match &self.pre {
            ExtensionPre::V0_2_0(pre) => {
                pre.instantiate(&mut sandbox.store, settings, parameters).map(Bindings::V0_2_0)
            }
            ExtensionPre::V0_4_0(pre) => {
                pre.instantiate(&mut sandbox.store, settings, parameters).map(Bindings::V0_4_0)
            }
        };
        let bindings = self.base.instantiated(&mut sandbox, made)?;
        Ok(ExtensionInstance { sandbox, bindings, prefix: annotation_prefix(name) })
    }

    /// The contract version the component is built for.
    pub fn version(&self) -> &'static str {
        match self.pre {
            ExtensionPre::V0_2_0(_) => v0_2_0::VERSION,
            ExtensionPre::V0_4_0(_) => since_v0_4_0::VERSION,
        }
    }

    /// Puts the operator's `parameters` to the component, once, when kpx
    /// loads it (at start, and for a replaced file), on an instance of its
    /// own, before any extender is made: so that a mistake in the flag
    /// stops kpx with the component's reason instead of failing every
    /// render. [`Error::ParametersRefused`] carries the refusal; a trap is
    /// [`Error::Trapped`], as in any call. A 0.2.0 component has no say:
    /// always Ok.
    pub fn check_parameters(&self, parameters: &[(String, String)]) -> Result<()> {
        let ExtensionPre::V0_4_0(pre) = &self.pre else { return Ok(()) };
        let mut sandbox = self.base.sandbox();
        let answer = pre.check_parameters(&mut sandbox.store, parameters);
        sandbox.check("check-parameters", answer)?.map_err(|message| Error::ParametersRefused {
            plugin: self.name().to_string(),
            message: super::log_line(&message),
        })
    }
}

/// One live extension instance with its extender resource.
pub struct ExtensionInstance {
    sandbox: Sandbox,
    bindings: Bindings,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{Limits, Runtime};
    use kpx_rules::model::{IpFamily, Protocol, ProxyMode};
    use kpx_rules::ops::extension::Action;

    fn load(file: &str) -> ExtensionPlugin {
        let bytes = std::fs::read(format!("{}/{file}", env!("KPX_TEST_PLUGIN_DIR"))).unwrap();
        Runtime::new(Limits::default(), None).unwrap().load_extension("probe", &bytes).unwrap()
    }

    fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The rules of a fresh instance with `parameters`, for one port.
    fn render(plugin: &ExtensionPlugin, parameters: &[(String, String)]) -> Result<Ruleset> {
        let settings = Settings::new(IpFamily::V4, ProxyMode::Nftables);
        let mut instance = plugin.instantiate("probe", &settings, parameters)?;
        let port = ServicePort::new("ns", "web", "", Protocol::Tcp, 80);
        instance.reset(&Node::default(), &Cluster::default(), [&port])?;
        instance.render(1)
    }

    /// A 0.4.0 component is asked about its parameters, and refuses a bad
    /// one with its reason; its accept rules cross.
    #[test]
    fn a_0_4_0_extension_accepts_and_refuses_its_parameters_at_load() {
        let probe = load("kpx_plugin_ext_probe.wasm");
        assert_eq!(probe.version(), "0.4.0");
        assert!(probe.check_parameters(&params(&[("do", "count")])).is_ok());
        match probe.check_parameters(&params(&[("do", "nonsense")])) {
            Err(Error::ParametersRefused { message, .. }) => assert!(message.contains("do=nonsense"), "{message}"),
            other => panic!("want a refusal: {other:?}"),
        }
        let bad = probe.check_parameters(&params(&[("do", "accept-from"), ("from", "ten")]));
        assert!(
            matches!(&bad, Err(Error::ParametersRefused { message, .. }) if message.contains("from=ten")),
            "{bad:?}"
        );
        let from = params(&[("do", "accept-from"), ("from", "192.0.2.0/24")]);
        assert!(probe.check_parameters(&from).is_ok());
        let actions: Vec<Action> = render(&probe, &from).unwrap().rules.iter().map(|r| r.action).collect();
        assert_eq!(actions, [Action::Accept, Action::Drop]);
    }

    /// A 0.2.0 component still runs; kpx never asks it about its
    /// parameters, and an accept, which 0.2.0 cannot say, fails its render.
    #[test]
    fn a_0_2_0_extension_runs_and_is_never_asked_about_its_parameters() {
        let old = load("kpx_plugin_ext_v0_2.wasm");
        assert_eq!(old.version(), "0.2.0");
        assert!(old.check_parameters(&params(&[("do", "nonsense")])).is_ok());
        let counted = render(&old, &[]).unwrap();
        assert_eq!(counted.rules.iter().map(|r| r.action).collect::<Vec<_>>(), [Action::Continue]);
        let err = render(&old, &params(&[("do", "accept")])).expect_err("0.2.0 cannot say accept");
        assert!(matches!(err, Error::Failed { .. }) && err.to_string().contains("accepts"), "{err}");
    }
}
