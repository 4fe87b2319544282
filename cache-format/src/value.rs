//! Canonical values: the only data that may appear in keys, scopes and candidate params,
//! and their canonical msgpack encoding (the input of every fingerprint).

use std::fmt;

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A named record of canonical values, ordered by field name, each name at most once.
///
/// Keys, scopes and candidate params are all `Fields`. The order is the byte order of the
/// UTF-8 names, which is also the order of the canonical encoding. It is a sorted vector, not
/// a tree: these records have a handful of fields, and a B-tree node costs several hundred
/// bytes even for two of them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Fields(Vec<(String, Value)>);

impl Fields {
    /// No fields.
    pub fn new() -> Self {
        Fields(Vec::new())
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| n.as_str().cmp(name))
    }

    /// Sets a field; returns the value it replaces.
    pub fn insert(&mut self, name: impl Into<String>, value: Value) -> Option<Value> {
        let name = name.into();
        // Fast path: fields usually arrive in order (files and structs keep them sorted).
        if self.0.last().is_none_or(|(last, _)| *last < name) {
            self.0.push((name, value));
            return None;
        }
        match self.position(&name) {
            Ok(at) => Some(std::mem::replace(&mut self.0[at].1, value)),
            Err(at) => {
                self.0.insert(at, (name, value));
                None
            }
        }
    }

    /// The value of a field.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.position(name).ok().map(|at| &self.0[at].1)
    }

    /// The value of a field, mutably.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Value> {
        self.position(name).ok().map(|at| &mut self.0[at].1)
    }

    /// Removes a field; returns its value.
    pub fn remove(&mut self, name: &str) -> Option<Value> {
        self.position(name).ok().map(|at| self.0.remove(at).1)
    }

    /// Whether the field is present.
    pub fn contains_key(&self, name: &str) -> bool {
        self.position(name).is_ok()
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no fields.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The fields in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&String, &Value)> {
        self.0.iter().map(|(n, v)| (n, v))
    }

    /// The names in order.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &String> {
        self.0.iter().map(|(n, _)| n)
    }
}

impl FromIterator<(String, Value)> for Fields {
    /// Like collecting into a map: sorted by name, a repeated name keeps its last value.
    /// O(n log n) whatever the order (one insertion at a time into the sorted vector would be
    /// quadratic for a hostile, unsorted map).
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(iter: I) -> Self {
        let mut items: Vec<(String, Value)> = iter.into_iter().collect();
        // Stable: equal names keep their order, so the last one written is the last here.
        items.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(String, Value)> = Vec::with_capacity(items.len());
        for item in items {
            match out.last_mut() {
                Some(last) if last.0 == item.0 => *last = item,
                _ => out.push(item),
            }
        }
        Fields(out)
    }
}

impl<const N: usize> From<[(String, Value); N]> for Fields {
    fn from(items: [(String, Value); N]) -> Self {
        items.into_iter().collect()
    }
}

impl IntoIterator for Fields {
    type Item = (String, Value);
    type IntoIter = std::vec::IntoIter<(String, Value)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a Fields {
    type Item = (&'a String, &'a Value);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (String, Value)>,
        fn(&'a (String, Value)) -> (&'a String, &'a Value),
    >;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(n, v)| (n, v))
    }
}

impl Serialize for Fields {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (n, v) in &self.0 {
            map.serialize_entry(n, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match deserializer.deserialize_map(ValueVisitor)? {
            Value::Map(fields) => Ok(fields),
            _ => Err(de::Error::custom("expected a map of named fields")),
        }
    }
}

/// A canonical value.
///
/// Deliberately small: booleans, signed 64-bit integers, strings, lists and maps with string
/// keys. There are no floats (two equal-looking floats may differ in their bits, and a key
/// must hash the same everywhere) and no null (an absent optional field is simply absent,
/// so adding an optional field to a key type does not change existing fingerprints).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Value {
    /// `true` or `false`.
    Bool(bool),
    /// A signed integer; unsigned values above `i64::MAX` are rejected.
    Int(i64),
    /// A UTF-8 string.
    Str(String),
    /// An ordered list.
    List(Vec<Value>),
    /// A map from field names to values, ordered by name.
    Map(Fields),
}

