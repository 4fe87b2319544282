//! A bounded structural check of msgpack bytes, run before any decoder allocates.
//!
//! It walks one value without recursion or allocation beyond a small stack of open
//! containers, and fails on: nesting deeper than the limit, a string, binary or extension
//! longer than the bytes that remain, an array or map announcing more elements than the
//! remaining bytes could hold, and the never-used marker 0xc1. After it passes, every length
//! a decoder sees is backed by real bytes, so decoding cannot allocate more than a small
//! multiple of the input size.

use crate::error::FormatError;

/// Bounds applied to every decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest snapshot or journal file accepted, in bytes.
    pub max_file_bytes: u64,
    /// Largest envelope header accepted, in bytes.
    pub max_header_bytes: u64,
    /// Deepest nesting of arrays and maps accepted.
    pub max_depth: u32,
    /// Most scopes in one file or record.
    pub max_scopes: u64,
    /// Most namespaces in one file or record, over all its scopes.
    pub max_namespaces: u64,
    /// Most candidates in one entry.
    pub max_candidates: u64,
    /// Most fields in one key, scope or params map.
    pub max_fields: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_bytes: 1 << 30,
            max_header_bytes: 64 << 10,
            max_depth: 32,
            max_scopes: 4096,
            max_namespaces: 1 << 16,
            max_candidates: crate::model::MAX_CANDIDATES as u64,
            max_fields: 256,
        }
    }
}

impl Limits {
    /// The deepest value (see [`crate::Value::depth`]) a candidate param may hold and still be
    /// read under these limits: a param value sits 9 containers into a payload (payload,
    /// scopes, scope, namespaces, entry list, entry, candidates, candidate, params).
    pub fn max_param_depth(&self) -> u32 {
        self.max_depth.saturating_sub(9)
    }

    /// The deepest value a key field may hold (7 containers in: payload, scopes, scope,
    /// namespaces, entry list, entry, key).
    pub fn max_key_field_depth(&self) -> u32 {
        self.max_depth.saturating_sub(7)
    }

    /// The deepest value a scope field may hold (4 containers in: payload, scopes, scope,
    /// its fields).
    pub fn max_scope_field_depth(&self) -> u32 {
        self.max_depth.saturating_sub(4)
    }
}

/// Checks that one complete msgpack value starts at `start` and returns where it ends.
pub(crate) fn scan_value(
    buf: &[u8],
    start: usize,
    what: &'static str,
    max_depth: u32,
) -> Result<usize, FormatError> {
    let mut pos = start;
    // Elements still expected by each open container, innermost last.
    let mut open: Vec<u64> = Vec::new();
    loop {
        let marker = *buf.get(pos).ok_or_else(|| truncated(what, pos, 1, buf))?;
        let at = pos;
        pos += 1;
        let container;
        (pos, container) = advance(buf, pos, marker, what)?;
        if let Some(items) = container {
            let remaining = (buf.len() - pos) as u64;
            if items > remaining {
                return Err(FormatError::Truncated {
                    what,
                    offset: at as u64,
                    needed: items,
                    available: remaining,
                });
            }
            if items > 0 {
                if open.len() as u32 >= max_depth {
                    return Err(FormatError::TooDeep {
                        what,
                        offset: at as u64,
                        limit: max_depth,
                    });
                }
                open.push(items);
                continue;
            }
        }
        // One value completed: count it against the enclosing containers.
        loop {
            match open.last_mut() {
                None => return Ok(pos),
                Some(left) => {
                    *left -= 1;
                    if *left > 0 {
                        break;
                    }
                    open.pop();
                }
            }
        }
    }
}

