//! The host's check of an extension's rules. There is little to check:
//! an extension names no chain, table or address to match; the host
//! derives every object and destination from the state. What is left is
//! that each rule is about a service port the extension was sent, within
//! the bounds the kernel objects have.

use std::collections::{BTreeMap, BTreeSet};

use kpx_rules::model::{IpFamily, ServicePort};
use kpx_rules::ops::extension::{Action, Attachment, MAX_COUNTER_NAME, Rate, Rule, Ruleset, valid_counter_name};

use super::{Rejected, shorten_debug};

/// Most rules in one extension's ruleset.
pub const MAX_RULES: usize = 65_536;
/// Most rules for one service port at one attachment.
pub const MAX_RULES_PER_PORT: usize = 64;
/// Most counters of one service port.
pub const MAX_COUNTERS_PER_PORT: usize = 64;
/// Most counters, and most rate limits, of one extension: each is a
/// kernel object (and a counter a metrics series).
pub const MAX_OBJECTS: usize = 4096;

/// Service ports whose rules are left out, with why: a port over its own
/// bounds is its Service's problem (an annotation listing too much), not
/// every Service's.
pub type Skipped = BTreeMap<String, String>;

/// Checks every rule; the first refusal names the rule and why. The ports
/// over a per-port bound are returned, to be left out.
pub fn check(
    plugin: &str,
    family: IpFamily,
    ruleset: &Ruleset,
    ports: &BTreeMap<String, ServicePort>,
) -> Result<Skipped, Rejected> {
    let refuse = |i: usize, rule: &Rule, reason: String| Rejected {
        plugin: plugin.to_string(),
        at: format!("rule {i}"),
        item: shorten_debug(rule),
        reason,
    };
    if ruleset.rules.len() > MAX_RULES {
        return Err(Rejected {
            plugin: plugin.to_string(),
            at: "ruleset".into(),
            item: format!("{} rules", ruleset.rules.len()),
            reason: format!("an extension may return at most {MAX_RULES} rules"),
        });
    }
    let mut per_port: BTreeMap<(&str, Attachment), usize> = BTreeMap::new();
    let mut counters: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let (mut all_counters, mut limits) = (BTreeSet::new(), 0);
    let mut skipped = Skipped::new();
    for (i, rule) in ruleset.rules.iter().enumerate() {
        if !ports.contains_key(&rule.service) {
            return Err(refuse(i, rule, format!("{:?} is not a service port of the state", rule.service)));
        }
        if let Some(s) = &rule.source {
            if s.cidr.family() != family {
                return Err(refuse(i, rule, format!("the source is not an {family} CIDR")));
            }
            if s.cidr.prefix_len > s.cidr.max_len() {
                return Err(refuse(i, rule, format!("prefix length {} is too long", s.cidr.prefix_len)));
            }
        }
        if let Some(Rate { per_second, burst }) = rule.over_rate {
            if !((1..=Rate::MAX).contains(&per_second) && (1..=Rate::MAX).contains(&burst)) {
                return Err(refuse(i, rule, format!("a rate and its burst are 1 to {}", Rate::MAX)));
            }
            limits += 1;
            if limits > MAX_OBJECTS {
                return Err(refuse(i, rule, format!("an extension has at most {MAX_OBJECTS} rate limits")));
            }
        }
        if let Some(c) = &rule.counter {
            if !valid_counter_name(c) {
                return Err(refuse(i, rule, format!("a counter's name is [a-z0-9_], 1 to {MAX_COUNTER_NAME} bytes")));
            }
            all_counters.insert((&rule.service, c));
            if all_counters.len() > MAX_OBJECTS {
                return Err(refuse(i, rule, format!("an extension has at most {MAX_OBJECTS} counters")));
            }
            let names = counters.entry(&rule.service).or_default();
            names.insert(c);
            if names.len() > MAX_COUNTERS_PER_PORT {
                skipped
                    .entry(rule.service.clone())
                    .or_insert_with(|| format!("more than {MAX_COUNTERS_PER_PORT} counters (rule {i} names the next)"));
            }
        }
        if rule.action == Action::Reject && rule.attachment != Attachment::Service {
            return Err(refuse(
                i,
                rule,
                format!("reject is only possible at the service attachment (not {})", rule.attachment.name()),
            ));
        }
        let n = per_port.entry((&rule.service, rule.attachment)).or_default();
        *n += 1;
        if *n > MAX_RULES_PER_PORT {
            skipped.entry(rule.service.clone()).or_insert_with(|| {
                format!("more than {MAX_RULES_PER_PORT} rules at {} (rule {i} is the next)", rule.attachment.name())
            });
        }
    }
    Ok(skipped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::model::{Cidr, Protocol};
    use kpx_rules::ops::extension::SourceMatch;

    fn ports() -> BTreeMap<String, ServicePort> {
        let p = ServicePort::new("ns", "web", "", Protocol::Tcp, 80);
        BTreeMap::from([(p.key.clone(), p)])
    }

    fn rule() -> Rule {
        Rule {
            attachment: Attachment::Service,
            service: "ns/web".into(),
            source: None,
            over_rate: None,
            counter: None,
            action: Action::Continue,
        }
    }

    fn refusal(rules: Vec<Rule>) -> String {
        match check("x", IpFamily::V4, &Ruleset { rules }, &ports()) {
            Ok(skipped) if skipped.is_empty() => "accepted".into(),
            Ok(skipped) => format!("skipped {skipped:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn each_bound_is_refused_by_name() {
        assert_eq!(refusal(vec![rule(), Rule { action: Action::Reject, ..rule() }]), "accepted");
        for (bad, why) in [
            (Rule { service: "ns/other".into(), ..rule() }, "not a service port of the state"),
            (Rule { counter: Some("x".repeat(33)), ..rule() }, "a counter's name"),
            (Rule { counter: Some("a-b".into()), ..rule() }, "a counter's name"),
            (Rule { over_rate: Some(Rate { per_second: 0, burst: 1 }), ..rule() }, "a rate and its burst"),
            (Rule { over_rate: Some(Rate { per_second: 1, burst: Rate::MAX + 1 }), ..rule() }, "a rate and its burst"),
            (
                Rule { attachment: Attachment::Firewall, action: Action::Reject, ..rule() },
                "only possible at the service",
            ),
            (
                Rule {
                    source: Some(SourceMatch {
                        negate: false,
                        cidr: Cidr { addr: "10.0.0.0".parse().unwrap(), prefix_len: 33 },
                    }),
                    ..rule()
                },
                "prefix length 33",
            ),
        ] {
            let got = refusal(vec![rule(), bad]);
            assert!(got.contains("rule 1") && got.contains(why), "want {why:?}: {got}");
        }
        // A port over its own bounds is left out, named; the rest stands.
        let many = vec![rule(); MAX_RULES_PER_PORT + 1];
        let got = refusal(many);
        assert!(got.starts_with("skipped") && got.contains("ns/web") && got.contains("more than 64 rules"), "{got}");
        let counters: Vec<Rule> =
            (0..=MAX_COUNTERS_PER_PORT).map(|i| Rule { counter: Some(format!("c{i}")), ..rule() }).collect();
        assert!(refusal(counters).contains("more than 64 counters"));
        let objects = vec![Rule { over_rate: Some(Rate { per_second: 1, burst: 1 }), ..rule() }; MAX_OBJECTS + 1];
        assert!(refusal(objects).contains("at most 4096 rate limits"));
    }
}
