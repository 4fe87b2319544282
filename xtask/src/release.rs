//! The release check: a version number may only move forward with its history covered.
//!
//! For each application under `golden/`: the current schema has a golden input (so the next
//! bump starts covered), the previous schema too (so the last bump is covered), and every
//! input has a migration path to the current schema. For the container format: a golden file
//! for the current format version in `golden/format/inputs/`, and, past format 1, one for
//! the previous version and a format step from it.

use std::path::Path;

use anyhow::bail;
use cache_format::FORMAT_VERSION;
use cache_migrate::FORMAT_STEPS;

use crate::golden::apps;

pub(crate) fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    for app in apps(root)? {
        let current = app.registry.current();
        let inputs = app.input_versions()?;
        let oldest = inputs.first().copied().unwrap_or(current);
        if !inputs.contains(&current) {
            problems.push(format!(
                "{}: schema {current} has no golden input {} (add source/v{current}.jsonl and run `cargo xtask golden --new-input {} {current}`)",
                app.name,
                app.input(current).display(),
                app.name
            ));
        }
        if current > oldest {
            let previous = current - 1;
            if !inputs.contains(&previous) {
                problems.push(format!(
                    "{}: the previous schema {previous} has no golden input",
                    app.name
                ));
            }
            if app.registry.path(previous).is_err() {
                problems.push(format!(
                    "{}: no migration step from schema {previous}",
                    app.name
                ));
            }
        }
        for v in inputs.iter().filter(|v| **v < current) {
            if let Err(e) = app.registry.path(*v) {
                problems.push(format!("{}: golden input v{v}: {e}", app.name));
            }
        }
    }
    let format_dir = root.join("golden").join("format");
    let has_format = |v: u32| {
        format_dir
            .join("inputs")
            .join(format!("v{v}.tcache"))
            .exists()
    };
    if !has_format(FORMAT_VERSION) {
        problems.push(format!("format {FORMAT_VERSION} has no golden file golden/format/inputs/v{FORMAT_VERSION}.tcache (run `cargo xtask golden --new-input format {FORMAT_VERSION}`)"));
    }
    if FORMAT_VERSION > 1 {
        let previous = FORMAT_VERSION - 1;
        if !has_format(previous) {
            problems.push(format!("the previous format {previous} has no golden file"));
        }
        if !FORMAT_STEPS
            .iter()
            .any(|s| s.from == previous && s.to == FORMAT_VERSION)
        {
            problems.push(format!(
                "no container-format step {previous}→{FORMAT_VERSION}"
            ));
        }
    }
    Ok(problems)
}

pub(crate) fn run(root: &Path) -> anyhow::Result<()> {
    let problems = check(root)?;
    if problems.is_empty() {
        println!(
            "release check ok: format {FORMAT_VERSION}; every schema bump has its step and golden inputs"
        );
        Ok(())
    } else {
        bail!("release check failed:\n  {}", problems.join("\n  "))
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    #[test]
    fn the_release_check_passes() {
        let problems = super::check(&crate::project_root()).expect("golden files readable");
        assert!(problems.is_empty(), "{problems:#?}");
    }

    /// A copy of the real golden tree, to break on purpose.
    fn copy_golden(to: &Path) {
        fn copy(from: &Path, to: &Path) {
            fs::create_dir_all(to).expect("mkdir");
            for e in fs::read_dir(from).expect("list") {
                let e = e.expect("entry");
                let target = to.join(e.file_name());
                if e.path().is_dir() {
                    copy(&e.path(), &target);
                } else {
                    fs::copy(e.path(), target).expect("copy");
                }
            }
        }
        copy(&crate::project_root().join("golden"), &to.join("golden"));
    }

    fn set_current(root: &Path, app: &str, edit: impl Fn(&mut serde_json::Value)) {
        let path = root.join("golden").join(app).join("migrations.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&path).expect("read")).expect("json");
        edit(&mut v);
        fs::write(path, v.to_string()).expect("write");
    }

    #[test]
    fn a_schema_bump_without_a_step_or_golden_input_fails() {
        let root = tempfile::tempdir().expect("dir");
        copy_golden(root.path());
        // Bump warpconvnet-demo from 9 to 10 with nothing else.
        set_current(root.path(), "warpconvnet-demo", |v| {
            v["current"] = 10.into()
        });
        let problems = super::check(root.path()).expect("readable");
        assert!(
            problems
                .iter()
                .any(|p| p.contains("schema 10 has no golden input")),
            "{problems:#?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("no migration step from schema 9")),
            "{problems:#?}"
        );

        // Adding the step is not enough without the golden input for the new schema.
        set_current(root.path(), "warpconvnet-demo", |v| {
            v["steps"]
                .as_array_mut()
                .expect("steps")
                .push(serde_json::json!({"from": 9, "to": 10, "ops": []}));
        });
        let problems = super::check(root.path()).expect("readable");
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(problems[0].contains("schema 10 has no golden input"));
    }

    #[test]
    fn a_broken_chain_fails() {
        let root = tempfile::tempdir().expect("dir");
        copy_golden(root.path());
        set_current(root.path(), "warpconvnet-demo", |v| {
            v["steps"]
                .as_array_mut()
                .expect("steps")
                .retain(|s| s["from"] != 7);
        });
        let problems = super::check(root.path()).expect("readable");
        assert!(
            problems
                .iter()
                .any(|p| p.contains("golden input v6") && p.contains("no step starts at schema 7")),
            "{problems:#?}"
        );
    }

    #[test]
    fn a_changed_migration_fails_the_golden_check() {
        let root = tempfile::tempdir().expect("dir");
        copy_golden(root.path());
        set_current(root.path(), "warpconvnet-demo", |v| {
            v["steps"][2]["ops"][0]["to"] = "masked_gemm".into();
        });
        let problems = crate::golden::check(root.path()).expect("readable");
        assert!(
            problems
                .iter()
                .any(|p| p.contains("expected/v8.tcache")
                    && p.contains("no longer gives these bytes")),
            "{problems:#?}"
        );
        assert!(
            !problems.iter().any(|p| p.contains("expected/v9.tcache")),
            "v9 is current and untouched: {problems:#?}"
        );
    }
}
