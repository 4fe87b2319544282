//! `cargo xtask bench-report`: what one lookup costs a fresh process, and what each command
//! costs, for caches of several sizes, in one run: a table (format 4) beside a format 3
//! snapshot of the same entries (read whole, as every open did before format 4) and an SQLite
//! database of the same keys.
//!
//! Each cell is one child process, timed from outside: wall and CPU seconds and peak resident
//! memory (from `wait4`). The one-key rows: `tunecache get` on each file, `sqlite3` selecting
//! the same key, Python's `tunecache.Cache` opened and asked once (beside `import tunecache`
//! alone, what Python costs before any cache is touched), a C program's `tc_open` and
//! `tc_get` (when `cargo xtask capi --release` has installed the library under
//! `target/capi`), and Python's first lookup through a bundle of the whole cache used as a
//! system tier (an empty local file); each the median of five runs. Timings on a shared machine are noisy: compare cells of
//! one run, not runs.

mod files;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, bail};

pub(crate) use files::generate;

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
        format!("{:.1} ms", s * 1000.0)
    } else {
        format!("{s:.2} s")
    }
}

/// Runs of each one-key row (the cell is their median).
const RUNS: usize = 5;

/// The rows of the report, in order (each column has one cell per row).
const ROWS: &[&str] = &[
    "file (format 4 table)",
    "file (format 3 snapshot, same entries)",
    "get one key: format 4",
    "get one key: format 3 (read whole)",
    "sqlite3: select one key",
    "python: import tunecache",
    "python: Cache() + first get",
    "C: tc_open + tc_get",
    "python: first get via a bundle as system tier",
    "stats",
    "list --limit 1",
    "verify",
    "put (one result)",
    "export",
    "migrate --dry-run",
    "migrate",
    "import (into a new cache)",
    "gc --max-size (half)",
    "diff (against the gc'd copy)",
    "merge -o (the cache and the gc'd copy)",
    "bundle create",
    "bundle verify",
    "bundle import (into a new cache)",
];

