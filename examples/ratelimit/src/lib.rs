//! An example kpx extension: a per-Service limit on new connections.
//!
//! Annotate a Service with
//! `ext.kpx.dev/<name>.new-connections-per-second: "N"` (and optionally
//! `ext.kpx.dev/<name>.burst: "B"`, default N), where `<name>` is the name
//! the operator gave the extension (`--extension ratelimit=FILE.wasm`).
//! New connections to every port of that Service beyond N a second (in
//! bursts of up to B) are dropped before kube-proxy picks an endpoint,
//! and counted: `kpx_extension_counter_total{counter="dropped"}`.
//!
//! Parameters (`--extension ratelimit=FILE.wasm,key=value`):
//! - `default=N`: the limit of Services without the annotation (none by default);
//! - `action=drop|reject`: reject (a TCP reset; ICMP port unreachable
//!   for UDP and SCTP) needs the
//!   `service` attachment, after kube-proxy's choice: the example then
//!   limits there.
//!
//! Any other parameter, or a wrong value, stops kpx when it loads the
//! extension (`check_parameters`), naming it.
#![forbid(unsafe_code)]

use kpx_sdk::extension::{Action, Attachment, Extension, Rate, Rule, State};
use kpx_sdk::{ServicePort, Settings};

pub const RATE_KEY: &str = "new-connections-per-second";
pub const BURST_KEY: &str = "burst";

pub struct RateLimit {
    default: Option<u32>,
    action: Action,
    /// The parameters' problem, reported at every render.
    problem: Option<String>,
}

fn number(text: &str, what: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(n) if (1..=Rate::MAX).contains(&n) => Ok(n),
        _ => Err(format!("{what} {text:?} is not a number from 1 to {}", Rate::MAX)),
    }
}

impl RateLimit {
    /// The limit a port's annotations ask for (None: unlimited).
    pub fn rate_of(&self, port: &ServicePort) -> Result<Option<Rate>, String> {
        let Some(rate) = State::annotation(port, RATE_KEY).map(|r| number(r, RATE_KEY)).transpose()? else {
            return Ok(self.default.map(|d| Rate { per_second: d, burst: d }));
        };
        let burst = State::annotation(port, BURST_KEY).map(|b| number(b, BURST_KEY)).transpose()?.unwrap_or(rate);
        Ok(Some(Rate { per_second: rate, burst }))
    }
}

/// The parameters' default limit and action, or the first one that is wrong.
fn parameters(parameters: &[(String, String)]) -> Result<(Option<u32>, Action), String> {
    let (mut default, mut action) = (None, Action::Drop);
    for (k, v) in parameters {
        match (k.as_str(), v.as_str()) {
            ("default", n) => default = Some(number(n, "default")?),
            ("action", "drop") => action = Action::Drop,
            ("action", "reject") => action = Action::Reject,
            _ => return Err(format!("unknown parameter {k}={v} (default=N, action=drop|reject)")),
        }
    }
    Ok((default, action))
}

impl Extension for RateLimit {
    /// A wrong parameter stops kpx at load, named.
    fn check_parameters(p: &[(String, String)]) -> Result<(), String> {
        parameters(p).map(|_| ())
    }

    fn new(_: Settings, p: Vec<(String, String)>) -> Self {
        match parameters(&p) {
            Ok((default, action)) => RateLimit { default, action, problem: None },
            // Only where kpx did not ask first (a 0.2.0 build).
            Err(e) => RateLimit { default: None, action: Action::Drop, problem: Some(e) },
        }
    }

    fn rules(&mut self, state: &State) -> Result<Vec<Rule>, String> {
        if let Some(p) = &self.problem {
            return Err(p.clone());
        }
        let attachment = if self.action == Action::Reject { Attachment::Service } else { Attachment::BeforeDispatch };
        let mut rules = Vec::new();
        for port in state.ports.values() {
            // A bad annotation is that Service's problem, not everyone's:
            // logged, and the Service is left unlimited.
            let rate = match self.rate_of(port) {
                Ok(r) => r,
                Err(e) => {
                    kpx_sdk::log::warn(&format!("{}: {e}; not limited", port.key));
                    None
                }
            };
            if let Some(rate) = rate {
                rules.push(Rule {
                    attachment,
                    service: port.key.clone(),
                    source: None,
                    over_rate: Some(rate),
                    counter: Some("dropped".into()),
                    action: self.action,
                });
            }
        }
        Ok(rules)
    }
}

#[cfg(target_family = "wasm")]
kpx_sdk::export_extension!(RateLimit);

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_sdk::Protocol;

    fn port(annotations: &[(&str, &str)]) -> ServicePort {
        let mut p = ServicePort::new("ns", "web", "", Protocol::Tcp, 80);
        p.annotations = annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        p
    }

    fn state(ports: Vec<ServicePort>) -> State {
        State { ports: ports.into_iter().map(|p| (p.key.clone(), p)).collect(), ..Default::default() }
    }

    #[test]
    fn an_annotated_service_is_limited_and_counted() {
        let mut e = RateLimit::new(Settings::new(kpx_sdk::IpFamily::V4, kpx_sdk::ProxyMode::Nftables), vec![]);
        let rules = e.rules(&state(vec![port(&[(RATE_KEY, "5"), (BURST_KEY, "10")])])).unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].over_rate, Some(Rate { per_second: 5, burst: 10 }));
        assert_eq!(rules[0].action, Action::Drop);
        assert_eq!(rules[0].attachment, Attachment::BeforeDispatch);
        assert_eq!(rules[0].counter.as_deref(), Some("dropped"));
    }

    #[test]
    fn unannotated_services_follow_the_default_and_bad_values_are_skipped() {
        let mut e = RateLimit::new(Settings::new(kpx_sdk::IpFamily::V4, kpx_sdk::ProxyMode::Nftables), vec![]);
        assert!(e.rules(&state(vec![port(&[]), port(&[(RATE_KEY, "lots")])])).unwrap().is_empty());
        let mut e = RateLimit::new(
            Settings::new(kpx_sdk::IpFamily::V4, kpx_sdk::ProxyMode::Nftables),
            vec![("default".into(), "7".into())],
        );
        let rules = e.rules(&state(vec![port(&[])])).unwrap();
        assert_eq!(rules[0].over_rate, Some(Rate { per_second: 7, burst: 7 }));
    }

    #[test]
    fn reject_limits_after_the_choice_and_bad_parameters_are_errors() {
        let mut e = RateLimit::new(
            Settings::new(kpx_sdk::IpFamily::V4, kpx_sdk::ProxyMode::Nftables),
            vec![("action".into(), "reject".into())],
        );
        let rules = e.rules(&state(vec![port(&[(RATE_KEY, "5")])])).unwrap();
        assert_eq!((rules[0].attachment, rules[0].action), (Attachment::Service, Action::Reject));
        let mut e = RateLimit::new(
            Settings::new(kpx_sdk::IpFamily::V4, kpx_sdk::ProxyMode::Nftables),
            vec![("colour".into(), "red".into())],
        );
        assert!(e.rules(&state(vec![])).unwrap_err().contains("colour"));
        // And kpx refuses them at load, before any instance.
        assert!(RateLimit::check_parameters(&[("colour".into(), "red".into())]).unwrap_err().contains("colour=red"));
        assert!(RateLimit::check_parameters(&[("default".into(), "0".into())]).unwrap_err().contains("default"));
        assert!(RateLimit::check_parameters(&[("action".into(), "reject".into())]).is_ok());
    }
}
