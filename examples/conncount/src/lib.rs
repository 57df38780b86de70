//! An example kpx extension: per-Service connection counters on /metrics.
//!
//! For every Service port it counts the new connections kube-proxy sent
//! to an endpoint (`accepted`: the `service` attachment, after DNAT), and,
//! for ports with load-balancer IPs, the new connections that arrived at
//! them (`load_balancer`: the `firewall` attachment). The host exports
//! them as `kpx_extension_counter_total{extension, service, counter}`.
//!
//! A Service opts out with `ext.kpx.dev/<name>.count: "false"`; with the
//! parameter `only-annotated=true`, only Services with
//! `ext.kpx.dev/<name>.count: "true"` are counted.
#![forbid(unsafe_code)]

use kpx_sdk::Settings;
use kpx_sdk::extension::{Action, Attachment, Extension, Rule, State};

pub struct ConnCount {
    only_annotated: bool,
    problem: Option<String>,
}

impl Extension for ConnCount {
    fn new(_: Settings, parameters: Vec<(String, String)>) -> Self {
        let mut out = ConnCount { only_annotated: false, problem: None };
        for (k, v) in parameters {
            match (k.as_str(), v.as_str()) {
                ("only-annotated", "true") => out.only_annotated = true,
                ("only-annotated", "false") => out.only_annotated = false,
                _ => out.problem = Some(format!("unknown parameter {k}={v} (only-annotated=true|false)")),
            }
        }
        out
    }

    fn rules(&mut self, state: &State) -> Result<Vec<Rule>, String> {
        if let Some(p) = &self.problem {
            return Err(p.clone());
        }
        let count = |attachment, service: &str, counter: &str| Rule {
            attachment,
            service: service.to_string(),
            source: None,
            over_rate: None,
            counter: Some(counter.to_string()),
            action: Action::Continue,
        };
        let mut rules = Vec::new();
        for port in state.ports.values() {
            let wanted = match State::annotation(port, "count") {
                Some("true") => true,
                Some("false") => false,
                _ => !self.only_annotated,
            };
            if !wanted {
                continue;
            }
            rules.push(count(Attachment::Service, &port.key, "accepted"));
            if !port.load_balancer_ips.is_empty() {
                rules.push(count(Attachment::Firewall, &port.key, "load_balancer"));
            }
        }
        Ok(rules)
    }
}

#[cfg(target_family = "wasm")]
kpx_sdk::export_extension!(ConnCount);

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_sdk::{Protocol, ServicePort};

    fn state(ports: Vec<ServicePort>) -> State {
        State { ports: ports.into_iter().map(|p| (p.key.clone(), p)).collect(), ..Default::default() }
    }

    #[test]
    fn every_port_counts_and_annotations_opt_out() {
        let a = ServicePort::new("ns", "a", "", Protocol::Tcp, 80);
        let mut b = ServicePort::new("ns", "b", "", Protocol::Tcp, 80);
        b.annotations = vec![("count".into(), "false".into())];
        let mut c = ServicePort::new("ns", "c", "", Protocol::Udp, 53);
        c.load_balancer_ips = vec!["192.0.2.1".parse().unwrap()];
        let rules = ConnCount::new(Settings::new(kpx_sdk::IpFamily::V4, kpx_sdk::ProxyMode::Nftables), vec![])
            .rules(&state(vec![a, b, c]))
            .unwrap();
        let got: Vec<_> = rules.iter().map(|r| (r.service.as_str(), r.counter.as_deref().unwrap())).collect();
        assert_eq!(got, [("ns/a", "accepted"), ("ns/c", "accepted"), ("ns/c", "load_balancer")]);
        assert!(rules.iter().all(|r| r.action == Action::Continue));
    }

    #[test]
    fn only_annotated_counts_only_those() {
        let a = ServicePort::new("ns", "a", "", Protocol::Tcp, 80);
        let mut b = ServicePort::new("ns", "b", "", Protocol::Tcp, 80);
        b.annotations = vec![("count".into(), "true".into())];
        let mut e = ConnCount::new(
            Settings::new(kpx_sdk::IpFamily::V4, kpx_sdk::ProxyMode::Nftables),
            vec![("only-annotated".into(), "true".into())],
        );
        let rules = e.rules(&state(vec![a, b])).unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].service, "ns/b");
    }
}
