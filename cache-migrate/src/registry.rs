//! An application's registry of schema migration steps, chained automatically.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::error::MigrateError;
use crate::report::{Change, Report, StepReport};
use crate::view::PayloadView;

/// The body of a coded step: edits the schema-less payload in place and describes what it
/// changed (one [`Change`] per kind of change, with how many entries it touched).
pub type StepFn = dyn Fn(&mut PayloadView) -> Result<Vec<Change>, String> + Send + Sync;

/// One step from schema `from` to schema `to`.
#[derive(Clone)]
pub struct Step {
    from: u32,
    to: u32,
    description: String,
    run: Arc<StepFn>,
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
            run: Arc::new(run),
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

    pub(crate) fn apply(&self, view: &mut PayloadView) -> Result<StepReport, MigrateError> {
        let changes = (self.run)(view).map_err(|reason| MigrateError::StepFailed {
            from: self.from,
            to: self.to,
            reason,
        })?;
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
        if let Some(existing) = self.steps.get(&step.from) {
            return Err(MigrateError::Registry(format!(
                "two steps start at schema {}: {existing:?} and {step:?}",
                step.from
            )));
        }
        self.steps.insert(step.from, step);
        Ok(self)
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
        let mut path = Vec::new();
        let mut at = from;
        while at < self.current {
            let step = self.steps.get(&at).ok_or(MigrateError::NoPath {
                from,
                to: self.current,
                missing: at,
            })?;
            path.push(step);
            at = step.to;
        }
        Ok(path)
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
