//! Progress on long commands: a bar (or, where the amount of work is unknown, a spinner with
//! the count and rate) on stderr, shown only when stderr is a terminal and the work has lasted
//! [`DELAY`]; nothing otherwise, and nothing with `--json`. `TUNECACHE_PROGRESS=always` draws
//! it whatever stderr is (tests, `script` logs), `never` never.
//!
//! A bar ends cleanly: its line is cleared when the work ends, fails or is interrupted
//! (Ctrl-C: see [`crate::interrupt`]), so what follows starts on a clean line.

use std::io::Write as _;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};
use serde::Serialize;

/// How long work runs before its bar appears.
pub(crate) const DELAY: Duration = Duration::from_secs(1);

/// `TUNECACHE_PROGRESS`.
pub(crate) const ENV_PROGRESS: &str = "TUNECACHE_PROGRESS";

/// When bars are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// When stderr is a terminal (the default).
    Auto,
    /// Always (`TUNECACHE_PROGRESS=always`).
    Always,
    /// Never (`TUNECACHE_PROGRESS=never`).
    Never,
}

impl Mode {
    /// `TUNECACHE_PROGRESS`'s mode; a value it does not know is said once on stderr and
    /// taken as `auto`.
    pub(crate) fn from_env() -> Mode {
        static SAID: std::sync::Once = std::sync::Once::new();
        let value = crate::settings().get_os(ENV_PROGRESS);
        Mode::parse(value.as_ref().map(|v| v.to_string_lossy()).as_deref()).unwrap_or_else(|e| {
            SAID.call_once(|| crate::output::say(format_args!("ignoring {ENV_PROGRESS}: {e}")));
            Mode::Auto
        })
    }

    /// The mode a value of `TUNECACHE_PROGRESS` asks for (pure, in any case); unset or empty
    /// is `auto`.
    pub(crate) fn parse(value: Option<&str>) -> Result<Mode, String> {
        let Some(value) = value.map(str::trim) else {
            return Ok(Mode::Auto);
        };
        match value.to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Mode::Auto),
            "always" => Ok(Mode::Always),
            "never" => Ok(Mode::Never),
            _ => Err(format!("{value:?} is not one of always, never, auto")),
        }
    }
}

/// Whether a bar is drawn now (pure): never with `--json` or `never`; with `always` or on a
/// terminal, once the work has run [`DELAY`].
pub(crate) fn drawn(mode: Mode, terminal: bool, json: bool, elapsed: Duration) -> bool {
    let wanted = match mode {
        Mode::Never => false,
        Mode::Always => true,
        Mode::Auto => terminal && !json,
    };
    wanted && !json && elapsed >= DELAY
}

/// What a long command reports of its pace (in `--json` summaries).
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Pace {
    /// Units of work done (entries, or bytes where said).
    pub(crate) done: u64,
    pub(crate) seconds: f64,
    pub(crate) per_second: f64,
}

impl Pace {
    /// `done` units of work since `start`.
    pub(crate) fn since(start: Instant, done: u64) -> Pace {
        let seconds = start.elapsed().as_secs_f64();
        Pace {
            done,
            seconds,
            per_second: if seconds > 0.0 {
                done as f64 / seconds
            } else {
                0.0
            },
        }
    }
}

/// Progress of one piece of work (see the module docs).
#[derive(Debug)]
pub(crate) struct Progress {
    bar: ProgressBar,
    what: String,
    total: Option<u64>,
    bytes: bool,
    start: Instant,
    mode: Mode,
    terminal: bool,
    json: bool,
    shown: bool,
    done: u64,
}

impl Progress {
    /// Progress of `what` (e.g. "importing"), out of `total` if known; `bytes`: the units
    /// are bytes (shown as sizes).
    pub(crate) fn new(what: &str, total: Option<u64>, bytes: bool, json: bool) -> Progress {
        Progress {
            bar: ProgressBar::hidden(),
            what: what.to_owned(),
            total,
            bytes,
            start: Instant::now(),
            mode: Mode::from_env(),
            terminal: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            json,
            shown: false,
            done: 0,
        }
    }

    /// `n` more units done.
    pub(crate) fn advance(&mut self, n: u64) {
        self.done += n;
        if !self.shown && drawn(self.mode, self.terminal, self.json, self.start.elapsed()) {
            self.show();
        }
        if self.shown {
            self.bar.set_position(self.done);
        }
    }

