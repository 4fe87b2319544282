//! The bucket's current generation as a warm-up for a process that pins none: a fresh machine
//! of a fleet reads the keys the generation holds from one download, not one object each.
//!
//! A background thread reads the pointer and fetches the current generation into the one
//! local folder (as a pinned one is: verified whole, signatures checked under a trust policy),
//! then lists this scope's per-key objects once: a key published one at a time after the
//! generation was written (less [`CUT_MARGIN_S`], as the snapshot may have read its file a
//! little earlier) is not answered from the generation, so it is read per key as before. A
//! lookup never waits for it: until it is ready, keys are read per key. No generation
//! published, or one that cannot be used, leaves things as they were (the latter with one
//! warning). `TUNECACHE_GENERATION=off` turns it off; a pinned generation replaces it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cache_core::cache_format::{Fingerprint, Limits, Scope};
use cache_core::cache_migrate::Migrations;
use cache_core::{Namespace, Tier, TierContext, TierSource};

use super::fetch::written_of;
use super::tier::{DOWNLOAD_CAP, GenerationTier, Newer, State, fetch_pinned, generation_dir};
use super::{ENV_GENERATION, GenerationError, Generations, SHORT};
use crate::dates::iso_ms;
use crate::layout::Layout;
use crate::options::RemoteMode;
use crate::server::S3Remote;

/// How long before the generation was written a key published one at a time is still read
/// per key: a snapshot reads its cache file, bundles and uploads it, and a key published
/// meanwhile may be newer than the generation's copy.
pub(crate) const CUT_MARGIN_S: i64 = 600;

/// How long the listing of a scope's per-key objects may take.
const LISTING_WITHIN: Duration = Duration::from_secs(60);

/// The bucket's current generation, to warm a cache from (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct WarmSource {
    address: String,
    /// The trust policy file (`None`: `TUNECACHE_TRUST`'s).
    trust: Option<PathBuf>,
    /// The settings the bucket is opened with (its endpoint and credentials).
    settings: cache_core::settings::Settings,
}

impl WarmSource {
    /// A warm-up from the bucket `address`, if it is an S3 bucket, no generation is pinned
    /// (`TUNECACHE_GENERATION` unset or empty; `off` turns the warm-up off too) and the
    /// shared tier is not off.
    pub(crate) fn from_settings(
        address: &str,
        trust: Option<&Path>,
        settings: &cache_core::settings::Settings,
    ) -> Option<Self> {
        // `off` in any case turns it off, as any pin replaces it.
        let pinned = settings.get(ENV_GENERATION).map_or("", str::trim);
        let mode = crate::RemoteOptions::default()
            .from_settings(settings)
            .0
            .mode;
        if !pinned.is_empty() || mode == RemoteMode::Off || !address.trim().starts_with("s3://") {
            return None;
        }
        Some(WarmSource {
            address: address.trim().to_owned(),
            trust: trust
                .map(Path::to_owned)
                .or_else(|| crate::trust::policy_path(settings)),
            settings: settings.clone(),
        })
    }
}

impl TierSource for WarmSource {
    fn open(&self, ctx: &mut TierContext<'_>) -> Option<Arc<dyn Tier>> {
        // An address that cannot be used, or no folder to keep a generation in: no warm-up
        // (the shared tier says what is wrong with the address).
        // A cache without a file (in memory, or switched off with TUNECACHE_DISABLE) writes
        // nothing anywhere: no warm-up.
        let dir = generation_dir(Some(ctx.cache_file?))?;
        let env = |name: &str| self.settings.get(name).map(str::to_owned);
        let fetcher = S3Remote::open(&self.address, env).ok()?;
        let lister = S3Remote::open(&self.address, env).ok()?;
        let tier = Arc::new(GenerationTier::new(
            format!(
                "current generation of {} (a warm-up)",
                crate::Remote::describe(&fetcher)
            ),
            true,
        ));
        let (registry, limits, scope) = (Arc::clone(ctx.registry), *ctx.limits, ctx.scope.clone());
        let (worker, trust) = (Arc::clone(&tier), self.trust.clone());
        let spawned = cache_core::spawn_background("tunecache-warm-up".into(), move || {
            let state = warm_up(
                fetcher,
                lister,
                &dir,
                trust.as_deref(),
                (&registry, &limits, &scope),
            );
            if let State::Refused(why) = &state {
                tracing::warn!(
                    "tunecache: the bucket's current generation is not used to warm this cache: \
                     {why}; keys are read one at a time"
                );
            }
            worker.set(state);
        });
        if let Err(e) = spawned {
            tier.set(State::Refused(format!("no thread to fetch it: {e}")));
        }
        Some(tier)
    }
}

