//! Integration tests of the importers and the vLLM exporter.

mod formats;
mod support;
mod triton;
mod vllm;
mod xla;
