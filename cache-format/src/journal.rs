//! The journal: an append-only msgpack stream beside a snapshot, so recording a result
//! costs what the result costs, not what the cache costs.
//!
//! ```text
//! [ "tunecache-journal", format_version, header: bin, header_crc32: uint ]   (once)
//! [ payload: bin, payload_crc32: uint ]                                      (per record)
//! ```
//!
//! Each record's payload has the same layout as a snapshot payload (a subset of the cache).
//! A record is all-or-nothing: a crash mid-append leaves a torn tail that fails its length
//! or checksum and is dropped; every record before it is intact (FORMAT.md, "Journal").

use std::ops::Range;

use crate::envelope::{Reader, write_checksummed, write_str};
use crate::error::FormatError;
use crate::model::CacheData;
use crate::scan::{Limits, scan_value};
use crate::version::{FORMAT_VERSION, FormatVersion};
use crate::wire::{self, JournalHeaderV1};

/// The first element of every journal.
pub(crate) const JOURNAL_MARKER: &str = "tunecache-journal";

/// What a journal's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalHeader {
    /// The application, as in the snapshot header.
    pub app: String,
    /// The application schema version of the records.
    pub schema: u32,
    /// What this journal extends: up to format 3, the generation of the snapshot (a journal
    /// whose base is not the snapshot's generation is stale: its records are already in the
    /// snapshot); from format 4, the table's lineage (a rewrite keeps it, so the journal goes
    /// on applying; one that names another lineage belongs to another cache file).
    pub base: u64,
    /// Tells this journal from another with the same base (format 4: journals come and go at
    /// every fold while the lineage stays): a reader that sees another nonce at the same
    /// place reads the journal afresh. 0 in journals written before it existed.
    pub nonce: u64,
}

/// Encodes a journal header (the first bytes of a new journal).
pub fn encode_journal_header(header: &JournalHeader) -> Vec<u8> {
    let bytes = wire::to_named(&JournalHeaderV1 {
        app: header.app.clone(),
        schema: header.schema,
        base: header.base,
        nonce: (header.nonce != 0).then_some(header.nonce),
    });
    let mut out = Vec::with_capacity(bytes.len() + 32);
    out.push(0x94);
    write_str(&mut out, JOURNAL_MARKER);
    rmp::encode::write_uint(&mut out, u64::from(FORMAT_VERSION)).expect("Vec write");
    write_checksummed(&mut out, &bytes);
    out
}

/// Reads a journal header; returns it with the container version and where records start.
pub fn read_journal_header(
    bytes: &[u8],
    limits: &Limits,
) -> Result<(FormatVersion, JournalHeader, usize), FormatError> {
    let mut rd = Reader::new(bytes, "journal");
    let (format, len) = rd.preamble(JOURNAL_MARKER, "journal")?;
    if len != 4 {
        return Err(rd.malformed(format!(
            "a format 1 journal header is an array of 4 elements, this one has {len}"
        )));
    }
    let header_bytes = rd.checksummed("journal header", limits.max_header_bytes)?;
    scan_value(header_bytes, 0, "journal header", limits.max_depth)?;
    let h: JournalHeaderV1 = rmp_serde::from_slice(header_bytes)
        .map_err(|e| FormatError::invalid("journal header", e))?;
    Ok((
        format,
        JournalHeader {
            app: h.app,
            schema: h.schema,
            base: h.base,
            nonce: h.nonce.unwrap_or(0),
        },
        rd.pos,
    ))
}

/// Encodes one record holding `data`: `[bin32 payload, uint32 crc]`.
pub fn encode_record(data: &CacheData) -> Vec<u8> {
    let payload = wire::encode_payload(data);
    let mut out = Vec::with_capacity(payload.len() + 11);
    out.push(0x92);
    write_checksummed(&mut out, &payload);
    out
}

/// A record whose frame was intact but whose content could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// Where the record starts.
    pub offset: u64,
    /// What is wrong with it.
    pub error: FormatError,
}

/// What follows the last complete record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    /// Nothing: the journal ends at a record boundary.
    Clean,
    /// Bytes that do not form a complete record, from `offset` to the end.
    Torn {
        /// Where the incomplete bytes start.
        offset: u64,
        /// How many bytes there are.
        len: u64,
        /// Whether they look like an interrupted append (a frame that runs past the end, or
        /// only zero bytes, as a crash can leave) rather than foreign garbage.
        interrupted: bool,
    },
}

