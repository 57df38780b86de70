//! The promises a scheduler states for its names (kpx:proxier 0.4.0's
//! `promise`), and what kpx requires of a list of them: one type for the
//! host, which checks them, and the SDK, which states them.

use std::fmt;

/// The most promises a name may state (there are six kinds; each at
/// most once).
pub const MAX_PROMISES: usize = 16;

/// A property a scheduler guarantees for one of its names (kpx:proxier
/// 0.4.0's `promise`; wit/since_v0.4.0 defines each), which `kpx
/// conformance` checks (and no property a name does not state).
/// Candidates are in the order the host sends them: endpoints sorted by
/// address, then port. docs/plugins.md, "Promises", says what the kit
/// does for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Promise {
    /// Equal endpoints take about equal shares of new connections (each
    /// at least half its fair share).
    Spread,
    /// Shares follow the endpoints' weights (`kpx.dev/weights`).
    Weighted,
    /// One client, one endpoint, while the endpoints stay the same.
    Sticky,
    /// When one of N endpoints leaves, at most 1/N of the clients (plus 2
    /// points) move to another endpoint.
    MinimalDisruption,
    /// A new connection goes to a candidate with the fewest open
    /// connections (per-connection picks).
    LeastLoaded,
    /// Every new connection goes to the first candidate that may take it
    /// (weight above 0, not failed for this connection): failover in
    /// candidate order.
    Priority,
}

impl Promise {
    /// Every promise, in the WIT's order.
    pub const ALL: [Promise; 6] = [
        Promise::Spread,
        Promise::Weighted,
        Promise::Sticky,
        Promise::MinimalDisruption,
        Promise::LeastLoaded,
        Promise::Priority,
    ];

    /// The WIT's name of the promise.
    pub fn as_str(self) -> &'static str {
        match self {
            Promise::Spread => "spread",
            Promise::Weighted => "weighted",
            Promise::Sticky => "sticky",
            Promise::MinimalDisruption => "minimal-disruption",
            Promise::LeastLoaded => "least-loaded",
            Promise::Priority => "priority",
        }
    }
}

impl fmt::Display for Promise {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kpx requires of a `promises` answer: at most [`MAX_PROMISES`],
/// each once (a list that names one twice is a component's mistake worth
/// saying, not a set to quietly dedupe).
pub fn promises_problem(promises: &[Promise]) -> Option<String> {
    if promises.len() > MAX_PROMISES {
        return Some(format!("promises() gave {} promises (at most {MAX_PROMISES})", promises.len()));
    }
    let twice = promises.iter().enumerate().find(|(i, p)| promises[..*i].contains(*p)).map(|(_, p)| *p);
    twice.map(|p| format!("promises() gave {p} twice"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_promise_list_too_long_or_naming_one_twice_is_refused() {
        assert_eq!(promises_problem(&Promise::ALL), None);
        let twice = promises_problem(&[Promise::Spread, Promise::Sticky, Promise::Spread]).unwrap();
        assert!(twice.contains("spread twice"), "{twice}");
        let long = promises_problem(&[Promise::Sticky; 17]).unwrap();
        assert!(long.contains("gave 17 promises (at most 16)"), "{long}");
        let names: Vec<String> = Promise::ALL.iter().map(Promise::to_string).collect();
        assert_eq!(names, ["spread", "weighted", "sticky", "minimal-disruption", "least-loaded", "priority"]);
    }
}
