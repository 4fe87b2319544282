//! A batch's requests, several at once: an object store answers one object per request, so a
//! batch of keys is as fast as the requests in flight together allow. Up to
//! `TUNECACHE_REMOTE_PARALLEL` (default 64, `options::parse_parallel`) threads take the next request as
//! each finishes (a slow one holds up only itself), and none starts after one failed.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::options::MAX_PARALLEL;
use crate::store::RemoteError;

/// `f` of each item, up to `parallel` at once, the results in the items' order; the error of
/// the first item (in order) that failed, if any. After a failure no further item starts.
pub(crate) fn in_parallel<T: Sync, R: Send>(
    items: &[T],
    parallel: usize,
    f: impl Fn(&T) -> Result<R, RemoteError> + Sync,
) -> Result<Vec<R>, RemoteError> {
    let workers = parallel.clamp(1, MAX_PARALLEL).min(items.len());
    if workers <= 1 {
        return items.iter().map(&f).collect();
    }
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let work = || {
        let mut done: Vec<(usize, Result<R, RemoteError>)> = Vec::new();
        while !failed.load(Ordering::Acquire) {
            let i = next.fetch_add(1, Ordering::AcqRel);
            let Some(item) = items.get(i) else {
                break;
            };
            let result = f(item);
            if result.is_err() {
                failed.store(true, Ordering::Release);
            }
            done.push((i, result));
        }
        done
    };
    let parts: Vec<Vec<(usize, Result<R, RemoteError>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                // Blocked signals: a SIGTERM for the process goes to the caller's threads.
                cache_core::with_signals_blocked(|| s.spawn(work))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    let lost = RemoteError::Protocol("a request thread panicked".to_owned());
                    vec![(0, Err(lost))]
                })
            })
            .collect()
    });
    let mut all: Vec<(usize, Result<R, RemoteError>)> = parts.into_iter().flatten().collect();
    all.sort_by_key(|(i, _)| *i);
    let mut out = Vec::with_capacity(items.len());
    for (_, result) in all {
        // In the items' order: the first error is the first failed item's.
        out.push(result?);
    }
    if out.len() != items.len() {
        return Err(RemoteError::Protocol(format!(
            "a batch of {} requests answered {}",
            items.len(),
            out.len()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    #[test]
    fn a_batch_keeps_its_order_and_fails_on_its_first_error() {
        let items: Vec<u32> = (0..50).collect();
        for parallel in [1, 3, 8, 64] {
            let doubled = in_parallel(&items, parallel, |i| Ok(i * 2)).expect("no error");
            assert_eq!(doubled, items.iter().map(|i| i * 2).collect::<Vec<_>>());
            let failed = in_parallel(&items, parallel, |i| {
                if *i == 30 || *i == 40 {
                    Err(RemoteError::Timeout(format!("late {i}")))
                } else {
                    Ok(*i)
                }
            });
            assert_eq!(failed, Err(RemoteError::Timeout("late 30".into())));
        }
        assert_eq!(in_parallel(&[] as &[u32], 8, |i| Ok(*i)), Ok(Vec::new()));
    }

    #[test]
    fn no_more_than_the_limit_run_at_once_and_a_slow_one_holds_up_only_itself() {
        let items: Vec<u32> = (0..200).collect();
        let (now, most, done) = (
            AtomicUsize::new(0),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        );
        let others_finished = AtomicBool::new(false);
        in_parallel(&items, 16, |i| {
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(n, Ordering::SeqCst);
            if *i == 0 {
                // One slow request: it lasts until every other one is done (the others are
                // not queued behind it), or 10 s if they are.
                let gave_up = std::time::Instant::now() + Duration::from_secs(10);
                while done.load(Ordering::SeqCst) < items.len() - 1
                    && std::time::Instant::now() < gave_up
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                others_finished.store(
                    done.load(Ordering::SeqCst) == items.len() - 1,
                    Ordering::SeqCst,
                );
            } else {
                std::thread::sleep(Duration::from_millis(2));
                done.fetch_add(1, Ordering::SeqCst);
            }
            now.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        })
        .expect("no error");
        let most = most.load(Ordering::SeqCst);
        assert!((2..=16).contains(&most), "{most} at once");
        assert!(
            others_finished.load(Ordering::SeqCst),
            "the slow request held up others"
        );
    }

    #[test]
    fn after_a_failure_no_further_request_starts() {
        let items: Vec<u32> = (0..1000).collect();
        let started = AtomicUsize::new(0);
        let got = in_parallel(&items, 4, |i| {
            started.fetch_add(1, Ordering::SeqCst);
            if *i == 0 {
                return Err(RemoteError::Unreachable("down".into()));
            }
            // Long enough that the failing one is seen before many start, on a loaded machine.
            std::thread::sleep(Duration::from_millis(20));
            Ok(())
        });
        assert!(got.is_err());
        assert!(started.load(Ordering::SeqCst) < 50, "{started:?}");
    }
}
