//! Bundles: a cache's selected entries with a manifest, to ship into containers, wheels and
//! other machines (FORMAT.md, "Bundles"). The entries travel as a complete cache file (from
//! version 3, a table: format 4), so a bundle is read through the same checks, version gate
//! and migration as any cache, and a reader that only looks keys up opens the table in place
//! ([`locate_table`]: a few bytes of framing, whatever the number of entries); the manifest
//! says what is inside without decoding it and carries a SHA-256 of the inner file's bytes,
//! which a whole check ([`read_bundle`]) verifies. Encoding is deterministic: the same entries
//! and manifest always give the same bytes.

mod manifest;

pub(crate) use manifest::sha256_hex;
pub use manifest::{
    Manifest, ManifestBuilder, ManifestScope, Sha256Stream, manifest_of, manifest_problems,
    problems_against,
};

use crate::envelope::{write_checksummed, write_str};
use crate::error::FormatError;
use crate::scan::Limits;

/// The marker a bundle starts with.
pub const BUNDLE_MARKER: &str = "TCBUNDLE";

/// The bundle container's version (independent of the inner file's format version): 3, a
/// table inside.
pub const BUNDLE_VERSION: u64 = 3;

/// Encodes a bundle: one msgpack array of six items, `[ "TCBUNDLE", version, bin32(manifest
/// JSON), crc32, bin32(inner file), crc32 ]` (FORMAT.md, "Bundles"): version 3 around a table,
/// 2 around a format 3 snapshot.
pub fn encode_bundle(manifest: &Manifest, inner: &[u8]) -> Vec<u8> {
    let version = if crate::table::is_table(inner) { 3 } else { 2 };
    let mut out = head_of(manifest, inner.len() as u64, version);
    out.extend_from_slice(inner);
    out.push(0xce);
    out.extend_from_slice(&crc32fast::hash(inner).to_be_bytes());
    out
}

/// The bytes of a bundle before its inner file (`inner_len` bytes long): the array header,
/// marker, version, the manifest with its CRC, and the inner file's `bin32` header. A writer
/// streaming a large inner file writes these, then the file, then `0xce` and its CRC-32.
pub fn bundle_head(manifest: &Manifest, inner_len: u64) -> Vec<u8> {
    head_of(manifest, inner_len, BUNDLE_VERSION)
}

fn head_of(manifest: &Manifest, inner_len: u64, version: u64) -> Vec<u8> {
    let json = serde_json::to_vec(manifest).expect("a manifest always serializes");
    let mut out = Vec::with_capacity(json.len() + 32);
    out.push(0x96);
    write_str(&mut out, BUNDLE_MARKER);
    rmp::encode::write_uint(&mut out, version).expect("Vec write");
    write_checksummed(&mut out, &json);
    out.push(0xc6);
    out.extend_from_slice(
        &u32::try_from(inner_len)
            .expect("an inner file under 4 GiB")
            .to_be_bytes(),
    );
    out
}

/// A version 3 bundle's manifest and where its table is: the offset and length of the table's
/// bytes (whose CRC-32 and SHA-256 only a whole read checks: a lookup checks each block it
/// reads).
#[derive(Debug, Clone)]
pub struct Located {
    /// The manifest (its CRC checked, and its `bundle_format` the framing's).
    pub manifest: Manifest,
    /// Where the table starts in the bundle.
    pub offset: u64,
    /// The table's length.
    pub len: u64,
}

