//! The CUDA backend: kernels compiled by NVRTC per configuration, kept as PTX in the artifact
//! store, loaded once per process, and timed with CUDA events on a stream.
//!
//! cudarc loads libcuda and libnvrtc at run time and panics if they are missing, so nothing
//! here touches the driver or NVRTC before [`driver_available`] or [`nvrtc_available`] said it
//! may. [`Device::open`] checks both.

mod error;
pub mod kernels;
mod ops;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cache_core::ArtifactStore;
use cache_core::cache_format::{Fields, Scope, Value};
use cudarc::driver::sys::{CUdevice_attribute, CUresult};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};

pub use error::CudaError;
pub use kernels::KernelSource;
pub use ops::{CudaKernel, CudaMatmul, CudaReduce};

/// Whether libcuda can be loaded (an NVIDIA driver is installed). Never panics.
pub fn driver_available() -> Result<(), CudaError> {
    // SAFETY: only tries to dlopen the library by its usual names.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::NoDriver)
    }
}

/// Whether libnvrtc can be loaded. Never panics.
pub fn nvrtc_available() -> Result<(), CudaError> {
    // SAFETY: only tries to dlopen the library by its usual names.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::NoNvrtc)
    }
}

/// Whether CUDA can be used here: both libraries, a working driver, and a device.
pub fn usable() -> Result<(), CudaError> {
    driver_available()?;
    nvrtc_available()?;
    cudarc::driver::result::init().map_err(|e| CudaError::driver("cuInit", e))?;
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(()),
        Ok(_) => Err(CudaError::NoDevice),
        Err(e) => Err(CudaError::driver("cuDeviceGetCount", e)),
    }
}

/// The NVRTC version as (major, minor). Call only after [`nvrtc_available`].
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    nvrtc_available()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked above); the pointers are valid for the call.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if status == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        Ok((major, minor))
    } else {
        Err(CudaError::Nvrtc {
            call: "nvrtcVersion".into(),
            detail: format!("{status:?}"),
        })
    }
}

/// The NVRTC options for a kernel configuration: the architecture, then one `-D` per value.
pub fn options(arch: &str, config: &[(&str, i64)]) -> Vec<String> {
    let mut out = vec![format!("--gpu-architecture={arch}")];
    out.extend(config.iter().map(|(k, v)| format!("-D{k}={v}")));
    out
}

/// Compiles one kernel configuration to PTX text. Call only after [`nvrtc_available`].
pub fn compile(
    kernel: &KernelSource,
    config: &[(&str, i64)],
    arch: &str,
) -> Result<String, CudaError> {
    nvrtc_available()?;
    let opts = CompileOptions {
        options: options(arch, config),
        name: Some(format!("{}.cu", kernel.name)),
        ..Default::default()
    };
    match compile_ptx_with_opts(kernel.source, opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(cudarc::nvrtc::CompileError::CompileError { log, options, .. }) => {
            Err(CudaError::Compile {
                kernel: kernel.name.to_owned(),
                options,
                log: log.to_string_lossy().into_owned(),
            })
        }
        Err(e) => Err(CudaError::Nvrtc {
            call: format!("compile {}", kernel.name),
            detail: e.to_string(),
        }),
    }
}

/// The fingerprint of a kernel's source text (SHA-256 based, 128 bits).
pub(crate) fn source_fingerprint(kernel: &KernelSource) -> cache_core::cache_format::Fingerprint {
    cache_core::cache_format::Fingerprint::digest(
        b"tunecache/kernel-source/1\0",
        kernel.source.as_bytes(),
    )
}

/// Compiles kernels through an artifact store: the PTX of a (source, options, architecture,
/// NVRTC version, kernel, configuration) is compiled once, ever, on a machine.
#[derive(Debug)]
pub struct Compiler {
    artifacts: Option<ArtifactStore>,
    nvrtc: (i32, i32),
    compiled: AtomicU64,
    reused: AtomicU64,
}

impl Compiler {
    /// A compiler using `artifacts` (or compiling every time without one).
    pub fn new(artifacts: Option<ArtifactStore>) -> Result<Self, CudaError> {
        Ok(Compiler {
            artifacts,
            nvrtc: nvrtc_version()?,
            compiled: AtomicU64::new(0),
            reused: AtomicU64::new(0),
        })
    }

    /// The artifact key of a kernel configuration: every input of the compilation.
    pub fn key(
        &self,
        kernel: &KernelSource,
        config: &[(&str, i64)],
        arch: &str,
    ) -> cache_core::cache_format::Fingerprint {
        ArtifactStore::key(&Fields::from([
            (
                "source".to_owned(),
                Value::from(source_fingerprint(kernel).to_hex()),
            ),
            ("options".to_owned(), Value::from(options(arch, config))),
            ("arch".to_owned(), Value::from(arch)),
            (
                "nvrtc".to_owned(),
                Value::from(format!("{}.{}", self.nvrtc.0, self.nvrtc.1)),
            ),
            ("kernel".to_owned(), Value::from(kernel.name)),
            (
                "config".to_owned(),
                Value::Map(
                    config
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), Value::Int(*v)))
                        .collect(),
                ),
            ),
        ]))
    }

    /// The PTX of a kernel configuration, from the artifact store or compiled now.
    pub fn ptx(
        &self,
        kernel: &KernelSource,
        config: &[(&str, i64)],
        arch: &str,
    ) -> Result<String, CudaError> {
        let key = self.key(kernel, config, arch);
        if let Some(store) = &self.artifacts
            && let Ok(Some(bytes)) = store.get(&key)
            && let Ok(text) = String::from_utf8(bytes)
        {
            self.reused.fetch_add(1, Ordering::Relaxed);
            return Ok(text);
        }
        let ptx = compile(kernel, config, arch)?;
        self.compiled.fetch_add(1, Ordering::Relaxed);
        if let Some(store) = &self.artifacts
            && let Err(e) = store.put(&key, ptx.as_bytes())
        {
            tracing::warn!("tunecache: cannot keep compiled PTX: {e}");
        }
        Ok(ptx)
    }

    /// (compiled by NVRTC, taken from the artifact store) so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.compiled.load(Ordering::Relaxed),
            self.reused.load(Ordering::Relaxed),
        )
    }
}

