//! Integration tests of gpu-tuner: one binary, a module per concern. Cross-process tests run
//! this binary again in a child role (see `children`).
#![allow(clippy::print_stdout, reason = "child processes report on stdout")]

mod children;
mod consistency;
#[cfg(feature = "cuda")]
mod cuda;
mod examples;
mod fleet;
mod loose;
mod new_device;
mod policy;
mod predict;
mod processes;
mod shared;
mod stability;
mod support;
mod tuner;
