//! `tunecache generation`: whole-cache generations on the S3 bucket `TUNECACHE_REMOTE` names
//! (cache-remote's `Generations`): publish the cache file as one (`snapshot`, signed with
//! `--sign`), list them, fetch one into the cache's folder, prune old ones. A job pins its
//! ranks to one with `TUNECACHE_GENERATION=<id>` (or `current`): each machine fetches it once
//! and reads it as a tier of its own (with `TUNECACHE_TRUST`, only if its signatures satisfy
//! the policy).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde::Serialize;

use cache_core::BundleWriter;
use cache_core::cache_format::{Limits, now_millis};
use cache_core::cache_migrate::Migrations;
use cache_remote::trust::{KeyPair, Signed, Statement};
use cache_remote::{GenerationError, Generations, S3Remote};

use crate::context::Context;
use crate::damage::Damage;
use crate::exit;
use crate::options::usage;
use crate::output::{Out, Report};

/// The arguments of `tunecache generation`.
#[derive(Debug, Args)]
pub(crate) struct GenerationArgs {
    #[command(subcommand)]
    action: Action,
    /// How long the bucket may take, in seconds (a store that sends nothing is given up on
    /// sooner)
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Publish the cache file as a generation and make it the current one
    Snapshot(SnapshotArgs),
    /// The generations in the bucket, and the current one
    List,
    /// Download a generation (default: the current one) into the cache's folder, verified
    /// whole (and, with TUNECACHE_TRUST, its signatures checked) before it is put in place
    Fetch {
        /// A generation's id (64 hex digits), or `current`
        #[arg(default_value = "current")]
        id: String,
    },
    /// Delete generations older than this many days, never one the pointer names or named in
    /// the last ten minutes
    Prune {
        /// Age in days
        #[arg(long)]
        older_than_days: u64,
    },
}

#[derive(Debug, Args)]
struct SnapshotArgs {
    /// Publish even if the cache is damaged: without what could not be read (each lost block
    /// is said on stderr). Without it, a damaged cache publishes nothing and exits 3
    #[arg(long)]
    allow_damaged: bool,
    /// Sign it with this secret key file (`tunecache keys generate`); repeat for more signers
    #[arg(long, value_name = "KEY")]
    sign: Vec<PathBuf>,
    /// With --sign: how many days the signature is good for
    #[arg(long, value_name = "DAYS", default_value_t = 30)]
    expires_days: u64,
    /// With --sign: the generation's number (default: one more than the current one's); a
    /// machine refuses a number below the highest it verified
    #[arg(long, value_name = "N")]
    number: Option<u64>,
}

#[derive(Debug, Default, Serialize)]
struct GenerationReport {
    bucket: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    current: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    published: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fetched: Option<PathBuf>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    generations: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pruned: Vec<String>,
    /// The keys that signed a published generation, and its number.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    signed_by: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    number: Option<u64>,
    /// A name taken by an object that is not that generation, worked around.
    #[serde(skip_serializing_if = "Option::is_none")]
    squatted: Option<String>,
}

impl Report for GenerationReport {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        let mut lines = vec![format!("generations in {}", self.bucket)];
        if let Some(id) = &self.squatted {
            lines.push(format!(
                "  the name {id} was taken by an object that is not that generation: published \
                 under another name instead"
            ));
        }
        if let Some(id) = &self.published {
            lines.push(format!("  published {id} (now current)"));
        }
        if !self.signed_by.is_empty() {
            lines.push(format!(
                "  signed by {} (number {})",
                self.signed_by.join(", "),
                self.number.unwrap_or(0)
            ));
        }
        if let Some(path) = &self.fetched {
            lines.push(format!("  fetched into {}", path.display()));
        }
        for id in &self.generations {
            let mark = if self.current.as_deref() == Some(id.as_str()) {
                "  (current)"
            } else {
                ""
            };
            lines.push(format!("  {id}{mark}"));
        }
        for id in &self.pruned {
            lines.push(format!("  pruned {id}"));
        }
        for line in lines {
            out.line(line)?;
        }
        Ok(())
    }
}