/// The records found in a journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalScan {
    /// Payload byte ranges of the records that passed their checksum, in order.
    pub records: Vec<Range<usize>>,
    /// Records with an intact frame but a bad checksum, skipped.
    pub damaged: Vec<Damage>,
    /// End of the last complete frame: a writer truncates the journal here before appending.
    pub end: usize,
    /// What follows `end`.
    pub tail: Tail,
}

/// Scans the records of a journal from `start` (just after the header, or a cursor saved
/// by an earlier scan). Never fails: damage is reported in the result.
pub fn scan_records(bytes: &[u8], start: usize, limits: &Limits) -> JournalScan {
    let mut scan = JournalScan {
        records: Vec::new(),
        damaged: Vec::new(),
        end: start.min(bytes.len()),
        tail: Tail::Clean,
    };
    let mut pos = scan.end;
    // What searching past broken frames' ends may cost in all (see `reframe_after`).
    let mut budget = 4 * (bytes.len() - pos);
    while pos < bytes.len() {
        match read_frame(bytes, pos, limits) {
            Ok((range, stored, end_of_frame)) => {
                let computed = crc32fast::hash(&bytes[range.clone()]);
                let value =
                    scan_value(&bytes[range.clone()], 0, "journal record", limits.max_depth);
                if stored == u64::from(computed) && value.is_ok() {
                    scan.records.push(range);
                    pos = end_of_frame;
                    scan.end = pos;
                    continue;
                }
                // The length or the marker may be what was damaged: records whole but for
                // their frames are read by their checksums; one whose payload is damaged is
                // skipped.
                if let Some((found, to)) =
                    reframe_after(bytes, pos, end_of_frame, limits, &mut budget)
                {
                    scan.damaged
                        .push(reread(pos, found.len(), "its frame is damaged"));
                    scan.records.extend(found);
                    pos = to;
                    scan.end = pos;
                    continue;
                }
                let error = match value {
                    Err(error) if stored == u64::from(computed) => error,
                    _ => FormatError::Checksum {
                        what: "journal record",
                        stored: stored as u32,
                        computed,
                    },
                };
                scan.damaged.push(Damage {
                    offset: pos as u64,
                    error,
                });
                pos = end_of_frame;
                scan.end = pos;
            }
            Err(err) => {
                // A broken frame followed by intact records is damage in the middle (a
                // corrupted length, a flipped byte), not an interrupted append: the records
                // after it are kept, and the broken bytes are reported. Records in the broken
                // bytes whole but for their frames are read by their checksums, which an
                // interrupted append cannot pass.
                let next = resync(bytes, pos, limits);
                let (found, stop) = reframe(bytes, pos, next.unwrap_or(bytes.len()), limits);
                let recovered = !found.is_empty();
                if recovered {
                    let what = format!("its frame is damaged ({err})");
                    scan.damaged.push(reread(pos, found.len(), &what));
                    scan.records.extend(found);
                }
                if let Some(next) = next {
                    if !recovered {
                        scan.damaged.push(Damage {
                            offset: pos as u64,
                            error: err,
                        });
                    } else if stop < next {
                        scan.damaged.push(Damage {
                            offset: stop as u64,
                            error: FormatError::malformed(
                                "journal record",
                                stop,
                                "bytes that are not a record",
                            ),
                        });
                    }
                    pos = next;
                    scan.end = pos;
                    continue;
                }
                scan.end = stop;
                if stop == bytes.len() {
                    break;
                }
                let err = if recovered {
                    read_frame(bytes, stop, limits).err()
                } else {
                    Some(err)
                };
                scan.tail = torn(&bytes[stop..], stop, err.as_ref());
                break;
            }
        }
    }
    scan
}

/// Reads the record frame at `pos`: its payload's range, its stored checksum, and where the
/// frame ends.
fn read_frame(
    bytes: &[u8],
    pos: usize,
    limits: &Limits,
) -> Result<(Range<usize>, u64, usize), FormatError> {
    let mut rd = Reader::new(bytes, "journal record");
    rd.pos = pos;
    if rd.array_len()? != 2 {
        return Err(rd.malformed("a record is an array of 2 elements"));
    }
    let payload = rd.bin("journal record", limits.max_file_bytes)?;
    let payload_start = rd.pos - payload.len();
    let stored = rd.uint()?;
    Ok((payload_start..payload_start + payload.len(), stored, rd.pos))
}

