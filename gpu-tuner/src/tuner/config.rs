//! The public configuration and result types of the tuner: what a miss does, how one operation
//! is tuned, what goes wrong, and what is reported and counted.

use std::sync::Arc;
use std::time::Duration;

use cache_core::cache_format::{CandidateId, Key, Stats};

use crate::bucket::Bucketing;
use crate::measure::MeasureConfig;

/// What to do when a key has no usable entry.
#[derive(Debug, Clone, PartialEq)]
pub enum MissPolicy {
    /// Measure the candidates now (the default).
    TuneNow,
    /// Use the predicted winner now (a vote of the nearest already-tuned keys, see
    /// [`crate::predict`]; the first candidate if no tuned key is comparable), as a
    /// provisional choice that says so ([`super::Choice::prediction`]), and tune this key on a
    /// background thread, spending at most `budget` of background tuning time in this
    /// process.
    NearestThenTune {
        /// Total background tuning time allowed.
        budget: Duration,
    },
    /// Measure only the `k` best predicted candidates (plus the nearest tuned key's winner,
    /// for a fair comparison), one at a time in predicted order, and choose among them;
    /// measuring stops early once every candidate left is predicted more than 5% slower than
    /// the best measured (plus that measurement's spread), unless the measurements so far
    /// contradicted the prediction's order. The entry records that its set was partial, so a
    /// later [`MissPolicy::TuneNow`] (or a grown candidate set) measures only the rest.
    /// Without a comparable tuned key, every candidate is measured.
    TopK {
        /// How many predicted candidates are measured.
        k: usize,
    },
    /// Never measure: use this declared default.
    Never {
        /// The candidate to use.
        default: CandidateId,
    },
}

/// What the tuner does with a winner that came from a shared tier (measured on another
/// machine): a poisoned or merely wrong entry from elsewhere must not be trusted blindly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RemotePolicy {
    /// Use it as measured there.
    Trust,
    /// Run the operation's verification on it once (per process) before using it; a candidate
    /// that fails here is recorded as failed and the next one is tried. The verified winner is
    /// then timed (a few samples, at most about three of its runs or `min_sample`s): one that
    /// runs more than [`OpConfig::remote_slack`] times slower here than its stored median is
    /// distrusted, and the key is tuned here. The default.
    #[default]
    Verify,
    /// Measure it here against the runner-up (with verification) and choose from that.
    Retime,
}

/// How one operation is tuned.
#[derive(Debug, Clone)]
pub struct OpConfig {
    /// What a miss does.
    pub policy: MissPolicy,
    /// Key bucketing for this namespace.
    pub bucketing: Bucketing,
    /// Longest wait for another thread or process that is tuning the same key; past it, a
    /// provisional fallback is used and nothing is measured twice.
    pub wait: Duration,
    /// How candidates are measured.
    pub measure: MeasureConfig,
    /// After a scope change (same device, new driver or library), how many of the stored best
    /// candidates are re-timed.
    pub retime_top: usize,
    /// On a device with no result for a key that other devices measured (a new GPU beside
    /// older ones), a [`MissPolicy::TuneNow`] miss measures this many of the candidates
    /// those devices rank best ([`crate::predict::Voters::Devices`], the list `tunecache
    /// explain` prints as "measure first here"), and every current candidate none of them
    /// measured, instead of every candidate, then every other one too if those measure here
    /// nearly the other way round from the other devices' ranking; the key is then complete.
    /// On PyTorch's published mm timings (an H100 from an A100's results) that reaches 99.2%
    /// of the optimum with 6.8 measurements a key on TIMM shapes and 98.8% with 9.8 on
    /// HuggingFace ones (docs/rust.md). 0 measures every candidate.
    pub transfer_top: usize,
    /// Make each candidate's measurement durable as soon as it is taken, so a killed tune
    /// resumes where it stopped.
    pub flush_each: bool,
    /// With `flush_each`: the longest one measurement waits to become durable before tuning
    /// goes on (the saver keeps trying in the background). While the cache's saves are failing
    /// (another process holds the lock, the disk is full) measurements do not wait at all:
    /// they queue in memory, and tuning runs at full speed.
    pub durable_wait: Duration,
    /// How long a provisional fallback is used before the key is looked at again.
    pub provisional_ttl: Duration,
    /// What to do with a winner from a shared tier.
    pub remote: RemotePolicy,
    /// Under [`RemotePolicy::Verify`], how many times slower than its stored median a winner
    /// from a shared tier may run here (its best timed sample) before it is distrusted and the
    /// key is tuned here: timings from another machine of the same scope differ by less, and
    /// a false figure (a poisoned or mistaken writer) by more.
    pub remote_slack: f64,
}

