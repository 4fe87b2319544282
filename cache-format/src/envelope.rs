//! The snapshot file: a single msgpack array that says what it is and which format version
//! before anything else, then a checksummed header and a checksummed payload.
//!
//! ```text
//! [ "tunecache", format_version, header: bin, header_crc32: uint, payload: bin, payload_crc32: uint ]
//! ```
//!
//! The header and the payload are themselves msgpack documents wrapped in `bin`, so any
//! msgpack library can open the file, verify both CRC-32s over the raw bytes, and decode
//! the parts (FORMAT.md, "Snapshot file").

use sha2::{Digest, Sha256};

use crate::error::FormatError;
use crate::model::CacheData;
use crate::scan::{Limits, scan_value};
use crate::version::FormatVersion;
use crate::wire::{self, HeaderV1};

/// The first element of every snapshot file.
pub(crate) const SNAPSHOT_MARKER: &str = "tunecache";

/// The version the msgpack envelope ([`encode_snapshot`]) is written with: its layout did not
/// change in format 4, which is the table, so a one-entry snapshot (a shared tier's value) stays
/// readable by builds that read format 3.
pub(crate) const ENVELOPE_VERSION: u32 = 3;

/// What the header of a snapshot says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The application whose schema the entries follow (e.g. `warpconvnet`).
    pub app: String,
    /// The application's schema version of the entries.
    pub schema: u32,
    /// A digest of the payload; journals name the snapshot they extend by it.
    pub generation: u64,
    /// Number of entries in the payload.
    pub entries: u64,
    /// Number of scopes in the payload.
    pub scopes: u64,
}

/// A snapshot whose envelope and checksums were verified; the payload is not decoded yet.
#[derive(Debug, Clone)]
pub struct Snapshot<'a> {
    /// The container format version.
    pub format: FormatVersion,
    /// The header.
    pub header: Header,
    payload: &'a [u8],
}

impl<'a> Snapshot<'a> {
    /// The raw payload bytes (a msgpack document).
    pub fn payload_bytes(&self) -> &'a [u8] {
        self.payload
    }
}

/// Decodes scanned msgpack bytes into the schema-less view.
pub(crate) fn value_from_bytes(
    bytes: &[u8],
    what: &'static str,
) -> Result<rmpv::Value, FormatError> {
    let mut rd = bytes;
    let value = rmpv::decode::read_value(&mut rd).map_err(|e| FormatError::invalid(what, e))?;
    if !rd.is_empty() {
        return Err(FormatError::malformed(
            what,
            bytes.len() - rd.len(),
            "trailing bytes after the document",
        ));
    }
    Ok(value)
}

pub(crate) fn scan_whole(
    bytes: &[u8],
    what: &'static str,
    limits: &Limits,
) -> Result<(), FormatError> {
    let end = scan_value(bytes, 0, what, limits.max_depth)?;
    if end != bytes.len() {
        return Err(FormatError::malformed(
            what,
            end,
            "trailing bytes after the document",
        ));
    }
    Ok(())
}

/// Checks payload bytes as every reader will before decoding them: the bounded structural scan
/// and the census caps of `limits`. A writer calls it on what it is about to write, so it
/// never writes bytes a reader refuses.
pub fn check_payload(bytes: &[u8], limits: &Limits) -> Result<(), FormatError> {
    scan_whole(bytes, "payload", limits)?;
    crate::census::check(bytes, limits)
}

/// Encodes `data` to the current format's payload bytes (the bytes a snapshot wraps).
pub fn encode_payload(data: &CacheData) -> Vec<u8> {
    wire::encode_payload(data)
}

/// The generation of a payload: the first 8 bytes of its SHA-256, big-endian.
pub(crate) fn generation_of(payload: &[u8]) -> u64 {
    let digest = Sha256::digest(payload);
    let mut b = [0u8; 8];
    b.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(b)
}

/// Encodes a snapshot file of the current format.
///
/// The result depends only on `app`, `schema` and the contents of `data`: there is no
/// timestamp or random number in it, so the same cache always gives the same bytes.
pub fn encode_snapshot(app: &str, schema: u32, data: &CacheData) -> Vec<u8> {
    let payload = wire::encode_payload(data);
    frame_snapshot(
        app,
        schema,
        payload,
        data.len() as u64,
        data.scope_count() as u64,
    )
}

