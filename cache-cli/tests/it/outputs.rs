//! `tunecache outputs stats|verify|gc|clear DIR` on a directory written by cache-outputs.

use cache_outputs::{Arg, Codec, KeyBuilder, OutputCache, Tensor};

use crate::tunecache;

fn json(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

#[test]
fn outputs_commands_count_check_prune_and_clear() {
    let tmp = test_support::temp_dir();
    let dir = tmp.path().join("outs");
    let cache = OutputCache::builder(&dir)
        .codec(Codec::Zstd(1))
        .open()
        .expect("open");
    let keys: Vec<_> = (0..3u64)
        .map(|i| KeyBuilder::new("f", "1").arg(Arg::UInt(i)).finish())
        .collect();
    for (i, k) in keys.iter().enumerate() {
        cache.put(k, Tensor::bytes(vec![i as u8; 10_000 * (i + 1)]));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let file = tmp.path().join("unused.tcache");
    let d = dir.to_str().expect("utf-8");

    let o = tunecache(&file, &["--json", "outputs", "stats", d]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(json(&o)["values"], 3);

    let o = tunecache(&file, &["outputs", "verify", d]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );

    // Damage the second value: verify names it and exits 3; --remove removes it.
    let victim = cache.store().path_of(&keys[1]);
    let mut bytes = std::fs::read(&victim).expect("read");
    let at = bytes.len() - 3;
    bytes[at] ^= 4;
    std::fs::write(&victim, bytes).expect("damage");
    let o = tunecache(&file, &["--json", "outputs", "verify", d]);
    assert_eq!(o.status.code(), Some(3));
    let v = json(&o);
    assert_eq!(v["damaged"][0]["path"], victim.to_str().expect("utf-8"));
    assert!(victim.exists(), "verify alone changes nothing");
    let o = tunecache(&file, &["outputs", "verify", "--remove", d]);
    assert_eq!(o.status.code(), Some(3));
    assert!(!victim.exists());

    // gc to the size of the newest value only: the older one goes.
    let newest = std::fs::metadata(cache.store().path_of(&keys[2]))
        .expect("meta")
        .len();
    let o = tunecache(
        &file,
        &[
            "--json",
            "outputs",
            "gc",
            "--max-size",
            &newest.to_string(),
            "--dry-run",
            d,
        ],
    );
    assert_eq!(json(&o)["removed"], 1);
    assert!(
        cache.store().contains(&keys[0]),
        "a dry run removes nothing"
    );
    let o = tunecache(
        &file,
        &["outputs", "gc", "--max-size", &newest.to_string(), d],
    );
    assert_eq!(o.status.code(), Some(0));
    assert!(!cache.store().contains(&keys[0]));
    assert!(cache.store().contains(&keys[2]));

    let o = tunecache(&file, &["--json", "outputs", "clear", d]);
    assert_eq!(json(&o)["removed"], 1);
    assert_eq!(cache.store().size().expect("size"), 0);

    // Not a directory: a clear error naming it, nothing created.
    let o = tunecache(&file, &["outputs", "stats", file.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unused.tcache"));
    assert!(!file.exists());
}
