#![allow(
    clippy::print_stdout,
    reason = "tests and child processes report on stdout"
)]
//! Integration tests of cache-core: one binary, a module per concern. Concurrency, crash and
//! lock tests use real child processes (this binary re-executed, see `children`).

mod append;
mod artifacts;
mod basics;
mod caps;
mod children;
mod concurrency;
mod corrupt;
mod crash;
mod degrade;
mod examples;
mod gc_beside_writer;
mod io_promise;
mod journal_lost;
mod lazy;
mod lock;
mod migration;
mod model;
mod replaced;
mod support;
mod system;
mod vectors;
mod versions;
