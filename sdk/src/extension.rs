//! The extension world: [`Extension`] and [`export_extension!`](crate::export_extension).
//!
//! An extension says what happens to new connections to Service ports
//! ([`Rule`]): count them, rate-limit them, drop or reject them, at one
//! of three points of their path ([`Attachment`]). It names no chain,
//! table or address: the host writes every kernel object and scopes each
//! rule to the port's own destinations. The SDK keeps the state the host
//! sends; an extension only turns it into rules.
//!
//! ```text
//! struct Limiter;
//! impl kpx_sdk::extension::Extension for Limiter {
//!     fn new(_: Settings, _: Vec<(String, String)>) -> Self { Limiter }
//!     fn rules(&mut self, state: &State) -> Result<Vec<Rule>, String> { /* ... */ }
//! }
//! kpx_sdk::export_extension!(Limiter);
//! ```
//!
//! A Service's annotations `ext.kpx.dev/<name>.<key>` (where `<name>` is
//! the name the operator gave the extension with `--extension`) reach the
//! extension as `port.annotations`, `<key>` only.
//!
//! [`crate::cidr`] has the CIDR arithmetic source matches need: containment,
//! overlap, and the complement of a set of prefixes (an allow-list as drop
//! rules: the contract has no accept action).

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

mod convert {
    kpx_rules::wit_conversions!(crate::extension::__bindings::kpx::proxier::types);
    pub use wit_convert::*;
}

use __bindings::exports::kpx::proxier::extension as wit;
use __bindings::kpx::proxier::types as wt;

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

impl<E: Extension + 'static> wit::GuestExtender for ExtensionResource<E> {
    fn new(settings: wt::Settings, parameters: Vec<(String, String)>) -> Self {
        crate::install_panic_hook();
        ExtensionResource {
            extension: RefCell::new(E::new(convert::from_wit_settings(settings), parameters)),
            state: RefCell::new(State::default()),
        }
    }

    fn reset(&self, node: wt::Node, cluster: wt::Cluster, services: Vec<wt::ServicePort>) {
        let ports = services.into_iter().map(convert::from_wit_service_port).map(|p| (p.key.clone(), p)).collect();
        *self.state.borrow_mut() =
            State { node: convert::from_wit_node(node), cluster: convert::from_wit_cluster(cluster), ports };
    }

    fn apply(&self, changes: Vec<wt::Change>) {
        self.state.borrow_mut().apply(changes.into_iter().map(convert::from_wit_change).collect());
    }

    fn render(&self) -> Result<wit::Ruleset, String> {
        let rules = self.extension.borrow_mut().rules(&self.state.borrow())?;
        Ok(wit::Ruleset { rules: rules.into_iter().map(to_wit_rule).collect() })
    }
}

fn to_wit_rule(r: Rule) -> wit::Rule {
    wit::Rule {
        attachment: match r.attachment {
            Attachment::BeforeDispatch => wit::Attachment::BeforeDispatch,
            Attachment::Service => wit::Attachment::Service,
            Attachment::Firewall => wit::Attachment::Firewall,
        },
        service: r.service,
        source: r.source.map(|s| wit::SourceMatch { negate: s.negate, cidr: convert::to_wit_cidr(&s.cidr) }),
        over_rate: r.over_rate.map(|o| wit::Rate { per_second: o.per_second, burst: o.burst }),
        counter: r.counter,
        action: match r.action {
            Action::Continue => wit::Action::Continue,
            Action::Drop => wit::Action::Drop,
            Action::Reject => wit::Action::Reject,
        },
    }
}

#[doc(hidden)]
pub struct ExtensionExport<E>(std::marker::PhantomData<E>);

impl<E: Extension + 'static> wit::Guest for ExtensionExport<E> {
    type Extender = ExtensionResource<E>;
}

/// Exports an [`Extension`] implementation as the plugin's `kpx:proxier/extension`.
#[macro_export]
macro_rules! export_extension {
    ($extension:ty) => {
        type __KpxExtensionExport = $crate::extension::ExtensionExport<$extension>;
        $crate::extension::__bindings::__export_extension_plugin!(
            __KpxExtensionExport with_types_in $crate::extension::__bindings
        );

        $crate::__kpx_version_section!($crate::CONTRACT_VERSION);
    };
}
