//! `tunecache keys`: the keys that sign generations and bundles, and the trust policy that
//! names them (cache-remote's `trust`; FORMAT.md, "Signed generations"). `generate` writes a
//! key pair (`NAME.key`, readable by its owner only, and `NAME.pub`); `policy` writes a policy
//! naming public keys and how many must sign, itself signed by the keys of the policy it
//! replaces (a rotation: machines take a new policy only if enough of the old keys signed it).

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde::Serialize;

use cache_remote::trust::{KeyPair, PublicKey, Trust};

use crate::context::Context;
use crate::exit;
use crate::output::{Out, Report};

/// The arguments of `tunecache keys`.
#[derive(Debug, Args)]
pub(crate) struct KeysArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Write a new ed25519 key pair: NAME.key (secret, mode 0600) and NAME.pub
    Generate {
        /// Where, without the extension (a file already there is refused)
        #[arg(short = 'o', long = "output", value_name = "NAME")]
        output: PathBuf,
    },
    /// Write a trust policy: the public keys a fleet trusts and how many must sign
    Policy {
        /// A public key file to trust (repeat)
        #[arg(long = "key", value_name = "PUB", required = true)]
        keys: Vec<PathBuf>,
        /// How many of them must sign a generation
        #[arg(long, default_value_t = 1)]
        threshold: usize,
        /// The policy's version: a rotation has a higher one than the policy it replaces
        #[arg(long, default_value_t = 1)]
        version: u64,
        /// Sign it with this secret key (repeat): for a rotation, enough keys of the current
        /// policy to meet its threshold
        #[arg(long, value_name = "KEY")]
        sign: Vec<PathBuf>,
        /// The policy file to write (a file already there is refused)
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: PathBuf,
    },
}

#[derive(Debug, Serialize)]
struct KeysReport {
    written: Vec<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_id: Option<String>,
}

impl Report for KeysReport {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        if let Some(id) = &self.key_id {
            out.line(format!("key {id}"))?;
        }
        for p in &self.written {
            out.line(format!("wrote {}", p.display()))?;
        }
        Ok(())
    }
}

/// Writes `text` as a new file at `path` (never over one), readable by its owner only when
/// `secret`.
fn write_new(path: &PathBuf, text: &str, secret: bool) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(path)
        .with_context(|| {
            format!(
                "cannot create {} (a file already there is left alone)",
                path.display()
            )
        })?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}

impl KeysArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let report = match self.action {
            Action::Generate { output } => {
                let mut secret = output.clone().into_os_string();
                secret.push(".key");
                let mut public = output.into_os_string();
                public.push(".pub");
                let (secret, public) = (PathBuf::from(secret), PathBuf::from(public));
                if public.exists() {
                    bail!("{} is already there: left alone", public.display());
                }
                let pair = KeyPair::generate()?;
                write_new(&secret, &pair.secret_text(), true)?;
                write_new(&public, &pair.public_text(), false)?;
                KeysReport {
                    written: vec![secret, public],
                    key_id: Some(pair.public().key_id.clone()),
                }
            }
            Action::Policy {
                keys,
                threshold,
                version,
                sign,
                output,
            } => {
                let keys: Vec<PublicKey> = keys
                    .iter()
                    .map(|p| PublicKey::read(p))
                    .collect::<Result<_, _>>()?;
                let signers: Vec<KeyPair> = sign
                    .iter()
                    .map(|p| KeyPair::read(p))
                    .collect::<Result<_, _>>()?;
                let text = Trust::write(version, threshold, keys, &signers)?;
                write_new(&output, &text, false)?;
                KeysReport {
                    written: vec![output],
                    key_id: None,
                }
            }
        };
        out.report(&report, ctx.json)?;
        Ok(exit::OK)
    }
}
