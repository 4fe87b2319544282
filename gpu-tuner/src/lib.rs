//! The tunecache benchmark runner: measures candidate implementations on a cache miss and
//! records the ranking, on CPU and (with a driver present) CUDA.
//!
//! Not built yet: this crate holds its place in the layering (it is the only crate allowed to
//! depend on cudarc) and is filled by the tuner issue.
#![deny(missing_docs)]
