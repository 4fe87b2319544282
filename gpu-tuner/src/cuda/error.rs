//! Why the CUDA backend cannot do something: a missing library, a driver call that failed, a
//! kernel that does not compile.

/// An error of the CUDA backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// libcuda cannot be loaded: no NVIDIA driver is installed.
    #[error("the CUDA driver library (libcuda) is not installed")]
    NoDriver,
    /// libnvrtc cannot be loaded.
    #[error("the NVRTC library (libnvrtc) is not installed or not on LD_LIBRARY_PATH")]
    NoNvrtc,
    /// The driver is there but there is no device to run on.
    #[error("no CUDA device")]
    NoDevice,
    /// A driver call failed.
    #[error("{call} failed: {detail}")]
    Driver {
        /// What was called (`cuInit`, `cuDeviceGetAttribute(...)`, ...).
        call: String,
        /// The driver's error.
        detail: String,
    },
    /// An NVRTC call other than the compilation itself failed.
    #[error("NVRTC {call} failed: {detail}")]
    Nvrtc {
        /// What was called.
        call: String,
        /// NVRTC's error.
        detail: String,
    },
    /// A kernel does not compile; the log says why.
    #[error("NVRTC could not compile {kernel} with {options:?}:\n{log}")]
    Compile {
        /// The kernel.
        kernel: String,
        /// The options it was compiled with.
        options: Vec<String>,
        /// NVRTC's log.
        log: String,
    },
    /// Loading compiled code failed.
    #[error("cannot load {kernel}: {detail}")]
    Load {
        /// The kernel.
        kernel: String,
        /// The driver's error.
        detail: String,
    },
}

impl CudaError {
    pub(crate) fn driver(call: impl Into<String>, detail: impl std::fmt::Debug) -> Self {
        CudaError::Driver {
            call: call.into(),
            detail: format!("{detail:?}"),
        }
    }
}
