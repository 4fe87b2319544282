//! Integration tests of the importers and the vLLM exporter.

mod autoheuristic;
mod formats;
mod support;
mod triton;
mod vllm;
mod xla;
