//! `allow`: an allow-list of sources per Service, as a kpx extension
//! written against kpx-sdk alone.
//!
//! A Service annotated
//!
//! ```yaml
//! metadata:
//!   annotations:
//!     ext.kpx.dev/allow.allow: "10.1.0.0/16, 192.0.2.7, 2001:db8::/32"
//! ```
//!
//! (`ext.kpx.dev/<name>.allow`, where `<name>` is the name the operator
//! gives the extension: `--extension allow=FILE.wasm`) is reached only
//! from those sources, on every one of its ports; new connections from
//! any other source are dropped before kube-proxy picks an endpoint, and
//! counted as `denied`. Services without the annotation get no rules.
//!
//! The rules of a guarded port are an accept rule for each listed prefix
//! of the instance's family, then one rule for every other source: an
//! accept ends this extension's rules for the connection, which goes on
//! through kube-proxy's as if the extension had none, so the last rule
//! sees only the sources not listed. Each instance serves one IP family
//! and takes that family's entries; the other family's instance takes the
//! others (an IPv4-mapped IPv6 entry is the IPv4 one).
//!
//! The parameter `action=drop|reject` (`--extension
//! allow=FILE.wasm,action=reject`) says what happens to the others:
//! dropped before kube-proxy picks an endpoint (`drop`, the default), or
//! refused after it did (`reject`: a TCP reset, at once; kpx rejects only
//! after its choice). Any other parameter stops kpx when it loads the
//! extension, named.
//!
//! A list this extension cannot apply as written (an entry that is not
//! an address or a CIDR, a CIDR with host bits set, or more rules than
//! kpx takes for a port) closes the Service's ports: every new connection
//! is denied and counted as `denied_unusable_list`, and the reason is
//! logged. See README.md for why it fails closed.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::net::IpAddr;

use kpx_sdk::extension::{Action, Attachment, Extension, Rule, SourceMatch, State};
use kpx_sdk::{Cidr, IpFamily, ServicePort, Settings};

/// The annotation's key. The host hands an extension the Service's
/// `ext.kpx.dev/<name>.*` annotations with that prefix removed (as
/// examples/ratelimit reads `new-connections-per-second`).
pub const ALLOW_KEY: &str = "allow";
/// Counts the new connections denied because their source is not listed.
pub const DENIED: &str = "denied";
/// Counts the new connections denied because the Service's list cannot
/// be applied as written.
pub const DENIED_UNUSABLE: &str = "denied_unusable_list";
/// kpx's limit of rules for one service port at one attachment
/// (`MAX_RULES_PER_PORT`, docs/plugins.md, "Extension rules"): kpx leaves
/// out, and so opens, a port with more. The SDK does not export it.
pub const MAX_RULES_PER_PORT: usize = 64;

/// What a port's annotation asks of this instance's family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No annotation, or one that lists the whole family: no rules.
    Open,
    /// Only these prefixes (none: no source of the family) reach the port.
    AllowOnly(Vec<Cidr>),
    /// The list cannot be applied as written (why): deny every source.
    Unusable(String),
}

pub struct Allowlist {
    family: IpFamily,
    /// What happens to the sources not listed.
    deny: Action,
    /// The parameters' problem, reported at every render (kpx asks
    /// [`Extension::check_parameters`] first: only a 0.2.0 build sees it).
    problem: Option<String>,
    /// The problems logged, by Service (`namespace/name`): each is logged
    /// when it appears or changes, not at every render.
    reported: BTreeMap<String, String>,
}

/// The prefixes an allow-list names, of both families: entries separated
/// by commas, each trimmed, empty ones skipped; an address is its host
/// prefix (/32 or /128). The first entry that is not an address or a CIDR
/// with its host bits clear makes the whole list unusable.
pub fn parse_list(list: &str) -> Result<Vec<Cidr>, String> {
    list.split(',').map(str::trim).filter(|e| !e.is_empty()).map(parse_entry).collect()
}

