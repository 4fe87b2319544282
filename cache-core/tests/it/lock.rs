//! Another process holding the lock for a long time does not block a caller beyond the
//! configured bound, and the result is saved once the lock frees.

use std::time::{Duration, Instant};

use cache_core::{Store, StoreError};

use crate::support::{
    builder, entry, ids_on_disk, ns, path_in, spawn_child, temp_dir, wait_for_line, wait_until,
};

#[test]
fn a_long_held_lock_bounds_the_wait_and_the_result_is_saved_after() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let mut holder = spawn_child("hold-lock", &path, &["60".into()], &[]);
    let _stdout = wait_for_line(&mut holder, "locked");

    let opened = Instant::now();
    let cache = builder(&path)
        .lock_timeout(Duration::from_millis(300))
        .flush_timeout(Duration::from_secs(2))
        .open();
    let open_took = opened.elapsed();
    cache.put(ns(), entry(1, 1));
    let flushing = Instant::now();
    let result = cache.flush();
    let flush_took = flushing.elapsed();
    // The holder keeps the lock for 60 s; returning at all before it lets go proves the bound.
    assert!(
        holder.try_wait().expect("poll holder").is_none(),
        "the holder is still holding the lock"
    );
    assert!(
        matches!(
            result,
            Err(StoreError::LockTimeout { .. } | StoreError::FlushTimeout(_))
        ),
        "flush must report the busy lock, got {result:?}"
    );
    assert!(
        flush_took < Duration::from_secs(30) && open_took < Duration::from_secs(30),
        "open {open_took:?}, flush {flush_took:?}"
    );
    assert!(
        ids_on_disk(&path, 1, 2).is_empty(),
        "nothing could be written while the lock was held"
    );

    holder
        .kill()
        .expect("kill the holder (the kernel releases its lock)");
    holder.wait().expect("reap");
    // No flush call: the saver retries on its own once the lock is free.
    assert!(
        wait_until(Duration::from_secs(30), || ids_on_disk(&path, 1, 2) == [1]),
        "saved after the lock freed"
    );
    cache.flush().expect("flush now succeeds");
}