/// What every column is measured with.
struct Tools<'a> {
    exe: &'a Path,
    python: Option<&'a Path>,
    c_lookup: Option<&'a Path>,
    migrations: &'a Path,
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
    let c_lookup = c_program(root, dir.path());
    let migrations = dir.path().join("migrations.json");
    std::fs::write(
        &migrations,
        r#"{"app": "bench", "current": 2, "steps": [{"from": 1, "to": 2, "description": "bump", "ops": [{"op": "rename_algorithm", "from": "tiled", "to": "blocked"}]}]}"#,
    )?;
    let tools = Tools {
        exe: &exe,
        python: python.as_deref(),
        c_lookup: c_lookup.as_deref(),
        migrations: &migrations,
    };
    let mut table: Vec<Vec<String>> = ROWS.iter().map(|r| vec![(*r).to_owned()]).collect();
    for &n in &sizes {
        let case = dir.path().join(format!("n{n}"));
        let col = column(n, &case, &tools)?;
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

/// Writes a file with `bench-gen` in a child (this process stays small, so what `wait4`
/// reports for the children measured later is theirs).
fn generated(n: usize, path: &Path, extra: &[&str]) -> anyhow::Result<u64> {
    let status = Command::new(std::env::current_exe()?)
        .args(["bench-gen", &n.to_string()])
        .arg(path)
        .args(extra)
        .status()
        .context("cannot start the cache generator")?;
    if !status.success() {
        bail!("the cache generator failed ({status})");
    }
    Ok(std::fs::metadata(path)?.len())
}

/// One column of the table (a cell per row of [`ROWS`]): the files generated in `case`, then
/// each lookup and command measured on them.
fn column(n: usize, case: &Path, tools: &Tools<'_>) -> anyhow::Result<Vec<String>> {
    eprintln!("bench-report: {n} entries");
    std::fs::create_dir_all(case)?;
    let cache = case.join("c.tcache");
    let legacy = case.join("legacy.tcache");
    let mb = |len: u64| format!("{:.1} MB", len as f64 / 1e6);
    let mut col = vec![
        mb(generated(n, &cache, &[])?),
        mb(generated(n, &legacy, &["--format", "3"])?),
    ];
    let key = files::key_json(n / 2);
    let tc = |file: &Path, args: &[&str]| {
        let mut cmd = Command::new(tools.exe);
        cmd.arg("--cache-file").arg(file).args(args);
        cmd.env_remove("TUNECACHE_FILE")
            .env_remove("TUNECACHE_SYSTEM_PATH");
        cmd
    };
    let get = ["get", "-n", "matmul", "-k", &key];
    col.push(median_of(RUNS, || tc(&cache, &get))?.cell());
    col.push(median_of(RUNS, || tc(&legacy, &get))?.cell());
    let db = case.join("baseline.sqlite");
    col.push(if files::sqlite(&db, n)? {
        let sql = format!("SELECT length(v) FROM t WHERE ns = 'matmul' AND k = '{key}';");
        median_of(RUNS, || {
            let mut cmd = Command::new("sqlite3");
            cmd.arg(&db).arg(&sql);
            cmd
        })?
        .cell()
    } else {
        "no sqlite3".to_owned()
    });
    let py_get = "import json, sys, tunecache\n\
                  c = tunecache.Cache('bench', scope=json.loads(sys.argv[2]), path=sys.argv[1], read_only=True)\n\
                  assert c.get('matmul', json.loads(sys.argv[3])) is not None";
    match tools.python {
        Some(py) => {
            col.push(
                median_of(RUNS, || {
                    let mut cmd = Command::new(py);
                    cmd.args(["-c", "import tunecache"]);
                    cmd
                })?
                .cell(),
            );
            col.push(
                median_of(RUNS, || {
                    let mut cmd = Command::new(py);
                    cmd.args(["-c", py_get])
                        .arg(&cache)
                        .args([files::SCOPE_JSON, &key]);
                    cmd
                })?
                .cell(),
            );
        }
        None => col.extend(["no python with tunecache".to_owned(), String::new()]),
    }
    col.push(match tools.c_lookup {
        Some(c) => median_of(RUNS, || {
            let mut cmd = Command::new(c);
            cmd.arg(&cache).args([files::SCOPE_JSON, &key]);
            cmd
        })?
        .cell(),
        None => "no target/capi (cargo xtask capi --release)".to_owned(),
    });
    let bundle = case.join("all.tcb");
    let created = measure(tc(&cache, &["bundle", "create", "-o"]).arg(&bundle))?;
    col.push(match tools.python {
        Some(py) => median_of(RUNS, || {
            let mut cmd = Command::new(py);
            cmd.args(["-c", py_get])
                .arg(case.join("empty.tcache"))
                .args([files::SCOPE_JSON, &key])
                .env("TUNECACHE_SYSTEM_PATH", &bundle);
            cmd
        })?
        .cell(),
        None => String::new(),
    });
    commands(&mut col, case, &cache, &tc, tools)?;
    col.push(created.cell());
    col.push(measure(tc(&cache, &["bundle", "verify"]).arg(&bundle))?.cell());
    let unbundled = case.join("unbundled.tcache");
    col.push(measure(tc(&unbundled, &["bundle", "import"]).arg(&bundle))?.cell());
    Ok(col)
}

/// The command rows, in [`ROWS`] order (`tc` runs the release binary on a file).
fn commands(
    col: &mut Vec<String>,
    case: &Path,
    cache: &Path,
    tc: &dyn Fn(&Path, &[&str]) -> Command,
    tools: &Tools<'_>,
) -> anyhow::Result<()> {
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
        col.push(measure(&mut tc(cache, args))?.cell());
    }
    let rows_file = case.join("rows.jsonl");
    col.push(measure(tc(cache, &["export", "-o"]).arg(&rows_file))?.cell());
    let m = tools.migrations.to_string_lossy().into_owned();
    let migrated = case.join("migrated.tcache");
    std::fs::copy(cache, &migrated)?;
    col.push(
        measure(&mut tc(
            &migrated,
            &["migrate", "--dry-run", "--migrations", &m],
        ))?
        .cell(),
    );
    col.push(measure(&mut tc(&migrated, &["migrate", "--migrations", &m]))?.cell());
    let fresh = case.join("imported.tcache");
    col.push(
        measure(
            Command::new(tools.exe)
                .arg("--cache-file")
                .arg(&fresh)
                .args(["--app", "bench", "import"])
                .arg(&rows_file),
        )?
        .cell(),
    );
    let half = (std::fs::metadata(cache)?.len() / 2).to_string();
    let pruned = case.join("pruned.tcache");
    std::fs::copy(cache, &pruned)?;
    col.push(measure(&mut tc(&pruned, &["gc", "--max-size", &half]))?.cell());
    // The cache against its pruned copy: half its keys differ.
    col.push(measure(tc(cache, &["diff"]).arg(cache).arg(&pruned))?.cell());
    let merged = case.join("merged.tcache");
    col.push(
        measure(
            tc(cache, &["merge", "-o"])
                .arg(&merged)
                .arg(cache)
                .arg(&pruned),
        )?
        .cell(),
    );
    Ok(())
}

