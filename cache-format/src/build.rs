//! Building a snapshot from entries one at a time, holding each as its encoded bytes rather
//! than as the model: for writers of very large files (an offline migration, an import) whose
//! peak memory should be a small multiple of the file, not of the decoded model.
//!
//! The bytes are exactly [`crate::encode_snapshot`]'s for the same entries, whatever the order
//! they came in (a property test checks it): the payload is written in the model's order
//! (scopes, then namespace names, then key fingerprints), each entry as
//! [`crate::encode_payload`] writes it.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::envelope::{frame_snapshot, write_str};
use crate::error::FormatError;
use crate::fingerprint::Fingerprint;
use crate::model::{Entry, Scope};
use crate::wire;

/// One namespace's entries in the arena, by key fingerprint.
type Held = BTreeMap<Fingerprint, Range<usize>>;

/// A snapshot under construction: the entries' bytes, and where each one is.
#[derive(Debug, Default)]
pub struct SnapshotBuilder {
    arena: Vec<u8>,
    scopes: BTreeMap<Scope, BTreeMap<String, BTreeMap<Fingerprint, Range<usize>>>>,
    entries: u64,
    /// Bytes of the arena the held entries use (the rest is what merges left behind).
    live: usize,
}

impl SnapshotBuilder {
    /// An empty snapshot.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `entry` to namespace `ns` of `scope`, encoded now; `false` (and nothing added) if
    /// that namespace holds an entry of the same key already.
    pub fn insert_new(&mut self, scope: &Scope, ns: &str, entry: &Entry) -> bool {
        if !self.scopes.contains_key(scope) {
            self.scopes.insert(scope.clone(), BTreeMap::new());
        }
        let namespaces = self.scopes.get_mut(scope).expect("inserted above");
        if !namespaces.contains_key(ns) {
            namespaces.insert(ns.to_owned(), BTreeMap::new());
        }
        let entries = namespaces.get_mut(ns).expect("inserted above");
        let slot = match entries.entry(entry.fingerprint()) {
            std::collections::btree_map::Entry::Occupied(_) => return false,
            std::collections::btree_map::Entry::Vacant(slot) => slot,
        };
        let start = self.arena.len();
        wire::encode_entry_into(&mut self.arena, entry);
        slot.insert(start..self.arena.len());
        self.live += self.arena.len() - start;
        self.entries += 1;
        true
    }

    /// Merges `entry` into namespace `ns` of `scope` ([`Entry::merge`], as
    /// [`crate::CacheData::insert`] does): encoded now if its key is new there, otherwise the
    /// held entry is decoded, merged and encoded again (its old bytes stay unused in the
    /// buffer until [`SnapshotBuilder::finish`]). An error is a held entry that does not
    /// decode (an entry no reader accepts, e.g. with non-finite timings, was added).
    pub fn merge(&mut self, scope: &Scope, ns: &str, entry: Entry) -> Result<(), FormatError> {
        let held = self
            .scopes
            .get(scope)
            .and_then(|n| n.get(ns))
            .and_then(|e| e.get(&entry.fingerprint()))
            .cloned();
        let Some(range) = held else {
            self.insert_new(scope, ns, &entry);
            return Ok(());
        };
        let mut merged = crate::stream::decode_entry(&self.arena[range.clone()], ns)?;
        merged.merge(entry);
        let start = self.arena.len();
        wire::encode_entry_into(&mut self.arena, &merged);
        let end = self.arena.len();
        self.live = self.live - range.len() + (end - start);
        let slot = self
            .scopes
            .get_mut(scope)
            .and_then(|n| n.get_mut(ns))
            .and_then(|e| e.get_mut(&merged.fingerprint()))
            .expect("held above");
        *slot = start..end;
        // Keys given again and again (each merge leaves the old bytes behind) must not grow
        // the buffer past a small multiple of what it holds.
        if self.arena.len() > 2 * self.live + (1 << 20) {
            self.compact();
        }
        Ok(())
    }

    /// Copies the held entries into a new buffer, leaving behind what merges replaced.
    fn compact(&mut self) {
        let mut arena = Vec::with_capacity(self.live);
        for range in self
            .scopes
            .values_mut()
            .flat_map(|n| n.values_mut())
            .flat_map(|e| e.values_mut())
        {
            let start = arena.len();
            arena.extend_from_slice(&self.arena[range.clone()]);
            *range = start..arena.len();
        }
        self.arena = arena;
    }

