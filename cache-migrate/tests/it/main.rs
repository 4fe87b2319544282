//! Integration tests of cache-migrate: one binary, a module per concern.

mod chain;
mod declarative;
mod properties;
mod support;
mod typed;
