//! What every command needs, resolved in one place: the cache file, the application, whether
//! to print JSON, and the embedding tool's configuration.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use cache_core::{Cache, CacheBuilder, GateVerdict, Inspection, Mode, Switches, inspect};
use cache_format::{Limits, Scope};
use cache_migrate::Migrations;

use crate::config::Config;
use crate::options::Global;
use crate::output::say;

/// The resolved global options.
#[derive(Debug)]
pub(crate) struct Context<'a> {
    /// `--app`, if given.
    app_flag: Option<String>,
    cache_file: Option<PathBuf>,
    /// Print JSON instead of text.
    pub(crate) json: bool,
    pub(crate) config: &'a Config,
    /// `TUNECACHE_DISABLE` and `TUNECACHE_READ_ONLY`: commands that write refuse to.
    switches: Switches,
}

impl<'a> Context<'a> {
    pub(crate) fn new(global: &Global, config: &'a Config, switches: Switches) -> Self {
        Context {
            app_flag: global.app.clone(),
            cache_file: global.cache_file.clone(),
            json: global.json,
            config,
            switches,
        }
    }

    /// Fails, before anything is written, if the environment says not to write: `command`
    /// names what was refused.
    pub(crate) fn check_writable(&self, command: &str) -> anyhow::Result<()> {
        let set = if self.switches.disabled {
            "TUNECACHE_DISABLE"
        } else if self.switches.read_only {
            "TUNECACHE_READ_ONLY"
        } else {
            return Ok(());
        };
        bail!(
            "`tunecache {command}` writes the cache, but {set} is set: nothing was written (unset {set} to write; inspecting still works)"
        )
    }

    /// The application: `--app`, else the embedding tool's default.
    pub(crate) fn app(&self) -> String {
        self.app_or(None)
    }

    /// The application: `--app`, else `fallback` (e.g. the one a migration file names), else
    /// the embedding tool's default.
    pub(crate) fn app_or(&self, fallback: Option<&str>) -> String {
        self.app_flag
            .clone()
            .or_else(|| fallback.map(str::to_owned))
            .unwrap_or_else(|| self.config.default_app.clone())
    }

    /// The cache file of `app`: `--cache-file`, else the library's own resolution
    /// (environment, then the default directory). The switches do not hide it: inspecting a
    /// cache works whatever they say.
    pub(crate) fn path_for(&self, app: &str) -> anyhow::Result<PathBuf> {
        if let Some(p) = &self.cache_file {
            return Ok(p.clone());
        }
        let builder = CacheBuilder::new(Migrations::new(app, 1));
        match builder.with_settings(crate::settings().clone()).path() {
            Some(path) => Ok(path),
            None => bail!(
                "no cache file: this system has no cache directory; pass --cache-file PATH or set TUNECACHE_DIR"
            ),
        }
    }

    /// The cache file of the default application.
    pub(crate) fn path(&self) -> anyhow::Result<PathBuf> {
        self.path_for(&self.app())
    }

    /// The registry of `app` that the embedding tool built in, if any.
    pub(crate) fn registry(&self, app: &str) -> Option<&Migrations> {
        self.config.registries.iter().find(|r| r.app() == app)
    }

    /// Reads `path` as stored (no lock, no repair), naming the gate this tool would apply.
    pub(crate) fn inspect(&self, path: &Path) -> anyhow::Result<Inspection> {
        let app = peek_app(path).unwrap_or_else(|| self.app());
        let found = inspect(path, &Limits::default(), self.registry(&app))?;
        if found.snapshot.bytes.is_none() && found.journal.bytes.is_none() {
            bail!("{}: no such cache file", path.display());
        }
        Ok(found)
    }

    /// [`Context::inspect`], with the entries as this build reads them: a file at an older
    /// schema whose migrations this tool knows is shown migrated, as a load would see it, and
    /// a note on stderr says so (the file is not changed).
    pub(crate) fn inspect_as_read(&self, path: &Path) -> anyhow::Result<Inspection> {
        let mut found = self.inspect(path)?;
        let app = found.snapshot.header.as_ref().map(|h| h.app.clone());
        if let (Some(GateVerdict::Migrates { from, to }), Some(registry)) = (
            found.gate.clone(),
            app.as_deref().and_then(|a| self.registry(a)),
        ) {
            found
                .migrate_in_memory(registry, &Limits::default())
                .with_context(|| format!("{}: cannot be read by this build", path.display()))?;
            say(format!(
                "{} is at schema {from}: shown as this build reads it, migrated to schema {to} (the file is unchanged; `tunecache migrate` rewrites it)",
                path.display()
            ));
        }
        Ok(found)
    }

