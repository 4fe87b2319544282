//! The example docs/rust.md quotes ("Tuning from Rust"), run by `gpu-tuner/tests/it/examples.rs`.
//! Run with `cargo run --release -p gpu-tuner --example tune_quickstart`.
#![allow(clippy::print_stdout, reason = "an example reports what it did")]

use std::sync::Arc;

use cache_core::Cache;
use cache_core::cache_migrate::Migrations;
use gpu_tuner::cpu::{Matmul, MatmulKey};
use gpu_tuner::{OpConfig, Operation, Tuner};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join("tunecache-tuner-quickstart");
    let cache = Arc::new(
        Cache::builder(Migrations::new("mylib", 1))
            .dir(&dir)
            .scope(gpu_tuner::cpu::scope())
            .open(),
    );
    let matmul = Tuner::new(cache).register(Matmul, OpConfig::default())?;
    let key = MatmulKey::f32(512, 256, 64);
    let choice = matmul.get(&key)?; // tunes on the first call (in the first process), a hash probe after
    println!(
        "{key:?}: {} (provisional: {})",
        choice.candidate(),
        choice.is_provisional()
    );
    // Run the chosen kernel; if it failed, run() would record that and try the runner-up.
    let mut problem = matmul.operation().problem(&key).map_err(String::from)?;
    matmul.run(&key, |kernel| matmul.operation().run(kernel, &mut problem))?;
    println!("ran it; dispatch hits so far: {}", matmul.stats().hits);
    Ok(())
}
