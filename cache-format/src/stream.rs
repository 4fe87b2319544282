//! Walking a format-1 payload entry by entry, without building the model: for readers that
//! count, check or print entries one at a time in constant memory (`tunecache stats`,
//! `verify`, `list`, `export`). The payload need not have been scanned first: every length is
//! checked against the bytes as the walk goes, and each scope and entry is scanned with the
//! nesting bound it has inside a payload before it is handed out or decoded. (The census caps
//! are not applied: entries are decoded one at a time, so memory is bounded by the largest
//! entry, not the payload; `verify` checks the caps separately.)

use std::ops::ControlFlow;

use rmp::Marker;

use crate::error::FormatError;
use crate::fastcheck::EntryFacts;
use crate::fingerprint::Fingerprint;
use crate::model::{Entry, Scope};
use crate::scan::{Limits, scan_value};
use crate::value::Fields;
use crate::wire;

/// Calls `visit` with each entry's scope, namespace and encoded bytes, in file order, until it
/// returns `Break`. The scope is decoded once per scope. An error is a payload whose shape is
/// not FORMAT.md's (the decoder would refuse it as well).
pub fn walk_payload(
    payload: &[u8],
    limits: &Limits,
    mut visit: impl FnMut(&Scope, &str, &[u8]) -> ControlFlow<()>,
) -> Result<(), FormatError> {
    // Containers above a scope's fields: payload, scopes, scope. Above an entry: those,
    // namespaces and the entry list. (The same bound a whole-payload scan applies.)
    let scope_depth = limits.max_depth.saturating_sub(3);
    let entry_depth = limits.max_depth.saturating_sub(5);
    let mut w = Walker {
        bytes: payload,
        pos: 0,
    };
    let scopes = w.field_ranges(&["scopes"])?;
    let Some(scopes) = scopes[0].clone() else {
        return Err(shape("a payload without scopes"));
    };
    w.pos = scopes.start;
    let n = w.array_len("the scopes")?;
    for _ in 0..n {
        let start = w.pos;
        let fields = w.field_ranges(&["scope", "namespaces"])?;
        let after = w.pos;
        let (Some(scope), Some(namespaces)) = (fields[0].clone(), fields[1].clone()) else {
            return Err(shape("a scope without its fields or namespaces"));
        };
        scan_value(&payload[scope.clone()], 0, "payload", scope_depth)?;
        let scope_fields: Fields = rmp_serde::from_slice(&payload[scope])
            .map_err(|e| FormatError::invalid("payload", e))?;
        let scope = Scope::new(scope_fields);
        w.pos = namespaces.start;
        let count = w.map_len("the namespaces")?;
        for _ in 0..count {
            let name = w.string("a namespace name")?;
            if name.is_empty() {
                return Err(shape("an empty namespace name"));
            }
            let entries = w.array_len("a namespace's entries")?;
            for _ in 0..entries {
                let at = w.pos;
                w.pos = scan_value(payload, at, "payload", entry_depth)?;
                if visit(&scope, name, &payload[at..w.pos]).is_break() {
                    return Ok(());
                }
            }
        }
        debug_assert!(start < after);
        w.pos = after;
    }
    Ok(())
}

