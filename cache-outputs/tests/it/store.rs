//! Limits that hold, damage that is a miss, kills that never leave a partial value, batch
//! mode, codecs and the memory map, session caches.

use std::path::Path;
use std::time::Duration;

use cache_outputs::{Codec, DType, KeyBuilder, OutputCache, Tensor, reap_sessions};
use test_support::child::{self, ChildGuard};

use crate::{content, f32_tensor, key, value};

/// Every byte under `dir` (what `du` would count, by file length).
fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("dir").flatten() {
            let m = e.metadata().expect("meta");
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += m.len();
            }
        }
    }
    total
}

#[test]
fn the_directory_stays_under_its_limit_and_recently_used_values_survive() {
    const MB: usize = 1_000_000;
    const LIMIT: u64 = 10 << 20;
    let dir = test_support::temp_dir();
    // No memory tier: every read goes to the directory, whose LRU is what is tested.
    let cache = OutputCache::builder(dir.path())
        .max_bytes(LIMIT)
        .memory_bytes(0)
        .open()
        .expect("open");
    for i in 0..10 {
        cache.put(&key(i), value(i, MB));
    }
    let hot = [1u64, 3, 4, 7, 8];
    for i in 10..30 {
        cache.put(&key(i), value(i, MB));
        assert!(
            dir_bytes(dir.path()) <= LIMIT,
            "over the limit after put {i}"
        );
        for h in hot {
            let got = cache.get(&key(h)).expect("a recently read value survives");
            assert_eq!(got.bytes(), content(h, MB).as_slice());
        }
    }
    // The 10 most recently used: the 5 read after every put, and the 5 written last.
    let kept: Vec<u64> = (0..30)
        .filter(|i| cache.store().contains(&key(*i)))
        .collect();
    assert_eq!(kept, [1, 3, 4, 7, 8, 25, 26, 27, 28, 29]);
    // A second process's view counts too: the limit is over the directory, not the session.
    let other = OutputCache::builder(dir.path())
        .max_bytes(LIMIT)
        .memory_bytes(0)
        .open()
        .expect("open");
    other.put(&key(100), value(100, MB));
    assert!(dir_bytes(dir.path()) <= LIMIT);
}

#[test]
fn a_flipped_bit_is_a_miss_and_the_value_is_removed() {
    let dir = test_support::temp_dir();
    let open = || {
        OutputCache::builder(dir.path())
            .memory_bytes(0)
            .open()
            .expect("open")
    };
    let cache = open();
    for (i, len) in [(1u64, 100usize), (2, 300_000)] {
        cache.put(&key(i), value(i, len));
        let path = cache.store().path_of(&key(i));
        let mut bytes = std::fs::read(&path).expect("read");
        for at in [5, 30, 70, bytes.len() / 2, bytes.len() - 1] {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            std::fs::write(&path, &damaged).expect("damage");
            assert!(open().get(&key(i)).is_none(), "flip at {at} of {len} bytes");
            assert!(!path.exists(), "the damaged value was removed");
        }
        bytes.truncate(bytes.len() - 1);
        std::fs::write(&path, &bytes).expect("truncate");
        assert!(open().get(&key(i)).is_none());
        assert!(!path.exists());
    }
}

#[test]
fn a_process_killed_during_puts_never_leaves_a_partial_value() {
    let dir = test_support::temp_dir();
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    for round in 0..20 {
        let mut child = child::spawn("putter", dir.path(), &[&round.to_string()], &[]);
        child::wait_for(&mut child, "started");
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_millis(5 + rng % 60));
        kill9(&mut child);
        let cache = OutputCache::builder(dir.path())
            .memory_bytes(0)
            .open()
            .expect("open");
        let mut found = 0;
        for i in 0..2000 {
            if let Some(v) = cache.get(&key(i)) {
                assert_eq!(v.bytes(), content(i, size_of(i)).as_slice(), "value {i}");
                found += 1;
            }
        }
        assert!(
            found > 0 || round == 0,
            "round {round}: something was stored"
        );
    }
}

pub(crate) fn size_of(i: u64) -> usize {
    100_000 + (i as usize % 7) * 150_000
}

fn kill9(child: &mut ChildGuard) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGKILL);
    }
    let _ = child.wait();
}

#[test]
fn batch_mode_computes_only_the_missing_items() {
    let dir = test_support::temp_dir();
    let cache = OutputCache::builder(dir.path()).open().expect("open");
    let item = 4 * 16;
    let batch = content(3, 8 * item);
    let shape = [8, 16];
    let keys = KeyBuilder::new("double", "1")
        .batch_keys(f32_tensor(&shape, &batch))
        .expect("keys");
    let double = |i: usize| {
        Tensor::new(
            DType::U8,
            vec![item as u64],
            batch[i * item..(i + 1) * item]
                .iter()
                .map(|b| b.wrapping_mul(2))
                .collect(),
        )
        .expect("tensor")
    };
    // Half the items first.
    let half: Vec<_> = keys.iter().step_by(2).copied().collect();
    let got = cache
        .get_or_compute_batch(&half, |missing| -> Result<_, ()> {
            assert_eq!(missing, [0, 1, 2, 3]);
            Ok(missing.iter().map(|m| double(m * 2)).collect())
        })
        .expect("batch");
    assert_eq!(got.len(), 4);
    let got = cache
        .get_or_compute_batch(&keys, |missing| -> Result<_, ()> {
            assert_eq!(missing, [1, 3, 5, 7], "only the items not cached");
            Ok(missing.iter().map(|m| double(*m)).collect())
        })
        .expect("batch");
    for (i, v) in got.iter().enumerate() {
        assert_eq!(v.bytes(), double(i).data.as_slice());
    }
}

