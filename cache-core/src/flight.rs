//! Single flight in a process: one thread (the leader) works out a key while the others
//! (followers) wait for its result, a bounded time. The cross-process half is a claim file
//! ([`crate::file::FileLock`]); this is the in-process half, shared by the tuner and the output
//! cache.
//!
//! A leader that ends without a result (an error it keeps, a panic) still wakes its
//! followers, with nothing: they then do the work themselves or fall back, never waiting out
//! their whole bound for a leader that is gone.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The keys in flight in this process.
#[derive(Debug)]
pub struct SingleFlight<K, V> {
    flights: Mutex<HashMap<K, Arc<Slot<V>>>>,
}

impl<K, V> Default for SingleFlight<K, V> {
    fn default() -> Self {
        SingleFlight {
            flights: Mutex::new(HashMap::new()),
        }
    }
}

/// One flight's outcome, once it lands: `Some(value)`, or `None` when its leader ended
/// without one.
#[derive(Debug)]
struct Slot<V> {
    done: Mutex<Option<Option<V>>>,
    cv: Condvar,
}

/// What [`SingleFlight::join`] made of the caller.
#[derive(Debug)]
pub enum Join<'a, K: Hash + Eq + Clone, V: Clone> {
    /// The result was ready (the caller's `ready` check found it under the flight table's
    /// lock): no flight.
    Ready(V),
    /// The caller does the work; it must [`Leader::finish`] (dropping it ends the flight
    /// without a result).
    Leader(Leader<'a, K, V>),
    /// Another thread does the work: [`Follower::wait`] for it.
    Follower(Follower<V>),
}

/// The thread that works out a key.
#[derive(Debug)]
pub struct Leader<'a, K: Hash + Eq + Clone, V: Clone> {
    flights: &'a SingleFlight<K, V>,
    key: K,
    slot: Arc<Slot<V>>,
    result: Option<V>,
}

/// A thread waiting for a leader.
#[derive(Debug)]
pub struct Follower<V> {
    slot: Arc<Slot<V>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the data consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<K: Hash + Eq + Clone, V: Clone> SingleFlight<K, V> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Joins the flight of `key`: as its leader if there is none, as a follower otherwise.
    /// `ready` is asked first, under the table's lock, so a result a leader published just
    /// before it finished is never worked out twice.
    pub fn join(&self, key: &K, ready: impl FnOnce() -> Option<V>) -> Join<'_, K, V> {
        let mut flights = lock(&self.flights);
        if let Some(v) = ready() {
            return Join::Ready(v);
        }
        if let Some(slot) = flights.get(key) {
            return Join::Follower(Follower {
                slot: Arc::clone(slot),
            });
        }
        let slot = Arc::new(Slot {
            done: Mutex::new(None),
            cv: Condvar::new(),
        });
        flights.insert(key.clone(), Arc::clone(&slot));
        Join::Leader(Leader {
            flights: self,
            key: key.clone(),
            slot,
            result: None,
        })
    }

    /// How many keys are in flight.
    pub fn len(&self) -> usize {
        lock(&self.flights).len()
    }

    /// Whether no key is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Leader<'_, K, V> {
    /// Ends the flight with `value`, waking the followers.
    pub fn finish(mut self, value: V) {
        self.result = Some(value);
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Drop for Leader<'_, K, V> {
    fn drop(&mut self) {
        lock(&self.flights.flights).remove(&self.key);
        *lock(&self.slot.done) = Some(self.result.take());
        self.slot.cv.notify_all();
    }
}

impl<V: Clone> Follower<V> {
    /// The leader's result, waiting at most `timeout`: `None` if it did not land in time or
    /// the leader ended without one.
    pub fn wait(&self, timeout: Duration) -> Option<V> {
        let deadline = crate::deadline_after(timeout);
        let mut done = lock(&self.slot.done);
        loop {
            if let Some(outcome) = done.as_ref() {
                return outcome.clone();
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            done = self
                .slot
                .cv
                .wait_timeout(done, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_leader_and_its_followers_get_its_result() {
        let flights: SingleFlight<u32, u64> = SingleFlight::new();
        let Join::Leader(leader) = flights.join(&1, || None) else {
            panic!("the first is the leader")
        };
        let Join::Follower(follower) = flights.join(&1, || None) else {
            panic!("the second follows")
        };
        assert!(
            matches!(flights.join(&2, || None), Join::Leader(_)),
            "another key"
        );
        std::thread::scope(|s| {
            let waiting = s.spawn(|| follower.wait(Duration::from_secs(10)));
            leader.finish(42);
            assert_eq!(waiting.join().expect("joined"), Some(42));
        });
        assert!(flights.is_empty(), "the flight ended");
        assert!(matches!(flights.join(&1, || Some(7)), Join::Ready(7)));
    }

    #[test]
    fn a_leader_that_ends_without_a_result_or_panics_wakes_its_followers_at_once() {
        let flights: SingleFlight<u32, u64> = SingleFlight::new();
        let started = Instant::now();
        std::thread::scope(|s| {
            let Join::Leader(leader) = flights.join(&1, || None) else {
                panic!("leader")
            };
            let Join::Follower(follower) = flights.join(&1, || None) else {
                panic!("follower")
            };
            let waiting = s.spawn(move || follower.wait(Duration::from_secs(30)));
            let panicking = s.spawn(move || {
                let _held = leader;
                panic!("the work failed");
            });
            assert!(panicking.join().is_err());
            assert_eq!(waiting.join().expect("joined"), None);
        });
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not the whole bound"
        );
        assert!(flights.is_empty());
    }
}
