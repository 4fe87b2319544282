//! What the benchmark measures on: a cache of N entries (about 350 bytes each, like a tuned
//! matmul key with a few candidates) as a table (format 4) and as a format 3 snapshot of the
//! same entries, and an SQLite database of the same keys (an indexed table of key text and a
//! 350-byte value), the baseline a one-key lookup is compared with.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};
use cache_format::{
    CacheData, Candidate, Entry, Fields, Fingerprint, Key, Origin, Scope, Stats, Value,
    encode_snapshot,
};

/// `cargo xtask bench-gen N PATH [--format 3]` (used by bench-report): writes a cache of N
/// entries, a table unless `--format 3` asks for a format 3 snapshot.
pub(crate) fn generate(args: &[String]) -> anyhow::Result<()> {
    let (n, path, legacy) = match args {
        [n, path] => (n, path, false),
        [n, path, flag, three] if flag == "--format" && three == "3" => (n, path, true),
        _ => bail!("bench-gen takes N PATH [--format 3]"),
    };
    let n: usize = n.parse().context("bench-gen: N")?;
    let data = data(n);
    let bytes = if legacy {
        encode_snapshot("bench", 1, &data)
    } else {
        cache_format::table::table_bytes("bench", 1, None, &data)
    };
    std::fs::write(path, bytes)?;
    Ok(())
}

/// The bench's scope, as JSON (what a Python or C reader opens the cache for).
pub(crate) const SCOPE_JSON: &str = r#"{"device": "bench device", "backend": "cpu"}"#;

/// The key of entry `i`, as JSON.
pub(crate) fn key_json(i: usize) -> String {
    format!(r#"{{"m":{i},"n":{},"k":64,"dtype":"f16"}}"#, (i % 97) + 1)
}

/// A cache of `n` entries: matmul keys with three candidates each.
pub(crate) fn data(n: usize) -> CacheData {
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

/// An SQLite database at `path` of `n` rows (namespace, key JSON as [`key_json`] writes it, a
/// 350-byte value) with a unique index on (namespace, key), made by the `sqlite3` command;
/// `false` when there is no `sqlite3`.
pub(crate) fn sqlite(path: &Path, n: usize) -> anyhow::Result<bool> {
    let script = format!(
        "PRAGMA journal_mode=WAL;\n\
         CREATE TABLE t (ns TEXT NOT NULL, k TEXT NOT NULL, v BLOB NOT NULL);\n\
         WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i < {last})\n\
         INSERT INTO t SELECT 'matmul', \
         '{{\"m\":' || i || ',\"n\":' || (i % 97 + 1) || ',\"k\":64,\"dtype\":\"f16\"}}', \
         randomblob(350) FROM c;\n\
         CREATE UNIQUE INDEX t_key ON t (ns, k);\n",
        last = n.saturating_sub(1)
    );
    let child = Command::new("sqlite3")
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return Ok(false);
    };
    use std::io::Write as _;
    child
        .stdin
        .take()
        .context("sqlite3's stdin")?
        .write_all(script.as_bytes())?;
    let status = child.wait()?;
    if !status.success() {
        bail!("sqlite3 could not build the baseline database ({status})");
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both files hold the same n entries and read back, and the key JSON is the key.
    #[test]
    fn the_generated_caches_read_back() {
        let limits = cache_format::Limits::default();
        let bytes = encode_snapshot("bench", 1, &data(50));
        let snap = cache_format::read_snapshot(&bytes, &limits).expect("readable");
        assert_eq!(snap.header.entries, 50);
        let per_entry = bytes.len() / 50;
        assert!(
            (200..600).contains(&per_entry),
            "{per_entry} bytes per entry"
        );
        let table = cache_format::table::table_bytes("bench", 1, None, &data(50));
        assert!(cache_format::table::is_table(&table));
        let key: serde_json::Value = serde_json::from_str(&key_json(7)).expect("JSON");
        assert_eq!(key["m"], 7);
        assert_eq!(key["n"], 8);
    }
}
