//! The tunecache benchmark runner: measures candidate implementations on a cache miss and
//! records the ranking, so every later call, in this process or any later one, gets the
//! winner for the cost of a hash probe.
//!
//! - [`Operation`] is what a kernel library implements per operation family: candidates with
//!   stable names and params, and how to prepare (compile), run, verify and time them.
//! - [`Tuner`] registers operations on a [`cache_core::Cache`]; [`Tuned::get`] returns a
//!   [`Choice`] with a ready-to-run handle. See the `tuner` module docs for what a miss does.
//! - [`cpu`] is the CPU backend (blocked matmul, reductions), always available; `cuda` (with
//!   the `cuda` feature) compiles kernels with NVRTC and times them with CUDA events, after
//!   checking that the driver and NVRTC libraries exist.
//!
//! This is the only crate of tunecache that may depend on cudarc.
#![deny(missing_docs)]

mod bucket;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod fleet;
mod measure;
mod operation;
pub mod predict;
mod tuner;

pub use bucket::{Bucketing, Rule};
pub use cache_core::cache_format::CandidateId;
pub use measure::MeasureConfig;
pub use operation::{OpError, Operation};
pub use tuner::{
    Choice, Consistency, DEFAULT_VOLATILE_SCOPE_FIELDS, KeyStability, MissPolicy, OpConfig,
    Progress, RemotePolicy, StabilityReport, SyncReport, TuneError, TuneStats, Tuned, Tuner,
};
