//! Generations on an S3 bucket: a whole cache as one content-addressed bundle object, and one
//! pointer object that names the current one, so every rank of a job can read the same bytes.
//!
//! - `PREFIX/generations/<sha256>.tcb` is a bundle (FORMAT.md, "Bundle"), written create-only:
//!   its name is the SHA-256 of its bytes, so an object of that name is that bundle, whole.
//! - `PREFIX/generations/current` names the current one (`pointer.rs`), advanced by
//!   compare-and-swap on its ETag only once the bundle object exists and was checked to be the
//!   bundle its name says: a publisher killed at any point leaves no half generation, and an
//!   object planted under the next name is never pointed at.
//! - A machine downloads a generation once into a folder of its own, streaming it into a
//!   temporary file while bytes arrive, verifies it there (its SHA-256 and the bundle's own
//!   checks), and only then puts it in place; a process pinned to it (`TUNECACHE_GENERATION`)
//!   opens it as a read-only tier.
//! - Old generations are pruned by age, never one the pointer names at the moment of deletion
//!   or named lately.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest as _, Sha256};

use crate::server::S3Remote;
use crate::store::{RemoteError, Swapped};

mod fetch;
mod pointer;
mod tier;
mod warm;

pub(crate) use tier::GenerationSource;
pub use tier::{fetch_pinned, generation_dir};
pub(crate) use warm::WarmSource;

use pointer::{Pointer, Unreadable};

pub(crate) use crate::options::{ENV_GENERATION, OFF, is_id};

/// How long a pointer read, or a store that sends nothing, may take.
pub(crate) const SHORT: Duration = Duration::from_secs(10);

/// How long a download may go without a byte before it is given up on.
pub(crate) const IDLE: Duration = Duration::from_secs(15);

/// How long a generation named lately by the pointer is kept by a prune whatever its age.
const KEEP_RECENT: Duration = Duration::from_secs(600);

/// The largest generation taken (a million entries make about 560 MB).
pub(crate) const MAX_GENERATION_BYTES: u64 = 4 << 30;

/// The largest pointer object read.
const MAX_POINTER_BYTES: u64 = pointer::MAX_BYTES as u64;

