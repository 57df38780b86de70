//! kpx's annotations:
//! - Service `kpx.dev/scheduler: <name>` and `kpx.dev/scheduler-params:
//!   key=value,...`: the Service's scheduler;
//! - Service `ext.kpx.dev/<extension>.<key>`: an extension's own, handed
//!   to that extension only;
//! - EndpointSlice `kpx.dev/weights: <address>=<weight>,...`: endpoint
//!   weights (0 to 65535; default 1).
//!
//! Each is parsed once, when the state stores its object ([`service`],
//! [`weights`]), never per port or per sync pass; every port of a Service
//! shares what its annotations say (one `Arc`). What is wrong with one is
//! returned as [`Problem`]s, which the state logs once per change of the
//! object ([`report`]: one line per annotation, by kind, namespace/name,
//! annotation and reason). A malformed annotation is ignored (the Service
//! keeps the default scheduler; an endpoint keeps weight 1); a bad entry
//! of `kpx.dev/weights` is left out, the others apply.
//!
//! Bounds: an annotation over its bound is refused by name and ignored
//! whole, the object's other fields still apply.
//! - `kpx.dev/weights`: at most [`MAX_WEIGHTS_ENTRIES`] entries and
//!   [`MAX_WEIGHTS_BYTES`] bytes (a slice holds at most 1,000 endpoints);
//! - `kpx.dev/scheduler`: a name of at most [`MAX_SCHEDULER_NAME_BYTES`]
//!   bytes (no component may export a longer one);
//! - `kpx.dev/scheduler-params`: at most [`MAX_SCHEDULER_PARAMS_BYTES`]
//!   bytes.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use kpx_rules::model::SchedulerChoice;

use crate::source::Kind;
use crate::wellknown::{EXTENSION_PREFIX, entries, non_empty};

pub const SCHEDULER: &str = "kpx.dev/scheduler";
pub const SCHEDULER_PARAMS: &str = "kpx.dev/scheduler-params";
pub const WEIGHTS: &str = "kpx.dev/weights";

/// The most entries `kpx.dev/weights` may have (an EndpointSlice holds at
/// most 1,000 endpoints).
pub const MAX_WEIGHTS_ENTRIES: usize = 4096;
/// The longest `kpx.dev/weights` (1,000 IPv6 entries are about 46 KiB).
pub const MAX_WEIGHTS_BYTES: usize = 64 * 1024;
/// The longest `kpx.dev/scheduler` name: a component's names are at most
/// 64 bytes (`runtime::scheduler::load_problem`).
pub const MAX_SCHEDULER_NAME_BYTES: usize = 64;
/// The longest `kpx.dev/scheduler-params`.
pub const MAX_SCHEDULER_PARAMS_BYTES: usize = 64 * 1024;

/// How much of an offending entry a problem keeps (and the log shows).
const QUOTED: usize = 64;

/// One thing wrong with one annotation of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The annotation's key.
    pub annotation: &'static str,
    pub reason: Reason,
}

/// Why an annotation, or one entry of it, is not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// Longer than its bound: ignored whole.
    TooLong { bytes: usize, max: usize },
    /// More entries than its bound: ignored whole.
    TooManyEntries { entries: usize, max: usize },
    /// An entry that is not `key=value` (the first 64 bytes of it): the
    /// annotation is ignored whole.
    NotKeyValue(String),
    /// A weight's key that is not an IP address: that entry is left out.
    NotAnAddress(String),
    /// A weight that is not 0 to 65535: that entry is left out.
    BadWeight { address: String, weight: String },
    /// `kpx.dev/scheduler-params` without `kpx.dev/scheduler`.
    WithoutScheduler,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::TooLong { bytes, max } => write!(f, "{bytes} bytes, over its bound of {max}"),
            Reason::TooManyEntries { entries, max } => write!(f, "{entries} entries, over its bound of {max}"),
            Reason::NotKeyValue(entry) => write!(f, "{entry:?} is not key=value"),
            Reason::NotAnAddress(address) => write!(f, "{address:?} is not an IP address"),
            Reason::BadWeight { address, weight } => write!(f, "weight {weight:?} of {address} is not 0 to 65535"),
            Reason::WithoutScheduler => write!(f, "without {SCHEDULER}"),
        }
    }
}

impl Problem {
    fn new(annotation: &'static str, reason: Reason) -> Problem {
        Problem { annotation, reason }
    }

    /// Whether only one entry is left out (the rest of the annotation
    /// applies).
    pub fn is_entry(&self) -> bool {
        matches!(self.reason, Reason::NotAnAddress(_) | Reason::BadWeight { .. })
    }

