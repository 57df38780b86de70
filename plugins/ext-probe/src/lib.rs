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
//!   2001:db8::/32), which no test client has, but for its upper half
//!   (192.0.2.128/25, 2001:db8:8000::/33), accepted first and counted
//!   (valid);
//! - `accept-from`: accepts, counted as `accepted`, the new connections to
//!   every port from the parameter `from=CIDR` before kube-proxy's choice,
//!   then drops every other, counted as `dropped` (valid: the accepted
//!   ones go on through kube-proxy's rules; a `from` of the other family
//!   accepts no one in this one).
//!
//! It refuses, when kpx loads it, a `do=` it does not know and a `from=`
//! that is not a CIDR (or missing with `do=accept-from`), naming them.
//! Whatever `do=` says, render fails while the state holds a Service
//! named `fail-now` (a failure the tests can start and end).
#![forbid(unsafe_code)]

use kpx_sdk::extension::{Action, Attachment, Extension, Rule, SourceMatch, State};
use kpx_sdk::{Cidr, IpFamily, Settings};

/// Every `do=`.
const BEHAVIOURS: &[&str] = &[
    "count",
    "unknown-service",
    "reject-at-dispatch",
    "bad-counter",
    "wrong-family",
    "too-many",
    "error",
    "panic",
    "spin",
    "drop-all",
    "reject-all",
    "reject-documentation",
    "accept-from",
];

struct Probe {
    what: String,
    family: IpFamily,
    /// `from=`: the sources `accept-from` accepts.
    from: Option<Cidr>,
}

fn parameter<'a>(parameters: &'a [(String, String)], key: &str) -> Option<&'a str> {
    parameters.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// `from=`, when given: a CIDR.
fn from(parameters: &[(String, String)]) -> Result<Option<Cidr>, String> {
    parameter(parameters, "from")
        .map(|text| text.parse::<Cidr>().map_err(|_| format!("from={text}: not a CIDR")))
        .transpose()
}

/// A source match for `cidr`.
fn only(cidr: Cidr) -> Option<SourceMatch> {
    Some(SourceMatch { negate: false, cidr })
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
    fn check_parameters(parameters: &[(String, String)]) -> Result<(), String> {
        let what = parameter(parameters, "do").unwrap_or("count");
        // A check that traps, as `parse().unwrap()` on a bad value would.
        assert!(what != "trap-in-check", "do=trap-in-check: trapping as asked");
        if !BEHAVIOURS.contains(&what) {
            return Err(format!("do={what}: not one of {}", BEHAVIOURS.join(", ")));
        }
        if from(parameters)?.is_none() && what == "accept-from" {
            return Err("do=accept-from needs from=CIDR".into());
        }
        Ok(())
    }

    fn new(settings: Settings, parameters: Vec<(String, String)>) -> Self {
        let what = parameter(&parameters, "do").unwrap_or("count").to_string();
        // Checked at load: a bad one is not here.
        let from = from(&parameters).ok().flatten();
        Probe { what, family: settings.family, from }
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
                let (upper, all) = match self.family {
                    IpFamily::V4 => ("192.0.2.128/25", "192.0.2.0/24"),
                    IpFamily::V6 => ("2001:db8:8000::/33", "2001:db8::/32"),
                };
                let (upper, all): (Cidr, Cidr) = (upper.parse().unwrap(), all.parse().unwrap());
                let at_service = |k: &str, source, counter: &str, action| Rule {
                    action,
                    attachment: Attachment::Service,
                    source,
                    counter: Some(counter.into()),
                    ..rule(k)
                };
                keys.iter()
                    .flat_map(|k| {
                        [
                            at_service(k, only(upper), "accepted", Action::Accept),
                            at_service(k, only(all), "rejected", Action::Reject),
                        ]
                    })
                    .collect()
            }
            "accept-from" => {
                let from = self.from.filter(|c| c.family() == self.family);
                keys.iter()
                    .flat_map(|k| {
                        let accept = from.map(|c| Rule {
                            source: only(c),
                            counter: Some("accepted".into()),
                            action: Action::Accept,
                            ..rule(k)
                        });
                        let drop = Rule { counter: Some("dropped".into()), action: Action::Drop, ..rule(k) };
                        accept.into_iter().chain([drop])
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
