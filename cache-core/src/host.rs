//! Who this process is, for the origin of what it measures and the holder of its leases: the
//! machine's name (read once: a process keeps its host across a fork) and its pid. The one
//! place a crate of tunecache reads the host name; cache-format, which does no I/O, is given
//! it ([`cache_format::Origin::measured_by`]).

use cache_format::{Candidate, Entry, Fingerprint, Key, Origin, now_millis};

/// The most characters of the host name kept.
const MAX_HOST: usize = 64;

/// This machine's name: `/proc/sys/kernel/hostname`, else `HOSTNAME`, else `unknown-host`;
/// only printable ASCII kept (no spaces or control characters reach a file or a message), at
/// most 64 characters.
pub fn host_name() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        let read = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| {
                let settings = crate::settings::Settings::from_env();
                settings.get("HOSTNAME").map(str::to_owned)
            })
            .unwrap_or_default();
        clean_host(&read)
    })
}

/// `raw` as a host name: printable ASCII only, at most [`MAX_HOST`] characters;
/// `unknown-host` if nothing is left.
fn clean_host(raw: &str) -> String {
    let host: String = raw
        .trim()
        .chars()
        .filter(char::is_ascii_graphic)
        .take(MAX_HOST)
        .collect();
    if host.is_empty() {
        "unknown-host".to_owned()
    } else {
        host
    }
}

/// The origin of what the running process measures: `measured on <host> by pid <pid>`.
/// Made once per thread (a record costs a copy of it, not a format), and again in a forked
/// child, whose pid differs. Per thread rather than behind a lock: a child forked while
/// another thread held a lock would find it held for good.
pub fn measured_here() -> Origin {
    thread_local! {
        static HERE: std::cell::RefCell<Option<(u32, Origin)>> = const { std::cell::RefCell::new(None) };
    }
    let pid = std::process::id();
    HERE.with_borrow_mut(|here| match here {
        Some((made_by, origin)) if *made_by == pid => origin.clone(),
        _ => {
            let origin = Origin::measured_by(host_name(), pid);
            *here = Some((pid, origin.clone()));
            origin
        }
    })
}

/// An entry of `candidates` measured here, now, for `key`: this process as its origin, and no
/// candidate-set checksum (a tuner that knows its whole candidate set records one with
/// [`Entry::new`]). What recording one result from Rust takes:
/// `cache.put(ns, measured_entry(key, [Candidate::measured("tiled", params, stats)]))`.
pub fn measured_entry(key: Key, candidates: impl IntoIterator<Item = Candidate>) -> Entry {
    Entry::new(
        key,
        Fingerprint::default(),
        measured_here(),
        now_millis(),
        candidates,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_name_keeps_printable_ascii_only_and_is_bounded() {
        assert_eq!(clean_host("gpu-node-7\n"), "gpu-node-7");
        assert_eq!(clean_host("a b\u{1b}[31mc\u{e9}"), "ab[31mc");
        assert_eq!(clean_host(&"x".repeat(500)).len(), MAX_HOST);
        assert_eq!(clean_host(" \n"), "unknown-host");
        let Origin::Measured(text) = measured_here() else {
            panic!("measured");
        };
        assert!(
            text.ends_with(&format!(" pid {}", std::process::id())),
            "{text}"
        );
    }
}
