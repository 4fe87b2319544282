//! How a cache gets a shared tier: [`RemoteBuilder`] on a [`CacheBuilder`] adds a
//! `RemoteSource`, which opens the tier when the cache opens, starts its publisher and gives
//! the cache the tier's [`RemoteHandle`].

use std::sync::Arc;

use cache_core::settings::Settings;
use cache_core::{CacheBuilder, Tier, TierContext, TierSource};

use crate::handle::RemoteHandle;
use crate::options::{RemoteMode, RemoteOptions};
use crate::policy::Policy;
use crate::store::Remote;
use crate::tier::CacheTier;

/// A shared tier waiting for its cache (what [`RemoteBuilder`] gives the builder).
#[derive(Debug, Clone)]
pub(crate) struct RemoteSource {
    remote: Arc<dyn Remote>,
    options: RemoteOptions,
}

impl RemoteSource {
    /// The shared tier on `remote`, used as `options` say (`TUNECACHE_REMOTE_MODE` and
    /// `TUNECACHE_REMOTE_TIMEOUT_MS` override the mode and the budget).
    pub(crate) fn new(remote: Arc<dyn Remote>, options: RemoteOptions) -> Self {
        RemoteSource { remote, options }
    }
}

impl TierSource for RemoteSource {
    fn open(&self, ctx: &mut TierContext<'_>) -> Option<Arc<dyn Tier>> {
        let (options, warnings) = self.options.clone().with_env(|name| ctx.env(name));
        for w in warnings {
            ctx.warn(w);
        }
        if options.mode == RemoteMode::Off {
            return None;
        }
        let writes = options.writes();
        let policy = Policy::new(
            Arc::clone(&self.remote),
            options,
            Arc::clone(ctx.registry),
            *ctx.limits,
        );
        let tier = Arc::new(CacheTier::new(policy, ctx.scope.clone(), ctx.link.clone()));
        ctx.provide(Arc::new(RemoteHandle::new(Arc::clone(&tier))));
        if writes {
            tier.publisher.set_running(true);
            let worker = Arc::clone(&tier);
            let delay = ctx.save_delay;
            match cache_core::spawn_background("tunecache-publisher".into(), move || {
                worker.run_publisher(delay)
            }) {
                Ok(handle) => *crate::lock(&tier.thread) = Some(handle),
                Err(e) => {
                    tier.publisher.set_running(false);
                    ctx.warn(format!(
                        "tunecache could not start its publisher thread: {e}; results are not \
                         published to the shared tier"
                    ));
                }
            }
        }
        Some(tier)
    }
}

/// A shared tier for a [`CacheBuilder`].
pub trait RemoteBuilder: Sized {
    /// A shared tier on `remote` behind the file (e.g. a [`crate::RedisRemote`]), with the
    /// default [`RemoteOptions`]: read on a local miss, published to in the background.
    fn remote(self, remote: Arc<dyn Remote>) -> Self {
        let options = remote.default_options();
        self.remote_with(remote, options)
    }

    /// [`RemoteBuilder::remote`] used as `options` say.
    fn remote_with(self, remote: Arc<dyn Remote>, options: RemoteOptions) -> Self;

    /// The builder with `source` added as a lower tier (a pinned generation).
    fn with_tier(self, source: impl TierSource + 'static) -> Self;

    /// [`RemoteBuilder::remote_with`] of the store at `address`, with the generation
    /// `settings` pin on it before it (or, with none pinned, its current one as a warm-up), as
    /// [`RemoteBuilder::remote_from_env`] adds them: for a builder whose own settings are not
    /// the ones the store is named in (the CLI's `tune` takes its file from the command line
    /// and its shared tier from the environment).
    fn remote_at(
        self,
        remote: Arc<dyn Remote>,
        options: RemoteOptions,
        address: &str,
        settings: &Settings,
    ) -> Self {
        pin_with(self, Some(address), None, settings).remote_with(remote, options)
    }

    /// The settings in force for the cache being built (`CacheBuilder::settings`).
    fn settings_in_force(&self) -> &Settings;

    /// The shared tier named by `TUNECACHE_REMOTE`, if set. A value that is not a usable
    /// address is an error naming the variable (the password left out).
    fn remote_from_env(self) -> Result<Self, crate::ConfigError> {
        let settings = self.settings_in_force().clone();
        Ok(match crate::from_settings(&settings)? {
            Some(remote) => pin(self, settings.get(crate::ENV_REMOTE), None).remote(remote),
            None => self,
        })
    }

    /// The shared tier at `address`, or else the one `TUNECACHE_REMOTE` names; an address
    /// that is not usable leaves the cache without one, with a warning (what an embedding
    /// that must open anyway, the Python package and the C ABI, does).
    fn remote_or_warn(self, address: Option<&str>) -> Self {
        self.remote_or_warn_trusting(address, None)
    }

    /// [`RemoteBuilder::remote_or_warn`], a pinned generation checked against the trust policy
    /// file `trust` (`None`: the one `TUNECACHE_TRUST` names, if any).
    fn remote_or_warn_trusting(
        self,
        address: Option<&str>,
        trust: Option<&std::path::Path>,
    ) -> Self {
        let settings = self.settings_in_force().clone();
        let remote = match address {
            Some(address) => crate::connect(address, &settings).map(Some),
            None => crate::from_settings(&settings),
        };
        let named = address.or_else(|| settings.get(crate::ENV_REMOTE));
        match remote {
            Ok(Some(r)) => pin(self, named, trust).remote(r),
            Ok(None) => self,
            Err(e) => {
                tracing::warn!("tunecache: no shared tier: {e}");
                self
            }
        }
    }
}

impl RemoteBuilder for CacheBuilder {
    fn remote_with(self, remote: Arc<dyn Remote>, options: RemoteOptions) -> Self {
        self.tier(RemoteSource::new(remote, options))
    }

    fn with_tier(self, source: impl TierSource + 'static) -> Self {
        self.tier(source)
    }

    fn settings_in_force(&self) -> &Settings {
        self.settings()
    }
}

/// `builder` with the generation `TUNECACHE_GENERATION` pins on the bucket `address` names, as
/// a tier before the shared one (fetched in the background: see `generations/tier.rs`), so
/// every process pinned to it reads the same bytes first.
fn pin<B: RemoteBuilder>(builder: B, address: Option<&str>, trust: Option<&std::path::Path>) -> B {
    let settings = builder.settings_in_force().clone();
    pin_with(builder, address, trust, &settings)
}

/// [`pin`] with the generation `settings` name.
fn pin_with<B: RemoteBuilder>(
    builder: B,
    address: Option<&str>,
    trust: Option<&std::path::Path>,
    settings: &Settings,
) -> B {
    #[cfg(feature = "s3")]
    if let Some(source) = address
        .and_then(|a| crate::generations::GenerationSource::from_settings(a, trust, settings))
    {
        return builder.with_tier(source);
    }
    // No generation pinned: the bucket's current one, if any, warms the cache.
    #[cfg(feature = "s3")]
    if let Some(source) =
        address.and_then(|a| crate::generations::WarmSource::from_settings(a, trust, settings))
    {
        return builder.with_tier(source);
    }
    let _ = (address, trust, settings);
    builder
}