/// Where the table of a version 3 bundle is, from the bundle's first bytes (`prefix`: at
/// least its framing and manifest). `Ok(Err(needed))`: read `needed` bytes first. A bundle of
/// another version is a `Malformed` error (read it whole with [`read_bundle`]).
pub fn locate_table(prefix: &[u8]) -> Result<Result<Located, u64>, FormatError> {
    const WHAT: &str = "bundle";
    let mut rd = prefix;
    let more = |n: usize| Ok(Err(n as u64));
    if prefix.len() < 16 {
        return more(16);
    }
    // The marker and version come first in every version (version 1 wrote an array header of
    // four), so they are read before the length is held against the version.
    let items = rmp::decode::read_array_len(&mut rd).map_err(|_| FormatError::NotTunecache {
        what: WHAT,
        marker: BUNDLE_MARKER,
    })?;
    let mut buf = [0u8; 16];
    match rmp::decode::read_str(&mut rd, &mut buf) {
        Ok(m) if m == BUNDLE_MARKER => {}
        _ => {
            return Err(FormatError::NotTunecache {
                what: WHAT,
                marker: BUNDLE_MARKER,
            });
        }
    }
    let version: u64 = rmp::decode::read_int(&mut rd)
        .map_err(|_| FormatError::malformed(WHAT, prefix.len() - rd.len(), "no version"))?;
    if version > BUNDLE_VERSION {
        return Err(FormatError::NewerFormat {
            found: version,
            supported: BUNDLE_VERSION as u32,
        });
    }
    if version != 3 {
        return Err(FormatError::malformed(
            WHAT,
            prefix.len() - rd.len(),
            format!("a version {version} bundle holds no table (read it whole)"),
        ));
    }
    if items != 6 {
        return Err(FormatError::malformed(
            WHAT,
            0,
            format!("a version 3 bundle is an array of 6 items, not {items}"),
        ));
    }
    let at = prefix.len() - rd.len();
    if rd.len() < 5 {
        return more(at + 5);
    }
    if rd[0] != 0xc6 {
        // Another msgpack encoder may write a short manifest as bin8 or bin16: said as such,
        // not as a length read from the wrong bytes.
        return Err(FormatError::malformed(
            WHAT,
            at,
            format!(
                "the manifest is not framed as a bin32 (type byte 0x{:02x}): a version 3 \
                 bundle's framing is fixed",
                rd[0]
            ),
        ));
    }
    let manifest = u32::from_be_bytes([rd[1], rd[2], rd[3], rd[4]]) as usize;
    // The manifest, its CRC (0xce + 4), then the table's bin32 header.
    let header_at = at + 5 + manifest + 5;
    if prefix.len() < header_at + 5 {
        return more(header_at + 5);
    }
    let json = checksummed(prefix, &mut rd, "bundle manifest")?;
    let h = &rd[..5];
    if h[0] != 0xc6 {
        return Err(FormatError::malformed(
            "bundle snapshot",
            header_at,
            "not a bin32",
        ));
    }
    let len = u64::from(u32::from_be_bytes([h[1], h[2], h[3], h[4]]));
    let manifest: Manifest =
        serde_json::from_slice(json).map_err(|e| FormatError::invalid("bundle manifest", e))?;
    if manifest.bundle_format != version {
        return Err(FormatError::invalid(
            "bundle",
            format_args!(
                "the framing says version {version}, the manifest {}",
                manifest.bundle_format
            ),
        ));
    }
    Ok(Ok(Located {
        manifest,
        offset: (header_at + 5) as u64,
        len,
    }))
}

/// A bundle whose framing, both checksums and the manifest's SHA-256 were verified; the
/// snapshot is not decoded yet (read it with [`crate::read_snapshot`]).
#[derive(Debug, Clone)]
pub struct Bundle<'a> {
    /// The container's version, as its framing says.
    pub version: u64,
    /// The manifest.
    pub manifest: Manifest,
    /// The snapshot file's bytes.
    pub snapshot: &'a [u8],
}

