//! The msgpack blocks of a table: the commit (what is current) and the directory (the
//! scopes' fields, the namespaces' names, and how many entries each holds).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::BlockRef;
use crate::error::FormatError;
use crate::fingerprint::Fingerprint;
use crate::model::Scope;
use crate::scan::{Limits, scan_value};
use crate::value::Fields;
use crate::wire::Fp;

/// The largest commit block a reader takes.
pub(crate) const COMMIT_MAX_BYTES: u32 = 4096;

/// Which file a rewritten table was made from, and at which of its commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rewritten {
    /// The source's lineage (the same as this table's for a compaction).
    pub lineage: u64,
    /// The source's commit the rewrite started from and caught up to.
    pub seq: u64,
}

/// A rewrite that left entries out on purpose (a retention limit: `tunecache gc`, a cache's
/// own retention), carried by every later commit of the same file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dropped {
    /// How many entries it left out.
    pub entries: u64,
    /// The nonce of the journal whose records were folded into the table just before the
    /// rewrite, if it knows one: a process that wrote to that journal and finds some of its
    /// results missing knows they were dropped, not lost.
    pub journal: Option<u64>,
}

/// A commit: the state of the table after one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// 1 for a table's first commit, then one more per write.
    pub seq: u64,
    /// Names the line of tables this one belongs to: every commit of a table and of its
    /// rewrites (compactions) keeps it, so a journal bound to it goes on applying; a table
    /// built afresh (a new cache, a migration) gets the digest of its entries.
    pub lineage: u64,
    /// The commit before this one in the same file (`None` for the first).
    pub prev: Option<BlockRef>,
    /// The tree's root (`None`: no entries).
    pub root: Option<BlockRef>,
    /// The root's height (0: the root is a leaf).
    pub height: u8,
    /// Entries in the tree.
    pub entries: u64,
    /// The directory block.
    pub dir: BlockRef,
    /// The keys this commit wrote or removed (`None` for a table's first commit).
    pub changes: Option<BlockRef>,
    /// Bytes of the blocks reachable from this commit (entries, nodes, the directory): what
    /// a rewrite would keep.
    pub live: u64,
    /// The file a rewrite made this table from, and its commit then (`None`: built afresh).
    pub from: Option<Rewritten>,
    /// What that rewrite left out on purpose (`None`: nothing, or not a rewrite).
    pub dropped: Option<Dropped>,
}

#[derive(Serialize, Deserialize)]
struct CommitWire {
    seq: u64,
    lineage: u64,
    prev: Option<(u64, u32, u32)>,
    root: Option<(u64, u32, u32)>,
    height: u8,
    entries: u64,
    dir: (u64, u32, u32),
    changes: Option<(u64, u32, u32)>,
    live: u64,
    from: Option<Rewritten>,
    /// Absent unless a rewrite dropped entries, so other commits encode as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dropped: Option<Dropped>,
}

fn out(r: &BlockRef) -> (u64, u32, u32) {
    (r.offset, r.len, r.crc)
}

fn back((offset, len, crc): (u64, u32, u32)) -> BlockRef {
    BlockRef { offset, len, crc }
}

impl Commit {
    pub(crate) fn encode(&self) -> Vec<u8> {
        rmp_serde::to_vec_named(&CommitWire {
            seq: self.seq,
            lineage: self.lineage,
            prev: self.prev.as_ref().map(out),
            root: self.root.as_ref().map(out),
            height: self.height,
            entries: self.entries,
            dir: out(&self.dir),
            changes: self.changes.as_ref().map(out),
            live: self.live,
            from: self.from,
            dropped: self.dropped,
        })
        .expect("encoding to a Vec cannot fail")
    }

    pub(crate) fn decode(bytes: &[u8], limits: &Limits) -> Result<Commit, FormatError> {
        scan_value(bytes, 0, "commit", limits.max_depth)?;
        let w: CommitWire =
            rmp_serde::from_slice(bytes).map_err(|e| FormatError::invalid("commit", e))?;
        if w.seq == 0 || w.height >= super::MAX_HEIGHT {
            return Err(FormatError::invalid(
                "commit",
                format!("sequence {} with a tree of height {}", w.seq, w.height),
            ));
        }
        Ok(Commit {
            seq: w.seq,
            lineage: w.lineage,
            prev: w.prev.map(back),
            root: w.root.map(back),
            height: w.height,
            entries: w.entries,
            dir: back(w.dir),
            changes: w.changes.map(back),
            live: w.live,
            from: w.from,
            dropped: w.dropped,
        })
    }
}

