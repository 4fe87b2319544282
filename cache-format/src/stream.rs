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
use crate::fastcheck::{Bounds, EntryFacts, entry_facts_prefix};
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

/// [`walk_payload`] in one pass that also makes every check of [`crate::check_payload`] (the
/// bounded scan and the census caps) as it goes, and hands each entry's [`EntryFacts`]
/// (`None`: not in the written form; decode it to know). The payload need not have been
/// scanned: when this returns `Ok` after visiting every entry, `check_payload` accepts the
/// payload. An entry that passes the fast check is read once, which also bounds its nesting
/// and counts what the census caps; any other entry is scanned and counted the general way.
///
/// It takes the payload, each scope and each entry in place, so it reads the structs above
/// the entries only in the form this crate writes (maps, as the decoder reads them too); the
/// array form of a struct is an error here. An error names the first thing this walk did not
/// accept, which is not always what `check_payload` or the decoder would name: a caller that
/// reports it runs those.
pub fn walk_checked_payload(
    payload: &[u8],
    limits: &Limits,
    mut visit: impl FnMut(&Scope, &str, &[u8], Option<EntryFacts>) -> ControlFlow<()>,
) -> Result<(), FormatError> {
    // The containers above an entry: payload (1), scopes (2), scope (3), namespaces (4),
    // entry list (5); the entry itself is at 6.
    if limits.max_depth < 6 {
        return Err(shape("nesting limits this walk does not follow"));
    }
    let mut w = Walker {
        bytes: payload,
        pos: 0,
    };
    let mut census = Census {
        limits,
        bounds: Bounds::in_payload(limits),
        namespaces: 0,
    };
    let mut seen = false;
    for _ in 0..w.map_len("the payload")? {
        match w.string("a payload field")? {
            "scopes" if seen => return Err(shape("two scopes fields")),
            "scopes" => {
                seen = true;
                let n = w.array_len("the scopes")?;
                census.cap("scopes", u64::from(n), limits.max_scopes)?;
                for _ in 0..n {
                    if w.scope_in_place(&mut census, &mut visit)? {
                        return Ok(());
                    }
                }
            }
            _ => w.skip_within(limits.max_depth - 1)?,
        }
    }
    if !seen {
        return Err(shape("a payload without scopes"));
    }
    if w.pos != payload.len() {
        return Err(FormatError::malformed(
            "payload",
            w.pos,
            "trailing bytes after the document",
        ));
    }
    Ok(())
}

/// What [`walk_checked_payload`] counts against the census caps as it goes.
struct Census<'l> {
    limits: &'l Limits,
    bounds: Bounds,
    namespaces: u64,
}

impl Census<'_> {
    fn cap(&self, what: &'static str, count: u64, limit: u64) -> Result<(), FormatError> {
        if count > limit {
            Err(FormatError::TooMany { what, count, limit })
        } else {
            Ok(())
        }
    }
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

    /// One scope, its entries visited in place (the namespaces are gone back to if they come
    /// before the scope's fields). `true`: the visitor stopped.
    fn scope_in_place(
        &mut self,
        census: &mut Census<'_>,
        visit: &mut impl FnMut(&Scope, &str, &[u8], Option<EntryFacts>) -> ControlFlow<()>,
    ) -> Result<bool, FormatError> {
        // Inside a scope's map (at 3), its field values start at 4.
        let field_depth = census.limits.max_depth - 3;
        let mut scope: Option<Scope> = None;
        let mut later: Option<usize> = None;
        let mut namespaces = 0;
        for _ in 0..self.map_len("a scope")? {
            match self.string("a scope field")? {
                "scope" if scope.is_some() => return Err(shape("two scope fields")),
                "scope" => {
                    let at = self.pos;
                    self.skip_within(field_depth)?;
                    let bytes = &self.bytes[at..self.pos];
                    let count = Walker { bytes, pos: 0 }.map_len("the fields of a scope")?;
                    census.cap(
                        "fields of a scope",
                        u64::from(count),
                        census.limits.max_fields,
                    )?;
                    let fields: Fields = rmp_serde::from_slice(bytes)
                        .map_err(|e| FormatError::invalid("payload", e))?;
                    scope = Some(Scope::new(fields));
                }
                "namespaces" => {
                    namespaces += 1;
                    match &scope {
                        Some(scope) => {
                            if self.namespaces_in_place(scope, census, visit)? {
                                return Ok(true);
                            }
                        }
                        None => {
                            later = Some(self.pos);
                            self.skip_within(field_depth)?;
                        }
                    }
                }
                _ => self.skip_within(field_depth)?,
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
            if self.namespaces_in_place(&scope, census, visit)? {
                return Ok(true);
            }
            self.pos = end;
        }
        Ok(false)
    }

    fn namespaces_in_place(
        &mut self,
        scope: &Scope,
        census: &mut Census<'_>,
        visit: &mut impl FnMut(&Scope, &str, &[u8], Option<EntryFacts>) -> ControlFlow<()>,
    ) -> Result<bool, FormatError> {
        let limits = census.limits;
        let entry_depth = limits.max_depth - 5;
        let count = self.map_len("the namespaces")?;
        census.namespaces += u64::from(count);
        census.cap("namespaces", census.namespaces, limits.max_namespaces)?;
        for _ in 0..count {
            let name = self.string("a namespace name")?;
            if name.is_empty() {
                return Err(shape("an empty namespace name"));
            }
            for _ in 0..self.array_len("a namespace's entries")? {
                let at = self.pos;
                let facts = match entry_facts_prefix(&self.bytes[at..], &census.bounds) {
                    Some((facts, len)) => {
                        self.pos = at + len;
                        Some(facts)
                    }
                    None => {
                        self.pos = scan_value(self.bytes, at, "payload", entry_depth)?;
                        crate::census::check_entry(&self.bytes[at..self.pos], limits)?;
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

    /// Skips one value whose containers may nest `depth` deep.
    fn skip_within(&mut self, depth: u32) -> Result<(), FormatError> {
        self.pos = scan_value(self.bytes, self.pos, "payload", depth)?;
        Ok(())
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

    /// A string (anything else is an error, however long or deep it is: it is not walked).
    fn string(&mut self, what: &str) -> Result<&'a str, FormatError> {
        let at = self.pos;
        let mut rd = &self.bytes[at..];
        let len = rmp::decode::read_str_len(&mut rd)
            .map_err(|_| shape(&format!("{what} is not a string")))?;
        let start = self.bytes.len() - rd.len();
        let text = usize::try_from(len)
            .ok()
            .and_then(|len| self.bytes.get(start..start.checked_add(len)?))
            .ok_or_else(|| FormatError::Truncated {
                what: "payload",
                offset: start as u64,
                needed: u64::from(len),
                available: (self.bytes.len() - start) as u64,
            })?;
        self.pos = start + text.len();
        std::str::from_utf8(text).map_err(|_| shape(&format!("{what} is not UTF-8")))
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
