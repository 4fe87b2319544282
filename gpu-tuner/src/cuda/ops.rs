//! The CUDA operations: matmul (naive, shared-memory tiles, register-blocked tiles) and sum
//! (shared-memory tree, warp shuffles), over block and tile sizes.

use crate::OpError;
use std::sync::Arc;
use std::time::Duration;

use cache_core::cache_format::{Fields, Value};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};

use super::kernels::{
    KernelSource, MATMUL_COARSE, MATMUL_NAIVE, MATMUL_TILED, REDUCE_SHUFFLE, REDUCE_TREE,
};
use super::{Device, source_fingerprint};
use crate::cpu::{MatmulKey, ReduceKey, fill};
use crate::operation::Operation;
use cache_core::cache_format::CandidateId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    MatmulNaive { block: u32 },
    MatmulTiled { tile: u32 },
    MatmulCoarse { tile: u32, wpt: u32 },
    ReduceTree { block: u32 },
    ReduceShuffle { block: u32 },
}

/// A loaded kernel and how to launch it.
#[derive(Debug, Clone)]
pub struct CudaKernel {
    function: CudaFunction,
    kind: Kind,
}

fn err(what: &str, e: impl std::fmt::Debug) -> String {
    format!("{what}: {e:?}")
}

fn salt(sources: &[KernelSource]) -> Fields {
    sources
        .iter()
        .map(|k| {
            (
                k.name.to_owned(),
                Value::from(source_fingerprint(k).to_hex()),
            )
        })
        .collect()
}

/// Times `iterations` launches with CUDA events on the device's stream, optionally writing a
/// buffer larger than L2 first so every sample starts with a cold cache.
fn time_with_events(
    device: &Device,
    flush: Option<&mut CudaSlice<u8>>,
    iterations: u32,
    mut launch: impl FnMut() -> Result<(), String>,
) -> Result<Duration, String> {
    let stream = device.stream();
    if let Some(buf) = flush {
        stream.memset_zeros(buf).map_err(|e| err("L2 flush", e))?;
    }
    let start = stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| err("record start event", e))?;
    for _ in 0..iterations {
        launch()?;
    }
    let end = stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| err("record end event", e))?;
    end.synchronize()
        .map_err(|e| err("wait for the kernels", e))?;
    let ms = start
        .elapsed_ms(&end)
        .map_err(|e| err("read the events", e))?;
    Ok(Duration::from_nanos((f64::from(ms) * 1e6) as u64))
}

/// CUDA events around back-to-back launches, each sample after an L2 flush of twice the L2
/// size when asked (FORMAT.md, "Measurement policy").
fn cuda_policy(device: &Device, flush_l2: bool) -> Fields {
    let flush = if flush_l2 { 2 * device.l2_bytes() } else { 0 };
    Fields::from([
        ("timer".to_owned(), Value::from("cuda-events")),
        ("delay_kernel".to_owned(), Value::Bool(false)),
        (
            "l2_flush_bytes".to_owned(),
            Value::Int(i64::try_from(flush).unwrap_or(i64::MAX)),
        ),
    ])
}

fn l2_scratch(device: &Device, enabled: bool) -> Result<Option<CudaSlice<u8>>, String> {
    if !enabled || device.l2_bytes() == 0 {
        return Ok(None);
    }
    device
        .stream()
        .alloc_zeros::<u8>(2 * device.l2_bytes())
        .map(Some)
        .map_err(|e| err("allocate the L2 flush buffer", e))
}

/// Matmul on the GPU (namespace `matmul`; the scope's `backend` field keeps it apart from the
/// CPU's entries).
#[derive(Debug, Clone)]
pub struct CudaMatmul {
    device: Arc<Device>,
    /// Write a buffer twice the size of L2 before every sample.
    pub flush_l2: bool,
}

impl CudaMatmul {
    /// The operation on `device`.
    pub fn new(device: Arc<Device>) -> Self {
        CudaMatmul {
            device,
            flush_l2: false,
        }
    }
}

/// Device buffers of one matmul shape, with reference values at sampled positions.
#[derive(Debug)]
pub struct MatmulOnDevice {
    m: usize,
    n: usize,
    k: usize,
    a: CudaSlice<f32>,
    b: CudaSlice<f32>,
    c: CudaSlice<f32>,
    checks: Vec<(usize, f64)>,
    flush: Option<CudaSlice<u8>>,
}

