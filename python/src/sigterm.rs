//! The SIGTERM flush of a multiprocessing worker, done natively: a signal handler that only
//! writes a byte to a pipe, and a thread of ours that reads it, flushes every open cache of
//! the process (each within its timeout) and then ends the process as SIGTERM does.
//!
//! Why not a Python handler: Python runs one only on the main thread, between bytecodes. A
//! pool worker's main thread blocked in a C call (the task queue's semaphore, which
//! `Pool.terminate` holds for ever, or a claim's wait in Rust) runs it late or never: a
//! SIGTERM that arrived between the semaphore's try and its wait left the worker blocked for
//! ever and `Pool.terminate` joining it for ever (a `forkserver` pool hung in about one run in
//! twenty on a loaded machine). Here nothing waits on the main thread.
//!
//! Armed once per process, and only while SIGTERM has its default action (a handler someone
//! installed is left alone). A child forked after arming inherits the handler but not the
//! thread: the handler sees another pid, restores the default action and raises SIGTERM again,
//! so the child ends as if nothing had been armed.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use cache_core::Cache;
use pyo3::prelude::*;

/// The pipe's write end, for the handler (-1: not armed).
static WRITE_FD: AtomicI32 = AtomicI32::new(-1);

/// The process that armed it.
static ARMED_PID: AtomicI32 = AtomicI32::new(0);

/// How long the SIGTERM flush waits in all while other processes' saves ahead of it land
/// (the same as `tunecache._cache.EXIT_BUDGET`).
const EXIT_BUDGET: Duration = Duration::from_secs(120);

/// Every cache this process opened from Python, to flush at SIGTERM.
static LIVE: Mutex<Vec<Weak<Cache>>> = Mutex::new(Vec::new());

/// Records a cache for the SIGTERM flush (dropped ones are forgotten as caches are added).
pub(crate) fn register(cache: &Arc<Cache>) {
    let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(cache));
}

extern "C" fn on_sigterm(_: libc::c_int) {
    // Only async-signal-safe calls: getpid, write, signal, raise.
    // SAFETY: each call is async-signal-safe and touches no Rust state but two atomics.
    unsafe {
        let fd = WRITE_FD.load(Ordering::Relaxed);
        if fd < 0 || libc::getpid() != ARMED_PID.load(Ordering::Relaxed) {
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
            libc::raise(libc::SIGTERM);
            return;
        }
        let byte = 1u8;
        let _ = libc::write(fd, (&raw const byte).cast(), 1);
    }
}

/// Arms the native SIGTERM flush in this process (see the module); each cache is flushed
/// within `timeout` seconds. Returns whether it armed now (false: already armed here, or
/// SIGTERM is not at its default action, or the pipe or thread could not be made).
#[pyfunction]
pub(crate) fn arm_sigterm_flush(timeout: f64) -> bool {
    let pid = std::process::id() as i32;
    if ARMED_PID.load(Ordering::Relaxed) == pid {
        return false;
    }
    let timeout = Duration::try_from_secs_f64(timeout).unwrap_or(Duration::from_secs(5));
    // SAFETY: queries and sets this process's SIGTERM action and makes a pipe, with valid
    // pointers to local storage; the handler installed is `on_sigterm` above.
    unsafe {
        let mut current = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
        if libc::sigaction(libc::SIGTERM, std::ptr::null(), current.as_mut_ptr()) != 0
            || current.assume_init_ref().sa_sigaction != libc::SIG_DFL
        {
            return false;
        }
        let mut fds = [0 as libc::c_int; 2];
        if libc::pipe(fds.as_mut_ptr()) != 0 {
            return false;
        }
        let (read_fd, write_fd) = (fds[0], fds[1]);
        // Not inherited by programs this process executes (pipe2 is not on every unix).
        for fd in fds {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
        let reader = cache_core::spawn_background("tunecache-sigterm".into(), move || {
            flush_then_end(read_fd, timeout);
        });
        if reader.is_err() {
            libc::close(read_fd);
            libc::close(write_fd);
            return false;
        }
        let old = WRITE_FD.swap(write_fd, Ordering::Relaxed);
        if old >= 0 {
            // Armed in the parent before a fork: the parent's pipe is not ours to use.
            libc::close(old);
        }
        ARMED_PID.store(pid, Ordering::Relaxed);
        let mut action = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
        let a = action.assume_init_mut();
        a.sa_sigaction = on_sigterm as *const () as libc::sighandler_t;
        a.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&raw mut a.sa_mask);
        libc::sigaction(libc::SIGTERM, action.as_ptr(), std::ptr::null_mut()) == 0
    }
}

/// The thread: waits for the handler's byte, flushes every live cache, then ends the process
/// by SIGTERM at its default action.
fn flush_then_end(read_fd: libc::c_int, timeout: Duration) {
    let mut byte = 0u8;
    loop {
        // SAFETY: a read of one byte into local storage from the pipe this thread owns.
        let n = unsafe { libc::read(read_fd, (&raw mut byte).cast(), 1) };
        if n == 1 {
            break;
        }
        if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
    let live: Vec<Arc<Cache>> = LIVE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    for cache in live {
        if let Err(e) = cache.flush_before_exit(timeout, EXIT_BUDGET) {
            tracing::warn!("tunecache: results are not all on disk at SIGTERM: {e}");
        }
    }
    // SAFETY: restores the default action and sends SIGTERM to the process: a thread that
    // does not block it (not this one) takes it and the process ends as SIGTERM ends it.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
        libc::kill(libc::getpid(), libc::SIGTERM);
    }
}
