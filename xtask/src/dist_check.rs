//! The test command's check of what `dist` makes, installed as a user would: the wheel into a
//! fresh virtual environment with no Rust toolchain on `PATH` (the Python quickstart twice, an
//! adapter import and its importer entry point), the CLI archive unpacked and `tune` run
//! twice (the second measures nothing), and the C archive unpacked elsewhere and a program
//! built against it through pkg-config (the `.pc` file is relocatable).
//!
//! It uses the dev profile (`dist --dev`: the debug build the tests made), so it adds the
//! packaging and these runs to the test command, not a release build.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// A `PATH` with the system's folders only: no cargo, no rustup, no test environment.
const SYSTEM_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

pub(crate) fn run(root: &Path) -> anyhow::Result<()> {
    let work = tempfile::Builder::new()
        .prefix("tunecache-dist-check-")
        .tempdir()?;
    let out = work.path().join("dist");
    let theirs = plant_look_alikes(root, &out)?;
    println!("xtask test: cargo xtask dist --dev (packaging, installed below as a user would)");
    let made = crate::dist::build(root, true, &out)?;
    only_the_artifacts_were_written(&out, &theirs, &made)?;
    for path in [&made.cli, &made.capi, &made.wheel] {
        println!(
            "xtask test:   {} ({:.1} MB)",
            path.file_name().unwrap_or_default().to_string_lossy(),
            std::fs::metadata(path)?.len() as f64 / 1e6
        );
    }
    wheel_in_a_fresh_venv(root, &made.wheel, work.path())?;
    cli_archive_tunes_twice(&made.cli, work.path())?;
    c_archive_links(&made.capi, work.path())?;
    println!("xtask test: the wheel, the CLI archive and the C archive work as installed");
    Ok(())
}

/// Files of the user's in the output folder that look like what `dist` makes (another
/// version's wheel, a folder with an archive's name): `dist` must leave them as they are.
fn plant_look_alikes(root: &Path, out: &Path) -> anyhow::Result<Vec<(PathBuf, Vec<u8>)>> {
    let name = format!(
        "tunecache-{}-{}",
        crate::dist::workspace_version(root)?,
        crate::dist::host_target()?
    );
    let theirs = vec![
        (
            out.join("tunecache-0.0.1-cp39-abi3-manylinux_2_17_x86_64.whl"),
            b"an older wheel of the user's".to_vec(),
        ),
        (
            out.join(&name).join("notes.txt"),
            b"the user's notes".to_vec(),
        ),
    ];
    for (path, bytes) in &theirs {
        std::fs::create_dir_all(path.parent().context("a parent")?)?;
        std::fs::write(path, bytes)?;
    }
    Ok(theirs)
}

/// `out` holds the user's files as they were, the three artifacts, and nothing else.
fn only_the_artifacts_were_written(
    out: &Path,
    theirs: &[(PathBuf, Vec<u8>)],
    made: &crate::dist::Artifacts,
) -> anyhow::Result<()> {
    for (path, bytes) in theirs {
        if std::fs::read(path).ok().as_ref() != Some(bytes) {
            bail!(
                "dist removed or changed {}, which it did not create",
                path.display()
            );
        }
    }
    let mut expected: Vec<PathBuf> = theirs
        .iter()
        .filter_map(|(p, _)| {
            let rel = p.strip_prefix(out).ok()?;
            Some(out.join(rel.components().next()?))
        })
        .chain([made.cli.clone(), made.capi.clone(), made.wheel.clone()])
        .collect();
    expected.sort();
    let mut found: Vec<PathBuf> = std::fs::read_dir(out)?
        .flatten()
        .map(|e| e.path())
        .collect();
    found.sort();
    if found != expected {
        bail!(
            "dist left in {}: {found:?}, expected {expected:?}",
            out.display()
        );
    }
    Ok(())
}

