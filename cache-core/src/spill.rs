//! Entries gathered one at a time as their encoded bytes, for imports of any size: held in
//! memory up to 32 MiB, then in a temporary file (created beside the cache it goes into, and
//! removed at once, so even a killed import leaves nothing behind), with only an index in
//! memory. What an import of a million entries holds is that index (about a hundred bytes an
//! entry), not the entries.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use cache_format::table::{TKey, namespace_hash};
use cache_format::{CacheData, Entry, Fingerprint, FormatError, Scope};

use crate::error::StoreError;

/// Bytes held in memory before the rest goes to a file.
const IN_MEMORY: usize = 32 << 20;

/// Where one entry's bytes are.
type Place = (u64, u32);

/// Entries gathered for an import (see the module docs): the same role as
/// [`cache_format::SnapshotBuilder`], spilling to a file past a bound.
#[derive(Debug)]
pub struct Spill {
    /// Bytes not yet in the file (all of them while under the bound).
    buf: Vec<u8>,
    /// The file, once one is needed, and how many bytes it holds.
    file: Option<(File, u64)>,
    /// Where a file is made.
    dir: PathBuf,
    index: BTreeMap<Scope, BTreeMap<String, BTreeMap<Fingerprint, Place>>>,
    entries: u64,
    live: u64,
}

impl Spill {
    /// An empty spill whose file, if one is needed, is made in `dir` (the folder of the cache
    /// the entries go into: its disk, not a memory-backed temporary folder).
    pub fn new(dir: &Path) -> Spill {
        Spill {
            buf: Vec::new(),
            file: None,
            dir: dir.to_owned(),
            index: BTreeMap::new(),
            entries: 0,
            live: 0,
        }
    }

    /// An empty spill whose file, if one is needed, is made in the system's temporary folder.
    pub fn in_temp() -> Spill {
        Spill::new(&std::env::temp_dir())
    }

