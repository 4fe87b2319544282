//! The census of a format-1 payload: how many scopes, namespaces, candidates per entry and
//! fields per map it holds, counted from the msgpack headers alone (nothing is allocated), and
//! checked against [`Limits`] before any decoder builds the model. A payload within the caps
//! decodes into a model whose size is a small multiple of its bytes; one over them is refused
//! with the cap it broke.
//!
//! The walk follows the layout of FORMAT.md ("Payload"); anything else it meets is skipped
//! and left for the decoder to judge. It runs on scanned bytes only, so every length is backed.

use rmp::Marker;

use crate::error::FormatError;
use crate::scan::{Limits, scan_value};

/// Checks the caps of `limits` on a scanned format-1 payload.
pub(crate) fn check(bytes: &[u8], limits: &Limits) -> Result<(), FormatError> {
    let mut walk = Walk {
        bytes,
        pos: 0,
        limits,
        namespaces: 0,
    };
    walk.payload().map(|_| ())
}

/// Checks the caps that apply inside one scanned entry (its candidates, and the fields of its
/// key and params) as [`check`] does for each entry of a payload.
pub(crate) fn check_entry(bytes: &[u8], limits: &Limits) -> Result<(), FormatError> {
    let mut walk = Walk {
        bytes,
        pos: 0,
        limits,
        namespaces: 0,
    };
    walk.entry().map(|_| ())
}

/// `None`: the shape is not the one expected; the walk stops and the decoder reports it.
type Step = Result<Option<()>, FormatError>;

struct Walk<'a> {
    bytes: &'a [u8],
    pos: usize,
    limits: &'a Limits,
    namespaces: u64,
}

impl Walk<'_> {
    fn payload(&mut self) -> Step {
        self.record(&["scopes"], |w, name| match name {
            "scopes" => w.scopes(),
            _ => w.skip(),
        })
    }

    fn scopes(&mut self) -> Step {
        let Some(n) = self.array_len() else {
            return Ok(None);
        };
        cap("scopes", n, self.limits.max_scopes)?;
        for _ in 0..n {
            if self
                .record(&["scope", "namespaces"], |w, name| match name {
                    "scope" => w.fields("fields of a scope"),
                    "namespaces" => w.namespaces(),
                    _ => w.skip(),
                })?
                .is_none()
            {
                return Ok(None);
            }
        }
        Ok(Some(()))
    }

    fn namespaces(&mut self) -> Step {
        let Some(n) = self.map_len() else {
            return Ok(None);
        };
        self.namespaces += n;
        cap("namespaces", self.namespaces, self.limits.max_namespaces)?;
        for _ in 0..n {
            if self.skip()?.is_none() {
                return Ok(None); // the name
            }
            let Some(entries) = self.array_len() else {
                return Ok(None);
            };
            for _ in 0..entries {
                if self.entry()?.is_none() {
                    return Ok(None);
                }
            }
        }
        Ok(Some(()))
    }

    fn entry(&mut self) -> Step {
        const FIELDS: [&str; 6] = [
            "fp",
            "key",
            "candidate_set",
            "recorded_at",
            "origin",
            "candidates",
        ];
        self.record(&FIELDS, |w, name| match name {
            "key" => w.fields("fields of a key"),
            "candidates" => w.candidates(),
            _ => w.skip(),
        })
    }

    fn candidates(&mut self) -> Step {
        let Some(n) = self.array_len() else {
            return Ok(None);
        };
        cap("candidates of an entry", n, self.limits.max_candidates)?;
        for _ in 0..n {
            if self
                .record(&["algo", "params"], |w, name| match name {
                    "params" => w.fields("fields of params"),
                    _ => w.skip(),
                })?
                .is_none()
            {
                return Ok(None);
            }
        }
        Ok(Some(()))
    }

    /// A map of fields: its size is checked, its contents skipped.
    fn fields(&mut self, what: &'static str) -> Step {
        let start = self.pos;
        let Some(n) = self.map_len() else {
            return Ok(None);
        };
        cap(what, n, self.limits.max_fields)?;
        self.pos = start;
        self.skip()
    }

    /// Walks a struct, written as a map (by field name) or as an array (by position, which
    /// the decoder accepts too), calling `value` with each field's name, positioned at its
    /// value, which it must consume. Fields it does not know are named "".
    fn record(
        &mut self,
        positional: &[&'static str],
        mut value: impl FnMut(&mut Self, &str) -> Step,
    ) -> Step {
        let start = self.pos;
        if let Some(n) = self.map_len() {
            for _ in 0..n {
                let Some(name) = self.name() else {
                    return Ok(None);
                };
                if value(self, name)?.is_none() {
                    return Ok(None);
                }
            }
            return Ok(Some(()));
        }
        self.pos = start;
        let Some(n) = self.array_len() else {
            return Ok(None);
        };
        for i in 0..n {
            let name = usize::try_from(i)
                .ok()
                .and_then(|i| positional.get(i))
                .copied()
                .unwrap_or("");
            if value(self, name)?.is_none() {
                return Ok(None);
            }
        }
        Ok(Some(()))
    }

    fn skip(&mut self) -> Step {
        match scan_value(self.bytes, self.pos, "payload", u32::MAX) {
            Ok(end) => {
                self.pos = end;
                Ok(Some(()))
            }
            Err(_) => Ok(None),
        }
    }

    fn map_len(&mut self) -> Option<u64> {
        let mut rd = &self.bytes[self.pos..];
        let n = rmp::decode::read_map_len(&mut rd).ok()?;
        self.pos = self.bytes.len() - rd.len();
        Some(u64::from(n))
    }

    fn array_len(&mut self) -> Option<u64> {
        let mut rd = &self.bytes[self.pos..];
        let n = rmp::decode::read_array_len(&mut rd).ok()?;
        self.pos = self.bytes.len() - rd.len();
        Some(u64::from(n))
    }

    /// Consumes a map key and names it: a field of the format, or "" for anything else (a
    /// key of another type or name is skipped with its value).
    fn name(&mut self) -> Option<&'static str> {
        let start = self.pos;
        let header = match rmp::decode::read_marker(&mut self.rest()).ok()? {
            Marker::FixStr(_) => 1,
            Marker::Str8 => 2,
            Marker::Str16 => 3,
            Marker::Str32 => 5,
            _ => 0,
        };
        self.skip().ok()??;
        if header == 0 {
            return Some("");
        }
        let text = self.bytes.get(start + header..self.pos)?;
        Some(match text {
            b"scopes" => "scopes",
            b"scope" => "scope",
            b"namespaces" => "namespaces",
            b"key" => "key",
            b"candidates" => "candidates",
            b"params" => "params",
            _ => "",
        })
    }

    fn rest(&self) -> &[u8] {
        &self.bytes[self.pos..]
    }
}

fn cap(what: &'static str, count: u64, limit: u64) -> Result<(), FormatError> {
    if count > limit {
        Err(FormatError::TooMany { what, count, limit })
    } else {
        Ok(())
    }
}
