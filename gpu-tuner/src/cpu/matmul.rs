//! Single-precision matrix multiply, C = A × B (row-major), with variants whose speed depends
//! on the shape: a naive triple loop, the cache-friendly i-k-j order, blocked i-k-j with tiles
//! from 16 to 128, and a variant that transposes B for contiguous dot products.

use crate::OpError;
use cache_core::cache_format::Fields;
use serde::Serialize;

use super::fill;
use crate::operation::Operation;
use cache_core::cache_format::CandidateId;

/// A matrix-multiply problem: C (m×n) = A (m×k) × B (k×n), f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct MatmulKey {
    /// Rows of A and C.
    pub m: u32,
    /// Columns of B and C.
    pub n: u32,
    /// Columns of A, rows of B.
    pub k: u32,
    /// Always `f32` here; part of the key so other dtypes never share entries.
    pub dtype: &'static str,
}

impl MatmulKey {
    /// An f32 problem.
    pub fn f32(m: u32, n: u32, k: u32) -> Self {
        MatmulKey {
            m,
            n,
            k,
            dtype: "f32",
        }
    }
}

/// A ready-to-run matmul variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulKernel {
    /// Dot product per output, B read with stride n.
    Naive,
    /// Row of A times rows of B, streaming along j.
    Ikj,
    /// i-k-j over tiles of this size.
    Blocked(usize),
    /// Transpose B once, then contiguous dot products with four accumulators.
    Transposed,
}

/// Inputs, output, scratch and the reference result of one shape.
#[derive(Debug)]
pub struct MatmulProblem {
    m: usize,
    n: usize,
    k: usize,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    bt: Vec<f32>,
    reference: Vec<f64>,
    scale: f64,
}

/// The CPU matmul operation (namespace `matmul`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Matmul;

impl Operation for Matmul {
    type Key = MatmulKey;
    type Handle = MatmulKernel;
    type Problem = MatmulProblem;

    fn namespace(&self) -> &str {
        "matmul"
    }

    fn candidates(&self) -> Vec<CandidateId> {
        let mut c = vec![CandidateId::new("naive", &[]), CandidateId::new("ikj", &[])];
        for tile in [16, 32, 64, 128] {
            c.push(CandidateId::new("blocked", &[("tile", tile)]));
        }
        c.push(CandidateId::new("transposed", &[]));
        c
    }

    fn salt(&self) -> Fields {
        Fields::from([("kernels".to_owned(), "cpu-matmul-v1".into())])
    }

    fn applies(&self, candidate: &CandidateId, key: &MatmulKey) -> bool {
        // A tile much larger than the matrix is the i-k-j loop with extra bookkeeping.
        candidate
            .int("tile")
            .is_none_or(|t| t <= 2 * i64::from(key.m.max(key.n).max(key.k)))
    }

    fn prepare(&self, candidate: &CandidateId, _key: &MatmulKey) -> Result<MatmulKernel, OpError> {
        match (candidate.algorithm.as_str(), candidate.int("tile")) {
            ("naive", None) => Ok(MatmulKernel::Naive),
            ("ikj", None) => Ok(MatmulKernel::Ikj),
            ("blocked", Some(t)) if (1..=4096).contains(&t) => {
                Ok(MatmulKernel::Blocked(t as usize))
            }
            ("transposed", None) => Ok(MatmulKernel::Transposed),
            _ => Err(format!("no CPU matmul kernel {candidate}").into()),
        }
    }

