//! A real S3 API server for one test: moto's server (from PyPI; `cargo xtask test` installs it
//! into its environment), started on a free loopback port and stopped by its pid (SIGKILL) when
//! dropped. It answers conditional writes with 412 as S3 does. It runs one request at a time:
//! moto checks a write's precondition and then stores the object as two steps, so its usual
//! threaded server lets two concurrent `If-Match` writes both succeed, which S3 never does
//! (found by the 8-process test: a candidate lost). SIGSTOP/SIGCONT freeze and thaw it.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running moto server owned by a test.
#[derive(Debug)]
pub struct S3Server {
    child: Child,
    /// Its loopback port.
    pub port: u16,
}

/// moto's server as `python -m moto.server` makes it, serving one request at a time.
const SERVE: &str = "import sys\n\
from werkzeug.serving import run_simple\n\
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app\n\
run_simple('127.0.0.1', int(sys.argv[1]), DomainDispatcherApplication(create_backend_app), threaded=False)\n";

/// The Python that has moto, if any: the one on `PATH` (the test environment's).
fn python() -> Option<&'static str> {
    ["python3", "python"].into_iter().find(|exe| {
        Command::new(exe)
            .args(["-c", "import moto.server"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

impl S3Server {
    /// Starts one with the bucket `bucket` made, or says why not: `None` skips the test
    /// outside CI and fails it in CI.
    pub fn start(bucket: &str) -> Option<S3Server> {
        let Some(python) = python() else {
            crate::skip::missing(
                "moto",
                "the S3 tier is tested against a real S3 API server (pip install 'moto[server]'; cargo xtask test installs it)",
            );
            return None;
        };
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(python)
            .arg("-c")
            .arg(SERVE)
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto's server");
        let server = S3Server { child, port };
        let up = crate::wait_until(Duration::from_secs(60), || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        assert!(
            up,
            "moto's server did not listen on port {port} within 60 s"
        );
        server.request("PUT", &format!("/{bucket}"), &[]);
        Some(server)
    }

    /// `AWS_ENDPOINT_URL` for it.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment an S3 client needs for it (`AWS_*`, any credentials).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "testing".to_owned()),
            ("AWS_REGION", "us-east-1".to_owned()),
        ]
    }

    /// One unauthenticated HTTP/1.0 request (moto makes buckets without a signature); the
    /// status code.
    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> u16 {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to moto");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let head = format!(
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\n\r\n",
            self.port,
            body.len()
        );
        stream.write_all(head.as_bytes()).expect("send");
        stream.write_all(body).expect("send");
        let mut reply = String::new();
        let _ = stream.read_to_string(&mut reply);
        reply
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    /// Its pid, for signals.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Freezes it (SIGSTOP to its own pid, while it is still this test's child) until the
    /// guard is dropped (SIGCONT).
    pub fn freeze(&self) -> Frozen<'_> {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid");
        // SAFETY: a signal to our own child, not waited for yet, so the pid is still ours.
        let stopped = unsafe { libc::kill(pid, libc::SIGSTOP) } == 0;
        assert!(stopped, "SIGSTOP to moto's server");
        Frozen { pid, _server: self }
    }
}

/// A frozen server ([`S3Server::freeze`]); thawed when dropped, which the borrow makes happen
/// before the server is stopped and its pid let go.
#[derive(Debug)]
pub struct Frozen<'a> {
    pid: libc::pid_t,
    _server: &'a S3Server,
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        // SAFETY: as in `freeze`: our own child, not waited for yet (the server outlives this).
        unsafe { libc::kill(self.pid, libc::SIGCONT) };
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
