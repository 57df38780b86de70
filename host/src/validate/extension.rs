//! The host's check of an extension's rules. There is little to check:
//! an extension names no chain, table or address to match; the host
//! derives every object and destination from the state. What is left is
//! that each rule is about a service port the extension was sent, within
//! the bounds the kernel objects have.

use std::collections::{BTreeMap, BTreeSet};

use kpx_rules::model::IpFamily;
use kpx_rules::ops::extension::{Action, Attachment, MAX_COUNTER_NAME, Rate, Rule, Ruleset, valid_counter_name};

use super::{Rejected, shorten_debug};

/// Most rules an extension may return: more is refused outright (bounded
/// work for the host).
pub const MAX_RETURNED: usize = 262_144;
/// Most rules written for one extension.
pub const MAX_RULES: usize = 65_536;
/// Most rules for one service port at one attachment.
pub const MAX_RULES_PER_PORT: usize = 64;
/// Most counters of one service port.
pub const MAX_COUNTERS_PER_PORT: usize = 64;
/// Most counters, and most rate limits, of one extension: each is a
/// kernel object (and a counter a metrics series).
pub const MAX_OBJECTS: usize = 4096;

/// Service ports whose rules are left out, with why. A port's numbers are
/// its Service's doing (an annotation listing too much), so a port over
/// its own bounds, or one that would take the extension past its totals
/// (ports in key order), is left out and the others' rules stand: one
/// Service cannot freeze the extension for every Service.
pub type Skipped = BTreeMap<String, String>;

/// What one port asks for.
#[derive(Default)]
struct PortLoad<'a> {
    rules: usize,
    per_attachment: BTreeMap<Attachment, usize>,
    counters: BTreeSet<&'a str>,
    limits: usize,
}

/// Checks every rule; a rule that is wrong whatever the Services say (an
/// unknown port, a bad name, family or rate, reject where the kernel
/// cannot) refuses the ruleset, naming the rule. The ports to leave out
/// are returned.
pub fn check(
    plugin: &str,
    family: IpFamily,
    ruleset: &Ruleset,
    ports: &crate::state::PortMap,
) -> Result<Skipped, Rejected> {
    let refuse = |i: usize, rule: &Rule, reason: String| Rejected {
        plugin: plugin.to_string(),
        at: format!("rule {i}"),
        item: shorten_debug(rule),
        reason,
    };
    if ruleset.rules.len() > MAX_RETURNED {
        return Err(Rejected {
            plugin: plugin.to_string(),
            at: "ruleset".into(),
            item: format!("{} rules", ruleset.rules.len()),
            reason: format!("an extension may return at most {MAX_RETURNED} rules"),
        });
    }
    let mut load: BTreeMap<&str, PortLoad> = BTreeMap::new();
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
        if let Some(Rate { per_second, burst }) = rule.over_rate
            && !((1..=Rate::MAX).contains(&per_second) && (1..=Rate::MAX).contains(&burst))
        {
            return Err(refuse(i, rule, format!("a rate and its burst are 1 to {}", Rate::MAX)));
        }
        if let Some(c) = &rule.counter
            && !valid_counter_name(c)
        {
            return Err(refuse(i, rule, format!("a counter's name is [a-z0-9_], 1 to {MAX_COUNTER_NAME} bytes")));
        }
        if rule.action == Action::Reject && rule.attachment != Attachment::Service {
            return Err(refuse(
                i,
                rule,
                format!("reject is only possible at the service attachment (not {})", rule.attachment.name()),
            ));
        }
        let l = load.entry(&rule.service).or_default();
        l.rules += 1;
        *l.per_attachment.entry(rule.attachment).or_default() += 1;
        l.counters.extend(rule.counter.as_deref());
        l.limits += usize::from(rule.over_rate.is_some());
    }
    let mut skipped = Skipped::new();
    let (mut rules, mut counters, mut limits) = (0, 0, 0);
    for (port, l) in &load {
        let why = if let Some((a, n)) = l.per_attachment.iter().find(|(_, n)| **n > MAX_RULES_PER_PORT) {
            Some(format!("{n} rules at {} (at most {MAX_RULES_PER_PORT})", a.name()))
        } else if l.counters.len() > MAX_COUNTERS_PER_PORT {
            Some(format!("{} counters (at most {MAX_COUNTERS_PER_PORT})", l.counters.len()))
        } else if rules + l.rules > MAX_RULES {
            Some(format!("its {} rules would take the extension past {MAX_RULES}", l.rules))
        } else if counters + l.counters.len() > MAX_OBJECTS {
            Some(format!("its {} counters would take the extension past {MAX_OBJECTS}", l.counters.len()))
        } else if limits + l.limits > MAX_OBJECTS {
            Some(format!("its {} rate limits would take the extension past {MAX_OBJECTS}", l.limits))
        } else {
            None
        };
        match why {
            Some(why) => {
                skipped.insert(port.to_string(), why);
            }
            None => {
                rules += l.rules;
                counters += l.counters.len();
                limits += l.limits;
            }
        }
    }
    Ok(skipped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::model::{Cidr, Protocol, ServicePort};
    use kpx_rules::ops::extension::SourceMatch;

    fn ports() -> crate::state::PortMap {
        let p = ServicePort::new("ns", "web", "", Protocol::Tcp, 80);
        BTreeMap::from([(p.key.clone(), Box::new(p))])
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
        // An accept only ends the extension's own rules: at every attachment.
        let accepts = Attachment::ALL.map(|attachment| Rule { attachment, action: Action::Accept, ..rule() });
        assert_eq!(refusal(accepts.to_vec()), "accepted");
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
        assert!(got.starts_with("skipped") && got.contains("ns/web") && got.contains("65 rules at service"), "{got}");
        let counters: Vec<Rule> = (0..=MAX_COUNTERS_PER_PORT)
            .map(|i| Rule {
                counter: Some(format!("c{i}")),
                attachment: if i % 2 == 0 { Attachment::Service } else { Attachment::BeforeDispatch },
                ..rule()
            })
            .collect();
        assert!(refusal(counters).contains("65 counters"));
        // Past the extension's totals: the ports that would pass them are
        // left out, the earlier ones stand.
        let ports: crate::state::PortMap = (0..=MAX_OBJECTS)
            .map(|i| {
                let p = ServicePort::new("ns", &format!("web{i:05}"), "", Protocol::Tcp, 80);
                (p.key.clone(), Box::new(p))
            })
            .collect();
        let limited: Vec<Rule> = ports
            .keys()
            .map(|k| Rule { service: k.clone(), over_rate: Some(Rate { per_second: 1, burst: 1 }), ..rule() })
            .collect();
        let skipped = check("x", IpFamily::V4, &Ruleset { rules: limited }, &ports).unwrap();
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert!(skipped["ns/web04096"].contains("would take the extension past 4096"), "{skipped:?}");
        let huge = vec![rule(); MAX_RETURNED + 1];
        assert!(refusal(huge).contains("at most 262144 rules"));
    }
}
