//! The cache's side of the shared tier: read-through on a local miss, and the publisher
//! thread that sends what was measured here to the server, never on a caller's path.
//!
//! The publisher is a thread of its own rather than a step of the saver: a frozen server
//! must not hold up the local file, whose saves stay as prompt as without a remote.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cache_format::{Entry, Fingerprint};

use super::{Mode, Shared, lock};
use crate::namespace::Namespace;
use crate::remote::RemoteError;

/// The publisher's queue.
#[derive(Debug, Default)]
pub(super) struct Publish {
    /// Keys measured here and not yet on the server.
    pub(super) pending: HashSet<(Namespace, Fingerprint)>,
    /// Since when the oldest pending key waits.
    pub(super) since: Option<Instant>,
    pub(super) requested: u64,
    pub(super) served: u64,
    pub(super) last_error: Option<RemoteError>,
    pub(super) running: bool,
    pub(super) shutdown: bool,
    /// The last attempt at shutdown was made.
    pub(super) final_round: bool,
}

impl Shared {
    /// A local miss: asks the remote (one round trip within its budget), and keeps what it
    /// had in memory and, for a persistent cache, in the file.
    #[cold]
    pub(super) fn read_through(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
        self.fetch_remote(ns, std::slice::from_ref(fp));
        self.memory.get(ns, fp)
    }

    /// Fetches the keys of `fps` that memory lacks from the remote, in one round trip;
    /// returns how many it had.
    pub(super) fn fetch_remote(&self, ns: Namespace, fps: &[Fingerprint]) -> usize {
        let Some(tier) = &self.remote else {
            return 0;
        };
        let missing: Vec<Fingerprint> = fps
            .iter()
            .filter(|fp| self.memory.get(ns, fp).is_none())
            .copied()
            .collect();
        let found = tier.fetch(ns, &missing);
        let n = found.len();
        self.absorb_remote(found.into_iter().map(|e| (ns, e)).collect());
        n
    }

    /// Merges entries read from the shared tier into memory and, for a persistent cache,
    /// queues the keys whose entry changed for the file (not for publishing: they came from
    /// there).
    pub(super) fn absorb_remote(&self, mut entries: Vec<(Namespace, Entry)>) {
        if entries.is_empty() {
            return;
        }
        self.clamp(entries.iter_mut().map(|(_, e)| e));
        let changed: Vec<(Namespace, Fingerprint)> = entries
            .iter()
            .filter(|(ns, e)| {
                self.memory.get(*ns, &e.fingerprint()).is_none_or(|held| {
                    let mut merged = Entry::clone(&held);
                    merged.merge(e.clone());
                    merged != *held
                })
            })
            .map(|(ns, e)| (*ns, e.fingerprint()))
            .collect();
        self.memory.merge_many(entries);
        if !changed.is_empty() && lock(&self.diag).mode == Mode::Persistent {
            let mut st = lock(&self.state);
            st.dirty.extend(changed);
            self.mark_dirty(&mut st);
        }
    }

    /// Reads every entry of this cache's application, schema and scope that the shared tier
    /// holds (a key listing, then batched reads) and merges them in; returns how many there
    /// were. Not on any hot path: for warming a fresh machine, or converging after
    /// publishing.
    pub(super) fn pull_remote(&self, timeout: Duration) -> Result<usize, RemoteError> {
        let Some(tier) = &self.remote else {
            return Ok(0);
        };
        let pulled = tier.pull_scope(Instant::now() + timeout)?;
        let n = pulled.len();
        self.absorb_remote(pulled);
        Ok(n)
    }

    /// Queues keys measured here for publishing.
    pub(super) fn queue_publish(&self, keys: impl IntoIterator<Item = (Namespace, Fingerprint)>) {
        if !self.remote.as_ref().is_some_and(|t| t.writes()) {
            return;
        }
        let mut p = lock(&self.publish);
        let before = p.pending.len();
        p.pending.extend(keys);
        if p.pending.len() > before && p.since.is_none() {
            p.since = Some(Instant::now());
            self.publish_cv.notify_all();
        }
    }

    /// Waits at most `timeout` until everything queued so far was published (or a round
    /// failed); returns the error of the last round, if it failed.
    pub(super) fn publish_within(&self, timeout: Duration) -> Result<(), RemoteError> {
        let deadline = Instant::now() + timeout;
        let mut p = lock(&self.publish);
        if !p.running || p.pending.is_empty() {
            return Ok(());
        }
        p.requested += 1;
        let request = p.requested;
        self.publish_cv.notify_all();
        while p.served < request {
            let now = Instant::now();
            if now >= deadline || !p.running {
                return Err(RemoteError::Timeout(format!(
                    "{} entries not published after {timeout:?}",
                    p.pending.len()
                )));
            }
            p = self
                .publish_cv
                .wait_timeout(p, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        match &p.last_error {
            Some(e) if !p.pending.is_empty() => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// The publisher thread: gathers keys for the save delay, publishes them within the
    /// publish budget, and on failure keeps them for when the breaker lets calls out again.
    /// At shutdown it makes one last bounded attempt.
    pub(super) fn run_publisher(self: Arc<Self>) {
        let Some(tier) = &self.remote else {
            return;
        };
        loop {
            let mut p = lock(&self.publish);
            let now = Instant::now();
            let wanted = p.requested > p.served;
            let due = p.since.map(|s| {
                let gathered = if wanted || p.shutdown {
                    now
                } else {
                    s + self.save_delay
                };
                tier.retry_at()
                    .filter(|_| !wanted && !p.shutdown)
                    .map_or(gathered, |r| r.max(gathered))
            });
            if p.shutdown && (p.pending.is_empty() || p.final_round) {
                p.running = false;
                p.served = p.requested;
                self.publish_cv.notify_all();
                return;
            }
            match due {
                Some(at) if at <= now => {}
                Some(at) => {
                    drop(
                        self.publish_cv
                            .wait_timeout(p, at - now)
                            .unwrap_or_else(|e| e.into_inner()),
                    );
                    continue;
                }
                None => {
                    p.served = p.requested;
                    self.publish_cv.notify_all();
                    drop(self.publish_cv.wait(p).unwrap_or_else(|e| e.into_inner()));
                    continue;
                }
            }
            let serving = p.requested;
            let force = p.requested > p.served;
            p.final_round = p.shutdown;
            let keys: Vec<(Namespace, Fingerprint)> = p.pending.drain().collect();
            p.since = None;
            drop(p);
            let entries: Vec<(Namespace, Entry)> = keys
                .iter()
                .filter_map(|(ns, fp)| self.memory.get(*ns, fp).map(|e| (*ns, Entry::clone(&e))))
                .collect();
            let outcome = tier.publish(
                entries,
                Instant::now() + tier.options().publish_budget,
                force,
            );
            if !outcome.folded.is_empty() {
                self.absorb_remote(outcome.folded);
            }
            let mut p = lock(&self.publish);
            if !outcome.left.is_empty() {
                p.pending.extend(outcome.left);
                p.since.get_or_insert_with(Instant::now);
            }
            p.last_error = outcome.error;
            p.served = p.served.max(serving);
            self.publish_cv.notify_all();
        }
    }

    pub(super) fn stop_publisher(&self, wait: Duration) {
        let deadline = Instant::now() + wait;
        let mut p = lock(&self.publish);
        p.shutdown = true;
        self.publish_cv.notify_all();
        while p.running {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            p = self
                .publish_cv
                .wait_timeout(p, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}
