//! Generations on an S3 bucket: a whole cache as one content-addressed bundle object, and one
//! pointer object that names the current one, so every rank of a job can read the same bytes.
//!
//! - `PREFIX/generations/<sha256>.tcb` is a bundle (FORMAT.md, "Bundle"), written create-only:
//!   its name is the SHA-256 of its bytes, so an object of that name is that bundle, whole.
//! - `PREFIX/generations/current` holds `{"generation": "<sha256>", "published_at": <ms>}`,
//!   advanced by compare-and-swap on its ETag only once the bundle object exists: a publisher
//!   killed at any point leaves no half generation and a pointer that names a complete one.
//! - A machine downloads a generation once into a folder of its own, verifies it (its SHA-256
//!   and the bundle's own checks), and moves it into place atomically; a process pinned to it
//!   (`TUNECACHE_GENERATION`) opens it as its read-only system tier.
//! - Old generations are pruned by age, never the one the pointer names.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest as _, Sha256};

use crate::server::S3Remote;
use crate::store::{RemoteError, Swapped};

/// `TUNECACHE_GENERATION`: the generation a process reads (`current`, or a SHA-256).
pub const ENV_GENERATION: &str = "TUNECACHE_GENERATION";

/// The generation `TUNECACHE_GENERATION` pins on the bucket of `address`, fetched once into
/// tunecache's folder (`<cache dir>/generations/`); `None` when nothing is pinned, with a
/// warning when it cannot be had (the process then reads without it).
pub(crate) fn pinned(address: &str) -> Option<PathBuf> {
    let id = std::env::var(ENV_GENERATION).ok()?;
    let id = id.trim();
    if id.is_empty() || !address.trim().starts_with("s3://") {
        return None;
    }
    let dir = cache_core::default_dir()?.join("generations");
    let fetched = S3Remote::open(address.trim(), |name| std::env::var(name).ok())
        .map_err(|e| e.to_string())
        .and_then(|store| {
            Generations::new(store)
                .fetch(id, &dir, Duration::from_secs(300))
                .map_err(|e| e.to_string())
        });
    match fetched {
        Ok(path) => Some(path),
        Err(e) => {
            tracing::warn!("tunecache: {ENV_GENERATION}={id} is not used: {e}");
            None
        }
    }
}

/// The largest generation taken (a million entries make about 560 MB).
const MAX_GENERATION_BYTES: u64 = 4 << 30;

/// The largest pointer object read.
const MAX_POINTER_BYTES: u64 = 4 << 10;

/// Why a generation could not be published, found, fetched or pruned.
#[derive(Debug, thiserror::Error)]
pub enum GenerationError {
    /// The store failed or refused.
    #[error("{0}")]
    Remote(#[from] RemoteError),
    /// The pointer names no generation yet.
    #[error("no generation has been published to {0}")]
    NoneYet(String),
    /// A generation named does not exist.
    #[error("{store} has no generation {id}")]
    Missing {
        /// Where.
        store: String,
        /// The generation.
        id: String,
    },
    /// What was read is not what its name or the bundle checks say.
    #[error("generation {id} is damaged: {detail}")]
    Damaged {
        /// The generation.
        id: String,
        /// What is wrong.
        detail: String,
    },
    /// A local file could not be read or written.
    #[error("{}: {detail}", path.display())]
    Local {
        /// The file.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
}

/// A bucket's generations.
#[derive(Debug)]
pub struct Generations {
    store: S3Remote,
}

/// A generation listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its SHA-256, in hex.
    pub id: String,
    /// When it was written, as the store says (`2026-11-27T08:16:22.000Z`).
    pub written: Option<String>,
}

impl Generations {
    /// The generations of the bucket `store` shares.
    pub fn new(store: S3Remote) -> Self {
        Generations { store }
    }

    fn key(&self, name: &str) -> String {
        self.store.object(&format!("generations/{name}"))
    }