/// Verifies a bundle's framing, checksums and manifest (its hash of the snapshot); any
/// damage is an error naming what and where.
pub fn read_bundle<'a>(bytes: &'a [u8], limits: &Limits) -> Result<Bundle<'a>, FormatError> {
    const WHAT: &str = "bundle";
    if bytes.len() as u64 > limits.max_file_bytes {
        return Err(FormatError::TooLarge {
            what: WHAT,
            len: bytes.len() as u64,
            limit: limits.max_file_bytes,
        });
    }
    let mut rd = bytes;
    let not_bundle = FormatError::NotTunecache {
        what: WHAT,
        marker: BUNDLE_MARKER,
    };
    // Version 2 is one array of six items. Version 1 wrote an array header of four and the
    // snapshot's two items after it (not one document); it is still read.
    let items = match rmp::decode::read_array_len(&mut rd) {
        Ok(n @ (4 | 6)) => n,
        _ => return Err(not_bundle),
    };
    let mut buf = [0u8; 16];
    match rmp::decode::read_str(&mut rd, &mut buf) {
        Ok(m) if m == BUNDLE_MARKER => {}
        _ => return Err(not_bundle),
    }
    let version: u64 = rmp::decode::read_int(&mut rd)
        .map_err(|_| FormatError::malformed(WHAT, bytes.len() - rd.len(), "no version"))?;
    if version > BUNDLE_VERSION {
        return Err(FormatError::NewerFormat {
            found: version,
            supported: BUNDLE_VERSION as u32,
        });
    }
    match (version, items) {
        (1, 4) | (2 | 3, 6) => {}
        (1..=3, _) => {
            return Err(FormatError::malformed(
                WHAT,
                bytes.len() - rd.len(),
                format!("a version {version} bundle is not an array of {items} items"),
            ));
        }
        _ => return Err(FormatError::UnknownFormat { found: version }),
    }
    let manifest_bytes = checksummed(bytes, &mut rd, "bundle manifest")?;
    let snapshot = checksummed(bytes, &mut rd, "bundle snapshot")?;
    if !rd.is_empty() {
        return Err(FormatError::malformed(
            WHAT,
            bytes.len() - rd.len(),
            "trailing bytes after the bundle",
        ));
    }
    let manifest: Manifest = serde_json::from_slice(manifest_bytes)
        .map_err(|e| FormatError::invalid("bundle manifest", e))?;
    if manifest.bundle_format != version {
        return Err(FormatError::invalid(
            "bundle",
            format_args!(
                "the framing says version {version}, the manifest {}",
                manifest.bundle_format
            ),
        ));
    }
    let sha = sha256_hex(snapshot);
    if sha != manifest.payload_sha256 {
        return Err(FormatError::invalid(
            "bundle",
            format_args!(
                "the snapshot's SHA-256 is {sha}, the manifest says {}",
                manifest.payload_sha256
            ),
        ));
    }
    Ok(Bundle {
        version,
        manifest,
        snapshot,
    })
}

