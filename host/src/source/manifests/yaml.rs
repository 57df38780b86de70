//! One YAML document into a JSON value: serde_norway's parser (libyaml's,
//! translated to Rust) reads the text, and kpx's own visitor builds the
//! value, so the rules that matter for untrusted files are kpx's:
//!
//! - **Bounded expansion.** An alias replays its anchor's events, so a
//!   small document can stand for billions of nodes. The visitor charges
//!   what it builds (a scalar 1, a sequence 2, a mapping 16: about its
//!   memory in 40-byte units) and every string byte, and stops the
//!   document at [`UNITS_PER_BYTE`] units and [`BYTES_PER_BYTE`] string
//!   bytes per byte of its text, past a small [`FLOOR`] (a document without
//!   aliases stays below both): time and memory stay proportional to the
//!   text read, whatever the aliases.
//! - **Nesting checked before the parser runs.** libyaml's scanner walks
//!   its stack of possible keys, one per open flow collection, for every
//!   token, and serde_norway reads a whole document's events before its
//!   depth limit (128) applies: `{a: {a: …` nested n deep costs n². A
//!   document whose `[`/`{` nest deeper than [`MAX_FLOW_DEPTH`], counted
//!   on the raw text, is refused unread. Known gap: the count does not
//!   know quotes or comments, so closing brackets inside them (`{a: '}',
//!   …`) lower it, and a crafted file can still cost the scanner
//!   quadratic time (minutes of one core for about a megabyte). Whoever
//!   can write the manifests already decides every Service kpx programs;
//!   a lexer of YAML's flow context would close it.
//! - **Merge keys** (`<<: *anchor`, `<<: [*a, *b]`) as kubectl reads them
//!   (go-yaml): a merge sets the merged mapping's keys where it stands,
//!   over keys before it; keys after it win; of several merged mappings
//!   the earlier wins. A quoted `<<` key is a field to kubectl, not a
//!   merge, and serde_norway does not say how a key was quoted, so a
//!   document with `"<<":` or `'<<':` in its text is refused. Known gaps,
//!   merged by kpx where kubectl reads a field named `<<`: an escaped
//!   (`"\x3c<"`), tagged (`!!str <<`), explicit (`? "<<"`) or aliased key;
//!   and `<<: *s` with `s` a sequence of mappings, which go-yaml refuses.
//! - **Duplicate keys** refuse the document (YAML forbids them, and
//!   kubectl's strict decoding refuses them: a parser that let the last
//!   one win would program a name the file's reader did not see).
//! - **No NaN or infinity**: JSON has none, and kubectl refuses them.
//!
//! Nesting is bounded by serde_norway's own limit (128 levels, carried
//! through alias jumps). With libyaml's parser the bench reads a 10k
//! Services x 10 endpoints dump in 302-317 ms, against 888-922 ms with
//! serde-saphyr (bench/results, 9bdad85 and 3ab30af).

