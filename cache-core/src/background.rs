//! Background threads (the saver, the compactor, the shared tier's publisher and lease
//! renewer, a tuner's background tune, a bucket's batch of requests): spawned with the
//! asynchronous signals blocked, so a signal sent to the process (SIGTERM, SIGINT, SIGHUP,
//! SIGUSR1, ...) is delivered to one of the application's own threads, never to ours.
//!
//! Why it matters: a Python signal handler (tunecache's SIGTERM flush in a multiprocessing
//! worker, or the application's own) runs only on the main thread, and only once that thread
//! returns to the interpreter. Delivered to a tunecache thread, a SIGTERM woke nothing: a pool
//! worker blocked on its task queue's lock (which `Pool.terminate` holds for ever) never ran the
//! handler, never ended, and its pool's `join` hung (found as a `forkserver` pool test that
//! timed out once in about 20 runs on a loaded machine). Faults a thread causes itself
//! (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT) stay unblocked.

use std::io;
use std::thread::JoinHandle;

/// Spawns `f` on a thread named `name` with the asynchronous signals blocked (see the module).
pub fn spawn_background<F, T>(name: String, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    with_signals_blocked(|| std::thread::Builder::new().name(name).spawn(f))
}

/// Runs `spawn` (which starts threads: a thread starts with its creator's signal mask) with
/// this thread's asynchronous signals blocked, and restores the mask after. A signal that
/// arrives meanwhile stays pending for the few microseconds this takes.
pub fn with_signals_blocked<R>(spawn: impl FnOnce() -> R) -> R {
    #[cfg(unix)]
    {
        let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: `set` and `old` are valid sigset_t storage; sigfillset and sigdelset only
        // write it, and pthread_sigmask reads `set` and writes `old`, for this thread alone.
        let blocked = unsafe {
            libc::sigfillset(set.as_mut_ptr());
            for fault in [
                libc::SIGSEGV,
                libc::SIGBUS,
                libc::SIGFPE,
                libc::SIGILL,
                libc::SIGTRAP,
                libc::SIGSYS,
                libc::SIGABRT,
            ] {
                libc::sigdelset(set.as_mut_ptr(), fault);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, set.as_ptr(), old.as_mut_ptr()) == 0
        };
        let out = spawn();
        if blocked {
            // SAFETY: `old` was filled by the successful pthread_sigmask above.
            unsafe {
                libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), std::ptr::null_mut());
            }
        }
        out
    }
    #[cfg(not(unix))]
    {
        spawn()
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// Whether `signal` is blocked on the calling thread.
    fn blocked(signal: libc::c_int) -> bool {
        let mut now = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: a query of this thread's mask into valid storage.
        unsafe {
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), now.as_mut_ptr());
            libc::sigismember(now.as_ptr(), signal) == 1
        }
    }

    #[test]
    fn a_background_thread_blocks_process_signals_and_its_creator_does_not() {
        let seen = spawn_background("tunecache-test".into(), || {
            (
                blocked(libc::SIGTERM),
                blocked(libc::SIGINT),
                blocked(libc::SIGUSR1),
                blocked(libc::SIGSEGV),
                std::thread::current().name().map(str::to_owned),
            )
        })
        .expect("spawned")
        .join()
        .expect("joined");
        assert_eq!(
            seen,
            (true, true, true, false, Some("tunecache-test".to_owned()))
        );
        assert!(!blocked(libc::SIGTERM), "the creator's mask is restored");
        let scoped = std::thread::scope(|s| {
            with_signals_blocked(|| s.spawn(|| blocked(libc::SIGHUP)))
                .join()
                .expect("joined")
        });
        assert!(scoped);
        assert!(!blocked(libc::SIGHUP));
    }
}
