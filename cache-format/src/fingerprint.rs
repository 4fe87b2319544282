//! Fingerprints: 128-bit digests of canonical encodings, for keys, scopes and candidate sets.
//!
//! Every fingerprint is the first 16 bytes of SHA-256 over a domain tag followed by the
//! canonical msgpack encoding of a map (FORMAT.md, "Fingerprints"). SHA-256 is in the
//! standard library of nearly every language, so another implementation needs nothing
//! beyond a msgpack encoder to reproduce these bytes.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

use crate::value::{Fields, Value, encode_fields, encode_value, write_array_len};

/// Domain tag of key fingerprints.
pub const KEY_TAG: &[u8] = b"tunecache/key/1\0";
/// Domain tag of scope fingerprints.
pub(crate) const SCOPE_TAG: &[u8] = b"tunecache/scope/1\0";
/// Domain tag of candidate-set checksums.
pub(crate) const CANDIDATES_TAG: &[u8] = b"tunecache/candidates/1\0";

/// A 128-bit fingerprint, shown as 32 lower-case hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Fingerprint(pub [u8; 16]);

impl Fingerprint {
    /// The fingerprint of `canonical` bytes under a domain `tag`.
    pub fn digest(tag: &[u8], canonical: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(tag);
        hasher.update(canonical);
        let full = hasher.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&full[..16]);
        Fingerprint(out)
    }

    /// The fingerprint of a key's fields.
    pub fn of_key(fields: &Fields) -> Self {
        let mut buf = Vec::with_capacity(64);
        encode_fields(fields, &mut buf);
        Self::digest(KEY_TAG, &buf)
    }

    /// The fingerprint of a scope's fields.
    pub fn of_scope(fields: &Fields) -> Self {
        let mut buf = Vec::with_capacity(64);
        encode_fields(fields, &mut buf);
        Self::digest(SCOPE_TAG, &buf)
    }

    /// The checksum of a candidate set: order-independent, duplicates ignored.
    ///
    /// Each candidate is the map `{"algo": name, "params": params}`; the encodings are sorted
    /// bytewise and deduplicated, and the digest covers the map
    /// `{"candidates": [...], "salt": salt}`. Put in `salt` whatever else makes measurements
    /// comparable (a kernel-source hash, a measurement-policy version).
    pub fn of_candidate_set<'a, I>(candidates: I, salt: &Fields) -> Self
    where
        I: IntoIterator<Item = (&'a str, &'a Fields)>,
    {
        let mut encoded: Vec<Vec<u8>> = candidates
            .into_iter()
            .map(|(algo, params)| {
                let mut buf = Vec::new();
                encode_fields(&candidate_identity(algo, params), &mut buf);
                buf
            })
            .collect();
        encoded.sort_unstable();
        encoded.dedup();
        // Hand-assemble {"candidates": [...], "salt": {...}}: the identities are already
        // encoded, and "candidates" < "salt" bytewise.
        let mut buf = Vec::new();
        buf.push(0x82);
        encode_value(&Value::from("candidates"), &mut buf);
        write_array_len(&mut buf, encoded.len());
        for item in &encoded {
            buf.extend_from_slice(item);
        }
        encode_value(&Value::from("salt"), &mut buf);
        encode_fields(salt, &mut buf);
        Self::digest(CANDIDATES_TAG, &buf)
    }

    /// The 32-digit lower-case hex form.
    pub fn to_hex(&self) -> String {
        self.to_string()
    }

    /// The low 64 bits, for hashing into in-memory tables (the digest is already uniform).
    pub fn low_u64(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[8..]);
        u64::from_le_bytes(b)
    }
}

/// The identity of one candidate: the map `{"algo": name, "params": params}`.
pub(crate) fn candidate_identity(algo: &str, params: &Fields) -> Fields {
    Fields::from([
        ("algo".to_owned(), Value::from(algo)),
        ("params".to_owned(), Value::Map(params.clone())),
    ])
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// Why a string is not a fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a fingerprint: expected 32 hex digits")]
pub struct ParseFingerprintError(String);

impl FromStr for Fingerprint {
    type Err = ParseFingerprintError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseFingerprintError(s.chars().take(64).collect());
        if s.len() != 32 || !s.is_ascii() {
            return Err(err());
        }
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| err())?;
        }
        Ok(Fingerprint(out))
    }
}
