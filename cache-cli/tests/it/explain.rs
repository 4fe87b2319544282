//! `tunecache explain`: which scope field differs, and the other reasons an entry is not used.

use std::path::Path;
use std::time::Duration;

use cache_core::cache_format::{Fields, Scope, Value};
use cache_core::cache_migrate::Migrations;
use cache_core::{Cache, Namespace, Store};

use crate::diff::entry;
use crate::tunecache;

fn scope(driver: &str) -> Scope {
    Scope::new(Fields::from([
        ("device".to_owned(), Value::from("H100")),
        ("driver".to_owned(), Value::from(driver)),
    ]))
}

fn explain(path: &Path, extra: &[&str]) -> (Option<i32>, serde_json::Value) {
    let mut args = vec!["--json", "explain", "-n", "mm", "-k", r#"{"id":1}"#];
    args.extend_from_slice(extra);
    let o = tunecache(path, &args);
    let json = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
    (o.status.code(), json)
}

/// Writes a cache at `path` holding `entries` of namespace `mm` under `scope`.
fn write_cache(path: &Path, scope: Scope, entries: Vec<cache_core::cache_format::Entry>) {
    let cache = Cache::builder(Migrations::new("tunecache", 1))
        .file(path)
        .ignore_env()
        .scope(scope)
        .refresh_interval(None)
        .flush_timeout(Duration::from_secs(30))
        .open();
    let ns = Namespace::new("mm").expect("ns");
    for e in entries {
        cache.try_put(ns, e).expect("put");
    }
    cache.close().expect("saved");
}

#[test]
fn explain_names_the_differing_scope_field_and_the_other_reasons() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("a.tcache");
    let x_wins = &[("x", Some((100.0, 5.0))), ("y", Some((200.0, 5.0)))];
    write_cache(&path, scope("550"), vec![entry(1, 0, x_wins)]);

    let (code, r) = explain(&path, &["--scope", r#"{"device":"H100","driver":"560"}"#]);
    assert_eq!(code, Some(4), "{r:#}");
    let found = &r["found"][0];
    assert_eq!(found["used"], false, "{r:#}");
    assert_eq!(
        found["differing_fields"],
        serde_json::json!([{"field": "driver", "here": "560", "there": "550"}]),
        "{r:#}"
    );

    let here = r#"{"device":"H100","driver":"550"}"#;
    let (code, r) = explain(&path, &["--scope", here]);
    assert_eq!(code, Some(0), "{r:#}");
    assert_eq!(r["found"][0]["used"], true, "{r:#}");
    assert_eq!(r["found"][0]["winner"], "x", "{r:#}");

    let other_set = "0101010101010101010101010101010101010101"[..32].to_owned();
    let (code, r) = explain(&path, &["--scope", here, "--candidate-set", &other_set]);
    assert_eq!(code, Some(4), "{r:#}");
    assert!(
        r["found"][0]["reasons"][0]
            .as_str()
            .expect("text")
            .contains("candidate set changed")
    );

    let (code, r) = explain(
        &path,
        &["--scope", here, "--candidate", "y", "--candidate", "z"],
    );
    assert_eq!(code, Some(4), "{r:#}");
    assert!(
        r["found"][0]["reasons"][0]
            .as_str()
            .expect("text")
            .contains("not a current candidate")
    );
}

#[test]
fn explain_says_loose_when_only_other_families_versions_changed() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("a.tcache");
    let stored = Scope::new(Fields::from([
        ("device".to_owned(), Value::from("H100")),
        ("version.x".to_owned(), Value::from("1")),
        ("version.y".to_owned(), Value::from("1")),
    ]));
    let x_wins = &[("x", Some((100.0, 5.0))), ("y", Some((200.0, 5.0)))];
    write_cache(&path, stored, vec![entry(1, 0, x_wins)]);
    let reason = |scope: &str| {
        let (_, r) = explain(&path, &["--scope", scope]);
        r["found"][0]["reasons"][0]
            .as_str()
            .expect("text")
            .to_owned()
    };
    // y's library moved on; the winner x's did not.
    let y_bumped = reason(r#"{"device":"H100","version.x":"1","version.y":"2"}"#);
    assert!(y_bumped.contains("loose"), "{y_bumped}");
    // x's own version moved on: not loose.
    let x_bumped = reason(r#"{"device":"H100","version.x":"2","version.y":"1"}"#);
    assert!(!x_bumped.contains("loose"), "{x_bumped}");
}

#[test]
fn a_key_no_tier_has_shows_its_prediction_and_the_keys_that_voted() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("a.tcache");
    // Keys 2..=6: x wins 2 to 4, y the larger ones.
    let tuned = (2..=6i64)
        .map(|id| {
            let (x, y) = if id <= 4 {
                (100.0, 200.0)
            } else {
                (300.0, 100.0)
            };
            entry(id, 0, &[("x", Some((x, 5.0))), ("y", Some((y, 5.0)))])
        })
        .collect();
    write_cache(&path, scope("550"), tuned);
    let here = r#"{"device":"H100","driver":"550"}"#;
    // Key 1 is not tuned: its four nearest keys (2 to 5, three of them x) vote for x.
    let (code, r) = explain(&path, &["--scope", here]);
    assert_eq!(code, Some(4), "{r:#}");
    let p = &r["prediction"];
    assert_eq!(p["winner"], "x", "{r:#}");
    let neighbours = p["neighbours"].as_array().expect("neighbours");
    assert_eq!(neighbours.len(), 4);
    // Key 3 is a little nearer than key 2: as far in size (ln 4/2 against ln 3/2), but as
    // odd as key 1 where 2 is even (the alignment term).
    assert_eq!(neighbours[0]["key"], r#"{"id":3}"#, "{r:#}");
    assert_eq!(neighbours[1]["key"], r#"{"id":2}"#, "{r:#}");
    // A tuned key shows no prediction.
    let o = tunecache(
        &path,
        &[
            "--json",
            "explain",
            "-n",
            "mm",
            "-k",
            r#"{"id":2}"#,
            "--scope",
            here,
        ],
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert!(r.get("prediction").is_none(), "{r:#}");
}

/// Hardening IV, case 11: with `TUNECACHE_SYSTEM_PATH` naming a bundle, a cache (and `tune`)
/// serves the key from it, but `get` and `explain` said it missed (exit 4), and with no user
/// file yet `explain` failed "no such cache file". Both see the tiers a lookup would.
#[test]
fn get_and_explain_see_the_system_files_a_lookup_would() {
    let dir = tempfile::tempdir().expect("dir");
    let shipped = dir.path().join("shipped.tcache");
    write_cache(
        &shipped,
        scope("560"),
        vec![entry(1, 0, &[("x", Some((100.0, 5.0)))])],
    );
    let bundle = dir.path().join("shipped.tcb");
    let made = tunecache(
        &shipped,
        &["bundle", "create", "-o", bundle.to_str().expect("utf-8")],
    );
    assert_eq!(
        made.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    // A machine with no cache file of its own.
    let mine = dir.path().join("mine.tcache");
    let here = r#"{"device":"H100","driver":"560"}"#;
    let run = |args: &[&str], system: bool| {
        let mut cmd = test_support::cli::command(crate::EXE, &mine, args);
        if system {
            cmd.env("TUNECACHE_SYSTEM_PATH", &bundle);
        }
        cmd.output().expect("run tunecache")
    };
    let get = ["get", "-n", "mm", "-k", r#"{"id":1}"#];
    let o = run(&get, true);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("read from the system file"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_ne!(run(&get, false).status.code(), Some(0), "no tier has it");
    // A system file that is not there is said to be missing (it was "holds no readable
    // cache"), and the next one still serves.
    let missing = dir.path().join("missing.tcb");
    let o = test_support::cli::command(crate::EXE, &mine, &get)
        .env(
            "TUNECACHE_SYSTEM_PATH",
            format!("{}:{}", missing.display(), bundle.display()),
        )
        .output()
        .expect("run tunecache");
    let said = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{said}");
    assert!(
        said.contains(&format!("{} is not used: no such file", missing.display())),
        "{said}"
    );
    let explain = [
        "--json",
        "explain",
        "-n",
        "mm",
        "-k",
        r#"{"id":1}"#,
        "--scope",
        here,
    ];
    let o = run(&explain, true);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let used = r["found"]
        .as_array()
        .expect("found")
        .iter()
        .find(|f| f["used"] == true)
        .expect("one entry is used");
    assert!(
        used["tier"]
            .as_str()
            .expect("tier")
            .starts_with("system file"),
        "{r:#}"
    );
}

/// A device with nothing tuned: `explain` shows what the tuner would serve, transferred from
/// the key's results on the other devices, each named with its winner.
#[test]
fn a_key_on_a_device_never_tuned_shows_the_transferred_prediction() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("a.tcache");
    let a100 = Scope::new(Fields::from([("device".to_owned(), Value::from("A100"))]));
    let y_wins = &[("x", Some((300.0, 5.0))), ("y", Some((100.0, 5.0)))];
    write_cache(&path, a100, vec![entry(1, 0, y_wins)]);
    let (code, r) = explain(&path, &["--scope", r#"{"device":"B200"}"#]);
    assert_eq!(code, Some(4), "a miss still: {r:#}");
    let p = &r["prediction"];
    assert_eq!(p["winner"], "y", "{r:#}");
    assert_eq!(
        p["transferred_from"][0]["scope"], r#"{"device":"A100"}"#,
        "{r:#}"
    );
    assert_eq!(p["transferred_from"][0]["winner"], "y", "{r:#}");
    // What a miss measures first here, per key: the other devices' best, y then x.
    assert_eq!(p["measure_first"], serde_json::json!(["y", "x"]), "{r:#}");
    let text = tunecache(
        &path,
        &[
            "explain",
            "-n",
            "mm",
            "-k",
            r#"{"id":1}"#,
            "--scope",
            r#"{"device":"B200"}"#,
        ],
    );
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("transferred here: y"), "{text}");
    assert!(
        text.contains("measure first here (a TuneNow miss measures the best 5 of their"),
        "{text}"
    );
    assert!(text.contains("nearly the other way round): y, x"), "{text}");
}

/// A device with a few keys tuned: `explain` shows its own nearest keys and, beside them,
/// the key's result on another device, marked so, with that device named.
#[test]
fn a_key_on_a_device_with_a_few_keys_shows_other_devices_results_beside_them() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("a.tcache");
    let a100 = Scope::new(Fields::from([("device".to_owned(), Value::from("A100"))]));
    let b200 = Scope::new(Fields::from([("device".to_owned(), Value::from("B200"))]));
    let y_wins = &[("x", Some((300.0, 5.0))), ("y", Some((100.0, 5.0)))];
    let x_wins = &[("x", Some((100.0, 5.0))), ("y", Some((300.0, 5.0)))];
    write_cache(&path, a100, vec![entry(1, 0, y_wins)]);
    write_cache(&path, b200, vec![entry(1000, 0, x_wins)]);
    let (code, r) = explain(&path, &["--scope", r#"{"device":"B200"}"#]);
    assert_eq!(code, Some(4), "a miss still: {r:#}");
    let p = &r["prediction"];
    assert_eq!(
        p["winner"], "y",
        "the same key's result outweighs a far key: {r:#}"
    );
    assert!(p.get("transferred_from").is_none(), "{r:#}");
    assert_eq!(p["beside"][0]["scope"], r#"{"device":"A100"}"#, "{r:#}");
    let flags: Vec<bool> = p["neighbours"]
        .as_array()
        .expect("neighbours")
        .iter()
        .map(|n| n["elsewhere"].as_bool().expect("flag"))
        .collect();
    assert_eq!(flags, [true, false], "{r:#}");
    let text = tunecache(
        &path,
        &[
            "explain",
            "-n",
            "mm",
            "-k",
            r#"{"id":1}"#,
            "--scope",
            r#"{"device":"B200"}"#,
        ],
    );
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("this key on another device") && text.contains("A100"),
        "{text}"
    );
}
