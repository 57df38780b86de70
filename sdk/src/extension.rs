//! The extension world: [`Extension`] and [`export_extension!`](crate::export_extension).
//!
//! An extension says what happens to new connections to Service ports
//! ([`Rule`]): count them, rate-limit them, drop or reject them, or
//! accept them (end its own rules for them), at one of three points of
//! their path ([`Attachment`]). It names no chain, table or address: the
//! host writes every kernel object and scopes each rule to the port's own
//! destinations. The SDK keeps the state the host sends; an extension only
//! turns it into rules.
//!
//! ```text
//! struct Limiter;
//! impl kpx_sdk::extension::Extension for Limiter {
//!     fn check_parameters(parameters: &[(String, String)]) -> Result<(), String> { /* ... */ }
//!     fn new(_: Settings, _: Vec<(String, String)>) -> Self { Limiter }
//!     fn rules(&mut self, state: &State) -> Result<Vec<Rule>, String> { /* ... */ }
//! }
//! kpx_sdk::export_extension!(Limiter);
//! ```
//!
//! [`export_extension!`](crate::export_extension) builds the component
//! for kpx:proxier 0.4.0 ([`PLUGIN_CONTRACT_VERSION`](crate::PLUGIN_CONTRACT_VERSION));
//! [`export_extension_v0_2!`](crate::export_extension_v0_2) builds the
//! same extension for 0.2.0, which kpx still runs, but which has neither
//! [`Action::Accept`] (a render that returns one fails, naming it) nor
//! [`Extension::check_parameters`] (kpx never asks).
//!
//! A Service's annotations `ext.kpx.dev/<name>.<key>` (where `<name>` is
//! the name the operator gave the extension with `--extension`) reach the
//! extension as `port.annotations`, `<key>` only.
//!
//! An allow-list is [`Action::Accept`] rules for the sources allowed, then
//! one [`Action::Drop`] (or [`Action::Reject`]) rule for the rest.
//! [`crate::cidr`] has the CIDR arithmetic source matches need:
//! containment, overlap, and the complement of a set of prefixes (what an
//! allow-list takes as drop rules alone, for 0.2.0, which has no accept).

use std::cell::RefCell;
use std::collections::BTreeMap;

use kpx_rules::model::{Change, Cluster, Node, ServicePort, Settings};
pub use kpx_rules::ops::extension::{Action, Attachment, Rate, Rule, SourceMatch, valid_counter_name};

#[doc(hidden)]
pub mod __bindings {
    wit_bindgen::generate!({
        path: "../wit/since_v0.2.0",
        world: "extension-plugin",
        pub_export_macro: true,
        export_macro_name: "__export_extension_plugin",
        default_bindings_module: "::kpx_sdk::extension::__bindings",
    });
}

/// The 0.4.0 extension world: its own `extension` (with `accept` and
/// `check-parameters`), 0.2.0's types, log and extension types bound to
/// [`__bindings`]' (so that both worlds share the conversions).
///
/// The world is 0.4.0's `extension-plugin` under a name of its own:
/// wit-bindgen names a world's exported macro after the world
/// (`__export_<world>_impl`, at the crate's root), and 0.2.0's
/// `extension-plugin` is bound in this crate too. The component is the
/// same: what it imports and exports are interfaces, named by their
/// package.
#[doc(hidden)]
pub mod __bindings_v0_4 {
    wit_bindgen::generate!({
        inline: "
            package kpx:sdk-extension;

            world extension-plugin-v04 {
                import kpx:proxier/log@0.2.0;
                export kpx:proxier/extension@0.4.0;
            }
        ",
        path: "../wit/since_v0.4.0",
        world: "extension-plugin-v04",
        pub_export_macro: true,
        export_macro_name: "__export_extension_plugin_v0_4",
        default_bindings_module: "::kpx_sdk::extension::__bindings_v0_4",
        with: {
            "kpx:proxier/types@0.2.0": crate::extension::__bindings::kpx::proxier::types,
            "kpx:proxier/log@0.2.0": crate::extension::__bindings::kpx::proxier::log,
        },
    });
}

mod convert {
    kpx_rules::wit_conversions!(crate::extension::__bindings::kpx::proxier::types);
    pub use wit_convert::*;
}

use __bindings::exports::kpx::proxier::extension as wit;
use __bindings::kpx::proxier::types as wt;
use __bindings_v0_4::exports::kpx::proxier0_4_0::extension as wit4;

/// What the host sent: this node, the cluster, and every service port
/// of the instance's family by key.
#[derive(Clone, Debug, Default)]
pub struct State {
    pub node: Node,
    pub cluster: Cluster,
    pub ports: BTreeMap<String, ServicePort>,
}

impl State {
    /// Applies changes the host sent.
    pub fn apply(&mut self, changes: Vec<Change>) {
        for c in changes {
            match c {
                Change::Upsert(p) => {
                    self.ports.insert(p.key.clone(), p);
                }
                Change::Remove(key) => {
                    self.ports.remove(&key);
                }
                Change::Node(n) => self.node = n,
                Change::Cluster(c) => self.cluster = c,
            }
        }
    }

