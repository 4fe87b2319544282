//! Measuring the candidates of one key: verify each, warm up, take samples interleaved across
//! candidates, stop early those clearly losing, and summarise.

use crate::OpError;
use std::time::{Duration, Instant};

use cache_core::cache_format::Stats;

use crate::operation::Operation;

/// How candidates are measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeasureConfig {
    /// At least this much warm-up before sampling (at least one run).
    pub warmup: Duration,
    /// Samples to take.
    pub samples: u32,
    /// Each sample times enough back-to-back runs to last at least this long, so a fast
    /// kernel is not lost in the clock's resolution.
    pub min_sample: Duration,
    /// Stop sampling a candidate after this long.
    pub max_per_candidate: Duration,
    /// Early stopping applies only after this many samples...
    pub early_stop_after: u32,
    /// ...when even the candidate's fastest sample is this many times slower than the best
    /// median measured so far for the key.
    pub early_stop_ratio: f64,
    /// Near-ties, measured again before a winner is chosen: the candidates whose median is
    /// within their own and the best's spread of the best (`near_ties`) take this many more
    /// samples, together and interleaved (each still within `max_per_candidate`), so the
    /// winner stored is not one run's noise. 0: none.
    pub confirm_rounds: u32,
}

impl Default for MeasureConfig {
    fn default() -> Self {
        MeasureConfig {
            warmup: Duration::from_millis(2),
            samples: 11,
            min_sample: Duration::from_micros(50),
            max_per_candidate: Duration::from_secs(1),
            early_stop_after: 3,
            early_stop_ratio: 1.5,
            confirm_rounds: 11,
        }
    }
}

/// The result of measuring one candidate.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Measured {
    pub(crate) stats: Stats,
    pub(crate) stopped_early: bool,
    /// Time spent running it.
    pub(crate) spent: Duration,
}

/// Median, minimum and median absolute deviation of per-run times (ns).
pub(crate) fn summarise(samples: &mut [f64]) -> Stats {
    samples.sort_by(f64::total_cmp);
    let median = median_of_sorted(samples);
    let mut deviations: Vec<f64> = samples.iter().map(|s| (s - median).abs()).collect();
    deviations.sort_by(f64::total_cmp);
    Stats {
        median_ns: median,
        min_ns: samples.first().copied().unwrap_or(0.0),
        spread_ns: median_of_sorted(&deviations),
        samples: samples.len() as u32,
    }
}

fn median_of_sorted(v: &[f64]) -> f64 {
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One candidate being measured by [`measure_all`].
struct Contender {
    iterations: u32,
    samples: Vec<f64>,
    /// Time spent running it (checked run, warm-up, samples).
    spent: Duration,
    stopped_early: bool,
    /// Out of the rounds: stopped early, out of time, or failed.
    done: bool,
    error: Option<String>,
}

/// Measures every handle on `problem`, **interleaved**: each handle gets one checked (and
/// verified) run, then all are warmed up, then samples are taken in rounds, one sample of each
/// live candidate per round, the order reversed every other round. A change in machine load
/// (another process, a clock change) lands on all candidates alike instead of on whichever was
/// being measured then, so the ranking does not depend on when it happened.
///
/// `best_known` is the best median already stored for the key; with the medians of this
/// measurement it drives early stopping. Returns one result per handle, in order.
pub(crate) fn measure_all<O: Operation>(
    op: &O,
    handles: &[&O::Handle],
    problem: &mut O::Problem,
    config: &MeasureConfig,
    best_known: Option<f64>,
) -> Vec<Result<Measured, String>> {
    let mut all: Vec<Contender> = handles
        .iter()
        .map(|handle| first_run(op, handle, problem, config))
        .collect();
    // Warm-up, round-robin until every live candidate has had its share (at least one run).
    let warm_until =
        cache_core::deadline_after(config.warmup.saturating_mul(all.len().max(1) as u32));
    loop {
        for (c, handle) in all.iter_mut().zip(handles) {
            if c.done {
                continue;
            }
            let started = Instant::now();
            if let Err(e) = op.time(handle, problem, c.iterations) {
                c.error = Some(e.to_string());
                c.done = true;
            }
            c.spent += started.elapsed();
        }
        if Instant::now() >= warm_until {
            break;
        }
    }
    for round in 0..config.samples.max(1) {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..all.len()).collect()
        } else {
            (0..all.len()).rev().collect()
        };
        for i in order {
            let c = &mut all[i];
            if c.done {
                continue;
            }
            sample(op, handles[i], problem, c);
            if c.error.is_some() || c.spent >= config.max_per_candidate {
                c.done = true;
            }
        }
        if round + 1 >= config.early_stop_after {
            stop_the_slow(&mut all, best_known, config.early_stop_ratio);
        }
        if all.iter().all(|c| c.done) {
            break;
        }
    }
    confirm(op, handles, problem, config, &mut all);
    all.into_iter()
        .map(|mut c| match c.error {
            Some(e) => Err(e),
            None => Ok(Measured {
                stats: summarise(&mut c.samples),
                stopped_early: c.stopped_early,
                spent: c.spent,
            }),
        })
        .collect()
}

