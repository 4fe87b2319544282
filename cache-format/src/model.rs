//! The public domain model: keys, scopes, entries with ranked candidates, and the contents
//! of a cache file. These types are independent of the bytes on disk (see `wire`).

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::candidate::{Candidate, CandidateId, rank_indices};
use crate::fingerprint::Fingerprint;
use crate::ser::{ValueError, to_fields};
use crate::value::{Fields, write_fields};

macro_rules! fingerprinted_record {
    ($(#[$doc:meta])* $name:ident, $fp:path) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name {
            fingerprint: Fingerprint,
            fields: Fields,
        }

        impl $name {
            /// Builds it from canonical fields, computing the fingerprint once.
            pub fn new(fields: Fields) -> Self {
                let fingerprint = $fp(&fields);
                Self { fingerprint, fields }
            }

            /// Builds it from any `Serialize` struct or map (see [`crate::to_fields`]).
            pub fn from_serialize<T: Serialize + ?Sized>(value: &T) -> Result<Self, ValueError> {
                to_fields(value).map(Self::new)
            }

            /// Its fields, ordered by name.
            pub fn fields(&self) -> &Fields {
                &self.fields
            }

            /// Its fingerprint (FORMAT.md, "Fingerprints").
            pub fn fingerprint(&self) -> Fingerprint {
                self.fingerprint
            }

            /// Gives back the fields.
            pub fn into_fields(self) -> Fields {
                self.fields
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({self})", stringify!($name))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write_fields(f, &self.fields)
            }
        }
    };
}

fingerprinted_record!(
    /// The problem signature of one lookup: shapes, dtypes, layouts, flags.
    Key,
    Fingerprint::of_key
);

fingerprinted_record!(
    /// The environment a measurement is valid for: device, toolkit, library, policy.
    ///
    /// One file may hold many scopes; a store looks up entries of its current scope only.
    Scope,
    Fingerprint::of_scope
);

impl Default for Scope {
    fn default() -> Self {
        Scope::new(Fields::new())
    }
}

/// Milliseconds since the Unix epoch.
pub type Millis = u64;

/// The current time in [`Millis`] (0 if the clock is before 1970).
pub fn now_millis() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Where an entry came from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Origin {
    /// Measured by a process on this or another machine; the text says which (host, pid).
    Measured(String),
    /// Imported from a file or bundle; the text names it.
    Imported(String),
    /// Fetched from a shared (remote) tier; the text names it.
    Remote(String),
}

impl Origin {
    /// Measured by process `pid` on `host` (`<host> pid <pid>`). The crate does no I/O: the
    /// caller knows its host (cache-core's `measured_here`).
    pub fn measured_by(host: &str, pid: u32) -> Self {
        Origin::Measured(format!("{host} pid {pid}"))
    }

    /// The kind as written in files: `measured`, `imported` or `remote`.
    pub fn kind(&self) -> &'static str {
        match self {
            Origin::Measured(_) => "measured",
            Origin::Imported(_) => "imported",
            Origin::Remote(_) => "remote",
        }
    }

    /// The free-form detail.
    pub fn detail(&self) -> &str {
        match self {
            Origin::Measured(s) | Origin::Imported(s) | Origin::Remote(s) => s,
        }
    }

    /// Rebuilds an origin from its kind and detail.
    pub fn from_parts(kind: &str, detail: String) -> Option<Self> {
        match kind {
            "measured" => Some(Origin::Measured(detail)),
            "imported" => Some(Origin::Imported(detail)),
            "remote" => Some(Origin::Remote(detail)),
            _ => None,
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.kind(), self.detail())
    }
}

/// The ranked candidates for one key, best first, with where and when they were measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    key: Key,
    /// Shared, not copied, by the entries a merge makes: a store that merges one new
    /// measurement into an entry of many candidates copies one candidate, not all of them.
    candidates: Vec<Arc<Candidate>>,
    candidate_set: Fingerprint,
    recorded_at: Millis,
    origin: Origin,
}

impl Entry {
    /// An entry with the given candidates (ranked here; duplicates keep the later
    /// measurement).
    pub fn new(
        key: Key,
        candidate_set: Fingerprint,
        origin: Origin,
        recorded_at: Millis,
        candidates: impl IntoIterator<Item = Candidate>,
    ) -> Self {
        let mut entry = Entry {
            key,
            candidates: Vec::new(),
            candidate_set,
            recorded_at,
            origin,
        };
        entry.absorb_all(candidates.into_iter().map(Arc::new));
        entry.rank();
        entry
    }

