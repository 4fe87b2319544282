//! Corrupt, truncated and torn files: kept aside or repaired, one clear warning, nothing
//! flushed is lost, nothing panics.

use std::io::Write;

use cache_core::cache_format::{CacheData, Scope, encode_record};
use cache_core::{Mode, Store};

use crate::support::{
    builder, capture_logs, entry, has, ids_on_disk, ns, path_in, temp_dir, warnings_about,
};

fn quarantines(bytes: &[u8], why: &str) {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    std::fs::write(&path, bytes).expect("write");
    let cache = builder(&path).open();
    let health = cache.health();
    assert_eq!(health.mode, Mode::Persistent, "{why}: keeps working");
    assert_eq!(health.quarantined.len(), 1, "{why}: {health:?}");
    let moved = &health.quarantined[0];
    assert_eq!(
        std::fs::read(moved).expect("kept aside"),
        bytes,
        "{why}: kept byte for byte"
    );
    let warned = warnings_about(&moved.display().to_string());
    assert_eq!(
        warned.len(),
        1,
        "{why}: one warning naming the new path: {warned:?}"
    );
    cache.put(ns(), entry(1, 1));
    cache.flush().expect("a fresh file is written");
    drop(cache);
    assert_eq!(ids_on_disk(&path, 1, 2), [1], "{why}");
}

fn valid_file() -> Vec<u8> {
    let mut data = CacheData::new();
    for i in 0..50 {
        data.insert(&Scope::default(), "matmul", entry(4, i));
    }
    cache_core::cache_format::encode_snapshot(crate::support::APP, 1, &data)
}

#[test]
fn a_cache_file_cut_short_within_its_marker_is_kept_aside_with_one_warning() {
    let bytes = valid_file();
    quarantines(&bytes[..7], "cut within the marker");
    quarantines(b"", "empty");
}

#[test]
fn a_truncated_file_is_kept_aside() {
    let bytes = valid_file();
    quarantines(&bytes[..bytes.len() / 2], "truncated");
}

#[test]
fn a_bit_flip_in_the_payload_is_caught_by_the_checksum() {
    let mut bytes = valid_file();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x40;
    quarantines(&bytes, "flipped byte");
}

#[test]
fn an_empty_file_is_kept_aside() {
    quarantines(b"", "empty");
}

#[test]
fn a_file_over_the_size_limit_is_kept_aside_without_being_read() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    std::fs::write(&path, valid_file()).expect("write");
    let limits = cache_core::cache_format::Limits {
        max_file_bytes: 100,
        ..Default::default()
    };
    let cache = builder(&path).limits(limits).open();
    assert_eq!(cache.health().quarantined.len(), 1);
}

/// A snapshot whose checksums hold but whose payload is over the reader's limits (here made so
/// by the reader's own, tighter limits) is refused at open as it always was, naming the limit
/// broken, though open checks the payload in its one walk now rather than in a scan first.
#[test]
fn a_snapshot_over_the_readers_caps_or_nesting_is_kept_aside_naming_them() {
    use cache_core::cache_format::Limits;
    let cases = [
        (
            Limits {
                max_candidates: 0,
                ..Limits::default()
            },
            "candidates of an entry: 1 is over the limit of 0",
        ),
        (
            Limits {
                max_depth: 7,
                ..Limits::default()
            },
            "nests deeper than 7 levels",
        ),
        (
            Limits {
                max_namespaces: 0,
                ..Limits::default()
            },
            "namespaces: 1 is over the limit of 0",
        ),
    ];
    for (limits, why) in cases {
        capture_logs();
        let dir = temp_dir();
        let path = path_in(&dir, "c.tcache");
        let bytes = valid_file();
        std::fs::write(&path, &bytes).expect("write");
        let cache = builder(&path).limits(limits).open();
        let health = cache.health();
        assert_eq!(health.quarantined.len(), 1, "{why}: {health:?}");
        assert_eq!(std::fs::read(&health.quarantined[0]).expect("kept"), bytes);
        let warned = warnings_about(&health.quarantined[0].display().to_string());
        assert!(warned.iter().any(|w| w.contains(why)), "{why}: {warned:?}");
        assert!(!has(&cache, 4, 1), "{why}: nothing of it is served");
    }
}

