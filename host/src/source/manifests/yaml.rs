//! One YAML document into a JSON value: serde_norway's parser (libyaml's,
//! translated to Rust) reads the text, and kpx's own visitor builds the
//! value, so the rules that matter for untrusted files are kpx's:
//!
//! - **Bounded expansion.** An alias replays its anchor's events, so a
//!   small document can stand for billions of nodes. The visitor counts
//!   every node and every string byte it builds and stops the document at
//!   [`NODES_PER_BYTE`] and [`BYTES_PER_BYTE`] times the document's own
//!   length (a document without aliases stays far below both): time and
//!   memory stay proportional to the text read.
//! - **Merge keys** (`<<: *anchor`, `<<: [*a, *b]`), as kubectl reads them:
//!   the merged mappings fill in the keys the mapping does not give itself,
//!   the earlier of several merged mappings first.
//! - **Duplicate keys** refuse the document (YAML forbids them; a parser
//!   that let the last one win would program a name the file's reader did
//!   not see).
//!
//! libyaml's parser is 2.5x serde-saphyr's speed here (a 10k Services x 10
//! endpoints dump in about 300 ms against 640-800 ms on two threads).

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, EnumAccess, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Nodes (scalars, sequences, mappings) a document may build per byte of
/// its text, past [`FLOOR`].
pub const NODES_PER_BYTE: usize = 4;
/// String bytes a document may build per byte of its text, past [`FLOOR`].
pub const BYTES_PER_BYTE: usize = 4;
/// What any document may build, however short.
pub const FLOOR: usize = 64 * 1024;
/// Nesting deeper than this refuses the document.
pub const MAX_DEPTH: usize = 128;

/// The value of `doc`, a single YAML document (null when it is empty), or
/// why it is not one kpx reads.
pub fn parse(doc: &str) -> Result<Value, String> {
    let budget = Budget {
        nodes: Cell::new(FLOOR + NODES_PER_BYTE * doc.len()),
        bytes: Cell::new(FLOOR + BYTES_PER_BYTE * doc.len()),
    };
    let de = serde_norway::Deserializer::from_str(doc);
    ValueSeed { budget: &budget, depth: 0 }.deserialize(de).map_err(|e| e.to_string())
}

/// What is left to build.
struct Budget {
    nodes: Cell<usize>,
    bytes: Cell<usize>,
}

impl Budget {
    fn node<E: serde::de::Error>(&self) -> Result<(), E> {
        let left = self.nodes.get();
        if left == 0 {
            return Err(E::custom(
                "the document expands past its node budget (aliases repeating anchors): refused as an alias bomb",
            ));
        }
        self.nodes.set(left - 1);
        Ok(())
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
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Value, D::Error> {
        if self.depth > MAX_DEPTH {
            return Err(D::Error::custom(format!("nested deeper than {MAX_DEPTH} levels")));
        }
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
        // As serde_json's own value: no JSON number for NaN or infinities.
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
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
        self.budget.node()?;
        let inner = ValueSeed { budget: self.budget, depth: self.depth + 1 };
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(inner)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.budget.node()?;
        let inner = ValueSeed { budget: self.budget, depth: self.depth + 1 };
        let mut out = Map::new();
        let mut merged: Option<Vec<Map<String, Value>>> = None;
        while let Some(key) = map.next_key_seed(KeySeed { budget: self.budget })? {
            let value = map.next_value_seed(inner)?;
            if key == "<<" {
                if merged.is_some() {
                    return Err(A::Error::custom("duplicate merge key `<<`"));
                }
                merged = Some(merge_sources(value).map_err(A::Error::custom)?);
                continue;
            }
            if out.contains_key(&key) {
                return Err(A::Error::custom(format!("duplicate key {key:?}")));
            }
            out.insert(key, value);
        }
        // The mapping's own keys first; then each merged mapping's others,
        // the earlier mapping winning.
        for source in merged.into_iter().flatten() {
            for (k, v) in source {
                out.entry(k).or_insert(v);
            }
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
        // Own keys win over merged ones, wherever the merge key stands;
        // the earlier merged mapping wins over the later.
        let v = parse("x: &x {a: 1, b: 1}\ny: &y {b: 2, c: 2}\nz: {a: 0, <<: [*x, *y]}\n").unwrap();
        assert_eq!(v["z"], serde_json::json!({"a": 0, "b": 1, "c": 2}));
        assert!(parse("a: 1\na: 2\n").unwrap_err().contains("duplicate key \"a\""));
        assert!(parse("x: &x 1\nz: {<<: *x}\n").unwrap_err().contains("merge key"));
        assert!(parse("a: !custom 1\n").unwrap_err().contains("tagged"));
        assert!(parse(&format!("a: {}{}\n", "[".repeat(200), "]".repeat(200))).is_err());
        assert_eq!(parse("").unwrap(), Value::Null);
        assert_eq!(parse("80: http\n").unwrap(), serde_json::json!({"80": "http"}));
    }

    #[test]
    fn expansion_stops_at_the_budget() {
        // 10^7 nodes from a 43 KB document: past 4 x its length.
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