/// The largest signature file read.
pub(crate) const MAX_SIGNATURE_BYTES: u64 = 1 << 20;

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
    /// What was asked for is not a generation's id (64 lower-case hex digits, or `current`).
    #[error("{0:?} is not a generation id (64 lower-case hex digits, or `current`)")]
    NotAnId(String),
    /// An object already has the generation's name but is not that generation (planted by
    /// someone who can write the bucket): never pointed at.
    #[error(
        "{store}: the object named for generation {id} holds other bytes (planted under the \
         name, or damaged): it is not pointed at"
    )]
    Squatted {
        /// Where.
        store: String,
        /// The name taken.
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
    /// The trust policy refused it (see `crate::trust`).
    #[error("{0}")]
    Refused(String),
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

    /// The store, back (to fetch through [`crate::fetch_pinned`]).
    pub fn into_store(self) -> S3Remote {
        self.store
    }

    pub(crate) fn key(&self, name: &str) -> String {
        self.store.object(&format!("generations/{name}"))
    }

    /// Publishes the bundle file `bundle` as a generation and makes it current; its id. An
    /// object already under the generation's name is hashed first: pointed at only if it is
    /// that generation, else `Squatted` (publish the bundle again with other bytes: a salt).
    /// `signed` is the generation's signature file (a [`crate::trust::Signed`]'s text), put
    /// beside it before the pointer moves, so a pinned process never sees it unsigned.
    pub fn publish(
        &self,
        bundle: &Path,
        signed: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<String, GenerationError> {
        let deadline = cache_core::deadline_after(timeout);
        let bytes = read_bounded(bundle)?;
        let id = hex(&Sha256::digest(&bytes));
        let objects = self.store.objects();
        let name = self.key(&format!("{id}.tcb"));
        // Create-only; an object already there is taken only once its bytes hash to the name.
        if objects.put(&name, &bytes, None, deadline)?.0 != Swapped::Set
            && self.hash_of(&id, deadline)?.as_deref() != Some(id.as_str())
        {
            return Err(GenerationError::Squatted {
                store: crate::Remote::describe(&self.store),
                id,
            });
        }
        if let Some(signed) = signed {
            self.put_replacing(&self.key(&format!("{id}.sig")), signed, deadline)?;
        }
        self.point_at(&id, deadline)?;
        // A prune that read the pointer before it moved may have deleted the object it now
        // names (a snapshot of unchanged contents points at an old name): put it back.
        let mut probe = |_: &[u8]| Ok(());
        let there = objects.download(&name, &mut probe, MAX_GENERATION_BYTES, IDLE, deadline)?;
        if there.is_none() {
            objects.put(&name, &bytes, None, deadline)?;
        }
        Ok(id)
    }

    /// Writes `bytes` as `object`, replacing what is there (by compare-and-swap on its ETag).
    fn put_replacing(
        &self,
        object: &str,
        bytes: &[u8],
        deadline: std::time::Instant,
    ) -> Result<(), GenerationError> {
        let objects = self.store.objects();
        for _ in 0..16 {
            let seen = objects.get(object, MAX_SIGNATURE_BYTES, deadline)?;
            let etag = seen.as_ref().and_then(|f| f.etag.as_deref());
            if objects.put(object, bytes, etag, deadline)?.0 == Swapped::Set {
                return Ok(());
            }
        }
        Err(RemoteError::Timeout(format!("{object} kept changing under 16 tries")).into())
    }

    /// The number the next signed generation gets: one more than the current one's (a
    /// statement's number only grows), 1 if there is none signed.
    pub fn next_number(&self, timeout: Duration) -> Result<u64, GenerationError> {
        let Some(p) = self.pointer(timeout)? else {
            return Ok(1);
        };
        let deadline = cache_core::deadline_after(timeout.min(SHORT));
        let sig = self.store.objects().get(
            &self.key(&format!("{}.sig", p.generation)),
            MAX_SIGNATURE_BYTES,
            deadline,
        )?;
        Ok(sig
            .and_then(|f| crate::trust::Signed::parse(&f.bytes).ok())
            .map_or(1, |(_, s)| s.number.saturating_add(1)))
    }

    /// Moves the pointer to `id` (compare-and-swap on its ETag), remembering what it named.
    fn point_at(&self, id: &str, deadline: std::time::Instant) -> Result<(), GenerationError> {
        let objects = self.store.objects();
        for _ in 0..16 {
            let seen = objects.get(&self.key("current"), MAX_POINTER_BYTES, deadline)?;
            let before = seen.as_ref().and_then(|f| Pointer::parse(&f.bytes).ok());
            let value = Pointer::next(before.as_ref(), id, cache_core::cache_format::now_millis());
            let etag = seen.as_ref().and_then(|f| f.etag.as_deref());
            if seen.is_some() && etag.is_none() {
                return Err(RemoteError::Protocol("the pointer has no ETag".to_owned()).into());
            }
            match objects
                .put(&self.key("current"), &value.encode(), etag, deadline)?
                .0
            {
                Swapped::Set => return Ok(()),
                Swapped::Changed | Swapped::Fenced => continue,
            }
        }
        Err(RemoteError::Timeout("the pointer kept changing under 16 tries".to_owned()).into())
    }

    /// The SHA-256 (hex) of the object named for generation `id`, read while bytes arrive;
    /// `None` if there is none.
    fn hash_of(
        &self,
        id: &str,
        deadline: std::time::Instant,
    ) -> Result<Option<String>, GenerationError> {
        let mut sha = Sha256::new();
        let mut sink = |b: &[u8]| {
            sha.update(b);
            Ok(())
        };
        let got = self.store.objects().download(
            &self.key(&format!("{id}.tcb")),
            &mut sink,
            MAX_GENERATION_BYTES,
            IDLE,
            deadline,
        )?;
        Ok(got.map(|_| hex(&sha.finalize())))
    }

    /// The pointer as it is now (`None`: nothing published yet).
    fn pointer(&self, timeout: Duration) -> Result<Option<Pointer>, GenerationError> {
        let deadline = cache_core::deadline_after(timeout.min(SHORT));
        let Some(fetched) =
            self.store
                .objects()
                .get(&self.key("current"), MAX_POINTER_BYTES, deadline)?
        else {
            return Ok(None);
        };
        Pointer::parse(&fetched.bytes)
            .map(Some)
            .map_err(|e| GenerationError::Damaged {
                id: "current".to_owned(),
                detail: match e {
                    Unreadable::NotAPointer(why) => format!("the pointer is not a pointer: {why}"),
                    Unreadable::NotAnId(id) => {
                        format!("the pointer names {id:?}, which is not a generation id")
                    }
                },
            })
    }

    /// The generation the pointer names (read within a short budget).
    pub fn current(&self, timeout: Duration) -> Result<String, GenerationError> {
        self.pointer(timeout)?
            .map(|p| p.generation)
            .ok_or_else(|| GenerationError::NoneYet(crate::Remote::describe(&self.store)))
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

    /// The id `id` names: a generation's, or the pointer's for `current`.
    pub(crate) fn resolve(&self, id: &str, timeout: Duration) -> Result<String, GenerationError> {
        if id == "current" {
            self.current(timeout)
        } else if is_id(id) {
            Ok(id.to_owned())
        } else {
            Err(GenerationError::NotAnId(
                id.chars().take(80).flat_map(char::escape_default).collect(),
            ))
        }
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
        // Named lately: within ten minutes, or the age asked for if that is shorter (an age of
        // 0 asks to keep only what the pointer names at the moment of each deletion).
        let keep_ms = u64::try_from(KEEP_RECENT.min(age).as_millis()).unwrap_or(u64::MAX);
        let mut deleted = Vec::new();
        for listed in self.list(timeout)? {
            let old = listed
                .written
                .as_deref()
                .and_then(crate::dates::iso_ms)
                .is_some_and(|at| older_than(at, now_ms, age));
            if !old {
                continue;
            }
            // The pointer as it is right before this deletion: what it names now, or named
            // lately (a snapshot that pointed at an old name since the listing), stays.
            if self
                .pointer(timeout)?
                .is_some_and(|p| p.keeps(&listed.id, now_ms, keep_ms))
            {
                continue;
            }
            self.store
                .objects()
                .delete(&self.key(&format!("{}.tcb", listed.id)), deadline)?;
            deleted.push(listed.id);
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

/// The id a bundle file would have as a generation: the SHA-256 of its bytes (lower-case hex),
/// read a chunk at a time.
pub fn generation_id(path: &Path) -> Result<String, GenerationError> {
    use std::io::Read as _;
    let local = |detail: String| GenerationError::Local {
        path: path.to_owned(),
        detail,
    };
    let mut file = cache_core::file::open_regular(path)
        .map_err(|e| local(e.to_string()))?
        .ok_or_else(|| local("no such file".to_owned()))?;
    let mut sha = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buf) {
            Ok(0) => return Ok(hex(&sha.finalize())),
            Ok(n) => sha.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(local(e.to_string())),
        }
    }
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

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn an_id_is_64_lower_case_hex_digits() {
        assert!(is_id(&"a".repeat(64)));
        assert!(!is_id(&"A".repeat(64)) && !is_id("abc"));
    }
}