impl Value {
    /// How many levels of lists and maps this value nests (0 for a scalar, 1 for a list of
    /// scalars). Computed without recursion, so a hostile value cannot overflow the stack.
    pub fn depth(&self) -> u32 {
        // Most values are scalars, or lists and maps of scalars: answered without the stack
        // (a put checks the depth of every key field and param).
        let scalar = |v: &Value| !matches!(v, Value::List(_) | Value::Map(_));
        match self {
            Value::List(items) if items.iter().all(scalar) => return 1,
            Value::Map(fields) if fields.iter().all(|(_, v)| scalar(v)) => return 1,
            Value::List(_) | Value::Map(_) => {}
            _ => return 0,
        }
        let mut deepest = 0;
        let mut stack: Vec<(&Value, u32)> = vec![(self, 0)];
        while let Some((v, d)) = stack.pop() {
            let children: Box<dyn Iterator<Item = &Value>> = match v {
                Value::List(items) => Box::new(items.iter()),
                Value::Map(fields) => Box::new(fields.iter().map(|(_, v)| v)),
                _ => {
                    deepest = deepest.max(d);
                    continue;
                }
            };
            deepest = deepest.max(d + 1);
            stack.extend(children.map(|c| (c, d + 1)));
        }
        deepest
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_owned())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(v)
    }
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::Int(i64::from(v))
            }
        }
    )*};
}
from_int!(i8, i16, i32, i64, u8, u16, u32);

impl<T: Into<Value>> From<Vec<T>> for Value {
    fn from(v: Vec<T>) -> Self {
        Value::List(v.into_iter().map(Into::into).collect())
    }
}

impl fmt::Display for Value {
    /// Compact JSON-like rendering, used in messages and by the CLI's table output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Str(s) => write!(f, "{s:?}"),
            Value::List(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            Value::Map(fields) => write_fields(f, fields),
        }
    }
}

/// Writes `fields` as a compact JSON-like object.
pub(crate) fn write_fields(f: &mut fmt::Formatter<'_>, fields: &Fields) -> fmt::Result {
    f.write_str("{")?;
    for (i, (name, value)) in fields.iter().enumerate() {
        if i > 0 {
            f.write_str(",")?;
        }
        write!(f, "{name:?}:{value}")?;
    }
    f.write_str("}")
}

mod canonical;

pub use canonical::encode_fields;
pub(crate) use canonical::{encode_value, write_array_len};

impl TryFrom<&rmpv::Value> for Value {
    type Error = String;

    /// Converts a schema-less value, applying the same rules as decoding (no floats, no nil,
    /// string map keys, integers within i64).
    fn try_from(v: &rmpv::Value) -> Result<Self, String> {
        Ok(match v {
            rmpv::Value::Boolean(b) => Value::Bool(*b),
            rmpv::Value::Integer(i) => Value::Int(
                i.as_i64()
                    .ok_or_else(|| format!("integer {i} is larger than i64::MAX"))?,
            ),
            rmpv::Value::String(s) => Value::Str(
                s.as_str()
                    .ok_or_else(|| "a string is not valid UTF-8".to_owned())?
                    .to_owned(),
            ),
            rmpv::Value::Array(items) => Value::List(
                items
                    .iter()
                    .map(Value::try_from)
                    .collect::<Result<_, _>>()?,
            ),
            rmpv::Value::Map(items) => {
                let mut fields = Fields::new();
                for (k, v) in items {
                    let name = k
                        .as_str()
                        .ok_or_else(|| "a map key is not a string".to_owned())?;
                    if fields
                        .insert(name.to_owned(), Value::try_from(v)?)
                        .is_some()
                    {
                        return Err(format!("duplicate field {name:?}"));
                    }
                }
                Value::Map(fields)
            }
            rmpv::Value::Nil => return Err("null is not allowed in keys, scopes or params".into()),
            rmpv::Value::F32(_) | rmpv::Value::F64(_) => {
                return Err("floats are not allowed in keys, scopes or params".into());
            }
            rmpv::Value::Binary(_) | rmpv::Value::Ext(..) => {
                return Err("binary data is not allowed in keys, scopes or params".into());
            }
        })
    }
}

