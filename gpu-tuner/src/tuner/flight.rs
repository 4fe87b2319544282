//! Single flight: one thread per process measures a key while the others wait for its result
//! (bounded), and the background queue of the "nearest now, tune later" policy.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{Choice, MissPolicy, TuneError, TunedInner, lock};
use crate::operation::Operation;

/// A key being tuned by one thread, waited for by others.
pub(super) struct Flight<H> {
    result: Mutex<Option<Result<Arc<Choice<H>>, TuneError>>>,
    done: Condvar,
}

impl<H> Default for Flight<H> {
    fn default() -> Self {
        Flight {
            result: Mutex::new(None),
            done: Condvar::new(),
        }
    }
}

impl<H> Flight<H> {
    pub(super) fn finish(&self, result: Result<Arc<Choice<H>>, TuneError>) {
        *lock(&self.result) = Some(result);
        self.done.notify_all();
    }

    pub(super) fn wait(&self, timeout: Duration) -> Option<Result<Arc<Choice<H>>, TuneError>> {
        let deadline = Instant::now() + timeout;
        let mut guard = lock(&self.result);
        loop {
            if let Some(r) = guard.as_ref() {
                return Some(r.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            guard = self
                .done
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

pub(super) struct Background<K> {
    queue: VecDeque<K>,
    running: bool,
    spent: Duration,
}

impl<K> Default for Background<K> {
    fn default() -> Self {
        Background {
            queue: VecDeque::new(),
            running: false,
            spent: Duration::ZERO,
        }
    }
}

impl<K> Background<K> {
    pub(super) fn busy(&self) -> bool {
        self.running || !self.queue.is_empty()
    }
}

impl<O: Operation> TunedInner<O> {
    pub(super) fn enqueue_background(self: &Arc<Self>, key: O::Key, budget: Duration) {
        let mut bg = lock(&self.background);
        if bg.spent >= budget || bg.queue.contains(&key) {
            return;
        }
        bg.queue.push_back(key);
        if bg.running {
            return;
        }
        bg.running = true;
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name(format!("tunecache-tune-{}", self.namespace()))
            .spawn(move || me.background_loop(budget));
        if spawned.is_err() {
            bg.running = false;
            bg.queue.clear();
        }
    }

    fn background_loop(self: Arc<Self>, budget: Duration) {
        loop {
            let key = {
                let mut bg = lock(&self.background);
                match (bg.spent < budget).then(|| bg.queue.pop_front()).flatten() {
                    Some(k) => k,
                    None => {
                        bg.queue.clear();
                        bg.running = false;
                        return;
                    }
                }
            };
            let started = Instant::now();
            if let Ok(choice) = self.resolve(&key, &MissPolicy::TuneNow) {
                self.publish(&key, &choice);
            }
            lock(&self.background).spent += started.elapsed();
        }
    }
}