/// The generations of the bucket `TUNECACHE_REMOTE` names.
pub(crate) fn from_env() -> anyhow::Result<(Generations, String)> {
    let settings = crate::settings();
    let address = settings.get(cache_remote::ENV_REMOTE).ok_or_else(|| {
        usage(format!(
            "`tunecache generation` needs a bucket: set {}=s3://BUCKET/PREFIX",
            cache_remote::ENV_REMOTE
        ))
    })?;
    if !address.trim().starts_with("s3://") {
        return Err(usage(format!(
            "generations live on an S3 bucket; {} is {address:?}",
            cache_remote::ENV_REMOTE
        )));
    }
    let store = S3Remote::open(address.trim(), |name| settings.get(name).map(str::to_owned))?;
    let describe = cache_remote::Remote::describe(&store);
    Ok((Generations::new(store), describe))
}

/// The generation `TUNECACHE_GENERATION` pins (an id, or `current`) for the cache at
/// `cache_file`, fetched (verified) as every pinned process fetches it (cache-remote's
/// `fetch_pinned`, into the one folder); a failure is said and the command goes on without.
pub(crate) fn pinned(cache_file: &Path) -> Option<PathBuf> {
    let id = crate::settings().get(cache_remote::ENV_GENERATION)?.trim();
    if id.is_empty() {
        return None;
    }
    let fetched = from_env().and_then(|(generations, _)| {
        let dir = cache_remote::generation_dir(Some(cache_file))
            .context("no folder to keep generations in")?;
        Ok(cache_remote::fetch_pinned(
            generations.into_store(),
            id,
            &dir,
            Duration::from_secs(300),
            cache_remote::trust::policy_path(crate::settings()).as_deref(),
        )?)
    });
    match fetched {
        Ok(path) => Some(path),
        Err(e) => {
            crate::output::say(format_args!(
                "{}={id} is not used: {e:#}",
                cache_remote::ENV_GENERATION
            ));
            None
        }
    }
}

impl GenerationArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let (generations, bucket) = from_env()?;
        let timeout = Duration::from_secs(self.timeout);
        let mut report = GenerationReport {
            bucket,
            ..GenerationReport::default()
        };
        match self.action {
            Action::Snapshot(args) => {
                if let Some(code) = args.run(ctx, &generations, timeout, &mut report)? {
                    return Ok(code);
                }
            }
            Action::List => {
                report.current = generations.current(timeout).ok();
                report.generations = generations
                    .list(timeout)?
                    .into_iter()
                    .map(|g| g.id)
                    .collect();
            }
            Action::Fetch { id } => {
                let dir = cache_remote::generation_dir(Some(&ctx.path()?))
                    .context("no folder to keep generations in")?;
                report.fetched = Some(cache_remote::fetch_pinned(
                    generations.into_store(),
                    &id,
                    &dir,
                    timeout,
                    cache_remote::trust::policy_path(crate::settings()).as_deref(),
                )?);
            }
            Action::Prune { older_than_days } => {
                // Saturating: a huge number of days is "older than anything", never a wrap
                // round to a short age (or a panic).
                let age = Duration::from_secs(older_than_days.saturating_mul(24 * 3600));
                report.pruned = generations.prune(age, now_millis(), timeout)?;
                report.current = generations.current(timeout).ok();
            }
        }
        out.report(&report, ctx.json)?;
        Ok(exit::OK)
    }
}