/// The snapshot file around `payload` (of `entries` entries in `scopes` scopes).
pub(crate) fn frame_snapshot(
    app: &str,
    schema: u32,
    payload: Vec<u8>,
    entries: u64,
    scopes: u64,
) -> Vec<u8> {
    let header = wire::to_named(&HeaderV1 {
        app: app.to_owned(),
        schema,
        generation: generation_of(&payload),
        entries,
        scopes,
    });
    let mut prefix = Vec::with_capacity(header.len() + 64);
    prefix.push(0x96);
    write_str(&mut prefix, SNAPSHOT_MARKER);
    rmp::encode::write_uint(&mut prefix, u64::from(ENVELOPE_VERSION)).expect("Vec write");
    write_checksummed(&mut prefix, &header);
    // The payload's own frame (`bin32`, the bytes, `uint32` CRC), built around the payload's
    // buffer: the prefix is moved in front of it rather than the payload copied behind the
    // prefix, so a large snapshot is not in memory twice.
    let crc = crc32fast::hash(&payload);
    prefix.push(0xc6);
    prefix.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    let mut out = payload;
    out.reserve_exact(prefix.len() + 5);
    out.splice(0..0, prefix);
    out.push(0xce);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    rmp::encode::write_str(out, s).expect("Vec write");
}

/// Appends `bin32(bytes)` then `uint32(crc32(bytes))`.
pub(crate) fn write_checksummed(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(0xc6);
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
    out.push(0xce);
    out.extend_from_slice(&crc32fast::hash(bytes).to_be_bytes());
}

/// Verifies a snapshot's envelope, checksums and header, without decoding the payload.
pub fn read_snapshot<'a>(bytes: &'a [u8], limits: &Limits) -> Result<Snapshot<'a>, FormatError> {
    let snap = read_snapshot_framing(bytes, limits)?;
    scan_whole(snap.payload, "payload", limits)?;
    crate::census::check(snap.payload, limits)?;
    Ok(snap)
}

/// [`read_snapshot`] without the structural scan and census of the payload: the envelope,
/// both checksums and the header. For readers that walk the payload entry by entry with
/// [`crate::raw::walk_payload`], which checks each entry's structure and depth as it goes
/// (a whole-payload decoder needs [`read_snapshot`]).
pub fn read_snapshot_framing<'a>(
    bytes: &'a [u8],
    limits: &Limits,
) -> Result<Snapshot<'a>, FormatError> {
    let mut rd = Reader::new(bytes, "file");
    if bytes.len() as u64 > limits.max_file_bytes {
        return Err(FormatError::TooLarge {
            what: "file",
            len: bytes.len() as u64,
            limit: limits.max_file_bytes,
        });
    }
    let (format, len) = rd.preamble(SNAPSHOT_MARKER, "file")?;
    match format {
        FormatVersion::V1 | FormatVersion::V2 | FormatVersion::V3 => {
            if len != 6 {
                return Err(rd.malformed(format!(
                    "a format {} file is an array of 6 elements, this one has {len}",
                    format.number()
                )));
            }
        }
        FormatVersion::V4 => {
            return Err(rd.malformed(
                "a format 4 file is a table, not a snapshot, and its table layout does not read",
            ));
        }
    }
    let header_bytes = rd.checksummed("header", limits.max_header_bytes)?;
    let payload = rd.checksummed("payload", limits.max_file_bytes)?;
    if rd.pos != bytes.len() {
        return Err(rd.malformed(format!(
            "{} trailing bytes after the envelope",
            bytes.len() - rd.pos
        )));
    }
    let header = decode_header(header_bytes, limits)?;
    Ok(Snapshot {
        format,
        header,
        payload,
    })
}

/// Reads only the marker, format version and header from the start of a cache file.
///
/// `prefix` may be the first few kilobytes of the file; the payload is neither needed nor
/// checked. Used to learn a file's versions and generation cheaply. For a table (format 4)
/// the header names the application and schema only: its lineage and counts are in its
/// commit, which this does not read (they are 0 here; open the table for them).
pub fn peek_header(prefix: &[u8], limits: &Limits) -> Result<(FormatVersion, Header), FormatError> {
    if crate::table::is_table(prefix) {
        let head =
            crate::table::read_head(prefix, limits)?.map_err(|needed| FormatError::Truncated {
                what: "table",
                offset: 0,
                needed,
                available: prefix.len() as u64,
            })?;
        return Ok((
            FormatVersion::V4,
            Header {
                app: head.app,
                schema: head.schema,
                generation: 0,
                entries: 0,
                scopes: 0,
            },
        ));
    }
    let mut rd = Reader::new(prefix, "file");
    let (format, _len) = rd.preamble(SNAPSHOT_MARKER, "file")?;
    let header_bytes = rd.checksummed("header", limits.max_header_bytes)?;
    Ok((format, decode_header(header_bytes, limits)?))
}