#[test]
fn a_torn_journal_tail_is_dropped_and_earlier_records_kept() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let journal = path_in(&dir, "c.tcache.journal");
    let cache = builder(&path).open();
    cache.put(ns(), entry(1, 0));
    cache.flush().expect("snapshot");
    cache.put(ns(), entry(1, 1));
    cache.flush().expect("journal record");
    drop(cache);
    assert!(journal.exists());
    // An interrupted append: the first half of a record.
    let mut torn = CacheData::new();
    torn.insert(&Scope::default(), "matmul", entry(1, 99));
    let record = encode_record(&torn);
    let good_len = std::fs::metadata(&journal).expect("journal").len();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&journal)
        .and_then(|mut f| f.write_all(&record[..record.len() / 2]))
        .expect("append half a record");

    let cache = builder(&path).open();
    assert!(has(&cache, 1, 0) && has(&cache, 1, 1) && !has(&cache, 1, 99));
    assert_eq!(
        std::fs::metadata(&journal).expect("journal").len(),
        good_len,
        "the torn tail was cut"
    );
    cache.put(ns(), entry(1, 2));
    cache.flush().expect("append after the repair");
    drop(cache);
    assert_eq!(ids_on_disk(&path, 1, 100), [0, 1, 2]);
}

/// Found by a hostile review: a flipped bit in the last record's length made that whole,
/// checksummed record look like an interrupted append, which the next save cut off. A record
/// damaged only in its frame is served, the journal's damaged bytes are kept in a copy, and
/// the record survives the next save.
#[test]
fn a_last_record_damaged_only_in_its_length_is_kept() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let journal = path_in(&dir, "c.tcache.journal");
    let cache = builder(&path).open();
    cache.put(ns(), entry(1, 0));
    cache.flush().expect("table");
    cache.put(ns(), entry(1, 1));
    cache.flush().expect("journal record");
    drop(cache);
    let mut bytes = std::fs::read(&journal).expect("journal");
    let limits = cache_core::cache_format::Limits::default();
    let (_, _, start) =
        cache_core::cache_format::read_journal_header(&bytes, &limits).expect("a header");
    let scan = cache_core::cache_format::scan_records(&bytes, start, &limits);
    // The last record's frame: 0x92 0xc6 <len:4> before its payload.
    let at = scan.records.last().expect("a record").start - 6;
    assert_eq!(
        &bytes[at..at + 2],
        b"\x92\xc6",
        "a record as tunecache writes it"
    );
    bytes[at + 2] ^= 0x10; // its length now runs far past the end
    std::fs::write(&journal, &bytes).expect("write");

    let cache = builder(&path).open();
    assert!(
        has(&cache, 1, 0) && has(&cache, 1, 1),
        "the record is served"
    );
    cache.put(ns(), entry(1, 2));
    cache.flush().expect("a save after the damage");
    drop(cache);
    assert_eq!(ids_on_disk(&path, 1, 100), [0, 1, 2], "nothing lost");
    let kept = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .any(|e| e.file_name().to_string_lossy().contains(".damaged-"));
    assert!(kept, "a copy of the damaged journal is kept");
}

#[test]
fn a_corrupt_snapshot_keeps_the_valid_journal_records() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let cache = builder(&path).open();
    cache.put(ns(), entry(1, 0));
    cache.flush().expect("snapshot");
    cache.put(ns(), entry(1, 1));
    cache.flush().expect("journal record");
    drop(cache);
    let mut bytes = std::fs::read(&path).expect("snapshot");
    let at = bytes.len() - 10;
    bytes[at] ^= 0xff;
    std::fs::write(&path, &bytes).expect("corrupt the snapshot");
    let cache = builder(&path).open();
    assert!(has(&cache, 1, 1), "the journal's record was rescued");
    assert_eq!(
        cache.health().quarantined.len(),
        2,
        "snapshot and journal both kept aside"
    );
    cache.flush().expect("the rescued record is saved again");
    drop(cache);
    assert_eq!(ids_on_disk(&path, 1, 2), [1]);
}

