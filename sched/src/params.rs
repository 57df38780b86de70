//! Scheduler parameters (`kpx.dev/scheduler-params: key=value,...`):
//! each scheduler names the keys it reads; anything else is an error that
//! names the key.

use std::collections::BTreeMap;

/// Parameters a scheduler has read from, checked as it reads.
pub struct Params<'a> {
    values: BTreeMap<&'a str, &'a str>,
    scheduler: &'a str,
}

impl<'a> Params<'a> {
    /// Refuses keys the scheduler does not read.
    pub fn new(scheduler: &'a str, given: &'a [(String, String)], known: &[&str]) -> Result<Params<'a>, String> {
        let mut values = BTreeMap::new();
        for (k, v) in given {
            if !known.contains(&k.as_str()) {
                let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
                return Err(format!("scheduler {scheduler} has no parameter {k:?} (it reads: {known})"));
            }
            values.insert(k.as_str(), v.as_str());
        }
        Ok(Params { values, scheduler })
    }

    pub fn flag(&self, key: &str) -> Result<bool, String> {
        match self.values.get(key) {
            None => Ok(false),
            Some(&"true" | &"1" | &"yes" | &"") => Ok(true),
            Some(&"false" | &"0" | &"no") => Ok(false),
            Some(v) => Err(format!("scheduler {}: {key}={v:?} is not true or false", self.scheduler)),
        }
    }

    pub fn number(&self, key: &str, default: u32, allowed: impl Fn(u32) -> bool, what: &str) -> Result<u32, String> {
        let Some(v) = self.values.get(key) else {
            return Ok(default);
        };
        let n = match v.strip_prefix("0x") {
            Some(hex) => u32::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        };
        match n {
            Some(n) if allowed(n) => Ok(n),
            _ => Err(format!("scheduler {}: {key}={v:?} is not {what}", self.scheduler)),
        }
    }
}
