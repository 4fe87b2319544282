//! The artifact store: content-addressed blobs (compiled PTX, cubins, cached outputs) with a
//! size limit and least-recently-used eviction.
//!
//! A blob's key is the fingerprint of everything that went into making it ([`ArtifactStore::key`]:
//! source, options, architecture, compiler version, kernel name, configuration), so two
//! different inputs can never share a file and concurrent writers of the same key write the
//! same bytes. Each blob is `<dir>/<first two hex digits>/<fingerprint>.art`, written to a
//! temporary file and renamed into place; its header carries a checksum, so a damaged blob is
//! a miss (and is removed), never a wrong kernel. Reading a blob touches its modification time,
//! which eviction uses as the last-use time (FORMAT.md, "Artifacts"). Large blobs are read
//! through a memory map ([`ArtifactStore::get_blob`]): checked in place, never copied.
//! Eviction measures the whole directory (every process's blobs), and removes the least
//! recently used in one batch down to a low-water mark, so a full store is not rescanned on
//! every put.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use cache_format::{Fields, Fingerprint, encode_fields};

use crate::error::StoreError;
use crate::fsio;

/// The first 8 bytes of every artifact file.
pub(crate) const ARTIFACT_MAGIC: &[u8; 8] = b"TCART1\0\0";

/// Domain tag of artifact keys.
pub(crate) const ARTIFACT_TAG: &[u8] = b"tunecache/artifact/1\0";

/// Bytes before a blob's payload: magic, CRC-32, length.
pub const ARTIFACT_HEADER_LEN: usize = 8 + 4 + 8;

/// Blobs at least this large are read through a memory map.
const MAP_AT: u64 = 64 << 10;

/// Temporary files older than this are a killed writer's, and are removed by an eviction scan.
const STALE_TEMPORARY: Duration = Duration::from_secs(3600);

/// What an eviction pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Eviction {
    /// Blobs removed.
    pub removed: usize,
    /// Bytes freed.
    pub freed: u64,
    /// Bytes kept.
    pub kept: u64,
}

/// One blob on disk, as listed by [`ArtifactStore::blobs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobInfo {
    /// Its file.
    pub path: PathBuf,
    /// Its key, from the file name.
    pub key: Fingerprint,
    /// Bytes on disk, header included.
    pub len: u64,
    /// Its last use (the file's modification time).
    pub last_use: SystemTime,
}

/// What a verification pass found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlobCheck {
    /// Blobs whose header and checksum are sound.
    pub sound: usize,
    /// Damaged blobs (removed unless the pass only looked).
    pub damaged: Vec<PathBuf>,
}

/// A blob's payload, checked: in memory, or mapped from its file for a large one (no copy).
#[derive(Debug)]
pub struct Blob {
    bytes: BlobBytes,
}

#[derive(Debug)]
enum BlobBytes {
    Heap(Vec<u8>),
    Mapped(memmap2::Mmap),
}

impl Blob {
    /// Whether the payload is mapped from the file rather than read into memory.
    pub fn is_mapped(&self) -> bool {
        matches!(self.bytes, BlobBytes::Mapped(_))
    }
}

impl std::ops::Deref for Blob {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.bytes {
            BlobBytes::Heap(v) => &v[ARTIFACT_HEADER_LEN..],
            BlobBytes::Mapped(m) => &m[ARTIFACT_HEADER_LEN..],
        }
    }
}