impl SnapshotArgs {
    /// Writes the cache as a bundle where this machine keeps generations, signs it if asked,
    /// and publishes it; a name squatted by another object is worked around once, with a
    /// salt in the manifest. `Some(code)`: it stopped (a damaged cache).
    fn run(
        self,
        ctx: &Context<'_>,
        generations: &Generations,
        timeout: Duration,
        report: &mut GenerationReport,
    ) -> anyhow::Result<Option<u8>> {
        let path = ctx.path()?;
        let keys: Vec<KeyPair> = self
            .sign
            .iter()
            .map(|k| KeyPair::read(k))
            .collect::<Result<_, _>>()?;
        let dir = cache_remote::generation_dir(Some(&path))
            .context("no folder to keep generations in")?;
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let number = match (&self.number, keys.is_empty()) {
            (_, true) => 0,
            (Some(n), false) => *n,
            (None, false) => generations.next_number(timeout)?,
        };
        // Reproducible: the same entries give the same bytes, so the same generation; a salt
        // only when the name was squatted.
        for salt in [None, Some(random_salt())] {
            let bundle = dir.join(format!(".snapshot.{}.tcb", std::process::id()));
            let producer = match &salt {
                None => "tunecache generation".to_owned(),
                Some(s) => format!("tunecache generation (salt {s})"),
            };
            let Some((id, manifest)) = self.write(ctx, &path, &bundle, &producer)? else {
                return Ok(Some(exit::PROBLEMS));
            };
            let signed = (!keys.is_empty()).then(|| {
                let created = now_millis() / 1000;
                let statement = Statement::new(
                    id.clone(),
                    manifest.app.clone(),
                    manifest.schema,
                    manifest
                        .scopes
                        .iter()
                        .map(|s| s.fingerprint.clone())
                        .collect(),
                    number,
                    created,
                    created.saturating_add(self.expires_days.saturating_mul(86_400)),
                );
                Signed::sign(&statement, &keys).text()
            });
            match generations.publish(&bundle, signed.as_deref().map(str::as_bytes), timeout) {
                Ok(published) => {
                    let kept = dir.join(format!("{published}.tcb"));
                    if let Some(signed) = &signed {
                        cache_core::file::write_atomic(
                            &dir.join(format!("{published}.tcb.sig")),
                            signed.as_bytes(),
                        )?;
                    }
                    if kept.exists() {
                        let _ = std::fs::remove_file(&bundle);
                    } else {
                        std::fs::rename(&bundle, &kept)
                            .with_context(|| format!("cannot keep {}", kept.display()))?;
                    }
                    report.published = Some(published.clone());
                    report.current = Some(published);
                    report.signed_by = keys.iter().map(|k| k.public().key_id.clone()).collect();
                    report.number = signed.is_some().then_some(number);
                    return Ok(None);
                }
                Err(GenerationError::Squatted { id, .. }) if salt.is_none() => {
                    let _ = std::fs::remove_file(&bundle);
                    crate::output::say(format_args!(
                        "the generation's name {id} is taken by an object that is not it (planted \
                         or damaged): publishing it under another name"
                    ));
                    report.squatted = Some(id);
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&bundle);
                    return Err(e.into());
                }
            }
        }
        bail!("the generation's names were taken twice: nothing was published")
    }

    /// The cache at `path` as the bundle `bundle`; its id and manifest, or `None` when the
    /// cache is damaged and --allow-damaged was not given (said on stderr).
    fn write(
        &self,
        ctx: &Context<'_>,
        path: &Path,
        bundle: &Path,
        producer: &str,
    ) -> anyhow::Result<Option<(String, cache_core::cache_format::bundle::Manifest)>> {
        let found = ctx.inspect_as_read(path)?;
        let Some((app, schema)) = ctx.version_as_read(&found) else {
            bail!("{}: no readable cache to snapshot", path.display());
        };
        let not_written = || format!("the generation of {} was not written", path.display());
        let mut writer =
            BundleWriter::create(bundle, &Migrations::new(app, schema), &Limits::default())
                .with_context(not_written)?;
        let mut walk = found.in_key_order();
        for (_, scope, ns, entry) in walk.by_ref() {
            writer.add(&scope, &ns, &entry).with_context(not_written)?;
        }
        let damage = Damage::of([found.problems.as_slice(), walk.problems()]);
        if damage
            .refuse("the generation", self.allow_damaged)
            .is_some()
        {
            return Ok(None);
        }
        let written = writer.finish(Some(0), producer).with_context(not_written)?;
        let id = cache_remote::generation_id(bundle)?;
        Ok(Some((id, written.manifest)))
    }
}

/// 16 random hex digits (the system's random source, through the time and the process).
fn random_salt() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}