/// [`walk_payload`] for a payload [`crate::read_snapshot`] has scanned, which also hands each
/// entry's [`EntryFacts`] (`None`: not in the written form; decode it to know). An entry that
/// passes the fast check is not scanned again: the check reads it whole, finds where it ends
/// and bounds its nesting, and the scan of the payload bounded everything already.
///
/// It takes the payload, each scope and each entry in place, in one pass, so it reads the
/// structs above the entries only in the form this crate writes (maps, as the decoder reads
/// them too); the array form of a struct is an error here, and a caller decodes such a
/// payload instead.
pub fn walk_scanned_payload(
    payload: &[u8],
    limits: &Limits,
    mut visit: impl FnMut(&Scope, &str, &[u8], Option<EntryFacts>) -> ControlFlow<()>,
) -> Result<(), FormatError> {
    let scope_depth = limits.max_depth.saturating_sub(3);
    let entry_depth = limits.max_depth.saturating_sub(5);
    let mut w = Walker {
        bytes: payload,
        pos: 0,
    };
    let mut seen = false;
    for _ in 0..w.map_len("the payload")? {
        match w.string("a payload field")? {
            "scopes" if seen => return Err(shape("two scopes fields")),
            "scopes" => {
                seen = true;
                for _ in 0..w.array_len("the scopes")? {
                    if w.scope_in_place(scope_depth, entry_depth, &mut visit)? {
                        return Ok(());
                    }
                }
            }
            _ => w.skip()?,
        }
    }
    if !seen {
        return Err(shape("a payload without scopes"));
    }
    Ok(())
}

/// Decodes one entry's bytes (from [`walk_payload`], which scanned them) of namespace `ns`,
/// with every check the whole-payload decoder makes (the fingerprint matches the key,
/// statuses, finite timings).
pub fn decode_entry(bytes: &[u8], ns: &str) -> Result<Entry, FormatError> {
    let e: wire::EntryIn<'_> =
        rmp_serde::from_slice(bytes).map_err(|e| FormatError::invalid("payload", e))?;
    wire::entry_from_wire(e, ns, "payload")
}

/// The fingerprint an entry is stored under, read from its bytes without decoding the rest
/// (`None` if it has none: the decoder reports that).
pub fn entry_fingerprint(bytes: &[u8]) -> Option<Fingerprint> {
    let mut w = Walker { bytes, pos: 0 };
    let range = w.field_ranges(&["fp"]).ok()?[0].clone()?;
    let mut rd = &bytes[range];
    let len = rmp::decode::read_bin_len(&mut rd).ok()?;
    let fp: [u8; 16] = (len == 16).then(|| rd.get(..16))??.try_into().ok()?;
    Some(Fingerprint(fp))
}

fn shape(what: &str) -> FormatError {
    FormatError::invalid("payload", format_args!("not the format-1 layout: {what}"))
}