impl CudaMatmul {
    fn launch(&self, kernel: &CudaKernel, p: &mut MatmulOnDevice) -> Result<(), String> {
        let (m, n, k) = (p.m as i32, p.n as i32, p.k as i32);
        let blocks = |extent: usize, per: u32| extent.div_ceil(per as usize) as u32;
        let cfg = match kernel.kind {
            Kind::MatmulNaive { block } => LaunchConfig {
                grid_dim: (blocks(p.n, block), blocks(p.m, block), 1),
                block_dim: (block, block, 1),
                shared_mem_bytes: 0,
            },
            Kind::MatmulTiled { tile } => LaunchConfig {
                grid_dim: (blocks(p.n, tile), blocks(p.m, tile), 1),
                block_dim: (tile, tile, 1),
                shared_mem_bytes: 0,
            },
            Kind::MatmulCoarse { tile, wpt } => LaunchConfig {
                grid_dim: (blocks(p.n, tile), blocks(p.m, tile), 1),
                block_dim: (tile, tile / wpt, 1),
                shared_mem_bytes: 0,
            },
            _ => return Err("not a matmul kernel".into()),
        };
        let stream = self.device.stream();
        let mut launch = stream.launch_builder(&kernel.function);
        launch
            .arg(&p.a)
            .arg(&p.b)
            .arg(&mut p.c)
            .arg(&m)
            .arg(&n)
            .arg(&k);
        // SAFETY: the kernels take (const float*, const float*, float*, int, int, int), which
        // is what is pushed; the buffers hold m*k, k*n and m*n floats, and every kernel
        // bounds-checks its rows and columns against M, N and K.
        unsafe { launch.launch(cfg) }.map_err(|e| err("launch", e))?;
        Ok(())
    }
}

impl Operation for CudaMatmul {
    type Key = MatmulKey;
    type Handle = CudaKernel;
    type Problem = MatmulOnDevice;

    fn namespace(&self) -> &str {
        "matmul"
    }

    fn candidates(&self) -> Vec<CandidateId> {
        let mut c = vec![CandidateId::new("naive", &[("block", 16)])];
        for tile in [8, 16, 32] {
            c.push(CandidateId::new("tiled", &[("tile", tile)]));
        }
        for wpt in [2, 4, 8] {
            c.push(CandidateId::new("coarse", &[("tile", 32), ("wpt", wpt)]));
        }
        c
    }

    fn salt(&self) -> Fields {
        salt(&[MATMUL_NAIVE, MATMUL_TILED, MATMUL_COARSE])
    }

    fn prepare(&self, candidate: &CandidateId, _key: &MatmulKey) -> Result<CudaKernel, OpError> {
        let int = |name: &str| candidate.int(name).and_then(|v| u32::try_from(v).ok());
        let (source, config, kind) = match (
            candidate.algorithm.as_str(),
            int("block"),
            int("tile"),
            int("wpt"),
        ) {
            ("naive", Some(b @ (8 | 16 | 32)), None, None) => (
                MATMUL_NAIVE,
                vec![("BLOCK", i64::from(b))],
                Kind::MatmulNaive { block: b },
            ),
            ("tiled", None, Some(t @ (8 | 16 | 32)), None) => (
                MATMUL_TILED,
                vec![("TILE", i64::from(t))],
                Kind::MatmulTiled { tile: t },
            ),
            ("coarse", None, Some(32), Some(w @ (2 | 4 | 8))) => (
                MATMUL_COARSE,
                vec![("TILE", 32), ("WPT", i64::from(w))],
                Kind::MatmulCoarse { tile: 32, wpt: w },
            ),
            _ => return Err(format!("no CUDA matmul kernel {candidate}").into()),
        };
        Ok(CudaKernel {
            function: self
                .device
                .function(&source, &config)
                .map_err(|e| e.to_string())?,
            kind,
        })
    }