    /// The key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The key's fingerprint.
    pub fn fingerprint(&self) -> Fingerprint {
        self.key.fingerprint()
    }

    /// The candidates, best first.
    pub fn candidates(&self) -> &[Arc<Candidate>] {
        &self.candidates
    }

    /// The winner: the best measured candidate, else the latest one another tool chose
    /// ([`crate::Outcome::Chosen`]); `None` when every candidate failed.
    pub fn best(&self) -> Option<&Candidate> {
        self.candidates.first().map(|c| &**c).filter(|c| c.usable())
    }

    /// The checksum of the candidate set that the latest tuning run measured against.
    pub fn candidate_set(&self) -> Fingerprint {
        self.candidate_set
    }

    /// When the entry was last recorded.
    pub fn recorded_at(&self) -> Millis {
        self.recorded_at
    }

    /// Where it came from.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// Takes the entry apart: key, candidate-set checksum, origin, when recorded, and the
    /// candidates (best first). [`Entry::new`] puts one back together.
    pub fn into_parts(self) -> (Key, Fingerprint, Origin, Millis, Vec<Candidate>) {
        (
            self.key,
            self.candidate_set,
            self.origin,
            self.recorded_at,
            self.candidates
                .into_iter()
                .map(Arc::unwrap_or_clone)
                .collect(),
        )
    }

    /// Replaces the origin (e.g. when importing).
    pub fn set_origin(&mut self, origin: Origin) {
        self.origin = origin;
    }

    /// Sets every timestamp later than `latest` (the entry's and its candidates') to `latest`;
    /// returns by how much the furthest one was ahead (0: none was). A clock set in the future
    /// must not pin a measurement for good: the merge keeps the later one, and nothing measured
    /// afterwards would be later.
    pub fn clamp_future(&mut self, latest: Millis) -> Millis {
        let mut ahead = 0;
        let mut clamp = |t: &mut Millis| {
            if *t > latest {
                ahead = ahead.max(*t - latest);
                *t = latest;
            }
        };
        clamp(&mut self.recorded_at);
        for c in &mut self.candidates {
            if c.measured_at > latest {
                clamp(&mut Arc::make_mut(c).measured_at);
            }
        }
        ahead
    }

    /// Adds or replaces one candidate's measurement and re-ranks.
    pub fn record(&mut self, candidate: Candidate) {
        self.absorb_all([Arc::new(candidate)]);
        self.rank();
    }

    /// Unites `incoming` with the candidates by identity (a candidate measured twice keeps
    /// the later measurement). Linear in the number of candidates: past a handful, matching
    /// goes through a hash index instead of a scan, so a hostile entry of N candidates costs
    /// O(N), not O(N²).
    fn absorb_all(&mut self, incoming: impl IntoIterator<Item = Arc<Candidate>>) {
        const SCAN_UP_TO: usize = 16;
        let mut index: Option<HashMap<CandidateId, usize>> = None;
        let incoming = incoming.into_iter();
        if self.candidates.is_empty() {
            // A new entry: one allocation of the right size (bounded, in case the hint lies).
            self.candidates
                .reserve_exact(incoming.size_hint().0.min(1 << 16));
        }
        for candidate in incoming {
            if index.is_none() && self.candidates.len() >= SCAN_UP_TO {
                index = Some(
                    self.candidates
                        .iter()
                        .enumerate()
                        .map(|(i, c)| (c.id.clone(), i))
                        .collect(),
                );
            }
            let found = match &index {
                Some(index) => {
                    #[cfg(test)]
                    probes::add(1);
                    index.get(&candidate.id).copied()
                }
                None => {
                    #[cfg(test)]
                    probes::add(self.candidates.len() as u64);
                    self.candidates.iter().position(|c| c.id == candidate.id)
                }
            };
            match found {
                Some(i) => {
                    if candidate.version_cmp(&self.candidates[i]) == Ordering::Greater {
                        self.candidates[i] = candidate;
                    }
                }
                None => {
                    if let Some(index) = &mut index {
                        index.insert(candidate.id.clone(), self.candidates.len());
                    }
                    self.candidates.push(candidate);
                }
            }
        }
    }