impl Default for OpConfig {
    fn default() -> Self {
        OpConfig {
            policy: MissPolicy::TuneNow,
            bucketing: Bucketing::none(),
            wait: Duration::from_secs(30),
            measure: MeasureConfig::default(),
            retime_top: 3,
            transfer_top: 5,
            flush_each: true,
            durable_wait: Duration::from_millis(250),
            provisional_ttl: Duration::from_secs(1),
            remote: RemotePolicy::Verify,
            remote_slack: 3.0,
        }
    }
}

/// Why a key could not be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TuneError {
    /// The key cannot be turned into canonical fields (e.g. it has a float).
    #[error("invalid key for {namespace}: {reason}")]
    InvalidKey {
        /// The namespace.
        namespace: String,
        /// Why.
        reason: String,
    },
    /// No candidate can run the key.
    #[error("no candidate of {namespace} can run {key}: {reasons}")]
    NoCandidate {
        /// The namespace.
        namespace: String,
        /// The key.
        key: String,
        /// What each candidate said.
        reasons: String,
    },
    /// Setting up the problem to measure on failed.
    #[error("cannot set up {namespace} {key} for measuring: {reason}")]
    Problem {
        /// The namespace.
        namespace: String,
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// The namespace name was refused.
    #[error("{0}")]
    Namespace(String),
}

/// What the tuner is doing, for progress displays.
#[derive(Debug)]
pub enum Progress<'a> {
    /// Measuring starts for a key.
    Tuning {
        /// The namespace.
        namespace: &'a str,
        /// The key.
        key: &'a Key,
        /// How many candidates will be measured.
        candidates: usize,
    },
    /// One candidate was measured (or failed), and the result recorded (durable, with
    /// `flush_each`).
    Measured {
        /// The namespace.
        namespace: &'a str,
        /// The candidate.
        candidate: &'a CandidateId,
        /// Its statistics, or why it failed.
        result: Result<&'a Stats, &'a str>,
        /// Whether sampling stopped early because it was clearly losing.
        stopped_early: bool,
    },
    /// A key is tuned.
    Tuned {
        /// The namespace.
        namespace: &'a str,
        /// The key.
        key: &'a Key,
        /// The winner.
        winner: &'a CandidateId,
        /// Time spent preparing and measuring.
        elapsed: Duration,
    },
}

/// A progress callback.
pub(crate) type ProgressFn = Arc<dyn Fn(&Progress<'_>) + Send + Sync>;

/// Counters of one tuned operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TuneStats {
    /// Calls served from the dispatch table.
    pub hits: u64,
    /// Calls that went to the miss path.
    pub misses: u64,
    /// Keys for which something was measured.
    pub tuned_keys: u64,
    /// Keys served from the persistent cache without measuring, by entries this process did
    /// not measure (recorded before it started, or by another process).
    pub reused_keys: u64,
    /// Keys served without measuring by a cache key this process measured for another key
    /// of the same bucket (see [`Bucketing`](crate::Bucketing)).
    pub bucketed_keys: u64,
    /// Candidates measured (or found failing).
    pub measured: u64,
    /// Provisional choices handed out.
    pub provisional: u64,
    /// Chosen candidates that failed at run time and were replaced by the runner-up.
    pub failures: u64,
    /// Winners from a shared tier checked here (verified, or re-timed) before use.
    pub remote_checked: u64,
    /// Winners from a shared tier that failed their verification here (recorded as failed).
    pub remote_refused: u64,
    /// Winners from a shared tier that ran far slower here than their stored median (see
    /// [`OpConfig::remote_slack`]): their keys were tuned here.
    pub remote_distrusted: u64,
    /// Time spent preparing and measuring.
    pub tuning_time: Duration,
    /// Tuning time recorded for the cache keys reused (each counted once, none that this
    /// process tuned itself): what this process did not spend.
    pub saved_time: Duration,
    /// Choices changed to the fleet's winner (see [`super::Consistency::Fleet`]).
    pub fleet_adopted: u64,
    /// Keys served by a loose match after an upgrade (see [`super::Choice::loose_from`]).
    pub loose_hits: u64,
}