    /// A port's annotation (the key without the extension's prefix).
    pub fn annotation<'a>(port: &'a ServicePort, key: &str) -> Option<&'a str> {
        port.annotations.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// An extension component: long-lived, one per IP family.
pub trait Extension {
    /// Whether the extension takes the operator's parameters (`--extension
    /// NAME=FILE,key=value,...`): called once when kpx loads the component
    /// (at start, and again for a replaced file), before any instance is
    /// made. Refuse a bad parameter here, naming it and what it takes: an
    /// `Err` stops kpx at start with the reason, and a replaced file that
    /// refuses is refused (the running one keeps serving), where a problem
    /// found later would fail every render instead. [`Extension::new`]
    /// then gets only parameters this took. The default takes any. (A
    /// 0.2.0 component, [`export_extension_v0_2!`](crate::export_extension_v0_2),
    /// is never asked.)
    fn check_parameters(parameters: &[(String, String)]) -> Result<(), String> {
        let _ = parameters;
        Ok(())
    }

    /// `parameters`: the operator's `--extension NAME=FILE,key=value,...`.
    fn new(settings: Settings, parameters: Vec<(String, String)>) -> Self;
    /// The whole set of rules for `state`, or why not (the host keeps
    /// the last good rules, logs the reason and tries again).
    fn rules(&mut self, state: &State) -> Result<Vec<Rule>, String>;
}

#[doc(hidden)]
pub struct ExtensionResource<E> {
    extension: RefCell<E>,
    state: RefCell<State>,
}

/// What both worlds' extenders do; only their rules' types differ.
impl<E: Extension + 'static> ExtensionResource<E> {
    fn create(settings: wt::Settings, parameters: Vec<(String, String)>) -> Self {
        crate::install_panic_hook();
        ExtensionResource {
            extension: RefCell::new(E::new(convert::from_wit_settings(settings), parameters)),
            state: RefCell::new(State::default()),
        }
    }

    fn reset_state(&self, node: wt::Node, cluster: wt::Cluster, services: Vec<wt::ServicePort>) {
        let ports = services.into_iter().map(convert::from_wit_service_port).map(|p| (p.key.clone(), p)).collect();
        *self.state.borrow_mut() =
            State { node: convert::from_wit_node(node), cluster: convert::from_wit_cluster(cluster), ports };
    }

    fn apply_changes(&self, changes: Vec<wt::Change>) {
        self.state.borrow_mut().apply(changes.into_iter().map(convert::from_wit_change).collect());
    }

    fn current_rules(&self) -> Result<Vec<Rule>, String> {
        self.extension.borrow_mut().rules(&self.state.borrow())
    }
}

impl<E: Extension + 'static> wit::GuestExtender for ExtensionResource<E> {
    fn new(settings: wt::Settings, parameters: Vec<(String, String)>) -> Self {
        Self::create(settings, parameters)
    }

    fn reset(&self, node: wt::Node, cluster: wt::Cluster, services: Vec<wt::ServicePort>) {
        self.reset_state(node, cluster, services);
    }

    fn apply(&self, changes: Vec<wt::Change>) {
        self.apply_changes(changes);
    }

    /// 0.2.0's rules: an accept cannot cross, and fails the render.
    fn render(&self) -> Result<wit::Ruleset, String> {
        let rules = self.current_rules()?;
        Ok(wit::Ruleset { rules: rules.into_iter().map(to_wit_rule).collect::<Result<_, _>>()? })
    }
}

impl<E: Extension + 'static> wit4::GuestExtender for ExtensionResource<E> {
    fn new(settings: wt::Settings, parameters: Vec<(String, String)>) -> Self {
        Self::create(settings, parameters)
    }

    fn reset(&self, node: wt::Node, cluster: wt::Cluster, services: Vec<wt::ServicePort>) {
        self.reset_state(node, cluster, services);
    }

    fn apply(&self, changes: Vec<wt::Change>) {
        self.apply_changes(changes);
    }

    fn render(&self) -> Result<wit4::Ruleset, String> {
        let rules = self.current_rules()?;
        Ok(wit4::Ruleset { rules: rules.into_iter().map(to_wit4_rule).collect() })
    }
}

fn to_wit_attachment(a: Attachment) -> wit::Attachment {
    match a {
        Attachment::BeforeDispatch => wit::Attachment::BeforeDispatch,
        Attachment::Service => wit::Attachment::Service,
        Attachment::Firewall => wit::Attachment::Firewall,
    }
}

fn to_wit_source(s: SourceMatch) -> wit::SourceMatch {
    wit::SourceMatch { negate: s.negate, cidr: convert::to_wit_cidr(&s.cidr) }
}

fn to_wit_rate(r: Rate) -> wit::Rate {
    wit::Rate { per_second: r.per_second, burst: r.burst }
}

