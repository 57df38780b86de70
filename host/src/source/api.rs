//! The Kubernetes API source: list and watch of Services, EndpointSlices,
//! this node's Node and ServiceCIDRs (kube-runtime's watcher), turned into
//! the same [`Event`]s the manifest source sends.
//!
//! - Services and EndpointSlices use upstream's label selector: not
//!   headless, no `service.kubernetes.io/service-proxy-name`.
//! - `Synced` is sent once the first lists of Services, EndpointSlices and
//!   this Node are complete; until then nothing is programmed.
//! - A relist (after a 410 Gone, or a watch that cannot resume) is diffed
//!   against what was reported: changed objects are applied, vanished ones
//!   deleted, and nothing else is touched, so programmed rules are never
//!   flushed. An error never deletes anything.
//! - `--config-sync-period` is upstream's informer resync: a replay of the
//!   informers' cache to handlers that find nothing changed. kpx's state is
//!   level-based, so it has no such replay; the flag is validated and shown
//!   in /configz.
//! - Fields the proxy does not read are dropped on arrival.
//! - An object that cannot be decoded ([`wire::Decoded`]) is logged (warn)
//!   with its kind, namespace/name and the decode error, counted
//!   (`kpx_objects_refused_total`), and its last good version stays, also
//!   through a relist; the other objects of its list apply. A watch error
//!   is logged with its causes.

mod mirror;
mod rate;
mod strip;
pub mod wire;

use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::runtime::{WatchStreamExt, watcher as watch};
use kube::{Api, Client};

pub use mirror::Mirror;

use super::slice::Placements;
use super::{Event, Kind, Object, ObjectRef, Refusals};
use crate::config::ApiConfig;

use wire::{Decoded, Undecodable};

/// Upstream's selector for Services and EndpointSlices.
pub const SERVICE_SELECTOR: &str = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No client configuration could be built; kpx exits.
    #[error("cannot configure the Kubernetes API client: {0}")]
    Config(String),
}

/// Builds the client: --kubeconfig (with --master overriding its server),
/// --master alone, or the in-cluster configuration; rate-limited to
/// --kube-api-qps / --kube-api-burst.
pub async fn client(config: &ApiConfig) -> Result<Client, Error> {
    let err = |e: &dyn std::fmt::Display| Error::Config(e.to_string());
    let mut cfg = match (&config.kubeconfig, &config.master) {
        (Some(path), _) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?
        }
        (None, Some(master)) => {
            kube::Config::new(master.parse().map_err(|e| err(&format!("--master {master:?}: {e}")))?)
        }
        (None, None) => kube::Config::incluster().map_err(|e| {
            Error::Config(format!(
                "neither --kubeconfig nor --master was given, and the in-cluster configuration is unusable: {e}"
            ))
        })?,
    };
    if let Some(master) = &config.master {
        cfg.cluster_url = master.parse().map_err(|e| err(&format!("--master {master:?}: {e}")))?;
    }
    let builder = kube::client::ClientBuilder::try_from(cfg).map_err(|e| err(&e))?;
    let client = match rate::Limit::new(config.qps, config.burst) {
        Some(limit) => builder.with_layer(&limit).build(),
        None => builder.build(),
    };
    Ok(client)
}

/// One kind's watch events, the object already stripped.
type Item = (Kind, Result<WatchEvent<Read>, watcher::Error>);

/// An object as a watch read it: in kpx's form, or not decodable.
#[derive(Debug)]
enum Read {
    Object(Object),
    Undecodable(Box<Undecodable>),
}

/// Retries for a kind the server may not serve (ServiceCIDR before
/// Kubernetes 1.33): doubling from 1 s to 5 min, so that thousands of
/// nodes of an older cluster ask rarely, and a cluster upgraded under kpx
/// is picked up.
#[derive(Debug, Clone)]
struct Patient {
    next: Duration,
}

impl Patient {
    const FIRST: Duration = Duration::from_secs(1);
    const MOST: Duration = Duration::from_secs(300);
}