/// Reads `bin32(bytes) uint32(crc32(bytes))` from `rd` (a suffix of `all`).
fn checksummed<'a>(
    all: &'a [u8],
    rd: &mut &'a [u8],
    what: &'static str,
) -> Result<&'a [u8], FormatError> {
    let at = all.len() - rd.len();
    let truncated = |needed: usize, available: usize| FormatError::Truncated {
        what,
        offset: at as u64,
        needed: needed as u64,
        available: available as u64,
    };
    if rd.first() != Some(&0xc6) {
        return Err(FormatError::malformed(what, at, "not a bin32"));
    }
    if rd.len() < 5 {
        return Err(truncated(5, rd.len()));
    }
    let len = u32::from_be_bytes([rd[1], rd[2], rd[3], rd[4]]) as usize;
    let rest = &rd[5..];
    if rest.len() < len + 5 {
        return Err(truncated(len + 5, rest.len()));
    }
    let (data, tail) = rest.split_at(len);
    if tail[0] != 0xce {
        return Err(FormatError::malformed(what, at + 5 + len, "no checksum"));
    }
    let stored = u32::from_be_bytes([tail[1], tail[2], tail[3], tail[4]]);
    let computed = crc32fast::hash(data);
    if stored != computed {
        return Err(FormatError::Checksum {
            what,
            stored,
            computed,
        });
    }
    *rd = &tail[5..];
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::candidate::{Candidate, Stats};
    use crate::fingerprint::Fingerprint;
    use crate::model::CacheData;
    use crate::model::{Entry, Key, Origin, Scope};
    use crate::value::{Fields, Value};

    fn sample() -> Vec<u8> {
        let mut data = CacheData::new();
        for i in 0..3 {
            let key = Key::new(Fields::from([("m".to_owned(), Value::Int(i))]));
            let stats = Stats {
                median_ns: 10.0,
                min_ns: 9.0,
                spread_ns: 1.0,
                samples: 3,
            };
            let e = Entry::new(
                key,
                Fingerprint::default(),
                Origin::Imported("t".into()),
                5,
                [Candidate::measured("a", Fields::new(), stats)],
            );
            data.insert(&Scope::default(), "mm", e);
        }
        let snapshot = crate::encode_snapshot("app", 1, &data);
        let manifest = manifest_of(&data, "app", 1, &snapshot, 0, "test");
        encode_bundle(&manifest, &snapshot)
    }

    #[test]
    fn a_bundle_reads_back_and_every_single_bit_flip_is_refused() {
        let bytes = sample();
        let b = read_bundle(&bytes, &Limits::default()).expect("reads back");
        assert_eq!(b.manifest.entries, 3);
        assert_eq!(b.manifest.scopes[0].namespaces.get("mm"), Some(&3));
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[i] ^= 1 << bit;
                assert!(
                    read_bundle(&damaged, &Limits::default()).is_err(),
                    "a flip of bit {bit} at byte {i} of {} went unnoticed",
                    bytes.len()
                );
            }
        }
        for cut in 0..bytes.len() {
            assert!(
                read_bundle(&bytes[..cut], &Limits::default()).is_err(),
                "cut at {cut}"
            );
        }
    }

    /// Found by a hostile review: a manifest framed as bin16 (what Python's msgpack writes for
    /// a short one) was reported as "needs 30309180 more bytes at offset 0".
    #[test]
    fn a_manifest_framed_otherwise_than_bin32_is_said_as_such() {
        let v2 = sample();
        assert_eq!(v2[11], 0xc6, "the manifest's bin32");
        let len = u32::from_be_bytes(v2[12..16].try_into().expect("4")) as usize;
        let mut v3 = v2[..11].to_vec();
        v3[10] = 3;
        v3.push(0xc5);
        v3.extend_from_slice(&(len as u16).to_be_bytes());
        v3.extend_from_slice(&v2[16..]);
        let err = locate_table(&v3).expect_err("refused").to_string();
        assert!(
            err.contains("not framed as a bin32") && err.contains("0xc5"),
            "{err}"
        );
    }

    #[test]
    fn locate_table_sends_older_versions_to_the_whole_reader_and_refuses_foreign_bytes() {
        // Version 2 (a snapshot inside) and version 1's framing (an array header of four):
        // `Malformed`, which a caller takes as "read it whole".
        let v2 = sample();
        assert!(matches!(
            locate_table(&v2),
            Err(FormatError::Malformed { .. })
        ));
        let mut v1 = v2.clone();
        v1[0] = 0x94;
        v1[10] = 1;
        assert_eq!(&v1[2..10], BUNDLE_MARKER.as_bytes());
        assert!(
            matches!(locate_table(&v1), Err(FormatError::Malformed { .. })),
            "{:?}",
            locate_table(&v1)
        );
        // A version 3 framing with the wrong number of items is damage, not an old bundle.
        let mut v3 = v2.clone();
        v3[10] = 3;
        v3[0] = 0x95;
        assert!(matches!(
            locate_table(&v3),
            Err(FormatError::Malformed { .. })
        ));
        // Not a bundle at all, and a newer one.
        assert!(matches!(
            locate_table(&[0x93; 32]),
            Err(FormatError::NotTunecache { .. })
        ));
        let mut newer = v2.clone();
        newer[10] = 9;
        assert!(matches!(
            locate_table(&newer),
            Err(FormatError::NewerFormat { found: 9, .. })
        ));
        assert!(matches!(locate_table(&v2[..8]), Ok(Err(16))));
    }
}
