//! `tunecache completions SHELL` and `tunecache man -o DIR`: shell completions and manual
//! pages generated from the command line's own definitions (clap_complete, clap_mangen), so
//! they cannot drift from it. `cargo xtask dist` ships both.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, CommandFactory};
use serde::Serialize;

use super::Cli;
use crate::context::Context;
use crate::exit;
use crate::output::{Out, Report, say};

/// The arguments of `tunecache completions`.
#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

impl CompletionsArgs {
    pub(crate) fn run(self, _ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let mut script = Vec::new();
        clap_complete::generate(self.shell, &mut Cli::command(), "tunecache", &mut script);
        out.generated(&String::from_utf8_lossy(&script))?;
        Ok(exit::OK)
    }
}

/// The arguments of `tunecache man`.
#[derive(Debug, Args)]
pub(crate) struct ManArgs {
    /// The folder to write the pages in (tunecache.1 and tunecache-COMMAND.1)
    #[arg(long, short = 'o', value_name = "DIR")]
    output: PathBuf,
}

#[derive(Debug, Serialize)]
struct ManReport {
    output: PathBuf,
    pages: Vec<String>,
}

impl Report for ManReport {
    fn text(&self, _out: &mut Out) -> anyhow::Result<()> {
        say(format_args!(
            "wrote {} manual pages to {}",
            self.pages.len(),
            self.output.display()
        ));
        Ok(())
    }
}

impl ManArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        std::fs::create_dir_all(&self.output)
            .with_context(|| format!("cannot create {}", self.output.display()))?;
        let top = Cli::command();
        let mut pages = vec![("tunecache".to_owned(), top.clone())];
        for sub in top.get_subcommands().filter(|s| !s.is_hide_set()) {
            let name = format!("tunecache-{}", sub.get_name());
            pages.push((name.clone(), sub.clone().name(name)));
        }
        let mut written = Vec::new();
        for (name, command) in pages {
            let mut page = Vec::new();
            clap_mangen::Man::new(command)
                .render(&mut page)
                .with_context(|| format!("cannot render the page of {name}"))?;
            let path = self.output.join(format!("{name}.1"));
            cache_core::file::write_atomic(&path, &page)
                .with_context(|| format!("cannot write {}", path.display()))?;
            written.push(format!("{name}.1"));
        }
        let report = ManReport {
            output: self.output,
            pages: written,
        };
        out.item(&report, ctx.json)?;
        Ok(exit::OK)
    }
}
