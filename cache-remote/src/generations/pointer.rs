//! The pointer object `PREFIX/generations/current` (FORMAT.md, "Generations"): a JSON object
//! `{"generation": "<id>", "published_at": <Unix ms>, "recent": [["<id>", <Unix ms>], ...]}`.
//! `recent` lists the generations the pointer named lately (the newest first, at most
//! [`RECENT`]), so a prune running while a snapshot moves the pointer keeps what it moved to.
//! Read as JSON: any spacing, fields in any order, unknown fields ignored; an older pointer
//! without `recent` is read too.

use serde::{Deserialize, Serialize};

/// How many generations a pointer remembers having named.
pub(crate) const RECENT: usize = 16;

/// The largest pointer read (FORMAT.md, "Shared tier").
pub(crate) const MAX_BYTES: usize = 4 << 10;

/// A pointer, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Pointer {
    pub(crate) generation: String,
    #[serde(default)]
    pub(crate) published_at: u64,
    #[serde(default)]
    pub(crate) recent: Vec<(String, u64)>,
}

/// Why a pointer's bytes are not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unreadable {
    /// Not a JSON object with a `generation` string.
    NotAPointer(String),
    /// `generation` is not 64 lower-case hex digits.
    NotAnId(String),
}

impl Pointer {
    /// The pointer in `bytes` (at most [`MAX_BYTES`]: a reader asks for one byte more).
    pub(crate) fn parse(bytes: &[u8]) -> Result<Pointer, Unreadable> {
        if bytes.len() > MAX_BYTES {
            return Err(Unreadable::NotAPointer(format!(
                "over {MAX_BYTES} bytes (a pointer is well under a kilobyte)"
            )));
        }
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| Unreadable::NotAPointer(e.to_string()))?;
        // Only an object: serde would also take the fields as a JSON array, in order.
        if !value.is_object() {
            return Err(Unreadable::NotAPointer("not a JSON object".to_owned()));
        }
        let p: Pointer =
            serde_json::from_value(value).map_err(|e| Unreadable::NotAPointer(e.to_string()))?;
        if !super::is_id(&p.generation) {
            let shown: String = p
                .generation
                .chars()
                .take(80)
                .flat_map(char::escape_default)
                .collect();
            return Err(Unreadable::NotAnId(shown));
        }
        Ok(p)
    }

    /// The pointer after `self` (if any) that names `id` from `now_ms`: `id` first in
    /// `recent`, the rest kept newest first, at most [`RECENT`]; only well-formed ids kept.
    pub(crate) fn next(before: Option<&Pointer>, id: &str, now_ms: u64) -> Pointer {
        let mut recent = vec![(id.to_owned(), now_ms)];
        if let Some(b) = before {
            let older = std::iter::once((b.generation.clone(), b.published_at))
                .chain(b.recent.iter().cloned());
            for (g, at) in older {
                if recent.len() >= RECENT {
                    break;
                }
                if super::is_id(&g) && !recent.iter().any(|(r, _)| *r == g) {
                    recent.push((g, at));
                }
            }
        }
        Pointer {
            generation: id.to_owned(),
            published_at: now_ms,
            recent,
        }
    }

    /// Its bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a pointer encodes")
    }

    /// Whether `id` is what the pointer names, or named within `keep_ms` of `now_ms`.
    pub(crate) fn keeps(&self, id: &str, now_ms: u64, keep_ms: u64) -> bool {
        self.generation == id
            || self
                .recent
                .iter()
                .any(|(g, at)| g == id && now_ms.saturating_sub(*at) <= keep_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(c: char) -> String {
        std::iter::repeat_n(c, 64).collect()
    }

    #[test]
    fn a_pointer_is_json_in_any_spacing_and_a_bad_id_is_said_as_such() {
        let a = id('a');
        for text in [
            format!("{{\"generation\":\"{a}\",\"published_at\":1}}"),
            format!("{{ \"generation\": \"{a}\" , \"published_at\" : 1, \"other\": [1] }}"),
            format!("{{\"published_at\":1,\"generation\":\"{a}\"}}"),
        ] {
            assert_eq!(
                Pointer::parse(text.as_bytes()).map(|p| p.generation),
                Ok(a.clone()),
                "{text}"
            );
        }
        assert!(matches!(
            Pointer::parse(b"{\"generation\":\"../etc/passwd\"}"),
            Err(Unreadable::NotAnId(_))
        ));
        assert!(matches!(
            Pointer::parse(b"\xff"),
            Err(Unreadable::NotAPointer(_))
        ));
        assert!(matches!(
            Pointer::parse(b"{}"),
            Err(Unreadable::NotAPointer(_))
        ));
    }

    #[test]
    fn a_pointer_remembers_what_it_named_lately() {
        let (a, b, c) = (id('a'), id('b'), id('c'));
        let p1 = Pointer::next(None, &a, 1_000);
        let p2 = Pointer::next(Some(&p1), &b, 2_000);
        let p3 = Pointer::next(Some(&p2), &a, 3_000);
        assert_eq!(p3.generation, a);
        assert_eq!(p3.recent, vec![(a.clone(), 3_000), (b.clone(), 2_000)]);
        assert!(p3.keeps(&b, 3_000, 600_000), "named a second ago");
        assert!(!p3.keeps(&b, 2_000 + 600_001, 600_000), "named long ago");
        assert!(!p3.keeps(&c, 3_000, 600_000));
        let back = Pointer::parse(&p3.encode()).expect("round trip");
        assert_eq!(back, p3);
        let mut p = p1;
        for i in 0..40u64 {
            p = Pointer::next(Some(&p), &format!("{:064x}", i), 10_000 + i);
        }
        assert_eq!(p.recent.len(), RECENT);
    }

    /// The format's pointer vectors (`cache-format/tests/data/vectors/trust/cases.json`,
    /// `pointers`): each file read as a correct reader must, and the pointer as written
    /// (`pointer.json`) written again byte for byte.
    #[test]
    fn the_format_vectors_pointers_read_as_committed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../cache-format/tests/data/vectors/trust");
        let cases: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.join("cases.json")).expect("the committed vectors"),
        )
        .expect("JSON");
        let pointers = cases["pointers"].as_array().expect("pointer cases");
        assert!(pointers.len() >= 7);
        for case in pointers {
            let file = case["file"].as_str().expect("a file");
            let bytes = std::fs::read(dir.join(file)).expect("committed");
            let mut want = case["want"].clone();
            if let Some(w) = want.as_object_mut() {
                w.remove("names_the_bundle");
            }
            let got = match Pointer::parse(&bytes) {
                Ok(p) => {
                    if file == "pointer.json" {
                        assert_eq!(p.encode(), bytes, "the pointer as written");
                    }
                    serde_json::to_value(&p).expect("encodes")
                }
                Err(Unreadable::NotAPointer(_)) => {
                    serde_json::json!({"unreadable": "not-a-pointer"})
                }
                Err(Unreadable::NotAnId(_)) => serde_json::json!({"unreadable": "not-an-id"}),
            };
            assert_eq!(got, want, "{}", case["name"]);
        }
    }
}
