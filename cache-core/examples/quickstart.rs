//! The README's first Rust example, run twice by `cache-core/tests/it/examples.rs`: a miss
//! records a result, the next run finds it. `cargo run -p cache-core --example quickstart`.
#![allow(clippy::print_stdout, reason = "an example reports what it did")]

use cache_core::cache_format::{Candidate, Fields, Key, Stats};
use cache_core::cache_migrate::Migrations;
use cache_core::{Cache, Namespace, Store, measured_entry};

#[derive(serde::Serialize)]
struct MatmulKey {
    m: u32,
    n: u32,
    k: u32,
    dtype: &'static str,
}

// Kept as the README quotes it.
#[rustfmt::skip]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join("tunecache-quickstart");
    let cache = Cache::builder(Migrations::new("mylib", 1)).dir(&dir).open(); // <dir>/mylib.tcache
    let matmul = Namespace::new("matmul")?;
    let key = Key::from_serialize(&MatmulKey { m: 128, n: 256, k: 64, dtype: "float16" })?;
    match cache.lookup(matmul, &key) {
        Some(entry) => println!("hit: {:?}", entry.best().map(|c| &c.id.algorithm)),
        None => {
            let stats = Stats { median_ns: 1200.0, min_ns: 1150.0, spread_ns: 8.0, samples: 15 };
            cache.put(matmul, measured_entry(key, [Candidate::measured("tiled", Fields::new(), stats)]));
            println!("miss: recorded in {}", dir.display());
        }
    }
    cache.close()?; // saves now (a dropped cache saves too, in the background within ~250 ms)
    Ok(())
}
