//! An application's registry of schema migration steps, chained automatically, and the
//! registry of container-format steps, chained by the same code.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use cache_format::rmpv::Value as Raw;
use serde::{Deserialize, Serialize};

use crate::error::MigrateError;
use crate::ops::Op;
use crate::report::{Change, Report, StepReport};
use crate::view::PayloadView;

/// The body of a coded step: edits the schema-less payload in place and describes what it
/// changed (one [`Change`] per kind of change, with how many entries it touched).
pub type StepFn = dyn Fn(&mut PayloadView) -> Result<Vec<Change>, String> + Send + Sync;

#[derive(Clone)]
enum Body {
    Coded(Arc<StepFn>),
    Declarative(Vec<Op>),
}

/// One step from schema `from` to schema `to`.
#[derive(Clone)]
pub struct Step {
    from: u32,
    to: u32,
    description: String,
    body: Body,
}

impl Step {
    /// A step written as code over the schema-less view.
    pub fn coded<F>(from: u32, to: u32, description: impl Into<String>, run: F) -> Self
    where
        F: Fn(&mut PayloadView) -> Result<Vec<Change>, String> + Send + Sync + 'static,
    {
        Step {
            from,
            to,
            description: description.into(),
            body: Body::Coded(Arc::new(run)),
        }
    }

    /// A step made of declarative operations, applied in order.
    pub fn declarative(from: u32, to: u32, description: impl Into<String>, ops: Vec<Op>) -> Self {
        Step {
            from,
            to,
            description: description.into(),
            body: Body::Declarative(ops),
        }
    }

    /// The version it starts from.
    pub fn from(&self) -> u32 {
        self.from
    }

    /// The version it produces.
    pub fn to(&self) -> u32 {
        self.to
    }

    /// What it does, in words.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Its operations, if it is declarative.
    pub fn ops(&self) -> Option<&[Op]> {
        match &self.body {
            Body::Declarative(ops) => Some(ops),
            Body::Coded(_) => None,
        }
    }

    pub(crate) fn apply(&self, view: &mut PayloadView) -> Result<StepReport, MigrateError> {
        let failed = |reason: String| MigrateError::StepFailed {
            from: self.from,
            to: self.to,
            reason,
        };
        let changes = match &self.body {
            Body::Coded(run) => run(view).map_err(failed)?,
            Body::Declarative(ops) => ops
                .iter()
                .map(|op| op.apply(view))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| failed(e.to_string()))?,
        };
        // A coded step may have produced two namespaces of one name: merge them.
        view.normalize();
        Ok(StepReport {
            from: self.from,
            to: self.to,
            description: self.description.clone(),
            changes,
        })
    }
}

impl fmt::Debug for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Step({}→{}: {})", self.from, self.to, self.description)
    }
}

impl fmt::Display for Step {
    /// The step as the CLI prints it: a title line, then one line per operation.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}→v{}: {}", self.from, self.to, self.description)?;
        match &self.body {
            Body::Declarative(ops) => {
                for op in ops {
                    write!(f, "\n  {op}")?;
                }
                Ok(())
            }
            Body::Coded(_) => f.write_str("\n  (coded step)"),
        }
    }
}

/// Resolves the chain of steps from `from` to `current`: each step starts where the previous
/// one ended. Shared by schema and format migrations.
fn chain<S>(
    steps: &BTreeMap<u32, S>,
    to_of: impl Fn(&S) -> u32,
    from: u32,
    current: u32,
) -> Result<Vec<&S>, u32> {
    let mut path = Vec::new();
    let mut at = from;
    while at < current {
        let step = steps.get(&at).ok_or(at)?;
        path.push(step);
        at = to_of(step);
    }
    Ok(path)
}

/// What a file's versions mean for this build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Same application and schema: use as is.
    Current,
    /// Same application, older schema: migrate from this version.
    Older(u32),
    /// Same application, newer schema: leave the file untouched.
    Newer(u32),
    /// Another application's file: leave it untouched.
    Foreign(String),
}

/// The migration registry of one application: its name, its current schema version, and
/// the steps that lead older versions to it.
#[derive(Debug, Clone)]
pub struct Migrations {
    app: String,
    current: u32,
    steps: BTreeMap<u32, Step>,
}

