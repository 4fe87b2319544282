//! Integration tests of the `tunecache` binary: real processes, real files.

mod commands;
mod migrate;
mod tune;
