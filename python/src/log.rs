//! The core's warnings, on their way to Python's `logging`.
//!
//! The Rust crates report through `tracing`, from the caller's thread or from a cache's saver
//! thread. Calling into Python from a background thread (and at interpreter exit) is a source
//! of deadlocks, so this subscriber only queues the messages; the Python package drains the
//! queue after each call that can warn and logs them on the `tunecache` logger.
//!
//! The queue's lock is cache-core's fork-safe `GlobalLock`: a `fork` taken while another thread
//! pushed a warning leaves it free in the child, and a child never hangs on a warning.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use cache_core::GlobalLock;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// At most this many messages wait; older ones are dropped (and counted).
const CAPACITY: usize = 1000;

static QUEUE: GlobalLock<VecDeque<(Level, String)>> = GlobalLock::new(VecDeque::new());
static DROPPED: AtomicU64 = AtomicU64::new(0);

fn push(level: Level, message: String) {
    let mut q = QUEUE.lock();
    if q.len() >= CAPACITY {
        q.pop_front();
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
    q.push_back((level, message));
}

/// Takes every queued message: (level name, text). A last line says how many were dropped.
pub(crate) fn drain() -> Vec<(&'static str, String)> {
    let taken: Vec<_> = QUEUE.lock().drain(..).collect();
    let mut out: Vec<(&'static str, String)> = taken
        .into_iter()
        .map(|(level, text)| {
            (
                if level == Level::ERROR {
                    "error"
                } else {
                    "warning"
                },
                text,
            )
        })
        .collect();
    let dropped = DROPPED.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        out.push((
            "warning",
            format!("tunecache: {dropped} more warnings were dropped"),
        ));
    }
    out
}

/// Installs the subscriber, unless the process already has one (then messages go there).
pub(crate) fn install() {
    let _ = tracing::subscriber::set_global_default(Queue);
}

struct Queue;

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
}

impl Subscriber for Queue {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::WARN
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        push(*event.metadata().level(), message.0);
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}