impl Migrations {
    /// A registry with no steps: older files have no migration path.
    pub fn new(app: impl Into<String>, current: u32) -> Self {
        Migrations {
            app: app.into(),
            current,
            steps: BTreeMap::new(),
        }
    }

    /// Adds a step. Refuses a step that goes backwards or past the current version, or that
    /// starts where another step starts.
    pub fn with(mut self, step: Step) -> Result<Self, MigrateError> {
        if step.to <= step.from {
            return Err(MigrateError::Registry(format!(
                "step {}→{} does not go forward",
                step.from, step.to
            )));
        }
        if step.to > self.current {
            return Err(MigrateError::Registry(format!(
                "step {}→{} goes past the current schema {}",
                step.from, step.to, self.current
            )));
        }
        check_defaults(&step)?;
        if let Some(existing) = self.steps.get(&step.from) {
            return Err(MigrateError::Registry(format!(
                "two steps start at schema {}: {existing:?} and {step:?}",
                step.from
            )));
        }
        self.steps.insert(step.from, step);
        Ok(self)
    }

    /// Reads a registry from a migration file (JSON; see [`MigrationFile`]).
    pub fn from_json(text: &str) -> Result<Self, MigrateError> {
        let file: MigrationFile = serde_json::from_str(text)
            .map_err(|e| MigrateError::Registry(format!("invalid migration file: {e}")))?;
        file.into_registry()
    }