/// A kernel name and its configuration.
type FunctionId = (String, Vec<(String, i64)>);

/// An opened CUDA device: context, stream, what the scope records, and loaded kernels.
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
    cc: (i32, i32),
    sm_count: i32,
    l2_bytes: i32,
    driver: i32,
    compiler: Compiler,
    functions: Mutex<HashMap<FunctionId, CudaFunction>>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("cc", &self.cc)
            .field("sm_count", &self.sm_count)
            .finish()
    }
}

impl Device {
    /// Opens device `ordinal` after checking that CUDA is usable ([`usable`]).
    pub fn open(
        ordinal: usize,
        artifacts: Option<ArtifactStore>,
    ) -> Result<Arc<Device>, CudaError> {
        usable()?;
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| CudaError::driver(format!("open device {ordinal}"), e))?;
        let stream = ctx.default_stream();
        let attr = |a: CUdevice_attribute| {
            ctx.attribute(a)
                .map_err(|e| CudaError::driver(format!("cuDeviceGetAttribute({a:?})"), e))
        };
        let mut driver = 0;
        // SAFETY: the driver library is present and initialised (usable() above).
        let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) };
        if status != CUresult::CUDA_SUCCESS {
            return Err(CudaError::driver("cuDriverGetVersion", status));
        }
        Ok(Arc::new(Device {
            name: ctx
                .name()
                .map_err(|e| CudaError::driver("cuDeviceGetName", e))?,
            cc: ctx
                .compute_capability()
                .map_err(|e| CudaError::driver("compute capability", e))?,
            sm_count: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            l2_bytes: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
            driver,
            compiler: Compiler::new(artifacts)?,
            stream,
            ctx,
            functions: Mutex::new(HashMap::new()),
        }))
    }

    /// The NVRTC target architecture, e.g. `compute_90`.
    pub fn arch(&self) -> String {
        format!("compute_{}{}", self.cc.0, self.cc.1)
    }

    /// The scope of measurements on this device: name, compute capability, SM count, driver,
    /// NVRTC and this library's versions (the last three volatile: an upgrade re-times the
    /// stored best instead of re-tuning).
    pub fn scope(&self) -> Scope {
        let (nv_major, nv_minor) = self.compiler.nvrtc;
        Scope::new(Fields::from([
            ("backend".to_owned(), Value::from("cuda")),
            ("device".to_owned(), Value::from(self.name.as_str())),
            (
                "cc".to_owned(),
                Value::from(format!("{}.{}", self.cc.0, self.cc.1)),
            ),
            ("sm_count".to_owned(), Value::Int(i64::from(self.sm_count))),
            (
                "driver".to_owned(),
                Value::from(format!(
                    "{}.{}",
                    self.driver / 1000,
                    (self.driver % 1000) / 10
                )),
            ),
            (
                "nvrtc".to_owned(),
                Value::from(format!("{nv_major}.{nv_minor}")),
            ),
            (
                "library".to_owned(),
                Value::from(concat!("gpu-tuner ", env!("CARGO_PKG_VERSION"))),
            ),
        ]))
    }

    /// The L2 cache size in bytes (for flushing it between samples).
    pub fn l2_bytes(&self) -> usize {
        self.l2_bytes.max(0) as usize
    }

    /// The stream kernels run and are timed on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The compiler (and its artifact counts).
    pub fn compiler(&self) -> &Compiler {
        &self.compiler
    }

    /// A loaded function for a kernel configuration: compiled (or taken from the artifact
    /// store) and loaded once per process.
    pub fn function(
        &self,
        kernel: &KernelSource,
        config: &[(&str, i64)],
    ) -> Result<CudaFunction, CudaError> {
        let id = (
            kernel.name.to_owned(),
            config
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect::<Vec<_>>(),
        );
        if let Some(f) = self
            .functions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
        {
            return Ok(f.clone());
        }
        let ptx = self.compiler.ptx(kernel, config, &self.arch())?;
        let module = self
            .ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(|e| CudaError::Load {
                kernel: kernel.name.to_owned(),
                detail: format!("the PTX does not load: {e:?}"),
            })?;
        let function = module
            .load_function(kernel.name)
            .map_err(|e| CudaError::Load {
                kernel: kernel.name.to_owned(),
                detail: format!("no such function in its module: {e:?}"),
            })?;
        self.functions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, function.clone());
        Ok(function)
    }
}
