//! The in-memory tier: values by key, bounded in bytes, least recently used dropped first.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cache_core::cache_format::Fingerprint;

use crate::value::Output;

/// How often a memory hit refreshes the value's last use in the directory.
const TOUCH_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Slot {
    value: Arc<Output>,
    tick: u64,
    touched: Instant,
}

#[derive(Debug)]
pub(crate) struct Memory {
    cap: u64,
    used: u64,
    tick: u64,
    slots: HashMap<Fingerprint, Slot>,
    order: BTreeMap<u64, Fingerprint>,
}

impl Memory {
    pub(crate) fn new(cap: u64) -> Self {
        Memory {
            cap,
            used: 0,
            tick: 0,
            slots: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    /// The value, and whether the directory's copy should be marked used.
    pub(crate) fn get(&mut self, key: &Fingerprint) -> Option<(Arc<Output>, bool)> {
        let slot = self.slots.get_mut(key)?;
        self.order.remove(&slot.tick);
        self.tick += 1;
        slot.tick = self.tick;
        self.order.insert(self.tick, *key);
        let touch = slot.touched.elapsed() >= TOUCH_EVERY;
        if touch {
            slot.touched = Instant::now();
        }
        Some((slot.value.clone(), touch))
    }

    pub(crate) fn insert(&mut self, key: Fingerprint, value: Arc<Output>) {
        let weight = value.weight();
        if weight > self.cap {
            return;
        }
        if let Some(old) = self.slots.remove(&key) {
            self.order.remove(&old.tick);
            self.used -= old.value.weight();
        }
        while self.used + weight > self.cap {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some(s) = self.slots.remove(&oldest) {
                self.used -= s.value.weight();
            }
        }
        self.tick += 1;
        self.used += weight;
        self.order.insert(self.tick, key);
        self.slots.insert(
            key,
            Slot {
                value,
                tick: self.tick,
                touched: Instant::now(),
            },
        );
    }
}
