//! `tc_cache` and `tc_ns`: opening, closing, flushing a cache and naming its namespaces.
//!
//! Handles are never freed: `tc_close` drops the cache inside and leaves a small closed shell,
//! so a call through a closed handle (from any thread, at any time) is answered `TC_E_CLOSED`
//! instead of reading freed memory. Every shell stays reachable from a global list
//! (`crate::fork`, which also pauses their savers around a `fork()`).

use std::ffi::{c_char, c_int};
use std::io::IsTerminal as _;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use cache_core::cache_format::{Fields, Scope};
use cache_core::cache_migrate::Migrations;
use cache_core::settings::Settings;
use cache_core::{Cache, Mode, Namespace, Store};
use cache_remote::RemoteBuilder as _;

use crate::fields::fields_arg;
use crate::fork;
use crate::memo::ByteMemo;
use crate::status::{
    Failure, TC_E_ARG, TC_E_CLOSED, TC_E_HANDLE, TC_E_NULL, TC_E_STORE, TC_E_TIMEOUT, TC_OK, guard,
};
use crate::text::{opt_str_arg, str_arg};

const CACHE_MAGIC: u64 = u64::from_be_bytes(*b"tccache1");
const NS_MAGIC: u64 = u64::from_be_bytes(*b"tcnames1");

/// Options of `tc_open`. Zero every field (`memset`, or `= {0}`) and set `size` to
/// `sizeof(tc_options)`; a zero field means "the default". Later versions only append fields:
/// a caller compiled against an older, shorter struct is read as far as its `size`, the rest
/// taken as the default.
#[repr(C)]
#[derive(Debug)]
pub struct tc_options {
    /// `sizeof(tc_options)` as the caller compiled it.
    pub size: u32,
    /// Non-zero: never write the file (read it and other processes' updates only).
    pub read_only: u32,
    /// How long after a change the background saver writes, in milliseconds (0: default).
    pub save_delay_ms: u32,
    /// How long a save or load waits for the file lock, in milliseconds (0: default).
    pub lock_timeout_ms: u32,
    /// A migration file's JSON text (`app`, `current`, `steps`), or null.
    pub migrations_json: *const c_char,
    /// A shared tier's address (`redis://...`, `s3://BUCKET/PREFIX` with the `AWS_*` variables), or
    /// null to read `TUNECACHE_REMOTE`.
    pub remote: *const c_char,
    /// A trust policy file: a generation pinned with `TUNECACHE_GENERATION` is used only if its
    /// signatures satisfy it; null to read `TUNECACHE_TRUST` (none: nothing is checked).
    pub trust: *const c_char,
}

/// An open cache (`tc_open`); closed by `tc_close`. Every function may be called on one handle
/// from any number of threads at once.
#[derive(Debug)]
pub struct tc_cache {
    magic: u64,
    /// The fork generation it was opened in (`crate::fork`).
    generation: u64,
    inner: ArcSwapOption<Cache>,
    namespaces: Mutex<Vec<&'static tc_ns>>,
}

/// A namespace of one cache (`tc_namespace`): valid as long as the process lives; its calls
/// answer `TC_E_CLOSED` once its cache is closed.
#[derive(Debug)]
pub struct tc_ns {
    magic: u64,
    pub(crate) cache: &'static tc_cache,
    pub(crate) ns: Namespace,
    pub(crate) key_size: usize,
    pub(crate) memo: ByteMemo,
}

impl tc_cache {
    /// The open cache, or `TC_E_CLOSED`.
    pub(crate) fn open_cache(&self) -> Result<Arc<Cache>, Failure> {
        if self.generation != fork::generation() {
            return Err(Failure::new(
                TC_E_CLOSED,
                "the cache handle was opened before fork(): a child process opens its own",
            ));
        }
        self.inner
            .load_full()
            .ok_or_else(|| Failure::new(TC_E_CLOSED, "the cache handle was closed"))
    }

