//! [`MemoryRemote`]: an in-process [`Remote`] for tests (the `testing` feature): a map with
//! time-to-live, a command counter, and switches to make it fail. Not a shared tier: it lives
//! and dies with the process.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::store::{Read, Remote, RemoteError, Swap, Swapped};

/// A value and when it expires.
type Stored = (Vec<u8>, Option<Instant>);

/// An in-process [`Remote`] for tests: see the module docs.
#[derive(Debug, Default)]
pub struct MemoryRemote {
    name: String,
    map: Mutex<HashMap<String, Stored>>,
    /// Commands received (one per key of a batch).
    pub commands: AtomicU64,
    /// Commands that write.
    pub writes: AtomicU64,
    fail: Mutex<Option<RemoteError>>,
}

impl MemoryRemote {
    /// An empty one.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty one that names itself `memory:<name>` in messages.
    pub fn named(name: &str) -> Self {
        MemoryRemote {
            name: name.to_owned(),
            ..Self::default()
        }
    }

    /// Makes every call fail with `error` (or succeed again with `None`).
    pub fn fail_with(&self, error: Option<RemoteError>) {
        *self.map_lock(&self.fail) = error;
    }

    /// Sets a raw value (e.g. a crafted one).
    pub fn insert(&self, key: &str, value: Vec<u8>) {
        self.map_lock(&self.map)
            .insert(key.to_owned(), (value, None));
    }

    /// The raw value of a key.
    pub fn value(&self, key: &str) -> Option<Vec<u8>> {
        let now = Instant::now();
        self.map_lock(&self.map)
            .get(key)
            .filter(|(_, exp)| exp.is_none_or(|e| e > now))
            .map(|(v, _)| v.clone())
    }

    /// Every live key.
    pub fn keys(&self) -> Vec<String> {
        let now = Instant::now();
        let mut keys: Vec<String> = self
            .map_lock(&self.map)
            .iter()
            .filter(|(_, (_, exp))| exp.is_none_or(|e| e > now))
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    fn map_lock<'a, T>(&self, m: &'a Mutex<T>) -> std::sync::MutexGuard<'a, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check(&self) -> Result<(), RemoteError> {
        match &*self.map_lock(&self.fail) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

impl Remote for MemoryRemote {
    fn describe(&self) -> String {
        format!("memory:{}", self.name)
    }

    fn get_many(
        &self,
        keys: &[String],
        read: Read,
        _deadline: Instant,
    ) -> Result<Vec<Option<Vec<u8>>>, RemoteError> {
        let touch = read.touch;
        self.check()?;
        self.commands
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        if touch.is_some() {
            self.writes.fetch_add(keys.len() as u64, Ordering::Relaxed);
        }
        let now = Instant::now();
        let mut map = self.map_lock(&self.map);
        Ok(keys
            .iter()
            .map(|k| {
                let (value, exp) = map.get_mut(k)?;
                if exp.is_some_and(|e| e <= now) {
                    return None;
                }
                if let Some(ttl) = touch {
                    *exp = Some(cache_core::deadline_from(now, ttl));
                }
                let cut = value.len().min(read.limit.saturating_add(1));
                Some(value[..cut].to_vec())
            })
            .collect())
    }

    fn compare_and_set_many(
        &self,
        swaps: &[Swap<'_>],
        ttl: Option<Duration>,
        _deadline: Instant,
    ) -> Result<Vec<Swapped>, RemoteError> {
        self.check()?;
        self.commands
            .fetch_add(swaps.len() as u64, Ordering::Relaxed);
        self.writes.fetch_add(swaps.len() as u64, Ordering::Relaxed);
        let now = Instant::now();
        let mut map = self.map_lock(&self.map);
        let live = |map: &HashMap<String, Stored>, key: &str| {
            map.get(key)
                .filter(|(_, exp)| exp.is_none_or(|e| e > now))
                .map(|(v, _)| v.clone())
        };
        Ok(swaps
            .iter()
            .map(|s| {
                if let Some(fence) = &s.fence {
                    let allowed = match live(&map, fence.lease) {
                        None => fence.unchanged,
                        Some(held) => held == fence.value,
                    };
                    if !allowed {
                        return Swapped::Fenced;
                    }
                }
                if live(&map, s.key).as_deref() != s.expected {
                    return Swapped::Changed;
                }
                map.insert(s.key.to_owned(), (s.value.to_vec(), ttl.map(|t| now + t)));
                if let Some(fence) = s.fence.filter(|f| f.release)
                    && live(&map, fence.lease).as_deref() == Some(fence.value)
                {
                    map.remove(fence.lease);
                }
                Swapped::Set
            })
            .collect())
    }

    fn ping(&self, _deadline: Instant) -> Result<(), RemoteError> {
        self.check()?;
        self.commands.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn lease(
        &self,
        key: &str,
        op: crate::LeaseOp<'_>,
        _deadline: Instant,
    ) -> Result<crate::LeaseReply, RemoteError> {
        use crate::{LeaseOp, LeaseReply};
        self.check()?;
        self.commands.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut map = self.map_lock(&self.map);
        let current = map
            .get(key)
            .filter(|(_, exp)| exp.is_none_or(|e| e > now))
            .cloned();
        let (op_value, ttl) = match op {
            LeaseOp::Acquire { value, ttl } | LeaseOp::Renew { value, ttl } => (value, Some(ttl)),
            LeaseOp::Release { value } => (value, None),
            LeaseOp::Peek => (&[][..], None),
        };
        Ok(match current {
            None if matches!(op, LeaseOp::Acquire { .. }) => {
                self.writes.fetch_add(1, Ordering::Relaxed);
                map.insert(key.to_owned(), (op_value.to_vec(), ttl.map(|t| now + t)));
                LeaseReply::Done
            }
            None => LeaseReply::Absent,
            Some((value, _)) if value == op_value && !matches!(op, LeaseOp::Peek) => {
                self.writes.fetch_add(1, Ordering::Relaxed);
                match ttl {
                    Some(t) => {
                        map.insert(key.to_owned(), (value, Some(now + t)));
                    }
                    None => {
                        map.remove(key);
                    }
                }
                LeaseReply::Done
            }
            Some((value, exp)) => LeaseReply::Held {
                value,
                ttl: exp.map(|e| e.saturating_duration_since(now)),
            },
        })
    }

    fn scan(&self, pattern: &str, _deadline: Instant) -> Result<Vec<String>, RemoteError> {
        self.check()?;
        self.commands.fetch_add(1, Ordering::Relaxed);
        Ok(self
            .keys()
            .into_iter()
            .filter(|k| crate::glob::matches(pattern, k))
            .collect())
    }
}