impl Iterator for Patient {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (self.next * 2).min(Self::MOST);
        Some(now)
    }
}

impl kube::runtime::utils::Backoff for Patient {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

fn watch_kind<K>(
    api: Api<Decoded<K>>,
    config: watcher::Config,
    kind: Kind,
    wrap: fn(K, &mut Placements) -> Object,
) -> futures::stream::BoxStream<'static, Item>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let events = watch::watcher(api, config);
    let events = match kind {
        Kind::ServiceCidr => events.backoff(Patient { next: Patient::FIRST }).boxed(),
        _ => events.default_backoff().boxed(),
    };
    let read = move |o: Decoded<K>, placements: &mut Placements| match o {
        Decoded::Read(o) => Read::Object(wrap(o, placements)),
        Decoded::Undecodable(u) => Read::Undecodable(u),
    };
    let mut listing = Listing::default();
    events.flat_map(move |r| futures::stream::iter(listing.on(kind, r, &read))).boxed()
}

/// A list's objects, held as read until the list is whole. kube's watcher
/// hands a list out object by object; converted one at a time, each
/// object's kept form would be allocated into the holes its predecessors'
/// wire forms left, scattered among the wire objects still waiting, and
/// the API thread's malloc arena could give few pages back once the list
/// is gone (28 MB of 85 free but resident at 30k Services x 10). Converted
/// once the list is whole, from copies, what is kept is allocated in one
/// run, and the list read off the wire is freed whole.
struct Listing<K> {
    objects: Vec<K>,
}

impl<K> Default for Listing<K> {
    fn default() -> Self {
        Listing { objects: Vec::new() }
    }
}

impl<K: Clone> Listing<K> {
    fn on<O>(
        &mut self,
        kind: Kind,
        r: Result<WatchEvent<K>, watcher::Error>,
        wrap: &impl Fn(K, &mut Placements) -> O,
    ) -> Vec<(Kind, Result<WatchEvent<O>, watcher::Error>)> {
        match r {
            Ok(WatchEvent::Init) => {
                self.objects.clear();
                vec![(kind, Ok(WatchEvent::Init))]
            }
            Ok(WatchEvent::InitApply(o)) => {
                self.objects.push(o);
                Vec::new()
            }
            Ok(WatchEvent::InitDone) => {
                let listed = std::mem::take(&mut self.objects);
                let mut out = Vec::with_capacity(listed.len() + 1);
                // Copies, while the whole list is still held: see above.
                // The list's slices share their endpoints' placements.
                let mut placements = Placements::default();
                out.extend(listed.iter().map(|o| (kind, Ok(WatchEvent::InitApply(wrap(o.clone(), &mut placements))))));
                drop(listed);
                out.push((kind, Ok(WatchEvent::InitDone)));
                out
            }
            other => vec![(kind, other.map(|e| convert(e, wrap)))],
        }
    }
}

/// One watched object's event (a list's objects go through [`Listing`]).
fn convert<K, O>(e: WatchEvent<K>, wrap: &impl Fn(K, &mut Placements) -> O) -> WatchEvent<O> {
    let one = |o| wrap(o, &mut Placements::default());
    match e {
        WatchEvent::Apply(o) => WatchEvent::Apply(one(o)),
        WatchEvent::Delete(o) => WatchEvent::Delete(one(o)),
        WatchEvent::Init => WatchEvent::Init,
        WatchEvent::InitApply(o) => WatchEvent::InitApply(one(o)),
        WatchEvent::InitDone => WatchEvent::InitDone,
    }
}