fn decode_header(bytes: &[u8], limits: &Limits) -> Result<Header, FormatError> {
    scan_value(bytes, 0, "header", limits.max_depth)?;
    let h: HeaderV1 =
        rmp_serde::from_slice(bytes).map_err(|e| FormatError::invalid("header", e))?;
    if h.app.is_empty() {
        return Err(FormatError::invalid("header", "empty application name"));
    }
    Ok(Header {
        app: h.app,
        schema: h.schema,
        generation: h.generation,
        entries: h.entries,
        scopes: h.scopes,
    })
}

/// A cursor over envelope bytes that reports offsets in its errors.
pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, pos: 0, what }
    }

    pub(crate) fn malformed(&self, detail: impl Into<String>) -> FormatError {
        FormatError::malformed(self.what, self.pos, detail)
    }

    fn truncated(&self, needed: u64) -> FormatError {
        FormatError::Truncated {
            what: self.what,
            offset: self.pos as u64,
            needed,
            available: (self.buf.len() - self.pos) as u64,
        }
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], FormatError> {
        if n > (self.buf.len() - self.pos) as u64 {
            return Err(self.truncated(n));
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn byte(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }

    fn be(&mut self, width: u64) -> Result<u64, FormatError> {
        Ok(self
            .take(width)?
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    /// Reads an array header; returns its length.
    pub(crate) fn array_len(&mut self) -> Result<u64, FormatError> {
        match self.byte()? {
            m @ 0x90..=0x9f => Ok(u64::from(m & 0x0f)),
            0xdc => self.be(2),
            0xdd => self.be(4),
            m => {
                self.pos -= 1;
                Err(self.malformed(format!("expected an array, found marker {m:#04x}")))
            }
        }
    }

    /// Reads a string.
    pub(crate) fn str(&mut self) -> Result<&'a [u8], FormatError> {
        let len = match self.byte()? {
            m @ 0xa0..=0xbf => u64::from(m & 0x1f),
            0xd9 => self.be(1)?,
            0xda => self.be(2)?,
            0xdb => self.be(4)?,
            m => {
                self.pos -= 1;
                return Err(self.malformed(format!("expected a string, found marker {m:#04x}")));
            }
        };
        self.take(len)
    }

    /// Reads a non-negative integer.
    pub(crate) fn uint(&mut self) -> Result<u64, FormatError> {
        match self.byte()? {
            m @ 0x00..=0x7f => Ok(u64::from(m)),
            0xcc => self.be(1),
            0xcd => self.be(2),
            0xce => self.be(4),
            0xcf => self.be(8),
            m => {
                self.pos -= 1;
                Err(self.malformed(format!(
                    "expected a non-negative integer, found marker {m:#04x}"
                )))
            }
        }
    }

    /// Reads a `bin` and returns its bytes, refusing lengths over `limit`.
    pub(crate) fn bin(&mut self, what: &'static str, limit: u64) -> Result<&'a [u8], FormatError> {
        let len = match self.byte()? {
            0xc4 => self.be(1)?,
            0xc5 => self.be(2)?,
            0xc6 => self.be(4)?,
            m => {
                self.pos -= 1;
                return Err(self.malformed(format!(
                    "expected the {what} as binary data, found marker {m:#04x}"
                )));
            }
        };
        if len > limit {
            return Err(FormatError::TooLarge { what, len, limit });
        }
        self.take(len)
    }

    /// Reads `bin` followed by its CRC-32 and verifies it.
    pub(crate) fn checksummed(
        &mut self,
        what: &'static str,
        limit: u64,
    ) -> Result<&'a [u8], FormatError> {
        let bytes = self.bin(what, limit)?;
        let stored = self.uint()?;
        let computed = crc32fast::hash(bytes);
        if stored != u64::from(computed) {
            return Err(FormatError::Checksum {
                what,
                stored: stored as u32,
                computed,
            });
        }
        Ok(bytes)
    }

    /// Reads `[marker, version, ...` and maps the version; returns it and the array length.
    pub(crate) fn preamble(
        &mut self,
        marker: &'static str,
        what: &'static str,
    ) -> Result<(FormatVersion, u64), FormatError> {
        let not_ours = FormatError::NotTunecache { what, marker };
        let len = self.array_len().map_err(|_| not_ours.clone())?;
        if len < 2 {
            return Err(not_ours);
        }
        match self.str() {
            Ok(found) if found == marker.as_bytes() => {}
            _ => return Err(not_ours),
        }
        let version = self.uint()?;
        Ok((FormatVersion::from_number(version)?, len))
    }
}
