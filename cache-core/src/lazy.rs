//! Entries kept as their bytes in the snapshot file until first used.
//!
//! Opening a cache checks every entry of its snapshot (the envelope's checksums, then one walk,
//! [`cache_format::raw::walk_checked_payload`], that makes the bounded scan's and the census's
//! checks and, on each entry, [`cache_format::raw::entry_facts`]' own: its shape, UTF-8,
//! finite timings, and that the stored fingerprint is the key's), but builds none: the
//! memory tier holds, per entry of the cache's own scope, where its bytes are in the file. The
//! first lookup of a key reads those bytes back with `pread` from the file descriptor the
//! snapshot was read through, decodes them with the decoder every other read uses, and keeps
//! the decoded entry. A process that looks up a few hundred keys of a large cache so pays for
//! those only, and holds about a hundred bytes per entry it never touched, not the decoded
//! model.
//!
//! The descriptor keeps the file's contents reachable even after a compaction replaces it
//! (tunecache renames a new snapshot over the old, never writes one in place), so offsets
//! stay valid for the life of the entries that use them. A file changed in place by someone
//! else is detected when read back (a short read, bytes that do not decode, a key whose
//! fingerprint is not the slot's): that entry is then a miss, with a warning, and is measured
//! again. Nothing can fault: no memory map is involved.

use std::fs::File;
use std::ops::ControlFlow;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use cache_format::{CacheData, Entry, Fingerprint, Limits, Scope, Snapshot};

use crate::namespace::Namespace;

/// The snapshot file entries are read back from.
#[derive(Debug)]
pub(crate) struct Source {
    file: File,
    path: PathBuf,
}

impl Source {
    pub(crate) fn new(file: File, path: PathBuf) -> Arc<Self> {
        Arc::new(Source { file, path })
    }

    /// The file's first `len` bytes (up to the end of the last entry wanted), for decoding
    /// many of its entries at once. Sized from the entries, not from the file's length now,
    /// which someone may have grown in place.
    fn read_prefix(&self, len: u64) -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0u8; usize::try_from(len).map_err(std::io::Error::other)?];
        self.file.read_exact_at(&mut buf, 0)?;
        Ok(buf)
    }
}

/// One entry in a snapshot file, decoded on first use.
#[derive(Debug)]
pub(crate) struct StoredEntry {
    source: Arc<Source>,
    offset: u64,
    len: u32,
    decoded: OnceLock<Option<Arc<Entry>>>,
}

impl StoredEntry {
    pub(crate) fn new(source: Arc<Source>, offset: u64, len: u32) -> Arc<Self> {
        Arc::new(StoredEntry {
            source,
            offset,
            len,
            decoded: OnceLock::new(),
        })
    }

    /// The entry, decoded now if this is its first use (and kept); `None` if its bytes no
    /// longer decode to the key `fp` of namespace `ns` (the file was changed in place).
    pub(crate) fn entry(&self, ns: &str, fp: &Fingerprint) -> Option<Arc<Entry>> {
        self.decoded
            .get_or_init(|| self.load(ns, fp, None).map(Arc::new))
            .clone()
    }

    /// The entry if it was decoded already (`Some(None)`: it no longer decodes); `None` if
    /// using it would read the file.
    pub(crate) fn decoded(&self) -> Option<Option<Arc<Entry>>> {
        self.decoded.get().cloned()
    }

    /// The entry without keeping it (for walks over every entry, which would otherwise leave
    /// the whole cache decoded): the kept one if there is one, else decoded from `file` (the
    /// whole source, read once by the caller) or read back alone.
    fn peek(&self, ns: &str, fp: &Fingerprint, file: Option<&[u8]>) -> Option<Arc<Entry>> {
        match self.decoded.get() {
            Some(kept) => kept.clone(),
            None => self.load(ns, fp, file).map(Arc::new),
        }
    }

    fn load(&self, ns: &str, fp: &Fingerprint, file: Option<&[u8]>) -> Option<Entry> {
        let read;
        let bytes = match file {
            Some(file) => usize::try_from(self.offset)
                .ok()
                .and_then(|at| file.get(at..at.checked_add(self.len as usize)?)),
            None => {
                let mut buf = vec![0u8; self.len as usize];
                read = self
                    .source
                    .file
                    .read_exact_at(&mut buf, self.offset)
                    .map(|()| buf);
                read.as_deref().ok()
            }
        };
        let decoded = match bytes {
            Some(bytes) => cache_format::raw::decode_entry(bytes, ns).map_err(|e| e.to_string()),
            None => Err("it can no longer be read (the file was shortened)".to_owned()),
        };
        match decoded {
            Ok(entry) if entry.fingerprint() == *fp => Some(entry),
            Ok(_) => {
                self.changed_under_us(fp, "its bytes now hold another key");
                None
            }
            Err(why) => {
                self.changed_under_us(fp, &why);
                None
            }
        }
    }