    /// What kpx does about it.
    pub fn consequence(&self) -> &'static str {
        if self.is_entry() {
            return "that entry is left out (its endpoint keeps weight 1)";
        }
        match (self.annotation, &self.reason) {
            (WEIGHTS, _) => "the annotation is ignored: every endpoint of the slice keeps weight 1",
            (_, Reason::WithoutScheduler) => "the annotation is ignored",
            _ => "the annotation is ignored: the Service keeps the default scheduler",
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}; {}", self.annotation, self.reason, self.consequence())
    }
}

/// Logs an object's annotation problems: one line per annotation (its
/// first problem and how many more it has), by kind, namespace/name,
/// annotation and reason. The state calls it once per change of the
/// object, when it stores it. Returns the lines logged.
pub fn report(kind: Kind, object: &dyn fmt::Display, problems: &[Problem]) -> usize {
    let mut lines = 0;
    let mut rest = problems;
    while let Some(first) = rest.first() {
        let same = rest.iter().take_while(|p| p.annotation == first.annotation).count();
        let more = match same - 1 {
            0 => String::new(),
            n => format!(" ({n} more problems in it)"),
        };
        tracing::warn!(
            kind = %kind,
            object = %object,
            annotation = first.annotation,
            "{}; {}{more}",
            first.reason,
            first.consequence()
        );
        lines += 1;
        rest = &rest[same..];
    }
    lines
}

/// What a Service's annotations say, parsed once when the state stores
/// the Service; every port of it shares the scheduler.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceAnnotations {
    /// `kpx.dev/scheduler` with `kpx.dev/scheduler-params`: one copy,
    /// which each port points to.
    pub scheduler: Option<Arc<SchedulerChoice>>,
    /// The extensions' annotations, full keys, sorted.
    pub extensions: Vec<(String, String)>,
}

/// A Service's annotations, parsed, and what is wrong with them.
pub fn service(annotations: Option<&BTreeMap<String, String>>) -> (ServiceAnnotations, Vec<Problem>) {
    let mut problems = Vec::new();
    let scheduler = scheduler(annotations, &mut problems).map(Arc::new);
    (ServiceAnnotations { scheduler, extensions: extensions(annotations) }, problems)
}

