//! Measuring one candidate: verify, warm up, take samples, stop early when it is clearly
//! losing, and summarise.

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
        }
    }
}

/// The result of measuring one candidate.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Measured {
    pub(crate) stats: Stats,
    pub(crate) stopped_early: bool,
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

/// Measures `handle` on `problem`. `best_median` is the best median measured so far for the
/// key, for early stopping.
pub(crate) fn measure<O: Operation>(
    op: &O,
    handle: &O::Handle,
    problem: &mut O::Problem,
    config: &MeasureConfig,
    best_median: Option<f64>,
) -> Result<Measured, String> {
    let started = Instant::now();
    // One checked run: a wrong answer disqualifies the candidate before any timing.
    let first = op.time(handle, problem, 1)?;
    op.verify(handle, problem)
        .map_err(|e| format!("wrong result: {e}"))?;
    let per_run = first.max(Duration::from_nanos(1));
    let iterations = (config.min_sample.as_nanos() / per_run.as_nanos()).clamp(1, 1_000_000) as u32;
    let warm_until = Instant::now() + config.warmup;
    loop {
        op.time(handle, problem, iterations)?;
        if Instant::now() >= warm_until {
            break;
        }
    }
    let mut samples = Vec::with_capacity(config.samples as usize);
    let mut stopped_early = false;
    for _ in 0..config.samples.max(1) {
        let t = op.time(handle, problem, iterations)?;
        samples.push(t.as_nanos() as f64 / f64::from(iterations));
        if samples.len() as u32 >= config.early_stop_after
            && let Some(best) = best_median
        {
            let fastest = samples.iter().copied().fold(f64::INFINITY, f64::min);
            if fastest > best * config.early_stop_ratio {
                stopped_early = true;
                break;
            }
        }
        if started.elapsed() >= config.max_per_candidate {
            break;
        }
    }
    Ok(Measured {
        stats: summarise(&mut samples),
        stopped_early,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
