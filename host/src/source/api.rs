//! The Kubernetes API source: list and watch of Services, EndpointSlices,
//! this node's Node and ServiceCIDRs (kube-runtime's watcher), turned into
//! the same [`Event`]s the manifest source sends.
//!
//! - Services and EndpointSlices use upstream's label selector: not
//!   headless, no `service.kubernetes.io/service-proxy-name`.
//! - `Synced` is sent once every kind's first list is complete; until then
//!   nothing is programmed.
//! - A relist (after a dropped watch, a 410 Gone, a server restart, or the
//!   periodic refresh of `--config-sync-period`) is diffed against what was
//!   reported: changed objects are applied, vanished ones deleted, and
//!   nothing else is touched, so programmed rules are never flushed.
//! - Fields the proxy does not read are dropped on arrival.

mod mirror;
mod rate;
mod strip;

use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::runtime::{WatchStreamExt, watcher as watch};
use kube::{Api, Client};

pub use mirror::Mirror;

use super::{Event, Kind, Object};
use crate::config::ApiConfig;

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
type Item = (Kind, Result<WatchEvent<Object>, watcher::Error>);

fn watch_kind<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: Kind,
    wrap: fn(K) -> Object,
) -> futures::stream::BoxStream<'static, Item>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    watch::watcher(api, config)
        .default_backoff()
        .map(move |r| (kind, r.map(|e| convert(e, wrap))))
        // A kind the server does not serve (ServiceCIDR before Kubernetes
        // 1.33) ends its stream after reporting it once.
        .scan(false, |ended, item| {
            if *ended {
                return futures::future::ready(None);
            }
            *ended = matches!(&item.1, Err(e) if not_served(e));
            futures::future::ready(Some(item))
        })
        .boxed()
}

fn convert<K>(e: WatchEvent<K>, wrap: fn(K) -> Object) -> WatchEvent<Object> {
    match e {
        WatchEvent::Apply(o) => WatchEvent::Apply(wrap(o)),
        WatchEvent::Delete(o) => WatchEvent::Delete(wrap(o)),
        WatchEvent::Init => WatchEvent::Init,
        WatchEvent::InitApply(o) => WatchEvent::InitApply(wrap(o)),
        WatchEvent::InitDone => WatchEvent::InitDone,
    }
}

fn not_served(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::InitialListFailed(kube::Error::Api(s)) if s.code == 404)
}

/// The four watches, from their first list.
fn streams(client: &Client, node_name: &str) -> futures::stream::SelectAll<futures::stream::BoxStream<'static, Item>> {
    let services = watcher::Config::default().labels(SERVICE_SELECTOR);
    let node = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
    futures::stream::select_all([
        watch_kind(Api::<Service>::all(client.clone()), services.clone(), Kind::Service, |o| {
            Object::Service(Arc::new(strip::service(o)))
        }),
        watch_kind(Api::<EndpointSlice>::all(client.clone()), services, Kind::EndpointSlice, |o| {
            Object::EndpointSlice(Arc::new(strip::endpoint_slice(o)))
        }),
        watch_kind(Api::<Node>::all(client.clone()), node, Kind::Node, |o| Object::Node(Arc::new(strip::node(o)))),
        watch_kind(Api::<ServiceCIDR>::all(client.clone()), watcher::Config::default(), Kind::ServiceCidr, |o| {
            Object::ServiceCidr(Arc::new(strip::service_cidr(o)))
        }),
    ])
}

/// Runs until the receiver is gone: watches, relists every `resync`, and
/// sends what changed.
pub async fn run(client: Client, node_name: String, resync: Duration, tx: Sender<Event>) {
    let mut mirrors: Vec<Mirror> =
        [Kind::Service, Kind::EndpointSlice, Kind::Node, Kind::ServiceCidr].into_iter().map(Mirror::new).collect();
    let mut synced = false;
    loop {
        let mut events = streams(&client, &node_name);
        let refresh = tokio::time::sleep(resync);
        tokio::pin!(refresh);
        loop {
            let (kind, result) = tokio::select! {
                item = events.next() => match item {
                    Some(item) => item,
                    // Every stream ended (only the ServiceCIDR one can): wait for the refresh.
                    None => { (&mut refresh).await; break; }
                },
                _ = &mut refresh => break,
            };
            let mirror = mirrors.iter_mut().find(|m| m.kind() == kind).expect("a mirror per kind");
            let out = match result {
                Ok(event) => mirror.on(event),
                Err(e) if not_served(&e) => {
                    tracing::info!(kind = %kind, "the API server does not serve this kind; reading none");
                    mirror.not_served()
                }
                Err(e) => {
                    tracing::warn!(kind = %kind, "watch failed, retrying: {e}");
                    Vec::new()
                }
            };
            for event in out {
                if tx.send(event).is_err() {
                    return;
                }
            }
            if !synced && mirrors.iter().all(Mirror::listed) {
                synced = true;
                tracing::info!("every initial list is complete");
                if tx.send(Event::Synced).is_err() {
                    return;
                }
            }
        }
        tracing::debug!("refreshing every kind from the API server (--config-sync-period)");
    }
}
