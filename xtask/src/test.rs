//! `cargo xtask test`: the README's test command. Prepares what the tests need on a fresh
//! machine, runs the whole suite, and fails if any test skipped, unless skips were allowed.
//!
//! 1. A virtual environment at `target/test-venv` with the Python packages the tests use
//!    (`msgpack` for the cross-language fingerprint check, `nvidia-cuda-nvrtc-cu12` for NVRTC
//!    without a GPU, `mypy` for the stub check, `torch` for `@memoize` of tensors: about
//!    5 GiB with its CUDA libraries, a minute or two to install), `triton` and `helion` for
//!    the framework adapters' tests, installed with pip once and reused; and WarpConvNet's
//!    benchmark-cache module from its sdist (`python/tests/frameworks/fetch_warpconvnet.py`,
//!    pinned by hash, into `target/frameworks`).
//! 2. `redis-server` (Debian's package, installed with apt-get when missing) for the shared
//!    tier's tests, which start their own servers on free loopback ports.
//! 3. `cargo test --workspace --locked` with that environment's `bin` first on `PATH`, NVRTC's
//!    library folder on `LD_LIBRARY_PATH`, and `TUNECACHE_SKIP_LOG` naming a file where every
//!    skipped test writes why (test-support's `skip::missing`).
//! 4. The Python package (`python/`): built into that environment with `maturin develop`,
//!    then its tests run with pytest (`python/tests`; a skipped one is logged like a Rust
//!    skip; no test collected, pytest's exit code 5, fails the run). Nothing is deselected:
//!    the tests marked `torch` run like the others.
//! 5. A skip fails the run (listing each), unless `--allow-skips` was given.
//!
//! Arguments after `--` go to `cargo test`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The Python packages the tests need.
const PACKAGES: [&str; 12] = [
    "msgpack",
    "nvidia-cuda-nvrtc-cu12",
    "maturin>=1.9,<2",
    // `cargo xtask dist` checks the wheel's manylinux tag with `auditwheel show`.
    "auditwheel",
    "numpy",
    "pytest",
    // `mypy.stubtest`: the extension's type stub checked against the built module; and mypy and
    // ruff over the package and its tests (python/pyproject.toml configures both).
    "mypy",
    "ruff",
    // A real S3 API server for the S3 tier's tests (moto's standalone server).
    "moto[server]",
    // `@memoize` of torch tensors (the tests marked `torch`), and the Inductor adapter.
    "torch",
    // The framework adapters (python/tunecache/integrations), at the versions they were tested with.
    "triton",
    "helion==1.5.1",
];

pub(crate) fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let mut allow_skips = false;
    let mut cargo_args = Vec::new();
    let mut rest = args.iter();
    while let Some(a) = rest.next() {
        match a.as_str() {
            "--allow-skips" => allow_skips = true,
            "--" => cargo_args.extend(rest.by_ref().cloned()),
            other => bail!(
                "unknown argument {other:?} (usage: cargo xtask test [--allow-skips] [-- CARGO TEST ARGS])"
            ),
        }
    }
    let venv = root.join("target").join("test-venv");
    let python = prepare_venv(&venv)?;
    let nvrtc = nvrtc_lib(&python)?;
    prepare_debian_tools();
    let skip_log = root.join("target").join("test-skips.log");
    let _ = std::fs::remove_file(&skip_log);

    let path = prepend("PATH", &venv.join("bin"));
    let ld = prepend("LD_LIBRARY_PATH", &nvrtc);
    println!("xtask test: Python packages from {}", venv.display());
    println!("xtask test: NVRTC from {}", nvrtc.display());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status = Command::new(cargo)
        .current_dir(root)
        .args(["test", "--workspace", "--locked"])
        .args(&cargo_args)
        .env("PATH", path)
        .env("LD_LIBRARY_PATH", ld)
        .env("TUNECACHE_SKIP_LOG", &skip_log)
        .status()
        .context("cannot run cargo test")?;
    if !status.success() {
        bail!("the tests failed");
    }
    python_tests(root, &venv, &skip_log)?;
    crate::dist_check::run(root)?;
    let log = std::fs::read_to_string(&skip_log).unwrap_or_default();
    println!("xtask test: {}", verdict(&log, allow_skips)?);
    Ok(())
}

