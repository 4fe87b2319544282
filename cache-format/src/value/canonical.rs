//! The canonical encoding of values (FORMAT.md, "Canonical encoding"): what every fingerprint
//! hashes, so it is the same bytes in every language.

use super::{Fields, Value};

/// Appends the canonical msgpack encoding of `fields` (a map) to `out`.
///
/// The rules (FORMAT.md, "Canonical encoding"): maps with keys sorted by their UTF-8 bytes,
/// integers in the smallest msgpack representation (non-negative values as positive fixint or
/// uint8/16/32/64, negative values as negative fixint or int8/16/32/64), strings as
/// fixstr/str8/str16/str32 and lists and maps with the smallest length header. This is what
/// common msgpack libraries produce for a map whose keys were inserted in sorted order.
pub fn encode_fields(fields: &Fields, out: &mut Vec<u8>) {
    write_map_len(out, fields.len());
    for (name, value) in fields {
        write_str(out, name);
        encode_value(value, out);
    }
}

/// Appends the canonical msgpack encoding of `value` to `out`; see [`encode_fields`].
pub(crate) fn encode_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Bool(false) => out.push(0xc2),
        Value::Bool(true) => out.push(0xc3),
        Value::Int(i) => write_int(out, *i),
        Value::Str(s) => write_str(out, s),
        Value::List(items) => {
            write_array_len(out, items.len());
            for item in items {
                encode_value(item, out);
            }
        }
        Value::Map(fields) => encode_fields(fields, out),
    }
}

fn write_int(out: &mut Vec<u8>, v: i64) {
    if v >= 0 {
        let u = v as u64;
        if u < 0x80 {
            out.push(u as u8);
        } else if u <= u64::from(u8::MAX) {
            out.extend_from_slice(&[0xcc, u as u8]);
        } else if u <= u64::from(u16::MAX) {
            out.push(0xcd);
            out.extend_from_slice(&(u as u16).to_be_bytes());
        } else if u <= u64::from(u32::MAX) {
            out.push(0xce);
            out.extend_from_slice(&(u as u32).to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&u.to_be_bytes());
        }
    } else if v >= -32 {
        out.push(v as i8 as u8);
    } else if v >= i64::from(i8::MIN) {
        out.extend_from_slice(&[0xd0, v as i8 as u8]);
    } else if v >= i64::from(i16::MIN) {
        out.push(0xd1);
        out.extend_from_slice(&(v as i16).to_be_bytes());
    } else if v >= i64::from(i32::MIN) {
        out.push(0xd2);
        out.extend_from_slice(&(v as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    let len = s.len();
    if len < 32 {
        out.push(0xa0 | len as u8);
    } else if len <= usize::from(u8::MAX) {
        out.extend_from_slice(&[0xd9, len as u8]);
    } else if len <= usize::from(u16::MAX) {
        out.push(0xda);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
    out.extend_from_slice(s.as_bytes());
}

pub(crate) fn write_array_len(out: &mut Vec<u8>, len: usize) {
    if len < 16 {
        out.push(0x90 | len as u8);
    } else if len <= usize::from(u16::MAX) {
        out.push(0xdc);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}

fn write_map_len(out: &mut Vec<u8>, len: usize) {
    if len < 16 {
        out.push(0x80 | len as u8);
    } else if len <= usize::from(u16::MAX) {
        out.push(0xde);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdf);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}