    fn changed_under_us(&self, fp: &Fingerprint, why: &str) {
        tracing::warn!(
            "tunecache: the entry {fp} of {} was changed in place since it was opened ({why}); it is treated as missing and will be measured again",
            self.source.path.display()
        );
    }
}

/// Decodes the stored entries of `items` (keeping them with `keep`), reading each source file
/// once (up to the end of the last entry wanted) when many of its entries are wanted, entry by
/// entry otherwise. Returns them in the order of `items`; `None` where an entry no longer
/// decodes.
pub(crate) fn decode_all(
    items: &[(&str, Fingerprint, &StoredEntry)],
    keep: bool,
) -> Vec<Option<Arc<Entry>>> {
    /// Fewer wanted entries than this are read back one by one.
    const WHOLE_FROM: usize = 64;
    // Per source: how many entries are wanted, and where the last of them ends.
    let mut wanted: std::collections::HashMap<*const Source, (usize, u64)> = Default::default();
    for (_, _, s) in items {
        if s.decoded.get().is_none() {
            let (count, end) = wanted.entry(Arc::as_ptr(&s.source)).or_default();
            *count += 1;
            *end = (*end).max(s.offset.saturating_add(u64::from(s.len)));
        }
    }
    let mut files: std::collections::HashMap<*const Source, Option<Vec<u8>>> = Default::default();
    items
        .iter()
        .map(|(ns, fp, s)| {
            let key = Arc::as_ptr(&s.source);
            let file = match wanted.get(&key) {
                Some((count, end)) if *count >= WHOLE_FROM => files
                    .entry(key)
                    .or_insert_with(|| s.source.read_prefix(*end).ok())
                    .as_deref(),
                _ => None,
            };
            if keep {
                s.decoded
                    .get_or_init(|| s.load(ns, fp, file).map(Arc::new))
                    .clone()
            } else {
                s.peek(ns, fp, file)
            }
        })
        .collect()
}

/// An entry stored, not decoded: its namespace, fingerprint and where it is.
pub(crate) type Indexed = (Namespace, Fingerprint, Arc<StoredEntry>);

/// Reads a snapshot (its framing checked by [`cache_format::read_snapshot_framing`]; `bytes`,
/// the whole file) without building the entries of `scope` that pass
/// [`cache_format::raw::entry_facts`]: those are returned as stored entries of the file
/// `source` makes. The payload is checked as [`cache_format::read_snapshot`] checks it, in the
/// same walk. Everything else (other scopes, entries in another writer's encoding, entries
/// dated in the future, which the caller must clamp, and namespaces it must refuse) is
/// decoded into the data returned. `None` if the walk refuses the payload or an entry does
/// not decode: the caller then checks and decodes the whole payload, which reports the damage
/// as every reader does.
pub(crate) fn index_snapshot(
    snap: &Snapshot<'_>,
    bytes: &[u8],
    scope: &Scope,
    limits: &Limits,
    source: impl FnOnce() -> Arc<Source>,
) -> Option<(CacheData, Vec<Indexed>)> {
    let payload = snap.payload_bytes();
    let base = (payload.as_ptr() as usize).checked_sub(bytes.as_ptr() as usize)?;
    let now = cache_format::now_millis();
    let mut source = Some(source);
    let mut file: Option<Arc<Source>> = None;
    let mut data = CacheData::new();
    let mut stored = Vec::new();
    let mut named: Option<(String, Namespace)> = None;
    let mut failed = false;
    let walked = cache_format::raw::walk_checked_payload(payload, limits, |s, ns, entry, facts| {
        let at = entry.as_ptr() as usize - payload.as_ptr() as usize;
        let fast = facts.filter(|facts| facts.latest <= now && s == scope);
        let namespace = match &named {
            Some((name, n)) if name == ns => Some(*n),
            _ => Namespace::new(ns)
                .ok()
                .inspect(|n| named = Some((ns.to_owned(), *n))),
        };
        match (fast, namespace, u32::try_from(entry.len())) {
            (Some(facts), Some(namespace), Ok(len)) => {
                let file = file.get_or_insert_with(|| source.take().expect("called once")());
                let offset = (base + at) as u64;
                stored.push((
                    namespace,
                    facts.fingerprint,
                    StoredEntry::new(Arc::clone(file), offset, len),
                ));
            }
            _ => match cache_format::raw::decode_entry(entry, ns) {
                Ok(decoded) => data.insert(s, ns, decoded),
                Err(_) => {
                    failed = true;
                    return ControlFlow::Break(());
                }
            },
        }
        ControlFlow::Continue(())
    });
    (walked.is_ok() && !failed).then_some((data, stored))
}