/// One scope of a [`Directory`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirScope {
    /// The scope (its fingerprint is the first part of its entries' keys).
    pub scope: Scope,
    /// Entries per namespace (by [`super::namespace_hash`]); none listed with 0.
    pub counts: BTreeMap<Fingerprint, u64>,
}

impl DirScope {
    /// Entries of this scope.
    pub fn entries(&self) -> u64 {
        self.counts.values().sum()
    }
}

/// What a table holds, in brief: every scope with its fields and its entries per namespace,
/// and every namespace's name. It grows with the scopes and namespaces, never with entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directory {
    /// By scope fingerprint.
    pub scopes: BTreeMap<Fingerprint, DirScope>,
    /// Namespace names by hash.
    pub names: BTreeMap<Fingerprint, String>,
}

#[derive(Serialize)]
struct DirOut<'a> {
    scopes: Vec<ScopeOut<'a>>,
    names: Vec<(Fp, &'a str)>,
}

#[derive(Serialize)]
struct ScopeOut<'a> {
    fp: Fp,
    scope: &'a Fields,
    namespaces: Vec<(Fp, u64)>,
}

#[derive(Deserialize)]
struct DirIn {
    scopes: Vec<ScopeIn>,
    names: Vec<(Fp, String)>,
}

#[derive(Deserialize)]
struct ScopeIn {
    fp: Fp,
    scope: Fields,
    namespaces: Vec<(Fp, u64)>,
}

