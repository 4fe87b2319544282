//! A real headless browser (Debian's `chromium`) for pages a person looks at: the DOM after
//! the page loaded, a screenshot, and what the page said on its console. Each run gets a new
//! profile folder and the flags that keep Chromium off the network, and is killed past a
//! deadline rather than waited for forever.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one browser run may take.
const DEADLINE: Duration = Duration::from_secs(90);

/// Debian's Chromium, found on this machine.
#[derive(Debug)]
pub struct Browser {
    exe: PathBuf,
}

/// What one run of the browser left.
#[derive(Debug)]
pub struct Run {
    /// Standard output (the DOM, for [`Browser::dom`]).
    pub stdout: String,
    /// Console messages the page produced (`INFO:CONSOLE` lines of Chromium's log).
    pub console: Vec<String>,
    /// The whole log, for messages.
    pub stderr: String,
}

impl Browser {
    /// Chromium, or says why not: `None` skips the test outside CI and fails it in CI.
    pub fn find() -> Option<Browser> {
        let found = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists());
        match found {
            Some(exe) => Some(Browser { exe }),
            None => {
                crate::skip::missing(
                    "chromium",
                    "pages are checked in a real browser (apt-get install chromium)",
                );
                None
            }
        }
    }

    /// The page's DOM once loaded (`--dump-dom`), with its console.
    pub fn dom(&self, page: &Path) -> Run {
        self.run(page, &["--dump-dom".to_owned()])
    }

    /// A screenshot of the page at `width` × `height` into `png`, with its console.
    pub fn screenshot(&self, page: &Path, png: &Path, width: u32, height: u32) -> Run {
        self.run(
            page,
            &[
                format!("--screenshot={}", png.display()),
                format!("--window-size={width},{height}"),
                "--hide-scrollbars".to_owned(),
            ],
        )
    }

    fn run(&self, page: &Path, args: &[String]) -> Run {
        let profile = crate::temp_dir();
        let out_dir = crate::temp_dir();
        let (out_path, err_path) = (out_dir.path().join("out"), out_dir.path().join("err"));
        let url = format!(
            "file://{}",
            page.canonicalize().expect("the page exists").display()
        );
        let mut child = Command::new(&self.exe)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--enable-logging=stderr",
                "--log-level=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(args)
            .arg(&url)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out_path).expect("stdout file"))
            .stderr(std::fs::File::create(&err_path).expect("stderr file"))
            .spawn()
            .expect("start chromium");
        let start = Instant::now();
        loop {
            if child.try_wait().expect("wait for chromium").is_some() {
                break;
            }
            if start.elapsed() > DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                panic!("chromium did not finish within {DEADLINE:?} on {url}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        let console = stderr
            .lines()
            .filter(|l| l.contains(":CONSOLE"))
            .map(str::to_owned)
            .collect();
        Run {
            stdout,
            console,
            stderr,
        }
    }
}