    /// The application and schema of what [`Context::inspect_as_read`] gives for a file: its
    /// snapshot header's, with the schema it is migrated to in memory where this tool knows
    /// the migrations (`None`: no readable snapshot).
    pub(crate) fn version_as_read(&self, found: &Inspection) -> Option<(String, u32)> {
        let header = found.snapshot.header.as_ref()?;
        let schema = match (&found.gate, self.registry(&header.app)) {
            (Some(GateVerdict::Migrates { to, .. }), Some(_)) => *to,
            _ => header.schema,
        };
        Some((header.app.clone(), schema))
    }

    /// Opens `path` for writing at `app` and `schema` (from [`Context::write_target`]),
    /// waiting at most `wait` for the lock and for the save (or the context's
    /// application and `schema` if it is new): the same lock and gate as the library.
    pub(crate) fn open_for_write(
        &self,
        command: &str,
        path: &Path,
        (app, schema): (String, u32),
        scope: Scope,
        wait: Duration,
    ) -> anyhow::Result<Cache> {
        self.check_writable(command)?;
        let cache = Cache::builder(Migrations::new(app, schema))
            .file(path)
            .ignore_env()
            .scope(scope)
            .refresh_interval(None)
            .save_delay(Duration::ZERO)
            // A command-line write waits for its own save, as long as the user allows: for
            // another process's lock, and for the save itself (a large file).
            .lock_timeout(wait)
            .flush_timeout(wait)
            // A compaction that is only due gives way to an append rather than outlast the
            // wait: a process that exits cannot finish it, and would fail every time.
            .compaction_budget(wait / 4)
            .open();
        let health = cache.health();
        if health.mode != Mode::Persistent {
            let reason = health.reason.unwrap_or_else(|| "unknown reason".into());
            bail!("cannot write {}: {reason}", path.display());
        }
        Ok(cache)
    }

    /// The application and schema a write to `path` records in: the file's own, or (a new
    /// file) the context's application and `schema`.
    /// Only the header is read, so this costs the same for any size of cache.
    pub(crate) fn write_target(&self, path: &Path, schema: u32) -> anyhow::Result<(String, u32)> {
        Ok(match peek_header(path) {
            Some(h) => (h.app, h.schema),
            None => (self.app(), schema),
        })
    }

    /// Reads a migration file.
    pub(crate) fn migration_file(&self, file: &Path) -> anyhow::Result<Migrations> {
        // A migration file is small: one past 16 MiB (or a FIFO, a device) is refused unread.
        let bytes = cache_core::file::read_bounded(file, 16 << 20)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let text = String::from_utf8(bytes)
            .with_context(|| format!("{}: not UTF-8 text", file.display()))?;
        Migrations::from_json(&text).with_context(|| format!("{}", file.display()))
    }
}

/// Closes a cache opened for writing and says exactly what happened to `what` (the result,
/// the import) if it was not saved. The process exits next, so a save that did not finish in
/// time does not go on: the message says to run the command again.
pub(crate) fn close(cache: Cache, what: &str, path: &Path) -> anyhow::Result<()> {
    match saving(what, path, || cache.close()) {
        Ok(()) => Ok(()),
        Err(cache_core::StoreError::FlushTimeout(waited)) => bail!(
            "{what} may not be in {}: the save did not finish within {waited:?} (another process may hold the lock, or the file is large); run the command again",
            path.display()
        ),
        Err(e) => {
            Err(anyhow::Error::new(e)
                .context(format!("{what} was not saved to {}", path.display())))
        }
    }
}

/// Runs `save` (a save of `what` to `path`); one that takes a while (a held lock, a large
/// file) says so on stderr after 2 s, then every 10 s, so a waiting user knows it is not stuck.
pub(crate) fn saving<T>(what: &str, path: &Path, save: impl FnOnce() -> T) -> T {
    let (done, finished) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            let started = std::time::Instant::now();
            let mut pause = Duration::from_secs(2);
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(pause)
            {
                say(format!(
                    "still saving {what} to {} ({:.0} s so far)",
                    path.display(),
                    started.elapsed().as_secs_f64()
                ));
                pause = Duration::from_secs(10);
            }
        });
        let result = save();
        drop(done);
        result
    })
}

/// The application named in a cache file's header, read from its first bytes only.
pub(crate) fn peek_app(path: &Path) -> Option<String> {
    peek_header(path).map(|h| h.app)
}

/// A cache file's header, read from its first bytes only (`None` if there is no readable
/// header: no file, not a regular file, damage).
pub(crate) fn peek_header(path: &Path) -> Option<cache_format::Header> {
    use std::io::Read;
    // Only a regular file is opened (opening a FIFO blocks); the inspection that follows
    // names anything else.
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    let mut prefix = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(128 << 10)
        .read_to_end(&mut prefix)
        .ok()?;
    cache_format::peek_header(&prefix, &Limits::default())
        .ok()
        .map(|(_, h)| h)
}
