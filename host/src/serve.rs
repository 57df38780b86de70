//! kpx's HTTP endpoints, as kube-proxy serves them:
//! - `/healthz` and `/livez` on --healthz-bind-address (0.0.0.0:10256);
//! - `/metrics`, `/proxyMode`, `/configz` and `/healthz` on
//!   --metrics-bind-address (127.0.0.1:10249);
//! - a listener per `healthCheckNodePort` of the Services with an
//!   `externalTrafficPolicy: Local`.
//!
//! They run on their own thread; the sync loop feeds them through
//! [`Telemetry`], whose health and metrics are cheap to update.

pub mod health;
pub mod http;
pub mod metrics;
pub mod service_health;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;

use health::{ProxyHealth, Stamp};
use http::Answer;
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
}

impl Telemetry {
    pub fn new(health: ProxyHealth, proxy_mode: &str, configz: String) -> Telemetry {
        Telemetry {
            health,
            metrics: Metrics::new(),
            checks: watch::channel(Checks::new()).0,
            proxy_mode: proxy_mode.to_string(),
            configz,
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

    fn counted(&self, which: &Metrics, healthz: bool, (code, body): (u16, String)) -> Answer {
        let family = if healthz { &which.healthz } else { &which.livez };
        family.get_or_create(&CodeLabel { code: code.to_string() }).inc();
        Answer::json(code, body)
    }

    /// The health server's routes.
    pub fn health_answer(&self, path: &str) -> Answer {
        match path {
            "/healthz" => self.counted(&self.metrics, true, self.health.healthz(Stamp::now())),
            "/livez" => self.counted(&self.metrics, false, self.health.livez(Stamp::now())),
            _ => Answer::not_found(),
        }
    }

    /// The metrics server's routes.
    pub fn metrics_answer(&self, path: &str) -> Answer {
        match path {
            "/metrics" => Answer {
                status: 200,
                content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
                headers: Vec::new(),
                body: self.metrics.encode(),
            },
            "/proxyMode" => Answer::text(200, self.proxy_mode.clone()),
            "/configz" => Answer::json(200, self.configz.clone()),
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

fn listen(flag: &'static str, addr: SocketAddr) -> Result<std::net::TcpListener, Error> {
    let l = std::net::TcpListener::bind(addr).map_err(|source| Error::Bind { flag, addr, source })?;
    l.set_nonblocking(true).map_err(|source| Error::Bind { flag, addr, source })?;
    Ok(l)
}

/// Opens the listeners (an address in use is an error naming its flag)
/// and serves them on a thread of their own for as long as kpx runs.
pub fn start(telemetry: Arc<Telemetry>, endpoints: Endpoints) -> Result<(), Error> {
    let open = |flag: &'static str, addr: Option<SocketAddr>| -> Result<Option<std::net::TcpListener>, Error> {
        match addr.map(|a| listen(flag, a)).transpose() {
            Err(e) if !endpoints.hard_fail => {
                tracing::error!("{e} (serving without it; --bind-address-hard-fail makes this fatal)");
                Ok(None)
            }
            other => other,
        }
    };
    let healthz = open("healthz-bind-address", endpoints.healthz)?;
    let metrics = open("metrics-bind-address", endpoints.metrics)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(Error::Runtime)?;
    let checks = telemetry.checks.subscribe();
    std::thread::Builder::new()
        .name("servers".into())
        .spawn(move || {
            runtime.block_on(async move {
                // Never stopped: the servers live as long as the process.
                let (_keep, never) = watch::channel(false);
                for (listener, route) in [
                    (healthz, Telemetry::health_answer as fn(&Telemetry, &str) -> Answer),
                    (metrics, Telemetry::metrics_answer),
                ] {
                    let Some(l) = listener else { continue };
                    let l = tokio::net::TcpListener::from_std(l).expect("a listener inside the runtime");
                    let t = telemetry.clone();
                    tokio::spawn(http::serve(l, Arc::new(move |p: &str| route(&t, p)), never.clone()));
                }
                service_health::run(telemetry, checks, endpoints.service_health).await;
            })
        })
        .map_err(Error::Runtime)?;
    Ok(())
}
