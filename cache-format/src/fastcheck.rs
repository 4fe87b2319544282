//! A check of one stored entry without building it, for `verify` over large files.
//!
//! [`entry_decodes`] accepts only the exact form this crate writes: the entry and candidate
//! maps with their fields in the written order, canonical keys and params (FORMAT.md,
//! "Canonical encoding"), `float 64` timings, unsigned integers where the model has them. For
//! those bytes it checks every rule the decoder checks: the fingerprint is the key's (hashed
//! from the key's bytes, which are canonical, so they are what the decoder would hash), UTF-8,
//! the origin kind, the statuses and finite timings of measured candidates. Anything else,
//! even if the decoder would accept it, is `None`: "not sure", and the caller decodes. So
//! `Some` is only ever an entry the decoder accepts (a property test checks it on mutated
//! entries), and the message for a bad entry always comes from the decoder.

use crate::clock::Millis;
use crate::fingerprint::{Fingerprint, KEY_TAG};

/// The stored fingerprint of an entry (bytes from [`crate::raw::walk_payload`]), if the entry
/// is in the written form and the decoder accepts it; `None`: decode it to know.
pub fn entry_decodes(bytes: &[u8]) -> Option<Fingerprint> {
    entry_facts(bytes).map(|f| f.fingerprint)
}

/// What [`entry_facts`] learns of an entry it accepts, without building it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryFacts {
    /// The stored fingerprint, which is the key's.
    pub fingerprint: Fingerprint,
    /// The latest of its timestamps (`recorded_at` and every candidate's `measured_at`): a
    /// reader that sets timestamps from the future to the present knows from this alone
    /// whether the entry has one.
    pub latest: Millis,
}

/// [`entry_decodes`], with the entry's latest timestamp too.
pub fn entry_facts(bytes: &[u8]) -> Option<EntryFacts> {
    entry_facts_prefix(bytes, &Bounds::NONE)
        .filter(|(_, len)| *len == bytes.len())
        .map(|(facts, _)| facts)
}

/// What an accepted entry must also keep within: the nesting a whole-payload scan allows an
/// entry, and the census caps that apply inside one. An entry over them is "not sure" too,
/// so a walk that accepts an entry here has checked it as the scan and the census would.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// Deepest nesting of containers, the entry's own map counting as 1 (empty containers
    /// count as well, which is stricter than the scan).
    pub(crate) depth: u32,
    /// Most fields in a key or params map.
    pub(crate) fields: u64,
    /// Most candidates.
    pub(crate) candidates: u64,
}

impl Bounds {
    /// Nesting this check follows at most: a key or params value 64 deep (it recurses).
    const MAX_DEPTH: u32 = 68;

    /// No caps, only the nesting this check follows.
    pub(crate) const NONE: Bounds = Bounds {
        depth: Bounds::MAX_DEPTH,
        fields: u64::MAX,
        candidates: u64::MAX,
    };

    /// The bounds an entry of a payload has under `limits` (it sits 5 containers in:
    /// payload, scopes, scope, namespaces, entry list).
    pub(crate) fn in_payload(limits: &crate::scan::Limits) -> Bounds {
        Bounds {
            depth: limits.max_depth.saturating_sub(5).min(Bounds::MAX_DEPTH),
            fields: limits.max_fields,
            candidates: limits.max_candidates,
        }
    }
}

