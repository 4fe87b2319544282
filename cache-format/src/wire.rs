//! The on-disk shapes of format version 1 (private: the domain model in `model` is public).
//!
//! Everything is a msgpack map with named fields (FORMAT.md, "Payload"), so fields can be
//! added and reordered without breaking readers. Serialization borrows from the model;
//! deserialization builds owned values and checks every rule the model relies on.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::candidate::{Candidate, CandidateId, Outcome, Stats};
use crate::error::FormatError;
use crate::fingerprint::Fingerprint;
use crate::model::{CacheData, Entry, Key, Origin, Scope};
use crate::value::Fields;

/// A fingerprint as msgpack `bin 8` of 16 bytes.
#[derive(Clone, Copy)]
pub(crate) struct Fp(pub(crate) Fingerprint);

impl Serialize for Fp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0.0)
    }
}

impl<'de> Deserialize<'de> for Fp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct FpVisitor;
        impl<'de> Visitor<'de> for FpVisitor {
            type Value = Fp;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("16 bytes of fingerprint")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Fp, E> {
                let bytes: [u8; 16] = v.try_into().map_err(|_| {
                    E::custom(format_args!("a fingerprint has 16 bytes, not {}", v.len()))
                })?;
                Ok(Fp(Fingerprint(bytes)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Fp, A::Error> {
                let mut bytes = [0u8; 16];
                for (i, b) in bytes.iter_mut().enumerate() {
                    *b = seq
                        .next_element()?
                        .ok_or_else(|| de::Error::invalid_length(i, &self))?;
                }
                if seq.next_element::<u8>()?.is_some() {
                    return Err(de::Error::invalid_length(17, &self));
                }
                Ok(Fp(Fingerprint(bytes)))
            }
        }
        d.deserialize_bytes(FpVisitor)
    }
}

/// The envelope header of format 1.
#[derive(Serialize, Deserialize)]
pub(crate) struct HeaderV1 {
    pub(crate) app: String,
    pub(crate) schema: u32,
    pub(crate) generation: u64,
    pub(crate) entries: u64,
    pub(crate) scopes: u64,
}

/// The journal header of format 1.
#[derive(Serialize, Deserialize)]
pub(crate) struct JournalHeaderV1 {
    pub(crate) app: String,
    pub(crate) schema: u32,
    pub(crate) base: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) nonce: Option<u64>,
}

// ---- serialization (borrowing) ----

#[derive(Serialize)]
struct PayloadOut<'a> {
    scopes: Vec<ScopeOut<'a>>,
}

#[derive(Serialize)]
struct ScopeOut<'a> {
    scope: &'a Fields,
    namespaces: BTreeMap<&'a str, Vec<EntryOut<'a>>>,
}

#[derive(Serialize)]
struct EntryOut<'a> {
    fp: Fp,
    key: &'a Fields,
    candidate_set: Fp,
    recorded_at: u64,
    origin: OriginOut<'a>,
    candidates: Vec<CandidateOut<'a>>,
}

#[derive(Serialize)]
struct OriginOut<'a> {
    kind: &'a str,
    from: &'a str,
}

#[derive(Serialize)]
struct CandidateOut<'a> {
    algo: &'a str,
    params: &'a Fields,
    measured_at: u64,
    status: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    median_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spread_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    samples: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    chosen_by: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tuning_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<&'a Fields>,
}

fn entry_out(entry: &Entry) -> EntryOut<'_> {
    EntryOut {
        fp: Fp(entry.fingerprint()),
        key: entry.key().fields(),
        candidate_set: Fp(entry.candidate_set()),
        recorded_at: entry.recorded_at(),
        origin: OriginOut {
            kind: entry.origin().kind(),
            from: entry.origin().detail(),
        },
        candidates: entry
            .candidates()
            .iter()
            .map(|c| candidate_out(c))
            .collect(),
    }
}

fn candidate_out(c: &Candidate) -> CandidateOut<'_> {
    let (status, stats, error, chosen_by) = match &c.outcome {
        Outcome::Measured(s) => ("ok", Some(s), None, None),
        Outcome::Failed(reason) => ("failed", None, Some(reason.as_str()), None),
        Outcome::Chosen(by) => ("chosen", None, None, Some(by.as_str())),
    };
    CandidateOut {
        algo: &c.id.algorithm,
        params: &c.id.params,
        measured_at: c.measured_at,
        status,
        median_ns: stats.map(|s| s.median_ns),
        min_ns: stats.map(|s| s.min_ns),
        spread_ns: stats.map(|s| s.spread_ns),
        samples: stats.map(|s| s.samples),
        error,
        chosen_by,
        tuning_ns: c.tuning_ns,
        policy: c.policy.as_ref(),
    }
}

/// Encodes the payload of `data` (format 2): scopes, namespaces and entries in a fixed
/// order, so the same contents always give the same bytes.
pub(crate) fn encode_payload(data: &CacheData) -> Vec<u8> {
    let payload = PayloadOut {
        scopes: data
            .scopes()
            .map(|(scope, sd)| ScopeOut {
                scope: scope.fields(),
                namespaces: sd
                    .namespaces
                    .iter()
                    .map(|(ns, entries)| (ns.as_str(), entries.values().map(entry_out).collect()))
                    .collect(),
            })
            .collect(),
    };
    rmp_serde::to_vec_named(&payload).expect("encoding to a Vec cannot fail")
}