struct Walker<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Walker<'a> {
    /// Reads a struct, written as a map by field name or as an array by position, and
    /// returns the byte range of the value of each of `names` (if present). Leaves `pos`
    /// after the struct.
    fn field_ranges(
        &mut self,
        names: &[&str],
    ) -> Result<Vec<Option<std::ops::Range<usize>>>, FormatError> {
        let mut found = vec![None; names.len()];
        let start = self.pos;
        let mut rd = &self.bytes[self.pos..];
        if let Ok(n) = rmp::decode::read_map_len(&mut rd) {
            self.pos = self.bytes.len() - rd.len();
            for _ in 0..n {
                let key_at = self.pos;
                self.skip()?;
                let name = key_name(&self.bytes[key_at..self.pos]);
                let at = self.pos;
                self.skip()?;
                if let Some(i) = name.and_then(|k| names.iter().position(|n| *n == k)) {
                    found[i] = Some(at..self.pos);
                }
            }
            return Ok(found);
        }
        self.pos = start;
        let n = self.array_len("a struct")?;
        for i in 0..n {
            let at = self.pos;
            self.skip()?;
            if let Some(slot) = usize::try_from(i).ok().and_then(|i| found.get_mut(i)) {
                *slot = Some(at..self.pos);
            }
        }
        Ok(found)
    }

    /// One scope of a scanned payload, its entries visited in place (the namespaces are
    /// gone back to if they come before the scope's fields). `true`: the visitor stopped.
    fn scope_in_place(
        &mut self,
        scope_depth: u32,
        entry_depth: u32,
        visit: &mut impl FnMut(&Scope, &str, &[u8], Option<EntryFacts>) -> ControlFlow<()>,
    ) -> Result<bool, FormatError> {
        let mut scope: Option<Scope> = None;
        let mut later: Option<usize> = None;
        let mut namespaces = 0;
        for _ in 0..self.map_len("a scope")? {
            match self.string("a scope field")? {
                "scope" if scope.is_some() => return Err(shape("two scope fields")),
                "scope" => {
                    let at = self.pos;
                    self.skip()?;
                    let bytes = &self.bytes[at..self.pos];
                    scan_value(bytes, 0, "payload", scope_depth)?;
                    let fields: Fields = rmp_serde::from_slice(bytes)
                        .map_err(|e| FormatError::invalid("payload", e))?;
                    scope = Some(Scope::new(fields));
                }
                "namespaces" => {
                    namespaces += 1;
                    match &scope {
                        Some(scope) => {
                            if self.namespaces_in_place(scope, entry_depth, visit)? {
                                return Ok(true);
                            }
                        }
                        None => {
                            later = Some(self.pos);
                            self.skip()?;
                        }
                    }
                }
                _ => self.skip()?,
            }
        }
        let (Some(scope), 1) = (scope, namespaces) else {
            return Err(shape(
                "a scope without exactly one scope and one namespaces field",
            ));
        };
        if let Some(at) = later {
            let end = self.pos;
            self.pos = at;
            if self.namespaces_in_place(&scope, entry_depth, visit)? {
                return Ok(true);
            }
            self.pos = end;
        }
        Ok(false)
    }

    fn namespaces_in_place(
        &mut self,
        scope: &Scope,
        entry_depth: u32,
        visit: &mut impl FnMut(&Scope, &str, &[u8], Option<EntryFacts>) -> ControlFlow<()>,
    ) -> Result<bool, FormatError> {
        for _ in 0..self.map_len("the namespaces")? {
            let name = self.string("a namespace name")?;
            if name.is_empty() {
                return Err(shape("an empty namespace name"));
            }
            for _ in 0..self.array_len("a namespace's entries")? {
                let at = self.pos;
                let facts = match crate::fastcheck::entry_facts_prefix(&self.bytes[at..]) {
                    Some((facts, len)) => {
                        self.pos = at + len;
                        Some(facts)
                    }
                    None => {
                        self.pos = scan_value(self.bytes, at, "payload", entry_depth)?;
                        None
                    }
                };
                if visit(scope, name, &self.bytes[at..self.pos], facts).is_break() {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    fn skip(&mut self) -> Result<(), FormatError> {
        self.pos = scan_value(self.bytes, self.pos, "payload", u32::MAX)?;
        Ok(())
    }

    fn array_len(&mut self, what: &str) -> Result<u32, FormatError> {
        let mut rd = &self.bytes[self.pos..];
        let n = rmp::decode::read_array_len(&mut rd)
            .map_err(|_| shape(&format!("{what} are not an array")))?;
        self.pos = self.bytes.len() - rd.len();
        Ok(n)
    }

    fn map_len(&mut self, what: &str) -> Result<u32, FormatError> {
        let mut rd = &self.bytes[self.pos..];
        let n = rmp::decode::read_map_len(&mut rd)
            .map_err(|_| shape(&format!("{what} are not a map")))?;
        self.pos = self.bytes.len() - rd.len();
        Ok(n)
    }

    fn string(&mut self, what: &str) -> Result<&'a str, FormatError> {
        let at = self.pos;
        self.skip()?;
        key_name(&self.bytes[at..self.pos]).ok_or_else(|| shape(&format!("{what} is not a string")))
    }
}

/// The text of an encoded msgpack string, or `None` for anything else.
fn key_name(bytes: &[u8]) -> Option<&str> {
    let header = match Marker::from_u8(*bytes.first()?) {
        Marker::FixStr(_) => 1,
        Marker::Str8 => 2,
        Marker::Str16 => 3,
        Marker::Str32 => 5,
        _ => return None,
    };
    std::str::from_utf8(bytes.get(header..)?).ok()
}
