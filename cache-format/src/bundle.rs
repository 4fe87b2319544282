//! Bundles: a cache's selected entries with a manifest, to ship into containers, wheels and
//! other machines (FORMAT.md, "Bundles"). The entries travel as a complete cache file (from
//! version 3, a table: format 4), so a bundle is read through the same checks, version gate
//! and migration as any cache, and a reader that only looks keys up opens the table in place
//! ([`locate_table`]: a few bytes of framing, whatever the number of entries); the manifest
//! says what is inside without decoding it and carries a SHA-256 of the inner file's bytes,
//! which a whole check ([`read_bundle`]) verifies. Encoding is deterministic: the same entries
//! and manifest always give the same bytes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::envelope::{write_checksummed, write_str};
use crate::error::FormatError;
use crate::model::CacheData;
use crate::scan::Limits;

/// The marker a bundle starts with.
pub const BUNDLE_MARKER: &str = "TCBUNDLE";

/// The bundle container's version (independent of the inner file's format version): 3, a
/// table inside.
pub const BUNDLE_VERSION: u64 = 3;

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

/// One scope's fields as text, entries per namespace, and candidate sets.
type ScopeTally = (
    String,
    BTreeMap<String, u64>,
    std::collections::BTreeSet<crate::fingerprint::Fingerprint>,
);

/// A manifest put together one entry at a time (entries in any order, each once), holding
/// per scope its counts and candidate sets, never the entries.
#[derive(Debug, Default)]
pub struct ManifestBuilder {
    scopes: BTreeMap<crate::fingerprint::Fingerprint, ScopeTally>,
    entries: u64,
    range: Option<(u64, u64)>,
}

impl ManifestBuilder {
    /// Counts `entry` of namespace `ns` in `scope`.
    pub fn add(&mut self, scope: &crate::model::Scope, ns: &str, entry: &crate::model::Entry) {
        let (_, namespaces, sets) = self
            .scopes
            .entry(scope.fingerprint())
            .or_insert_with(|| (scope.to_string(), BTreeMap::new(), Default::default()));
        *namespaces.entry(ns.to_owned()).or_default() += 1;
        sets.insert(entry.candidate_set());
        self.entries += 1;
        let t = entry.recorded_at();
        self.range = Some(self.range.map_or((t, t), |(a, b)| (a.min(t), b.max(t))));
    }

    /// The manifest of an inner file whose bytes hash to `sha256` (lower-case hex), of `app`
    /// at `schema` in container `format`.
    pub fn finish(
        self,
        app: &str,
        schema: u32,
        format: u32,
        sha256: String,
        created: u64,
        producer: &str,
    ) -> Manifest {
        let scopes = self
            .scopes
            .into_iter()
            .map(|(fp, (fields, namespaces, sets))| ManifestScope {
                fingerprint: fp.to_hex(),
                fields,
                entries: namespaces.values().sum(),
                namespaces,
                candidate_sets: sets.iter().map(|s| s.to_hex()).collect(),
            })
            .collect();
        Manifest {
            tool: format!("tunecache {}", env!("CARGO_PKG_VERSION")),
            bundle_format: if format >= 4 { BUNDLE_VERSION } else { 2 },
            cache_format: format,
            app: app.to_owned(),
            schema,
            created,
            producer: producer.to_owned(),
            entries: self.entries,
            time_range: self.range,
            scopes,
            payload_sha256: sha256,
        }
    }
}

/// The manifest of `inner` (the bytes of a cache file holding `data`: a table, or a format 3
/// snapshot).
pub fn manifest_of(
    data: &CacheData,
    app: &str,
    schema: u32,
    inner: &[u8],
    created: u64,
    producer: &str,
) -> Manifest {
    let mut b = ManifestBuilder::default();
    for (scope, ns, e) in data.entries() {
        b.add(scope, ns, e);
    }
    let format = if crate::table::is_table(inner) {
        crate::FORMAT_VERSION
    } else {
        crate::ENVELOPE_VERSION
    };
    b.finish(app, schema, format, sha256_hex(inner), created, producer)
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
    let mut b = ManifestBuilder::default();
    for (scope, ns, e) in data.entries() {
        b.add(scope, ns, e);
    }
    let truth = b.finish(
        app,
        schema,
        format,
        manifest.payload_sha256.clone(),
        manifest.created,
        &manifest.producer,
    );
    problems_against(manifest, &truth, bundle.version)
}

/// Every way `manifest` differs from `truth` (what the entries make of it) but for the free
/// fields; `version`: the container's version, as its framing says.
pub fn problems_against(manifest: &Manifest, truth: &Manifest, version: u64) -> Vec<String> {
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
        version.to_string(),
    );
    differ(
        "cache format",
        manifest.cache_format.to_string(),
        truth.cache_format.to_string(),
    );
    differ(
        "application",
        format!("{:?}", manifest.app),
        format!("{:?}", truth.app),
    );
    differ(
        "schema",
        manifest.schema.to_string(),
        truth.schema.to_string(),
    );
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

/// Where the table of a version 3 bundle is, from the bundle's first bytes (`prefix`: at
/// least its framing and manifest): the offset and length of the table's bytes, and the
/// CRC-32 the bundle stores for them (checked only by a whole read: a lookup checks each block
/// it reads). `Ok(Err(needed))`: read `needed` bytes first. A bundle of another version is
/// an error (read it whole with [`read_bundle`]).
pub fn locate_table(prefix: &[u8]) -> Result<Result<(u64, u64), u64>, FormatError> {
    const WHAT: &str = "bundle";
    let mut rd = prefix;
    let more = |n: usize| Ok(Err(n as u64));
    if prefix.len() < 16 {
        return more(16);
    }
    if rmp::decode::read_array_len(&mut rd).ok() != Some(6) {
        return Err(FormatError::NotTunecache {
            what: WHAT,
            marker: BUNDLE_MARKER,
        });
    }
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
    let at = prefix.len() - rd.len();
    if rd.len() < 5 {
        return more(at + 5);
    }
    if rd[0] != 0xc6 {
        return Err(FormatError::malformed("bundle manifest", at, "not a bin32"));
    }
    let manifest = u32::from_be_bytes([rd[1], rd[2], rd[3], rd[4]]) as usize;
    // The manifest, its CRC (0xce + 4), then the table's bin32 header.
    let header_at = at + 5 + manifest + 5;
    if prefix.len() < header_at + 5 {
        return more(header_at + 5);
    }
    let h = &prefix[header_at..header_at + 5];
    if h[0] != 0xc6 {
        return Err(FormatError::malformed(
            "bundle snapshot",
            header_at,
            "not a bin32",
        ));
    }
    let len = u64::from(u32::from_be_bytes([h[1], h[2], h[3], h[4]]));
    Ok(Ok(((header_at + 5) as u64, len)))
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