fn parse_entry(entry: &str) -> Result<Cidr, String> {
    let bad = || format!("{entry:?} is not an IP address or a CIDR");
    let cidr = if entry.contains('/') {
        entry.parse::<Cidr>().map_err(|_| bad())?
    } else {
        Cidr::host(entry.parse::<IpAddr>().map_err(|_| bad())?)
    };
    let cidr = unmapped(cidr);
    // 10.1.2.3/16 is most likely a typo for 10.1.2.3/32 or 10.1.0.0/16:
    // reading it as the /16 would allow 65,536 sources nobody listed.
    if cidr.addr != cidr.network() {
        let network = Cidr { addr: cidr.network(), prefix_len: cidr.prefix_len };
        return Err(format!(
            "{entry:?} has host bits set (the network is {network}; one address is {}/{})",
            cidr.addr,
            cidr.max_len()
        ));
    }
    Ok(cidr)
}

/// An IPv4-mapped IPv6 prefix (`::ffff:a.b.c.d/N`, N >= 96) as the IPv4
/// prefix it holds: IPv4 connections reach the IPv4 instance with IPv4
/// sources, so the IPv6 form would match nothing.
fn unmapped(cidr: Cidr) -> Cidr {
    match cidr.addr {
        IpAddr::V6(v6) if cidr.prefix_len >= 96 => match v6.to_ipv4_mapped() {
            Some(v4) => Cidr { addr: IpAddr::V4(v4), prefix_len: cidr.prefix_len - 96 },
            None => cidr,
        },
        _ => cidr,
    }
}

/// What the parameters say happens to the sources not listed: `action`,
/// `drop` (the default) or `reject`; anything else is refused, named.
pub fn deny_action(parameters: &[(String, String)]) -> Result<Action, String> {
    let mut action = Action::Drop;
    for (key, value) in parameters {
        action = match (key.as_str(), value.as_str()) {
            ("action", "drop") => Action::Drop,
            ("action", "reject") => Action::Reject,
            ("action", _) => return Err(format!("action={value}: the action is drop or reject")),
            _ => return Err(format!("unknown parameter {key}={value} (the extension takes action=drop|reject)")),
        };
    }
    Ok(action)
}

impl Allowlist {
    /// What `port`'s annotation asks of this instance's family.
    pub fn verdict(&self, port: &ServicePort) -> Verdict {
        let Some(list) = State::annotation(port, ALLOW_KEY) else { return Verdict::Open };
        let allowed = match parse_list(list) {
            Ok(allowed) => allowed,
            Err(why) => return Verdict::Unusable(why),
        };
        // The other family's entries are left out here: that family's
        // instance applies them.
        let mine: Vec<Cidr> = allowed.into_iter().filter(|c| c.family() == self.family).collect();
        if mine.iter().any(|c| c.prefix_len == 0) {
            return Verdict::Open;
        }
        // An accept rule for each, and the rule for the rest.
        if mine.len() >= MAX_RULES_PER_PORT {
            return Verdict::Unusable(format!(
                "its {} {} entries take {} rules, past kpx's {MAX_RULES_PER_PORT} per port (list fewer, wider ones)",
                mine.len(),
                self.family,
                mine.len() + 1
            ));
        }
        Verdict::AllowOnly(mine)
    }

    /// Where the rules go: a reject only after kube-proxy's choice (the
    /// kernel rejects only there), a drop before it.
    fn attachment(&self) -> Attachment {
        if self.deny == Action::Reject { Attachment::Service } else { Attachment::BeforeDispatch }
    }

    /// `service`'s rule for the sources of `cidr` (None: every source).
    fn rule(&self, service: &str, cidr: Option<Cidr>, counter: Option<&str>, action: Action) -> Rule {
        Rule {
            attachment: self.attachment(),
            service: service.to_string(),
            source: cidr.map(|cidr| SourceMatch { negate: false, cidr }),
            over_rate: None,
            counter: counter.map(str::to_string),
            action,
        }
    }

    /// Logs each Service's problem once, when it appears or changes:
    /// `rules` runs at every change of the state.
    fn report(&mut self, problems: BTreeMap<String, String>) {
        for (service, why) in &problems {
            if self.reported.get(service) != Some(why) {
                kpx_sdk::log::error(&format!(
                    "{service}: annotation {ALLOW_KEY}: {why}; every new {} connection to the Service is denied \
                     (counter {DENIED_UNUSABLE}) until the list is fixed",
                    self.family
                ));
            }
        }
        self.reported = problems;
    }
}