use std::cell::Cell;
use std::collections::HashSet;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, EnumAccess, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Units (see the module's notes) a document may build per byte of its
/// text, past [`FLOOR`].
pub const UNITS_PER_BYTE: usize = 8;
/// String bytes a document may build per byte of its text, past [`FLOOR`].
pub const BYTES_PER_BYTE: usize = 4;
/// What any document may build, however short.
pub const FLOOR: usize = 1024;
/// `[` and `{` open at once, counted on the raw text, past which a
/// document is refused before it is parsed (serde_norway refuses deeper
/// than 128 anyway, after scanning it all).
pub const MAX_FLOW_DEPTH: usize = 128;

const SCALAR: usize = 1;
const SEQUENCE: usize = 2;
const MAPPING: usize = 16;

/// The value of `doc`, a single YAML document (null when it is empty), or
/// why it is not one kpx reads.
pub fn parse(doc: &str) -> Result<Value, String> {
    check_text(doc)?;
    let budget = Budget {
        units: Cell::new(FLOOR + UNITS_PER_BYTE * doc.len()),
        bytes: Cell::new(FLOOR + BYTES_PER_BYTE * doc.len()),
    };
    let de = serde_norway::Deserializer::from_str(doc);
    ValueSeed { budget: &budget }.deserialize(de).map_err(|e| e.to_string())
}

/// What is refused on the raw text: flow nesting past [`MAX_FLOW_DEPTH`],
/// a quoted `<<` key.
fn check_text(doc: &str) -> Result<(), String> {
    let mut depth = 0usize;
    for b in doc.bytes() {
        match b {
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_FLOW_DEPTH {
                    return Err(format!("flow collections ([ or {{) nested deeper than {MAX_FLOW_DEPTH} levels"));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    for quoted in ["\"<<\"", "'<<'"] {
        for (at, _) in doc.match_indices(quoted) {
            if doc[at + quoted.len()..].trim_start_matches([' ', '\t']).starts_with(':') {
                return Err(format!(
                    "a quoted {quoted} key: kubectl reads it as a field named <<, not as a merge; write it plain or not at all"
                ));
            }
        }
    }
    Ok(())
}

/// What is left to build.
struct Budget {
    units: Cell<usize>,
    bytes: Cell<usize>,
}

impl Budget {
    fn charge<E: serde::de::Error>(&self, units: usize) -> Result<(), E> {
        let left = self.units.get();
        if units > left {
            return Err(E::custom(
                "the document expands past its node budget (aliases repeating anchors): refused as an alias bomb",
            ));
        }
        self.units.set(left - units);
        Ok(())
    }

    fn node<E: serde::de::Error>(&self) -> Result<(), E> {
        self.charge(SCALAR)
    }

    fn string<E: serde::de::Error>(&self, s: &str) -> Result<(), E> {
        self.node()?;
        let left = self.bytes.get();
        if s.len() > left {
            return Err(E::custom(
                "the document's strings expand past its byte budget (aliases repeating anchors): refused as an alias bomb",
            ));
        }
        self.bytes.set(left - s.len());
        Ok(())
    }
}

#[derive(Clone, Copy)]
struct ValueSeed<'a> {
    budget: &'a Budget,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Value, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Value, E> {
        self.budget.node()?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
        self.budget.node()?;
        Ok(Value::from(v))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
        self.budget.node()?;
        Ok(Value::from(v))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        self.budget.node()?;
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(format!("{v} is not a number JSON (or kubectl) has")))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        self.budget.string(v)?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Value, E> {
        self.budget.string(&v)?;
        Ok(Value::String(v))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        self.budget.node()?;
        Ok(Value::Null)
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<Value, D::Error> {
        self.deserialize(de)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.budget.charge(SEQUENCE)?;
        let inner = self;
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(inner)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.budget.charge(MAPPING)?;
        let inner = self;
        let mut out = Map::new();
        // Once a merge has set keys, the keys the mapping gives itself
        // (before that, they are the keys of `out`): one given twice
        // refuses it.
        let mut own: Option<HashSet<String>> = None;
        while let Some(key) = map.next_key_seed(KeySeed { budget: self.budget })? {
            let value = map.next_value_seed(inner)?;
            if key == "<<" {
                if own.is_some() {
                    return Err(A::Error::custom("duplicate merge key `<<`"));
                }
                own = Some(out.keys().cloned().collect());
                // go-yaml's order: the last merged mapping first, so the
                // earlier ones overwrite it; all of them over what came
                // before the merge key.
                for source in merge_sources(value).map_err(A::Error::custom)?.into_iter().rev() {
                    out.extend(source);
                }
                continue;
            }
            let twice = match &mut own {
                None => out.contains_key(&key),
                Some(own) => !own.insert(key.clone()),
            };
            if twice {
                return Err(A::Error::custom(format!("duplicate key {key:?}")));
            }
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, _: A) -> Result<Value, A::Error> {
        Err(A::Error::custom("tagged values (`!tag`) are not Kubernetes objects"))
    }
}

/// What a merge key's value merges: one mapping, or a sequence of them.
fn merge_sources(value: Value) -> Result<Vec<Map<String, Value>>, String> {
    let want = "a merge key (`<<`) takes a mapping or a sequence of mappings";
    match value {
        Value::Object(m) => Ok(vec![m]),
        Value::Array(items) => {
            items.into_iter().map(|v| if let Value::Object(m) = v { Ok(m) } else { Err(want.to_string()) }).collect()
        }
        _ => Err(want.to_string()),
    }
}

/// A mapping key: a scalar, as its text (JSON objects have string keys).
struct KeySeed<'a> {
    budget: &'a Budget,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<String, D::Error> {
        de.deserialize_string(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a scalar mapping key")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
        self.budget.string(v)?;
        Ok(v.to_owned())
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<String, E> {
        self.budget.string(&v)?;
        Ok(v)
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<String, E> {
        self.visit_string(v.to_string())
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<String, E> {
        self.visit_string(v.to_string())
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<String, E> {
        self.visit_string(v.to_string())
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<String, E> {
        self.visit_string(v.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_merges_and_the_refusals() {
        let v = parse("a: 1\nb: [x, 2.5, true, ~]\nc: {d: \"e\"}\n").unwrap();
        assert_eq!(v, serde_json::json!({"a": 1, "b": ["x", 2.5, true, null], "c": {"d": "e"}}));
        // As go-yaml: the merge sets its keys where it stands (over `a`
        // before it, under `c` after it); the earlier merged mapping wins.
        let v = parse("x: &x {a: 1, b: 1}\ny: &y {b: 2, c: 2, d: 2}\nz: {a: 0, <<: [*x, *y], c: 3}\n").unwrap();
        assert_eq!(v["z"], serde_json::json!({"a": 1, "b": 1, "c": 3, "d": 2}));
        assert!(parse("x: &x {a: 1}\nz: {\"<<\" : *x}\n").unwrap_err().contains("quoted"));
        assert!(parse("x: &x {a: 1}\nz: {'<<': *x}\n").unwrap_err().contains("quoted"));
        assert_eq!(parse("note: \"<<\"\n").unwrap()["note"], "<<");
        assert!(parse("a: .nan\n").unwrap_err().contains("not a number"));
        assert!(parse("a: -.inf\n").unwrap_err().contains("not a number"));
        assert!(parse("a: 1\na: 2\n").unwrap_err().contains("duplicate key \"a\""));
        // Own keys stay single around a merge too.
        assert!(parse("x: &x {a: 1}\nz: {a: 0, <<: *x, a: 2}\n").unwrap_err().contains("duplicate key \"a\""));
        assert!(parse("x: &x {a: 1}\nz: {<<: *x, b: 0, b: 2}\n").unwrap_err().contains("duplicate key \"b\""));
        assert!(parse("x: &x {a: 1}\nz: {<<: *x, <<: *x}\n").unwrap_err().contains("duplicate merge key"));
        assert!(parse("x: &x 1\nz: {<<: *x}\n").unwrap_err().contains("merge key"));
        assert!(parse("a: !custom 1\n").unwrap_err().contains("tagged"));
        assert!(parse(&format!("a: {}{}\n", "[".repeat(200), "]".repeat(200))).is_err());
        // Past the flow depth the text is not parsed at all: `{a: ` nested
        // 100k deep costs libyaml's scanner minutes, the check a moment.
        let started = std::time::Instant::now();
        let err = parse(&"{a: ".repeat(100_000)).unwrap_err();
        assert!(err.contains("nested deeper than 128"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "{:?}", started.elapsed());
        // Brackets that close do not add up.
        assert!(parse(&format!("a: [{}]\n", vec!["[x]"; 1000].join(", "))).is_ok());
        assert_eq!(parse("").unwrap(), Value::Null);
        assert_eq!(parse("80: http\n").unwrap(), serde_json::json!({"80": "http"}));
    }

    #[test]
    fn expansion_stops_at_the_budget() {
        // 10^7 scalars from a 43 KB document: past 8 units per byte.
        let items = |what: &str, n: usize| vec![what; n].join(", ");
        let flat = format!("a: &a [{}]\nb: [{}]\n", items("x", 1_000), items("*a", 10_000));
        let err = parse(&flat).unwrap_err();
        assert!(err.contains("alias bomb"), "{err}");
        // A few repeats of an anchor are fine.
        let few = format!("a: &a [{}]\nb: [*a, *a, *a]\n", items("x", 1_000));
        assert_eq!(parse(&few).unwrap()["b"].as_array().unwrap().len(), 3);
        // Long strings repeated: the byte budget.
        let long = format!("a: &a {}\nb: [{}]\n", "y".repeat(100_000), items("*a", 20));
        assert!(parse(&long).unwrap_err().contains("byte budget"));
    }
}