/// The damage of a frame whose `n` records were read all the same (their checksums match).
fn reread(offset: usize, n: usize, what: &str) -> Damage {
    Damage {
        offset: offset as u64,
        error: FormatError::Invalid {
            what: "journal record",
            detail: if n == 1 {
                format!("{what}; its payload matches its checksum and was read")
            } else {
                format!("{what}; {n} records there match their checksums and were read")
            },
        },
    }
}

/// The torn tail `rest` at `offset`, whose frame fails with `err`: an interrupted append if
/// the frame runs past the end or only zero bytes are left (as a crash can leave).
fn torn(rest: &[u8], offset: usize, err: Option<&FormatError>) -> Tail {
    Tail::Torn {
        offset: offset as u64,
        len: rest.len() as u64,
        interrupted: matches!(err, Some(FormatError::Truncated { .. }))
            || rest.iter().all(|b| *b == 0),
    }
}

/// After a frame at `pos` that parses but holds no sound record: the records whole but for
/// their frames from `pos` up to the next frame (a damaged length can end the frame where a
/// frame seems to start: then up to the next intact record), or the end, read by their
/// checksums ([`reframe`]), and where they end; `None` unless they fill that span. A frame
/// that ends where tunecache's next record starts (`0x92 0xc6`) or at the end had its length
/// right: only its own bytes are searched (a damaged payload costs its record, not a walk to
/// the end). The searches past a frame's end share `budget` (bytes), so a journal of damaged
/// frames costs a few passes over it, never one per frame.
fn reframe_after(
    bytes: &[u8],
    pos: usize,
    end_of_frame: usize,
    limits: &Limits,
    budget: &mut usize,
) -> Option<(Vec<Range<usize>>, usize)> {
    let fill = |to: usize| {
        let (found, stop) = reframe(bytes, pos, to, limits);
        (!found.is_empty() && stop == to).then_some((found, to))
    };
    if end_of_frame == bytes.len() || bytes[end_of_frame..].starts_with(&[0x92, 0xc6]) {
        return fill(end_of_frame);
    }
    let reach = bytes.len() - pos;
    if *budget < reach {
        return None;
    }
    *budget -= reach;
    let beyond = resync(bytes, pos, limits).unwrap_or(bytes.len());
    let next_frame = end_of_frame == bytes.len() || read_frame(bytes, end_of_frame, limits).is_ok();
    let ends = if next_frame && end_of_frame != beyond {
        vec![end_of_frame, beyond]
    } else {
        vec![beyond]
    };
    ends.into_iter().find_map(fill)
}

/// Records laid out as tunecache writes them (`0x92 0xc6 <len:4> <payload> 0xce <crc:4>`) one
/// after another from `from` to at most `to`, found by their checksums alone, their framing
/// bytes not trusted (FORMAT.md, "Journal file"): from each start, the first end at which the
/// CRC-32 of the bytes in the payload's place is the four bytes after the marker's place and
/// those bytes scan as one value. Their payloads, and where the last ends (`from` if none).
/// One pass over the bytes per record found, and one over the rest.
fn reframe(bytes: &[u8], from: usize, to: usize, limits: &Limits) -> (Vec<Range<usize>>, usize) {
    let mut found = Vec::new();
    let mut start = from;
    'records: while to >= start + 11 {
        let body = start + 6;
        let mut crc = crc32fast::Hasher::new();
        // The payload is bytes[body..x], the marker at x, the checksum at x + 1..x + 5.
        for x in body..=to - 5 {
            let stored =
                u32::from_be_bytes([bytes[x + 1], bytes[x + 2], bytes[x + 3], bytes[x + 4]]);
            if x > body
                && crc.clone().finalize() == stored
                && scan_value(&bytes[body..x], 0, "journal record", limits.max_depth).is_ok()
            {
                found.push(body..x);
                start = x + 5;
                continue 'records;
            }
            crc.update(&bytes[x..=x]);
        }
        break;
    }
    (found, start)
}