    fn problem(&self, key: &MatmulKey) -> Result<MatmulOnDevice, OpError> {
        let (m, n, k) = (key.m as usize, key.n as usize, key.k as usize);
        if m == 0 || n == 0 || k == 0 || i32::try_from(m.max(n).max(k)).is_err() {
            return Err(format!("cannot measure a {m}x{n}x{k} matmul").into());
        }
        let a = fill(m * k, 1);
        let b = fill(k * n, 2);
        // Reference values at 64 spread-out positions: O(64 k) on the host, whatever the size.
        let checks = (0..64usize)
            .map(|s| {
                let idx = (s.wrapping_mul(2_654_435_761) ^ (s << 7)) % (m * n);
                let (i, j) = (idx / n, idx % n);
                let want: f64 = (0..k)
                    .map(|q| f64::from(a[i * k + q]) * f64::from(b[q * n + j]))
                    .sum();
                (idx, want)
            })
            .collect();
        let stream = self.device.stream();
        Ok(MatmulOnDevice {
            m,
            n,
            k,
            a: stream
                .clone_htod(&a)
                .map_err(|e| err("copy A to the device", e))?,
            b: stream
                .clone_htod(&b)
                .map_err(|e| err("copy B to the device", e))?,
            c: stream
                .alloc_zeros::<f32>(m * n)
                .map_err(|e| err("allocate C", e))?,
            checks,
            flush: l2_scratch(&self.device, self.flush_l2)?,
        })
    }

    fn run(&self, kernel: &CudaKernel, p: &mut MatmulOnDevice) -> Result<(), OpError> {
        self.launch(kernel, p)?;
        self.device
            .stream()
            .synchronize()
            .map_err(|e| err("synchronize", e).into())
    }

    fn verify(&self, _kernel: &CudaKernel, p: &mut MatmulOnDevice) -> Result<(), OpError> {
        let c = self
            .device
            .stream()
            .clone_dtoh(&p.c)
            .map_err(|e| err("copy C to the host", e))?;
        let tolerance = 1e-4 * p.k as f64 + 1e-4;
        for &(idx, want) in &p.checks {
            let got = f64::from(c[idx]);
            if (got - want).abs() > tolerance {
                return Err(format!("C[{idx}] = {got}, expected {want:.6}").into());
            }
        }
        Ok(())
    }

    fn measure_policy(&self) -> Fields {
        cuda_policy(&self.device, self.flush_l2)
    }

    fn time(
        &self,
        kernel: &CudaKernel,
        p: &mut MatmulOnDevice,
        iterations: u32,
    ) -> Result<Duration, OpError> {
        let mut flush = p.flush.take();
        let result = time_with_events(&self.device, flush.as_mut(), iterations, || {
            self.launch(kernel, p)
        });
        p.flush = flush;
        Ok(result?)
    }
}

/// Sum on the GPU (namespace `reduce`).
#[derive(Debug, Clone)]
pub struct CudaReduce {
    device: Arc<Device>,
    /// Write a buffer twice the size of L2 before every sample.
    pub flush_l2: bool,
}

impl CudaReduce {
    /// The operation on `device`.
    pub fn new(device: Arc<Device>) -> Self {
        CudaReduce {
            device,
            flush_l2: false,
        }
    }

    fn launch(&self, kernel: &CudaKernel, p: &mut ReduceOnDevice) -> Result<(), String> {
        let block = match kernel.kind {
            Kind::ReduceTree { block } | Kind::ReduceShuffle { block } => block,
            _ => return Err("not a reduce kernel".into()),
        };
        let stream = self.device.stream();
        stream
            .memset_zeros(&mut p.out)
            .map_err(|e| err("zero the output", e))?;
        // Enough blocks to fill the device a few times over; the grid-stride loop covers the rest.
        let cap = (self.device.sm_count.max(1) as u64) * 8;
        let grid = p.n.div_ceil(u64::from(block)).clamp(1, cap) as u32;
        let n = p.n as i64;
        let mut launch = stream.launch_builder(&kernel.function);
        launch.arg(&p.x).arg(&mut p.out).arg(&n);
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernels take (const float*, float*, long long), which is what is pushed;
        // x holds n floats and out one, and the grid-stride loop stops at n.
        unsafe { launch.launch(cfg) }.map_err(|e| err("launch", e))?;
        Ok(())
    }
}

