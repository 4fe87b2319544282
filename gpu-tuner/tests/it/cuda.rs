//! The CUDA backend without a GPU: every kernel source compiles with NVRTC (the PyPI wheel
//! `nvidia-cuda-nvrtc-cu12` provides the library), and the runtime tests decide at run time,
//! loudly, whether a driver and a device are there. In CI (`CI=true`) a missing NVRTC fails.

use gpu_tuner::cuda::{self, KernelSource, kernels};

/// Returns false (after saying why, loudly) if NVRTC cannot be loaded here.
fn nvrtc_or_skip(test: &str) -> bool {
    match cuda::nvrtc_available() {
        Ok(()) => true,
        Err(why) => {
            test_support::skip::missing(
                &format!("NVRTC for {test}"),
                &format!(
                    "{why} (install the nvidia-cuda-nvrtc-cu12 wheel and put its lib folder on LD_LIBRARY_PATH)"
                ),
            );
            false
        }
    }
}

#[test]
fn every_cuda_kernel_compiles_with_nvrtc() {
    if !nvrtc_or_skip("every_cuda_kernel_compiles_with_nvrtc") {
        return;
    }
    let (major, minor) = cuda::nvrtc_version().expect("NVRTC reports its version");
    eprintln!("NVRTC {major}.{minor}");
    // CUDA 13 dropped Volta: NVRTC 13.0 refuses compute_70 ("invalid value for
    // --gpu-architecture"), found on an H200. The oldest architecture asked for is then Turing's.
    let oldest = if major >= 13 {
        "compute_75"
    } else {
        "compute_70"
    };
    let mut compiled = 0;
    for arch in [oldest, "compute_80", "compute_90"] {
        for (kernel, config) in kernels::all_configs() {
            let ptx = cuda::compile(&kernel, &config, arch).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                ptx.contains(&format!(".entry {}", kernel.name)),
                "{} {config:?}: no entry point in the PTX",
                kernel.name
            );
            compiled += 1;
        }
    }
    assert_eq!(compiled, 3 * kernels::all_configs().len());
}

#[test]
fn a_broken_kernel_fails_with_the_compiler_log() {
    if !nvrtc_or_skip("a_broken_kernel_fails_with_the_compiler_log") {
        return;
    }
    let broken = KernelSource {
        name: "broken",
        source: "extern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }",
    };
    let err = cuda::compile(&broken, &[], "compute_80").expect_err("does not compile");
    match &err {
        cuda::CudaError::Compile { kernel, log, .. } => {
            assert_eq!(kernel, "broken");
            assert!(log.contains("undefined_name"), "{err}");
        }
        other => panic!("expected a compile error with its log, got {other:?}"),
    }
}

#[test]
fn compiled_ptx_is_kept_in_the_artifact_store_and_reused() {
    if !nvrtc_or_skip("compiled_ptx_is_kept_in_the_artifact_store_and_reused") {
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let store = || cache_core::ArtifactStore::open(dir.path(), 64 << 20).expect("store");
    let first = cuda::Compiler::new(Some(store())).expect("compiler");
    let ptx = first
        .ptx(&kernels::MATMUL_TILED, &[("TILE", 16)], "compute_80")
        .expect("compiles");
    assert_eq!(first.counts(), (1, 0));
    // A new process (a new compiler) finds it without compiling.
    let second = cuda::Compiler::new(Some(store())).expect("compiler");
    assert_eq!(
        second
            .ptx(&kernels::MATMUL_TILED, &[("TILE", 16)], "compute_80")
            .expect("cached"),
        ptx
    );
    assert_eq!(second.counts(), (0, 1));
    // Another configuration, architecture or source is another artifact.
    assert_ne!(
        second.key(&kernels::MATMUL_TILED, &[("TILE", 32)], "compute_80"),
        second.key(&kernels::MATMUL_TILED, &[("TILE", 16)], "compute_80")
    );
    assert_ne!(
        second.key(&kernels::MATMUL_TILED, &[("TILE", 16)], "compute_90"),
        second.key(&kernels::MATMUL_TILED, &[("TILE", 16)], "compute_80")
    );
    assert_ne!(
        second.key(&kernels::MATMUL_NAIVE, &[("BLOCK", 16)], "compute_80"),
        second.key(&kernels::MATMUL_TILED, &[("TILE", 16)], "compute_80")
    );
}

#[test]
fn checking_for_cuda_never_panics_and_says_why_not() {
    match cuda::usable() {
        Ok(()) => eprintln!("CUDA is usable on this machine"),
        Err(why) => {
            eprintln!("CUDA is not usable here: {why}");
            assert!(!why.to_string().is_empty());
        }
    }
}