/// Runs `cmd` with only [`SYSTEM_PATH`] (plus `extra` first) and no Rust or tunecache
/// variables; returns stdout, failing with its stderr.
fn user(cmd: &mut Command, extra: Option<&Path>, what: &str) -> anyhow::Result<String> {
    let path = match extra {
        Some(dir) => format!("{}:{SYSTEM_PATH}", dir.display()),
        None => SYSTEM_PATH.to_owned(),
    };
    cmd.env_clear()
        .env("PATH", path)
        .env("HOME", std::env::var_os("HOME").unwrap_or_default())
        .env("LANG", "C.UTF-8");
    let out = cmd.output().with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn wheel_in_a_fresh_venv(root: &Path, wheel: &Path, work: &Path) -> anyhow::Result<()> {
    let venv = work.join("venv");
    user(
        Command::new("python3").arg("-m").arg("venv").arg(&venv),
        None,
        "python3 -m venv",
    )?;
    let bin = venv.join("bin");
    // As docs/python.md says: the wheel with its `numpy` extra, which the quickstart imports
    // (numpy from pip's cache after the test environment's install, or PyPI).
    let mut with_extra = wheel.as_os_str().to_owned();
    with_extra.push("[numpy]");
    user(
        Command::new(bin.join("pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(with_extra),
        Some(&bin),
        "pip install the wheel",
    )?;
    let which = user(
        Command::new("sh").args([
            "-c",
            "for t in cargo rustc rustup maturin; do command -v $t; done; true",
        ]),
        Some(&bin),
        "a look for a Rust toolchain",
    )?;
    if !which.trim().is_empty() {
        bail!("the fresh environment has a Rust toolchain on PATH: {which}");
    }
    // The quickstart, copied out of the repository so that it imports the installed package.
    let script = work.join("quickstart.py");
    std::fs::copy(root.join("python/examples/quickstart.py"), &script)?;
    let cache_dir = work.join("quickstart-cache");
    let runs: Vec<String> = (0..2)
        .map(|_| {
            user(
                Command::new(bin.join("python"))
                    .current_dir(work)
                    .arg(&script)
                    .arg(&cache_dir),
                Some(&bin),
                "the Python quickstart from the wheel",
            )
        })
        .collect::<anyhow::Result<_>>()?;
    // The second run finds everything in the cache: it measures and computes nothing.
    let said = |run: &str, line: &str| run.lines().any(|l| l.trim() == line);
    if said(&runs[0], "candidates measured in this run: 0")
        || !said(&runs[1], "candidates measured in this run: 0")
        || !said(&runs[1], "normalize computed 0 time(s) in this run")
    {
        bail!("the quickstart from the wheel did not measure once and then hit: {runs:?}");
    }
    let probe = "import tunecache, tunecache.integrations.warpconvnet, sys\n\
        from importlib.metadata import entry_points\n\
        names = [e.name for e in entry_points(group='tunecache.importers')]\n\
        assert 'warpconvnet' in names, names\n\
        assert sys.prefix in tunecache.__file__, tunecache.__file__\n\
        print(tunecache.__file__)";
    user(
        Command::new(bin.join("python"))
            .current_dir(work)
            .args(["-c", probe]),
        Some(&bin),
        "an adapter import from the wheel",
    )?;
    Ok(())
}

/// The one folder an archive unpacked into `into`.
fn unpack(archive: &Path, into: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(into)?;
    user(
        Command::new("tar")
            .arg("-xzf")
            .arg(archive)
            .arg("-C")
            .arg(into),
        None,
        "tar -xzf",
    )?;
    let mut dirs = std::fs::read_dir(into)?.flatten().map(|e| e.path());
    let dir = dirs.next().context("the archive is empty")?;
    if dirs.next().is_some() {
        bail!("{} unpacks into more than one folder", archive.display());
    }
    Ok(dir)
}

fn cli_archive_tunes_twice(archive: &Path, work: &Path) -> anyhow::Result<()> {
    let dir = unpack(archive, &work.join("cli"))?;
    let exe = dir.join("bin").join("tunecache");
    let cache = work.join("tune.tcache");
    let tune = |what: &str| {
        user(
            Command::new(&exe).arg("--cache-file").arg(&cache).args([
                "--json",
                "tune",
                "--backend",
                "cpu",
                "--steps",
                "2",
                "--no-progress",
            ]),
            None,
            what,
        )
    };
    let first: serde_json::Value = serde_json::from_str(&tune("tune from the archive")?)?;
    let second: serde_json::Value = serde_json::from_str(&tune("tune again")?)?;
    let measured = |v: &serde_json::Value| -> u64 {
        v["namespaces"]
            .as_object()
            .map(|ns| {
                ns.values()
                    .filter_map(|n| n["candidates_measured"].as_u64())
                    .sum()
            })
            .unwrap_or(0)
    };
    if measured(&first) == 0 || measured(&second) != 0 {
        bail!(
            "tune from the archive measured {} then {} candidates (expected some, then none)",
            measured(&first),
            measured(&second)
        );
    }
    for page in ["tunecache.1", "tunecache-report.1"] {
        if !dir.join("share/man/man1").join(page).exists() {
            bail!("the CLI archive lacks share/man/man1/{page}");
        }
    }
    Ok(())
}

fn c_archive_links(archive: &Path, work: &Path) -> anyhow::Result<()> {
    let dir = unpack(archive, &work.join("c"))?;
    let source = work.join("hello.c");
    std::fs::write(
        &source,
        "#include <tunecache.h>\n#include <stdio.h>\n\
         int main(void) { struct tc_fields *f = tc_fields_new();\n\
         if (!f || tc_fields_int(f, \"m\", 128) != 0) return 1;\n\
         tc_fields_free(f); puts(\"linked\"); return 0; }\n",
    )?;
    // Found through the unpacked folder's .pc file, wherever it was unpacked.
    let pc = dir.join("lib").join("pkgconfig");
    let out = Command::new("pkg-config")
        .args(["--cflags", "--libs", "tunecache"])
        .env("PKG_CONFIG_PATH", &pc)
        .output()
        .context("cannot run pkg-config")?;
    if !out.status.success() {
        bail!("pkg-config does not find tunecache in {}", pc.display());
    }
    let flags = String::from_utf8_lossy(&out.stdout).into_owned();
    let exe = work.join("hello");
    user(
        Command::new("cc")
            .arg(&source)
            .arg("-o")
            .arg(&exe)
            .args(flags.split_whitespace()),
        None,
        "cc against the C archive",
    )?;
    let said = user(
        &mut Command::new(&exe),
        None,
        "a program linked to the C archive",
    )?;
    if said.trim() != "linked" {
        bail!("the program linked to the C archive said {said:?}");
    }
    Ok(())
}