/// The caps a reader checks on a directory: its scopes, its namespaces' names, and the
/// namespaces over all scopes.
fn caps(scopes: usize, names: usize, pairs: usize, limits: &Limits) -> Result<(), FormatError> {
    let too_many = |what, count: usize, limit: u64| {
        (count as u64 > limit).then_some(FormatError::TooMany {
            what,
            count: count as u64,
            limit,
        })
    };
    match too_many("scopes", scopes, limits.max_scopes)
        .or_else(|| too_many("namespaces", names, limits.max_namespaces))
        .or_else(|| too_many("namespaces over all scopes", pairs, limits.max_namespaces))
    {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

impl Directory {
    /// Whether a reader with `limits` accepts this directory's counts (what decoding it
    /// checks): a writer checks before it writes one, so it never writes a table its readers
    /// refuse.
    pub(crate) fn check_caps(&self, limits: &Limits) -> Result<(), FormatError> {
        let pairs = self.scopes.values().map(|s| s.counts.len()).sum();
        caps(self.scopes.len(), self.names.len(), pairs, limits)
    }

    /// Counts one more (or one less) entry of namespace `ns` (named `name`) in `scope`.
    pub fn add(&mut self, scope: &Scope, ns: &Fingerprint, name: &str, delta: i64) {
        let s = self
            .scopes
            .entry(scope.fingerprint())
            .or_insert_with(|| DirScope {
                scope: scope.clone(),
                counts: BTreeMap::new(),
            });
        let count = s.counts.entry(*ns).or_insert(0);
        *count = count.saturating_add_signed(delta);
        if *count == 0 {
            s.counts.remove(ns);
        }
        if s.counts.is_empty() {
            self.scopes.remove(&scope.fingerprint());
        }
        if delta > 0 {
            self.names.entry(*ns).or_insert_with(|| name.to_owned());
        }
    }

    /// Forgets the names of namespaces no scope counts any more.
    pub(crate) fn prune_names(&mut self) {
        let used: std::collections::BTreeSet<Fingerprint> = self
            .scopes
            .values()
            .flat_map(|s| s.counts.keys().copied())
            .collect();
        self.names.retain(|h, _| used.contains(h));
    }

    /// Entries of the scope `fp`.
    pub fn entries_of(&self, fp: &Fingerprint) -> u64 {
        self.scopes.get(fp).map_or(0, DirScope::entries)
    }

    /// All entries.
    pub fn entries(&self) -> u64 {
        self.scopes.values().map(DirScope::entries).sum()
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let dir = DirOut {
            scopes: self
                .scopes
                .iter()
                .map(|(fp, s)| ScopeOut {
                    fp: Fp(*fp),
                    scope: s.scope.fields(),
                    namespaces: s.counts.iter().map(|(h, n)| (Fp(*h), *n)).collect(),
                })
                .collect(),
            names: self
                .names
                .iter()
                .map(|(h, n)| (Fp(*h), n.as_str()))
                .collect(),
        };
        rmp_serde::to_vec_named(&dir).expect("encoding to a Vec cannot fail")
    }

    pub(crate) fn decode(bytes: &[u8], limits: &Limits) -> Result<Directory, FormatError> {
        // The scope fields sit at depth 5 here (directory, scopes, scope, its map, a field);
        // their values get the nesting a payload allows them.
        scan_value(
            bytes,
            0,
            "directory",
            limits.max_scope_field_depth().saturating_add(4),
        )?;
        let w: DirIn =
            rmp_serde::from_slice(bytes).map_err(|e| FormatError::invalid("directory", e))?;
        let pairs = w.scopes.iter().map(|s| s.namespaces.len()).sum();
        caps(w.scopes.len(), w.names.len(), pairs, limits)?;
        let mut dir = Directory::default();
        for s in w.scopes {
            if s.scope.len() as u64 > limits.max_fields {
                return Err(FormatError::TooMany {
                    what: "fields of a scope",
                    count: s.scope.len() as u64,
                    limit: limits.max_fields,
                });
            }
            let scope = Scope::new(s.scope);
            if scope.fingerprint() != s.fp.0 {
                return Err(FormatError::invalid(
                    "directory",
                    format!("a scope listed as {} has the fields of another", s.fp.0),
                ));
            }
            let counts: BTreeMap<Fingerprint, u64> =
                s.namespaces.into_iter().map(|(h, n)| (h.0, n)).collect();
            dir.scopes.insert(s.fp.0, DirScope { scope, counts });
        }
        for (h, name) in w.names {
            if super::namespace_hash(&name) != h.0 || name.is_empty() {
                return Err(FormatError::invalid(
                    "directory",
                    format!("the namespace {name:?} is listed under another hash"),
                ));
            }
            dir.names.insert(h.0, name);
        }
        if let Some(missing) = dir
            .scopes
            .values()
            .flat_map(|s| s.counts.keys())
            .find(|h| !dir.names.contains_key(h))
        {
            return Err(FormatError::invalid(
                "directory",
                format!("no name for the namespace hashed {missing}"),
            ));
        }
        Ok(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    #[test]
    fn commit_and_directory_round_trip() {
        let commit = Commit {
            seq: 3,
            lineage: 77,
            prev: Some(BlockRef {
                offset: 10,
                len: 20,
                crc: 30,
            }),
            root: None,
            height: 0,
            entries: 0,
            dir: BlockRef {
                offset: 1,
                len: 2,
                crc: 3,
            },
            changes: None,
            live: 99,
            from: Some(Rewritten { lineage: 5, seq: 6 }),
            dropped: None,
        };
        assert_eq!(
            Commit::decode(&commit.encode(), &Limits::default()),
            Ok(commit.clone())
        );
        // `dropped` is written only when set: other commits encode as before it existed.
        let text = String::from_utf8_lossy(&commit.encode()).into_owned();
        assert!(!text.contains("dropped"), "{text}");
        let pruned = Commit {
            dropped: Some(Dropped {
                entries: 4,
                journal: Some(9),
            }),
            ..commit
        };
        assert_eq!(
            Commit::decode(&pruned.encode(), &Limits::default()),
            Ok(pruned)
        );
        let mut dir = Directory::default();
        let scope = Scope::new(Fields::from([("gpu".to_owned(), Value::Str("a".into()))]));
        let ns = super::super::namespace_hash("matmul");
        dir.add(&scope, &ns, "matmul", 2);
        dir.add(&Scope::default(), &ns, "matmul", 1);
        let back = Directory::decode(&dir.encode(), &Limits::default()).expect("valid");
        assert_eq!(back, dir);
        assert_eq!(back.entries(), 3);
        dir.add(&scope, &ns, "matmul", -2);
        assert_eq!(dir.scopes.len(), 1, "a scope without entries is gone");
    }

    #[test]
    fn a_directory_whose_names_or_scopes_lie_is_refused() {
        let mut dir = Directory::default();
        let ns = super::super::namespace_hash("a");
        dir.add(&Scope::default(), &ns, "a", 1);
        let mut lying = dir.clone();
        lying.names.insert(ns, "b".into());
        assert!(Directory::decode(&lying.encode(), &Limits::default()).is_err());
        let mut nameless = dir.clone();
        nameless.names.clear();
        assert!(Directory::decode(&nameless.encode(), &Limits::default()).is_err());
    }
}