#[test]
fn zstd_values_round_trip_and_large_raw_values_are_mapped() {
    let dir = test_support::temp_dir();
    let zipped = OutputCache::builder(dir.path().join("z"))
        .codec(Codec::Zstd(3))
        .memory_bytes(0)
        .open()
        .expect("open");
    let compressible = Tensor::from_f32(vec![512, 512], &vec![1.5f32; 512 * 512]).expect("t");
    zipped.put(&key(1), compressible.clone());
    let on_disk = std::fs::metadata(zipped.store().path_of(&key(1)))
        .expect("stored")
        .len();
    assert!(on_disk < 100_000, "compressed: {on_disk} bytes");
    let back = zipped.get(&key(1)).expect("hit");
    assert_eq!(back.to_tensor(), compressible);
    assert!(!back.is_mapped());

    let raw = OutputCache::builder(dir.path().join("r"))
        .memory_bytes(0)
        .open()
        .expect("open");
    raw.put(&key(2), compressible.clone());
    let back = raw.get(&key(2)).expect("hit");
    assert!(back.is_mapped(), "a 1 MiB raw value is mapped, not copied");
    assert_eq!(back.shape(), [512, 512]);
    assert_eq!(back.to_f32_vec().expect("f32")[1234], 1.5);
    assert_eq!(
        back.bytes().as_ptr() as usize % 64,
        0,
        "64-byte aligned data"
    );
}

#[test]
fn a_value_over_the_entry_cap_is_returned_but_not_kept() {
    let dir = test_support::temp_dir();
    let cache = OutputCache::builder(dir.path())
        .max_entry_bytes(1000)
        .open()
        .expect("open");
    let (kept, out) = cache.put(&key(1), value(1, 5000));
    assert!(!kept);
    assert_eq!(out.bytes().len(), 5000);
    assert!(!cache.store().contains(&key(1)));
    assert!(cache.put(&key(2), value(2, 500)).0);
    assert_eq!(cache.stats().not_stored, 1);
}

#[test]
fn a_session_cache_is_gone_after_drop_and_after_a_normal_exit() {
    let root = test_support::temp_dir();
    let cache = OutputCache::session(Some(root.path()), |b| b).expect("session");
    let dir = cache.dir().to_owned();
    cache.put(&key(1), value(1, 1000));
    assert!(dir.is_dir());
    drop(cache);
    assert!(!dir.exists(), "removed on drop");

    // A process that exits normally without dropping it (std::process::exit skips
    // destructors): removed by the exit hook.
    let mut c = child::spawn("session-exit", root.path(), &[], &[]);
    let said = child::lines(&mut c);
    let dir = said
        .iter()
        .find_map(|l| l.strip_prefix("dir "))
        .expect("the child's session dir")
        .to_owned();
    assert!(c.wait().expect("exit").success());
    assert!(!Path::new(&dir).exists(), "removed at exit: {dir}");
}

#[test]
fn a_session_left_by_a_killed_process_is_reaped_by_the_next_open() {
    let root = test_support::temp_dir();
    let mut c = child::spawn("session-wait", root.path(), &[], &[]);
    let mut out = child::wait_for(&mut c, "ready");
    let _ = &mut out;
    let dirs: Vec<_> = std::fs::read_dir(root.path())
        .expect("root")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(dirs.len(), 1);
    // While its owner lives, a reap leaves it alone.
    assert!(reap_sessions(root.path()).is_empty());
    assert!(dirs[0].is_dir());
    kill9(&mut c);
    assert!(dirs[0].is_dir(), "a killed process removes nothing");
    let next = OutputCache::session(Some(root.path()), |b| b).expect("session");
    assert!(!dirs[0].exists(), "reaped by the next session's open");
    assert!(next.dir().is_dir());
}

#[test]
fn a_reap_removes_only_dead_sessions_and_nothing_else_under_the_root() {
    let root = test_support::temp_dir();
    // A user's folders and files under the root, old, without an owner lock: not sessions.
    let then = std::time::SystemTime::now() - std::time::Duration::from_secs(86_400);
    for name in ["data", "1234-notes", "12-ab-3-x"] {
        let dir = root.path().join(name);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("keep.txt"), b"mine").expect("file");
        std::fs::File::open(&dir)
            .and_then(|f| f.set_modified(then))
            .expect("backdate");
    }
    // A session folder whose owner is gone (no lock file, long ago): ours, reaped.
    let dead = root.path().join("99-1f-0");
    std::fs::create_dir_all(&dead).expect("dir");
    std::fs::File::open(&dead)
        .and_then(|f| f.set_modified(then))
        .expect("backdate");
    assert_eq!(reap_sessions(root.path()), [dead]);
    for name in ["data", "1234-notes", "12-ab-3-x"] {
        assert!(
            root.path().join(name).join("keep.txt").exists(),
            "{name} was removed"
        );
    }
}

#[test]
fn the_default_session_root_is_this_user_s_own_and_private() {
    use std::os::unix::fs::MetadataExt;
    let cache = OutputCache::session(None, |b| b).expect("session");
    let root = cache.dir().parent().expect("root").to_owned();
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert!(
        root.ends_with(format!("tunecache-sessions-{uid}")),
        "{}",
        root.display()
    );
    let meta = std::fs::symlink_metadata(&root).expect("root");
    assert_eq!(meta.uid(), uid);
    assert!(meta.file_type().is_dir());
}

#[test]
fn a_root_that_is_a_link_or_another_users_folder_is_refused() {
    let tmp = test_support::temp_dir();
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).expect("dir");
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&real, &link).expect("link");
    let err = OutputCache::session(Some(&link), |b| b).expect_err("a link is refused");
    assert!(
        err.to_string().contains("not a folder of this user"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&real).expect("real").count(),
        0,
        "nothing made there"
    );
}
