//! A test-only extension component. Its parameter `do=` picks what it
//! returns, so that tests and the conformance kit can show the host's
//! answer to each:
//! - `count` (the default): a counter `seen` on every port, before dispatch;
//! - `unknown-service`: a rule for a service port the state does not have;
//! - `reject-at-dispatch`: reject before kube-proxy's choice;
//! - `bad-counter`: a counter name with upper case and a space;
//! - `wrong-family`: an IPv6 source in an IPv4 instance (and back);
//! - `too-many`: 300,000 rules (more than the host takes at all);
//! - `error`: render fails with a message;
//! - `panic`: render panics (a trap);
//! - `spin`: render never returns (fuel ends it);
//! - `drop-all`: drops every new connection to every port (valid: a
//!   Service's traffic only, by construction);
//! - `reject-all`: rejects every new connection to every port, after
//!   kube-proxy's choice (valid);
//! - `reject-documentation`: rejects, with a counter, the connections to
//!   every port from the documentation prefix of its family (192.0.2.0/24,
//!   2001:db8::/32), which no test client has (valid).
//!
//! Whatever `do=` says, render fails while the state holds a Service
//! named `fail-now` (a failure the tests can start and end).
#![forbid(unsafe_code)]

use kpx_sdk::extension::{Action, Attachment, Extension, Rule, SourceMatch, State};
use kpx_sdk::{Cidr, IpFamily, Settings};

struct Probe {
    what: String,
    family: IpFamily,
}

fn rule(service: &str) -> Rule {
    Rule {
        attachment: Attachment::BeforeDispatch,
        service: service.to_string(),
        source: None,
        over_rate: None,
        counter: Some("seen".into()),
        action: Action::Continue,
    }
}

impl Extension for Probe {
    fn new(settings: Settings, parameters: Vec<(String, String)>) -> Self {
        let what = parameters.iter().find(|(k, _)| k == "do").map_or("count", |(_, v)| v.as_str()).to_string();
        Probe { what, family: settings.family }
    }

    fn rules(&mut self, state: &State) -> Result<Vec<Rule>, String> {
        if state.ports.values().any(|p| p.name == "fail-now") {
            return Err("a Service named fail-now asks me to fail".into());
        }
        let keys: Vec<&String> = state.ports.keys().collect();
        let first = keys.first().map_or("none/none", |k| k.as_str()).to_string();
        Ok(match self.what.as_str() {
            "count" => keys.iter().map(|k| rule(k)).collect(),
            "drop-all" => keys.iter().map(|k| Rule { action: Action::Drop, counter: None, ..rule(k) }).collect(),
            "reject-all" => keys
                .iter()
                .map(|k| Rule { action: Action::Reject, attachment: Attachment::Service, counter: None, ..rule(k) })
                .collect(),
            "reject-documentation" => {
                let cidr = match self.family {
                    IpFamily::V4 => Cidr { addr: "192.0.2.0".parse().unwrap(), prefix_len: 24 },
                    IpFamily::V6 => Cidr { addr: "2001:db8::".parse().unwrap(), prefix_len: 32 },
                };
                let source = Some(SourceMatch { negate: false, cidr });
                keys.iter()
                    .map(|k| Rule {
                        action: Action::Reject,
                        attachment: Attachment::Service,
                        source,
                        counter: Some("rejected".into()),
                        ..rule(k)
                    })
                    .collect()
            }
            "unknown-service" => vec![rule("nope/nope:none")],
            "reject-at-dispatch" => vec![Rule { action: Action::Reject, ..rule(&first) }],
            "bad-counter" => vec![Rule { counter: Some("Bad Name".into()), ..rule(&first) }],
            "wrong-family" => {
                let addr = match self.family {
                    IpFamily::V4 => "2001:db8::".parse().unwrap(),
                    IpFamily::V6 => "192.0.2.0".parse().unwrap(),
                };
                let source = SourceMatch { negate: false, cidr: Cidr { addr, prefix_len: 24 } };
                vec![Rule { source: Some(source), ..rule(&first) }]
            }
            "too-many" => (0..300_000).map(|_| rule(&first)).collect(),
            "error" => return Err("asked to fail".into()),
            "panic" => panic!("asked to panic"),
            "spin" => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            other => return Err(format!("unknown do={other}")),
        })
    }
}

kpx_sdk::export_extension!(Probe);