impl Extension for Allowlist {
    /// `action=drop|reject`, nothing else: kpx stops at load naming a
    /// wrong one.
    fn check_parameters(parameters: &[(String, String)]) -> Result<(), String> {
        deny_action(parameters).map(|_| ())
    }

    fn new(settings: Settings, parameters: Vec<(String, String)>) -> Self {
        let (deny, problem) = match deny_action(&parameters) {
            Ok(action) => (action, None),
            Err(why) => (Action::Drop, Some(why)),
        };
        Allowlist { family: settings.family, deny, problem, reported: BTreeMap::new() }
    }

    fn rules(&mut self, state: &State) -> Result<Vec<Rule>, String> {
        // A bad parameter is the operator's: the whole set is refused.
        if let Some(p) = &self.problem {
            return Err(p.clone());
        }
        let mut rules = Vec::new();
        let mut problems = BTreeMap::new();
        for port in state.ports.values() {
            match self.verdict(port) {
                Verdict::Open => {}
                Verdict::AllowOnly(allowed) => {
                    let accept = |cidr| self.rule(&port.key, Some(cidr), None, Action::Accept);
                    rules.extend(allowed.into_iter().map(accept));
                    rules.push(self.rule(&port.key, None, Some(DENIED), self.deny));
                }
                // A bad list is its Service's problem, handled here and
                // logged, not an Err: an Err would have kpx keep the last
                // good rules of every Service (and retry with back-off),
                // so one Service's typo would hold back every other
                // Service's new or changed allow-list. The Service's
                // ports close (one rule each), never open: every port of
                // the Service carries the same list, so either all of
                // them close or none.
                Verdict::Unusable(why) => {
                    rules.push(self.rule(&port.key, None, Some(DENIED_UNUSABLE), self.deny));
                    problems.insert(format!("{}/{}", port.namespace, port.name), why);
                }
            }
        }
        self.report(problems);
        Ok(rules)
    }
}

