//! The CLI's text formats (times, durations, dates, short fingerprints) and the parsing of
//! JSON given on the command line.

use std::time::Duration;

use anyhow::{Context, bail};
use cache_core::Inspection;
use cache_format::{Entry, Fields, Fingerprint, Key, Scope, Value};

/// `812.000 µs`, `3.400 ms`, `12.700 s`: the CLI's one time format.
pub(crate) fn fmt_ns(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.3} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.3} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

/// A duration in the CLI's time format.
pub(crate) fn fmt_duration(d: Duration) -> String {
    fmt_ns(d.as_nanos() as f64)
}

/// `YYYY-MM-DD HH:MM:SSZ` for Unix milliseconds (UTC; proleptic Gregorian calendar).
pub(crate) fn fmt_time(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The first 8 hex digits of a fingerprint.
pub(crate) fn short(fp: Fingerprint) -> String {
    fp.to_hex()[..8].to_owned()
}

/// A JSON object given as `what` (e.g. `--key`), as canonical fields.
pub(crate) fn parse_fields(what: &str, text: &str) -> anyhow::Result<Fields> {
    match serde_json::from_str::<Value>(text)
        .with_context(|| format!("{what} {text:?} is not a usable JSON object"))?
    {
        Value::Map(fields) => Ok(fields),
        other => bail!("{what} must be a JSON object such as {{\"m\":128}}, got {other}"),
    }
}

/// An optional `--scope` filter.
pub(crate) fn scope_filter(scope: Option<&str>) -> anyhow::Result<Option<Scope>> {
    scope
        .map(|s| parse_fields("--scope", s).map(Scope::new))
        .transpose()
}

/// The entries recorded for `key` in `namespace`, in every scope or only `scope`.
pub(crate) fn entries_for(
    found: &Inspection,
    namespace: &str,
    key: &Key,
    scope: Option<&Scope>,
) -> Vec<(Scope, Entry)> {
    let (entries, unreadable) = found.find_checked(namespace, &key.fingerprint());
    for problem in unreadable {
        crate::output::say(problem);
    }
    entries
        .into_iter()
        .filter(|(s, _)| scope.is_none_or(|want| want == s))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamps_render_as_utc_dates() {
        assert_eq!(super::fmt_time(0), "1970-01-01 00:00:00Z");
        assert_eq!(super::fmt_time(951_782_400_000), "2000-02-29 00:00:00Z");
        assert_eq!(super::fmt_time(1_795_331_542_894), "2026-11-22 07:12:22Z");
    }
}
