//! `tunecache remote`: the shared tier named by `TUNECACHE_REMOTE`: check it (`ping`), see
//! what it holds (`stats`), seed it from the cache file (`push`) or the file from it (`pull`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde::Serialize;

use cache_core::cache_format::Fingerprint;
use cache_core::cache_migrate::Migrations;
use cache_core::{AppendOptions, merge_into_file};
use cache_remote::SharedTier;

use crate::context::{Context, saving};
use crate::exit;
use crate::options::{WaitArgs, usage};
use crate::output::{Out, Report, say};
use crate::progress::Pace;

/// The arguments of `tunecache remote`.
#[derive(Debug, Args)]
pub(crate) struct RemoteArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// One round trip to the server; exit 1 if it does not answer
    Ping,
    /// The server, and how many entries it holds for this application and schema
    Stats,
    /// Publish every entry of the cache file to the server, merged with what it holds
    Push(WaitArgs),
    /// Merge every entry the server holds for this application and schema into the file
    Pull(WaitArgs),
}

#[derive(Debug, Serialize)]
struct LeaseHeld {
    key: String,
    holder: String,
}

#[derive(Debug, Serialize)]
struct RemoteReport {
    server: String,
    app: String,
    schema: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    round_trip_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    entries_on_server: Option<usize>,
    /// Fleet leases held now: a key being measured, and by whom.
    #[serde(skip_serializing_if = "Option::is_none")]
    leases_held: Option<Vec<LeaseHeld>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    published: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    already_there: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    not_published: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pulled: Option<usize>,
    /// Keys read by a pull (of `entries_on_server`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pulled_keys: Option<usize>,
    /// Whether a pull read every key before its wait ran out.
    #[serde(skip_serializing_if = "Option::is_none")]
    complete: Option<bool>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    rejected: std::collections::BTreeMap<&'static str, u64>,
    path: PathBuf,
    /// Entries pushed or pulled, and how fast (push and pull only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pace: Option<Pace>,
}

impl RemoteArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let path = ctx.path()?;
        let (app, schema) = ctx.write_target(&path, 1)?;
        let registry = ctx
            .registry(&app)
            .filter(|r| r.current() == schema)
            .cloned()
            .unwrap_or_else(|| Migrations::new(app.clone(), schema));
        if crate::settings().get_os(cache_remote::ENV_REMOTE).is_none() {
            return Err(usage(format!(
                "`tunecache remote` needs a server: set {}=redis://HOST:PORT/DB or s3://BUCKET/PREFIX",
                cache_remote::ENV_REMOTE
            )));
        }
        let Some(tier) = crate::shared::tier(&registry)? else {
            bail!("the shared tier is switched off (TUNECACHE_REMOTE_MODE=off)");
        };
        let mut report = RemoteReport {
            server: tier.describe().to_owned(),
            app,
            schema,
            round_trip_ms: None,
            entries_on_server: None,
            leases_held: None,
            published: None,
            already_there: None,
            not_published: None,
            pulled: None,
            pulled_keys: None,
            complete: None,
            rejected: Default::default(),
            path: path.clone(),
            pace: None,
        };
        let code = match self.action {
            Action::Ping => {
                let rtt = tier
                    .ping(crate::shared::WAIT)
                    .with_context(|| format!("{} does not answer", tier.describe()))?;
                report.round_trip_ms = Some(rtt.as_secs_f64() * 1e3);
                exit::OK
            }
            Action::Stats => {
                let rtt = tier
                    .ping(crate::shared::WAIT)
                    .with_context(|| format!("{} does not answer", tier.describe()))?;
                report.round_trip_ms = Some(rtt.as_secs_f64() * 1e3);
                report.entries_on_server = Some(tier.count(Duration::from_secs(30))?);
                let leases = tier.leases(Duration::from_secs(30))?;
                report.leases_held = Some(
                    leases
                        .into_iter()
                        .map(|(key, holder)| LeaseHeld { key, holder })
                        .collect(),
                );
                exit::OK
            }
            Action::Push(wait) => push(ctx, &tier, &path, wait.wait, &mut report)?,
            Action::Pull(wait) => pull(ctx, &tier, &registry, &path, wait.wait, &mut report)?,
        };
        out.report(&report, ctx.json)?;
        Ok(code)
    }
}

