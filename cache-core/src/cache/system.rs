//! The read-only system tier: bundles or cache files shipped with an installation (a container
//! image, a wheel), read once at open behind the user's own file. Nothing here locks, writes,
//! repairs or moves them: a file that cannot be used is reported once and ignored. Lookups go
//! memory (the user's file) → system → shared tier; the user's entries win.

use std::path::{Path, PathBuf};

use cache_format::bundle::{BUNDLE_MARKER, read_bundle};
use cache_format::{Entry, Limits, Scope};
use cache_migrate::Migrations;

use crate::namespace::Namespace;

/// `TUNECACHE_SYSTEM_PATH`: system files, separated by `:`.
pub const ENV_SYSTEM_PATH: &str = "TUNECACHE_SYSTEM_PATH";

/// The entries of `scope` in the system file at `path` (a bundle or a snapshot file), read
/// through the version gate and migration of `registry`; the error says why it is not used.
pub(crate) fn load(
    path: &Path,
    registry: &Migrations,
    limits: &Limits,
    scope: &Scope,
) -> Result<Vec<(Namespace, Entry)>, String> {
    let file = crate::fsio::open_regular(path)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "no such file".to_owned())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if len > limits.max_file_bytes {
        return Err(format!(
            "{len} bytes, over the limit of {}",
            limits.max_file_bytes
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    std::io::Read::read_to_end(&mut &file, &mut bytes).map_err(|e| e.to_string())?;
    let is_bundle = bytes.len() > 12 && bytes[2..10] == *BUNDLE_MARKER.as_bytes();
    let snapshot: &[u8] = if is_bundle {
        read_bundle(&bytes, limits)
            .map_err(|e| e.to_string())?
            .snapshot
    } else {
        &bytes
    };
    let snap = cache_format::read_snapshot(snapshot, limits).map_err(|e| e.to_string())?;
    let data = cache_migrate::upgrade_snapshot(registry, &snap, limits)
        .map_err(|e| e.to_string())?
        .data;
    let mut out = Vec::new();
    for (s, ns, entry) in data.entries() {
        if s == scope
            && let Ok(ns) = Namespace::new(ns)
        {
            out.push((ns, entry.clone()));
        }
    }
    Ok(out)
}

/// The system files named by `TUNECACHE_SYSTEM_PATH`.
pub(crate) fn from_env() -> Vec<PathBuf> {
    std::env::var_os(ENV_SYSTEM_PATH)
        .map(|v| {
            std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default()
}