/// Device buffers of one sum.
#[derive(Debug)]
pub struct ReduceOnDevice {
    n: u64,
    x: CudaSlice<f32>,
    out: CudaSlice<f32>,
    reference: f64,
    magnitude: f64,
    flush: Option<CudaSlice<u8>>,
}

impl Operation for CudaReduce {
    type Key = ReduceKey;
    type Handle = CudaKernel;
    type Problem = ReduceOnDevice;

    fn namespace(&self) -> &str {
        "reduce"
    }

    fn candidates(&self) -> Vec<CandidateId> {
        let mut c: Vec<CandidateId> = [64, 128, 256, 512, 1024]
            .into_iter()
            .map(|b| CandidateId::new("tree", &[("block", b)]))
            .collect();
        c.extend(
            [128, 256, 512, 1024]
                .into_iter()
                .map(|b| CandidateId::new("shuffle", &[("block", b)])),
        );
        c
    }

    fn salt(&self) -> Fields {
        salt(&[REDUCE_TREE, REDUCE_SHUFFLE])
    }

    fn prepare(&self, candidate: &CandidateId, _key: &ReduceKey) -> Result<CudaKernel, OpError> {
        let block = candidate.int("block").and_then(|b| u32::try_from(b).ok());
        let (source, kind) = match (candidate.algorithm.as_str(), block) {
            ("tree", Some(b @ (64 | 128 | 256 | 512 | 1024))) => {
                (REDUCE_TREE, Kind::ReduceTree { block: b })
            }
            ("shuffle", Some(b @ (128 | 256 | 512 | 1024))) => {
                (REDUCE_SHUFFLE, Kind::ReduceShuffle { block: b })
            }
            _ => return Err(format!("no CUDA reduce kernel {candidate}").into()),
        };
        let block = i64::from(block.unwrap_or(256));
        Ok(CudaKernel {
            function: self
                .device
                .function(&source, &[("BLOCK", block)])
                .map_err(|e| e.to_string())?,
            kind,
        })
    }

    fn problem(&self, key: &ReduceKey) -> Result<ReduceOnDevice, OpError> {
        if key.n == 0 || key.n > 1 << 31 {
            return Err(format!("cannot measure a sum of {} elements", key.n).into());
        }
        let x = fill(key.n as usize, 3);
        let stream = self.device.stream();
        Ok(ReduceOnDevice {
            n: key.n,
            reference: x.iter().map(|v| f64::from(*v)).sum(),
            magnitude: x.iter().map(|v| f64::from(v.abs())).sum(),
            x: stream
                .clone_htod(&x)
                .map_err(|e| err("copy x to the device", e))?,
            out: stream
                .alloc_zeros::<f32>(1)
                .map_err(|e| err("allocate the output", e))?,
            flush: l2_scratch(&self.device, self.flush_l2)?,
        })
    }

    fn run(&self, kernel: &CudaKernel, p: &mut ReduceOnDevice) -> Result<(), OpError> {
        self.launch(kernel, p)?;
        self.device
            .stream()
            .synchronize()
            .map_err(|e| err("synchronize", e).into())
    }

    fn verify(&self, _kernel: &CudaKernel, p: &mut ReduceOnDevice) -> Result<(), OpError> {
        let out = self
            .device
            .stream()
            .clone_dtoh(&p.out)
            .map_err(|e| err("copy the sum to the host", e))?;
        let got = f64::from(out.first().copied().unwrap_or(f32::NAN));
        if !got.is_finite() || (got - p.reference).abs() > 1e-5 * p.magnitude + 1e-3 {
            return Err(format!("sum {got} differs from {:.6}", p.reference).into());
        }
        Ok(())
    }

    fn measure_policy(&self) -> Fields {
        cuda_policy(&self.device, self.flush_l2)
    }

    fn time(
        &self,
        kernel: &CudaKernel,
        p: &mut ReduceOnDevice,
        iterations: u32,
    ) -> Result<Duration, OpError> {
        let mut flush = p.flush.take();
        let result = time_with_events(&self.device, flush.as_mut(), iterations, || {
            self.launch(kernel, p)
        });
        p.flush = flush;
        Ok(result?)
    }
}
