//! Lower tiers: what a [`crate::Cache`] asks, in order, when its memory lacks a key.
//!
//! A cache is a stack: memory (its own file's entries), then an ordered list of [`Tier`]s.
//! The read-only system tier (files shipped with an installation) is built in; other crates
//! add their own through a [`TierSource`] given to the builder (cache-remote's shared tier on
//! Redis). A lookup that misses memory asks each tier in turn, within each tier's own time
//! [`Tier::budget`], and stops at the first that has the key. What a tier finds is either
//! served from it as it is ([`Fill::Serve`]: the system tier) or kept in memory and the
//! cache's file ([`Fill::Keep`]: the shared tier), after which it is a memory hit.
//!
//! A hit in memory never reaches a tier. A tier that writes ([`Tier::offer`]) is told the keys
//! recorded in this cache and reads their merged entries through its [`TierLink`] when it
//! writes, from a thread of its own: never on a caller's path.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use cache_format::{Entry, Fingerprint, Limits, Scope};
use cache_migrate::Migrations;

use crate::namespace::Namespace;

/// A lower tier of a [`crate::Cache`]. Implementations must return from every call within
/// their [`Tier::budget`] (or promptly, for the calls that take no time budget) and must
/// never panic.
pub trait Tier: Send + Sync + fmt::Debug {
    /// A short, stable name for messages and counters: `"system"`, `"shared"`.
    fn name(&self) -> &'static str;

    /// Where it is, for messages: never a password.
    fn describe(&self) -> String;

    /// The longest one [`Tier::get_many`] may keep its caller waiting (zero: it only reads
    /// memory).
    fn budget(&self) -> Duration;

    /// What the cache does with the entries this tier returns.
    fn fill(&self) -> Fill;

    /// The entries this tier holds for the keys `fps` of `ns` (keys the cache's memory
    /// lacks), each checked as a file's entry would be; in one round trip within the budget.
    /// A key it lacks, or could not read in time, is simply left out.
    fn get_many(&self, ns: Namespace, fps: &[Fingerprint]) -> Vec<Arc<Entry>>;

    /// Keys recorded in this cache (measured, imported): a tier that writes queues them and
    /// reads their merged entries through its [`TierLink`] when it writes. Must not block.
    fn offer(&self, keys: &[(Namespace, Fingerprint)]) {
        let _ = keys;
    }

    /// Its counters and state.
    fn health(&self) -> TierHealth;

    /// The cache is closing: a tier that writes makes one last attempt, bounded by its own
    /// budget, then stops its threads.
    fn close(&self) {}
}

/// What a [`crate::Cache`] does with an entry a tier returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// Served from the tier every time, never copied into memory or the cache's file (shipped
    /// files: the user's own entries keep winning and the file stays the user's own).
    Serve,
    /// Kept in memory and the cache's file (merged by the one merge rule), so the next
    /// lookup is a memory hit and the next process finds it locally.
    Keep,
}

/// A tier's counters and state, as plain data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierHealth {
    /// [`Tier::name`].
    pub name: &'static str,
    /// [`Tier::describe`].
    pub describe: String,
    /// Whether calls go to it now (`false`: it failed and is skipped until a probe finds it
    /// back, or it is full).
    pub available: bool,
    /// Counters by name (`hits`, `misses`, `timeouts`, `published`, `rejected: damaged`, ...):
    /// which ones a tier keeps is its own.
    pub counters: BTreeMap<String, u64>,
    /// What the tier is doing, in words, where that matters (a pinned generation: pending,
    /// ready, or refused and why); `None` for a tier that is simply there.
    pub state: Option<String>,
}

impl TierHealth {
    /// One counter, zero if the tier does not keep it.
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }
}

/// A tier's way back to the cache it serves: the merged entries of offered keys, and a place
/// to put entries it learned (another machine's measurements joined in while publishing, a
/// pull). It does not keep the cache alive: once the cache is gone, reads find nothing and
/// entries given are dropped.
#[derive(Clone)]
pub struct TierLink {
    shared: Weak<dyn Served>,
}

/// What a tier reaches of the cache it serves, through its [`TierLink`]: implemented by the
/// cache (`cache/queue.rs`), so this room needs nothing of the cache's.
pub(crate) trait Served: Send + Sync {
    /// The entry for `fp` in `ns` in memory or the file (not the lower tiers).
    fn local(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>>;
    /// Merges entries a tier learned; returns how many changed what the cache held.
    fn absorb_from_tier(&self, entries: Vec<(Namespace, Entry)>) -> usize;
}

impl fmt::Debug for TierLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierLink")
            .field("open", &(self.shared.strong_count() > 0))
            .finish()
    }
}

impl TierLink {
    pub(crate) fn new(shared: Weak<dyn Served>) -> Self {
        TierLink { shared }
    }

    /// The entry the cache holds for `fp` in `ns`: its memory, or at most one bounded read of
    /// an entry still kept in the file.
    pub fn get(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
        self.shared.upgrade()?.local(ns, fp)
    }

    /// Merges entries into the cache's memory and, for a persistent cache, its file; they are
    /// not offered back to any tier. Returns how many changed what the cache held.
    pub fn absorb(&self, entries: Vec<(Namespace, Entry)>) -> usize {
        match self.shared.upgrade() {
            Some(shared) => shared.absorb_from_tier(entries),
            None => 0,
        }
    }
}

/// What a [`TierSource`] is given to open its tier for one cache.
pub struct TierContext<'a> {
    /// The cache's application registry (the version gate every value passes).
    pub registry: &'a Arc<Migrations>,
    /// The cache's scope.
    pub scope: &'a Scope,
    /// The cache's decoding bounds.
    pub limits: &'a Limits,
    /// The cache's save delay (how long changes are gathered before a write).
    pub save_delay: Duration,
    /// The way back to the cache.
    pub link: TierLink,
    /// The cache's file, if it has one (a tier that keeps files of its own puts them beside).
    pub cache_file: Option<&'a std::path::Path>,
    pub(crate) settings: &'a crate::settings::Settings,
    pub(crate) warnings: Vec<String>,
    pub(crate) handles: Vec<Handle>,
}

/// A value a tier gave its cache to hand out by type ([`TierContext::provide`]).
pub(crate) type Handle = Arc<dyn Any + Send + Sync>;

impl fmt::Debug for TierContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierContext")
            .field("app", &self.registry.app())
            .field("scope", &self.scope)
            .finish()
    }
}

impl TierContext<'_> {
    /// A setting in force for the cache (the builder's [`crate::settings::Settings`]: the
    /// environment as read once, or none when told to ignore it).
    pub fn env(&self, name: &str) -> Option<String> {
        self.settings.get(name).map(str::to_owned)
    }

    /// A warning about the tier's configuration, logged once when the cache opens.
    pub fn warn(&mut self, text: impl Into<String>) {
        self.warnings.push(text.into());
    }

    /// Gives the cache a handle to what only this tier does (its crate's own type: leases,
    /// pulls, counters), which callers find by type with [`crate::Cache::handle`]. A feature
    /// of one tier lives behind that handle, never as a method of `Cache` or [`Tier`].
    pub fn provide<T: Send + Sync + 'static>(&mut self, handle: Arc<T>) {
        self.handles.push(handle);
    }
}

/// A tier as a [`crate::CacheBuilder`] holds it until the cache opens.
pub trait TierSource: Send + Sync + fmt::Debug {
    /// The tier for one cache, or `None` when it is switched off (say why with
    /// [`TierContext::warn`] if that is not what the configuration asked for).
    fn open(&self, ctx: &mut TierContext<'_>) -> Option<Arc<dyn Tier>>;
}
