//! Settings in the environment as the CLI reads them: once per command, every value that
//! does not parse named before anything is done (docs/settings.md).

use crate::commands::{KEY, err, file, put, put_args};

#[test]
fn the_environment_switches_refuse_writes_and_leave_inspection_alone() {
    let (_d, path) = file();
    put(&path, "tiled", "1200");
    let files = || {
        let journal = path.with_file_name("c.tcache.journal");
        (std::fs::read(&path).ok(), std::fs::read(journal).ok())
    };
    let before = files();
    let with = |var: &str, value: &str, args: &[&str]| {
        test_support::cli::command(crate::EXE, &path, args)
            .env(var, value)
            .output()
            .expect("run")
    };
    let put = put_args(KEY, "x", "1");
    let import_args = ["import", "/dev/null"];
    let tune_args = ["tune", "--backend", "cpu", "--steps", "1", "--no-progress"];
    for var in ["TUNECACHE_READ_ONLY", "TUNECACHE_DISABLE"] {
        for args in [&put[..], &import_args[..], &tune_args[..], &["migrate"][..]] {
            let o = with(var, "1", args);
            assert_eq!(o.status.code(), Some(1), "{var} {args:?}: {}", err(&o));
            assert!(
                err(&o).contains(var) && err(&o).contains("nothing was written"),
                "{var} {args:?}: {}",
                err(&o)
            );
        }
        for args in [
            &["stats"][..],
            &["verify"][..],
            &["list"][..],
            &["migrate", "--dry-run"][..],
        ] {
            let o = with(var, "1", args);
            assert_eq!(o.status.code(), Some(0), "{var} {args:?}: {}", err(&o));
        }
        let o = with(var, "maybe", &["stats"]);
        assert_eq!(o.status.code(), Some(2), "{var}=maybe: {}", err(&o));
        assert!(err(&o).contains(&format!("{var}=\"maybe\"")), "{}", err(&o));
    }
    assert_eq!(files(), before, "nothing was written, snapshot or journal");
    assert_eq!(
        with("TUNECACHE_READ_ONLY", "0", &put).status.code(),
        Some(0)
    );
    // A log filter that is not one is named, not ignored without a word (it once was); a
    // good one is taken.
    let o = with("TUNECACHE_LOG", "tunecache=[", &["stats"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(
        err(&o).contains("TUNECACHE_LOG=\"tunecache=[\": not a log filter"),
        "{}",
        err(&o)
    );
    assert_eq!(
        with("TUNECACHE_LOG", "debug", &["stats"]).status.code(),
        Some(0)
    );
    assert_eq!(with("TUNECACHE_LOG", "", &["stats"]).status.code(), Some(0));
    // So is every other setting that does not parse, whatever the command (a shared tier's
    // mode once stopped only the commands that opened one, a generation's id none): one line
    // naming the variable and what it expects; a good or empty value is taken.
    for (var, bad, good) in [
        ("TUNECACHE_REMOTE_MODE", "sideways", "read"),
        ("TUNECACHE_REMOTE_TIMEOUT_MS", "0", "1500"),
        ("TUNECACHE_REMOTE_LEASE_MS", "5", "0"),
        ("TUNECACHE_REMOTE_PARALLEL", "0", "16"),
        ("TUNECACHE_GENERATION", "latest", "current"),
        ("TUNECACHE_GENERATION", "of", "off"),
        ("TUNECACHE_PROGRESS", "sometimes", "never"),
    ] {
        let o = with(var, bad, &["stats"]);
        let said = err(&o);
        assert_eq!(o.status.code(), Some(2), "{var}={bad}: {said}");
        assert!(
            said.contains(var)
                && said.contains(bad)
                && (said.contains("expected") || said.contains("one of")),
            "{var}={bad}: {said}"
        );
        assert_eq!(said.lines().count(), 1, "one line: {said}");
        for fine in [good, ""] {
            let o = with(var, fine, &["stats"]);
            assert_eq!(o.status.code(), Some(0), "{var}={fine:?}: {}", err(&o));
        }
    }
}

/// A shared tier's address that names no usable store refuses `put` and `import` before
/// anything is written (a put once saved, then failed on the address with exit 1, leaving the
/// user unsure of both); a store that is only unreachable does not (the local save counts).
#[test]
fn an_unusable_shared_tier_address_refuses_writes_before_anything_is_written() {
    let (dir, path) = file();
    put(&path, "tiled", "1200");
    let files = || {
        let journal = path.with_file_name("c.tcache.journal");
        (std::fs::read(&path).ok(), std::fs::read(journal).ok())
    };
    let before = files();
    let fresh = dir.path().join("fresh.tcache");
    let lines = dir.path().join("one.jsonl");
    let source = test_support::cli::stdout(
        &test_support::cli::command(crate::EXE, &path, &["export"])
            .output()
            .expect("export"),
    );
    std::fs::write(&lines, source).expect("lines");
    let put_args = put_args(KEY, "x", "1");
    let import_args = ["import", lines.to_str().expect("utf-8")];
    let secret = "s3://AKIA:SuperSecret123@mybucket/p";
    for address in [
        "bogus://x",
        "s3://",
        "http://nope",
        "redis://h:notaport/0",
        secret,
    ] {
        for target in [&path, &fresh] {
            for args in [&put_args[..], &import_args[..]] {
                let o = test_support::cli::command(crate::EXE, target, args)
                    .env("TUNECACHE_REMOTE", address)
                    .output()
                    .expect("run");
                assert_eq!(o.status.code(), Some(1), "{address} {args:?}: {}", err(&o));
                assert!(
                    err(&o).contains("TUNECACHE_REMOTE") && err(&o).contains("nothing was written"),
                    "{address} {args:?}: {}",
                    err(&o)
                );
                // Credentials pasted into an address are never printed.
                assert!(!err(&o).contains("SuperSecret"), "{}", err(&o));
            }
        }
    }
    assert_eq!(files(), before, "nothing was written, snapshot or journal");
    assert!(!fresh.exists(), "no file was made");
    // Read-only sharing publishes nothing: the address is not in the way of a local write.
    let o = test_support::cli::command(crate::EXE, &fresh, &put_args)
        .env("TUNECACHE_REMOTE", "bogus://x")
        .env("TUNECACHE_REMOTE_MODE", "read")
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    // An unreachable store: saved, said, exit 0.
    let o = test_support::cli::command(crate::EXE, &fresh, &put_args)
        .env("TUNECACHE_REMOTE", "redis://127.0.0.1:1/0")
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(
        err(&o).contains("the local save still counts"),
        "{}",
        err(&o)
    );
}
