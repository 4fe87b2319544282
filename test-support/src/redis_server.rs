//! A real `redis-server` for one test: started on a free loopback port with persistence off,
//! stopped by its pid (SIGKILL) when dropped. Faults are real: kill and restart on the same
//! port, SIGSTOP/SIGCONT, `DEBUG SLEEP`, `CONFIG SET maxmemory`.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server` owned by a test.
#[derive(Debug)]
pub struct Server {
    child: Option<Child>,
    /// With [`Server::start_unix`]: the socket it listens on (and its folder), no TCP port.
    socket: Option<(std::path::PathBuf, tempfile::TempDir)>,
    /// With [`Server::start_tls`]: the folder holding the CA and the server's certificate.
    tls: Option<tempfile::TempDir>,
    /// More arguments (a cluster node's).
    extra: Vec<std::ffi::OsString>,
    /// Its working folder (`--dir`): a replica's full sync writes an RDB file, which must
    /// never land in the test's working directory, where every later server would load it.
    data: tempfile::TempDir,
    /// Its loopback port.
    pub port: u16,
    exe: String,
}

/// The `redis-server` executable, if this machine has one.
fn executable() -> Option<String> {
    let candidates = [
        "redis-server",
        "/usr/bin/redis-server",
        "/usr/local/bin/redis-server",
    ];
    candidates.into_iter().map(str::to_owned).find(|exe| {
        Command::new(exe)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("address").port()
}

impl Server {
    /// Starts one, or says why not: `None` skips the test outside CI and fails it in CI.
    pub fn start() -> Option<Server> {
        let Some(exe) = executable() else {
            crate::skip::missing(
                "redis-server",
                "the shared tier is tested against a real server (apt-get install redis-server)",
            );
            return None;
        };
        let mut server = Server {
            child: None,
            socket: None,
            tls: None,
            extra: Vec::new(),
            data: crate::temp_dir(),
            port: free_port(),
            exe,
        };
        server.spawn();
        Some(server)
    }

    /// Like [`Server::start`], speaking TLS only on its port (`rediss://localhost:PORT/0`),
    /// with a certificate for `localhost` signed by a fresh CA ([`Server::ca_file`]), made
    /// with the `openssl` command.
    pub fn start_tls() -> Option<Server> {
        let mut server = Server::start()?;
        server.kill();
        let dir = crate::temp_dir();
        if !make_certificates(dir.path()) {
            crate::skip::missing(
                "openssl",
                "the TLS test makes its certificates with the openssl command",
            );
            return None;
        }
        server.tls = Some(dir);
        server.spawn();
        Some(server)
    }

    /// With [`Server::start_tls`]: the CA certificate (PEM) that signed the server's.
    pub fn ca_file(&self) -> Option<std::path::PathBuf> {
        self.tls.as_ref().map(|d| d.path().join("ca.crt"))
    }

    /// A replica of `master` (`--replicaof`): it serves reads and answers writes with
    /// `READONLY`, as a read-only replica in front of a fleet does.
    pub fn start_replica_of(master: &Server) -> Option<Server> {
        let mut server = Server::start()?;
        server.kill();
        server.extra = vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            master.port.to_string().into(),
        ];
        server.spawn();
        Some(server)
    }

    /// Like [`Server::start`], listening on a unix socket only (`--port 0`).
    pub fn start_unix() -> Option<Server> {
        let mut server = Server::start()?;
        server.kill();
        let dir = crate::temp_dir();
        server.socket = Some((dir.path().join("redis.sock"), dir));
        server.spawn();
        Some(server)
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(&self.exe);
        match (&self.socket, &self.tls) {
            (Some((socket, _)), _) => cmd.args(["--port", "0", "--unixsocket"]).arg(socket),
            (None, Some(dir)) => cmd
                .args(["--bind", "127.0.0.1", "--port", "0", "--tls-port"])
                .arg(self.port.to_string())
                .arg("--tls-cert-file")
                .arg(dir.path().join("server.crt"))
                .arg("--tls-key-file")
                .arg(dir.path().join("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(dir.path().join("ca.crt"))
                .args(["--tls-auth-clients", "no"]),
            (None, None) => cmd
                .args(["--bind", "127.0.0.1", "--port"])
                .arg(self.port.to_string()),
        };
        let child = cmd
            .args(&self.extra)
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
            ])
            .arg(self.data.path())
            .args(["--enable-debug-command", "local", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.answers() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "redis-server on port {} did not answer within 10 s",
            self.port
        );
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        match (&self.socket, &self.tls) {
            (Some((socket, _)), _) => format!("redis+unix://{}", socket.display()),
            (None, Some(_)) => format!("rediss://localhost:{}/0", self.port),
            (None, None) => format!("redis://127.0.0.1:{}/0", self.port),
        }
    }

    /// Whether it answers PING (over TLS through `redis-cli`, which the package ships).
    fn answers(&self) -> bool {
        match &self.tls {
            None => self.admin().is_some(),
            Some(dir) => Command::new("redis-cli")
                .args(["--tls", "--cacert"])
                .arg(dir.path().join("ca.crt"))
                .args(["-h", "localhost", "-p"])
                .arg(self.port.to_string())
                .arg("PING")
                .output()
                .is_ok_and(|o| o.status.success() && o.stdout.starts_with(b"PONG")),
        }
    }

    /// A plain connection for the test's own commands (not counted by the tier).
    pub fn admin(&self) -> Option<redis::Connection> {
        let client = redis::Client::open(self.url()).ok()?;
        let mut c = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let pong: String = redis::cmd("PING").query(&mut c).ok()?;
        (pong == "PONG").then_some(c)
    }

    /// Runs one command on an admin connection.
    pub fn cmd(&self, args: &[&str]) -> redis::Value {
        let mut c = self.admin().expect("the test server answers");
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut c).expect("admin command")
    }

    /// Sets a key to raw bytes.
    pub fn set_raw(&self, key: &str, value: &[u8]) {
        let mut c = self.admin().expect("the test server answers");
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .query(&mut c)
            .expect("SET");
    }

    /// The raw bytes of a key.
    pub fn get_raw(&self, key: &str) -> Option<Vec<u8>> {
        let mut c = self.admin().expect("the test server answers");
        redis::cmd("GET").arg(key).query(&mut c).expect("GET")
    }

    /// Calls of each command since the last `CONFIG RESETSTAT`, from `INFO commandstats`.
    pub fn command_calls(&self) -> std::collections::BTreeMap<String, u64> {
        let mut c = self.admin().expect("the test server answers");
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut c)
            .expect("INFO");
        info.lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest
                    .strip_prefix("calls=")?
                    .split(',')
                    .next()?
                    .parse()
                    .ok()?;
                Some((name.to_owned(), calls))
            })
            .collect()
    }

    /// The server's pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// Sends `sig` to the server.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(rc, 0, "kill({}, {sig})", self.pid());
    }

    /// Kills it (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A stopped server must be continued before it can die of SIGKILL cleanly.
            // SAFETY: as in `signal`.
            unsafe { libc::kill(self.pid(), libc::SIGCONT) };
        }
        self.kill();
    }
}

