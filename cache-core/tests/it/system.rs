//! The read-only system tier: bundles or cache files behind the user's own file, never
//! locked, written or moved; the user's entries win; a damaged one is reported once.

use std::path::Path;

use cache_core::cache_format::bundle::{encode_bundle, manifest_of};
use cache_core::cache_format::{CacheData, encode_snapshot};
use cache_core::{Cache, Store};

use crate::support::{
    builder, capture_logs, entry, has, key, ns, path_in, registry, temp_dir, warnings_about,
};

fn listing(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("dir")
        .flatten()
        .map(|f| {
            (
                f.file_name().to_string_lossy().into_owned(),
                std::fs::read(f.path()).unwrap_or_default(),
            )
        })
        .collect();
    files.sort();
    files
}

fn system_files(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let mut data = CacheData::new();
    for id in 0..5 {
        data.insert(&Default::default(), "matmul", entry(7, id));
    }
    let snapshot = encode_snapshot("testapp", 1, &data);
    let manifest = manifest_of(&data, "testapp", 1, &snapshot, 0, "test");
    let bundle = dir.join("shipped.tcb");
    std::fs::write(&bundle, encode_bundle(&manifest, &snapshot)).expect("bundle");
    let mut more = CacheData::new();
    more.insert(&Default::default(), "matmul", entry(8, 1));
    let file = dir.join("shipped.tcache");
    std::fs::write(&file, encode_snapshot("testapp", 1, &more)).expect("snapshot");
    (bundle, file)
}

#[test]
fn lookups_hit_the_system_tier_and_nothing_is_created_there() {
    let sys = temp_dir();
    let (bundle, file) = system_files(sys.path());
    let before = listing(sys.path());
    let user = temp_dir();
    let cache = builder(&path_in(&user, "u.tcache"))
        .system_files([&bundle, &file])
        .open();
    assert!(has(&cache, 7, 3), "from the bundle");
    assert!(has(&cache, 8, 1), "from the cache file");
    assert!(!has(&cache, 9, 1));
    cache.put(ns(), entry(1, 1));
    cache.flush().expect("the user's file");
    drop(cache);
    assert_eq!(
        listing(sys.path()),
        before,
        "no file, lock or change in the system folder"
    );
}

/// The acceptance case as a real process that cannot write the system folder: the tests run
/// as root here, so the reader runs as `nobody` (a folder's mode does not stop root).
#[test]
fn a_system_tier_in_a_read_only_directory_hits_and_gains_no_file() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;

    let sys = temp_dir();
    let (bundle, file) = system_files(sys.path());
    for f in [&bundle, &file] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o444)).expect("chmod");
    }
    std::fs::set_permissions(sys.path(), std::fs::Permissions::from_mode(0o555)).expect("chmod");
    let before = listing(sys.path());
    let user = temp_dir();
    std::fs::set_permissions(user.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let path = path_in(&user, "u.tcache");
    let args = [
        sys.path().to_str().expect("utf-8"),
        bundle.to_str().expect("utf-8"),
        file.to_str().expect("utf-8"),
    ];
    let mut cmd = test_support::child::command("system-reader", &path, &args, &[]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.uid(65534).gid(65534);
    }
    let out = cmd.output().expect("run the reader");
    let said = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = said
        .lines()
        .filter_map(|l| Some(&l[l.find(crate::support::MARK)? + crate::support::MARK.len()..]))
        .collect();
    assert!(
        out.status.success(),
        "{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        lines,
        ["read-only PermissionDenied", "hits 6", "done"],
        "{said}"
    );
    assert_eq!(
        listing(sys.path()),
        before,
        "no file or lock in the system folder"
    );
    let cache = builder(&path).open();
    assert!(
        has(&cache, 1, 1),
        "the reader's own result is in its own file"
    );
    std::fs::set_permissions(sys.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

#[test]
fn the_users_entries_win_over_the_system_tier() {
    let sys = temp_dir();
    let (bundle, _) = system_files(sys.path());
    let user = temp_dir();
    let cache: Cache = builder(&path_in(&user, "u.tcache"))
        .system_files([&bundle])
        .open();
    let mut mine = entry(7, 2);
    let mut c = (*mine.candidates()[0]).clone();
    c.id.algorithm = "mine".into();
    mine = cache_core::cache_format::Entry::new(
        mine.key().clone(),
        mine.candidate_set(),
        mine.origin().clone(),
        mine.recorded_at(),
        [c],
    );
    cache.put(ns(), mine);
    let got = cache.lookup(ns(), &key(7, 2)).expect("hit");
    assert_eq!(got.best().map(|c| c.id.algorithm.as_str()), Some("mine"));
}

#[test]
fn a_damaged_system_file_is_reported_once_and_left_alone() {
    capture_logs();
    let sys = temp_dir();
    let (bundle, _) = system_files(sys.path());
    let mut bytes = std::fs::read(&bundle).expect("bundle");
    let n = bytes.len();
    bytes[n / 2] ^= 0x40;
    std::fs::write(&bundle, &bytes).expect("damage");
    let before = listing(sys.path());
    let user = temp_dir();
    for _ in 0..2 {
        let cache = builder(&path_in(&user, "u.tcache"))
            .system_files([&bundle])
            .open();
        assert!(!has(&cache, 7, 3));
        drop(cache);
    }
    assert_eq!(listing(sys.path()), before, "never moved or repaired");
    let name = bundle.display().to_string();
    assert_eq!(warnings_about(&name).len(), 2, "once per cache opened");
    let _ = registry(1);
}

/// Seen once (issue 24): a procfs file claims size 0 and was read to the 1 GiB bound before
/// failing; it is ignored at once now, with a warning naming it, and the good file still serves.
#[test]
#[cfg(target_os = "linux")]
fn a_procfs_file_as_a_system_file_is_ignored_without_reading_it() {
    capture_logs();
    let sys = temp_dir();
    let (bundle, _) = system_files(sys.path());
    let proc_file = Path::new("/proc/self/pagemap");
    let user = temp_dir();
    let t = std::time::Instant::now();
    let cache = builder(&path_in(&user, "u.tcache"))
        .system_files([proc_file, bundle.as_path()])
        .open();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        t.elapsed()
    );
    assert!(has(&cache, 7, 3), "the good system file still serves");
    let said = warnings_about("/proc/self/pagemap");
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("procfs"), "{said:?}");
}

/// A file another application wrote, served by [`cache_core::serve_files`] (what a pinned
/// generation is opened with, whose caller wraps the note in a message of its own) and as a
/// system file of a cache: the note says which file and why without a `tunecache:` prefix,
/// and the cache's warning carries the prefix once.
#[test]
fn a_foreign_system_file_is_said_once_with_one_prefix() {
    capture_logs();
    let sys = temp_dir();
    let mut data = CacheData::new();
    data.insert(&Default::default(), "matmul", entry(7, 1));
    let foreign = sys.path().join("someone-else.tcache");
    std::fs::write(&foreign, encode_snapshot("otherapp", 1, &data)).expect("snapshot");
    let (tier, notes) = cache_core::serve_files(
        std::slice::from_ref(&foreign),
        &registry(1),
        &Default::default(),
        &Default::default(),
    );
    assert!(tier.is_none());
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].starts_with(&format!(
            "the system file {} is ignored: ",
            foreign.display()
        )),
        "{notes:?}"
    );
    let user = temp_dir();
    let _cache = builder(&path_in(&user, "u.tcache"))
        .system_files([&foreign])
        .open();
    let said = warnings_about("someone-else.tcache");
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0].matches("tunecache:").count(), 1, "{said:?}");
}
