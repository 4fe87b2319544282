//! The public domain model: keys, scopes, entries with ranked candidates, and the contents
//! of a cache file. These types are independent of the bytes on disk (see `wire`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::candidate::Candidate;
use crate::clock::Millis;
use crate::fingerprint::Fingerprint;
use crate::ser::{ValueError, to_fields};
use crate::value::{Fields, write_fields};

mod merge;

pub(crate) use merge::MAX_CANDIDATES;

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
