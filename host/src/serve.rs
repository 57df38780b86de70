//! kpx's HTTP endpoints, as kube-proxy serves them:
//! - `/healthz` and `/livez` on --healthz-bind-address (0.0.0.0:10256);
//! - `/metrics`, `/proxyMode`, `/configz`, `/flagz`, `/statusz` and
//!   `/healthz` on --metrics-bind-address (127.0.0.1:10249);
//! - a listener per `healthCheckNodePort` of the Services with an
//!   `externalTrafficPolicy: Local`.
//!
//! They run on their own thread; the sync loop feeds them through
//! [`Telemetry`], whose health and metrics are cheap to update.

pub mod health;
pub mod http;
pub mod metrics;
pub mod service_health;
pub mod zpages;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;

use health::{ProxyHealth, Stamp};
use http::{Answer, Asked};
use metrics::{CodeLabel, Metrics};
use service_health::{Bind, Checks};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A listener cannot be opened at start; kpx exits.
    #[error("cannot serve --{flag} on {addr}: {source}")]
    Bind { flag: &'static str, addr: SocketAddr, source: std::io::Error },
    #[error("cannot start the servers' runtime: {0}")]
    Runtime(std::io::Error),
}

/// What the sync loop reports and the servers read.
pub struct Telemetry {
    pub health: ProxyHealth,
    pub metrics: Metrics,
    checks: watch::Sender<Checks>,
    proxy_mode: String,
    configz: String,
    zpages: Zpages,
}

/// `/flagz` and `/statusz`, each while its gate is on.
pub struct Zpages {
    pub pages: zpages::Zpages,
    pub flagz: bool,
    pub statusz: bool,
}

impl Default for Zpages {
    fn default() -> Self {
        Zpages { pages: zpages::Zpages::new(Vec::new(), "", Vec::new()), flagz: false, statusz: false }
    }
}

impl Telemetry {
    /// `/flagz` and `/statusz` served.
    pub fn with_zpages(mut self, zpages: Zpages) -> Telemetry {
        self.zpages = zpages;
        self
    }

    /// userspace mode: serves the relays' refusals.
    pub fn with_relay_refusals(
        mut self,
        family: prometheus_client::metrics::family::Family<
            metrics::ReasonLabel,
            prometheus_client::metrics::counter::Counter,
        >,
    ) -> Telemetry {
        self.metrics.register_relay_refusals(family);
        self
    }

    pub fn new(
        health: ProxyHealth,
        proxy_mode: kpx_rules::model::ProxyMode,
        optional: metrics::Optional,
        configz: String,
    ) -> Telemetry {
        Telemetry {
            health,
            metrics: Metrics::with(proxy_mode, optional),
            checks: watch::channel(Checks::new()).0,
            proxy_mode: proxy_mode.as_str().to_string(),
            configz,
            zpages: Zpages::default(),
        }
    }

    /// The Services' health-check node ports and local endpoints now.
    pub fn set_checks(&self, checks: Checks) {
        self.checks.send_if_modified(|old| {
            let changed = *old != checks;
            *old = checks;
            changed
        });
    }

    /// A health answer, counted as upstream counts them.
    fn counted(&self, healthz: bool, (code, body): (u16, String)) -> Answer {
        let family = if healthz { &self.metrics.healthz } else { &self.metrics.livez };
        family.get_or_create(&CodeLabel { code: code.to_string() }).inc();
        Answer::json(code, body)
    }

    /// The health server's routes.
    pub fn health_answer(&self, asked: &Asked) -> Answer {
        match asked.path {
            "/healthz" => self.counted(true, self.health.healthz(Stamp::now())),
            "/livez" => self.counted(false, self.health.livez(Stamp::now())),
            _ => Answer::not_found(),
        }
    }

    /// The metrics server's routes.
    pub fn metrics_answer(&self, asked: &Asked) -> Answer {
        match asked.path {
            "/metrics" => Answer {
                status: 200,
                content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
                headers: Vec::new(),
                body: self.metrics.encode(),
            },
            "/proxyMode" => Answer::text(200, self.proxy_mode.clone()),
            "/configz" => Answer::json(200, self.configz.clone()),
            "/flagz" if self.zpages.flagz => self.zpages.pages.flagz(asked.accept),
            "/statusz" if self.zpages.statusz => self.zpages.pages.statusz(asked.accept, std::time::SystemTime::now()),
            "/healthz" => Answer::text(200, "ok".into()),
            _ => Answer::not_found(),
        }
    }
}

/// Where to serve (None: disabled).
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub healthz: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
    pub service_health: Bind,
    /// --bind-address-hard-fail: a server that cannot bind ends kpx;
    /// otherwise it is logged and that server is left out.
    pub hard_fail: bool,
}

/// How often a server that could not bind tries again (upstream: 5 s).
const BIND_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

type Route = fn(&Telemetry, &Asked) -> Answer;

/// Serves one endpoint; if its address cannot be bound now, retries every
/// [`BIND_RETRY`], as upstream does when --bind-address-hard-fail is off.
async fn serve_when_bound(
    flag: &'static str,
    addr: SocketAddr,
    first: Option<std::net::TcpListener>,
    telemetry: Arc<Telemetry>,
    route: Route,
    never: watch::Receiver<bool>,
) {
    let mut listener = first;
    while listener.is_none() {
        tokio::time::sleep(BIND_RETRY).await;
        match http::bind(addr) {
            Ok(l) => {
                tracing::info!("serving --{flag} on {addr} now");
                listener = Some(l);
            }
            Err(e) => tracing::error!("cannot serve --{flag} on {addr}, retrying in {BIND_RETRY:?}: {e}"),
        }
    }
    let l = tokio::net::TcpListener::from_std(listener.expect("bound")).expect("a listener inside the runtime");
    http::serve(l, Arc::new(move |a: &Asked| route(&telemetry, a)), never).await;
}

/// Opens the listeners and serves them on a thread of their own for as
/// long as kpx runs. An address that cannot be bound is an error naming
/// its flag with --bind-address-hard-fail; otherwise it is logged and
/// retried.
pub fn start(telemetry: Arc<Telemetry>, endpoints: Endpoints) -> Result<(), Error> {
    let mut servers: Vec<(&'static str, SocketAddr, Option<std::net::TcpListener>, Route)> = Vec::new();
    for (flag, addr, route) in [
        ("healthz-bind-address", endpoints.healthz, Telemetry::health_answer as Route),
        ("metrics-bind-address", endpoints.metrics, Telemetry::metrics_answer as Route),
    ] {
        let Some(addr) = addr else { continue };
        match http::bind(addr) {
            Ok(l) => servers.push((flag, addr, Some(l), route)),
            Err(source) if endpoints.hard_fail => return Err(Error::Bind { flag, addr, source }),
            Err(e) => {
                tracing::error!("cannot serve --{flag} on {addr}, retrying in {BIND_RETRY:?}: {e}");
                servers.push((flag, addr, None, route));
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(Error::Runtime)?;
    let checks = telemetry.checks.subscribe();
    std::thread::Builder::new()
        .name("servers".into())
        .spawn(move || {
            runtime.block_on(async move {
                // Never stopped: the servers live as long as the process.
                let (_keep, never) = watch::channel(false);
                for (flag, addr, listener, route) in servers {
                    tokio::spawn(serve_when_bound(flag, addr, listener, telemetry.clone(), route, never.clone()));
                }
                service_health::run(telemetry, checks, endpoints.service_health).await;
            })
        })
        .map_err(Error::Runtime)?;
    Ok(())
}