    /// The open cache of this process, if any (for the fork hooks).
    pub(crate) fn current(&self) -> Option<Arc<Cache>> {
        if self.generation == fork::generation() {
            self.inner.load_full()
        } else {
            None
        }
    }
}

/// The cache handle at `ptr`, checked.
///
/// # Safety
/// `ptr` is null or was returned by `tc_open`.
pub(crate) unsafe fn cache_arg<'a>(ptr: *const tc_cache) -> Result<&'a tc_cache, Failure> {
    if ptr.is_null() {
        return Err(Failure::new(TC_E_NULL, "the cache handle is null"));
    }
    // SAFETY: shells are never freed, so a pointer tc_open returned is always readable.
    let cache = unsafe { &*ptr };
    if cache.magic != CACHE_MAGIC {
        return Err(Failure::new(TC_E_HANDLE, "not a tc_cache handle"));
    }
    Ok(cache)
}

/// The namespace handle at `ptr`, checked.
///
/// # Safety
/// `ptr` is null or was returned by `tc_namespace`.
pub(crate) unsafe fn ns_arg<'a>(ptr: *const tc_ns) -> Result<&'a tc_ns, Failure> {
    if ptr.is_null() {
        return Err(Failure::new(TC_E_NULL, "the namespace handle is null"));
    }
    // SAFETY: namespace handles are never freed.
    let ns = unsafe { &*ptr };
    if ns.magic != NS_MAGIC {
        return Err(Failure::new(TC_E_HANDLE, "not a tc_ns handle"));
    }
    Ok(ns)
}

/// Sends the core's warnings to stderr (`TUNECACHE_LOG` takes a tracing filter; default
/// `warn`), unless the process already set a tracing subscriber.
fn init_logging(settings: &Settings) {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let asked = settings.get_os("TUNECACHE_LOG").filter(|v| !v.is_empty());
        let text = asked.map(|v| v.to_string_lossy().into_owned());
        let parsed = text.as_deref().map(tracing_subscriber::EnvFilter::try_new);
        let (filter, bad) = match parsed {
            Some(Ok(f)) => (f, None),
            Some(Err(e)) => (tracing_subscriber::EnvFilter::new("warn"), Some(e)),
            None => (tracing_subscriber::EnvFilter::new("warn"), None),
        };
        // Logging must never take the process down: a stderr that cannot be written (a full
        // disk) loses the line. tracing-subscriber would otherwise report the failure with
        // `eprintln!`, which panics, on whichever thread logged (the saver's, too).
        let _ = tracing_subscriber::fmt()
            .log_internal_errors(false)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .with_env_filter(filter)
            .with_target(false)
            .without_time()
            .try_init();
        // A library must open whatever happens: a filter that does not parse is said, once.
        if let (Some(e), Some(text)) = (bad, text) {
            tracing::warn!("tunecache: ignoring TUNECACHE_LOG={text:?}: not a log filter ({e})");
        }
    });
}

fn millis(ms: u32) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(u64::from(ms)))
}