/// A rule as 0.2.0 says it; Err for an accept, which 0.2.0 cannot say.
fn to_wit_rule(r: Rule) -> Result<wit::Rule, String> {
    let action = match r.action {
        Action::Continue => wit::Action::Continue,
        Action::Drop => wit::Action::Drop,
        Action::Reject => wit::Action::Reject,
        Action::Accept => {
            return Err(format!(
                "a rule for {} accepts, which kpx:proxier {} cannot say: export the extension with \
                 kpx_sdk::export_extension! (kpx:proxier {})",
                r.service,
                crate::CONTRACT_VERSION,
                crate::PLUGIN_CONTRACT_VERSION
            ));
        }
    };
    Ok(wit::Rule {
        attachment: to_wit_attachment(r.attachment),
        service: r.service,
        source: r.source.map(to_wit_source),
        over_rate: r.over_rate.map(to_wit_rate),
        counter: r.counter,
        action,
    })
}

/// A rule as 0.4.0 says it (its attachment, source and rate restate
/// 0.2.0's).
fn to_wit4_rule(r: Rule) -> wit4::Rule {
    wit4::Rule {
        attachment: match r.attachment {
            Attachment::BeforeDispatch => wit4::Attachment::BeforeDispatch,
            Attachment::Service => wit4::Attachment::Service,
            Attachment::Firewall => wit4::Attachment::Firewall,
        },
        service: r.service,
        source: r.source.map(|s| wit4::SourceMatch { negate: s.negate, cidr: convert::to_wit_cidr(&s.cidr) }),
        over_rate: r.over_rate.map(|r| wit4::Rate { per_second: r.per_second, burst: r.burst }),
        counter: r.counter,
        action: match r.action {
            Action::Continue => wit4::Action::Continue,
            Action::Drop => wit4::Action::Drop,
            Action::Reject => wit4::Action::Reject,
            Action::Accept => wit4::Action::Accept,
        },
    }
}

/// The 0.4.0 export of an [`Extension`] ([`export_extension!`](crate::export_extension)).
#[doc(hidden)]
pub struct ExtensionExport<E>(std::marker::PhantomData<E>);

impl<E: Extension + 'static> wit4::Guest for ExtensionExport<E> {
    type Extender = ExtensionResource<E>;

    fn check_parameters(parameters: Vec<(String, String)>) -> Result<(), String> {
        crate::install_panic_hook();
        E::check_parameters(&parameters)
    }
}

/// The 0.2.0 export of an [`Extension`] ([`export_extension_v0_2!`](crate::export_extension_v0_2)).
#[doc(hidden)]
pub struct ExtensionExportV0_2<E>(std::marker::PhantomData<E>);

impl<E: Extension + 'static> wit::Guest for ExtensionExportV0_2<E> {
    type Extender = ExtensionResource<E>;
}

/// Exports an [`Extension`] implementation as the plugin's
/// `kpx:proxier/extension@0.4.0` (accept, and parameters checked at load).
#[macro_export]
macro_rules! export_extension {
    ($extension:ty) => {
        type __KpxExtensionExport = $crate::extension::ExtensionExport<$extension>;
        $crate::extension::__bindings_v0_4::__export_extension_plugin_v0_4!(
            __KpxExtensionExport with_types_in $crate::extension::__bindings_v0_4
        );

        $crate::__kpx_version_section!($crate::PLUGIN_CONTRACT_VERSION);
    };
}

/// Exports an [`Extension`] implementation as `kpx:proxier/extension@0.2.0`,
/// which kpx still runs: without accept (a render that returns an
/// [`Action::Accept`] rule fails, naming it) and without
/// [`Extension::check_parameters`] (kpx never asks a 0.2.0 component).
#[macro_export]
macro_rules! export_extension_v0_2 {
    ($extension:ty) => {
        type __KpxExtensionExport = $crate::extension::ExtensionExportV0_2<$extension>;
        $crate::extension::__bindings::__export_extension_plugin!(
            __KpxExtensionExport with_types_in $crate::extension::__bindings
        );

        $crate::__kpx_version_section!($crate::CONTRACT_VERSION);
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(action: Action) -> Rule {
        Rule {
            attachment: Attachment::Service,
            service: "ns/web".into(),
            source: Some(SourceMatch { negate: true, cidr: "10.1.0.0/16".parse().unwrap() }),
            over_rate: Some(Rate { per_second: 5, burst: 10 }),
            counter: Some("n".into()),
            action,
        }
    }

    /// 0.4.0 says every action; 0.2.0 every one but accept, which fails
    /// naming the rule's port and the macro that builds 0.4.0.
    #[test]
    fn an_accept_crosses_in_0_4_0_only() {
        let accept = to_wit4_rule(rule(Action::Accept));
        assert!(matches!(accept.action, wit4::Action::Accept));
        assert!(matches!(accept.attachment, wit4::Attachment::Service));
        assert_eq!((accept.source.map(|s| s.negate), accept.over_rate.map(|r| r.burst)), (Some(true), Some(10)));
        for action in [Action::Continue, Action::Drop, Action::Reject] {
            assert!(to_wit_rule(rule(action)).is_ok(), "{action:?}");
        }
        let err = to_wit_rule(rule(Action::Accept)).expect_err("0.2.0 has no accept");
        assert!(err.contains("ns/web") && err.contains("export_extension!"), "{err}");
    }
}
