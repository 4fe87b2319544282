//! `cargo xtask bench-report`: the command-line costs of issue 10's table, for caches of
//! several sizes, side by side with Python's `msgpack.unpackb` of the same file, in one run.
//!
//! For each size it writes a cache of that many entries (about 350 bytes each, like a tuned
//! matmul key with a few candidates), then times the release `tunecache` binary on it: wall
//! and CPU seconds and peak resident memory of each child process (from `wait4`). Timings
//! on a shared machine are noisy: compare columns of one run, not runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, bail};
use cache_format::{
    CacheData, Candidate, Entry, Fields, Fingerprint, Key, Origin, Scope, Stats, Value,
    encode_snapshot,
};

/// One measured run of a child process.
#[derive(Debug, Clone, Copy)]
struct Cost {
    wall: f64,
    cpu: f64,
    rss_mb: f64,
    ok: bool,
}

impl Cost {
    fn cell(&self) -> String {
        let mark = if self.ok { "" } else { " FAILED" };
        format!(
            "{} ({:.2} cpu) {:.0} MB{mark}",
            secs(self.wall),
            self.cpu,
            self.rss_mb
        )
    }
}

fn secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else {
        format!("{s:.2} s")
    }
}

pub(crate) fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let sizes = sizes(args)?;
    let status = Command::new(env!("CARGO"))
        .args(["build", "--release", "--quiet", "-p", "cache-cli"])
        .current_dir(root)
        .status()
        .context("cannot run cargo build")?;
    if !status.success() {
        bail!("cargo build --release -p cache-cli failed");
    }
    let exe = root.join("target/release/tunecache");
    let python = python(root);
    let dir = tempfile::tempdir().context("cannot create a temporary folder")?;
    let migrations = dir.path().join("migrations.json");
    std::fs::write(
        &migrations,
        r#"{"app": "bench", "current": 2, "steps": [{"from": 1, "to": 2, "description": "bump", "ops": [{"op": "rename_algorithm", "from": "tiled", "to": "blocked"}]}]}"#,
    )?;
    let rows = [
        "file",
        "python msgpack.unpackb",
        "stats",
        "list --limit 1",
        "verify",
        "put (one result)",
        "export",
        "migrate --dry-run",
        "migrate",
        "import (into a new cache)",
    ];
    let mut table: Vec<Vec<String>> = rows.iter().map(|r| vec![(*r).to_owned()]).collect();
    for &n in &sizes {
        let case = dir.path().join(format!("n{n}"));
        let col = column(n, &case, &exe, python.as_deref(), &migrations)?;
        for (row, cell) in table.iter_mut().zip(col) {
            row.push(cell);
        }
        std::fs::remove_dir_all(&case).ok();
    }
    let mut header = vec!["entries".to_owned()];
    header.extend(sizes.iter().map(ToString::to_string));
    print_table(&header, &table);
    Ok(())
}

/// The sizes `--sizes N,N,...` asks for (1k to 1M by default).
fn sizes(args: &[String]) -> anyhow::Result<Vec<usize>> {
    let mut sizes = vec![1_000usize, 10_000, 100_000, 1_000_000];
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--sizes" => {
                let list = iter
                    .next()
                    .context("--sizes needs a list, e.g. 1000,100000")?;
                sizes = list
                    .split(',')
                    .map(|s| s.trim().replace('_', "").parse())
                    .collect::<Result<_, _>>()
                    .context("--sizes: numbers separated by commas")?;
            }
            other => bail!("bench-report: unknown argument {other:?} (takes --sizes N,N,...)"),
        }
    }
    Ok(sizes)
}

/// One column of the table: a cache of `n` entries generated in `case`, then each command
/// (and Python's `msgpack.unpackb` of the same file) measured on it.
fn column(
    n: usize,
    case: &Path,
    exe: &Path,
    python: Option<&Path>,
    migrations: &Path,
) -> anyhow::Result<Vec<String>> {
    eprintln!("bench-report: {n} entries");
    std::fs::create_dir_all(case)?;
    let cache = case.join("c.tcache");
    // Written by a child: this process stays small, so what `wait4` reports for the
    // children measured below is theirs (a child's peak counts what it shared at fork).
    let status = Command::new(std::env::current_exe()?)
        .args(["bench-gen", &n.to_string()])
        .arg(&cache)
        .status()
        .context("cannot start the cache generator")?;
    if !status.success() {
        bail!("the cache generator failed ({status})");
    }
    let len = std::fs::metadata(&cache)?.len();
    let mut col = vec![format!("{:.1} MB", len as f64 / 1e6)];
    col.push(match &python {
        Some(py) => measure(
            Command::new(py)
                .args([
                    "-c",
                    "import msgpack, sys\n\
                 b = open(sys.argv[1], 'rb').read()\n\
                 outer = msgpack.unpackb(b, raw=False, strict_map_key=False)\n\
                 msgpack.unpackb(outer[4], raw=False, strict_map_key=False)",
                ])
                .arg(&cache),
        )?
        .cell(),
        None => "no python3 with msgpack".to_owned(),
    });
    let tc = |args: &[&str]| {
        let mut cmd = Command::new(exe);
        cmd.arg("--cache-file").arg(&cache).args(args);
        cmd.env_remove("TUNECACHE_FILE");
        cmd
    };
    for args in [
        &["stats"][..],
        &["list", "--limit", "1"],
        &["verify"],
        &[
            "put",
            "-n",
            "matmul",
            "-k",
            r#"{"m":1,"n":1,"k":1,"dtype":"f16"}"#,
            "--algo",
            "naive",
            "--median-ns",
            "100",
        ],
    ] {
        col.push(measure(&mut tc(args))?.cell());
    }
    let rows_file = case.join("rows.jsonl");
    col.push(measure(tc(&["export", "-o"]).arg(&rows_file))?.cell());
    let m = migrations.to_string_lossy().into_owned();
    col.push(measure(&mut tc(&["migrate", "--dry-run", "--migrations", &m]))?.cell());
    col.push(measure(&mut tc(&["migrate", "--migrations", &m]))?.cell());
    let fresh = case.join("imported.tcache");
    col.push(
        measure(
            Command::new(exe)
                .arg("--cache-file")
                .arg(&fresh)
                .args(["--app", "bench", "import"])
                .arg(&rows_file),
        )?
        .cell(),
    );
    Ok(col)
}