/// # Safety
/// As `tc_open`.
unsafe fn build(
    app: *const c_char,
    schema: u32,
    scope: *const crate::fields::tc_fields,
    path: *const c_char,
    options: *const tc_options,
    settings: Settings,
) -> Result<Cache, Failure> {
    // SAFETY: the pointers are as tc_open documents.
    let app = unsafe { str_arg(app, "app") }?;
    if app.is_empty() {
        return Err(Failure::new(TC_E_ARG, "app must not be empty"));
    }
    let scope = if scope.is_null() {
        Fields::new()
    } else {
        // SAFETY: as documented.
        unsafe { fields_arg(scope, "scope") }?.clone()
    };
    // SAFETY: as documented.
    let path = unsafe { opt_str_arg(path, "path") }?;
    let options = if options.is_null() {
        None
    } else {
        // SAFETY: a tc_options the caller filled, at least its `size` (checked next).
        Some(unsafe { read_options(options) }?)
    };
    let options = options.as_ref();
    let registry = match options.map(|o| o.migrations_json) {
        // SAFETY: as documented.
        Some(text) if !text.is_null() => registry(app, schema, unsafe {
            str_arg(text, "options.migrations_json")
        }?)?,
        _ => Migrations::new(app, schema),
    };
    let mut builder = Cache::builder(registry)
        .with_settings(settings)
        .scope(Scope::new(scope));
    if let Some(path) = path {
        builder = builder.file(path);
    }
    let (mut remote, mut trust) = (None, None);
    if let Some(o) = options {
        builder = builder.read_only(o.read_only != 0);
        if let Some(d) = millis(o.save_delay_ms) {
            builder = builder.save_delay(d);
        }
        if let Some(t) = millis(o.lock_timeout_ms) {
            builder = builder.lock_timeout(t);
        }
        // SAFETY: as documented.
        remote = unsafe { opt_str_arg(o.remote, "options.remote") }?;
        // SAFETY: as documented.
        trust = unsafe { opt_str_arg(o.trust, "options.trust") }?;
    }
    Ok(builder
        .remote_or_warn_trusting(remote, trust.map(std::path::Path::new))
        .open())
}

/// The caller's `tc_options`, as long as its `size` says it is: `size` is read first, then the
/// whole fields it covers are copied (a caller compiled against an older, shorter struct has
/// the defaults for the fields it lacks), never a byte past it. A size that cannot hold `size`
/// itself is refused.
///
/// # Safety
/// `options` points to at least 4 readable bytes, and to `size` bytes of a `tc_options`.
unsafe fn read_options(options: *const tc_options) -> Result<tc_options, Failure> {
    // SAFETY: `size` is the first field, and the caller's struct has it.
    let size = unsafe { std::ptr::read(options.cast::<u32>()) } as usize;
    if size < std::mem::size_of::<u32>() {
        return Err(Failure::new(
            TC_E_ARG,
            format!("options.size is {size}; set it to sizeof(tc_options)"),
        ));
    }
    // The fields the caller's struct holds whole (a size cutting a field leaves it out).
    let ends = [
        std::mem::offset_of!(tc_options, read_only) + 4,
        std::mem::offset_of!(tc_options, save_delay_ms) + 4,
        std::mem::offset_of!(tc_options, lock_timeout_ms) + 4,
        std::mem::offset_of!(tc_options, migrations_json) + std::mem::size_of::<*const c_char>(),
        std::mem::offset_of!(tc_options, remote) + std::mem::size_of::<*const c_char>(),
        std::mem::offset_of!(tc_options, trust) + std::mem::size_of::<*const c_char>(),
    ];
    let whole = ends
        .iter()
        .copied()
        .filter(|end| *end <= size)
        .max()
        .unwrap_or(4);
    let mut out = tc_options {
        size: size as u32,
        read_only: 0,
        save_delay_ms: 0,
        lock_timeout_ms: 0,
        migrations_json: std::ptr::null(),
        remote: std::ptr::null(),
        trust: std::ptr::null(),
    };
    // SAFETY: `whole` bytes of the caller's struct are readable (its size says so) and fit
    // `out`; both are `tc_options` layouts up to there, and `out` is a distinct local.
    unsafe {
        std::ptr::copy_nonoverlapping(
            options.cast::<u8>(),
            std::ptr::from_mut(&mut out).cast::<u8>(),
            whole.min(std::mem::size_of::<tc_options>()),
        );
    }
    Ok(out)
}

fn registry(app: &str, schema: u32, text: &str) -> Result<Migrations, Failure> {
    let registry = Migrations::from_json(text)
        .map_err(|e| Failure::new(TC_E_ARG, format!("options.migrations_json: {e}")))?;
    if registry.app() != app || registry.current() != schema {
        return Err(Failure::new(
            TC_E_ARG,
            format!(
                "the migrations are for {} schema {}, the cache for {app} schema {schema}",
                registry.app(),
                registry.current()
            ),
        ));
    }
    Ok(registry)
}

