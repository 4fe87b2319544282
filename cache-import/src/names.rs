//! What several importers share: `name=value,...` file names, JSON values as canonical values
//! (integers, strings, booleans, lists, maps; anything else kept whole as JSON text), and
//! JSON text written back.

use cache_core::cache_format::{Fields, Value};

use crate::tree::{Json, Node};

/// `E=8,N=14336,device_name=X,block_shape=[128,128]` as its fields in order; `None` if a part
/// has no `=` or a name is empty. Commas inside brackets belong to the value.
pub(crate) fn split_fields(stem: &str) -> Option<Vec<(String, String)>> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in stem.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&stem[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&stem[start..]);
    parts
        .into_iter()
        .map(|p| {
            let (k, v) = p.split_once('=')?;
            (!k.is_empty()).then(|| (k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// A file-name value as a canonical value: an integer, a list of them (`[128,128]`), or
/// the text.
pub(crate) fn typed(text: &str) -> Value {
    if let Some(i) = int_text(text) {
        return Value::Int(i);
    }
    if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        let items: Option<Vec<Value>> = if inner.is_empty() {
            Some(Vec::new())
        } else {
            inner
                .split(',')
                .map(|p| int_text(p.trim()).map(Value::Int))
                .collect()
        };
        if let Some(items) = items {
            return Value::List(items);
        }
    }
    Value::from(text)
}

/// An integer written the one way `i64` prints it (so `007` or `+1` stay text and a file name
/// written back is the same).
fn int_text(text: &str) -> Option<i64> {
    text.parse::<i64>().ok().filter(|i| i.to_string() == text)
}

/// A JSON value as a canonical value; `None` for a float, a null, or an integer outside i64.
pub(crate) fn to_value(node: &Node) -> Option<Value> {
    Some(match &node.value {
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(_) => Value::Int(node.as_int()?),
        Json::Str(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::List(items.iter().map(to_value).collect::<Option<_>>()?),
        Json::Object(members) => Value::Map(object_fields(members)?),
        Json::Null => return None,
    })
}

fn object_fields(members: &[(String, Node)]) -> Option<Fields> {
    let mut fields = Fields::new();
    for (k, v) in members {
        fields.insert(k.clone(), to_value(v)?);
    }
    Some(fields)
}

/// A JSON object's members as params: each as its canonical value, or, if one of them has no
/// canonical value (a float), the whole object as `{"json": <compact JSON, sorted keys>}`.
pub(crate) fn params_of(members: &[(String, Node)]) -> Fields {
    object_fields(members).unwrap_or_else(|| {
        Fields::from([("json".to_owned(), Value::from(compact_sorted(members)))])
    })
}

/// Compact JSON of an object with its members sorted by name.
pub(crate) fn compact_sorted(members: &[(String, Node)]) -> String {
    let mut sorted: Vec<&(String, Node)> = members.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::from("{");
    for (i, (k, v)) in sorted.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(&mut out, k);
        out.push(':');
        write_compact(&mut out, v);
    }
    out.push('}');
    out
}

fn write_compact(out: &mut String, node: &Node) {
    match &node.value {
        Json::Object(members) => out.push_str(&compact_sorted(members)),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_compact(out, item);
            }
            out.push(']');
        }
        other => write_scalar(out, other),
    }
}

/// A scalar as JSON text (numbers as the source wrote them).
pub(crate) fn write_scalar(out: &mut String, value: &Json) {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(t) => out.push_str(t),
        Json::Str(s) => write_string(out, s),
        Json::Array(_) | Json::Object(_) => {}
    }
}

/// A JSON string as Python's `json.dumps` writes it (non-ASCII escaped).
pub(crate) fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A canonical value as JSON text (compact).
pub(crate) fn value_json(out: &mut String, value: &Value) {
    match value {
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => out.push_str(&i.to_string()),
        Value::Str(s) => write_string(out, s),
        Value::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                value_json(out, item);
            }
            out.push(']');
        }
        Value::Map(fields) => {
            out.push('{');
            for (i, (k, v)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, k);
                out.push(':');
                value_json(out, v);
            }
            out.push('}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_name_fields_keep_bracketed_commas_and_type_their_values() {
        let got = split_fields(
            "N=1536,K=7168,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128,128]",
        )
        .expect("fields");
        let names: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["N", "K", "device_name", "dtype", "block_shape"]);
        assert_eq!(
            typed(&got[4].1),
            Value::List(vec![Value::Int(128), Value::Int(128)])
        );
        assert_eq!(typed("14336"), Value::Int(14336));
        assert_eq!(typed("007"), Value::from("007"));
        assert_eq!(
            typed("NVIDIA_H100_80GB_HBM3"),
            Value::from("NVIDIA_H100_80GB_HBM3")
        );
        assert!(split_fields("E=8,oops").is_none());
        assert!(split_fields("=8").is_none());
    }
}
