//! Integration tests of cache-format: one binary, a module per concern.

mod alloc_guard;
mod fastcheck;
mod fingerprint;
mod hostile;
mod merge;
mod roundtrip;
mod strategies;
