//! The background queue of the "nearest now, tune later" policy: one worker, no key twice,
//! a time budget. (Single flight in a process is cache-core's `SingleFlight`.)

use std::collections::VecDeque;
use std::time::Duration;

/// The keys the "nearest now, tune later" policy queued, tuned by one worker at a time.
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

impl<K: PartialEq> Background<K> {
    pub(super) fn busy(&self) -> bool {
        self.running || !self.queue.is_empty()
    }

    /// Queues `key` unless the budget is spent or it is queued already; true when a worker
    /// must be started for it (none is running).
    pub(super) fn push(&mut self, key: K, budget: Duration) -> bool {
        if self.spent >= budget || self.queue.contains(&key) {
            return false;
        }
        self.queue.push_back(key);
        !std::mem::replace(&mut self.running, true)
    }

    /// The next key for the worker, or `None` (and the worker stops, dropping what is left)
    /// once the queue is empty or the budget is spent.
    pub(super) fn next(&mut self, budget: Duration) -> Option<K> {
        let key = (self.spent < budget)
            .then(|| self.queue.pop_front())
            .flatten();
        if key.is_none() {
            self.stop();
        }
        key
    }

    /// Counts tuning time against the budget.
    pub(super) fn spend(&mut self, d: Duration) {
        self.spent += d;
    }

    /// The worker is gone (finished, or could not start): nothing is queued.
    pub(super) fn stop(&mut self) {
        self.queue.clear();
        self.running = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_background_queue_starts_one_worker_and_respects_its_budget() {
        let budget = Duration::from_secs(1);
        let mut bg = Background::default();
        assert!(bg.push(1, budget), "the first key starts a worker");
        assert!(!bg.push(2, budget), "the running worker takes the next");
        assert!(!bg.push(1, budget), "no key twice");
        assert!(bg.busy());
        assert_eq!(bg.next(budget), Some(1));
        bg.spend(Duration::from_secs(2));
        assert_eq!(bg.next(budget), None, "the budget is spent");
        assert!(!bg.busy(), "the worker stopped and dropped the rest");
        assert!(!bg.push(3, budget), "nothing is queued past the budget");
    }
}
