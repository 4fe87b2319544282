//! Fetching a generation: streamed into a temporary file beside its place while bytes arrive,
//! verified there (its SHA-256, every check of the bundle, and with a trust policy its
//! signatures), and only then put in place.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest as _, Sha256};

use cache_core::cache_format::Limits;

use super::{GenerationError, Generations, IDLE, MAX_GENERATION_BYTES, MAX_SIGNATURE_BYTES, hex};
use crate::trust::Trust;

impl Generations {
    /// The local file of generation `id` (`current`: the pointer's) in `dir`: downloaded first
    /// if it is not there yet, streamed into a temporary file while bytes arrive (`timeout` in
    /// all; a store silent for 15 s is given up on), verified there (its SHA-256, every
    /// check of the bundle, and `verify`'s: a trust policy), and only then put in place. A
    /// process killed meanwhile leaves no file in place; what is in place was verified.
    pub fn fetch(
        &self,
        id: &str,
        dir: &Path,
        timeout: Duration,
        trust: Option<&Trust>,
    ) -> Result<PathBuf, GenerationError> {
        let deadline = cache_core::deadline_after(timeout);
        let id = self.resolve(id, timeout)?;
        let target = dir.join(format!("{id}.tcb"));
        if target.is_file() {
            // Verified whole when it was put in place; with a policy, its signature is checked
            // again (it may have expired since, or the machine seen a higher number).
            if let Some(trust) = trust {
                recheck(trust, &target, &id, dir)?;
            }
            return Ok(target);
        }
        let local = |detail: String| GenerationError::Local {
            path: target.clone(),
            detail,
        };
        let damaged = |detail: String| GenerationError::Damaged {
            id: id.clone(),
            detail,
        };
        std::fs::create_dir_all(dir).map_err(|e| local(e.to_string()))?;
        remove_abandoned_downloads(dir);
        let mut file = cache_core::file::AtomicFile::create(&target, true)
            .map_err(|e| local(e.to_string()))?;
        let mut sha = Sha256::new();
        let mut written: Result<(), String> = Ok(());
        let mut sink = |b: &[u8]| {
            sha.update(b);
            if written.is_ok() {
                written = file.write_all(b).map_err(|e| e.to_string());
            }
            Ok(())
        };
        let got = self.store.objects().download(
            &self.key(&format!("{id}.tcb")),
            &mut sink,
            MAX_GENERATION_BYTES,
            IDLE,
            deadline,
        )?;
        let Some(got) = got else {
            return Err(GenerationError::Missing {
                store: crate::Remote::describe(&self.store),
                id,
            });
        };
        written.map_err(local)?;
        if hex(&sha.finalize()) != id {
            return Err(damaged("its bytes do not hash to its name".to_owned()));
        }
        let tmp = file
            .written_path()
            .map_err(|e| local(e.to_string()))?
            .to_owned();
        let checked = check_downloaded(&tmp).map_err(damaged)?;
        if let Some(trust) = trust {
            let manifest = checked
                .manifest
                .as_ref()
                .ok_or_else(|| damaged("no manifest".to_owned()))?;
            let sig = self
                .store
                .objects()
                .get(
                    &self.key(&format!("{id}.sig")),
                    MAX_SIGNATURE_BYTES,
                    deadline,
                )?
                .map(|f| f.bytes);
            verify_signed(trust, sig.as_deref(), &id, manifest, dir)?;
            if let Some(sig) = &sig {
                cache_core::file::write_atomic(&dir.join(format!("{id}.tcb.sig")), sig)
                    .map_err(|e| local(e.to_string()))?;
            }
        }
        // When the store wrote it, beside it, for a warm-up to tell which keys were
        // published after it (not kept: that costs the warm-up a listing of the generations).
        if let Some(written) = got.written {
            let _ = cache_core::file::write_atomic(
                &written_path(&target),
                written.to_string().as_bytes(),
            );
        }
        match file.commit_new() {
            Ok(()) => Ok(target),
            // Another fetch put the same verified generation in place first.
            Err(_) if target.is_file() => Ok(target),
            Err(e) => Err(local(e.to_string())),
        }
    }
}

/// Removes what downloads of generations into `dir` left when their process died (a worker
/// that exited while its warm-up was downloading): the temporaries of `<id>.tcb` and
/// `<id>.tcb.written` whose writer is gone (their lock is free), never anything else.
fn remove_abandoned_downloads(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut targets = std::collections::BTreeSet::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix('.')) else {
            continue;
        };
        for suffix in [".tcb.tmp.", ".tcb.written.tmp."] {
            if let Some((id, _)) = rest.split_once(suffix)
                && super::is_id(id)
            {
                targets.insert(format!("{id}{}", &suffix[..suffix.len() - ".tmp.".len()]));
            }
        }
    }
    for target in targets {
        cache_core::file::remove_abandoned_temporaries(&dir.join(target));
    }
}