fn push(
    ctx: &Context<'_>,
    tier: &SharedTier,
    path: &Path,
    wait: Duration,
    report: &mut RemoteReport,
) -> anyhow::Result<u8> {
    if !crate::shared::writable() {
        bail!("TUNECACHE_REMOTE_MODE=read: `tunecache remote push` writes to the server");
    }
    // Streamed: the cache's entries in key order, published a few thousand at a time, all
    // within one wait.
    let started = std::time::Instant::now();
    let found = ctx.inspect_as_read(path)?;
    let deadline = cache_core::deadline_from(started, wait);
    let (mut written, mut unchanged, mut left, mut failed) = (0, 0, 0, 0);
    let mut chunk = cache_format::CacheData::new();
    let mut walk = found.in_key_order().peekable();
    while walk.peek().is_some() {
        for (_, scope, ns, entry) in walk.by_ref().take(4096) {
            chunk.insert(&scope, &ns, entry);
        }
        let remaining = deadline.saturating_duration_since(std::time::Instant::now());
        let published = tier
            .publish(&std::mem::take(&mut chunk), remaining)
            .with_context(|| format!("nothing more was published to {}", tier.describe()))?;
        written += published.written;
        unchanged += published.unchanged;
        left += published.left + published.refused as usize;
        failed += published.left;
    }
    report.published = Some(written);
    report.already_there = Some(unchanged);
    report.not_published = Some(left);
    report.pace = Some(Pace::since(started, written + unchanged + left as u64));
    report.rejected = tier.health().rejected;
    Ok(if failed > 0 { exit::ERROR } else { exit::OK })
}

fn pull(
    ctx: &Context<'_>,
    tier: &SharedTier,
    registry: &Migrations,
    path: &Path,
    wait: Duration,
    report: &mut RemoteReport,
) -> anyhow::Result<u8> {
    ctx.check_writable("remote pull")?;
    let started = std::time::Instant::now();
    // Keys this cache lacks are read first: a pull cut short by --wait, run again, goes on
    // where it stopped instead of reading the same keys again.
    let local = if path.exists() {
        Some(ctx.inspect_as_read(path)?)
    } else {
        None
    };
    let lacks = |scope: &Fingerprint, ns: &str, fp: &Fingerprint| {
        local.as_ref().is_none_or(|l| !l.holds(scope, ns, fp))
    };
    let options = AppendOptions {
        lock_timeout: wait,
        ..AppendOptions::default()
    };
    // Each batch is saved as it arrives, so what was downloaded is kept when the wait runs
    // out.
    let pulled = tier
        .pull(wait, lacks, |batch| {
            saving("the pulled entries", path, || {
                merge_into_file(path, registry, batch, &options)
            })
            .map(|_| ())
            .with_context(|| format!("the pulled entries were not saved to {}", path.display()))
        })
        .with_context(|| format!("cannot read {}", tier.describe()))?;
    report.entries_on_server = Some(pulled.keys);
    report.rejected = pulled.rejected.clone();
    let n = pulled.entries;
    if let Some(e) = pulled.stopped.as_ref().filter(|_| pulled.read == 0) {
        // Nothing read: running it again with the same wait would read nothing again.
        say(format_args!(
            "read none of the server's {} keys within --wait {:.3} s ({e}): listing them and \
             finding those this cache lacks took the whole wait; run it again with a longer \
             --wait",
            pulled.keys,
            wait.as_secs_f64()
        ));
    } else if let Some(e) = &pulled.stopped {
        say(format_args!(
            "pulled {} of the server's {} keys before stopping ({e}); what was pulled is saved: \
             run `tunecache remote pull` again to go on (keys this cache lacks are read first)",
            pulled.read, pulled.keys
        ));
    } else if n == 0 && report.rejected.is_empty() {
        say("the server holds nothing for this application and schema");
    } else if n == 0 {
        say(format_args!(
            "the server's {} value(s) for this application and schema were all refused",
            pulled.keys
        ));
    }
    report.pulled = Some(n);
    report.pulled_keys = Some(pulled.read);
    report.complete = Some(pulled.stopped.is_none());
    report.pace = Some(Pace::since(started, n as u64));
    Ok(if pulled.stopped.is_some() {
        exit::ERROR
    } else {
        exit::OK
    })
}

impl Report for RemoteReport {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        out.line(format!(
            "shared tier {} (application {}, schema {})",
            self.server, self.app, self.schema
        ))?;
        if let Some(ms) = self.round_trip_ms {
            out.line(format!("  answers in {ms:.2} ms"))?;
        }
        if let Some(n) = self.entries_on_server {
            out.line(format!("  {n} entries on the server"))?;
        }
        if let Some(leases) = &self.leases_held {
            out.line(format!(
                "  {} keys being measured now (fleet leases)",
                leases.len()
            ))?;
            for l in leases {
                out.line(format!("    {} by {}", l.key, l.holder))?;
            }
        }
        if let (Some(w), Some(u)) = (self.published, self.already_there) {
            out.line(format!(
                "  published {w}, already there {u}, not published {}",
                self.not_published.unwrap_or(0)
            ))?;
        }
        if let Some(n) = self.pulled {
            out.line(format!("  pulled {n} entries into {}", self.path.display()))?;
        }
        if let (Some(read), Some(false), Some(keys)) =
            (self.pulled_keys, self.complete, self.entries_on_server)
        {
            out.line(format!(
                "  read {read} of {keys} keys before stopping: run it again to go on"
            ))?;
        }
        for (why, n) in &self.rejected {
            out.line(format!("  refused {n}: {why}"))?;
        }
        Ok(())
    }
}
