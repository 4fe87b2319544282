//! Integration tests of the importers and the vLLM exporter.

mod support;
mod vllm;