    /// Publishes the bundle file `bundle` as a generation and makes it current; its id.
    pub fn publish(&self, bundle: &Path, timeout: Duration) -> Result<String, GenerationError> {
        let deadline = cache_core::deadline_after(timeout);
        let bytes = read_bounded(bundle)?;
        let id = hex(&Sha256::digest(&bytes));
        let objects = self.store.objects();
        // Create-only: an object of this name is already this bundle, whole.
        objects.put(&self.key(&format!("{id}.tcb")), &bytes, None, deadline)?;
        // Only now may the pointer name it.
        for _ in 0..16 {
            let seen = objects.get(&self.key("current"), MAX_POINTER_BYTES, deadline)?;
            let value = format!(
                "{{\"generation\":\"{id}\",\"published_at\":{}}}",
                cache_core::cache_format::now_millis()
            );
            let etag = seen.as_ref().and_then(|f| f.etag.as_deref());
            if seen.is_some() && etag.is_none() {
                return Err(RemoteError::Protocol("the pointer has no ETag".to_owned()).into());
            }
            match objects
                .put(&self.key("current"), value.as_bytes(), etag, deadline)?
                .0
            {
                Swapped::Set => return Ok(id),
                Swapped::Changed | Swapped::Fenced => continue,
            }
        }
        Err(RemoteError::Timeout("the pointer kept changing under 16 tries".to_owned()).into())
    }

    /// The generation the pointer names.
    pub fn current(&self, timeout: Duration) -> Result<String, GenerationError> {
        let deadline = cache_core::deadline_after(timeout);
        let describe = crate::Remote::describe(&self.store);
        let Some(fetched) =
            self.store
                .objects()
                .get(&self.key("current"), MAX_POINTER_BYTES, deadline)?
        else {
            return Err(GenerationError::NoneYet(describe));
        };
        pointer_id(&fetched.bytes).ok_or_else(|| GenerationError::Damaged {
            id: "current".to_owned(),
            detail: "the pointer does not name a generation".to_owned(),
        })
    }

    /// Every generation in the bucket, with when it was written.
    pub fn list(&self, timeout: Duration) -> Result<Vec<Listed>, GenerationError> {
        let deadline = cache_core::deadline_after(timeout);
        let prefix = self.key("");
        Ok(self
            .store
            .objects()
            .list(&prefix, deadline)?
            .into_iter()
            .filter_map(|l| {
                let id = l.key.strip_prefix(&prefix)?.strip_suffix(".tcb")?;
                is_id(id).then(|| Listed {
                    id: id.to_owned(),
                    written: l.last_modified,
                })
            })
            .collect())
    }

    /// The local file of generation `id` (`current`: the pointer's) in `dir`, downloaded and
    /// verified first if it is not there yet; written atomically, so a process killed
    /// meanwhile leaves no half file.
    pub fn fetch(
        &self,
        id: &str,
        dir: &Path,
        timeout: Duration,
    ) -> Result<PathBuf, GenerationError> {
        let deadline = cache_core::deadline_after(timeout);
        let id = if id == "current" {
            self.current(timeout)?
        } else if is_id(id) {
            id.to_owned()
        } else {
            return Err(GenerationError::Missing {
                store: crate::Remote::describe(&self.store),
                id: id.to_owned(),
            });
        };
        let target = dir.join(format!("{id}.tcb"));
        if target.is_file() {
            return Ok(target);
        }
        let local = |detail: String| GenerationError::Local {
            path: target.clone(),
            detail,
        };
        let Some(fetched) = self.store.objects().get(
            &self.key(&format!("{id}.tcb")),
            MAX_GENERATION_BYTES,
            deadline,
        )?
        else {
            return Err(GenerationError::Missing {
                store: crate::Remote::describe(&self.store),
                id,
            });
        };
        let damaged = |detail: String| GenerationError::Damaged {
            id: id.clone(),
            detail,
        };
        if hex(&Sha256::digest(&fetched.bytes)) != id {
            return Err(damaged("its bytes do not hash to its name".to_owned()));
        }
        std::fs::create_dir_all(dir).map_err(|e| local(e.to_string()))?;
        let mut file = cache_core::file::AtomicFile::create(&target, true)
            .map_err(|e| local(e.to_string()))?;
        file.write_all(&fetched.bytes)
            .map_err(|e| local(e.to_string()))?;
        file.commit_new().map_err(|e| local(e.to_string()))?;
        if let Err(e) =
            cache_core::check_bundle(&target, &cache_core::cache_format::Limits::default())
        {
            // Hashing right and failing the bundle's checks: it was published damaged.
            let _ = std::fs::remove_file(&target);
            return Err(damaged(e.to_string()));
        }
        Ok(target)
    }