/// One damaged record is kept aside once, not once per process and save that meets it.
#[test]
fn one_damaged_record_is_copied_aside_once() {
    use cache_core::cache_format::{Limits, read_journal_header, scan_records};
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    {
        let cache = builder(&path).open();
        for i in 0..3 {
            cache.put(ns(), entry(1, i));
            cache.flush().expect("saved");
        }
    }
    let journal = path_in(&dir, "c.tcache.journal");
    let mut bytes = std::fs::read(&journal).expect("journal");
    let (_, _, start) = read_journal_header(&bytes, &Limits::default()).expect("header");
    let scan = scan_records(&bytes, start, &Limits::default());
    assert!(scan.records.len() >= 2, "{:?}", scan.records);
    let second = scan.records[1].clone();
    bytes[second.start + second.len() / 2] ^= 0x55; // a bad checksum, the frame intact
    std::fs::write(&journal, &bytes).expect("write");
    for i in 10..15 {
        let cache = builder(&path).open();
        cache.put(ns(), entry(1, i));
        cache.flush().expect("saved");
    }
    let copies: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".damaged-"))
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_eq!(
        ids_on_disk(&path, 1, 15),
        [0, 1, 10, 11, 12, 13, 14],
        "only the damaged record is lost"
    );
}

/// A corrupt cache with a long name (the suffix would pass 255 bytes) is still moved aside,
/// so the cache can go on.
#[test]
fn a_corrupt_cache_with_a_long_name_is_moved_aside() {
    let dir = temp_dir();
    let path = path_in(&dir, &format!("{}.tcache", "n".repeat(240)));
    // A table cut short in its header: tunecache's, and unusable.
    let cut = b"\x96\xa9tunecache\x04TBL";
    std::fs::write(&path, cut).expect("write");
    let cache = builder(&path).open();
    let moved = cache.health().quarantined;
    assert_eq!(moved.len(), 1, "{:?}", cache.health());
    let name = moved[0]
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    assert!(name.len() <= 255 && name.contains(".unusable-"), "{name}");
    assert_eq!(std::fs::read(&moved[0]).expect("kept"), cut);
    cache.put(ns(), entry(1, 1));
    cache.flush().expect("the cache goes on");
}

/// Issue 8, case 12: a cache whose name leaves no room for `.journal` or `.lock` (more than
/// 247 bytes) still gets a journal and a lock, under shortened names, and works as any other.
#[test]
fn a_cache_with_a_name_too_long_for_its_suffixes_works() {
    let dir = temp_dir();
    let path = path_in(&dir, &format!("{}.tcache", "n".repeat(248)));
    assert_eq!(path.file_name().expect("name").len(), 255);
    {
        let cache = builder(&path).open();
        for i in 0..4 {
            cache.put(ns(), entry(1, i));
            cache.flush().expect("saved");
        }
        assert!(cache.health().last_error.is_none(), "{:?}", cache.health());
    }
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .map(|f| f.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n.ends_with(".journal") && n.len() <= 255),
        "the journal holds the appends: {names:?}"
    );
    let cache = builder(&path).open();
    for i in 0..4 {
        assert!(has(&cache, 1, i), "entry {i} survives a reopen");
    }
}