/// Compiles the C lookup (`tc_open` for the file and scope given, `tc_get_fields` of the key
/// given, `tc_close`) against the library `cargo xtask capi --release` installed under
/// `target/capi`; `None` when it is not there or the C compiler fails.
fn c_program(root: &Path, dir: &Path) -> Option<PathBuf> {
    let prefix = root.join("target/capi");
    let lib = prefix.join("lib");
    if !prefix.join("include/tunecache.h").exists() {
        return None;
    }
    let source = dir.join("lookup.c");
    std::fs::write(&source, C_LOOKUP).ok()?;
    let exe = dir.join("lookup");
    let status = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&source)
        .arg(format!("-I{}", prefix.join("include").display()))
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-ltunecache")
        .status()
        .ok()?;
    status.success().then_some(exe)
}

/// The C lookup of [`c_program`]: exit 0 on a hit.
const C_LOOKUP: &str = r#"#include <stdio.h>
#include <tunecache.h>
int main(int argc, char **argv) {
    if (argc != 4) return 2;
    struct tc_fields *scope = tc_fields_new(), *key = tc_fields_new();
    if (tc_fields_json(scope, argv[2]) != TC_OK || tc_fields_json(key, argv[3]) != TC_OK) return 2;
    struct tc_options options = {0};
    options.size = sizeof options;
    options.read_only = 1;
    struct tc_cache *cache = NULL;
    if (tc_open("bench", 1, scope, argv[1], &options, &cache) != TC_OK) {
        char why[512];
        tc_last_error(why, sizeof why);
        fprintf(stderr, "tc_open: %s\n", why);
        return 3;
    }
    struct tc_ns *ns = NULL;
    if (tc_namespace(cache, "matmul", 0, &ns) != TC_OK) return 3;
    char algorithm[64];
    struct tc_result out = {0};
    out.algorithm = algorithm;
    out.algorithm_cap = sizeof algorithm;
    int rc = tc_get_fields(ns, key, &out);
    if (rc != TC_OK) {
        char why[512];
        tc_last_error(why, sizeof why);
        fprintf(stderr, "tc_get_fields: %d %s\n", rc, why);
    }
    tc_close(cache);
    return rc == TC_OK ? 0 : 1;
}
"#;

/// A Python with the tunecache package: the test environment's (`cargo xtask test` builds it
/// into it), else the system's.
fn python(root: &Path) -> Option<PathBuf> {
    let venv = root.join("target/test-venv/bin/python3");
    [venv, PathBuf::from("python3")].into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import tunecache"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// The median of `runs` runs of the command `make` gives (wall and CPU each), the largest
/// peak memory, and whether every run succeeded: for the one-key rows, whose few milliseconds
/// a single run measures poorly on a shared machine.
fn median_of(runs: usize, make: impl Fn() -> Command) -> anyhow::Result<Cost> {
    let mut costs = Vec::with_capacity(runs);
    for _ in 0..runs {
        costs.push(measure(&mut make())?);
    }
    let median = |f: fn(&Cost) -> f64| {
        let mut v: Vec<f64> = costs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(Cost {
        wall: median(|c| c.wall),
        cpu: median(|c| c.cpu),
        rss_mb: costs.iter().map(|c| c.rss_mb).fold(0.0, f64::max),
        ok: costs.iter().all(|c| c.ok),
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

    /// A child's costs are measured, and a failing command is marked.
    #[test]
    fn children_are_measured() {
        let ok = measure(&mut Command::new("true")).expect("runs");
        assert!(ok.ok && ok.rss_mb > 0.0, "{ok:?}");
        let failed = measure(&mut Command::new("false")).expect("runs");
        assert!(!failed.ok);
    }
}
