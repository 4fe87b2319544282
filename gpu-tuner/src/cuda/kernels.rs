//! CUDA C sources of the CUDA backend's kernels and the configurations each is compiled for.
//! Every (source, configuration) pair is compiled with NVRTC by the test suite, so a kernel
//! that does not compile fails CI even on machines without a GPU.

/// One kernel source and the name of its entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSource {
    /// The `extern "C" __global__` function.
    pub name: &'static str,
    /// The CUDA C source.
    pub source: &'static str,
}

/// Matmul, one thread per output, no shared memory; block BLOCK×BLOCK.
pub const MATMUL_NAIVE: KernelSource = KernelSource {
    name: "matmul_naive",
    source: r#"
extern "C" __global__ void matmul_naive(const float* A, const float* B, float* C, int M, int N, int K) {
    int row = blockIdx.y * BLOCK + threadIdx.y;
    int col = blockIdx.x * BLOCK + threadIdx.x;
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int p = 0; p < K; ++p) acc += A[row * K + p] * B[p * N + col];
    C[row * N + col] = acc;
}
"#,
};

/// Matmul with TILE×TILE tiles of A and B in shared memory; block TILE×TILE.
pub const MATMUL_TILED: KernelSource = KernelSource {
    name: "matmul_tiled",
    source: r#"
extern "C" __global__ void matmul_tiled(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE + 1];
    int ty = threadIdx.y, tx = threadIdx.x;
    int row = blockIdx.y * TILE + ty;
    int col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int t = 0; t < K; t += TILE) {
        As[ty][tx] = (row < M && t + tx < K) ? A[row * K + t + tx] : 0.0f;
        Bs[ty][tx] = (col < N && t + ty < K) ? B[(t + ty) * N + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < TILE; ++i) acc += As[ty][i] * Bs[i][tx];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}
"#,
};

/// Tiled matmul where each thread computes WPT outputs of a column (register blocking);
/// block TILE×(TILE/WPT).
pub(crate) const MATMUL_COARSE: KernelSource = KernelSource {
    name: "matmul_coarse",
    source: r#"
extern "C" __global__ void matmul_coarse(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE + 1];
    const int RTS = TILE / WPT;
    int tx = threadIdx.x, ty = threadIdx.y;
    int col = blockIdx.x * TILE + tx;
    int row0 = blockIdx.y * TILE + ty;
    float acc[WPT];
#pragma unroll
    for (int w = 0; w < WPT; ++w) acc[w] = 0.0f;
    for (int t = 0; t < K; t += TILE) {
#pragma unroll
        for (int w = 0; w < WPT; ++w) {
            int r = row0 + w * RTS;
            int ly = ty + w * RTS;
            As[ly][tx] = (r < M && t + tx < K) ? A[r * K + t + tx] : 0.0f;
            Bs[ly][tx] = (col < N && t + ly < K) ? B[(t + ly) * N + col] : 0.0f;
        }
        __syncthreads();
        for (int i = 0; i < TILE; ++i) {
            float b = Bs[i][tx];
#pragma unroll
            for (int w = 0; w < WPT; ++w) acc[w] += As[ty + w * RTS][i] * b;
        }
        __syncthreads();
    }
#pragma unroll
    for (int w = 0; w < WPT; ++w) {
        int r = row0 + w * RTS;
        if (r < M && col < N) C[r * N + col] = acc[w];
    }
}
"#,
};

/// Sum with a grid-stride loop and a shared-memory tree per block of BLOCK threads.
pub(crate) const REDUCE_TREE: KernelSource = KernelSource {
    name: "reduce_tree",
    source: r#"
extern "C" __global__ void reduce_tree(const float* x, float* out, long long n) {
    __shared__ float s[BLOCK];
    float acc = 0.0f;
    for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (long long)gridDim.x * BLOCK) acc += x[i];
    s[threadIdx.x] = acc;
    __syncthreads();
    for (int stride = BLOCK / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, s[0]);
}
"#,
};

/// Sum with a grid-stride loop and warp shuffles; BLOCK threads per block.
pub(crate) const REDUCE_SHUFFLE: KernelSource = KernelSource {
    name: "reduce_shuffle",
    source: r#"
extern "C" __global__ void reduce_shuffle(const float* x, float* out, long long n) {
    __shared__ float warp_sums[BLOCK / 32];
    float acc = 0.0f;
    for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (long long)gridDim.x * BLOCK) acc += x[i];
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = (lane < BLOCK / 32) ? warp_sums[lane] : 0.0f;
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
        if (lane == 0) atomicAdd(out, acc);
    }
}
"#,
};

/// Every kernel with every configuration the backend compiles it for, as `-D` defines.
pub fn all_configs() -> Vec<(KernelSource, Vec<(&'static str, i64)>)> {
    let mut out = vec![];
    for block in [8, 16, 32] {
        out.push((MATMUL_NAIVE, vec![("BLOCK", block)]));
    }
    for tile in [8, 16, 32] {
        out.push((MATMUL_TILED, vec![("TILE", tile)]));
    }
    for wpt in [2, 4, 8] {
        out.push((MATMUL_COARSE, vec![("TILE", 32), ("WPT", wpt)]));
    }
    for block in [64, 128, 256, 512, 1024] {
        out.push((REDUCE_TREE, vec![("BLOCK", block)]));
    }
    for block in [128, 256, 512, 1024] {
        out.push((REDUCE_SHUFFLE, vec![("BLOCK", block)]));
    }
    out
}
