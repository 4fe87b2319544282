//! Nothing tunecache did not create is ever removed or changed: files named like the ones it
//! writes (copies kept aside, temporaries, claim files, output values), old enough to be
//! pruned, and links to other folders are planted beside a cache, in its claims folder, in an
//! output directory and in a folder that is not one; then every command runs. Each planted
//! file must be there afterwards, byte for byte.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use cache_outputs::{Arg, KeyBuilder, OutputCache, Tensor};
use test_support::cli::stderr;

use crate::diff::{Cands, entry, write};
use crate::tunecache;

const X_WINS: Cands<'static> = &[("x", Some((100.0, 5.0))), ("y", Some((200.0, 5.0)))];

/// A month ago: older than any age a command prunes by.
fn backdate(path: &Path) {
    let then = SystemTime::now() - Duration::from_secs(30 * 86_400);
    std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(then))
        .expect("backdate");
}

/// Writes `path` (old), remembering its bytes.
fn plant(planted: &mut BTreeMap<PathBuf, Vec<u8>>, path: PathBuf) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("folder");
    let bytes = format!("not tunecache's: {}", path.display()).into_bytes();
    std::fs::write(&path, &bytes).expect("plant");
    backdate(&path);
    planted.insert(path, bytes);
}

/// A folder with an output cache's shape: a value written by cache-outputs.
fn output_dir(dir: &Path) {
    let cache = OutputCache::builder(dir).open().expect("open");
    let key = KeyBuilder::new("f", "1").arg(Arg::UInt(1)).finish();
    cache.put(&key, Tensor::bytes(vec![7; 1000]));
}

#[test]
fn no_command_removes_or_changes_a_look_alike() {
    let tmp = test_support::temp_dir();
    let d = tmp.path();
    let cache = d.join("c.tcache");
    write(&cache, (1..=5).map(|id| entry(id, 0, X_WINS)).collect());
    let mut planted = BTreeMap::new();
    for name in [
        "c.tcache.bak.before-upgrade",
        "c.tcache.bak.1700000000000.txt",
        "c.tcache.unusable-notes.txt",
        "c.tcache.torn-notes",
        "c.tcache.damaged-0A1B2C3D",
        "c.tcache.journal.bak.old",
        ".c.tcache.tmp.notes",
        ".c.tcache.tmp.1.2.txt",
        "c.tcache.lock.old",
        "other.tcache.bak.1700000000000",
    ] {
        plant(&mut planted, d.join(name));
    }
    for name in ["notes.lock", "db.lock", "x-abc.lock", "README"] {
        plant(&mut planted, d.join("c.tcache.claims").join(name));
    }
    // A claims folder that is a link to somewhere else: never followed.
    let victim = d.join("victim");
    for name in ["data.lock", &format!("x-{}.lock", "ab".repeat(16))] {
        plant(&mut planted, victim.join(name));
    }
    let linked = d.join("l.tcache");
    write(&linked, (1..=2).map(|id| entry(id, 0, X_WINS)).collect());
    std::os::unix::fs::symlink(&victim, d.join("l.tcache.claims")).expect("link");
    // An output directory with look-alikes, and a folder that is not an output cache.
    let out = d.join("out");
    output_dir(&out);
    let docs = d.join("docs");
    for dir in [&out, &docs] {
        for name in [
            "ab/.tmp.notes",
            "ab/notes.txt",
            "zz/.tmp.1.2",
            "ab/.0123.art.tmp.1.2",
            "claims/notes.lock",
            "notes.txt",
        ] {
            plant(&mut planted, dir.join(name));
        }
    }
    run_every_command(&cache, &linked, &out, &docs);
    for (path, bytes) in &planted {
        let now = std::fs::read(path).unwrap_or_else(|e| panic!("{} is gone: {e}", path.display()));
        assert_eq!(&now, bytes, "{} changed", path.display());
    }
}

/// Every command that reads or writes files, on the cache, the linked cache and both folders.
fn run_every_command(cache: &Path, linked: &Path, out: &Path, docs: &Path) {
    let p = |p: &Path| p.to_str().expect("utf-8").to_owned();
    let tmp = cache.parent().expect("folder");
    let (export, bundle, merged) = (tmp.join("e.jsonl"), tmp.join("b.tcb"), tmp.join("m.tcache"));
    let key = r#"{"id":1}"#;
    let runs: Vec<(&Path, Vec<String>)> = vec![
        (cache, vec!["stats".into()]),
        (cache, vec!["list".into()]),
        (
            cache,
            vec![
                "get".into(),
                "-n".into(),
                "mm".into(),
                "-k".into(),
                key.into(),
            ],
        ),
        (
            cache,
            vec![
                "show".into(),
                "-n".into(),
                "mm".into(),
                "-k".into(),
                key.into(),
            ],
        ),
        (cache, vec!["verify".into()]),
        (
            cache,
            vec![
                "explain".into(),
                "-n".into(),
                "mm".into(),
                "-k".into(),
                key.into(),
            ],
        ),
        (cache, vec!["export".into(), "-o".into(), p(&export)]),
        (cache, vec!["import".into(), p(&export)]),
        (
            cache,
            vec![
                "put".into(),
                "-n".into(),
                "mm".into(),
                "-k".into(),
                r#"{"id":9}"#.into(),
                "--algo".into(),
                "x".into(),
                "--median-ns".into(),
                "5".into(),
            ],
        ),
        (
            cache,
            vec!["bundle".into(), "create".into(), "-o".into(), p(&bundle)],
        ),
        (cache, vec!["bundle".into(), "verify".into(), p(&bundle)]),
        (cache, vec!["bundle".into(), "inspect".into(), p(&bundle)]),
        (cache, vec!["bundle".into(), "import".into(), p(&bundle)]),
        (
            cache,
            vec!["merge".into(), "-o".into(), p(&merged), p(cache)],
        ),
        (cache, vec!["diff".into(), p(cache), p(&merged)]),
        (cache, vec!["migrate".into(), "--dry-run".into()]),
        (
            cache,
            vec![
                "gc".into(),
                "--leftovers".into(),
                "0".into(),
                "--max-size".into(),
                "1M".into(),
            ],
        ),
        (cache, vec!["gc".into(), "--leftovers".into(), "0".into()]),
        (linked, vec!["gc".into(), "--leftovers".into(), "0".into()]),
    ];
    let mut outputs = Vec::new();
    for dir in [out, docs] {
        for action in [
            &["stats"][..],
            &["verify"],
            &["verify", "--remove"],
            &["gc", "--max-size", "1"],
            &["clear"],
        ] {
            let mut args: Vec<String> = vec!["outputs".into()];
            args.extend(action.iter().map(|a| (*a).to_owned()));
            args.push(p(dir));
            outputs.push((cache, args));
        }
    }
    for (file, args) in runs.into_iter().chain(outputs) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = tunecache(file, &args);
        assert!(
            matches!(o.status.code(), Some(0..=4)),
            "tunecache {args:?} crashed: {}",
            stderr(&o)
        );
    }
}
