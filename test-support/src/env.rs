//! A clean environment for the processes tests start: the developer's own `TUNECACHE_*`
//! settings (a cache directory, `TUNECACHE_DISABLE`, a log filter) must not change a test.

use std::process::Command;

/// Removes every `TUNECACHE_*` variable from what `cmd` inherits.
pub fn clean(cmd: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        let name_text = name.to_string_lossy();
        if name_text.starts_with("TUNECACHE_") || name_text.starts_with("AWS_") {
            cmd.env_remove(name);
        }
    }
    cmd
}
