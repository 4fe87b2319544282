//! Single-precision sum of a vector, with variants whose speed depends on its length: one
//! accumulator, several interleaved accumulators (instruction-level parallelism), pairwise
//! sums of chunks, and two or four threads (which pay off only on long vectors).

use crate::OpError;
use cache_core::cache_format::Fields;
use serde::Serialize;

use super::fill;
use crate::operation::Operation;
use cache_core::cache_format::CandidateId;

/// A reduction problem: the sum of `n` f32 values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct ReduceKey {
    /// Number of elements.
    pub n: u64,
    /// Always `f32` here.
    pub dtype: &'static str,
}

impl ReduceKey {
    /// An f32 sum of `n` elements.
    pub fn f32(n: u64) -> Self {
        ReduceKey { n, dtype: "f32" }
    }
}

/// A ready-to-run reduction variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceKernel {
    /// One accumulator.
    Sequential,
    /// This many interleaved accumulators.
    Unrolled(usize),
    /// Sums of chunks of this size, then the sum of those.
    Pairwise(usize),
    /// This many threads, each with eight accumulators.
    Threaded(usize),
}

/// The input, the output and the reference sum.
#[derive(Debug)]
pub struct ReduceProblem {
    x: Vec<f32>,
    out: f32,
    reference: f64,
    magnitude: f64,
}

/// The CPU sum operation (namespace `reduce`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Reduce;

fn unrolled<const L: usize>(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; L];
    let mut chunks = x.chunks_exact(L);
    for c in &mut chunks {
        for l in 0..L {
            acc[l] += c[l];
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

impl Operation for Reduce {
    type Key = ReduceKey;
    type Handle = ReduceKernel;
    type Problem = ReduceProblem;

    fn namespace(&self) -> &str {
        "reduce"
    }

    fn candidates(&self) -> Vec<CandidateId> {
        vec![
            CandidateId::new("sequential", &[]),
            CandidateId::new("unrolled", &[("lanes", 4)]),
            CandidateId::new("unrolled", &[("lanes", 8)]),
            CandidateId::new("unrolled", &[("lanes", 16)]),
            CandidateId::new("pairwise", &[("chunk", 256)]),
            CandidateId::new("pairwise", &[("chunk", 4096)]),
            CandidateId::new("threaded", &[("threads", 2)]),
            CandidateId::new("threaded", &[("threads", 4)]),
        ]
    }

    fn salt(&self) -> Fields {
        Fields::from([("kernels".to_owned(), "cpu-reduce-v1".into())])
    }

    fn prepare(&self, candidate: &CandidateId, _key: &ReduceKey) -> Result<ReduceKernel, OpError> {
        let int = |name| candidate.int(name);
        match candidate.algorithm.as_str() {
            "sequential" => Ok(ReduceKernel::Sequential),
            "unrolled" if matches!(int("lanes"), Some(4 | 8 | 16)) => {
                Ok(ReduceKernel::Unrolled(int("lanes").unwrap_or(8) as usize))
            }
            "pairwise" if int("chunk").is_some_and(|c| c > 0) => {
                Ok(ReduceKernel::Pairwise(int("chunk").unwrap_or(256) as usize))
            }
            "threaded" if int("threads").is_some_and(|t| (1..=64).contains(&t)) => {
                Ok(ReduceKernel::Threaded(int("threads").unwrap_or(2) as usize))
            }
            _ => Err(format!("no CPU reduce kernel {candidate}").into()),
        }
    }

    fn problem(&self, key: &ReduceKey) -> Result<ReduceProblem, OpError> {
        if key.n == 0 || key.n > 1 << 31 {
            return Err(format!("cannot measure a sum of {} elements", key.n).into());
        }
        let x = fill(key.n as usize, 3);
        let reference = x.iter().map(|v| f64::from(*v)).sum();
        let magnitude = x.iter().map(|v| f64::from(v.abs())).sum();
        Ok(ReduceProblem {
            x,
            out: 0.0,
            reference,
            magnitude,
        })
    }

    fn run(&self, kernel: &ReduceKernel, p: &mut ReduceProblem) -> Result<(), OpError> {
        let x = &p.x;
        p.out = match *kernel {
            ReduceKernel::Sequential => x.iter().fold(0.0f32, |a, b| a + b),
            ReduceKernel::Unrolled(4) => unrolled::<4>(x),
            ReduceKernel::Unrolled(16) => unrolled::<16>(x),
            ReduceKernel::Unrolled(_) => unrolled::<8>(x),
            ReduceKernel::Pairwise(chunk) => x.chunks(chunk).map(unrolled::<8>).sum(),
            ReduceKernel::Threaded(threads) => {
                let per = x.len().div_ceil(threads).max(1);
                std::thread::scope(|s| {
                    let parts: Vec<_> = x
                        .chunks(per)
                        .map(|c| s.spawn(move || unrolled::<8>(c)))
                        .collect();
                    parts
                        .into_iter()
                        .map(|h| h.join().unwrap_or(f32::NAN))
                        .sum()
                })
            }
        };
        Ok(())
    }

    fn verify(&self, _kernel: &ReduceKernel, p: &mut ReduceProblem) -> Result<(), OpError> {
        let error = (f64::from(p.out) - p.reference).abs();
        if !p.out.is_finite() || error > 1e-5 * p.magnitude + 1e-3 {
            return Err(format!("sum {} differs from {:.6} by {error}", p.out, p.reference).into());
        }
        Ok(())
    }
}