/// Past one msgpack marker at `pos - 1` (`pos` is just after it): where its value's bytes end,
/// or, for a container, where its elements begin and how many there are.
#[inline(always)]
fn advance(
    buf: &[u8],
    mut pos: usize,
    marker: u8,
    what: &'static str,
) -> Result<(usize, Option<u64>), FormatError> {
    let at = pos - 1;
    let mut container: Option<u64> = None;
    match marker {
        0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => {}
        0x80..=0x8f => container = Some(2 * u64::from(marker & 0x0f)),
        0x90..=0x9f => container = Some(u64::from(marker & 0x0f)),
        0xa0..=0xbf => pos = skip(buf, pos, u64::from(marker & 0x1f), what)?,
        0xc1 => return Err(FormatError::malformed(what, at, "reserved marker 0xc1")),
        0xc4 | 0xd9 => {
            let len = read_be(buf, pos, 1, what)?;
            pos = skip(buf, pos + 1, len, what)?;
        }
        0xc5 | 0xda => {
            let len = read_be(buf, pos, 2, what)?;
            pos = skip(buf, pos + 2, len, what)?;
        }
        0xc6 | 0xdb => {
            let len = read_be(buf, pos, 4, what)?;
            pos = skip(buf, pos + 4, len, what)?;
        }
        0xc7 => {
            let len = read_be(buf, pos, 1, what)?;
            pos = skip(buf, pos + 1, len + 1, what)?;
        }
        0xc8 => {
            let len = read_be(buf, pos, 2, what)?;
            pos = skip(buf, pos + 2, len + 1, what)?;
        }
        0xc9 => {
            let len = read_be(buf, pos, 4, what)?;
            pos = skip(buf, pos + 4, len + 1, what)?;
        }
        0xca => pos = skip(buf, pos, 4, what)?,
        0xcb => pos = skip(buf, pos, 8, what)?,
        0xcc | 0xd0 => pos = skip(buf, pos, 1, what)?,
        0xcd | 0xd1 => pos = skip(buf, pos, 2, what)?,
        0xce | 0xd2 => pos = skip(buf, pos, 4, what)?,
        0xcf | 0xd3 => pos = skip(buf, pos, 8, what)?,
        0xd4 => pos = skip(buf, pos, 2, what)?,
        0xd5 => pos = skip(buf, pos, 3, what)?,
        0xd6 => pos = skip(buf, pos, 5, what)?,
        0xd7 => pos = skip(buf, pos, 9, what)?,
        0xd8 => pos = skip(buf, pos, 17, what)?,
        0xdc => {
            container = Some(read_be(buf, pos, 2, what)?);
            pos += 2;
        }
        0xdd => {
            container = Some(read_be(buf, pos, 4, what)?);
            pos += 4;
        }
        0xde => {
            container = Some(2 * read_be(buf, pos, 2, what)?);
            pos += 2;
        }
        0xdf => {
            container = Some(2 * read_be(buf, pos, 4, what)?);
            pos += 4;
        }
    }
    Ok((pos, container))
}

fn truncated(what: &'static str, pos: usize, needed: u64, buf: &[u8]) -> FormatError {
    FormatError::Truncated {
        what,
        offset: pos as u64,
        needed,
        available: buf.len().saturating_sub(pos) as u64,
    }
}

fn read_be(buf: &[u8], pos: usize, width: usize, what: &'static str) -> Result<u64, FormatError> {
    let bytes = buf
        .get(pos..pos + width)
        .ok_or_else(|| truncated(what, pos, width as u64, buf))?;
    Ok(bytes.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
}

fn skip(buf: &[u8], pos: usize, len: u64, what: &'static str) -> Result<usize, FormatError> {
    let available = buf.len().saturating_sub(pos) as u64;
    if len > available {
        return Err(FormatError::Truncated {
            what,
            offset: pos as u64,
            needed: len,
            available,
        });
    }
    Ok(pos + len as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_nested_values_and_returns_their_end() {
        // {"a": [1, 2, {"b": true}]} followed by a trailing byte
        let bytes = [0x81, 0xa1, b'a', 0x93, 1, 2, 0x81, 0xa1, b'b', 0xc3, 0xff];
        assert_eq!(scan_value(&bytes, 0, "test", 8), Ok(10));
    }

    #[test]
    fn rejects_a_huge_array_header_without_allocating() {
        let bytes = [0xdd, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert!(matches!(
            scan_value(&bytes, 0, "test", 8),
            Err(FormatError::Truncated {
                needed: 0xffff_ffff,
                ..
            })
        ));
    }

    #[test]
    fn rejects_a_huge_string_length() {
        let bytes = [0xdb, 0x7f, 0xff, 0xff, 0xff, b'x'];
        assert!(matches!(
            scan_value(&bytes, 0, "test", 8),
            Err(FormatError::Truncated { .. })
        ));
    }

    #[test]
    fn rejects_deep_nesting() {
        let bytes = vec![0x91; 100];
        assert!(matches!(
            scan_value(&bytes, 0, "test", 32),
            Err(FormatError::TooDeep { .. })
        ));
    }

    #[test]
    fn rejects_the_reserved_marker() {
        assert!(matches!(
            scan_value(&[0xc1], 0, "test", 8),
            Err(FormatError::Malformed { .. })
        ));
    }
}
