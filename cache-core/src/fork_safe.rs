//! Process-global locks that `fork` cannot leave held in the child.
//!
//! A forked child has one thread: the one that called `fork`. A lock another thread of the
//! parent held at that moment stays held in the child for good, and the child's first use of
//! it blocks for ever (a Python worker forked while another thread was inside a cache call did,
//! 1 fork in 3 to 15). A [`GlobalLock`] cannot be left so: at-fork hooks take it before the
//! fork (waiting for its holder to finish, so its data is whole) and release it after, in the
//! parent and in the child, which both go on with it free.
//!
//! Each lock registers its hooks (`pthread_atfork`) before its first use. The C library
//! serializes that registration against a fork in progress, so a fork either runs the lock's
//! hooks or happens before anyone took it. Registration is a one-time step that a fork may
//! interrupt, so it is not a `Once` (a child would wait for ever on one the parent was
//! running): a child that inherits a registration its parent had begun but whose hooks did not
//! run for the fork registers the lock itself.
//!
//! Rules for users: a `GlobalLock` is a `static`; nothing holding one takes another (the hooks
//! take every registered lock, in one order) or calls back into code that might.

use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// How many global locks a process may hook. tunecache uses three.
const SLOTS: usize = 8;

/// The state of a lock's registration: not begun, done, or begun by the process whose pid is
/// the value less [`BEGUN_BY`].
const NOT_BEGUN: u64 = 0;
const DONE: u64 = 1;
const BEGUN_BY: u64 = 2;

/// What the hooks of one slot reach: a registered lock.
trait Hooked: Sync {
    /// Takes the lock until [`Hooked::release`], on this thread.
    fn hold(&'static self) -> Box<dyn Any>;
}

static REGISTERED: [OnceLock<&'static dyn Hooked>; SLOTS] = [const { OnceLock::new() }; SLOTS];
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The guards the prepare hooks took, by slot, until the parent or child hook drops them.
    static HELD: RefCell<[Option<Box<dyn Any>>; SLOTS]> =
        const { RefCell::new([const { None }; SLOTS]) };
}

extern "C" fn prepare<const I: usize>() {
    if let Some(lock) = REGISTERED[I].get() {
        let guard = lock.hold();
        // A thread past its thread-locals' end cannot keep it: then it is released at once
        // (the fork goes on as if unhooked, rather than aborting).
        let _ = HELD.try_with(|h| h.borrow_mut()[I] = Some(guard));
    }
}

extern "C" fn after<const I: usize>() {
    // Dropping the guard releases the lock (in the child too: the thread that took it is the
    // one thread the child has).
    let guard = HELD.try_with(|h| h.borrow_mut()[I].take());
    drop(guard);
}

type Hooks = (extern "C" fn(), extern "C" fn());

const HOOKS: [Hooks; SLOTS] = [
    (prepare::<0>, after::<0>),
    (prepare::<1>, after::<1>),
    (prepare::<2>, after::<2>),
    (prepare::<3>, after::<3>),
    (prepare::<4>, after::<4>),
    (prepare::<5>, after::<5>),
    (prepare::<6>, after::<6>),
    (prepare::<7>, after::<7>),
];

/// A process-global mutex that a `fork` never leaves held in the child (see the module docs).
/// A panic while it is held does not poison it for others: its users keep their data valid
/// at every step.
pub struct GlobalLock<T: 'static> {
    mutex: Mutex<T>,
    registration: AtomicU64,
}

impl<T: Send + 'static> GlobalLock<T> {
    /// A lock around `value`, for a `static`.
    pub const fn new(value: T) -> Self {
        GlobalLock {
            mutex: Mutex::new(value),
            registration: AtomicU64::new(NOT_BEGUN),
        }
    }

    /// Takes the lock, waiting for its holder.
    pub fn lock(&'static self) -> MutexGuard<'static, T> {
        self.register();
        self.mutex.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the lock only if no one holds it (for exit handlers, which must never wait).
    pub fn try_lock(&'static self) -> Option<MutexGuard<'static, T>> {
        self.register();
        match self.mutex.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Registers the at-fork hooks once per process image (see the module docs).
    fn register(&'static self) {
        let me = BEGUN_BY + u64::from(std::process::id());
        loop {
            let state = self.registration.load(Ordering::Acquire);
            if state == DONE {
                return;
            }
            // Begun by this process (another thread): it finishes in microseconds.
            if state == me {
                std::thread::yield_now();
                continue;
            }
            // Not begun, or begun by a parent whose hooks did not run for the fork that made
            // this process (had they run, the prepare hook would have said DONE).
            if self
                .registration
                .compare_exchange(state, me, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.hook();
                self.registration.store(DONE, Ordering::Release);
                return;
            }
        }
    }

    fn hook(&'static self) {
        let slot = NEXT_SLOT.fetch_add(1, Ordering::Relaxed);
        let Some(&(prepare, after)) = HOOKS.get(slot) else {
            // More global locks than slots: a programming error, caught by the tests; in a
            // release build this lock goes without hooks rather than failing.
            debug_assert!(false, "more than {SLOTS} global locks");
            return;
        };
        if REGISTERED[slot].set(self).is_err() {
            return;
        }
        // SAFETY: the hooks are plain functions that live as long as the program and only
        // take and release this static lock on the forking thread.
        unsafe {
            libc::pthread_atfork(Some(prepare), Some(after), Some(after));
        }
    }
}

impl<T: 'static> std::fmt::Debug for GlobalLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalLock")
            .field(
                "hooked",
                &(self.registration.load(Ordering::Relaxed) == DONE),
            )
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> Hooked for GlobalLock<T> {
    fn hold(&'static self) -> Box<dyn Any> {
        // Registered: a child of this fork has the hooks in its own list.
        self.registration.store(DONE, Ordering::Release);
        Box::new(self.mutex.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static TABLE: GlobalLock<Vec<u32>> = GlobalLock::new(Vec::new());

    /// A child forked while another thread holds the lock takes it at once; the parent and
    /// the child both see the data as it was when the holder let go.
    #[test]
    fn a_child_forked_while_another_thread_holds_the_lock_can_take_it() {
        TABLE.lock().push(1);
        let (held, release) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut t = TABLE.lock();
                held.wait();
                // The fork's prepare hook waits for this guard: the data is whole.
                release.wait();
                std::thread::sleep(std::time::Duration::from_millis(50));
                t.push(2);
            });
            held.wait();
            release.wait();
            // SAFETY: the child only takes the lock, reads it and leaves with `_exit`.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                let ok = TABLE.lock().as_slice() == [1, 2];
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            assert!(pid > 0, "fork failed");
            let mut status = 0;
            let started = std::time::Instant::now();
            loop {
                // SAFETY: waiting for our own child without blocking.
                let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                if r == pid {
                    break;
                }
                if started.elapsed() > std::time::Duration::from_secs(10) {
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    panic!("the child hung on the lock");
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        });
        assert_eq!(TABLE.lock().as_slice(), [1, 2]);
    }
}