/// A corrupted length in the middle of the journal is damage, not an interrupted append: the
/// records after it stay readable and are kept by the next writer, and verify reports it. The
/// record whose length it is is read too: its payload matches its checksum (FORMAT.md,
/// "Journal file"; it was lost before a hostile review).
#[test]
fn a_corrupted_length_mid_journal_loses_no_record() {
    use cache_core::cache_format::{Limits, read_journal_header, scan_records};
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    {
        let cache = builder(&path).open();
        for i in 0..6 {
            cache.put(ns(), entry(1, i));
            cache.flush().expect("saved");
        }
    }
    let journal = path_in(&dir, "c.tcache.journal");
    let mut bytes = std::fs::read(&journal).expect("journal");
    let (_, _, start) = read_journal_header(&bytes, &Limits::default()).expect("header");
    let records = scan_records(&bytes, start, &Limits::default()).records;
    assert_eq!(records.len(), 5, "the first flush wrote the snapshot");
    let second = records[1].clone();
    // The frame's length is right before its payload (bin8, bin16 or bin32): make its high
    // byte 0xff, so the length runs into the records after it.
    let length_at = match (
        bytes[second.start - 2],
        bytes[second.start - 3],
        bytes[second.start - 5],
    ) {
        (0xc4, _, _) => second.start - 1,
        (_, 0xc5, _) => second.start - 2,
        (_, _, 0xc6) => second.start - 4,
        other => panic!("not a bin frame: {other:x?}"),
    };
    bytes[length_at] = 0xff;
    std::fs::write(&journal, &bytes).expect("write");

    let found = cache_core::inspect(&path, &Limits::default(), None).expect("inspect");
    assert!(
        !found.problems.is_empty(),
        "verify reports the damage: {:?}",
        found.notes
    );
    assert_eq!(
        found.data().len(),
        6,
        "every record is read, the damaged one too: {:?}",
        found.problems
    );

    let cache = builder(&path).open();
    cache.put(ns(), entry(1, 10));
    cache.flush().expect("saved");
    drop(cache);
    assert_eq!(
        ids_on_disk(&path, 1, 11),
        [0, 1, 2, 3, 4, 5, 10],
        "no record is lost"
    );
}

#[test]
fn a_damaged_newest_slot_loses_no_commit_and_verify_says_so() {
    use cache_core::cache_format::table::{SLOT_A, Table};
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    // Every save folds (a journal bound of one byte): the first makes the table, the second
    // folds four entries into it as commit 2.
    let fold_each = || builder(&path).compaction(1e9, 1);
    let cache = fold_each().open();
    cache.put(ns(), entry(1, 0));
    cache.flush().expect("saved");
    for id in 1..5 {
        cache.put(ns(), entry(1, id));
    }
    cache.flush().expect("saved");
    drop(cache);
    let bytes = std::fs::read(&path).expect("read");
    let t = Table::open(bytes.clone(), &Default::default()).expect("a table");
    assert_eq!(t.commit().seq, 2, "the four entries are one fold");
    assert!(!path.with_extension("tcache.journal").exists());
    // One bit of that commit's slot flipped, as a failing disk would.
    let slot = t.slot_at();
    let mut damaged = bytes;
    damaged[slot as usize + 20] ^= 0x01;
    std::fs::write(&path, &damaged).expect("write");
    assert_eq!(
        ids_on_disk(&path, 1, 5),
        [0, 1, 2, 3, 4],
        "the newest commit is read"
    );
    let found = cache_core::inspect(&path, &Default::default(), None).expect("inspect");
    let which = if slot == SLOT_A { "16" } else { "80" };
    assert!(
        found.problems.iter().any(|p| p
            .contains(&format!("commit slot at offset {which} fails its check"))
            && p.contains("commit 2 was found whole")),
        "{:?}",
        found.problems
    );
    // The next folds keep it: nothing is cut off, and the slots are written afresh.
    let cache = fold_each().open();
    cache.put(ns(), entry(1, 5));
    cache.flush().expect("saved");
    cache.put(ns(), entry(1, 6));
    cache.flush().expect("saved");
    drop(cache);
    assert_eq!(ids_on_disk(&path, 1, 7), [0, 1, 2, 3, 4, 5, 6]);
    let t = Table::open(std::fs::read(&path).expect("read"), &Default::default()).expect("a table");
    assert_eq!(t.recovered_slot(), None);
    assert_eq!(t.head().damaged, [false, false]);
}