/// Opens the cache of application `app` at `schema`, for the `scope` fields (null: an empty
/// scope), in the file `path` (null: `$TUNECACHE_FILE`, `$TUNECACHE_DIR/<app>.tcache`, or the
/// user cache directory), with `options` (null: defaults). Writes the handle to `*out`.
///
/// A location that cannot be used does not fail the call: the cache degrades to memory with
/// one warning on stderr (`tc_mode` says so). Fails only for bad arguments.
///
/// # Safety
/// `app` and `path` are NUL-terminated strings (`path` may be null), `scope` null or a live
/// `tc_fields`, `options` null or a filled `tc_options`, `out` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_open(
    app: *const c_char,
    schema: u32,
    scope: *const crate::fields::tc_fields,
    path: *const c_char,
    options: *const tc_options,
    out: *mut *mut tc_cache,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(Failure::new(TC_E_NULL, "out is null"));
        }
        // The environment, read once for this open: the log filter and the cache's settings.
        let settings = Settings::from_env();
        init_logging(&settings);
        // SAFETY: as documented.
        let cache = unsafe { build(app, schema, scope, path, options, settings) }?;
        let shell: &'static tc_cache = Box::leak(Box::new(tc_cache {
            magic: CACHE_MAGIC,
            generation: fork::generation(),
            inner: ArcSwapOption::from_pointee(cache),
            namespaces: Mutex::new(Vec::new()),
        }));
        fork::register(shell);
        // SAFETY: checked non-null; the caller gives a writable pointer.
        unsafe { *out = std::ptr::from_ref(shell).cast_mut() };
        Ok(TC_OK)
    })
}

/// Saves what is pending, stops the background saver and closes the handle: later calls with
/// it (or its namespaces) answer `TC_E_CLOSED`. Closing twice is harmless. `TC_E_STORE` if the
/// last save failed (the handle is closed anyway).
///
/// # Safety
/// `cache` is null or was returned by `tc_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_close(cache: *mut tc_cache) -> c_int {
    guard(|| {
        // SAFETY: as documented.
        let shell = unsafe { cache_arg(cache) }?;
        let Some(cache) = shell.inner.swap(None) else {
            return Ok(TC_OK);
        };
        if shell.generation != fork::generation() {
            // Opened by an ancestor: its saver thread is not in this process.
            std::mem::forget(cache);
            return Ok(TC_OK);
        }
        if cache.health().mode != Mode::Persistent {
            // Nothing to save: it never wrote a file (it said why when it opened).
            drop(cache);
            return Ok(TC_OK);
        }
        let saved = match Arc::try_unwrap(cache) {
            Ok(cache) => cache.close(),
            // Another thread is inside a call with it: save now; the last user drops it.
            Err(shared) => shared.flush(),
        };
        saved
            .map(|()| TC_OK)
            .map_err(|e| Failure::new(TC_E_STORE, e.to_string()))
    })
}

/// Makes everything recorded so far durable, waiting at most `timeout_ms` milliseconds (0:
/// the cache's flush timeout). `TC_E_TIMEOUT` past it (the save goes on in the background),
/// `TC_E_STORE` if it failed.
///
/// # Safety
/// `cache` is null or was returned by `tc_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_flush(cache: *mut tc_cache, timeout_ms: u32) -> c_int {
    guard(|| {
        // SAFETY: as documented.
        let cache = unsafe { cache_arg(cache) }?.open_cache()?;
        let saved = match millis(timeout_ms) {
            Some(t) => cache.flush_within(t),
            None => cache.flush(),
        };
        saved.map(|()| TC_OK).map_err(|e| {
            let code = if matches!(e, cache_core::StoreError::FlushTimeout { .. }) {
                TC_E_TIMEOUT
            } else {
                TC_E_STORE
            };
            Failure::new(code, e.to_string())
        })
    })
}