#[cfg(target_family = "wasm")]
kpx_sdk::export_extension!(Allowlist);

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_sdk::{Change, ProxyMode, testing};

    fn cidr(text: &str) -> Cidr {
        text.parse().unwrap_or_else(|_| panic!("{text:?} is not a CIDR"))
    }

    /// A TCP port `key` (testing's cluster IP and one endpoint, of
    /// `family`) with the annotation `allow` when given.
    fn port(key: &str, family: IpFamily, allow: Option<&str>) -> ServicePort {
        let endpoint = if family == IpFamily::V4 { "10.244.1.5" } else { "fd00:244::5" };
        let mut p = testing::service_port(key, &[(endpoint, 1)]);
        p.annotations = allow.map(|a| (ALLOW_KEY.to_string(), a.to_string())).into_iter().collect();
        p
    }

    fn state(ports: Vec<ServicePort>) -> State {
        State { ports: ports.into_iter().map(|p| (p.key.clone(), p)).collect(), ..Default::default() }
    }

    fn allowlist(family: IpFamily) -> Allowlist {
        Allowlist::new(Settings::new(family, ProxyMode::Nftables), vec![])
    }

    /// What happens to a new connection from `ip` to `service`: the action
    /// of the first of its rules that matches (None: no rule does).
    fn fate(rules: &[Rule], service: &str, ip: &str) -> Option<Action> {
        let ip: IpAddr = ip.parse().unwrap();
        rules
            .iter()
            .filter(|r| r.service == service && r.action != Action::Continue)
            .find(|r| r.source.is_none_or(|s| s.cidr.contains(&ip) != s.negate))
            .map(|r| r.action)
    }

    fn for_service<'a>(rules: &'a [Rule], service: &str) -> Vec<&'a Rule> {
        rules.iter().filter(|r| r.service == service).collect()
    }

    #[test]
    fn only_the_listed_sources_reach_the_port() {
        let web = port("shop/web:http", IpFamily::V4, Some("10.1.0.0/16, 192.168.7.9, 2001:db8::/32"));
        let open = port("shop/open:http", IpFamily::V4, None);
        let rules = allowlist(IpFamily::V4).rules(&state(vec![web, open])).unwrap();
        assert!(for_service(&rules, "shop/open:http").is_empty(), "a Service without the annotation gets no rules");
        // An accept for each IPv4 entry, in its order, then the drop.
        let sources: Vec<Option<Cidr>> = rules.iter().map(|r| r.source.map(|s| s.cidr)).collect();
        assert_eq!(sources, [Some(cidr("10.1.0.0/16")), Some(cidr("192.168.7.9/32")), None]);
        let actions: Vec<Action> = rules.iter().map(|r| r.action).collect();
        assert_eq!(actions, [Action::Accept, Action::Accept, Action::Drop]);
        for r in &rules {
            assert_eq!((r.service.as_str(), r.attachment), ("shop/web:http", Attachment::BeforeDispatch));
            assert_eq!(r.over_rate, None);
            assert!(r.source.is_none_or(|s| !s.negate), "{r:?}");
        }
        assert_eq!(rules[2].counter.as_deref(), Some(DENIED), "the rest is counted");
        assert!(rules[..2].iter().all(|r| r.counter.is_none()), "the listed ones are not");
        for ip in ["10.1.0.0", "10.1.77.1", "10.1.255.255", "192.168.7.9"] {
            assert_eq!(fate(&rules, "shop/web:http", ip), Some(Action::Accept), "{ip} is allowed");
        }
        for ip in ["0.0.0.0", "10.0.255.255", "10.2.0.0", "192.168.7.8", "192.168.7.10", "255.255.255.255"] {
            assert_eq!(fate(&rules, "shop/web:http", ip), Some(Action::Drop), "{ip} is dropped");
        }
    }

    #[test]
    fn each_family_takes_its_own_entries() {
        let list = "10.1.0.0/16, 2001:db8::/32, ::ffff:192.0.2.7";
        let v6 = allowlist(IpFamily::V6).rules(&state(vec![port("shop/web:http", IpFamily::V6, Some(list))])).unwrap();
        assert_eq!(v6.len(), 2, "one accept and the drop: {v6:?}");
        assert!(v6.iter().all(|r| r.source.is_none_or(|s| s.cidr.family() == IpFamily::V6)), "{v6:?}");
        assert_eq!(fate(&v6, "shop/web:http", "2001:db8:ffff::1"), Some(Action::Accept));
        assert_eq!(fate(&v6, "shop/web:http", "2001:db9::"), Some(Action::Drop));
        let mapped = fate(&v6, "shop/web:http", "::ffff:192.0.2.7");
        assert_eq!(mapped, Some(Action::Drop), "a mapped entry is the IPv4 instance's");
        // The mapped entry is 192.0.2.7 for the IPv4 instance.
        let v4 = allowlist(IpFamily::V4).rules(&state(vec![port("shop/web:http", IpFamily::V4, Some(list))])).unwrap();
        assert_eq!(fate(&v4, "shop/web:http", "192.0.2.7"), Some(Action::Accept));
        assert_eq!(fate(&v4, "shop/web:http", "192.0.2.6"), Some(Action::Drop));
        assert_eq!(fate(&v4, "shop/web:http", "10.1.2.3"), Some(Action::Accept));
        // A list of the other family only: this family has no allowed source.
        let only4 = port("shop/web:http", IpFamily::V6, Some("10.1.0.0/16"));
        let rules = allowlist(IpFamily::V6).rules(&state(vec![only4])).unwrap();
        assert_eq!(rules.iter().map(|r| (r.source, r.action)).collect::<Vec<_>>(), [(None, Action::Drop)]);
        assert_eq!(rules[0].counter.as_deref(), Some(DENIED));
    }

    #[test]
    fn empty_entries_are_skipped_and_an_empty_list_allows_no_one() {
        let mut e = allowlist(IpFamily::V4);
        let tidy = e.rules(&state(vec![port("a/web", IpFamily::V4, Some("10.1.0.0/16"))])).unwrap();
        let loose = e.rules(&state(vec![port("a/web", IpFamily::V4, Some(" ,10.1.0.0/16,, ,"))])).unwrap();
        assert_eq!(tidy, loose);
        for nothing in ["", " , "] {
            let rules = e.rules(&state(vec![port("a/web", IpFamily::V4, Some(nothing))])).unwrap();
            assert_eq!(rules.len(), 1, "{nothing:?}");
            assert_eq!((rules[0].source, rules[0].action), (None, Action::Drop));
            assert_eq!(rules[0].counter.as_deref(), Some(DENIED), "an empty list is a list, not a typo");
        }
        let everyone = e.rules(&state(vec![port("a/web", IpFamily::V4, Some("0.0.0.0/0"))])).unwrap();
        assert!(everyone.is_empty(), "{everyone:?}");
    }

    #[test]
    fn an_unusable_list_closes_its_service_only_and_says_why() {
        let mut e = allowlist(IpFamily::V4);
        for (list, why) in [
            ("10.1.0.0/16, 10.1.2.300", "\"10.1.2.300\" is not an IP address or a CIDR"),
            ("10.1.2.3/16", "host bits set (the network is 10.1.0.0/16; one address is 10.1.2.3/32)"),
            ("10.0.0.0/33", "\"10.0.0.0/33\" is not"),
            ("10.1.0.0/16 192.168.0.0/16", "is not an IP address"),
            ("ten.one.two.three", "is not an IP address"),
            ("fe80::1%eth0", "is not an IP address"),
            ("2001:db8::1/32", "host bits set"),
        ] {
            let bad = |key: &str| port(key, IpFamily::V4, Some(list));
            let guarded = port("ok/web:http", IpFamily::V4, Some("10.9.0.0/16"));
            let open = port("ok/open:http", IpFamily::V4, None);
            let ports = vec![bad("shop/bad:a"), bad("shop/bad:b"), guarded, open];
            let rules = e.rules(&state(ports)).unwrap_or_else(|err| panic!("{list:?}: an Err for all: {err}"));
            for key in ["shop/bad:a", "shop/bad:b"] {
                let closed = for_service(&rules, key);
                assert_eq!(closed.len(), 1, "{list:?}: {closed:?}");
                assert_eq!(closed[0].source, None, "{list:?}: every source");
                assert_eq!((closed[0].attachment, closed[0].action), (Attachment::BeforeDispatch, Action::Drop));
                assert_eq!(closed[0].counter.as_deref(), Some(DENIED_UNUSABLE));
                assert_eq!(fate(&rules, key, "10.1.2.3"), Some(Action::Drop), "{list:?}: a listed source too");
            }
            assert_eq!(for_service(&rules, "ok/web:http").len(), 2, "{list:?}: another Service keeps its list");
            assert_eq!(fate(&rules, "ok/web:http", "10.9.1.1"), Some(Action::Accept));
            assert!(for_service(&rules, "ok/open:http").is_empty());
            let logged = e.reported.get("shop/bad").unwrap_or_else(|| panic!("{list:?}: not reported"));
            assert!(logged.contains(why), "{list:?}: {logged}");
            assert_eq!(e.reported.len(), 1, "{:?}", e.reported);
        }
        // Fixed, the list applies and nothing is left to report.
        let fixed = port("shop/bad:a", IpFamily::V4, Some("10.1.2.3/32"));
        let rules = e.rules(&state(vec![fixed])).unwrap();
        assert_eq!((rules.len(), fate(&rules, "shop/bad:a", "10.1.2.3")), (2, Some(Action::Accept)));
        assert!(e.reported.is_empty(), "{:?}", e.reported);
    }

    #[test]
    fn a_list_past_the_rule_limit_closes_the_port() {
        // 63 entries and the drop fit; 64 do not.
        let entries = |n: usize| (0..n).map(|i| format!("10.0.{i}.0/24")).collect::<Vec<_>>().join(", ");
        let (fits, past) = (entries(MAX_RULES_PER_PORT - 1), entries(MAX_RULES_PER_PORT));
        let mut e = allowlist(IpFamily::V4);
        let rules = e.rules(&state(vec![port("shop/web:http", IpFamily::V4, Some(fits.as_str()))])).unwrap();
        assert_eq!(rules.len(), MAX_RULES_PER_PORT);
        assert_eq!(fate(&rules, "shop/web:http", "10.0.62.1"), Some(Action::Accept));
        assert_eq!(fate(&rules, "shop/web:http", "10.0.63.1"), Some(Action::Drop));
        assert!(e.reported.is_empty());
        let rules = e.rules(&state(vec![port("shop/web:http", IpFamily::V4, Some(past.as_str()))])).unwrap();
        assert_eq!(rules.len(), 1, "{rules:?}");
        assert_eq!((rules[0].source, rules[0].counter.as_deref()), (None, Some(DENIED_UNUSABLE)));
        assert!(e.reported["shop/web"].contains("take 65 rules"), "{:?}", e.reported);
        // The IPv6 instance has nothing of the list: it fits (one rule).
        let v6 = port("shop/web:http", IpFamily::V6, Some(past.as_str()));
        let rules = allowlist(IpFamily::V6).rules(&state(vec![v6])).unwrap();
        assert_eq!((rules.len(), rules[0].counter.as_deref()), (1, Some(DENIED)));
    }

    #[test]
    fn the_rules_follow_the_state_and_fresh_instances_agree() {
        let mut s = state(vec![
            port("a/web:http", IpFamily::V4, Some("192.168.100.100, 192.168.100.102/31")),
            port("b/db", IpFamily::V4, None),
        ]);
        let mut e = allowlist(IpFamily::V4);
        let first = e.rules(&s).unwrap();
        assert_eq!(first.len(), 3);
        assert_eq!(first, allowlist(IpFamily::V4).rules(&s).unwrap());
        for ip in ["192.168.100.100", "192.168.100.102", "192.168.100.103"] {
            assert_eq!(fate(&first, "a/web:http", ip), Some(Action::Accept), "{ip}");
        }
        for ip in ["192.168.100.101", "192.168.100.104", "192.168.100.99"] {
            assert_eq!(fate(&first, "a/web:http", ip), Some(Action::Drop), "{ip}");
        }
        // The annotation moves from one Service to the other.
        s.apply(vec![
            Change::Upsert(port("a/web:http", IpFamily::V4, None)),
            Change::Upsert(port("b/db", IpFamily::V4, Some("192.168.100.101"))),
        ]);
        let moved = e.rules(&s).unwrap();
        assert!(for_service(&moved, "a/web:http").is_empty());
        assert_eq!(for_service(&moved, "b/db").len(), 2);
        assert_eq!(fate(&moved, "b/db", "192.168.100.101"), Some(Action::Accept));
        s.apply(vec![Change::Remove("b/db".into())]);
        assert!(e.rules(&s).unwrap().is_empty());
    }

    /// `action=reject` refuses the others after kube-proxy's choice (the
    /// accepts move with it); anything else is refused at load, named.
    #[test]
    fn the_action_parameter_and_no_other() {
        let reject = vec![("action".to_string(), "reject".to_string())];
        assert!(Allowlist::check_parameters(&reject).is_ok());
        let mut e = Allowlist::new(Settings::new(IpFamily::V4, ProxyMode::Iptables), reject);
        let rules = e.rules(&state(vec![port("a/web", IpFamily::V4, Some("10.1.0.0/16"))])).unwrap();
        assert!(rules.iter().all(|r| r.attachment == Attachment::Service), "{rules:?}");
        assert_eq!(fate(&rules, "a/web", "10.1.0.1"), Some(Action::Accept));
        assert_eq!(fate(&rules, "a/web", "10.2.0.1"), Some(Action::Reject));
        for (key, value, named) in [("action", "allow", "action=allow"), ("mode", "open", "mode=open")] {
            let parameters = vec![(key.to_string(), value.to_string())];
            let refused = Allowlist::check_parameters(&parameters).unwrap_err();
            assert!(refused.contains(named), "{refused}");
            // Built for 0.2.0 (kpx does not ask): every render says it.
            let mut e = Allowlist::new(Settings::new(IpFamily::V4, ProxyMode::Iptables), parameters);
            assert!(e.rules(&state(vec![])).unwrap_err().contains(named));
        }
    }
}