/// Every check of a bundle on a downloaded generation (it hashed right: one that fails them
/// was published damaged); what is wrong, if anything.
fn check_downloaded(tmp: &Path) -> Result<cache_core::BundleCheck, String> {
    let checked = cache_core::check_bundle(tmp, &Limits::default()).map_err(|e| e.to_string())?;
    match checked.problems.first() {
        None => Ok(checked),
        Some(first) => Err(format!(
            "{first}{}",
            match checked.problems.len() {
                1 => String::new(),
                n => format!(" (and {} more problems)", n - 1),
            }
        )),
    }
}

/// Where the time the store wrote generation `target` is kept (Unix seconds, as text).
pub(crate) fn written_path(target: &Path) -> PathBuf {
    let mut name = target.as_os_str().to_owned();
    name.push(".written");
    PathBuf::from(name)
}

/// The time the store wrote generation `target`, as [`Generations::fetch`] kept it; `None` if
/// it was not kept (fetched before it was, or the store did not say) or cannot be read.
pub(crate) fn written_of(target: &Path) -> Option<i64> {
    let bytes = cache_core::file::read_bounded(&written_path(target), 32).ok()?;
    // Decimal digits only (FORMAT.md): no sign, no spacing.
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(&bytes).ok()?.parse().ok()
}

/// A generation already in place, with a trust policy: its signature checked again.
fn recheck(trust: &Trust, target: &Path, id: &str, dir: &Path) -> Result<u64, GenerationError> {
    let sig = std::fs::read(dir.join(format!("{id}.tcb.sig"))).ok();
    let manifest = cache_core::open_bundle(target, &Limits::default(), None)
        .map_err(|e| GenerationError::Local {
            path: target.to_owned(),
            detail: e.to_string(),
        })?
        .0;
    verify_signed(trust, sig.as_deref(), id, &manifest, dir)
}

/// Checks a generation's signature file against the policy in force in `dir`.
fn verify_signed(
    trust: &Trust,
    sig: Option<&[u8]>,
    id: &str,
    manifest: &cache_core::cache_format::bundle::Manifest,
    dir: &Path,
) -> Result<u64, GenerationError> {
    let scopes: Vec<String> = manifest
        .scopes
        .iter()
        .map(|s| s.fingerprint.clone())
        .collect();
    let now = cache_core::cache_format::now_millis() / 1000;
    trust
        .verify(sig, id, (&manifest.app, manifest.schema, &scopes), now, dir)
        .map_err(|e| GenerationError::Refused(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aged(path: &Path) {
        let f = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .expect("made");
        f.set_modified(std::time::SystemTime::now() - Duration::from_secs(120))
            .expect("aged");
    }

    /// What a download killed midway left is removed at the next fetch into the folder: its
    /// temporaries and those of the time kept beside it, unless a live writer holds them;
    /// nothing else (look-alike names, another id's finished file, files of other tools).
    #[test]
    fn a_fetch_removes_what_killed_downloads_left_and_nothing_else() {
        let dir = tempfile::tempdir().expect("dir");
        let id = "a".repeat(64);
        let left = [
            format!(".{id}.tcb.tmp.4242.0"),
            format!(".{id}.tcb.written.tmp.4242.1"),
        ];
        let kept = [
            format!("{id}.tcb"),
            format!("{id}.tcb.written"),
            format!(".{id}.tcb.tmp.x"),
            ".notanid.tcb.tmp.1.0".to_owned(),
            format!(".{}.tcb.tmp.1.0", "A".repeat(64)),
            "notes.txt".to_owned(),
            format!(".{id}.tcb.tmp.4243.0x"),
        ];
        for name in left.iter().chain(&kept) {
            aged(&dir.path().join(name));
        }
        // A download still going on: its temporary is locked.
        let live = dir.path().join(format!(".{id}.tcb.tmp.4244.0"));
        aged(&live);
        let held = std::fs::File::open(&live).expect("open");
        held.lock().expect("locked");
        remove_abandoned_downloads(dir.path());
        for name in &left {
            assert!(!dir.path().join(name).exists(), "{name} was left");
        }
        for name in &kept {
            assert!(dir.path().join(name).exists(), "{name} was removed");
        }
        assert!(live.exists(), "a live download's temporary was removed");
    }

    /// The time kept beside a generation is decimal digits, nothing else.
    #[test]
    fn only_decimal_digits_are_a_written_time() {
        let dir = tempfile::tempdir().expect("dir");
        let target = dir.path().join("g.tcb");
        for (text, read) in [
            ("1764000000", Some(1_764_000_000)),
            ("0", Some(0)),
            ("-5", None),
            ("+5", None),
            (" 5", None),
            ("5\n", None),
            ("", None),
            ("0x10", None),
            ("99999999999999999999999", None),
        ] {
            std::fs::write(written_path(&target), text).expect("write");
            assert_eq!(written_of(&target), read, "{text:?}");
        }
    }
}