impl AsRef<[u8]> for Blob {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// A directory of content-addressed blobs with a size limit.
#[derive(Debug)]
pub struct ArtifactStore {
    dir: PathBuf,
    max_bytes: u64,
    /// Eviction goes down to this share of `max_bytes`.
    low_water: f64,
    /// The largest payload admitted.
    max_entry_bytes: u64,
    /// Sync each blob and its folder (kernels: yes; recomputable outputs: no need).
    durable: bool,
    /// Bytes on disk as last counted plus what this process added since.
    estimate: Mutex<u64>,
}

impl ArtifactStore {
    /// Opens (creating) the store at `dir`, keeping at most `max_bytes` of blobs.
    pub fn open(dir: impl Into<PathBuf>, max_bytes: u64) -> Result<Self, StoreError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| StoreError::io("create", &dir, e))?;
        let store = ArtifactStore {
            dir,
            max_bytes,
            low_water: 1.0,
            max_entry_bytes: u64::MAX,
            durable: true,
            estimate: Mutex::new(0),
        };
        let total = store.blobs()?.iter().map(|b| b.len).sum();
        *store.lock_estimate() = total;
        Ok(store)
    }

    /// Eviction removes blobs until the store is at most `share` (0 < share ≤ 1) of its limit,
    /// so the next puts do not each trigger a scan.
    pub fn with_low_water(mut self, share: f64) -> Self {
        self.low_water = if share.is_finite() {
            share.clamp(0.0, 1.0)
        } else {
            1.0
        };
        self
    }

    /// Refuses payloads larger than `bytes` ([`ArtifactStore::put_parts`] returns false).
    pub fn with_entry_cap(mut self, bytes: u64) -> Self {
        self.max_entry_bytes = bytes;
        self
    }

    /// Whether each write is synced to disk before it counts (default true). A store of
    /// values that can be recomputed can skip it: a write is still atomic, and a blob torn
    /// by a crash fails its checksum and is a miss.
    pub fn with_durable_writes(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// The size limit.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The default location: `<user cache dir>/tunecache/artifacts`.
    pub fn default_dir() -> Option<PathBuf> {
        crate::config::default_dir().map(|d| d.join("artifacts"))
    }

    /// The key of a blob made from `inputs` (every input that affects its bytes).
    pub fn key(inputs: &Fields) -> Fingerprint {
        let mut buf = Vec::new();
        encode_fields(inputs, &mut buf);
        Fingerprint::digest(ARTIFACT_TAG, &buf)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn lock_estimate(&self) -> std::sync::MutexGuard<'_, u64> {
        self.estimate.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The file of the blob stored under `key`.
    pub fn path_of(&self, key: &Fingerprint) -> PathBuf {
        let hex = key.to_hex();
        self.dir.join(&hex[..2]).join(format!("{hex}.art"))
    }

    /// The blob stored under `key`, if any. A damaged blob is removed and reported as a miss.
    pub fn get(&self, key: &Fingerprint) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.get_blob(key)?.map(|b| b.to_vec()))
    }

    /// The blob stored under `key`, checked; a large one is mapped, not copied. A damaged
    /// blob is removed and reported as a miss. Marks the blob used.
    pub fn get_blob(&self, key: &Fingerprint) -> Result<Option<Blob>, StoreError> {
        let path = self.path_of(key);
        let mut file = match fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io("open", &path, e)),
        };
        let len = file
            .metadata()
            .map_err(|e| StoreError::io("inspect", &path, e))?
            .len();
        let bytes = if len >= MAP_AT {
            // SAFETY: blobs are replaced by rename and removed by unlink, never truncated or
            // written in place, so the mapped pages do not change under us.
            let map = unsafe { memmap2::Mmap::map(&file) }
                .map_err(|e| StoreError::io("map", &path, e))?;
            BlobBytes::Mapped(map)
        } else {
            let mut bytes = Vec::with_capacity(len as usize);
            file.read_to_end(&mut bytes)
                .map_err(|e| StoreError::io("read", &path, e))?;
            BlobBytes::Heap(bytes)
        };
        let whole: &[u8] = match &bytes {
            BlobBytes::Heap(v) => v,
            BlobBytes::Mapped(m) => m,
        };
        if decode(whole).is_some() {
            // Last use, for eviction; failing to record it only makes eviction less exact.
            let _ = file.set_modified(SystemTime::now());
            Ok(Some(Blob { bytes }))
        } else {
            tracing::warn!(
                "tunecache: removing the damaged artifact {}",
                path.display()
            );
            let _ = fs::remove_file(&path);
            Ok(None)
        }
    }

    /// Whether a blob is stored under `key` (not checked, not marked used).
    pub fn contains(&self, key: &Fingerprint) -> bool {
        self.path_of(key).is_file()
    }

    /// Stores `bytes` under `key` (atomically), then evicts least-recently-used blobs if the
    /// store is over its limit.
    pub fn put(&self, key: &Fingerprint, bytes: &[u8]) -> Result<(), StoreError> {
        self.put_parts(key, &[bytes]).map(|_| ())
    }

    /// Stores the concatenation of `parts` under `key` (atomically, without joining them in
    /// memory), then evicts if the store is over its limit. Returns false, storing nothing,
    /// when the payload is over the per-entry cap.
    pub fn put_parts(&self, key: &Fingerprint, parts: &[&[u8]]) -> Result<bool, StoreError> {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        if len > self.max_entry_bytes || len + ARTIFACT_HEADER_LEN as u64 > self.max_bytes {
            return Ok(false);
        }
        let path = self.path_of(key);
        let parent = fsio::parent_dir(&path);
        fs::create_dir_all(&parent).map_err(|e| StoreError::io("create", &parent, e))?;
        let mut crc = crc32fast::Hasher::new();
        for p in parts {
            crc.update(p);
        }
        let mut header = [0u8; ARTIFACT_HEADER_LEN];
        header[..8].copy_from_slice(ARTIFACT_MAGIC);
        header[8..12].copy_from_slice(&crc.finalize().to_be_bytes());
        header[12..20].copy_from_slice(&len.to_be_bytes());
        let mut file = fsio::AtomicFile::create(&path, self.durable)?;
        file.write_all(&header)?;
        for p in parts {
            file.write_all(p)?;
        }
        file.commit()?;
        let over = {
            let mut estimate = self.lock_estimate();
            *estimate += len + ARTIFACT_HEADER_LEN as u64;
            *estimate > self.max_bytes
        };
        if over {
            self.evict()?;
        }
        Ok(true)
    }

    /// Removes the blob under `key`; true if there was one.
    pub fn remove(&self, key: &Fingerprint) -> bool {
        fs::remove_file(self.path_of(key)).is_ok()
    }

    /// Every blob with its size and last use. Listing changes nothing: only blobs named as
    /// this store names them (`<2 hex>/<32 hex>.art`) are listed, anything else is left alone.
    pub fn blobs(&self) -> Result<Vec<BlobInfo>, StoreError> {
        let mut out = Vec::new();
        self.each_file(|path, name, meta| {
            let key = name
                .strip_suffix(".art")
                .and_then(|h| h.parse::<Fingerprint>().ok());
            if let Some(key) = key
                && meta.is_file()
            {
                out.push(BlobInfo {
                    path: path.to_owned(),
                    key,
                    len: meta.len(),
                    last_use: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                });
            }
        })?;
        Ok(out)
    }

    /// Removes the temporary files of writers killed long ago (over an hour old, named as this
    /// store's writers name them); returns how many. Writers do it when they evict, and
    /// `tunecache outputs gc`; a listing or a report never does.
    pub fn reap_temporaries(&self) -> Result<usize, StoreError> {
        let now = SystemTime::now();
        let mut stale = Vec::new();
        self.each_file(|path, name, meta| {
            let old = meta
                .modified()
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age > STALE_TEMPORARY);
            if meta.is_file() && is_temporary(name) && old {
                stale.push(path.to_owned());
            }
        })?;
        Ok(stale
            .into_iter()
            .filter(|p| fs::remove_file(p).is_ok())
            .count())
    }

    /// Calls `f` with each file (not following links) in the store's two-hex-digit folders.
    fn each_file(&self, mut f: impl FnMut(&Path, &str, &fs::Metadata)) -> Result<(), StoreError> {
        let top = fs::read_dir(&self.dir).map_err(|e| StoreError::io("list", &self.dir, e))?;
        let hex2 =
            |n: &str| n.len() == 2 && n.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        for sub in top.flatten() {
            let is_dir = sub.file_type().is_ok_and(|t| t.is_dir());
            if !is_dir || !sub.file_name().to_str().is_some_and(hex2) {
                continue;
            }
            let Ok(files) = fs::read_dir(sub.path()) else {
                continue;
            };
            for file in files.flatten() {
                let path = file.path();
                let (Ok(meta), Some(name)) = (
                    fs::symlink_metadata(&path),
                    file.file_name().to_str().map(str::to_owned),
                ) else {
                    continue;
                };
                f(&path, &name, &meta);
            }
        }
        Ok(())
    }

    /// Removes least-recently-used blobs until the store is within its limit (down to its
    /// low-water mark), in one pass over the whole directory.
    pub fn evict(&self) -> Result<Eviction, StoreError> {
        self.evict_to(self.max_bytes, self.low_water)
    }

    /// Removes least-recently-used blobs until the store holds at most `limit` bytes (down to
    /// `share` of it once it is over).
    pub fn evict_to(&self, limit: u64, share: f64) -> Result<Eviction, StoreError> {
        let _ = self.reap_temporaries();
        let mut blobs = self.blobs()?;
        blobs.sort_by(|a, b| {
            a.last_use
                .cmp(&b.last_use)
                .then_with(|| a.path.cmp(&b.path))
        });
        let mut total: u64 = blobs.iter().map(|b| b.len).sum();
        let target = if total > limit {
            (limit as f64 * share) as u64
        } else {
            limit
        };
        let mut result = Eviction::default();
        for blob in blobs {
            if total <= target {
                break;
            }
            // Another process may have evicted it already.
            if fs::remove_file(&blob.path).is_ok() {
                result.removed += 1;
                result.freed += blob.len;
            }
            total = total.saturating_sub(blob.len);
        }
        result.kept = total;
        *self.lock_estimate() = total;
        Ok(result)
    }

    /// Checks every blob's header and checksum; removes the damaged ones unless `look_only`.
    pub fn verify(&self, look_only: bool) -> Result<BlobCheck, StoreError> {
        let mut check = BlobCheck::default();
        for blob in self.blobs()? {
            let sound = fs::read(&blob.path)
                .ok()
                .is_some_and(|b| decode(&b).is_some());
            if sound {
                check.sound += 1;
            } else {
                if !look_only {
                    let _ = fs::remove_file(&blob.path);
                }
                check.damaged.push(blob.path);
            }
        }
        check.damaged.sort();
        Ok(check)
    }

    /// The checked payload of the blob file at `path` (`None`: damaged), changing nothing.
    pub fn read_checked(path: &Path) -> Result<Option<Vec<u8>>, StoreError> {
        let bytes = fs::read(path).map_err(|e| StoreError::io("read", path, e))?;
        Ok(decode(&bytes).map(<[u8]>::to_vec))
    }

    /// Removes every blob; returns how many.
    pub fn clear(&self) -> Result<usize, StoreError> {
        let mut removed = 0;
        for blob in self.blobs()? {
            if fs::remove_file(&blob.path).is_ok() {
                removed += 1;
            }
        }
        *self.lock_estimate() = 0;
        Ok(removed)
    }

    /// Bytes currently stored.
    pub fn size(&self) -> Result<u64, StoreError> {
        Ok(self.blobs()?.iter().map(|b| b.len).sum())
    }
}

