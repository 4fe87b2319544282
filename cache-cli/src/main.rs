//! The `tunecache` binary: see the cache-cli library for the commands.

fn main() -> std::process::ExitCode {
    cache_cli::main_with(cache_cli::Config::tunecache())
}