/// A Service's extension annotations, full keys, sorted.
pub fn extensions(annotations: Option<&BTreeMap<String, String>>) -> Vec<(String, String)> {
    annotations
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(EXTENSION_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// At most [`QUOTED`] bytes of `text` (cut at a character), for a problem
/// to name an entry without holding all of it.
fn quoted(text: &str) -> String {
    if text.len() <= QUOTED {
        return text.to_string();
    }
    let mut end = QUOTED;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The scheduler a Service's annotations select.
fn scheduler(annotations: Option<&BTreeMap<String, String>>, problems: &mut Vec<Problem>) -> Option<SchedulerChoice> {
    let annotations = annotations?;
    let name = annotations.get(SCHEDULER).map(|n| n.trim()).filter(|n| !n.is_empty());
    let params = annotations.get(SCHEDULER_PARAMS);
    let Some(name) = name else {
        if params.is_some() {
            problems.push(Problem::new(SCHEDULER_PARAMS, Reason::WithoutScheduler));
        }
        return None;
    };
    if name.len() > MAX_SCHEDULER_NAME_BYTES {
        let reason = Reason::TooLong { bytes: name.len(), max: MAX_SCHEDULER_NAME_BYTES };
        problems.push(Problem::new(SCHEDULER, reason));
        return None;
    }
    let parameters = match params.map(|p| parameters(p)).transpose() {
        Ok(parameters) => parameters.unwrap_or_default(),
        Err(reason) => {
            problems.push(Problem::new(SCHEDULER_PARAMS, reason));
            return None;
        }
    };
    Some(SchedulerChoice { name: name.to_string(), parameters })
}

/// `kpx.dev/scheduler-params`, within its bound.
fn parameters(text: &str) -> Result<Vec<(String, String)>, Reason> {
    if text.len() > MAX_SCHEDULER_PARAMS_BYTES {
        return Err(Reason::TooLong { bytes: text.len(), max: MAX_SCHEDULER_PARAMS_BYTES });
    }
    let entries = entries(text).map_err(|entry| Reason::NotKeyValue(quoted(entry)))?;
    Ok(entries.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

/// An EndpointSlice's endpoint weights, by address (sorted; parsed once
/// when the state stores the slice).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Weights(Box<[(IpAddr, u16)]>);

impl Weights {
    /// The weight the annotation gives `ip`, if any.
    pub fn get(&self, ip: &IpAddr) -> Option<u16> {
        self.0.binary_search_by(|(a, _)| a.cmp(ip)).ok().map(|i| self.0[i].1)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The weights an EndpointSlice's annotation gives, and what is wrong
/// with it: bad entries are left out, an annotation over its bounds or
/// with an entry that is not `key=value` is ignored whole.
pub fn weights(annotations: Option<&BTreeMap<String, String>>) -> (Weights, Vec<Problem>) {
    let mut problems = Vec::new();
    let Some(text) = annotations.and_then(|a| a.get(WEIGHTS)) else {
        return (Weights::default(), problems);
    };
    let weights = match weights_within_bounds(text) {
        Ok(entries) => parse_weights(entries, &mut problems),
        Err(reason) => {
            problems.push(Problem::new(WEIGHTS, reason));
            Weights::default()
        }
    };
    (weights, problems)
}

/// The entries of `kpx.dev/weights`, if it is within its bounds and
/// every entry is `key=value`.
fn weights_within_bounds(text: &str) -> Result<Vec<(&str, &str)>, Reason> {
    if text.len() > MAX_WEIGHTS_BYTES {
        return Err(Reason::TooLong { bytes: text.len(), max: MAX_WEIGHTS_BYTES });
    }
    let count = non_empty(text).count();
    if count > MAX_WEIGHTS_ENTRIES {
        return Err(Reason::TooManyEntries { entries: count, max: MAX_WEIGHTS_ENTRIES });
    }
    entries(text).map_err(|entry| Reason::NotKeyValue(quoted(entry)))
}

/// Each entry's address and weight (the last one of an address counts;
/// an IPv4-mapped IPv6 address is the IPv4 address, as the slice's are);
/// a bad entry is a problem and left out.
fn parse_weights(entries: Vec<(&str, &str)>, problems: &mut Vec<Problem>) -> Weights {
    let mut out = BTreeMap::new();
    for (address, weight) in entries {
        match (address.parse::<IpAddr>(), weight.parse::<u16>()) {
            (Ok(ip), Ok(w)) => {
                out.insert(ip.to_canonical(), w);
            }
            (Err(_), _) => problems.push(Problem::new(WEIGHTS, Reason::NotAnAddress(quoted(address)))),
            (_, Err(_)) => {
                let reason = Reason::BadWeight { address: quoted(address), weight: quoted(weight) };
                problems.push(Problem::new(WEIGHTS, reason));
            }
        }
    }
    Weights(out.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn scheduler_of(a: &BTreeMap<String, String>) -> (Option<SchedulerChoice>, Vec<Problem>) {
        let (parsed, problems) = service(Some(a));
        (parsed.scheduler.map(|s| SchedulerChoice::clone(&s)), problems)
    }

    #[test]
    fn scheduler_and_parameters() {
        let a = map(&[(SCHEDULER, "maglev"), (SCHEDULER_PARAMS, "table-size=31, seed=7")]);
        let (s, problems) = scheduler_of(&a);
        let s = s.unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(s.name, "maglev");
        assert_eq!(s.parameters, vec![("table-size".into(), "31".into()), ("seed".into(), "7".into())]);
        let bad = map(&[(SCHEDULER, "maglev"), (SCHEDULER_PARAMS, "table-size")]);
        assert_eq!(
            scheduler_of(&bad),
            (None, vec![Problem::new(SCHEDULER_PARAMS, Reason::NotKeyValue("table-size".into()))])
        );
        assert_eq!(scheduler_of(&map(&[(SCHEDULER, " ")])), (None, vec![]));
        assert_eq!(
            scheduler_of(&map(&[(SCHEDULER_PARAMS, "a=1")])),
            (None, vec![Problem::new(SCHEDULER_PARAMS, Reason::WithoutScheduler)])
        );
        assert_eq!(service(None), (ServiceAnnotations::default(), vec![]));
    }

    #[test]
    fn scheduler_annotations_over_their_bounds_are_refused_by_name() {
        let at_bound = format!("blob={}", "v".repeat(MAX_SCHEDULER_PARAMS_BYTES - 5));
        assert_eq!(at_bound.len(), MAX_SCHEDULER_PARAMS_BYTES);
        let (s, problems) = scheduler_of(&map(&[(SCHEDULER, "maglev"), (SCHEDULER_PARAMS, at_bound.as_str())]));
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(s.unwrap().parameters[0].1.len(), MAX_SCHEDULER_PARAMS_BYTES - 5);

        let over = format!("{at_bound}v");
        let (s, problems) = scheduler_of(&map(&[(SCHEDULER, "maglev"), (SCHEDULER_PARAMS, over.as_str())]));
        assert_eq!(s, None, "the Service keeps the default scheduler");
        let reason = Reason::TooLong { bytes: MAX_SCHEDULER_PARAMS_BYTES + 1, max: MAX_SCHEDULER_PARAMS_BYTES };
        assert_eq!(problems, [Problem::new(SCHEDULER_PARAMS, reason)]);
        assert_eq!(
            problems[0].to_string(),
            "kpx.dev/scheduler-params: 65537 bytes, over its bound of 65536; the annotation is ignored: the Service keeps the default scheduler"
        );

        let long_name = "n".repeat(MAX_SCHEDULER_NAME_BYTES + 1);
        let (s, problems) = scheduler_of(&map(&[(SCHEDULER, long_name.as_str())]));
        assert_eq!(s, None);
        assert_eq!(problems[0].annotation, SCHEDULER);
        assert!(matches!(problems[0].reason, Reason::TooLong { bytes: 65, max: 64 }), "{problems:?}");
    }

    #[test]
    fn weights_by_address() {
        let a = map(&[(WEIGHTS, "10.0.0.1=3, 10.0.0.2=0,fd00::1=7,10.0.0.3=70000,nope=1,::ffff:10.0.0.4=5")]);
        let (w, problems) = weights(Some(&a));
        assert_eq!(w.len(), 4);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(w.get(&ip("10.0.0.1")), Some(3));
        assert_eq!(w.get(&ip("10.0.0.2")), Some(0));
        assert_eq!(w.get(&ip("fd00::1")), Some(7));
        assert_eq!(w.get(&ip("10.0.0.4")), Some(5), "an IPv4-mapped address is the IPv4 one");
        assert_eq!(w.get(&ip("10.0.0.3")), None);
        assert_eq!(
            problems,
            [
                Problem::new(WEIGHTS, Reason::BadWeight { address: "10.0.0.3".into(), weight: "70000".into() }),
                Problem::new(WEIGHTS, Reason::NotAnAddress("nope".into())),
            ]
        );
        assert!(problems.iter().all(Problem::is_entry));
        let (w, problems) = weights(Some(&map(&[(WEIGHTS, "10.0.0.1")])));
        assert!(w.is_empty());
        assert_eq!(problems, [Problem::new(WEIGHTS, Reason::NotKeyValue("10.0.0.1".into()))]);
        assert_eq!(weights(None), (Weights::default(), vec![]));
    }

    /// Each bad entry is one problem of one parse; the log has one line
    /// for the annotation.
    #[test]
    fn bad_entries_are_problems_of_one_parse_and_one_log_line() {
        let text: Vec<String> = (0..1000).map(|i| format!("x{i}=1")).collect();
        let a = map(&[(WEIGHTS, text.join(",").as_str()), (SCHEDULER_PARAMS, "a=1")]);
        let (w, problems) = weights(Some(&a));
        assert!(w.is_empty());
        assert_eq!(problems.len(), 1000);
        assert_eq!(report(Kind::EndpointSlice, &"ns/web-abc", &problems), 1);
        let (_, more) = service(Some(&a));
        let all: Vec<Problem> = problems.into_iter().chain(more).collect();
        assert_eq!(report(Kind::Service, &"ns/web", &all), 2, "one line per annotation");
        assert_eq!(report(Kind::Service, &"ns/web", &[]), 0);
    }

    #[test]
    fn weights_over_their_bounds_are_refused_by_name() {
        let entry = |i: usize| format!("10.{}.{}.{}=2", i / 65536, (i / 256) % 256, i % 256);
        let at_bound: Vec<String> = (0..MAX_WEIGHTS_ENTRIES).map(entry).collect();
        let text = at_bound.join(",");
        assert!(text.len() <= MAX_WEIGHTS_BYTES, "{}", text.len());
        let (w, problems) = weights(Some(&map(&[(WEIGHTS, text.as_str())])));
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(w.len(), MAX_WEIGHTS_ENTRIES);

        let over = format!("{text},{}", entry(MAX_WEIGHTS_ENTRIES));
        let (w, problems) = weights(Some(&map(&[(WEIGHTS, over.as_str())])));
        assert!(w.is_empty(), "ignored whole");
        let reason = Reason::TooManyEntries { entries: MAX_WEIGHTS_ENTRIES + 1, max: MAX_WEIGHTS_ENTRIES };
        assert_eq!(problems, [Problem::new(WEIGHTS, reason)]);

        let long = format!("10.0.0.1=1,{}", " ".repeat(MAX_WEIGHTS_BYTES));
        let (w, problems) = weights(Some(&map(&[(WEIGHTS, long.as_str())])));
        assert!(w.is_empty());
        assert!(matches!(problems.as_slice(), [Problem { annotation: WEIGHTS, reason: Reason::TooLong { .. } }]));
        assert!(problems[0].consequence().contains("every endpoint of the slice keeps weight 1"));
    }

    #[test]
    fn a_problem_quotes_at_most_64_bytes_of_an_entry() {
        let long = "é".repeat(100);
        let (_, problems) = weights(Some(&map(&[(WEIGHTS, format!("{long}=1").as_str())])));
        let Reason::NotAnAddress(quoted) = &problems[0].reason else { panic!("{problems:?}") };
        assert!(quoted.len() <= QUOTED + '…'.len_utf8(), "{}", quoted.len());
        assert!(quoted.ends_with('…'));
    }
}
