//! Bundles: a cache's selected entries with a manifest, to ship into containers, wheels and
//! other machines (FORMAT.md, "Bundles"). The entries travel as a complete snapshot file
//! (its own envelope and checksums), so a bundle is read through the same checks, version
//! gate and migration as any cache; the manifest says what is inside without decoding it and
//! carries a SHA-256 of the snapshot bytes. Encoding is deterministic: the same entries and
//! manifest always give the same bytes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::envelope::{write_checksummed, write_str};
use crate::error::FormatError;
use crate::model::CacheData;
use crate::scan::Limits;

/// The marker a bundle starts with.
pub const BUNDLE_MARKER: &str = "TCBUNDLE";

/// The bundle container's version (independent of the snapshot's format version).
pub(crate) const BUNDLE_VERSION: u64 = 2;

/// What a bundle holds, readable without decoding its entries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The tool that wrote it, e.g. `tunecache 0.1.0`.
    pub tool: String,
    /// The bundle container's version.
    pub bundle_format: u64,
    /// The snapshot's container format version.
    pub cache_format: u32,
    /// The application whose schema the entries follow.
    pub app: String,
    /// Its schema version.
    pub schema: u32,
    /// When it was made, in seconds since the Unix epoch (`SOURCE_DATE_EPOCH` if set, else
    /// the latest entry's time: the same inputs give the same bytes).
    pub created: u64,
    /// Who made it (a name the producer chose, e.g. a CI job).
    pub producer: String,
    /// Number of entries.
    pub entries: u64,
    /// The earliest and latest time an entry was recorded (milliseconds since the epoch).
    pub time_range: Option<(u64, u64)>,
    /// Per scope, in fingerprint order.
    pub scopes: Vec<ManifestScope>,
    /// SHA-256 of the snapshot bytes, lower-case hex.
    pub payload_sha256: String,
}

/// One scope of a [`Manifest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestScope {
    /// Its fingerprint (32 hex digits).
    pub fingerprint: String,
    /// Its fields, as JSON text (e.g. `{"device":"H100","driver":"550"}`).
    pub fields: String,
    /// Entries of this scope.
    pub entries: u64,
    /// Entries per namespace.
    pub namespaces: BTreeMap<String, u64>,
    /// The candidate-set checksums its entries were measured against.
    pub candidate_sets: Vec<String>,
}

/// The manifest of `snapshot` (the bytes of a snapshot file holding `data`).
pub fn manifest_of(
    data: &CacheData,
    app: &str,
    schema: u32,
    snapshot: &[u8],
    created: u64,
    producer: &str,
) -> Manifest {
    let mut scopes = Vec::new();
    let mut range: Option<(u64, u64)> = None;
    for (scope, sd) in data.scopes() {
        let mut namespaces = BTreeMap::new();
        let mut sets = std::collections::BTreeSet::new();
        let mut entries = 0u64;
        for (ns, by_fp) in sd.namespaces() {
            namespaces.insert(ns.to_owned(), by_fp.len() as u64);
            for e in by_fp.values() {
                entries += 1;
                sets.insert(e.candidate_set().to_hex());
                let t = e.recorded_at();
                range = Some(range.map_or((t, t), |(a, b)| (a.min(t), b.max(t))));
            }
        }
        scopes.push(ManifestScope {
            fingerprint: scope.fingerprint().to_hex(),
            fields: scope.to_string(),
            entries,
            namespaces,
            candidate_sets: sets.into_iter().collect(),
        });
    }
    scopes.sort_by(|a, b| a.fingerprint.cmp(&b.fingerprint));
    Manifest {
        tool: format!("tunecache {}", env!("CARGO_PKG_VERSION")),
        bundle_format: BUNDLE_VERSION,
        cache_format: crate::envelope::FormatVersion::CURRENT.number(),
        app: app.to_owned(),
        schema,
        created,
        producer: producer.to_owned(),
        entries: data.len() as u64,
        time_range: range,
        scopes,
        payload_sha256: sha256_hex(snapshot),
    }
}

/// Every way `manifest` misstates the snapshot it came with (`data`, decoded from `snapshot`,
/// whose header says `app`, `schema` and `format`; the framing said `version`): it must be
/// exactly the manifest [`manifest_of`] makes of them, but for the free fields (`tool`,
/// `created`, `producer`). Empty: the manifest is true. Any line is damage.
pub fn manifest_problems(
    manifest: &Manifest,
    bundle: &Bundle<'_>,
    header: (&str, u32, u32),
    data: &CacheData,
) -> Vec<String> {
    let (app, schema, format) = header;
    let truth = manifest_of(
        data,
        app,
        schema,
        bundle.snapshot,
        manifest.created,
        &manifest.producer,
    );
    let mut problems = Vec::new();
    let mut differ = |what: &str, says: String, is: String| {
        if says != is {
            let cut = |t: String| {
                if t.len() <= 200 {
                    return t;
                }
                let mut end = 200;
                while !t.is_char_boundary(end) {
                    end -= 1;
                }
                format!("{}…", &t[..end])
            };
            problems.push(format!(
                "the manifest's {what} is {}, the bundle's is {}",
                cut(says),
                cut(is)
            ));
        }
    };
    differ(
        "bundle format",
        manifest.bundle_format.to_string(),
        bundle.version.to_string(),
    );
    differ(
        "cache format",
        manifest.cache_format.to_string(),
        format.to_string(),
    );
    differ(
        "application",
        format!("{:?}", manifest.app),
        format!("{app:?}"),
    );
    differ("schema", manifest.schema.to_string(), schema.to_string());
    differ(
        "entry count",
        manifest.entries.to_string(),
        truth.entries.to_string(),
    );
    differ(
        "time range",
        format!("{:?}", manifest.time_range),
        format!("{:?}", truth.time_range),
    );
    if manifest.scopes.len() != truth.scopes.len() {
        differ(
            "number of scopes",
            manifest.scopes.len().to_string(),
            truth.scopes.len().to_string(),
        );
    } else {
        for (says, is) in manifest.scopes.iter().zip(&truth.scopes) {
            if says != is {
                differ(
                    &format!("scope {}", says.fingerprint),
                    format!("{says:?}"),
                    format!("{is:?}"),
                );
            }
        }
    }
    problems
}

/// SHA-256 of `bytes`, lower-case hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Encodes a bundle: one msgpack array of six items, `[ "TCBUNDLE", 2, bin32(manifest JSON),
/// crc32, bin32(snapshot), crc32 ]` (FORMAT.md, "Bundles").
pub fn encode_bundle(manifest: &Manifest, snapshot: &[u8]) -> Vec<u8> {
    let json = serde_json::to_vec(manifest).expect("a manifest always serializes");
    let mut out = Vec::with_capacity(json.len() + snapshot.len() + 32);
    out.push(0x96);
    write_str(&mut out, BUNDLE_MARKER);
    rmp::encode::write_uint(&mut out, BUNDLE_VERSION).expect("Vec write");
    write_checksummed(&mut out, &json);
    write_checksummed(&mut out, snapshot);
    out
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
        (1, 4) | (2, 6) => {}
        (1 | 2, _) => {
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
}