/// Whether `tool` runs here (`openssl version`, `redis-server --version`).
fn has(tool: &str) -> bool {
    let arg = if tool == "openssl" {
        "version"
    } else {
        "--version"
    };
    Command::new(tool)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Installs Debian's `redis-server` (the shared tier's tests), `openssl` (their TLS
/// certificates) and `chromium` (the report page's tests open it in a real browser) when
/// missing and apt-get can (as root). Failing that, says what to install: those tests then
/// fail in CI and skip elsewhere.
fn prepare_debian_tools() {
    for tool in ["redis-server", "openssl", "chromium"] {
        if has(tool) {
            println!("xtask test: {tool} is installed");
            continue;
        }
        println!("xtask test: installing {tool} (apt-get)");
        let install = |update: bool| {
            if update {
                let _ = Command::new("apt-get").args(["update", "-qq"]).status();
            }
            Command::new("apt-get")
                .args(["install", "-y", "-qq", tool])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .is_ok_and(|s| s.success())
        };
        if !(install(false) || install(true)) || !has(tool) {
            println!(
                "xtask test: could not install {tool}; install it (apt-get install {tool}) or \
                 the tests that need it fail in CI and skip elsewhere"
            );
        }
    }
}

/// The run's verdict from the skip log: a skip fails it unless skips are allowed.
fn verdict(skip_log: &str, allow_skips: bool) -> anyhow::Result<String> {
    let skipped: Vec<&str> = skip_log.lines().filter(|l| !l.is_empty()).collect();
    if skipped.is_empty() {
        return Ok("every test ran; none skipped".to_owned());
    }
    let list = skipped.join("\n  ");
    if allow_skips {
        Ok(format!(
            "{} tests skipped (allowed):\n  {list}",
            skipped.len()
        ))
    } else {
        bail!(
            "{} tests skipped, and a skip is not a pass (use --allow-skips to accept them):\n  {list}",
            skipped.len()
        )
    }
}

/// Creates the virtual environment if needed and installs the packages it lacks; returns its
/// Python.
fn prepare_venv(venv: &Path) -> anyhow::Result<PathBuf> {
    let python = venv.join("bin").join("python3");
    if !python.exists() {
        run_checked(
            Command::new("python3").args(["-m", "venv"]).arg(venv),
            "create the test virtual environment (python3 -m venv; on Debian: apt-get install python3-venv)",
        )?;
    }
    let have = Command::new(&python)
        .args([
            "-c",
            "import msgpack, nvidia.cuda_nvrtc, numpy, pytest, maturin, mypy.stubtest, torch, triton, helion, moto.server, auditwheel",
        ])
        .output()
        .is_ok_and(|o| o.status.success())
        && venv.join("bin").join("maturin").exists()
        && venv.join("bin").join("ruff").exists();
    if !have {
        run_checked(
            Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                // In CI, pip's copy of every wheel (torch's CUDA libraries: gigabytes) would
                // only take the disk that the build and the tests need.
                .args(std::env::var_os("CI").map(|_| "--no-cache-dir"))
                .args(PACKAGES),
            "install the Python packages the tests need",
        )?;
    }
    run_checked(
        Command::new(&python)
            .arg(venv.join("../../python/tests/frameworks/fetch_warpconvnet.py"))
            .arg(venv.join("../frameworks/warpconvnet-1.8.2")),
        "fetch WarpConvNet's benchmark cache from its sdist (PyPI)",
    )?;
    Ok(python)
}

/// Builds the Python package into the test environment and runs its tests.
fn python_tests(root: &Path, venv: &Path, skip_log: &Path) -> anyhow::Result<()> {
    let bin = venv.join("bin");
    let path = prepend("PATH", &bin);
    println!("xtask test: building the Python package (maturin develop)");
    run_checked(
        Command::new(bin.join("maturin"))
            .current_dir(root)
            .args(["develop", "--quiet", "--manifest-path", "python/Cargo.toml"])
            .env("VIRTUAL_ENV", venv)
            .env("PATH", &path),
        "build the Python package into the test environment (maturin develop)",
    )?;
    // Lint and types as python/pyproject.toml configures them: a finding fails the run.
    println!("xtask test: ruff and mypy (python/pyproject.toml)");
    let python_dir = root.join("python");
    for (args, what) in [
        (
            &["check", "tunecache", "tests", "examples", "benches"][..],
            "ruff check",
        ),
        (
            &[
                "format",
                "--check",
                "tunecache",
                "tests",
                "examples",
                "benches",
            ][..],
            "ruff format --check",
        ),
    ] {
        run_checked(
            Command::new(bin.join("ruff"))
                .current_dir(&python_dir)
                .args(args),
            what,
        )?;
    }
    run_checked(
        Command::new(bin.join("mypy"))
            .current_dir(&python_dir)
            .env("PATH", &path),
        "mypy (the package's types)",
    )?;
    let python = bin.join("python3");
    let mut pytest = Command::new(&python);
    pytest
        .current_dir(root.join("python"))
        .args([
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "tests",
        ])
        .env("PATH", &path)
        .env("TUNECACHE_SKIP_LOG", skip_log)
        .env(
            "TUNECACHE_BIN",
            root.join("target").join("debug").join("tunecache"),
        );
    let status = pytest.status().context("cannot run pytest")?;
    match status.code() {
        Some(0) => Ok(()),
        Some(5) => bail!("pytest collected no tests in python/tests: that is a failure"),
        _ => bail!("the Python tests failed ({status})"),
    }
}

/// The folder of libnvrtc inside the NVRTC wheel.
fn nvrtc_lib(python: &Path) -> anyhow::Result<PathBuf> {
    let out = Command::new(python)
        .args([
            "-c",
            "import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], 'lib'))",
        ])
        .output()
        .context("cannot run the virtual environment's python")?;
    if !out.status.success() {
        bail!(
            "the NVRTC wheel is not importable: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn run_checked(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("cannot {what}"))?;
    if !status.success() {
        bail!("could not {what} ({status})");
    }
    Ok(())
}

/// `dir` in front of the list in the environment variable `var`.
pub(crate) fn prepend(var: &str, dir: &Path) -> std::ffi::OsString {
    let mut paths = vec![dir.to_owned()];
    if let Some(old) = std::env::var_os(var) {
        paths.extend(std::env::split_paths(&old));
    }
    std::env::join_paths(paths).unwrap_or_else(|_| dir.as_os_str().to_owned())
}

#[cfg(test)]
mod tests {
    use super::verdict;

    #[test]
    fn a_skip_fails_the_run_unless_allowed() {
        assert!(verdict("", false).is_ok());
        let log = "NVRTC for x: not installed\n";
        let err = verdict(log, false).expect_err("a skip fails").to_string();
        assert!(
            err.contains("1 tests skipped") && err.contains("NVRTC for x"),
            "{err}"
        );
        assert!(verdict(log, true).expect("allowed").contains("NVRTC for x"));
    }
}