/// Found by a hostile review: a table written in one go (an import, a merge, a rewrite) has
/// one slot ever written; one flipped bit of it made every entry unusable, and the next write
/// set the whole file aside. The file's only commit is now found by its block, as a damaged
/// newest slot's is, and the next writes keep every entry.
#[test]
fn a_damaged_only_slot_loses_no_entry() {
    use cache_core::cache_format::table::{SLOT_A, SLOT_B, Table, table_bytes};
    use cache_core::cache_format::{CacheData, Scope};
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let mut data = CacheData::new();
    for id in 0..40 {
        data.insert(&Scope::default(), "matmul", entry(1, id));
    }
    let bytes = table_bytes(crate::support::APP, 1, None, &data);
    let t = Table::open(bytes.clone(), &Default::default()).expect("a table");
    assert_eq!(t.slot_at(), SLOT_A, "one commit, in slot A");
    assert_eq!(t.head().slots[1], None, "slot B never written");
    // One byte of the sequence number, the offset, the zeros, the slot's own CRC.
    for at in [SLOT_A + 3, SLOT_A + 12, SLOT_A + 40, SLOT_A + 63] {
        let mut damaged = bytes.clone();
        damaged[at as usize] ^= 0x01;
        let t = Table::open(damaged.clone(), &Default::default()).expect("found by its block");
        assert_eq!(t.recovered_slot(), Some(SLOT_A), "byte {at}");
        std::fs::write(&path, &damaged).expect("write");
        assert_eq!(
            ids_on_disk(&path, 1, 40),
            (0..40).collect::<Vec<_>>(),
            "byte {at}"
        );
        let found = cache_core::inspect(&path, &Default::default(), None).expect("inspect");
        assert!(
            found
                .problems
                .iter()
                .any(|p| p.contains("commit slot at offset 16")),
            "byte {at}: verify says so: {:?}",
            found.problems
        );
        // A write keeps every entry and sets nothing aside; the slot is written afresh.
        let cache = builder(&path).compaction(1e9, 1).open();
        cache.put(ns(), entry(1, 40));
        cache.flush().expect("saved");
        assert!(
            cache.health().quarantined.is_empty(),
            "{:?}",
            cache.health()
        );
        drop(cache);
        assert_eq!(
            ids_on_disk(&path, 1, 41),
            (0..41).collect::<Vec<_>>(),
            "byte {at}"
        );
        let t =
            Table::open(std::fs::read(&path).expect("read"), &Default::default()).expect("a table");
        assert_eq!(
            t.slot_at(),
            SLOT_B,
            "the next commit went to the other slot"
        );
    }
    // Not adopted, the file unusable as before: the file cut short as well (its commit
    // block no longer ends it); the commit block damaged as well (a second hostile review:
    // a flipped `root` key read as an empty tree, a flipped lineage dropped the journal);
    // the slot's record of the commit's CRC is what was damaged (nothing vouches for the
    // block then).
    let slot_damaged = |mut b: Vec<u8>, at: u64| {
        b[at as usize] ^= 0x01;
        b
    };
    let cut = slot_damaged(bytes[..bytes.len() - 1].to_vec(), SLOT_A + 40);
    assert!(Table::open(cut, &Default::default()).is_err());
    let root = bytes
        .windows(5)
        .rposition(|w| w == b"\xa4root")
        .expect("the commit names its root");
    for flip in [root + 1, bytes.len() - 3] {
        let mut both = slot_damaged(bytes.clone(), SLOT_A + 40);
        both[flip] ^= 0x01;
        assert!(
            Table::open(both, &Default::default()).is_err(),
            "byte {flip}"
        );
    }
    let crc_field = slot_damaged(bytes.clone(), SLOT_A + 20);
    assert!(Table::open(crc_field, &Default::default()).is_err());
}