/// Appends one entry's bytes as [`encode_payload`] writes it.
pub(crate) fn encode_entry_into(out: &mut Vec<u8>, entry: &Entry) {
    rmp_serde::encode::write_named(out, &entry_out(entry)).expect("encoding to a Vec cannot fail");
}

/// Encodes any serializable value as named msgpack.
pub(crate) fn to_named<T: Serialize>(value: &T) -> Vec<u8> {
    rmp_serde::to_vec_named(value).expect("encoding to a Vec cannot fail")
}

// ---- deserialization (owned, checked) ----

#[derive(Deserialize)]
struct PayloadIn<'a> {
    #[serde(borrow)]
    scopes: Vec<ScopeIn<'a>>,
}

#[derive(Deserialize)]
struct ScopeIn<'a> {
    scope: Fields,
    #[serde(borrow)]
    namespaces: BTreeMap<String, Vec<EntryIn<'a>>>,
}

#[derive(Deserialize)]
pub(crate) struct EntryIn<'a> {
    fp: Fp,
    key: Fields,
    candidate_set: Fp,
    recorded_at: u64,
    #[serde(borrow)]
    origin: OriginIn<'a>,
    #[serde(borrow)]
    candidates: Vec<CandidateIn<'a>>,
}

#[derive(Deserialize)]
struct OriginIn<'a> {
    kind: &'a str,
    from: String,
}

#[derive(Deserialize)]
struct CandidateIn<'a> {
    algo: String,
    params: Fields,
    measured_at: u64,
    status: &'a str,
    #[serde(default)]
    median_ns: Option<f64>,
    #[serde(default)]
    min_ns: Option<f64>,
    #[serde(default)]
    spread_ns: Option<f64>,
    #[serde(default)]
    samples: Option<u32>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    chosen_by: Option<String>,
    #[serde(default)]
    tuning_ns: Option<u64>,
    #[serde(default)]
    policy: Option<Fields>,
}

/// Decodes a format 1 or 2 payload (already scanned and checksummed) into the model.
pub(crate) fn decode_payload(bytes: &[u8], what: &'static str) -> Result<CacheData, FormatError> {
    decode_payload_counted(bytes, what).map(|(data, _)| data)
}

/// Like [`decode_payload`], also counting the entries as stored (entries of one key stored
/// twice count twice, though the model merges them).
pub(crate) fn decode_payload_counted(
    bytes: &[u8],
    what: &'static str,
) -> Result<(CacheData, u64), FormatError> {
    let payload: PayloadIn<'_> =
        rmp_serde::from_slice(bytes).map_err(|e| FormatError::invalid(what, e))?;
    let mut data = CacheData::new();
    let mut stored = 0u64;
    for scope_in in payload.scopes {
        let scope = Scope::new(scope_in.scope);
        for (ns, entries) in scope_in.namespaces {
            if ns.is_empty() {
                return Err(FormatError::invalid(what, "empty namespace name"));
            }
            for entry_in in entries {
                let entry = entry_from_wire(entry_in, &ns, what)?;
                stored += 1;
                data.insert(&scope, &ns, entry);
            }
        }
    }
    Ok((data, stored))
}

pub(crate) fn entry_from_wire(
    e: EntryIn<'_>,
    ns: &str,
    what: &'static str,
) -> Result<Entry, FormatError> {
    let key = Key::new(e.key);
    if key.fingerprint() != e.fp.0 {
        return Err(FormatError::invalid(
            what,
            format_args!(
                "entry {key} in namespace {ns:?} is stored under fingerprint {} but its key \
                 fingerprints to {}",
                e.fp.0,
                key.fingerprint()
            ),
        ));
    }
    let origin = Origin::from_parts(e.origin.kind, e.origin.from).ok_or_else(|| {
        FormatError::invalid(
            what,
            format_args!("unknown origin kind {:?}", e.origin.kind),
        )
    })?;
    let candidates = e
        .candidates
        .into_iter()
        .map(|c| candidate_from_wire(c, what))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Entry::new(
        key,
        e.candidate_set.0,
        origin,
        e.recorded_at,
        candidates,
    ))
}

fn candidate_from_wire(c: CandidateIn<'_>, what: &'static str) -> Result<Candidate, FormatError> {
    let outcome = match c.status {
        "ok" => match (c.median_ns, c.min_ns, c.spread_ns, c.samples) {
            (Some(median_ns), Some(min_ns), Some(spread_ns), Some(samples))
                if median_ns.is_finite() && min_ns.is_finite() && spread_ns.is_finite() =>
            {
                Outcome::Measured(Stats {
                    median_ns,
                    min_ns,
                    spread_ns,
                    samples,
                })
            }
            _ => {
                return Err(FormatError::invalid(
                    what,
                    format_args!(
                        "candidate {:?} has status \"ok\" but lacks finite median_ns, min_ns, \
                         spread_ns or samples",
                        c.algo
                    ),
                ));
            }
        },
        "failed" => Outcome::Failed(c.error.unwrap_or_default()),
        "chosen" => Outcome::Chosen(c.chosen_by.unwrap_or_default()),
        other => {
            return Err(FormatError::invalid(
                what,
                format_args!("candidate {:?} has unknown status {other:?}", c.algo),
            ));
        }
    };
    Ok(Candidate {
        id: CandidateId::with_params(c.algo, c.params),
        outcome,
        measured_at: c.measured_at,
        tuning_ns: c.tuning_ns,
        policy: c.policy,
    })
}
