//! Time as the format stores it.

/// Milliseconds since the Unix epoch.
pub type Millis = u64;

/// The current time in [`Millis`] (0 if the clock is before 1970).
pub fn now_millis() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