impl From<&Value> for rmpv::Value {
    fn from(v: &Value) -> Self {
        match v {
            Value::Bool(b) => rmpv::Value::Boolean(*b),
            Value::Int(i) => rmpv::Value::from(*i),
            Value::Str(s) => rmpv::Value::from(s.as_str()),
            Value::List(items) => rmpv::Value::Array(items.iter().map(Into::into).collect()),
            Value::Map(fields) => rmpv::Value::Map(
                fields
                    .iter()
                    .map(|(k, v)| (rmpv::Value::from(k.as_str()), v.into()))
                    .collect(),
            ),
        }
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Bool(b) => serializer.serialize_bool(*b),
            Value::Int(i) => serializer.serialize_i64(*i),
            Value::Str(s) => serializer.serialize_str(s),
            Value::List(items) => items.serialize(serializer),
            Value::Map(fields) => fields.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a boolean, an integer, a string, a list or a map with string keys")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        i64::try_from(v)
            .map(Value::Int)
            .map_err(|_| E::custom(out_of_range(&v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        // A JSON integer outside 64 bits arrives as a float, already rounded: say about
        // which it is (its rounded digits named another integer: -2^63 for -2^63 - 1).
        if v.is_finite() && v.fract() == 0.0 && v.abs() >= 9.223_372_036_854_776e18 {
            return Err(E::custom(out_of_range(&format_args!("near {v:e}"))));
        }
        Err(E::custom(format_args!(
            "floats are not allowed in keys, scopes or params (got {v}); use an integer or a string"
        )))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::Str(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Err(E::custom(
            "null is not allowed in keys, scopes or params; leave the field out",
        ))
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::List(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        // Sized from the header (msgpack gives it; the census has bounded it to 256 fields),
        // so a decoded map holds no spare slots: most maps in a cache are small, and a
        // one-field map grown by pushing would keep room for four.
        let mut items: Vec<(String, Value)> =
            Vec::with_capacity(map.size_hint().unwrap_or(0).min(256));
        while let Some(name) = map.next_key::<String>()? {
            let value = map.next_value()?;
            items.push((name, value));
        }
        // Sorted once (a field at a time would be quadratic for an unsorted map).
        items.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(w) = items.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(de::Error::custom(format_args!(
                "duplicate field {:?}",
                w[0].0
            )));
        }
        Ok(Value::Map(Fields(items)))
    }
}

fn out_of_range(v: &dyn std::fmt::Display) -> String {
    format!(
        "the integer {v} is out of range: keys, scopes and params hold 64-bit signed integers (-9223372036854775808 to 9223372036854775807); use a string for larger numbers"
    )
}

#[cfg(test)]
mod tests {
    /// Depth counts every list and map, empty ones too, whichever path answers it.
    #[test]
    fn depth_counts_lists_and_maps_empty_or_not() {
        let map = |v: Value| Value::Map(Fields::from([("x".to_owned(), v)]));
        assert_eq!(Value::Int(1).depth(), 0);
        assert_eq!(Value::Str(String::new()).depth(), 0);
        assert_eq!(Value::List(vec![]).depth(), 1);
        assert_eq!(Value::Map(Fields::new()).depth(), 1);
        assert_eq!(
            Value::List(vec![Value::Int(1), Value::Bool(true)]).depth(),
            1
        );
        assert_eq!(map(Value::Int(1)).depth(), 1);
        assert_eq!(
            Value::List(vec![Value::Int(1), Value::List(vec![])]).depth(),
            2
        );
        assert_eq!(map(map(Value::List(vec![Value::Int(1)]))).depth(), 3);
        let mut deep = Value::Int(0);
        for _ in 0..1000 {
            deep = Value::List(vec![deep]);
        }
        assert_eq!(deep.depth(), 1000);
    }

    #[test]
    fn fields_built_in_any_order_are_sorted_and_the_last_value_wins() {
        let items = (0..1000).rev().map(|i| (format!("f{i:04}"), Value::Int(i)));
        let fields: Fields = items
            .chain([("f0001".to_owned(), Value::Int(-1))])
            .collect();
        assert_eq!(fields.len(), 1000);
        assert!(fields.iter().map(|(k, _)| k).is_sorted());
        assert_eq!(fields.get("f0001"), Some(&Value::Int(-1)));
    }

    #[test]
    fn a_decoded_map_with_a_repeated_name_is_refused() {
        let unsorted = r#"{"z":1,"a":2,"m":3}"#;
        let v: Value = serde_json::from_str(unsorted).expect("decodes");
        let Value::Map(fields) = v else {
            panic!("a map");
        };
        assert_eq!(
            fields.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["a", "m", "z"]
        );
        let err = serde_json::from_str::<Value>(r#"{"b":1,"a":2,"b":3}"#).expect_err("duplicate");
        assert!(err.to_string().contains("duplicate field \"b\""), "{err}");
    }

    use super::*;

    fn enc(v: Value) -> Vec<u8> {
        let mut out = Vec::new();
        encode_value(&v, &mut out);
        out
    }

    #[test]
    fn integers_use_the_smallest_representation() {
        assert_eq!(enc(Value::Int(0)), [0x00]);
        assert_eq!(enc(Value::Int(127)), [0x7f]);
        assert_eq!(enc(Value::Int(128)), [0xcc, 0x80]);
        assert_eq!(enc(Value::Int(256)), [0xcd, 0x01, 0x00]);
        assert_eq!(enc(Value::Int(65536)), [0xce, 0, 1, 0, 0]);
        assert_eq!(enc(Value::Int(1 << 32)), [0xcf, 0, 0, 0, 1, 0, 0, 0, 0]);
        assert_eq!(enc(Value::Int(-1)), [0xff]);
        assert_eq!(enc(Value::Int(-32)), [0xe0]);
        assert_eq!(enc(Value::Int(-33)), [0xd0, 0xdf]);
        assert_eq!(enc(Value::Int(-129)), [0xd1, 0xff, 0x7f]);
        assert_eq!(enc(Value::Int(i64::MIN))[0], 0xd3);
    }

    #[test]
    fn strings_and_containers_use_the_smallest_header() {
        assert_eq!(enc(Value::from("ab")), [0xa2, b'a', b'b']);
        assert_eq!(enc(Value::from("x".repeat(32)))[..2], [0xd9, 32]);
        assert_eq!(enc(Value::from("x".repeat(256)))[..3], [0xda, 1, 0]);
        assert_eq!(enc(Value::List(vec![Value::Int(1); 15]))[0], 0x9f);
        assert_eq!(
            enc(Value::List(vec![Value::Int(1); 16]))[..3],
            [0xdc, 0, 16]
        );
    }

    #[test]
    fn map_fields_are_sorted_by_name() {
        let mut fields = Fields::new();
        fields.insert("n", Value::Int(2));
        fields.insert("k", Value::Int(3));
        fields.insert("m", Value::Int(1));
        assert_eq!(
            enc(Value::Map(fields)),
            [0x83, 0xa1, b'k', 3, 0xa1, b'm', 1, 0xa1, b'n', 2]
        );
    }
}
