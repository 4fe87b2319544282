//! The artifact store: content-addressed blobs (compiled PTX, cubins, cached outputs) with a
//! size limit and least-recently-used eviction.
//!
//! A blob's key is the fingerprint of everything that went into making it ([`ArtifactStore::key`]:
//! source, options, architecture, compiler version, kernel name, configuration), so two
//! different inputs can never share a file and concurrent writers of the same key write the
//! same bytes. Each blob is `<dir>/<first two hex digits>/<fingerprint>.art`, written to a
//! temporary file and renamed into place; its header carries a checksum, so a damaged blob is
//! a miss (and is removed), never a wrong kernel. Reading a blob touches its modification time,
//! which eviction uses as the last-use time (FORMAT.md, "Artifacts").

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use cache_format::{Fields, Fingerprint, encode_fields};

use crate::error::StoreError;
use crate::fsio;

/// The first 8 bytes of every artifact file.
pub(crate) const ARTIFACT_MAGIC: &[u8; 8] = b"TCART1\0\0";

/// Domain tag of artifact keys.
pub(crate) const ARTIFACT_TAG: &[u8] = b"tunecache/artifact/1\0";

const HEADER_LEN: usize = 8 + 4 + 8;

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

/// A directory of content-addressed blobs with a size limit.
#[derive(Debug)]
pub struct ArtifactStore {
    dir: PathBuf,
    max_bytes: u64,
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
            estimate: Mutex::new(0),
        };
        let total = store.list()?.iter().map(|(_, len, _)| len).sum();
        *store.lock_estimate() = total;
        Ok(store)
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

    fn path_of(&self, key: &Fingerprint) -> PathBuf {
        let hex = key.to_hex();
        self.dir.join(&hex[..2]).join(format!("{hex}.art"))
    }

    /// The blob stored under `key`, if any. A damaged blob is removed and reported as a miss.
    pub fn get(&self, key: &Fingerprint) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.path_of(key);
        let mut file = match fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io("open", &path, e)),
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|e| StoreError::io("read", &path, e))?;
        match decode(&bytes) {
            Some(payload) => {
                // Last use, for eviction; failing to record it only makes eviction less exact.
                let _ = file.set_modified(SystemTime::now());
                Ok(Some(payload.to_vec()))
            }
            None => {
                tracing::warn!(
                    "tunecache: removing the damaged artifact {}",
                    path.display()
                );
                let _ = fs::remove_file(&path);
                Ok(None)
            }
        }
    }

    /// Stores `bytes` under `key` (atomically), then evicts least-recently-used blobs if the
    /// store is over its limit.
    pub fn put(&self, key: &Fingerprint, bytes: &[u8]) -> Result<(), StoreError> {
        let path = self.path_of(key);
        let parent = fsio::parent_dir(&path);
        fs::create_dir_all(&parent).map_err(|e| StoreError::io("create", &parent, e))?;
        let mut framed = Vec::with_capacity(bytes.len() + HEADER_LEN);
        framed.extend_from_slice(ARTIFACT_MAGIC);
        framed.extend_from_slice(&crc32fast::hash(bytes).to_be_bytes());
        framed.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        framed.extend_from_slice(bytes);
        fsio::atomic_write(&path, &framed)?;
        let over = {
            let mut estimate = self.lock_estimate();
            *estimate += framed.len() as u64;
            *estimate > self.max_bytes
        };
        if over {
            self.evict()?;
        }
        Ok(())
    }

    /// Every blob with its size and last use.
    fn list(&self) -> Result<Vec<(PathBuf, u64, SystemTime)>, StoreError> {
        let mut out = Vec::new();
        let top = match fs::read_dir(&self.dir) {
            Ok(t) => t,
            Err(e) => return Err(StoreError::io("list", &self.dir, e)),
        };
        for sub in top.flatten() {
            let Ok(files) = fs::read_dir(sub.path()) else {
                continue;
            };
            for f in files.flatten() {
                let path = f.path();
                if path.extension().is_some_and(|e| e == "art")
                    && let Ok(meta) = f.metadata()
                {
                    out.push((
                        path,
                        meta.len(),
                        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Removes least-recently-used blobs until the store is within its limit.
    pub fn evict(&self) -> Result<Eviction, StoreError> {
        let mut blobs = self.list()?;
        blobs.sort_by(|a, b| a.2.cmp(&b.2).then_with(|| a.0.cmp(&b.0)));
        let mut total: u64 = blobs.iter().map(|(_, len, _)| len).sum();
        let mut result = Eviction::default();
        for (path, len, _) in blobs {
            if total <= self.max_bytes {
                break;
            }
            // Another process may have evicted it already.
            if fs::remove_file(&path).is_ok() {
                result.removed += 1;
                result.freed += len;
            }
            total = total.saturating_sub(len);
        }
        result.kept = total;
        *self.lock_estimate() = total;
        Ok(result)
    }

    /// Bytes currently stored.
    pub fn size(&self) -> Result<u64, StoreError> {
        Ok(self.list()?.iter().map(|(_, len, _)| len).sum())
    }
}

fn decode(bytes: &[u8]) -> Option<&[u8]> {
    if bytes.len() < HEADER_LEN || &bytes[..8] != ARTIFACT_MAGIC {
        return None;
    }
    let crc = u32::from_be_bytes(bytes[8..12].try_into().ok()?);
    let len = u64::from_be_bytes(bytes[12..20].try_into().ok()?);
    let payload = &bytes[HEADER_LEN..];
    (payload.len() as u64 == len && crc32fast::hash(payload) == crc).then_some(payload)
}
