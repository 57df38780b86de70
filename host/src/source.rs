//! Where Kubernetes objects come from. Every source emits the same
//! watcher-style [`Event`]s, so the state cannot tell them apart.

pub mod api;
pub mod manifests;
pub mod service;
pub mod slice;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

pub use service::Service;
pub use slice::Slice;

/// A null as an absent field, as k8s-openapi reads these fields (as
/// options); for the readers of objects off the wire and of the spec both
/// sources share.
pub(crate) fn null_as_default<'de, D: serde::Deserializer<'de>, T: Deserialize<'de> + Default>(
    d: D,
) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A list read off the wire at its length: serde grows a list of unknown
/// length from room for four (a slice's one port kept room for four, 9.6
/// MB at 30k slices in a heaptrack profile, and a Service's 7.7 MB).
pub(crate) fn exact<T>(mut v: Vec<T>) -> Vec<T> {
    v.shrink_to_fit();
    v
}

/// The kinds of object kpx reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
    ServiceCidr,
}

impl Kind {
    /// The kind as Kubernetes spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
            Kind::ServiceCidr => "ServiceCIDR",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a source counts the objects it refuses or drops
/// (`kpx_objects_refused_total{kind}`, [`crate::serve::metrics`]). Each
/// one is also logged where it is refused, at warn level, with its kind,
/// namespace/name and why. The default counts nowhere (tests, tools).
#[derive(Clone, Default)]
pub struct Refusals {
    count: Option<Arc<dyn Fn(&'static str) + Send + Sync>>,
}

impl Refusals {
    /// Refusals counted by `count`, called with the refused object's kind
    /// ([`Kind::as_str`], or `unknown` for a document that names no kind
    /// kpx reads).
    pub fn new(count: impl Fn(&'static str) + Send + Sync + 'static) -> Refusals {
        Refusals { count: Some(Arc::new(count)) }
    }

    /// Counts one refused object of `kind` (None: not a kind kpx reads).
    pub fn count(&self, kind: Option<Kind>) {
        if let Some(count) = &self.count {
            count(kind.map_or("unknown", Kind::as_str));
        }
    }
}

impl std::fmt::Debug for Refusals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refusals").field("counted", &self.count.is_some()).finish()
    }
}

/// Identity of one object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    pub kind: Kind,
    /// Empty for cluster-scoped kinds (Node).
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// One object. Shared (`Arc`): the source's cache and the state hold the
/// same copy, which at tens of thousands of objects is most of kpx's memory.
#[derive(Debug, Clone, PartialEq)]
pub enum Object {
    /// Kept in kpx's own compact form ([`Service`]).
    Service(Arc<Service>),
    /// Kept in kpx's own compact form ([`Slice`]).
    EndpointSlice(Arc<Slice>),
    Node(Arc<Node>),
    ServiceCidr(Arc<ServiceCIDR>),
}

impl Object {
    /// The same shared copy (cheap; equal content may still be a copy).
    pub fn same_copy(&self, other: &Object) -> bool {
        match (self, other) {
            (Object::Service(a), Object::Service(b)) => Arc::ptr_eq(a, b),
            (Object::EndpointSlice(a), Object::EndpointSlice(b)) => Arc::ptr_eq(a, b),
            (Object::Node(a), Object::Node(b)) => Arc::ptr_eq(a, b),
            (Object::ServiceCidr(a), Object::ServiceCidr(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    pub fn object_ref(&self) -> ObjectRef {
        let of = |kind, meta: &ObjectMeta| ObjectRef {
            kind,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
        };
        match self {
            Object::Service(o) => ObjectRef {
                kind: Kind::Service,
                namespace: o.metadata.namespace.clone().unwrap_or_default(),
                name: o.metadata.name.clone().unwrap_or_default(),
            },
            Object::EndpointSlice(o) => {
                ObjectRef { kind: Kind::EndpointSlice, namespace: o.meta.namespace.clone(), name: o.meta.name.clone() }
            }
            Object::Node(o) => of(Kind::Node, &o.metadata),
            Object::ServiceCidr(o) => of(Kind::ServiceCidr, &o.metadata),
        }
    }
}

/// What a source reports, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// An object was created or changed.
    Apply(Object),
    /// An object is gone.
    Delete(ObjectRef),
    /// The initial list is complete: syncing may start.
    Synced,
}