/// [`entry_facts`] of the entry that starts `bytes`, and its length, if it also keeps within
/// `bounds`.
pub(crate) fn entry_facts_prefix(bytes: &[u8], bounds: &Bounds) -> Option<(EntryFacts, usize)> {
    let mut r = Reader {
        bytes,
        pos: 0,
        bounds,
    };
    // The entry's map, then its key, origin and candidates (2) and a candidate (3).
    if bounds.depth < 3 || r.map_len()? != 6 {
        return None;
    }
    r.name(b"fp")?;
    let fp = r.fingerprint()?;
    r.name(b"key")?;
    let key_start = r.pos;
    r.canonical_map(2, true)?;
    let key = &bytes[key_start..r.pos];
    r.name(b"candidate_set")?;
    r.fingerprint()?;
    r.name(b"recorded_at")?;
    let mut latest = r.uint()?;
    r.name(b"origin")?;
    if r.map_len()? != 2 {
        return None;
    }
    r.name(b"kind")?;
    if !matches!(r.str()?, b"measured" | b"imported" | b"remote") {
        return None;
    }
    r.name(b"from")?;
    r.str()?;
    r.name(b"candidates")?;
    let n = r.array_len()?;
    if n > bounds.candidates {
        return None;
    }
    for _ in 0..n {
        latest = latest.max(r.candidate()?);
    }
    if Fingerprint::digest(KEY_TAG, key) != fp {
        return None;
    }
    Some((
        EntryFacts {
            fingerprint: fp,
            latest,
        },
        r.pos,
    ))
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    bounds: &'a Bounds,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let out = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }

    fn be(&mut self, n: usize) -> Option<u64> {
        Some(
            self.take(n)?
                .iter()
                .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)),
        )
    }

    /// A map header of the smallest form; its length.
    fn map_len(&mut self) -> Option<u64> {
        match self.byte()? {
            b @ 0x80..=0x8f => Some(u64::from(b & 0x0f)),
            0xde => self.be(2).filter(|n| *n >= 16),
            0xdf => self.be(4).filter(|n| *n >= 1 << 16),
            _ => None,
        }
    }

    /// An array header of the smallest form; its length.
    fn array_len(&mut self) -> Option<u64> {
        match self.byte()? {
            b @ 0x90..=0x9f => Some(u64::from(b & 0x0f)),
            0xdc => self.be(2).filter(|n| *n >= 16),
            0xdd => self.be(4).filter(|n| *n >= 1 << 16),
            _ => None,
        }
    }

    /// A string of the smallest form, valid UTF-8; its bytes.
    fn str(&mut self) -> Option<&'a [u8]> {
        let len = match self.byte()? {
            b @ 0xa0..=0xbf => u64::from(b & 0x1f),
            0xd9 => self.be(1).filter(|n| *n >= 32)?,
            0xda => self.be(2).filter(|n| *n >= 1 << 8)?,
            0xdb => self.be(4).filter(|n| *n >= 1 << 16)?,
            _ => return None,
        };
        let s = self.take(usize::try_from(len).ok()?)?;
        std::str::from_utf8(s).ok()?;
        Some(s)
    }

    /// Exactly the field name `want`.
    fn name(&mut self, want: &[u8]) -> Option<()> {
        (self.str()? == want).then_some(())
    }

    /// `bin 8` of 16 bytes.
    fn fingerprint(&mut self) -> Option<Fingerprint> {
        if self.byte()? != 0xc4 || self.byte()? != 16 {
            return None;
        }
        Some(Fingerprint(self.take(16)?.try_into().ok()?))
    }

    /// An unsigned integer as written (positive fixint or uint 8/16/32/64).
    fn uint(&mut self) -> Option<u64> {
        match self.byte()? {
            b @ 0x00..=0x7f => Some(u64::from(b)),
            0xcc => self.be(1),
            0xcd => self.be(2),
            0xce => self.be(4),
            0xcf => self.be(8),
            _ => None,
        }
    }

    /// A `float 64`.
    fn f64(&mut self) -> Option<f64> {
        if self.byte()? != 0xcb {
            return None;
        }
        Some(f64::from_bits(self.be(8)?))
    }

    /// An integer in its smallest form, within the signed 64-bit range.
    fn canonical_int(&mut self, marker: u8) -> Option<()> {
        let ok = match marker {
            0x00..=0x7f | 0xe0..=0xff => true,
            0xcc => self.be(1)? >= 0x80,
            0xcd => self.be(2)? > 0xff,
            0xce => self.be(4)? > 0xffff,
            0xcf => {
                let v = self.be(8)?;
                v > 0xffff_ffff && v <= i64::MAX as u64
            }
            // Negative values only, each below the smaller form's range.
            0xd0 => (self.be(1)? as u8 as i8) < -32,
            0xd1 => (self.be(2)? as u16 as i16) < i16::from(i8::MIN),
            0xd2 => (self.be(4)? as u32 as i32) < i32::from(i16::MIN),
            0xd3 => (self.be(8)? as i64) < i64::from(i32::MIN),
            _ => return None,
        };
        ok.then_some(())
    }

    /// A canonical value (FORMAT.md): bool, integer, string, array or map, smallest forms;
    /// a container one at nesting `level`.
    fn canonical_value(&mut self, level: u32) -> Option<()> {
        let marker = *self.bytes.get(self.pos)?;
        match marker {
            0xc2 | 0xc3 => {
                self.pos += 1;
                Some(())
            }
            0x80..=0x8f | 0xde | 0xdf => self.canonical_map(level, false),
            0x90..=0x9f | 0xdc | 0xdd => {
                if level > self.bounds.depth {
                    return None;
                }
                let n = self.array_len()?;
                for _ in 0..n {
                    self.canonical_value(level + 1)?;
                }
                Some(())
            }
            0xa0..=0xbf | 0xd9..=0xdb => self.str().map(|_| ()),
            _ => {
                self.pos += 1;
                self.canonical_int(marker)
            }
        }
    }

    /// A canonical map at nesting `level`: string keys in strictly increasing byte order,
    /// canonical values. `capped`: a key or params map, whose fields the census caps.
    fn canonical_map(&mut self, level: u32, capped: bool) -> Option<()> {
        if level > self.bounds.depth {
            return None;
        }
        let n = self.map_len()?;
        if capped && n > self.bounds.fields {
            return None;
        }
        let mut previous: Option<&[u8]> = None;
        for _ in 0..n {
            let name = self.str()?;
            if previous.is_some_and(|p| p >= name) {
                return None;
            }
            previous = Some(name);
            self.canonical_value(level + 1)?;
        }
        Some(())
    }

    /// One candidate as written: algo, params, measured_at, status, then the optional fields
    /// in order; a measured one has finite timings and its sample count, a failed or chosen
    /// one none.
    /// Returns when it was measured.
    fn candidate(&mut self) -> Option<Millis> {
        let fields = self.map_len()?;
        self.name(b"algo")?;
        self.str()?;
        self.name(b"params")?;
        self.canonical_map(4, true)?;
        self.name(b"measured_at")?;
        let measured_at = self.uint()?;
        self.name(b"status")?;
        let status = self.str()?;
        let mut left = fields.checked_sub(4)?;
        let mut timings = 0;
        for name in [&b"median_ns"[..], b"min_ns", b"spread_ns"] {
            if self.optional(&mut left, name)? {
                if !self.f64()?.is_finite() {
                    return None;
                }
                timings += 1;
            }
        }
        let samples = self.optional(&mut left, b"samples")?;
        if samples {
            u32::try_from(self.uint()?).ok()?;
        }
        let error = self.optional(&mut left, b"error")?;
        if error {
            self.str()?;
        }
        let chosen_by = self.optional(&mut left, b"chosen_by")?;
        if chosen_by {
            self.str()?;
        }
        if self.optional(&mut left, b"tuning_ns")? {
            self.uint()?;
        }
        if self.optional(&mut left, b"policy")? {
            self.canonical_map(4, true)?;
        }
        if left != 0 {
            return None;
        }
        match status {
            b"ok" if timings == 3 && samples && !error && !chosen_by => Some(measured_at),
            b"failed" if timings == 0 && !samples && !chosen_by => Some(measured_at),
            b"chosen" if timings == 0 && !samples && !error => Some(measured_at),
            _ => None,
        }
    }

    /// Whether the next field is `name` (consumed if so), while fields are `left`.
    fn optional(&mut self, left: &mut u64, name: &[u8]) -> Option<bool> {
        if *left == 0 {
            return Some(false);
        }
        let save = self.pos;
        if self.str()? == name {
            *left -= 1;
            Some(true)
        } else {
            self.pos = save;
            Some(false)
        }
    }
}
