//! Integration tests of gpu-tuner: one binary, a module per concern.

#[cfg(feature = "cuda")]
mod cuda;