    /// The registry as a migration file, if every step is declarative.
    pub fn to_file(&self) -> Option<MigrationFile> {
        let steps = self
            .steps
            .values()
            .map(|s| {
                s.ops().map(|ops| StepSpec {
                    from: s.from,
                    to: s.to,
                    description: s.description.clone(),
                    ops: ops.to_vec(),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(MigrationFile {
            app: self.app.clone(),
            current: self.current,
            steps,
        })
    }

    /// The application name.
    pub fn app(&self) -> &str {
        &self.app
    }

    /// The current schema version.
    pub fn current(&self) -> u32 {
        self.current
    }

    /// The registered steps, by starting version.
    pub fn steps(&self) -> impl Iterator<Item = &Step> {
        self.steps.values()
    }

    /// Classifies a file's application and schema version. Every read path calls this.
    pub fn gate(&self, app: &str, schema: u32) -> Gate {
        if app != self.app {
            Gate::Foreign(app.to_owned())
        } else if schema == self.current {
            Gate::Current
        } else if schema < self.current {
            Gate::Older(schema)
        } else {
            Gate::Newer(schema)
        }
    }

    /// Checks that a file's versions can be brought to the current ones.
    pub fn check(&self, app: &str, schema: u32) -> Result<(), MigrateError> {
        match self.gate(app, schema) {
            Gate::Current => Ok(()),
            Gate::Older(from) => self.path(from).map(|_| ()),
            Gate::Newer(found) => Err(MigrateError::NewerSchema {
                found,
                current: self.current,
            }),
            Gate::Foreign(found) => Err(MigrateError::Foreign {
                found,
                expected: self.app.clone(),
            }),
        }
    }

    /// The chain of steps from `from` to the current version.
    pub fn path(&self, from: u32) -> Result<Vec<&Step>, MigrateError> {
        if from > self.current {
            return Err(MigrateError::NewerSchema {
                found: from,
                current: self.current,
            });
        }
        chain(&self.steps, |s| s.to, from, self.current).map_err(|missing| MigrateError::NoPath {
            from,
            to: self.current,
            missing,
        })
    }

    /// Runs the chain from `from` on `view`, in place, and reports what each step did.
    pub fn migrate_view(&self, from: u32, view: &mut PayloadView) -> Result<Report, MigrateError> {
        let path = self.path(from)?;
        let mut report = Report {
            app: self.app.clone(),
            from,
            to: self.current,
            entries: view.entry_count() as u64,
            steps: Vec::new(),
            collisions: Vec::new(),
        };
        for step in path {
            report.steps.push(step.apply(view)?);
        }
        Ok(report)
    }
}

/// A migration file: an application's registry as data (JSON).
///
/// ```json
/// {"app": "warpconvnet", "current": 9, "steps": [
///   {"from": 8, "to": 9, "description": "production kernels became mask_gemm",
///    "ops": [{"op": "rename_algorithm", "from": "production", "to": "mask_gemm"}]}]}
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrationFile {
    /// The application.
    pub app: String,
    /// Its current schema version.
    pub current: u32,
    /// The steps, any order.
    #[serde(default)]
    pub steps: Vec<StepSpec>,
}

/// One declarative step of a [`MigrationFile`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepSpec {
    /// Source version.
    pub from: u32,
    /// Target version.
    pub to: u32,
    /// What and why, for the history table and the log.
    #[serde(default)]
    pub description: String,
    /// The operations, applied in order.
    pub ops: Vec<Op>,
}

impl MigrationFile {
    /// Builds the registry, with the same checks as [`Migrations::with`].
    pub fn into_registry(self) -> Result<Migrations, MigrateError> {
        if self.app.is_empty() {
            return Err(MigrateError::Registry(
                "the migration file names no app".into(),
            ));
        }
        let mut registry = Migrations::new(self.app, self.current);
        for s in self.steps {
            registry = registry.with(Step::declarative(s.from, s.to, s.description, s.ops))?;
        }
        Ok(registry)
    }
}

/// One container-format step: rewrites a whole payload from format `from`'s layout to
/// format `to`'s; the chain is the same code as for schema steps.
#[derive(Debug, Clone, Copy)]
pub struct FormatStep {
    /// Source format.
    pub from: u32,
    /// Target format.
    pub to: u32,
    /// What changed.
    pub description: &'static str,
    /// The rewrite.
    pub run: fn(Raw) -> Result<Raw, String>,
}

/// The container-format steps of this build, oldest first.
pub const FORMAT_STEPS: &[FormatStep] = &[
    FormatStep {
        from: 1,
        to: 2,
        description: "candidates record how they were measured (policy); older results: unknown",
        // A format 1 payload is a format 2 payload whose candidates record no policy: an
        // absent `policy` is the unknown policy, so the layout needs no rewrite.
        run: Ok,
    },
    FormatStep {
        from: 2,
        to: 3,
        description: "a candidate may be a winner another tool chose, without figures (status chosen)",
        // A format 2 payload is a format 3 payload without chosen candidates: no rewrite.
        run: Ok,
    },
    FormatStep {
        from: 3,
        to: 4,
        description: "the cache file becomes a table that opens in constant time; entries unchanged",
        // Format 4 changed the file around the entries (a copy-on-write B+tree), not the
        // entries: a format 3 payload is a format 4 one.
        run: Ok,
    },
];

/// Lifts a schema-less payload from format `from` to `current` through `steps`.
pub(crate) fn lift_format(
    steps: &[FormatStep],
    from: u32,
    current: u32,
    mut payload: Raw,
) -> Result<(Raw, Vec<StepReport>), MigrateError> {
    let by_start: BTreeMap<u32, FormatStep> = steps.iter().map(|s| (s.from, *s)).collect();
    let path =
        chain(&by_start, |s| s.to, from, current).map_err(|missing| MigrateError::NoPath {
            from,
            to: current,
            missing,
        })?;
    let mut reports = Vec::new();
    for step in path {
        payload = (step.run)(payload).map_err(|reason| MigrateError::StepFailed {
            from: step.from,
            to: step.to,
            reason,
        })?;
        reports.push(StepReport {
            from: step.from,
            to: step.to,
            description: format!("container format: {}", step.description),
            changes: Vec::new(),
        });
    }
    Ok((payload, reports))
}

/// Refuses a step whose default values could not be read back once written: a param or key
/// field default nested deeper than the readers' bound (with the default [`Limits`]).
fn check_defaults(step: &Step) -> Result<(), MigrateError> {
    let limits = cache_format::Limits::default();
    for op in step.ops().unwrap_or_default() {
        let (what, name, value, max) = match op {
            Op::SetParamDefault { name, value, .. } => {
                ("param", name, value, limits.max_param_depth())
            }
            Op::SetKeyFieldDefault { name, value, .. } => {
                ("key field", name, value, limits.max_key_field_depth())
            }
            _ => continue,
        };
        let depth = value.depth();
        if depth > max {
            return Err(MigrateError::Registry(format!(
                "step {}→{}: the default of {what} {name:?} nests {depth} levels; \
                 readers accept at most {max}",
                step.from, step.to
            )));
        }
    }
    Ok(())
}