    fn show(&mut self) {
        let units = if self.bytes {
            "{bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)"
        } else {
            "{human_pos}/{human_len} ({per_sec}, {eta} left)"
        };
        let template = match (self.total, self.bytes) {
            (Some(_), _) => format!("{{msg}} [{{bar:30}}] {units}"),
            (None, true) => "{spinner} {msg} {bytes} ({bytes_per_sec}, {elapsed})".to_owned(),
            (None, false) => "{spinner} {msg} {human_pos} ({per_sec}, {elapsed})".to_owned(),
        };
        let bar = ProgressBar::with_draw_target(self.total, draw_target(self.mode));
        bar.set_style(
            ProgressStyle::with_template(&template)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_message(self.what.clone());
        bar.set_position(self.done);
        bar.enable_steady_tick(Duration::from_millis(200));
        self.bar = bar;
        self.shown = true;
    }

    /// Ends it (the bar's line cleared); returns the pace.
    pub(crate) fn finish(mut self) -> Pace {
        self.clear();
        Pace::since(self.start, self.done)
    }

    fn clear(&mut self) {
        if self.shown {
            self.bar.finish_and_clear();
            self.shown = false;
        }
    }
}

impl Drop for Progress {
    /// A bar of work that failed or was interrupted is cleared too.
    fn drop(&mut self) {
        self.clear();
    }
}

/// Runs `work`, which reports no progress of its own (one call into the library: a
/// migration, a verification), with a spinner saying `what` and the time it has taken once it
/// has run [`DELAY`], where bars are drawn; cleared when it returns.
pub(crate) fn during<T>(what: &str, json: bool, work: impl FnOnce() -> T) -> T {
    let mode = Mode::from_env();
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    if !drawn(mode, terminal, json, DELAY) {
        return work();
    }
    let (done, wait) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            if wait.recv_timeout(DELAY) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                return;
            }
            let bar = ProgressBar::with_draw_target(None, draw_target(mode));
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.set_message(what.to_owned());
            bar.enable_steady_tick(Duration::from_millis(200));
            let _ = wait.recv();
            bar.finish_and_clear();
        });
        let out = work();
        drop(done);
        out
    })
}

/// stderr, or, with `always`, stderr even when it is not a terminal.
fn draw_target(mode: Mode) -> ProgressDrawTarget {
    if mode == Mode::Always && !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ProgressDrawTarget::term_like(Box::new(Forced))
    } else {
        ProgressDrawTarget::stderr()
    }
}

/// stderr drawn on as if it were an 80-column terminal.
#[derive(Debug)]
struct Forced;

impl Forced {
    fn put(&self, s: &str) -> std::io::Result<()> {
        let mut err = std::io::stderr().lock();
        err.write_all(s.as_bytes())?;
        err.flush()
    }
}

impl TermLike for Forced {
    fn width(&self) -> u16 {
        80
    }
    fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
        self.put(&format!("\x1b[{n}A"))
    }
    fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
        self.put(&format!("\x1b[{n}B"))
    }
    fn move_cursor_right(&self, n: usize) -> std::io::Result<()> {
        self.put(&format!("\x1b[{n}C"))
    }
    fn move_cursor_left(&self, n: usize) -> std::io::Result<()> {
        self.put(&format!("\x1b[{n}D"))
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.put(&format!("{s}\n"))
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.put(s)
    }
    fn clear_line(&self) -> std::io::Result<()> {
        self.put("\r\x1b[2K")
    }
    fn flush(&self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// A reader that counts what is read through it into a [`Progress`] and stops with an error
/// once Ctrl-C was pressed ([`crate::interrupt::requested`]).
pub(crate) struct Counting<R> {
    inner: R,
    progress: std::rc::Rc<std::cell::RefCell<Progress>>,
}

impl<R> Counting<R> {
    pub(crate) fn new(inner: R, progress: std::rc::Rc<std::cell::RefCell<Progress>>) -> Self {
        Counting { inner, progress }
    }
}

impl<R: std::io::Read> std::io::Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        crate::interrupt::check_io()?;
        let n = self.inner.read(buf)?;
        self.progress.borrow_mut().advance(n as u64);
        Ok(n)
    }
}

impl<R: std::io::BufRead> std::io::BufRead for Counting<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        crate::interrupt::check_io()?;
        self.inner.fill_buf()
    }
    fn consume(&mut self, amt: usize) {
        self.inner.consume(amt);
        self.progress.borrow_mut().advance(amt as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_is_drawn_on_a_terminal_after_the_delay_and_never_with_json() {
        let late = DELAY;
        let early = DELAY - Duration::from_millis(1);
        assert!(drawn(Mode::Auto, true, false, late));
        assert!(
            !drawn(Mode::Auto, true, false, early),
            "short work draws nothing"
        );
        assert!(!drawn(Mode::Auto, false, false, late), "not a terminal");
        assert!(!drawn(Mode::Auto, true, true, late), "--json");
        assert!(drawn(Mode::Always, false, false, late), "forced");
        assert!(
            !drawn(Mode::Always, false, true, late),
            "--json wins over always"
        );
        assert!(!drawn(Mode::Never, true, false, late));
    }

    #[test]
    fn progress_modes_parse_and_an_unknown_one_is_an_error_naming_it() {
        assert_eq!(Mode::parse(None), Ok(Mode::Auto));
        assert_eq!(Mode::parse(Some("")), Ok(Mode::Auto));
        assert_eq!(Mode::parse(Some("auto")), Ok(Mode::Auto));
        assert_eq!(Mode::parse(Some(" always ")), Ok(Mode::Always));
        assert_eq!(Mode::parse(Some("never")), Ok(Mode::Never));
        assert_eq!(Mode::parse(Some("ALWAYS")), Ok(Mode::Always), "any case");
        let e = Mode::parse(Some("sometimes")).expect_err("unknown");
        assert!(e.contains("\"sometimes\"") && e.contains("always"), "{e}");
    }

    #[test]
    fn the_pace_counts_what_was_done() {
        let mut p = Progress::new("x", Some(10), false, true);
        p.advance(4);
        p.advance(6);
        let pace = p.finish();
        assert_eq!(pace.done, 10);
        assert!(pace.seconds >= 0.0 && pace.per_second >= 0.0);
    }
}