/// What one watch event changes. An object that could not be decoded is
/// refused by name ([`refusal`]) and its last good version, if any, stays:
/// a relist that lists it keeps it, a watched change leaves it as it was
/// (a deletion, which names it, still deletes it).
fn on_event(mirror: &mut Mirror, kind: Kind, event: WatchEvent<Read>, refusals: &Refusals) -> Vec<Event> {
    let refuse = |u: &Undecodable| {
        let (r, message) = refusal(kind, u);
        tracing::warn!(kind = %kind, "{message}");
        refusals.count(Some(kind));
        r
    };
    match event {
        WatchEvent::Init => mirror.on(WatchEvent::Init),
        WatchEvent::InitDone => mirror.on(WatchEvent::InitDone),
        WatchEvent::InitApply(Read::Object(o)) => mirror.on(WatchEvent::InitApply(o)),
        WatchEvent::Apply(Read::Object(o)) => mirror.on(WatchEvent::Apply(o)),
        WatchEvent::Delete(Read::Object(o)) => mirror.on(WatchEvent::Delete(o)),
        WatchEvent::InitApply(Read::Undecodable(u)) => {
            if let Some(r) = refuse(&u) {
                mirror.keep(r);
            }
            Vec::new()
        }
        WatchEvent::Apply(Read::Undecodable(u)) => {
            refuse(&u);
            Vec::new()
        }
        WatchEvent::Delete(Read::Undecodable(u)) => match reference(kind, &u.metadata) {
            Some(r) => mirror.delete(r),
            None => Vec::new(),
        },
    }
}

/// The object an undecodable one names, when its metadata gives a name.
fn reference(kind: Kind, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<ObjectRef> {
    let name = meta.name.clone().filter(|n| !n.is_empty())?;
    Some(ObjectRef { kind, namespace: meta.namespace.clone().unwrap_or_default(), name })
}

/// The refusal of an object that could not be decoded: what it names, and
/// the log line, which names its kind, namespace/name (when its metadata
/// gives them) and the decode error.
fn refusal(kind: Kind, u: &Undecodable) -> (Option<ObjectRef>, String) {
    let r = reference(kind, &u.metadata);
    let message = match &r {
        Some(r) => format!("rejected: {r} cannot be decoded: {}; its last good version, if any, stays", u.error),
        None => format!("rejected: a {kind} whose metadata gives no name cannot be decoded: {}", u.error),
    };
    (r, message)
}

/// A watch error with its causes, each said once (kube's errors repeat
/// their cause in their own message). kube reads a watch event it cannot
/// decode as a `Status`, an empty one: said as such, not as an empty
/// ApiError.
fn describe(e: &watcher::Error) -> String {
    let status = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
        | watcher::Error::WatchError(s) => Some(s),
        _ => None,
    };
    if status.is_some_and(|s| s.code == 0 && s.message.is_empty() && s.reason.is_empty()) {
        return "the API server sent a watch event the client cannot decode (kube-rs reports it as an empty Status)"
            .into();
    }
    let mut out = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let said = c.to_string();
        if !out.contains(&said) {
            out.push_str(": ");
            out.push_str(&said);
        }
        cause = c.source();
    }
    out
}

/// The status code of an error the API server answered.
fn status(e: &watcher::Error) -> Option<u16> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s.code),
        watcher::Error::WatchError(s) => Some(s.code),
        _ => None,
    }
}

/// The four watches. Lists are served from the API server's watch cache
/// (resourceVersion=0, as client-go's reflector lists), not from etcd,
/// and ask for everything in one response: the watch cache answers a
/// resourceVersion=0 list whole whatever limit client-go sends, and
/// pages would each be a request under --kube-api-qps (10k Services in
/// pages of 500 took 6.8 s at the default 5 per second).
fn streams(client: &Client, node_name: &str) -> futures::stream::SelectAll<futures::stream::BoxStream<'static, Item>> {
    let mut base = watcher::Config::default().any_semantic();
    base.page_size = None;
    let services = base.clone().labels(SERVICE_SELECTOR);
    let node = base.clone().fields(&format!("metadata.name={node_name}"));
    futures::stream::select_all([
        watch_kind(Api::<Decoded<wire::WireService>>::all(client.clone()), services.clone(), Kind::Service, |o, _| {
            Object::Service(Arc::new(o.into()))
        }),
        watch_kind(
            Api::<Decoded<wire::WireSlice>>::all(client.clone()),
            services,
            Kind::EndpointSlice,
            |o, placements| Object::EndpointSlice(Arc::new(o.into_slice(placements))),
        ),
        watch_kind(Api::<Decoded<Node>>::all(client.clone()), node, Kind::Node, |o, _| {
            Object::Node(Arc::new(strip::node(o)))
        }),
        watch_kind(Api::<Decoded<ServiceCIDR>>::all(client.clone()), base, Kind::ServiceCidr, |o, _| {
            Object::ServiceCidr(Arc::new(strip::service_cidr(o)))
        }),
    ])
}

