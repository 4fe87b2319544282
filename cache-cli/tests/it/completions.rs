//! `tunecache completions SHELL` and `tunecache man -o DIR`: generated from the command
//! line's own definitions, so every command appears in them.

use std::process::Command;

use crate::tunecache;

/// Every visible command of `tunecache --help`.
fn commands() -> Vec<String> {
    let dir = tempfile::tempdir().expect("dir");
    let out = tunecache(&dir.path().join("c.tcache"), &["--help"]);
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|c| c != "help")
        .collect()
}

#[test]
fn bash_loads_the_completion_script_and_it_knows_every_command() {
    let dir = tempfile::tempdir().expect("dir");
    let out = tunecache(&dir.path().join("c.tcache"), &["completions", "bash"]);
    assert!(out.status.success());
    let script = dir.path().join("tunecache.bash");
    std::fs::write(&script, &out.stdout).expect("script");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let listed = commands();
    assert!(listed.len() > 15, "{listed:?}");
    for c in &listed {
        assert!(
            text.contains(c.as_str()),
            "{c} is not in the bash completions"
        );
    }
    // Sourced by a real bash, it registers a completion for tunecache.
    let loaded = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && complete -p tunecache",
            script.display()
        ))
        .output()
        .expect("bash");
    assert!(
        loaded.status.success(),
        "{}",
        String::from_utf8_lossy(&loaded.stderr)
    );
    assert!(String::from_utf8_lossy(&loaded.stdout).contains("tunecache"));
    for shell in ["zsh", "fish"] {
        let out = tunecache(&dir.path().join("c.tcache"), &["completions", shell]);
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            text.contains("report") && text.contains("evaluate"),
            "{shell}"
        );
    }
    let out = tunecache(&dir.path().join("c.tcache"), &["completions", "tcsh"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

#[test]
fn a_manual_page_is_written_for_every_command() {
    let dir = tempfile::tempdir().expect("dir");
    let pages = dir.path().join("man");
    let out = tunecache(
        &dir.path().join("c.tcache"),
        &["man", "-o", pages.to_str().expect("utf-8")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let top = std::fs::read_to_string(pages.join("tunecache.1")).expect("tunecache.1");
    assert!(
        top.starts_with(".ie") || top.contains(".TH"),
        "roff: {}",
        &top[..80.min(top.len())]
    );
    for c in commands() {
        let page = pages.join(format!("tunecache-{c}.1"));
        let text =
            std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        assert!(text.contains(".TH"), "{c}");
        assert!(text.contains(&format!("tunecache\\-{c}")), "{c}: {text}");
    }
}

/// `--help` ends with every environment variable of the one settings table (issue 52), each
/// with its meaning and what holds unset; `-h` stays short.
#[test]
fn help_lists_every_environment_variable() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    let long = tunecache(&file, &["--help"]);
    let text = String::from_utf8_lossy(&long.stdout);
    assert!(text.contains("Environment (docs/settings.md):"), "{text}");
    for v in cache_core::settings::VARIABLES {
        assert!(
            text.contains(&format!("\n  {}\n", v.name)),
            "{}: {text}",
            v.name
        );
    }
    assert!(
        text.contains("[unset: 50]"),
        "the read budget's default: {text}"
    );
    let short = tunecache(&file, &["-h"]);
    assert!(!String::from_utf8_lossy(&short.stdout).contains("Environment (docs/settings.md)"));
}