/// Samples the near-ties of `all` again, `config.confirm_rounds` rounds, interleaved in
/// alternating order (see [`MeasureConfig::confirm_rounds`]).
fn confirm<O: Operation>(
    op: &O,
    handles: &[&O::Handle],
    problem: &mut O::Problem,
    config: &MeasureConfig,
    all: &mut [Contender],
) {
    if config.confirm_rounds == 0 {
        return;
    }
    let figures: Vec<Option<(f64, f64)>> = all
        .iter()
        .map(|c| {
            (c.error.is_none() && !c.stopped_early && !c.samples.is_empty()).then(|| {
                let s = summarise(&mut c.samples.clone());
                (s.median_ns, s.spread_ns)
            })
        })
        .collect();
    let close = near_ties(&figures);
    for round in 0..config.confirm_rounds {
        let mut order = close.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let c = &mut all[i];
            if c.error.is_none() && c.spent < config.max_per_candidate {
                sample(op, handles[i], problem, c);
            }
        }
    }
}

/// One sample of `c`: its runs timed together, per run; an error ends the candidate.
fn sample<O: Operation>(op: &O, handle: &O::Handle, problem: &mut O::Problem, c: &mut Contender) {
    let started = Instant::now();
    match op.time(handle, problem, c.iterations) {
        Ok(t) => c
            .samples
            .push(t.as_nanos() as f64 / f64::from(c.iterations)),
        Err(e) => c.error = Some(e.to_string()),
    }
    c.spent += started.elapsed();
}

/// The candidates (by position) that are within noise of the best, given each one's median
/// and spread (`None`: failed or stopped early): those whose median exceeds the best's by no
/// more than their two spreads together, the best among them; none when it stands alone.
/// Pure.
pub(crate) fn near_ties(figures: &[Option<(f64, f64)>]) -> Vec<usize> {
    let best = figures
        .iter()
        .enumerate()
        .filter_map(|(i, f)| Some((i, (*f)?)))
        .min_by(|a, b| a.1.0.total_cmp(&b.1.0).then(a.0.cmp(&b.0)));
    let Some((_, (best_median, best_spread))) = best else {
        return Vec::new();
    };
    let close: Vec<usize> = figures
        .iter()
        .enumerate()
        .filter_map(|(i, f)| {
            let (median, spread) = (*f)?;
            (median - best_median <= spread + best_spread).then_some(i)
        })
        .collect();
    if close.len() >= 2 { close } else { Vec::new() }
}

/// One candidate's first run: timed once, then verified (a wrong result disqualifies it),
/// and how many back-to-back runs a sample takes to outlast the clock's resolution.
fn first_run<O: Operation>(
    op: &O,
    handle: &O::Handle,
    problem: &mut O::Problem,
    config: &MeasureConfig,
) -> Contender {
    let started = Instant::now();
    let checked = op
        .time(handle, problem, 1)
        .and_then(|first| {
            op.verify(handle, problem)
                .map_err(|e| format!("wrong result: {e}"))?;
            Ok(first)
        })
        .map(|first| {
            let per_run = first.max(Duration::from_nanos(1));
            (config.min_sample.as_nanos() / per_run.as_nanos()).clamp(1, 1_000_000) as u32
        });
    let (iterations, error) = match checked {
        Ok(n) => (n, None),
        Err(e) => (1, Some(e.to_string())),
    };
    Contender {
        iterations,
        // Grows as samples come: a huge configured count reserves no memory up front.
        samples: Vec::with_capacity(config.samples.min(4096) as usize),
        spent: started.elapsed(),
        stopped_early: false,
        done: error.is_some(),
        error,
    }
}