    fn rank(&mut self) {
        if self.candidates.len() < 2 {
            return;
        }
        let order: Vec<usize> = rank_indices(&self.candidates);
        if order.iter().enumerate().all(|(at, i)| at == *i) {
            // Already in rank order (an entry read back from a file always is).
            return;
        }
        let mut slots: Vec<Option<Arc<Candidate>>> = std::mem::take(&mut self.candidates)
            .into_iter()
            .map(Some)
            .collect();
        self.candidates = order
            .into_iter()
            .map(|i| slots[i].take().expect("rank_indices is a permutation"))
            .collect();
    }

    fn header_cmp(&self, other: &Entry) -> Ordering {
        self.recorded_at
            .cmp(&other.recorded_at)
            .then_with(|| self.candidate_set.cmp(&other.candidate_set))
            .then_with(|| self.origin.cmp(&other.origin))
    }

    /// Merges another entry for the same key into this one.
    ///
    /// This is the one merge rule used everywhere (memory, journal replay, merge-on-save,
    /// import): candidates are united by identity, a candidate measured twice keeps the later
    /// measurement, and the entry's candidate-set checksum, timestamp and origin come from
    /// the later entry. Ties are broken by comparing every field, so the result does not
    /// depend on the order merges happen in (it is commutative, associative and idempotent).
    pub fn merge(&mut self, other: Entry) {
        debug_assert_eq!(self.key, other.key, "merging entries of different keys");
        if other.header_cmp(self) == Ordering::Greater {
            self.candidate_set = other.candidate_set;
            self.recorded_at = other.recorded_at;
            self.origin = other.origin;
        }
        self.absorb_all(other.candidates);
        self.rank();
    }

    /// Whether this entry already holds everything of `other`: merging `other` into it
    /// changes nothing (what a writer checks before writing `other` again).
    pub fn covers(&self, other: &Entry) -> bool {
        let mut merged = self.clone();
        merged.merge_from(other);
        merged == *self
    }

    /// [`Entry::merge`] of a borrowed entry: the same result as `self.merge(other.clone())`,
    /// copying only what of `other` wins (its header when later, the candidates this entry
    /// lacks or measured earlier). Merging an update into the entry a store holds this way
    /// round copies nothing when the update is the later measurement of every candidate.
    pub fn merge_from(&mut self, other: &Entry) {
        debug_assert_eq!(self.key, other.key, "merging entries of different keys");
        if other.header_cmp(self) == Ordering::Greater {
            self.candidate_set = other.candidate_set;
            self.recorded_at = other.recorded_at;
            self.origin = other.origin.clone();
        }
        let wins = |c: &Candidate, mine: Option<&Candidate>| {
            mine.is_none_or(|m| c.version_cmp(m) == Ordering::Greater)
        };
        // Past a handful, matching goes through an index, as in `absorb_all`.
        let winners: Vec<Arc<Candidate>> = if self.candidates.len() < 16 {
            other
                .candidates
                .iter()
                .filter(|c| {
                    wins(
                        c,
                        self.candidates.iter().find(|m| m.id == c.id).map(|m| &**m),
                    )
                })
                .cloned()
                .collect()
        } else {
            let index: HashMap<&CandidateId, &Candidate> =
                self.candidates.iter().map(|c| (&c.id, &**c)).collect();
            other
                .candidates
                .iter()
                .filter(|c| wins(c, index.get(&c.id).copied()))
                .cloned()
                .collect()
        };
        if !winners.is_empty() {
            self.absorb_all(winners);
            self.rank();
        }
    }
}

/// The entries of one scope, by namespace and key fingerprint.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScopeData {
    /// Namespace name → key fingerprint → entry; every entry sits under its own fingerprint
    /// (which is why this is private: [`CacheData::insert`] is the way in).
    pub(crate) namespaces: BTreeMap<String, BTreeMap<Fingerprint, Entry>>,
}

impl ScopeData {
    /// The namespaces and their entries by key fingerprint, in name order.
    pub fn namespaces(&self) -> impl Iterator<Item = (&str, &BTreeMap<Fingerprint, Entry>)> {
        self.namespaces.iter().map(|(n, e)| (n.as_str(), e))
    }

    /// The entries of one namespace, by key fingerprint.
    pub fn namespace(&self, name: &str) -> Option<&BTreeMap<Fingerprint, Entry>> {
        self.namespaces.get(name)
    }

    /// Takes the namespaces out.
    pub fn into_namespaces(self) -> impl Iterator<Item = (String, BTreeMap<Fingerprint, Entry>)> {
        self.namespaces.into_iter()
    }
}