    /// Deletes the generations written more than `age` before `now_ms` (Unix milliseconds),
    /// never the one the pointer names; the ids deleted.
    pub fn prune(
        &self,
        age: Duration,
        now_ms: u64,
        timeout: Duration,
    ) -> Result<Vec<String>, GenerationError> {
        let deadline = cache_core::deadline_after(timeout);
        let keep = match self.current(timeout) {
            Ok(id) => Some(id),
            Err(GenerationError::NoneYet(_)) => None,
            Err(e) => return Err(e),
        };
        let mut deleted = Vec::new();
        for listed in self.list(timeout)? {
            let old = listed
                .written
                .as_deref()
                .and_then(unix_ms)
                .is_some_and(|at| older_than(at, now_ms, age));
            if old && keep.as_deref() != Some(listed.id.as_str()) {
                self.store
                    .objects()
                    .delete(&self.key(&format!("{}.tcb", listed.id)), deadline)?;
                deleted.push(listed.id);
            }
        }
        Ok(deleted)
    }
}

/// Whether a generation written at `at_ms` is more than `age` before `now_ms` (Unix
/// milliseconds; pure). An age past what milliseconds in a u64 hold is never reached: nothing
/// is that old (a cast would wrap it round to a short age and delete young generations).
fn older_than(at_ms: u64, now_ms: u64, age: Duration) -> bool {
    let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
    now_ms.saturating_sub(at_ms) > age_ms
}

/// The bytes of `path`, a regular file of at most [`MAX_GENERATION_BYTES`].
fn read_bounded(path: &Path) -> Result<Vec<u8>, GenerationError> {
    use std::io::Read as _;
    let local = |detail: String| GenerationError::Local {
        path: path.to_owned(),
        detail,
    };
    let file = cache_core::file::open_regular(path)
        .map_err(|e| local(e.to_string()))?
        .ok_or_else(|| local("no such file".to_owned()))?;
    let mut bytes = Vec::new();
    file.take(MAX_GENERATION_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| local(e.to_string()))?;
    if bytes.len() as u64 > MAX_GENERATION_BYTES {
        return Err(local(format!(
            "larger than {} GiB",
            MAX_GENERATION_BYTES >> 30
        )));
    }
    Ok(bytes)
}

/// The generation a pointer's bytes name.
fn pointer_id(bytes: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?;
    let id = text.split("\"generation\":\"").nth(1)?.split('"').next()?;
    is_id(id).then(|| id.to_owned())
}

/// Whether `id` is a generation's name: 64 lower-case hex digits.
pub(crate) fn is_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `2026-11-27T08:16:22.000Z` (what S3 lists) as Unix milliseconds.
pub(crate) fn unix_ms(text: &str) -> Option<u64> {
    let (date, time) = text.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (h, min, s) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || min > 59 || s > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let ms: i64 = frac.get(..3).unwrap_or(frac).parse().unwrap_or(0);
    u64::try_from(((days * 24 + h) * 60 + min) * 60 + s)
        .ok()
        .map(|secs| secs * 1000 + ms as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_times_read_as_unix_milliseconds() {
        assert_eq!(unix_ms("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(unix_ms("2000-03-01T00:00:01.250Z"), Some(951_868_801_250));
        assert_eq!(unix_ms("2026-11-27T08:16:22Z"), Some(1_795_767_382_000));
        for bad in ["", "2026-13-01T00:00:00Z", "yesterday", "2026-11-27"] {
            assert_eq!(unix_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_generation_is_old_past_its_age_and_a_huge_age_is_never_reached() {
        let day = Duration::from_secs(86_400);
        let now = 1_795_767_382_000;
        assert!(older_than(now - 2 * 86_400_000, now, day));
        assert!(!older_than(now - 3_600_000, now, day));
        assert!(
            !older_than(now + 5_000, now, day),
            "a clock behind the bucket's"
        );
        // 2^64 + 1 ms: cast to u64 it was 1 ms, and every generation older than that went.
        let wraps = Duration::from_millis(u64::MAX) + Duration::from_millis(2);
        assert!(!older_than(0, now, wraps));
        assert!(!older_than(0, u64::MAX, Duration::MAX));
    }

    #[test]
    fn a_pointer_names_a_generation_or_nothing() {
        let id = "a".repeat(64);
        assert_eq!(
            pointer_id(format!("{{\"generation\":\"{id}\",\"published_at\":1}}").as_bytes()),
            Some(id)
        );
        assert_eq!(pointer_id(b"{\"generation\":\"../etc/passwd\"}"), None);
        assert_eq!(pointer_id(b"\xff"), None);
        assert!(!is_id(&"A".repeat(64)) && !is_id("abc"));
    }
}