/// Reads what other processes saved since the last read.
///
/// # Safety
/// `cache` is null or was returned by `tc_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_refresh(cache: *mut tc_cache) -> c_int {
    guard(|| {
        // SAFETY: as documented.
        let cache = unsafe { cache_arg(cache) }?.open_cache()?;
        cache
            .refresh()
            .map(|()| TC_OK)
            .map_err(|e| Failure::new(TC_E_STORE, e.to_string()))
    })
}

/// The cache writes its file.
pub const TC_MODE_PERSISTENT: c_int = 0;
/// The cache reads its file but never writes it.
pub const TC_MODE_READ_ONLY: c_int = 1;
/// The cache keeps results in memory only (asked for, or its location was unusable).
pub const TC_MODE_MEMORY: c_int = 2;

/// What the cache can do: `TC_MODE_PERSISTENT`, `TC_MODE_READ_ONLY` or `TC_MODE_MEMORY`
/// (a negative error code for a bad or closed handle).
///
/// # Safety
/// `cache` is null or was returned by `tc_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_mode(cache: *mut tc_cache) -> c_int {
    guard(|| {
        // SAFETY: as documented.
        let cache = unsafe { cache_arg(cache) }?.open_cache()?;
        Ok(match cache.health().mode {
            Mode::Persistent => TC_MODE_PERSISTENT,
            Mode::ReadOnly => TC_MODE_READ_ONLY,
            Mode::Memory => TC_MODE_MEMORY,
        })
    })
}

/// The number of entries of this cache's scope in memory and in its file.
///
/// # Safety
/// `cache` is null or was returned by `tc_open`; `out` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_len(cache: *mut tc_cache, out: *mut usize) -> c_int {
    guard(|| {
        // SAFETY: as documented.
        let cache = unsafe { cache_arg(cache) }?.open_cache()?;
        if out.is_null() {
            return Err(Failure::new(TC_E_NULL, "out is null"));
        }
        // SAFETY: checked non-null.
        unsafe { *out = cache.len() };
        Ok(TC_OK)
    })
}

/// The namespace `name` (an operation family such as `conv_fwd`: 1 to 512 bytes, no control
/// characters) of `cache`, for byte keys of exactly `key_size` bytes (0: any length). Asking
/// again for the same name and size returns the same handle. Make it once and keep it: the
/// handle stays valid for the life of the process.
///
/// # Safety
/// `cache` is null or was returned by `tc_open`; `name` a NUL-terminated string; `out` valid
/// for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_namespace(
    cache: *mut tc_cache,
    name: *const c_char,
    key_size: usize,
    out: *mut *mut tc_ns,
) -> c_int {
    guard(|| {
        // SAFETY: as documented.
        let shell: &'static tc_cache = unsafe { cache_arg(cache) }?;
        shell.open_cache()?;
        // SAFETY: as documented.
        let name = unsafe { str_arg(name, "the namespace name") }?;
        if out.is_null() {
            return Err(Failure::new(TC_E_NULL, "out is null"));
        }
        let ns = Namespace::new(name).map_err(|e| Failure::new(TC_E_ARG, e.to_string()))?;
        let mut known = shell
            .namespaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let handle = match known.iter().find(|h| h.ns == ns && h.key_size == key_size) {
            Some(h) => *h,
            None => {
                let h: &'static tc_ns = Box::leak(Box::new(tc_ns {
                    magic: NS_MAGIC,
                    cache: shell,
                    ns,
                    key_size,
                    memo: ByteMemo::new(),
                }));
                known.push(h);
                h
            }
        };
        // SAFETY: checked non-null.
        unsafe { *out = std::ptr::from_ref(handle).cast_mut() };
        Ok(TC_OK)
    })
}

/// The version of this C ABI (`TC_ABI_VERSION` of the header it was built with). A caller
/// checks it equals the header's before any other call.
#[unsafe(no_mangle)]
pub extern "C" fn tc_abi_version() -> u32 {
    crate::TC_ABI_VERSION
}