/// A Redis Cluster of three primaries (no replicas) on free loopback ports, made with
/// `redis-cli --cluster create`; its nodes are stopped by pid when it is dropped.
#[derive(Debug)]
pub struct Cluster {
    /// The nodes.
    pub nodes: Vec<Server>,
    _dir: tempfile::TempDir,
    /// With [`Cluster::start_tls`]: the CA and the nodes' certificate.
    certs: Option<tempfile::TempDir>,
}

impl Cluster {
    /// Starts one, or says why not (as [`Server::start`]).
    pub fn start() -> Option<Cluster> {
        Cluster::start_with(None)
    }

    /// [`Cluster::start`] speaking TLS only (client ports and the cluster bus), every node
    /// with one certificate signed by one fresh CA ([`Cluster::ca_file`]).
    pub fn start_tls() -> Option<Cluster> {
        let certs = crate::temp_dir();
        if !make_certificates(certs.path()) {
            crate::skip::missing(
                "openssl",
                "the TLS test makes its certificates with the openssl command",
            );
            return None;
        }
        Cluster::start_with(Some(certs))
    }

    /// With [`Cluster::start_tls`]: the CA certificate (PEM) that signed the nodes'.
    pub fn ca_file(&self) -> Option<std::path::PathBuf> {
        self.certs.as_ref().map(|d| d.path().join("ca.crt"))
    }

    fn start_with(certs: Option<tempfile::TempDir>) -> Option<Cluster> {
        let dir = crate::temp_dir();
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let mut node = Server::start()?;
            node.kill();
            node.extra = vec![
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-config-file".into(),
                dir.path().join(format!("nodes-{}.conf", node.port)).into(),
                "--cluster-node-timeout".into(),
                "2000".into(),
            ];
            if let Some(certs) = &certs {
                let own = crate::temp_dir();
                for f in ["ca.crt", "server.crt", "server.key"] {
                    std::fs::copy(certs.path().join(f), own.path().join(f)).expect("certificate");
                }
                node.tls = Some(own);
                node.extra.extend(["--tls-cluster".into(), "yes".into()]);
            }
            node.spawn();
            nodes.push(node);
        }
        let ca = certs.as_ref().map(|c| c.path().join("ca.crt"));
        let cli = |args: &[&str]| {
            let mut cmd = Command::new("redis-cli");
            if let Some(ca) = &ca {
                cmd.args(["--tls", "--cacert"]).arg(ca);
            }
            cmd.args(args);
            cmd
        };
        let ports: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut create = cli(&["--cluster", "create"]);
        let made = create
            .args(&ports)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(made, "redis-cli --cluster create failed");
        let cluster = Cluster {
            nodes,
            _dir: dir,
            certs,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let ok = cluster.nodes.iter().all(|n| {
                let port = n.port.to_string();
                cli(&["-h", "127.0.0.1", "-p", &port, "CLUSTER", "INFO"])
                    .output()
                    .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
            });
            if ok {
                return Some(cluster);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the test cluster did not reach cluster_state:ok within 20 s");
    }

    /// Its nodes' addresses, separated by commas (what `TUNECACHE_REMOTE` takes).
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(Server::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Keys held by each node (`DBSIZE`).
    pub fn keys_per_node(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .map(|n| match n.cmd(&["DBSIZE"]) {
                redis::Value::Int(k) => k as u64,
                other => panic!("DBSIZE answered {other:?}"),
            })
            .collect()
    }
}

/// Writes `ca.crt` (a fresh CA), `server.crt` and `server.key` (for `localhost` and
/// 127.0.0.1, signed by it) into `dir` with the `openssl` command; false if it cannot.
fn make_certificates(dir: &std::path::Path) -> bool {
    let openssl = |args: &[&str]| {
        Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=tunecache test CA",
    ]) && openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]) && std::fs::write(dir.join("ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1").is_ok()
        && openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "ext",
        ])
}
