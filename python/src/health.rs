//! A cache's health as plain Python data (no Debug strings): what `Cache.health()` returns.

use cache_core::{Cache, Mode};
use cache_remote::RemoteCache as _;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// A mode as Python sees it.
pub(crate) fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Persistent => "persistent",
        Mode::ReadOnly => "read-only",
        Mode::Memory => "memory",
    }
}

/// `Cache.health()`.
pub(crate) fn health<'py>(py: Python<'py>, cache: &Cache) -> PyResult<Bound<'py, PyDict>> {
    let h = cache.health();
    let d = PyDict::new(py);
    d.set_item("mode", mode_name(h.mode))?;
    d.set_item("path", h.path)?;
    d.set_item("reason", h.reason)?;
    d.set_item("last_error", h.last_error)?;
    d.set_item("quarantined", h.quarantined)?;
    d.set_item("pending", h.pending)?;
    d.set_item(
        "migration",
        h.migration.map(|r| {
            r.steps
                .iter()
                .flat_map(|s| s.lines())
                .collect::<Vec<String>>()
        }),
    )?;
    let tiers = PyList::empty(py);
    for t in &h.tiers {
        let tier = PyDict::new(py);
        tier.set_item("name", t.name)?;
        tier.set_item("describe", &t.describe)?;
        tier.set_item("available", t.available)?;
        tier.set_item("counters", t.counters.clone())?;
        tier.set_item("state", t.state.clone())?;
        tiers.append(tier)?;
    }
    d.set_item("tiers", tiers)?;
    d.set_item(
        "remote",
        cache
            .remote_health()
            .map(|r| remote_dict(py, &r))
            .transpose()?,
    )?;
    Ok(d)
}

/// The shared tier's counters as a dict of plain values.
pub(crate) fn remote_dict<'py>(
    py: Python<'py>,
    r: &cache_remote::RemoteHealth,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("describe", &r.describe)?;
    d.set_item("mode", r.mode.to_string())?;
    for (name, n) in [
        ("hits", r.hits),
        ("misses", r.misses),
        ("timeouts", r.timeouts),
        ("errors", r.errors),
        ("skipped", r.skipped),
        ("published", r.published),
        ("unchanged", r.unchanged),
        ("conflicts", r.conflicts),
    ] {
        d.set_item(name, n)?;
    }
    d.set_item("pending", r.pending)?;
    d.set_item("rejected", r.rejected.clone())?;
    let failures = match r.breaker {
        cache_remote::BreakerState::Closed => 0,
        cache_remote::BreakerState::Open { failures } => failures,
    };
    d.set_item("breaker_open", failures > 0)?;
    d.set_item("failures", failures)?;
    d.set_item("full", r.full)?;
    Ok(d)
}
