//! The documents' command blocks marked runnable, run as written (issue 52: "every command the
//! README or docs show works when pasted into a fresh shell"). A fenced `sh` block right after
//! a line `<!-- runnable -->` (or `<!-- runnable after: SETUP -->`, whose SETUP runs first and
//! is shown in the source) in README.md or docs/*.md is run by bash with `set -euo pipefail`,
//! in a fresh folder with a fresh HOME and nothing of this environment but a PATH whose
//! `tunecache` is this build's; the blocks of one document run in order in one folder, so a
//! block may use what an earlier one made. Each must exit 0 within a minute.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A runnable block: where it is, what runs before it, and its text.
#[derive(Debug)]
struct Block {
    at: String,
    setup: Option<String>,
    text: String,
}

/// The runnable blocks of `doc`, in order; a marker without a `sh` block after it is an error.
fn blocks(doc: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(doc).expect("a document");
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim().strip_prefix("<!-- runnable") else {
            continue;
        };
        let rest = rest
            .strip_suffix("-->")
            .expect("a marker on one line")
            .trim();
        let setup = rest.strip_prefix("after:").map(|s| s.trim().to_owned());
        assert!(
            setup.is_some() || rest.is_empty(),
            "{}:{}: a marker is `<!-- runnable -->` or `<!-- runnable after: SETUP -->`",
            doc.display(),
            i + 1
        );
        assert_eq!(
            lines.get(i + 1).map(|l| l.trim()),
            Some("```sh"),
            "{}:{}: a runnable marker must precede a ```sh block",
            doc.display(),
            i + 1
        );
        let body: Vec<&str> = lines[i + 2..]
            .iter()
            .take_while(|l| l.trim() != "```")
            .copied()
            .collect();
        out.push(Block {
            at: format!("{}:{}", doc.display(), i + 3),
            setup,
            text: body.join("\n"),
        });
    }
    out
}

/// Runs `script` with bash in `dir` (HOME `dir/home`, PATH `bin` and the system's), within a
/// minute: its exit status and output.
fn run(script: &str, dir: &Path, bin: &Path) -> (Option<i32>, String) {
    let home = dir.join("home");
    std::fs::create_dir_all(&home).expect("home");
    let mut child = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("set -euo pipefail\n{script}"))
        .current_dir(dir)
        .env_clear()
        .env("HOME", &home)
        .env(
            "PATH",
            format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display()),
        )
        .env("LANG", "C.UTF-8")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("bash runs");
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_documents_runnable_blocks_work_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut docs: Vec<PathBuf> = vec![root.join("README.md")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    more.sort();
    docs.extend(more);
    // `tunecache` on PATH is this build's.
    let bin = tempfile::tempdir().expect("bin");
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_tunecache"),
        bin.path().join("tunecache"),
    )
    .expect("link");
    let mut ran = 0;
    let mut failed = Vec::new();
    for doc in &docs {
        let dir = tempfile::tempdir().expect("dir");
        for block in blocks(doc) {
            let script = match &block.setup {
                Some(setup) => format!("{setup}\n{}", block.text),
                None => block.text.clone(),
            };
            let (code, said) = run(&script, dir.path(), bin.path());
            ran += 1;
            if code != Some(0) {
                failed.push(format!(
                    "{} (exit {code:?}):\n{}\n--- said:\n{said}",
                    block.at, block.text
                ));
            }
        }
    }
    assert!(ran >= 3, "only {ran} runnable blocks: a marker was lost");
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