/// `cargo xtask bench-gen N PATH` (used by bench-report): writes a cache of N entries.
pub(crate) fn generate(args: &[String]) -> anyhow::Result<()> {
    let [n, path] = args else {
        bail!("bench-gen takes N and PATH");
    };
    let n: usize = n.parse().context("bench-gen: N")?;
    std::fs::write(path, encode_snapshot("bench", 1, &data(n)))?;
    Ok(())
}

/// A cache of `n` entries: matmul keys with three candidates each.
fn data(n: usize) -> CacheData {
    let mut data = CacheData::new();
    let scope = Scope::new(Fields::from([
        ("device".to_owned(), Value::from("bench device")),
        ("backend".to_owned(), Value::from("cpu")),
    ]));
    for i in 0..n {
        let key = Key::new(Fields::from([
            ("m".to_owned(), Value::Int(i as i64)),
            ("n".to_owned(), Value::Int((i % 97) as i64 + 1)),
            ("k".to_owned(), Value::Int(64)),
            ("dtype".to_owned(), Value::from("f16")),
        ]));
        let stats = |median: f64| Stats {
            median_ns: median,
            min_ns: median * 0.97,
            spread_ns: median * 0.01,
            samples: 11,
        };
        let candidates = [
            Candidate::measured(
                "tiled",
                Fields::from([("tile".to_owned(), Value::Int(32))]),
                stats(1000.0 + i as f64),
            ),
            Candidate::measured("ikj", Fields::new(), stats(1500.0 + i as f64)),
            Candidate::measured("naive", Fields::new(), stats(9000.0 + i as f64)),
        ];
        let entry = Entry::new(
            key,
            Fingerprint::default(),
            Origin::Measured("bench".into()),
            1_795_000_000_000,
            candidates,
        );
        data.insert(&scope, "matmul", entry);
    }
    data
}

/// A Python with msgpack: the test environment's (`cargo xtask test` builds it), else the
/// system's.
fn python(root: &Path) -> Option<PathBuf> {
    let venv = root.join("target/test-venv/bin/python3");
    [venv, PathBuf::from("python3")].into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import msgpack"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Runs `cmd` to completion (output discarded) and measures it with `wait4`.
fn measure(cmd: &mut Command) -> anyhow::Result<Cost> {
    let started = Instant::now();
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start a benchmark command")?;
    let pid = libc::pid_t::try_from(child.id()).context("pid out of range")?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for the out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own child, not yet waited for; both pointers are valid.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    if waited != pid {
        bail!("wait4 failed: {}", std::io::Error::last_os_error());
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Cost {
        wall: started.elapsed().as_secs_f64(),
        cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
        rss_mb: usage.ru_maxrss as f64 / 1024.0,
        ok: libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
    })
}

fn print_table(header: &[String], rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .chain([header[c].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("| {} |", padded.join(" | "))
    };
    println!("{}", line(header));
    println!(
        "|{}|",
        widths
            .iter()
            .map(|w| "-".repeat(w + 2))
            .collect::<Vec<_>>()
            .join("|")
    );
    for row in rows {
        println!("{}", line(row));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generated cache is what it says (n entries, readable), and a child's costs are
    /// measured (a failing command is marked).
    #[test]
    fn the_generated_cache_reads_back_and_children_are_measured() {
        let bytes = encode_snapshot("bench", 1, &data(50));
        let snap = cache_format::read_snapshot(&bytes, &cache_format::Limits::default())
            .expect("readable");
        assert_eq!(snap.header.entries, 50);
        let per_entry = bytes.len() / 50;
        assert!(
            (200..600).contains(&per_entry),
            "{per_entry} bytes per entry"
        );
        let ok = measure(&mut Command::new("true")).expect("runs");
        assert!(ok.ok && ok.rss_mb > 0.0, "{ok:?}");
        let failed = measure(&mut Command::new("false")).expect("runs");
        assert!(!failed.ok);
    }
}