/// Whether a candidate runs more than `slack` times slower than `median_ns` (a figure recorded
/// elsewhere): `Some(ratio)` of its best sample to the median if every sample does, `None` as
/// soon as one does not. `first` is a sample already taken (one run, e.g. the verification
/// run); up to two more are taken, each lengthened to outlast `min_sample` (a single short
/// run is mostly clock and call overhead) but never past 10,000 runs, so checking a false
/// figure costs about three of the candidate's runs or `min_sample`s.
pub(crate) fn slower_than<O: Operation>(
    op: &O,
    (handle, problem): (&O::Handle, &mut O::Problem),
    first: Duration,
    median_ns: f64,
    slack: f64,
    min_sample: Duration,
) -> Result<Option<f64>, OpError> {
    if median_ns.is_nan() || median_ns <= 0.0 {
        // No reader accepts such a figure from a shared tier; nothing to compare with.
        return Ok(None);
    }
    let (mut took, mut iterations) = (first, 1u32);
    let mut best = f64::INFINITY;
    for sample in 0..3 {
        if sample > 0 {
            took = op.time(handle, problem, iterations)?;
        }
        let per_run = took.as_nanos() as f64 / f64::from(iterations);
        best = best.min(per_run);
        if per_run <= median_ns * slack {
            return Ok(None);
        }
        if took < min_sample {
            let runs = min_sample.as_nanos() as f64 / per_run.max(1.0);
            iterations = runs.ceil().clamp(1.0, 10_000.0) as u32;
        }
    }
    Ok(Some(best / median_ns))
}

/// Whether a shared tier's winner that ran slower here than its recorded median is explained
/// by this machine being slower now (contention, another clock) rather than by a false figure:
/// held against the entry's runner-up, timed here in the same moments, the winner keeps within
/// `slack` of the ratio the two have on record. A false figure (a slow candidate recorded as
/// fast) does not: the runner-up beats it here by far more than the record says.
pub(crate) fn contention_explains(
    (winner_here, runner_here): (f64, f64),
    (winner_stored, runner_stored): (f64, f64),
    slack: f64,
) -> bool {
    let valid = |x: f64| x.is_finite() && x > 0.0;
    if ![winner_here, runner_here, winner_stored, runner_stored]
        .into_iter()
        .all(valid)
    {
        return false;
    }
    winner_here / runner_here <= (winner_stored / runner_stored) * slack
}

/// The fastest per-run time of the winner and of the runner-up over three rounds, each round
/// timing one then the other (so both see the same load), each sample lengthened to outlast
/// `min_sample` as [`slower_than`] does.
pub(crate) fn interleaved_best<O: Operation>(
    op: &O,
    problem: &mut O::Problem,
    (winner, runner): (&O::Handle, &O::Handle),
    min_sample: Duration,
) -> Result<(f64, f64), String> {
    let mut iterations = [1u32, 1u32];
    let mut best = [f64::INFINITY, f64::INFINITY];
    for _ in 0..3 {
        for (i, handle) in [winner, runner].into_iter().enumerate() {
            let took = op.time(handle, problem, iterations[i])?;
            let per_run = took.as_nanos() as f64 / f64::from(iterations[i]);
            best[i] = best[i].min(per_run);
            if took < min_sample {
                let runs = min_sample.as_nanos() as f64 / per_run.max(1.0);
                iterations[i] = runs.ceil().clamp(1.0, 10_000.0) as u32;
            }
        }
    }
    Ok((best[0], best[1]))
}

