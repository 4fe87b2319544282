//! The copies kept aside beside a cache (`.unusable-<ms>`, `.bak.<ms>`, `.damaged-<id>`,
//! `.torn-<id>`), removed by `gc --leftovers` once old enough: exactly the names tunecache
//! gives them, each as old as its setting aside.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::disk::Paths;

/// The copies kept aside beside the cache older than `age`, removed: exactly the names
/// tunecache gives them ([`kept_aside`]), nothing that merely looks alike.
pub(super) fn prune_leftovers(paths: &Paths, age: Duration, dry_run: bool) -> Vec<PathBuf> {
    let Ok(files) = std::fs::read_dir(&paths.dir) else {
        return Vec::new();
    };
    let now = SystemTime::now();
    let mut removed = Vec::new();
    for f in files.flatten() {
        let Some(name) = f.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let aside = [&paths.snapshot, &paths.journal]
            .iter()
            .any(|base| kept_aside(base, &name));
        let modified = std::fs::symlink_metadata(f.path())
            .ok()
            .filter(std::fs::Metadata::is_file)
            .and_then(|m| m.modified().ok());
        let old = modified.is_some_and(|m| old_enough(now, m, set_aside_at(&name), age));
        // A copy holds a cache file or a journal (or a beginning of one): a file of someone
        // else's that merely has such a name stays (a third hostile review).
        let ours = || {
            crate::fsio::read_prefix(&f.path(), 32)
                .is_ok_and(|p| crate::tablefile::begins_as_ours(&p))
        };
        if aside && old && ours() && (dry_run || std::fs::remove_file(f.path()).is_ok()) {
            removed.push(f.path());
        }
    }
    removed.sort();
    removed
}

/// When a copy named `.unusable-<ms>` or `.bak.<ms>` was set aside: its name says, where its
/// modification time is the original file's (a rename keeps it). `None` for other names.
fn set_aside_at(name: &str) -> Option<SystemTime> {
    [".unusable-", ".bak."].into_iter().find_map(|tag| {
        let digits = &name[name.rfind(tag)? + tag.len()..];
        let ms: u64 = digits.parse().ok()?;
        SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms))
    })
}

/// Whether a copy last modified at `modified`, and set aside at `set_aside` when its name says
/// so, is at least `age` old by both: one set aside a minute ago is young, however old the file
/// it was. A time ahead of `now` (a clock set back) is young.
fn old_enough(
    now: SystemTime,
    modified: SystemTime,
    set_aside: Option<SystemTime>,
    age: Duration,
) -> bool {
    let old = |t: SystemTime| now.duration_since(t).is_ok_and(|d| d >= age);
    old(modified) && set_aside.is_none_or(old)
}

/// Whether `name` is a copy tunecache kept aside of the file `base`: `.unusable-<ms>` (moved
/// aside), `.bak.<ms>` (before a migration), `.damaged-<8 hex>` or `.torn-<8 hex>` (copies of
/// damage), each as `fsio::aside` names it (a long name shortened the same way).
pub(crate) fn kept_aside(base: &Path, name: &str) -> bool {
    // Milliseconds as tunecache writes them: no leading zero.
    let digits = |s: &str| {
        !s.is_empty()
            && s.len() <= 20
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0'))
    };
    // 8 hex digits, and `-<n>` (1 to 15) when a copy of other bytes had that name already.
    let hex8 = |s: &str| {
        let (hex, numbered) = match s.split_once('-') {
            None => (s, true),
            Some((hex, n)) => (
                hex,
                !n.starts_with('0') && n.parse::<u8>().is_ok_and(|n| (1..16).contains(&n)),
            ),
        };
        hex.len() == 8 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) && numbered
    };
    let suffix = [
        (".unusable-", &digits as &dyn Fn(&str) -> bool),
        (".bak.", &digits),
        (".damaged-", &hex8),
        (".torn-", &hex8),
    ]
    .into_iter()
    .find_map(|(tag, valid)| {
        let at = name.rfind(tag)?;
        valid(&name[at + tag.len()..]).then(|| &name[at..])
    });
    suffix.is_some_and(|suffix| {
        crate::fsio::aside(base, suffix)
            .file_name()
            .is_some_and(|n| n == name)
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use std::path::{Path, PathBuf};

    use super::{kept_aside, old_enough, set_aside_at};

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn a_copy_is_as_old_as_its_setting_aside_not_the_file_it_was() {
        let now = SystemTime::UNIX_EPOCH + 1_000 * DAY;
        let ms = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .expect("after")
                .as_millis()
        };
        let name = |t: SystemTime| format!("c.tcache.unusable-{}", ms(t));
        let sixty_days_ago = now - 60 * DAY;
        // Set aside a minute ago, from a file last written 60 days ago: young.
        let minute_ago = now - Duration::from_secs(60);
        let stamp = set_aside_at(&name(minute_ago));
        assert_eq!(stamp.map(ms), Some(ms(minute_ago)));
        assert!(!old_enough(now, sixty_days_ago, stamp, 30 * DAY));
        assert!(!old_enough(now, sixty_days_ago, stamp, DAY));
        // Set aside 60 days ago: old.
        assert!(old_enough(
            now,
            sixty_days_ago,
            set_aside_at(&name(sixty_days_ago)),
            30 * DAY
        ));
        // A `.bak.<ms>` likewise; a stamp ahead of now (a clock set back) is young.
        let bak = format!("c.tcache.bak.{}", ms(now + DAY));
        assert!(!old_enough(
            now,
            sixty_days_ago,
            set_aside_at(&bak),
            30 * DAY
        ));
        // Copies of damage are written afresh: their time is their own.
        assert_eq!(set_aside_at("c.tcache.journal.damaged-0a1b2c3d"), None);
        assert!(old_enough(now, sixty_days_ago, None, 30 * DAY));
        assert!(!old_enough(now, now, None, 30 * DAY));
    }

    #[test]
    fn only_the_names_tunecache_keeps_aside_are_recognised() {
        let base = Path::new("/c/cache.tcache");
        for ours in [
            "cache.tcache.unusable-1795352693050",
            "cache.tcache.bak.1795352693050",
            "cache.tcache.damaged-0a1b2c3d",
            "cache.tcache.torn-0a1b2c3d",
            "cache.tcache.damaged-0a1b2c3d-1",
            "cache.tcache.damaged-0a1b2c3d-15",
            "cache.tcache.unusable-0",
        ] {
            assert!(kept_aside(base, ours), "{ours}");
        }
        for theirs in [
            "cache.tcache.bak.before-upgrade",
            "cache.tcache.unusable-notes.txt",
            "cache.tcache.bak.1795352693050.txt",
            "cache.tcache.torn-0A1B2C3D",
            "cache.tcache.damaged-0a1b2c3",
            "other.tcache.bak.1795352693050",
            "cache.tcache",
            "cache.tcache.bak.",
            "cache.tcache.unusable-0123",
            "cache.tcache.damaged-0a1b2c3d-16",
            "cache.tcache.damaged-0a1b2c3d-01",
            "cache.tcache.damaged-0a1b2c3d-",
        ] {
            assert!(!kept_aside(base, theirs), "{theirs}");
        }
        // A long name is shortened as it was when kept aside.
        let long = PathBuf::from(format!("/c/{}.tcache", "é".repeat(120)));
        let kept = crate::fsio::aside(&long, ".unusable-1795352693050");
        let name = kept.file_name().and_then(|n| n.to_str()).expect("name");
        assert!(kept_aside(&long, name), "{name}");
    }
}
