//! One module per command: its arguments (`#[derive(Args)]`), its `run(self, ctx, out)`, and
//! the typed report it renders as text or JSON.

pub(crate) mod export;
pub(crate) mod get;
pub(crate) mod import;
pub(crate) mod list;
pub(crate) mod migrate;
pub(crate) mod put;
pub(crate) mod show;
pub(crate) mod stats;
pub(crate) mod tune;
pub(crate) mod verify;

use crate::args::Command;
use crate::context::Context;
use crate::output::Out;

/// Runs one command; returns its exit code.
pub(crate) fn dispatch(command: Command, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
    match command {
        Command::Tune(args) => args.run(ctx, out),
        Command::Show(args) => args.run(ctx, out),
        Command::Stats(args) => args.run(ctx, out),
        Command::List(args) => args.run(ctx, out),
        Command::Get(args) => args.run(ctx, out),
        Command::Put(args) => args.run(ctx, out),
        Command::Verify(args) => args.run(ctx, out),
        Command::Export(args) => args.run(ctx, out),
        Command::Migrate(args) => args.run(ctx, out),
        Command::Import(args) => args.run(ctx, out),
    }
}