/// Stops every live candidate whose fastest sample is already `ratio` times the best median
/// so far (over this measurement and `best_known`, what was stored).
fn stop_the_slow(all: &mut [Contender], best_known: Option<f64>, ratio: f64) {
    // The best median so far, over this measurement and what was stored.
    let best = all
        .iter()
        .filter(|c| c.error.is_none() && !c.samples.is_empty())
        .map(|c| {
            let mut s = c.samples.clone();
            summarise(&mut s).median_ns
        })
        .chain(best_known)
        .fold(f64::INFINITY, f64::min);
    for c in all.iter_mut().filter(|c| !c.done) {
        let fastest = c.samples.iter().copied().fold(f64::INFINITY, f64::min);
        if fastest > best * ratio {
            c.stopped_early = true;
            c.done = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An operation whose timings are synthetic: the machine is 3× slower for the first
    /// `slow_calls` timing calls (load that goes away), then at full speed; with `wander`, each
    /// call up to 12% slower, in a cycle of seven calls (no two rounds alike).
    struct Drifting {
        calls: std::sync::atomic::AtomicU32,
        slow_calls: u32,
        wander: bool,
    }

    impl Operation for Drifting {
        type Key = u32;
        type Handle = f64;
        type Problem = ();
        fn namespace(&self) -> &str {
            "drift"
        }
        fn candidates(&self) -> Vec<cache_core::cache_format::CandidateId> {
            Vec::new()
        }
        fn prepare(
            &self,
            _: &cache_core::cache_format::CandidateId,
            _: &u32,
        ) -> Result<f64, OpError> {
            Ok(0.0)
        }
        fn problem(&self, _: &u32) -> Result<(), OpError> {
            Ok(())
        }
        fn run(&self, _: &f64, _: &mut ()) -> Result<(), OpError> {
            Ok(())
        }
        fn time(&self, base_ns: &f64, _: &mut (), iterations: u32) -> Result<Duration, OpError> {
            let n = self
                .calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let load = if n < self.slow_calls { 3.0 } else { 1.0 };
            let factor = load
                * if self.wander {
                    1.0 + 0.02 * f64::from(n % 7)
                } else {
                    1.0
                };
            Ok(Duration::from_nanos(
                (base_ns * factor * f64::from(iterations)) as u64,
            ))
        }
    }

    #[test]
    fn near_ties_are_those_within_both_spreads_of_the_best() {
        let f = |m: f64, s: f64| Some((m, s));
        assert_eq!(
            near_ties(&[f(100.0, 5.0), f(108.0, 5.0), f(200.0, 5.0), None]),
            [0, 1]
        );
        assert_eq!(
            near_ties(&[f(108.0, 5.0), f(100.0, 5.0)]),
            [0, 1],
            "in their order"
        );
        assert!(
            near_ties(&[f(100.0, 1.0), f(150.0, 1.0)]).is_empty(),
            "a clear winner"
        );
        assert_eq!(
            near_ties(&[f(100.0, 0.0), f(100.0, 0.0)]),
            [0, 1],
            "an exact tie"
        );
        assert!(near_ties(&[f(100.0, 9.0), None]).is_empty() && near_ties(&[]).is_empty());
    }

    /// The near-ties take `confirm_rounds` more samples, interleaved; a clearly slower
    /// candidate takes none.
    #[test]
    fn near_ties_are_sampled_again_and_the_rest_are_not() {
        // Timings that wander by up to 12%: each candidate has a spread of a few percent.
        let config = MeasureConfig {
            warmup: Duration::ZERO,
            samples: 11,
            min_sample: Duration::from_nanos(1),
            max_per_candidate: Duration::from_secs(10),
            early_stop_after: 100,
            early_stop_ratio: 100.0,
            confirm_rounds: 7,
        };
        let (a, b, c) = (100_000.0, 101_000.0, 300_000.0);
        let op = Drifting {
            calls: 0.into(),
            slow_calls: 0,
            wander: true,
        };
        let results = measure_all(&op, &[&a, &b, &c], &mut (), &config, None);
        let samples: Vec<u32> = results
            .iter()
            .map(|r| r.as_ref().expect("measured").stats.samples)
            .collect();
        assert_eq!(samples, [18, 18, 11], "{results:?}");
        let off = MeasureConfig {
            confirm_rounds: 0,
            ..config
        };
        let results = measure_all(&op, &[&a, &b, &c], &mut (), &off, None);
        assert!(
            results
                .iter()
                .all(|r| r.as_ref().expect("ok").stats.samples == 11)
        );
    }

    /// Load that changes while a key is measured lands on every candidate alike: the truly
    /// faster candidate (100 ns against 110 ns) keeps the lower median although the machine
    /// was 3× slower for the first third of the measurement. Measured one after the other,
    /// the faster one would have taken all its samples in the slow phase and lost.
    #[test]
    fn load_that_changes_mid_measurement_lands_on_all_candidates() {
        let op = Drifting {
            calls: 0.into(),
            slow_calls: 12,
            wander: false,
        };
        let config = MeasureConfig {
            warmup: Duration::ZERO,
            samples: 11,
            min_sample: Duration::from_nanos(1),
            max_per_candidate: Duration::from_secs(10),
            early_stop_after: 3,
            early_stop_ratio: 100.0,
            confirm_rounds: 0,
        };
        let (fast, slow) = (100.0, 110.0);
        let results = measure_all(&op, &[&fast, &slow], &mut (), &config, None);
        let medians: Vec<f64> = results
            .iter()
            .map(|r| r.as_ref().expect("measured").stats.median_ns)
            .collect();
        assert!(medians[0] < medians[1], "{medians:?}");
        assert_eq!(medians, [100.0, 110.0], "both medians are full-speed ones");
    }

    /// A figure recorded elsewhere is checked against the best of at most three samples: a
    /// cold first run does not condemn an honest one, a false one is caught whatever the first
    /// run says, and a short run is lengthened before it counts.
    #[test]
    fn a_recorded_figure_is_distrusted_only_when_every_sample_is_far_slower() {
        let check = |slow_calls: u32, base: f64, first_ns: u64, median: f64| {
            let op = Drifting {
                calls: 0.into(),
                slow_calls,
                wander: false,
            };
            let min_sample = Duration::from_micros(50);
            let first = Duration::from_nanos(first_ns);
            let verdict = slower_than(&op, (&base, &mut ()), first, median, 3.0, min_sample);
            (verdict.expect("timed"), op.calls.into_inner())
        };
        // Honest, the first run enough: no extra run at all.
        assert_eq!(check(0, 1000.0, 1200, 1000.0), (None, 0));
        // A cold first run (10x), then one more sample at full speed: trusted.
        assert_eq!(check(0, 1000.0, 10_000, 1000.0), (None, 1));
        // Still 3x slower (the machine is loaded) for the next sample: within slack at 3x.
        assert_eq!(check(5, 1000.0, 10_000, 1000.0), (None, 1));
        // A false figure: 600x, every sample, three in all.
        let (verdict, calls) = check(0, 600_000.0, 600_000, 1000.0);
        assert_eq!(calls, 2);
        assert_eq!(verdict, Some(600.0));
        // A 0 or NaN figure is nothing to compare with.
        assert_eq!(check(0, 1000.0, 1000, 0.0), (None, 0));
        assert_eq!(check(0, 1000.0, 1000, f64::NAN), (None, 0));
    }

    #[test]
    fn statistics_are_median_min_and_mad() {
        let mut s = vec![5.0, 1.0, 3.0, 100.0, 4.0];
        let st = summarise(&mut s);
        assert_eq!((st.median_ns, st.min_ns, st.samples), (4.0, 1.0, 5));
        // deviations from 4: 3, 1, 0, 96, 1 -> sorted 0 1 1 3 96 -> median 1
        assert_eq!(st.spread_ns, 1.0);
        let mut even = vec![1.0, 2.0, 3.0, 4.0];
        assert_eq!(summarise(&mut even).median_ns, 2.5);
    }

    #[test]
    fn contention_explains_a_uniform_slowdown_and_not_a_false_figure() {
        // Both three times slower here than recorded, in the same proportion: contention.
        assert!(contention_explains((300.0, 600.0), (100.0, 200.0), 3.0));
        // The winner a little worse against the runner-up than on record: still within slack.
        assert!(contention_explains((500.0, 600.0), (100.0, 200.0), 3.0));
        // A slow candidate recorded as fast (1 ns against the runner-up's 200): here it is
        // slower than the runner-up, thousands of times its recorded ratio.
        assert!(!contention_explains((300.0, 200.0), (1.0, 200.0), 3.0));
        // Figures that cannot be compared explain nothing.
        assert!(!contention_explains((300.0, 0.0), (100.0, 200.0), 3.0));
        assert!(!contention_explains((f64::NAN, 1.0), (100.0, 200.0), 3.0));
    }
}
