//! The shared tier as the commands use it: named by `TUNECACHE_REMOTE` (mode and budget from
//! `TUNECACHE_REMOTE_MODE` and `TUNECACHE_REMOTE_TIMEOUT_MS`). A command's own work never
//! depends on it: a server that cannot be reached is said on stderr, and the local result
//! stands.

use std::time::Duration;

use cache_core::cache_format::CacheData;
use cache_core::cache_migrate::Migrations;
use cache_remote::{ENV_REMOTE, RemoteMode, RemoteOptions, SharedTier};

use crate::output::say;

/// How long a command waits for the shared tier before it exits (a publish, a read-through,
/// a listing).
pub(crate) const WAIT: Duration = Duration::from_secs(2);

/// The shared tier of `registry`'s application and schema, if `TUNECACHE_REMOTE` names one
/// and the mode is not `off`. A value that is not a usable address is an error naming the
/// variable (no password in it).
pub(crate) fn tier(registry: &Migrations) -> anyhow::Result<Option<SharedTier>> {
    let Some(remote) = cache_remote::from_settings(crate::settings())? else {
        return Ok(None);
    };
    let (options, warnings) = remote.default_options().from_settings(crate::settings());
    for w in warnings {
        say(w);
    }
    if options.mode == RemoteMode::Off {
        return Ok(None);
    }
    Ok(Some(SharedTier::new(remote, options, registry.clone())))
}

/// Whether the shared tier may be written (`TUNECACHE_REMOTE_MODE` is not `read`).
pub(crate) fn writable() -> bool {
    RemoteOptions::default()
        .from_settings(crate::settings())
        .0
        .mode
        == RemoteMode::ReadWrite
}

/// Whether the shared tier a writing command publishes to after its local save can be used:
/// an address that names no usable store (`TUNECACHE_REMOTE`) is an error naming it before
/// anything is written, not after the save (a command that saved and then failed left the
/// user unsure of both). A store that cannot be reached is not an error: that is said after
/// the save, which still counts.
pub(crate) fn check_publishable() -> anyhow::Result<()> {
    if writable() {
        cache_remote::from_settings(crate::settings())
            .map_err(|e| anyhow::anyhow!("{e}; nothing was written (fix or unset {ENV_REMOTE})"))?;
    }
    Ok(())
}

/// Publishes `data` (just saved locally) to the shared tier, if there is a writable one, and
/// says what happened; the local save counts whatever the server does.
pub(crate) fn publish(registry: &Migrations, data: &CacheData) -> anyhow::Result<()> {
    if data.is_empty() || !writable() {
        return Ok(());
    }
    let Some(tier) = tier(registry)? else {
        return Ok(());
    };
    match tier.publish(data, WAIT.max(tier.publish_budget())) {
        Ok(p) if p.left == 0 => say(format_args!(
            "published to the shared tier at {}: {} written, {} already there",
            tier.describe(),
            p.written,
            p.unchanged
        )),
        Ok(p) => say(format_args!(
            "published to the shared tier at {}: {} written, {} already there; {} results were \
             not published (the local save still counts; `tunecache remote push` publishes them)",
            tier.describe(),
            p.written,
            p.unchanged,
            p.left
        )),
        Err(e) => say(format_args!(
            "could not publish to the shared tier at {}: {e}; {} results were not published \
             (the local save still counts; `tunecache remote push` publishes them)",
            tier.describe(),
            data.len()
        )),
    }
    Ok(())
}