/// The kinds whose first list the first sync waits for: Services and
/// EndpointSlices (as upstream's `isInitialized`), and this node's Node
/// (its addresses, pod CIDRs and zone shape the rules). ServiceCIDRs apply
/// when they arrive: a cluster that does not serve them, or a role that
/// does not grant them, must not keep a node unprogrammed.
const FIRST_SYNC_WAITS_FOR: [Kind; 3] = [Kind::Service, Kind::EndpointSlice, Kind::Node];

/// Runs until the receiver is gone: watches and sends what changed. The
/// watcher relists by itself after an expired resource version or a
/// broken watch; each relist is diffed against what was reported. Objects
/// that cannot be decoded are counted in `refusals`.
pub async fn run(client: Client, node_name: String, tx: Sender<Event>, refusals: Refusals) {
    let mut mirrors: Vec<Mirror> =
        [Kind::Service, Kind::EndpointSlice, Kind::Node, Kind::ServiceCidr].into_iter().map(Mirror::new).collect();
    let mut synced = false;
    let mut events = streams(&client, &node_name);
    while let Some((kind, result)) = events.next().await {
        let mirror = mirrors.iter_mut().find(|m| m.kind() == kind).expect("a mirror per kind");
        let out = match result {
            Ok(event) => on_event(mirror, kind, event, &refusals),
            // Not served: none, until the server serves the kind (it is
            // asked again, rarely). Objects once listed are never dropped
            // for an error: a 404 from one server of a mixed-version
            // control plane must not delete them.
            Err(e) if kind == Kind::ServiceCidr && status(&e) == Some(404) => {
                if mirror.listed() {
                    tracing::debug!(kind = %kind, "not served by this API server; keeping what was read: {}", describe(&e));
                    Vec::new()
                } else {
                    tracing::info!(kind = %kind, "the API server does not serve this kind; reading none for now");
                    mirror.not_served()
                }
            }
            Err(e) if status(&e) == Some(403) => {
                tracing::error!(kind = %kind, "forbidden: kpx's ClusterRole must allow list and watch (deploy/kpx.yaml): {}", describe(&e));
                Vec::new()
            }
            Err(e) => {
                tracing::warn!(kind = %kind, "watch failed, retrying: {}", describe(&e));
                Vec::new()
            }
        };
        for event in out {
            if tx.send(event).is_err() {
                return;
            }
        }
        if !synced && FIRST_SYNC_WAITS_FOR.iter().all(|k| mirrors.iter().any(|m| m.kind() == *k && m.listed())) {
            synced = true;
            tracing::info!("the initial lists of Services, EndpointSlices and this Node are complete");
            if !mirrors.iter().any(|m| m.kind() == Kind::Node && m.holds_any()) {
                tracing::warn!(node = %node_name, "no Node object of this name: node addresses, pod CIDRs and zone are unknown (is --hostname-override right?)");
            }
            // The lists' responses and objects are freed in this thread's
            // malloc arena, which the sync thread does not allocate from:
            // given back before the first sync builds its ruleset (at 30k
            // Services x 10, the daemon's peak 425 -> 398 MiB).
            kpx_heap::release_free_memory();
            if tx.send(Event::Synced).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> Node {
        Node { metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() }, ..Default::default() }
    }

    fn names(out: &[(Kind, Result<WatchEvent<Object>, watcher::Error>)]) -> Vec<String> {
        out.iter()
            .map(|(_, e)| match e {
                Ok(WatchEvent::Init) => "init".to_string(),
                Ok(WatchEvent::InitApply(o)) => format!("apply {}", o.object_ref().name),
                Ok(WatchEvent::InitDone) => "done".to_string(),
                Ok(WatchEvent::Apply(o)) => format!("watched {}", o.object_ref().name),
                Ok(WatchEvent::Delete(o)) => format!("deleted {}", o.object_ref().name),
                Err(e) => format!("error {e}"),
            })
            .collect()
    }

    #[test]
    fn a_list_is_handed_on_whole_once_it_is_complete() {
        let wrap: fn(Node, &mut Placements) -> Object = |n, _| Object::Node(Arc::new(n));
        let mut listing = Listing::default();
        let mut on = |e| names(&listing.on(Kind::Node, Ok(e), &wrap));
        assert_eq!(on(WatchEvent::Init), ["init"]);
        assert!(on(WatchEvent::InitApply(node("a"))).is_empty());
        assert!(on(WatchEvent::InitApply(node("b"))).is_empty());
        assert_eq!(on(WatchEvent::InitDone), ["apply a", "apply b", "done"]);
        // Watch events pass straight through.
        assert_eq!(on(WatchEvent::Apply(node("c"))), ["watched c"]);
        assert_eq!(on(WatchEvent::Delete(node("a"))), ["deleted a"]);
        // A list cut short and begun again: only the new list counts.
        assert_eq!(on(WatchEvent::Init), ["init"]);
        assert!(on(WatchEvent::InitApply(node("x"))).is_empty());
        assert_eq!(on(WatchEvent::Init), ["init"]);
        assert!(on(WatchEvent::InitApply(node("y"))).is_empty());
        assert_eq!(on(WatchEvent::InitDone), ["apply y", "done"]);
        assert_eq!(on(WatchEvent::InitDone), ["done"]);
    }

    /// Services read through [`Decoded`] from a JSON list, as a list's
    /// items are.
    fn decoded(items: serde_json::Value) -> Vec<Decoded<wire::WireService>> {
        serde_json::from_str(&items.to_string()).expect("a JSON list")
    }

    fn undecodable(d: &Decoded<wire::WireService>) -> &Undecodable {
        match d {
            Decoded::Undecodable(u) => u,
            Decoded::Read(o) => panic!("decoded: {o:?}"),
        }
    }

    /// An object that cannot be decoded is refused, not its list: the
    /// others read, and the refusal names its kind, namespace/name and the
    /// decode error (its metadata read as far as it can be).
    #[test]
    fn an_object_that_cannot_be_decoded_is_named_and_the_others_read() {
        let read = decoded(serde_json::json!([
            {"metadata": {"name": "web", "namespace": "shop", "resourceVersion": "7"}, "spec": {"ports": "not-a-list"}},
            {"metadata": {"name": "ok", "namespace": "shop"},
             "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}},
            {"metadata": 5, "spec": {}}
        ]));
        assert_eq!(read.len(), 3);
        assert_eq!(kube::Resource::meta(&read[0]).resource_version.as_deref(), Some("7"));
        let (r, message) = refusal(Kind::Service, undecodable(&read[0]));
        assert_eq!(r.map(|r| r.to_string()).as_deref(), Some("Service shop/web"));
        assert!(message.contains("Service shop/web") && message.contains("cannot be decoded"), "{message}");
        assert!(message.contains("invalid type: string \"not-a-list\", expected a sequence"), "{message}");
        assert!(matches!(&read[1], Decoded::Read(_)));
        let (r, message) = refusal(Kind::Service, undecodable(&read[2]));
        assert!(r.is_none());
        assert!(message.contains("a Service whose metadata gives no name"), "{message}");
        assert!(message.contains("invalid type"), "{message}");
        // A watch event whose object comes before its type (read through
        // serde's buffer) reads the same way.
        let line = r#"{"object": {"metadata": {"name": "web", "namespace": "shop", "resourceVersion": "9"},
                       "spec": {"ports": "not-a-list"}}, "type": "MODIFIED"}"#;
        let event: kube::core::WatchEvent<Decoded<wire::WireService>> = serde_json::from_str(line).unwrap();
        let kube::core::WatchEvent::Modified(Decoded::Undecodable(u)) = event else {
            panic!("not a change of an undecodable object")
        };
        assert_eq!((u.metadata.name.as_deref(), u.metadata.resource_version.as_deref()), (Some("web"), Some("9")));
    }

    /// A watched change that cannot be decoded changes nothing, and a
    /// relist that lists the object so keeps its last good version; each is
    /// counted. Its deletion, which names it, deletes it.
    #[test]
    fn an_undecodable_object_keeps_its_last_good_version() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let counted = Arc::new(AtomicUsize::new(0));
        let refusals = {
            let counted = counted.clone();
            Refusals::new(move |kind| {
                assert_eq!(kind, "Service");
                counted.fetch_add(1, Ordering::Relaxed);
            })
        };
        let service = |rv: &str, ports: serde_json::Value| {
            let value = serde_json::json!({"metadata": {"name": "web", "namespace": "shop", "resourceVersion": rv},
                                           "spec": {"clusterIP": "10.96.0.1", "ports": ports}});
            match serde_json::from_value::<Decoded<wire::WireService>>(value).unwrap() {
                Decoded::Read(o) => Read::Object(Object::Service(Arc::new(o.into()))),
                Decoded::Undecodable(u) => Read::Undecodable(u),
            }
        };
        let good = |rv: &str, port: u16| service(rv, serde_json::json!([{"port": port}]));
        let bad = |rv: &str| service(rv, serde_json::json!("not-a-list"));
        let said = |events: Vec<Event>| -> Vec<String> {
            events
                .iter()
                .map(|e| match e {
                    Event::Apply(o) => format!("apply {}", o.object_ref()),
                    Event::Delete(r) => format!("delete {r}"),
                    Event::Synced => "synced".into(),
                })
                .collect()
        };
        let mut mirror = Mirror::new(Kind::Service);
        let mut on = |e| said(on_event(&mut mirror, Kind::Service, e, &refusals));
        assert!(on(WatchEvent::Init).is_empty());
        assert_eq!(on(WatchEvent::InitApply(good("1", 80))), ["apply Service shop/web"]);
        assert!(on(WatchEvent::InitDone).is_empty());
        assert!(on(WatchEvent::Apply(bad("2"))).is_empty());
        assert!(on(WatchEvent::Init).is_empty());
        assert!(on(WatchEvent::InitApply(bad("3"))).is_empty());
        assert!(on(WatchEvent::InitDone).is_empty(), "the last good version stays through the relist");
        assert_eq!(on(WatchEvent::Apply(good("4", 81))), ["apply Service shop/web"]);
        assert_eq!(on(WatchEvent::Delete(bad("5"))), ["delete Service shop/web"]);
        assert_eq!(counted.load(Ordering::Relaxed), 2);
    }

    /// A watch error is said with its causes, each once; kube's empty
    /// Status for a watch event it cannot decode is said as such.
    #[test]
    fn watch_errors_are_said_with_their_causes_once() {
        let empty = watcher::Error::WatchFailed(kube::Error::Api(Box::default()));
        let said = describe(&empty);
        assert!(said.contains("cannot decode") && !said.contains("ApiError"), "{said}");
        let gone = watcher::Error::WatchError(Box::new(kube::core::Status {
            code: 410,
            message: "too old resource version".into(),
            reason: "Expired".into(),
            ..Default::default()
        }));
        let said = describe(&gone);
        assert_eq!(said.matches("too old resource version").count(), 1, "{said}");
        let unreadable = serde_json::from_str::<u8>("x").unwrap_err();
        let said = describe(&watcher::Error::InitialListFailed(kube::Error::SerdeError(unreadable)));
        assert!(said.contains("initial object list") && said.contains("expected value"), "{said}");
    }
}
