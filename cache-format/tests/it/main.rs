//! Integration tests of cache-format: one binary, a module per concern.

mod alloc_guard;
mod build;
mod checked_walk;
mod fastcheck;
mod fingerprint;
mod hostile;
mod merge;
mod roundtrip;
mod strategies;
mod table;
mod table_python;