/// Whether `name` is a temporary file a writer of this store made: `.<key>.art.tmp.<pid>.<n>`,
/// or `.tmp.<pid>.<n>` from writers of earlier versions. Nothing else is ever removed.
fn is_temporary(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let legacy = name
        .strip_prefix(".tmp.")
        .and_then(|rest| rest.split_once('.'))
        .is_some_and(|(pid, n)| digits(pid) && digits(n));
    let current = fsio::temporary_of(name)
        .and_then(|target| target.strip_suffix(".art"))
        .is_some_and(|key| key.parse::<Fingerprint>().is_ok());
    legacy || current
}

fn decode(bytes: &[u8]) -> Option<&[u8]> {
    if bytes.len() < ARTIFACT_HEADER_LEN || &bytes[..8] != ARTIFACT_MAGIC {
        return None;
    }
    let crc = u32::from_be_bytes(bytes[8..12].try_into().ok()?);
    let len = u64::from_be_bytes(bytes[12..20].try_into().ok()?);
    let payload = &bytes[ARTIFACT_HEADER_LEN..];
    (payload.len() as u64 == len && crc32fast::hash(payload) == crc).then_some(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_temporaries_a_writer_of_the_store_makes_are_recognised() {
        let key = format!("{}.art", "ab".repeat(16));
        let ours = format!(
            "{}{}.{}",
            fsio::tmp_prefix(Path::new(&key)),
            std::process::id(),
            3
        );
        assert!(is_temporary(&ours), "{ours}");
        assert!(is_temporary(".tmp.123.4"), "an earlier version's");
        for other in [
            ".tmp.notes",
            ".tmp.123.4.txt",
            ".tmp.",
            ".0123.art.tmp.1.2",
            "my.tmp.file",
            &key,
        ] {
            assert!(!is_temporary(other), "{other}");
        }
    }
}