    /// Calls `visit` with each entry, decoded, in the order of the snapshot (scopes, namespace
    /// names, key fingerprints), until it returns an error or an entry does not decode (see
    /// [`SnapshotBuilder::merge`]).
    pub fn try_for_each<E: From<FormatError>>(
        &self,
        mut visit: impl FnMut(&Scope, &str, Entry) -> Result<(), E>,
    ) -> Result<(), E> {
        for (scope, namespaces) in &self.scopes {
            for (ns, entries) in namespaces {
                for range in entries.values() {
                    let entry = crate::stream::decode_entry(&self.arena[range.clone()], ns)?;
                    visit(scope, ns, entry)?;
                }
            }
        }
        Ok(())
    }

    /// Calls `visit` with each entry's table key, scope, namespace and encoded bytes, in the
    /// order a table holds them (see [`crate::table::TKey`]), until it returns an error.
    pub fn try_for_each_in_table_order<E>(
        &self,
        mut visit: impl FnMut(crate::table::TKey, &Scope, &str, &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        for (scope, namespaces) in &self.scopes {
            let mut by_hash: Vec<(Fingerprint, &String, &Held)> = namespaces
                .iter()
                .map(|(name, e)| (crate::table::namespace_hash(name), name, e))
                .collect();
            by_hash.sort_by_key(|(hash, ..)| *hash);
            let scope_fp = scope.fingerprint();
            for (hash, ns, entries) in by_hash {
                for (fp, range) in entries {
                    let key = crate::table::TKey::new(&scope_fp, &hash, fp);
                    visit(key, scope, ns, &self.arena[range.clone()])?;
                }
            }
        }
        Ok(())
    }

    /// The entries as the model.
    pub fn into_data(self) -> Result<crate::CacheData, FormatError> {
        let mut data = crate::CacheData::new();
        self.try_for_each(|scope, ns, entry| {
            data.insert(scope, ns, entry);
            Ok::<(), FormatError>(())
        })?;
        Ok(data)
    }

    /// How many bytes its entries take, encoded (about what they add to a snapshot).
    pub fn encoded_len(&self) -> u64 {
        self.live as u64
    }

    /// How many entries it holds.
    pub fn len(&self) -> u64 {
        self.entries
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// The snapshot file's bytes: [`crate::encode_snapshot`]`(app, schema, data)` for the data
    /// these entries make. Holds the entries' bytes and the payload at once, then frees the
    /// former.
    pub fn finish(self, app: &str, schema: u32) -> Vec<u8> {
        let SnapshotBuilder {
            arena,
            scopes,
            entries,
            live: _,
        } = self;
        let mut heads = Vec::with_capacity(scopes.len());
        let mut bound = 16;
        for (scope, namespaces) in &scopes {
            let mut fields = Vec::new();
            rmp_serde::encode::write_named(&mut fields, scope.fields())
                .expect("encoding to a Vec cannot fail");
            bound += 32 + fields.len();
            for (name, entries) in namespaces {
                bound += 16 + name.len();
                bound += entries.values().map(|r| r.len()).sum::<usize>();
            }
            heads.push(fields);
        }
        // Room for the envelope too, so framing does not move the payload.
        let mut payload = Vec::with_capacity(bound + 64 + app.len() + 128);
        rmp::encode::write_map_len(&mut payload, 1).expect("Vec write");
        write_str(&mut payload, "scopes");
        rmp::encode::write_array_len(&mut payload, len32(scopes.len())).expect("Vec write");
        for ((_, namespaces), fields) in scopes.iter().zip(heads) {
            rmp::encode::write_map_len(&mut payload, 2).expect("Vec write");
            write_str(&mut payload, "scope");
            payload.extend_from_slice(&fields);
            write_str(&mut payload, "namespaces");
            rmp::encode::write_map_len(&mut payload, len32(namespaces.len())).expect("Vec write");
            for (name, entries) in namespaces {
                write_str(&mut payload, name);
                rmp::encode::write_array_len(&mut payload, len32(entries.len()))
                    .expect("Vec write");
                for range in entries.values() {
                    payload.extend_from_slice(&arena[range.clone()]);
                }
            }
        }
        drop(arena);
        frame_snapshot(app, schema, payload, entries, scopes.len() as u64)
    }
}

/// A count as msgpack writes it (a file over 4 GiB is refused long before).
fn len32(n: usize) -> u32 {
    u32::try_from(n).expect("fewer than 2^32 items")
}
