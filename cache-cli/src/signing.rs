//! Bundles signed like generations (cache-remote's `trust`): `bundle create --sign KEY` writes
//! `<bundle>.sig` beside the bundle; with `TUNECACHE_TRUST` set, `bundle verify` counts a
//! bundle the policy refuses as a problem and `bundle import` refuses it. A bundle's number
//! is not a fleet's: no rollback check.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use cache_core::cache_format::bundle::Manifest;
use cache_remote::trust::{KeyPair, Signed, Statement};

/// The signature file beside `bundle`.
pub(crate) fn sig_path(bundle: &Path) -> PathBuf {
    let mut s = bundle.as_os_str().to_owned();
    s.push(".sig");
    PathBuf::from(s)
}

/// Signs the bundle written at `bundle` (whose manifest is `manifest`) with each secret key of
/// `keys`, good for `days`; writes `<bundle>.sig`. The key ids that signed.
pub(crate) fn sign_bundle(
    bundle: &Path,
    manifest: &Manifest,
    keys: &[PathBuf],
    days: u64,
) -> anyhow::Result<Vec<String>> {
    let pairs: Vec<KeyPair> = keys
        .iter()
        .map(|k| KeyPair::read(k))
        .collect::<Result<_, _>>()?;
    let created = cache_core::cache_format::now_millis() / 1000;
    let statement = Statement::new(
        cache_remote::generation_id(bundle)?,
        manifest.app.clone(),
        manifest.schema,
        manifest
            .scopes
            .iter()
            .map(|s| s.fingerprint.clone())
            .collect(),
        0,
        created,
        created.saturating_add(days.saturating_mul(86_400)),
    );
    let sig = sig_path(bundle);
    cache_core::file::write_atomic(&sig, Signed::sign(&statement, &pairs).text().as_bytes())
        .with_context(|| format!("cannot write {}", sig.display()))?;
    Ok(pairs.iter().map(|k| k.public().key_id.clone()).collect())
}

/// With `TUNECACHE_TRUST` set: why the policy (as in force for the cache at `cache_file`)
/// refuses the bundle at `bundle`, if it does. Without: `None`. `keep`: the policy is taken
/// for good if the machine may take it (an import); else the machine's state is only read (a
/// verify changes nothing).
pub(crate) fn refusal(
    bundle: &Path,
    manifest: &Manifest,
    cache_file: Option<&Path>,
    keep: bool,
) -> anyhow::Result<Option<String>> {
    let Some(trust) = cache_remote::trust::from_settings(crate::settings())? else {
        return Ok(None);
    };
    let trust = match cache_remote::generation_dir(cache_file) {
        Some(dir) if keep => trust.in_force(&dir)?,
        Some(dir) => trust.in_force_unchanged(&dir)?,
        None => trust,
    };
    let sig = cache_core::file::read_bounded(&sig_path(bundle), 1 << 20).ok();
    let scopes: Vec<String> = manifest
        .scopes
        .iter()
        .map(|s| s.fingerprint.clone())
        .collect();
    let now = cache_core::cache_format::now_millis() / 1000;
    Ok(trust
        .verify_as(
            sig.as_deref(),
            &cache_remote::generation_id(bundle)?,
            (&manifest.app, manifest.schema, &scopes),
            now,
            None,
        )
        .err()
        .map(|e| e.to_string()))
}