/// Everything a cache file (or one journal record) holds, at the current format version.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CacheData {
    scopes: BTreeMap<Scope, ScopeData>,
}

impl CacheData {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Merges `entry` into the given scope and namespace (see [`Entry::merge`]).
    pub fn insert(&mut self, scope: &Scope, namespace: &str, entry: Entry) {
        let scope_data = match self.scopes.get_mut(scope) {
            Some(s) => s,
            None => self.scopes.entry(scope.clone()).or_default(),
        };
        let entries = match scope_data.namespaces.get_mut(namespace) {
            Some(n) => n,
            None => scope_data
                .namespaces
                .entry(namespace.to_owned())
                .or_default(),
        };
        match entries.get_mut(&entry.fingerprint()) {
            Some(existing) => existing.merge(entry),
            None => {
                entries.insert(entry.fingerprint(), entry);
            }
        }
    }

    /// Merges every entry of `other` into this cache.
    pub fn merge(&mut self, other: CacheData) {
        for (scope, data) in other.scopes {
            for (namespace, entries) in data.namespaces {
                for (_, entry) in entries {
                    self.insert(&scope, &namespace, entry);
                }
            }
        }
    }

    /// Looks an entry up.
    pub fn get(&self, scope: &Scope, namespace: &str, fingerprint: &Fingerprint) -> Option<&Entry> {
        self.scopes
            .get(scope)?
            .namespaces
            .get(namespace)?
            .get(fingerprint)
    }

    /// The scopes and their entries, in fingerprint order of nothing in particular but
    /// deterministic (scopes sorted by fingerprint, then fields).
    pub fn scopes(&self) -> impl Iterator<Item = (&Scope, &ScopeData)> {
        self.scopes.iter()
    }

    /// Takes the scopes out.
    pub fn into_scopes(self) -> impl Iterator<Item = (Scope, ScopeData)> {
        self.scopes.into_iter()
    }

    /// Every entry as `(scope, namespace, entry)`, in a deterministic order.
    pub fn entries(&self) -> impl Iterator<Item = (&Scope, &str, &Entry)> {
        self.scopes.iter().flat_map(|(scope, data)| {
            data.namespaces.iter().flat_map(move |(ns, entries)| {
                entries.values().map(move |e| (scope, ns.as_str(), e))
            })
        })
    }

    /// Number of entries over all scopes and namespaces.
    pub fn len(&self) -> usize {
        self.scopes
            .values()
            .flat_map(|s| s.namespaces.values())
            .map(BTreeMap::len)
            .sum()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of scopes.
    pub fn scope_count(&self) -> usize {
        self.scopes.len()
    }
}

/// Counts identity comparisons in tests, to check that matching stays linear.
#[cfg(test)]
pub(crate) mod probes {
    use std::cell::Cell;

    thread_local! {
        static PROBES: Cell<u64> = const { Cell::new(0) };
    }

    pub(crate) fn add(n: u64) {
        PROBES.with(|p| p.set(p.get() + n));
    }

    pub(crate) fn take() -> u64 {
        PROBES.with(|p| p.replace(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::candidate::Stats;
    use crate::value::{Fields, Value};

    fn many(n: u64, offset: u64) -> Vec<Candidate> {
        (0..n)
            .map(|i| {
                let params = Fields::from([("i".to_owned(), Value::Int((i + offset) as i64))]);
                let stats = Stats {
                    median_ns: 1.0 + i as f64,
                    min_ns: 1.0,
                    spread_ns: 0.0,
                    samples: 1,
                };
                Candidate::measured("a", params, stats)
            })
            .collect()
    }

    #[test]
    fn matching_candidates_is_linear_in_their_number() {
        let key = Key::new(Fields::new());
        for n in [1_000u64, 10_000] {
            probes::take();
            let mut entry = Entry::new(
                key.clone(),
                Fingerprint::default(),
                Origin::Imported("t".into()),
                1,
                many(n, 0),
            );
            let other = Entry::new(
                key.clone(),
                Fingerprint::default(),
                Origin::Imported("t".into()),
                2,
                many(n, n / 2),
            );
            entry.merge(other);
            assert_eq!(entry.candidates().len() as u64, n + n / 2);
            let probes = probes::take();
            // A scan per candidate made ~n²/2 comparisons (5·10⁷ at n = 10,000).
            assert!(
                probes <= 4 * n + 1_000,
                "{probes} comparisons for {n} candidates"
            );
        }
    }
}