    fn problem(&self, key: &MatmulKey) -> Result<MatmulProblem, OpError> {
        let (m, n, k) = (key.m as usize, key.n as usize, key.k as usize);
        if m == 0 || n == 0 || k == 0 {
            return Err("empty matrix".into());
        }
        if m.saturating_mul(n).saturating_mul(k) > 1 << 33 {
            return Err(format!("{m}x{n}x{k} is too large to measure on the CPU").into());
        }
        let a = fill(m * k, 1);
        let b = fill(k * n, 2);
        // Reference in f64, i-k-j order.
        let mut reference = vec![0.0f64; m * n];
        for i in 0..m {
            for p in 0..k {
                let av = f64::from(a[i * k + p]);
                let row = &b[p * n..(p + 1) * n];
                for (r, bv) in reference[i * n..(i + 1) * n].iter_mut().zip(row) {
                    *r += av * f64::from(*bv);
                }
            }
        }
        Ok(MatmulProblem {
            m,
            n,
            k,
            a,
            b,
            c: vec![0.0; m * n],
            bt: vec![0.0; k * n],
            reference,
            scale: k as f64,
        })
    }

    fn run(&self, kernel: &MatmulKernel, p: &mut MatmulProblem) -> Result<(), OpError> {
        let (m, n, k) = (p.m, p.n, p.k);
        let (a, b, c) = (&p.a, &p.b, &mut p.c);
        match *kernel {
            MatmulKernel::Naive => {
                for i in 0..m {
                    for j in 0..n {
                        let mut sum = 0.0f32;
                        for q in 0..k {
                            sum += a[i * k + q] * b[q * n + j];
                        }
                        c[i * n + j] = sum;
                    }
                }
            }
            MatmulKernel::Ikj => {
                c.fill(0.0);
                for i in 0..m {
                    let crow = &mut c[i * n..(i + 1) * n];
                    for q in 0..k {
                        let av = a[i * k + q];
                        for (cv, bv) in crow.iter_mut().zip(&b[q * n..(q + 1) * n]) {
                            *cv += av * bv;
                        }
                    }
                }
            }
            MatmulKernel::Blocked(t) => {
                c.fill(0.0);
                for ii in (0..m).step_by(t) {
                    for qq in (0..k).step_by(t) {
                        for jj in (0..n).step_by(t) {
                            let (ie, qe, je) = ((ii + t).min(m), (qq + t).min(k), (jj + t).min(n));
                            for i in ii..ie {
                                let crow = &mut c[i * n + jj..i * n + je];
                                for q in qq..qe {
                                    let av = a[i * k + q];
                                    for (cv, bv) in crow.iter_mut().zip(&b[q * n + jj..q * n + je])
                                    {
                                        *cv += av * bv;
                                    }
                                }
                            }
                        }
                    }
                }
            }
            MatmulKernel::Transposed => {
                let bt = &mut p.bt;
                for q in 0..k {
                    for j in 0..n {
                        bt[j * k + q] = b[q * n + j];
                    }
                }
                for i in 0..m {
                    let arow = &a[i * k..(i + 1) * k];
                    for j in 0..n {
                        let brow = &bt[j * k..(j + 1) * k];
                        let mut acc = [0.0f32; 4];
                        let mut chunks_a = arow.chunks_exact(4);
                        let mut chunks_b = brow.chunks_exact(4);
                        for (x, y) in (&mut chunks_a).zip(&mut chunks_b) {
                            for l in 0..4 {
                                acc[l] += x[l] * y[l];
                            }
                        }
                        let mut sum = acc[0] + acc[1] + acc[2] + acc[3];
                        for (x, y) in chunks_a.remainder().iter().zip(chunks_b.remainder()) {
                            sum += x * y;
                        }
                        c[i * n + j] = sum;
                    }
                }
            }
        }
        Ok(())
    }

    fn verify(&self, _kernel: &MatmulKernel, p: &mut MatmulProblem) -> Result<(), OpError> {
        let tolerance = 1e-4 * p.scale + 1e-4;
        for (idx, (got, want)) in p.c.iter().zip(&p.reference).enumerate() {
            if (f64::from(*got) - want).abs() > tolerance {
                return Err(format!("C[{idx}] = {got}, expected {want:.6}").into());
            }
        }
        Ok(())
    }
}