    /// How many entries it holds.
    pub fn len(&self) -> u64 {
        self.entries
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// How many bytes its entries take, encoded.
    pub fn encoded_len(&self) -> u64 {
        self.live
    }

    fn offset(&self) -> u64 {
        self.file.as_ref().map_or(0, |(_, len)| *len) + self.buf.len() as u64
    }

    fn append(&mut self, bytes: &[u8]) -> Result<Place, StoreError> {
        let at = self.offset();
        self.buf.extend_from_slice(bytes);
        if self.buf.len() >= IN_MEMORY {
            self.flush()?;
        }
        Ok((
            at,
            u32::try_from(bytes.len()).expect("an entry under 4 GiB"),
        ))
    }

    /// Moves what memory holds to the file (made now if there is none).
    fn flush(&mut self) -> Result<(), StoreError> {
        if self.file.is_none() {
            self.file = Some((anonymous_file(&self.dir)?, 0));
        }
        let (file, len) = self.file.as_mut().expect("made above");
        file.write_all_at(&self.buf, *len)
            .map_err(|e| StoreError::io("write the import's spill file in", &self.dir, e))?;
        *len += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    fn read(&self, (at, len): Place) -> Result<Vec<u8>, StoreError> {
        let in_file = self.file.as_ref().map_or(0, |(_, n)| *n);
        if at >= in_file {
            let start = usize::try_from(at - in_file).expect("within the buffer");
            return Ok(self.buf[start..start + len as usize].to_vec());
        }
        let mut out = vec![0u8; len as usize];
        let (file, _) = self.file.as_ref().expect("at is before the buffer");
        file.read_exact_at(&mut out, at)
            .map_err(|e| StoreError::io("read the import's spill file in", &self.dir, e))?;
        Ok(out)
    }

    fn decode(&self, place: Place, ns: &str) -> Result<Entry, StoreError> {
        let bytes = self.read(place)?;
        cache_format::raw::decode_entry(&bytes, ns).map_err(spill_error)
    }

    /// Whether it holds an entry for key `fp` of namespace `ns` in `scope`.
    pub(crate) fn holds(&self, scope: &Scope, ns: &str, fp: &Fingerprint) -> bool {
        self.index
            .get(scope)
            .and_then(|n| n.get(ns))
            .is_some_and(|e| e.contains_key(fp))
    }

    /// Merges `entry` into namespace `ns` of `scope` ([`Entry::merge`]): encoded now if its key
    /// is new there, otherwise the held entry is read back, merged and encoded again.
    pub fn merge(&mut self, scope: &Scope, ns: &str, entry: Entry) -> Result<(), StoreError> {
        let fp = entry.fingerprint();
        let held = self
            .index
            .get(scope)
            .and_then(|n| n.get(ns))
            .and_then(|e| e.get(&fp))
            .copied();
        let entry = match held {
            Some(place) => {
                let mut merged = self.decode(place, ns)?;
                merged.merge(entry);
                self.live -= u64::from(place.1);
                merged
            }
            None => {
                self.entries += 1;
                entry
            }
        };
        let bytes = cache_format::table::encode_entry(&entry);
        let place = self.append(&bytes)?;
        self.live += u64::from(place.1);
        if !self.index.contains_key(scope) {
            self.index.insert(scope.clone(), BTreeMap::new());
        }
        let namespaces = self.index.get_mut(scope).expect("inserted above");
        if !namespaces.contains_key(ns) {
            namespaces.insert(ns.to_owned(), BTreeMap::new());
        }
        namespaces
            .get_mut(ns)
            .expect("inserted above")
            .insert(fp, place);
        Ok(())
    }

    /// Calls `visit` with each entry, decoded, in the order of a snapshot (scopes, namespace
    /// names, key fingerprints), until it returns an error.
    pub fn try_for_each<E: From<StoreError>>(
        &self,
        mut visit: impl FnMut(&Scope, &str, Entry) -> Result<(), E>,
    ) -> Result<(), E> {
        for (scope, namespaces) in &self.index {
            for (ns, entries) in namespaces {
                for place in entries.values() {
                    visit(scope, ns, self.decode(*place, ns)?)?;
                }
            }
        }
        Ok(())
    }

    /// The keys of every entry in the order a table holds them, with their scope, namespace
    /// and where their bytes are: what [`Spill::bytes`] reads.
    pub(crate) fn in_table_order(&self) -> Vec<(TKey, &Scope, &str, Place)> {
        let mut out = Vec::with_capacity(usize::try_from(self.entries).unwrap_or(0));
        for (scope, namespaces) in &self.index {
            let scope_fp = scope.fingerprint();
            let mut by_hash: Vec<(Fingerprint, &String)> =
                namespaces.keys().map(|n| (namespace_hash(n), n)).collect();
            by_hash.sort();
            for (hash, ns) in by_hash {
                for (fp, place) in &namespaces[ns] {
                    out.push((TKey::new(&scope_fp, &hash, fp), scope, ns.as_str(), *place));
                }
            }
        }
        out
    }

    /// An entry's bytes, where [`Spill::in_table_order`] says they are.
    pub(crate) fn bytes(&self, place: Place) -> Result<Vec<u8>, StoreError> {
        self.read(place)
    }

    /// The entries as the model (for a few: the rest stream).
    pub fn into_data(self) -> Result<CacheData, StoreError> {
        self.to_data()
    }

    /// [`Spill::into_data`], keeping the spill.
    pub(crate) fn to_data(&self) -> Result<CacheData, StoreError> {
        let mut data = CacheData::new();
        self.try_for_each(|scope, ns, entry| {
            data.insert(scope, ns, entry);
            Ok::<(), StoreError>(())
        })?;
        Ok(data)
    }
}

/// A file in `dir` that nobody else can see: created under a name nobody else uses, removed at
/// once (the descriptor keeps it until it is closed or the process dies).
pub(crate) fn anonymous_file(dir: &Path) -> Result<File, StoreError> {
    let path = dir.join(format!(
        ".tunecache-spill.{}.{:016x}",
        std::process::id(),
        crate::fsio::nonce()
    ));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| StoreError::io("create the import's spill file", &path, e))?;
    std::fs::remove_file(&path).map_err(|e| StoreError::io("remove", &path, e))?;
    Ok(file)
}

/// A spilled entry that does not decode (it was written by this process: a bug or damage).
fn spill_error(source: FormatError) -> StoreError {
    StoreError::Format {
        path: PathBuf::from("(the import's spill file)"),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cache_format::{Candidate, Fields, Key, Stats, Value};

    fn entry(id: i64, algo: &str) -> Entry {
        let key = Key::new(Fields::from([("id".to_owned(), Value::Int(id))]));
        let stats = Stats {
            median_ns: 5.0,
            min_ns: 5.0,
            spread_ns: 0.0,
            samples: 1,
        };
        Entry::new(
            key,
            Fingerprint::default(),
            crate::measured_here(),
            1,
            [Candidate::measured(algo, Fields::new(), stats)],
        )
    }

    /// Past its memory bound a spill goes on in a file, merges keys given again, and gives
    /// back exactly the model the same merges make.
    #[test]
    fn a_spill_past_its_bound_gives_back_the_merged_model() {
        let dir = tempfile::tempdir().expect("dir");
        let mut spill = Spill::new(dir.path());
        let mut model = CacheData::new();
        let scope = Scope::default();
        // About 50 MB of entries: over the 32 MiB held in memory.
        let big = "x".repeat(1000);
        for i in 0..50_000 {
            let e = entry(i % 40_000, &format!("{big}{}", i / 40_000));
            model.insert(&scope, "mm", e.clone());
            spill.merge(&scope, "mm", e).expect("spilled");
        }
        assert!(spill.file.is_some(), "the file took over");
        assert_eq!(spill.len(), 40_000);
        let listed = std::fs::read_dir(dir.path()).expect("dir").count();
        assert_eq!(listed, 0, "the spill file is not left in the folder");
        let order = spill.in_table_order();
        assert!(order.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(spill.into_data().expect("decodes"), model);
    }
}
