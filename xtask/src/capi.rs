//! `cargo xtask header [--verify]`: writes (or checks) `tunecache-capi/include/tunecache.h`
//! from the crate with cbindgen. `cargo xtask capi [--release] [--prefix DIR]`: builds the C
//! library and installs the headers, `libtunecache.a`, `libtunecache.so` and a pkg-config file
//! `tunecache.pc` under DIR (default `target/capi`), as `cargo cinstall` would.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

const CRATE: &str = "tunecache-capi";

fn header_path(root: &Path) -> PathBuf {
    root.join(CRATE).join("include").join("tunecache.h")
}

/// The header cbindgen writes for the crate as it is now.
fn generate(root: &Path) -> anyhow::Result<Vec<u8>> {
    let dir = root.join(CRATE);
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml"))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let bindings = cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .context("cbindgen cannot generate the header")?;
    let mut out = Vec::new();
    bindings.write(&mut out);
    Ok(out)
}

pub(crate) fn header(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let verify = match args {
        [] => false,
        [flag] if flag == "--verify" => true,
        _ => bail!("usage: cargo xtask header [--verify]"),
    };
    let path = header_path(root);
    let fresh = generate(root)?;
    if verify {
        let checked_in =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        if checked_in != fresh {
            bail!(
                "{} is not what cbindgen generates from {CRATE}/src: run `cargo xtask header` and commit it",
                path.display()
            );
        }
        println!("header ok: {} is up to date", path.display());
    } else {
        std::fs::write(&path, &fresh)
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// What a static link of the library needs besides it (the Rust standard library's own
/// dependencies on glibc, as `rustc --print native-static-libs` lists them).
const STATIC_DEPS: &str = "-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc";

pub(crate) fn install(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let mut release = false;
    let mut prefix = root.join("target").join("capi");
    let mut rest = args.iter();
    while let Some(a) = rest.next() {
        match a.as_str() {
            "--release" => release = true,
            "--prefix" => {
                prefix = PathBuf::from(rest.next().context("--prefix needs a folder")?);
            }
            other => bail!(
                "unknown argument {other:?} (usage: cargo xtask capi [--release] [--prefix DIR])"
            ),
        }
    }
    let libs = build_libraries(root, release)?;
    let (include, lib) = (prefix.join("include"), prefix.join("lib"));
    let pkgconfig = lib.join("pkgconfig");
    for dir in [&include, &pkgconfig] {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    for name in ["tunecache.h", "tunecache.hpp"] {
        copy(
            &root.join(CRATE).join("include").join(name),
            &include.join(name),
        )?;
    }
    for built in &libs {
        let name = built
            .file_name()
            .context("a library path has a file name")?;
        copy(built, &lib.join(name))?;
    }
    let prefix = std::path::absolute(&prefix)?;
    // Relative to the .pc file itself, so the folder can be moved (an unpacked archive).
    let pc = format!(
        "prefix=${{pcfiledir}}/../..\nlibdir=${{prefix}}/lib\nincludedir=${{prefix}}/include\n\n\
         Name: tunecache\nDescription: Persistent, versioned autotune cache (C ABI)\n\
         Version: {}\nLibs: -L${{libdir}} -Wl,-rpath,${{libdir}} -ltunecache\n\
         Libs.private: {STATIC_DEPS}\nCflags: -I${{includedir}}\n",
        env!("CARGO_PKG_VERSION"),
    );
    std::fs::write(pkgconfig.join("tunecache.pc"), pc)?;
    println!("installed the C library under {}", prefix.display());
    println!(
        "  PKG_CONFIG_PATH={} pkg-config --cflags --libs tunecache",
        pkgconfig.display()
    );
    Ok(())
}

/// Builds the crate's libraries; returns `libtunecache.a` and `libtunecache.so` wherever the
/// target directory is (cargo says, in its JSON messages).
fn build_libraries(root: &Path, release: bool) -> anyhow::Result<Vec<PathBuf>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut build = Command::new(cargo);
    build.current_dir(root).args([
        "build",
        "--locked",
        "-p",
        CRATE,
        "--message-format=json-render-diagnostics",
    ]);
    if release {
        build.arg("--release");
    }
    let out = build
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot run cargo build")?;
    if !out.status.success() {
        bail!("cargo build -p {CRATE} failed");
    }
    let libs: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "tunecache")
        .flat_map(|m| m["filenames"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f.as_str().map(PathBuf::from))
        .filter(|f| f.extension().is_some_and(|e| e == "a" || e == "so"))
        .collect();
    if libs.len() != 2 {
        bail!("cargo built {libs:?}, not libtunecache.a and libtunecache.so");
    }
    Ok(libs)
}

fn copy(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::copy(from, to)
        .map(|_| ())
        .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_checked_in_header_is_what_cbindgen_generates() {
        let root = crate::project_root();
        let fresh = super::generate(&root).expect("cbindgen generates the header");
        let checked_in =
            std::fs::read(super::header_path(&root)).expect("the header is checked in");
        assert!(
            checked_in == fresh,
            "tunecache-capi/include/tunecache.h is stale: run `cargo xtask header` and commit it"
        );
    }
}
