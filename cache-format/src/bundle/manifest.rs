//! A bundle's manifest (FORMAT.md, "Bundles"): what it holds, made from its entries one at a
//! time, and held against what the entries really make of it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{BUNDLE_VERSION, Bundle};
use crate::model::CacheData;

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
    let range = |r: Option<(u64, u64)>| {
        r.map_or_else(
            || "none".to_owned(),
            |(a, b)| format!("{a} to {b} (Unix ms)"),
        )
    };
    differ(
        "time range",
        range(manifest.time_range),
        range(truth.time_range),
    );
    if manifest.scopes.len() != truth.scopes.len() {
        differ(
            "number of scopes",
            manifest.scopes.len().to_string(),
            truth.scopes.len().to_string(),
        );
    } else {
        for (says, is) in manifest.scopes.iter().zip(&truth.scopes) {
            if says.fingerprint != is.fingerprint {
                differ("a scope", says.fingerprint.clone(), is.fingerprint.clone());
                continue;
            }
            let names =
                |s: &ManifestScope| serde_json::to_string(&s.namespaces).unwrap_or_default();
            let sets =
                |s: &ManifestScope| serde_json::to_string(&s.candidate_sets).unwrap_or_default();
            for (field, a, b) in [
                ("fields", says.fields.clone(), is.fields.clone()),
                ("entries", says.entries.to_string(), is.entries.to_string()),
                ("namespaces", names(says), names(is)),
                ("candidate sets", sets(says), sets(is)),
            ] {
                differ(&format!("scope {} {field}", says.fingerprint), a, b);
            }
        }
    }
    problems
}

/// SHA-256 over bytes given a chunk at a time (a large table read back in pieces), as the
/// manifest's lower-case hex.
#[derive(Debug, Default, Clone)]
pub struct Sha256Stream(Sha256);

impl Sha256Stream {
    /// Hashes `bytes` after those given before.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The digest, lower-case hex.
    pub fn hex(self) -> String {
        self.0
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// SHA-256 of `bytes`, lower-case hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