/// The start of the next intact record after a broken frame at `broken`: a frame that parses
/// and whose checksum matches. The search hashes at most twice the bytes that follow, so
/// hostile bytes cannot make it quadratic; past that, or with no such frame, `None`.
fn resync(bytes: &[u8], broken: usize, limits: &Limits) -> Option<usize> {
    const FIXARRAY_2: u8 = 0x92;
    let mut budget = 2 * (bytes.len() - broken) as u64;
    for p in broken + 1..bytes.len() {
        if bytes[p] != FIXARRAY_2 {
            continue;
        }
        let Ok((range, stored, _)) = read_frame(bytes, p, limits) else {
            continue;
        };
        budget = budget.checked_sub(range.len() as u64)?;
        if stored == u64::from(crc32fast::hash(&bytes[range])) {
            return Some(p);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Entry, Fields, Key, Origin, Scope, Value};

    fn record(id: i64) -> Vec<u8> {
        let mut data = CacheData::new();
        let key = Key::new(Fields::from([("id".to_owned(), Value::Int(id))]));
        let e = Entry::new(key, Default::default(), Origin::Measured("x".into()), 0, []);
        data.insert(&Scope::default(), "ns", e);
        encode_record(&data)
    }

    /// Three records; `damage` changes the bytes; what the scan finds.
    fn scan_damaged(damage: impl Fn(&mut Vec<u8>, &[usize])) -> (JournalScan, usize) {
        let mut bytes = Vec::new();
        let mut starts = Vec::new();
        for id in 0..3 {
            starts.push(bytes.len());
            bytes.extend_from_slice(&record(id));
        }
        damage(&mut bytes, &starts);
        let len = bytes.len();
        (scan_records(&bytes, 0, &Limits::default()), len)
    }

    /// Found by hostile reviews: a flipped bit in a record's length or checksum marker made a
    /// whole, checksummed record look like an interrupted append (cut off at the next save) or
    /// like a record with a bad checksum (skipped). Every single-bit flip of any record's frame
    /// bytes (the array and bin markers, the length, the checksum's marker) loses nothing, and
    /// is reported.
    #[test]
    fn every_flip_of_a_frame_byte_loses_no_record() {
        for which in 0..3 {
            for at in [0usize, 1, 2, 3, 4, 5, usize::MAX] {
                for bit in 0..8 {
                    let (scan, len) = scan_damaged(|b, starts| {
                        let end = starts.get(which + 1).copied().unwrap_or(b.len());
                        let i = if at == usize::MAX {
                            end - 5
                        } else {
                            starts[which] + at
                        };
                        b[i] ^= 1 << bit;
                    });
                    let case = format!("record {which}, frame byte {at}, bit {bit}: {scan:?}");
                    assert_eq!(scan.records.len(), 3, "{case}");
                    assert!(!scan.damaged.is_empty(), "{case}");
                    assert_eq!(scan.tail, Tail::Clean, "{case}");
                    assert_eq!(scan.end, len, "{case}");
                }
            }
        }
    }

    /// Two records next to each other, each damaged in its frame (the last two markers, two
    /// lengths): both are read.
    #[test]
    fn neighbouring_frame_damage_loses_no_record() {
        let cases: [(&str, [(usize, usize); 2]); 4] = [
            ("the last two markers", [(1, usize::MAX), (2, usize::MAX)]),
            ("the first two markers", [(0, usize::MAX), (1, usize::MAX)]),
            ("two lengths", [(0, 5), (1, 5)]),
            ("a length and the next marker", [(1, 2), (2, usize::MAX)]),
        ];
        for (what, flips) in cases {
            let (scan, len) = scan_damaged(|b, starts| {
                for (which, at) in flips {
                    let end = starts.get(which + 1).copied().unwrap_or(b.len());
                    let i = if at == usize::MAX {
                        end - 5
                    } else {
                        starts[which] + at
                    };
                    b[i] ^= 0x01;
                }
            });
            assert_eq!(scan.records.len(), 3, "{what}: {scan:?}");
            assert_eq!(scan.tail, Tail::Clean, "{what}");
            assert_eq!(scan.end, len, "{what}");
        }
    }

    #[test]
    fn an_interrupted_append_is_still_a_torn_tail() {
        for cut in [1, 5, 9, 20] {
            let (scan, _) = scan_damaged(|b, _| b.truncate(b.len() - cut));
            assert_eq!(scan.records.len(), 2, "cut {cut}");
            assert!(scan.damaged.is_empty(), "cut {cut}");
            assert!(matches!(scan.tail, Tail::Torn { .. }), "cut {cut}");
        }
    }
}
