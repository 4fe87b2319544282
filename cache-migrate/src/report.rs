//! What a migration did, for logs, the CLI and callers.

use std::fmt;

use cache_format::Fingerprint;

/// One kind of change a step made, and to how many entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The verb, e.g. `renamed`.
    pub action: String,
    /// The object, e.g. `production→mask_gemm`.
    pub detail: String,
    /// How many entries it touched.
    pub entries: u64,
}

impl Change {
    /// A change touching `entries` entries.
    pub fn new(action: impl Into<String>, detail: impl Into<String>, entries: u64) -> Self {
        Change {
            action: action.into(),
            detail: detail.into(),
            entries,
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} entries ({})",
            self.action, self.entries, self.detail
        )
    }
}

/// What one step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepReport {
    /// Source version.
    pub from: u32,
    /// Target version.
    pub to: u32,
    /// The step's description.
    pub description: String,
    /// Its changes.
    pub changes: Vec<Change>,
}

impl StepReport {
    /// One line per change, as logged: `v8→v9 renamed 412 entries (production→mask_gemm)`.
    pub fn lines(&self) -> Vec<String> {
        if self.changes.is_empty() {
            return vec![format!(
                "v{}→v{} {}: no entries changed",
                self.from, self.to, self.description
            )];
        }
        self.changes
            .iter()
            .map(|c| format!("v{}→v{} {c}", self.from, self.to))
            .collect()
    }
}

impl fmt::Display for StepReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.lines().join("; "))
    }
}

/// Two entries whose keys became equal after a step changed key fields; they were merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collision {
    /// The namespace.
    pub namespace: String,
    /// The fingerprint both keys now have.
    pub fingerprint: Fingerprint,
    /// How many entries ended up under it.
    pub merged: u64,
}

impl fmt::Display for Collision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} entries of namespace {:?} now share key {} and were merged",
            self.merged, self.namespace, self.fingerprint
        )
    }
}

/// What a whole migration did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The application.
    pub app: String,
    /// The schema the data had.
    pub from: u32,
    /// The schema it has now.
    pub to: u32,
    /// Number of entries migrated.
    pub entries: u64,
    /// One report per step, in order.
    pub steps: Vec<StepReport>,
    /// Keys that collided after a step changed key fields.
    pub collisions: Vec<Collision>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for step in &self.steps {
            for line in step.lines() {
                writeln!(f, "cache migration {line}")?;
            }
        }
        for c in &self.collisions {
            writeln!(f, "cache migration collision: {c}")?;
        }
        write!(
            f,
            "migrated {} cache v{} → v{} ({} entries)",
            self.app, self.from, self.to, self.entries
        )
    }
}

/// Data brought to the current format and schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Upgraded {
    /// The entries, at the current versions.
    pub data: cache_format::CacheData,
    /// What was migrated; `None` when the data was already current.
    pub report: Option<Report>,
}