/// Fetches the current generation into `dir` and works out which of its keys were published
/// after it; the state the tier serves from.
fn warm_up(
    fetcher: S3Remote,
    lister: S3Remote,
    dir: &Path,
    trust: Option<&Path>,
    (registry, limits, scope): (&Migrations, &Limits, &Scope),
) -> State {
    let path = match fetch_pinned(fetcher, "current", dir, DOWNLOAD_CAP, trust) {
        Ok(path) => path,
        Err(GenerationError::NoneYet(_)) => {
            return State::Empty("no generation has been published to the bucket".to_owned());
        }
        Err(e) => return State::Refused(e.to_string()),
    };
    let Some(id) = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".tcb"))
    else {
        return State::Refused(format!("{} is not a generation's file", path.display()));
    };
    let generations = Generations::new(lister);
    let written = match written_of(&path) {
        Some(seconds) => seconds,
        None => match generations.list(SHORT) {
            Ok(listed) => match listed
                .iter()
                .find(|g| g.id == id)
                .and_then(|g| g.written.as_deref().and_then(iso_ms))
            {
                Some(ms) => (ms / 1000) as i64,
                None => {
                    return State::Refused(format!(
                        "the bucket does not say when generation {id} was written"
                    ));
                }
            },
            Err(e) => return State::Refused(e.to_string()),
        },
    };
    let store = generations.into_store();
    let layout = Layout::new(registry.app(), registry.current());
    let listed = match store.objects().list(
        &store.object(&layout.scope_prefix(scope)),
        cache_core::deadline_after(LISTING_WITHIN),
    ) {
        Ok(listed) => listed,
        Err(e) => return State::Refused(format!("listing the per-key objects: {e}")),
    };
    let prefix = store.object("");
    let since_ms = (written.saturating_sub(CUT_MARGIN_S).max(0) as u64).saturating_mul(1000);
    let newer = published_after(
        listed
            .iter()
            .filter_map(|l| Some((l.key.strip_prefix(&prefix)?, l.last_modified.as_deref()))),
        &layout,
        &scope.fingerprint(),
        since_ms,
    );
    match cache_core::serve_files(&[path], registry, limits, scope) {
        (Some(t), _) => State::Ready(t, Arc::new(newer)),
        (None, notes) if notes.is_empty() => {
            State::Empty("the current generation holds nothing for this scope".to_owned())
        }
        (None, notes) => State::Refused(notes.join("; ")),
    }
}

/// The keys of `scope` among `listed` (key, and when it was last written as S3 lists it)
/// written at or after `since_ms` (Unix milliseconds, the store's clock): the ones a
/// generation written then must not answer. A time that cannot be read counts as after; a
/// name that is not a key of this application, schema and scope is passed by.
pub(crate) fn published_after<'a>(
    listed: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    layout: &Layout,
    scope: &Fingerprint,
    since_ms: u64,
) -> Newer {
    listed
        .into_iter()
        .filter(|(_, written)| written.and_then(iso_ms).is_none_or(|ms| ms >= since_ms))
        .filter_map(|(key, _)| {
            let (s, ns, fp) = layout.parse(key)?;
            if s != *scope {
                return None;
            }
            Some((Namespace::new(&ns).ok()?, fp))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cache_core::cache_format::Fields;

    fn layout() -> Layout {
        Layout::new("app", 1)
    }

    fn key(scope: &Scope, ns: &str, n: u8) -> (String, Fingerprint) {
        let fp = Fingerprint([n; 16]);
        (layout().key(scope, ns, &fp), fp)
    }

    /// Which keys a generation written at 12:00:00 leaves to be read per key: those written
    /// at or after it, or whose time cannot be read; never another scope's, schema's or
    /// application's, nor an object that is not a key.
    #[test]
    fn keys_written_after_the_generation_are_left_to_per_key_reads() {
        let here = Scope::default();
        let other = Scope::new(Fields::from([("gpu".to_owned(), "h100".into())]));
        let since = iso_ms("2026-12-06T12:00:00.000Z").expect("a time");
        let (before, _) = key(&here, "mm", 1);
        let (at, at_fp) = key(&here, "mm", 2);
        let (after, after_fp) = key(&here, "conv", 3);
        let (unknown, unknown_fp) = key(&here, "mm", 4);
        let (garbled, garbled_fp) = key(&here, "mm", 5);
        let (elsewhere, _) = key(&other, "mm", 6);
        let foreign = Layout::new("app", 2).key(&here, "mm", &Fingerprint([7; 16]));
        let listed = [
            (before.as_str(), Some("2026-12-06T11:59:59.999Z")),
            (at.as_str(), Some("2026-12-06T12:00:00.000Z")),
            (after.as_str(), Some("2026-12-07T00:00:00Z")),
            (unknown.as_str(), None),
            (garbled.as_str(), Some("yesterday")),
            (elsewhere.as_str(), Some("2026-12-07T00:00:00Z")),
            (foreign.as_str(), Some("2026-12-07T00:00:00Z")),
            ("generations/current", Some("2026-12-07T00:00:00Z")),
            ("tc1:app:1:not-a-key", Some("2026-12-07T00:00:00Z")),
        ];
        let newer = published_after(listed, &layout(), &here.fingerprint(), since);
        let ns = |n: &str| Namespace::new(n).expect("a namespace");
        let expected: Newer = [
            (ns("mm"), at_fp),
            (ns("conv"), after_fp),
            (ns("mm"), unknown_fp),
            (ns("mm"), garbled_fp),
        ]
        .into_iter()
        .collect();
        assert_eq!(newer, expected);
    }
}
