//! A hostile HTTP server on a free loopback port, for what a real store never does: a listing
//! whose pages never end, object names a URL would rewrite, a server that accepts and never
//! answers. Each request is answered by the test's own function (or not at all) and
//! recorded; one thread per connection, `Connection: close` after each reply. Stopped when
//! dropped.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A request as the server read it.
#[derive(Debug, Clone)]
pub struct Request {
    /// `GET`, `PUT`, ...
    pub method: String,
    /// The path and query, as sent.
    pub target: String,
    /// The headers, names in lower case (none where a [`Proxy`] decides on the request line).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Request {
    /// The value of header `name` (lower case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the server does with a request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A status, headers and a body.
    With(u16, Vec<(String, String)>, Vec<u8>),
    /// Nothing: the connection stays open and silent until the server is dropped.
    Silence,
}

/// The server.
pub struct FakeHttp {
    port: u16,
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for FakeHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FakeHttp(127.0.0.1:{})", self.port)
    }
}

impl FakeHttp {
    /// Starts a server that answers each request with `reply`.
    pub fn start(reply: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> FakeHttp {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("address").port();
        listener.set_nonblocking(true).expect("non-blocking");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let reply = Arc::new(reply);
        {
            let (requests, stop) = (Arc::clone(&requests), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let (requests, stop, reply) =
                                (Arc::clone(&requests), Arc::clone(&stop), Arc::clone(&reply));
                            std::thread::spawn(move || serve(stream, &requests, &stop, &*reply));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            });
        }
        FakeHttp {
            port,
            requests,
            stop,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for FakeHttp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve(
    stream: TcpStream,
    requests: &Mutex<Vec<Request>>,
    stop: &AtomicBool,
    reply: &(dyn Fn(&Request) -> Reply + Send + Sync),
) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut parts = line.split_whitespace();
    let mut request = Request {
        method: parts.next().unwrap_or("").to_owned(),
        target: parts.next().unwrap_or("").to_owned(),
        headers: Vec::new(),
        body: Vec::new(),
    };
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            let (name, value) = (name.trim().to_ascii_lowercase(), value.trim().to_owned());
            if name == "content-length" {
                length = value.parse().unwrap_or(0);
            }
            request.headers.push((name, value));
        }
    }
    let mut body = vec![0u8; length.min(1 << 24)];
    let _ = std::io::Read::read_exact(&mut reader, &mut body);
    request.body = body;
    requests
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(request.clone());
    match reply(&request) {
        Reply::With(status, headers, body) => {
            let mut out = format!(
                "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (name, value) in headers {
                out.push_str(&format!("{name}: {value}\r\n"));
            }
            out.push_str("\r\n");
            let mut stream = stream;
            let _ = stream.write_all(out.as_bytes());
            let _ = stream.write_all(&body);
        }
        Reply::Silence => {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// A ListObjectsV2 page holding `keys`, truncated with `next` as its continuation token.
pub fn list_page(keys: &[String], next: Option<&str>) -> Vec<u8> {
    let mut xml = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name><Prefix></Prefix>",
    );
    xml.push_str(&format!(
        "<KeyCount>{}</KeyCount><MaxKeys>1000</MaxKeys>",
        keys.len()
    ));
    xml.push_str(&format!("<IsTruncated>{}</IsTruncated>", next.is_some()));
    if let Some(next) = next {
        xml.push_str(&format!(
            "<NextContinuationToken>{next}</NextContinuationToken>"
        ));
    }
    for k in keys {
        xml.push_str(&format!(
            "<Contents><Key>{k}</Key><LastModified>2026-11-27T08:16:22.000Z</LastModified><ETag>\"x\"</ETag><Size>1</Size><StorageClass>STANDARD</StorageClass></Contents>"
        ));
    }
    xml.push_str("</ListBucketResult>");
    xml.into_bytes()
}

/// A proxy in front of a real server (moto) on a free loopback port: each request is read
/// whole and sent on (one connection each, `Connection: close`), and the reply sent back; a
/// request `hold` says yes to waits until `gate` is opened. For races a real store cannot be
/// made to lose on its own (a prune's listing held while a snapshot lands).
pub struct Proxy {
    port: u16,
    stop: Arc<AtomicBool>,
    /// Open (`true`): held requests go on.
    pub gate: Arc<AtomicBool>,
    held: Arc<std::sync::atomic::AtomicUsize>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Proxy(127.0.0.1:{})", self.port)
    }
}

impl Proxy {
    /// A proxy to `upstream` (`127.0.0.1:PORT`) holding what `hold` says yes to.
    pub fn start(upstream: u16, hold: impl Fn(&Request) -> bool + Send + Sync + 'static) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("address").port();
        listener.set_nonblocking(true).expect("non-blocking");
        let stop = Arc::new(AtomicBool::new(false));
        let gate = Arc::new(AtomicBool::new(false));
        let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let hold = Arc::new(hold);
        {
            let (stop, gate, held) = (Arc::clone(&stop), Arc::clone(&gate), Arc::clone(&held));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let (gate, held, hold) =
                                (Arc::clone(&gate), Arc::clone(&held), Arc::clone(&hold));
                            std::thread::spawn(move || {
                                forward(stream, upstream, &*hold, &gate, &held);
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            });
        }
        Proxy {
            port,
            stop,
            gate,
            held,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// How many requests are held (or were: a held request counts until it goes on).
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.gate.store(true, Ordering::Relaxed);
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn forward(
    stream: TcpStream,
    upstream: u16,
    hold: &(dyn Fn(&Request) -> bool + Send + Sync),
    gate: &AtomicBool,
    held: &std::sync::atomic::AtomicUsize,
) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(clone) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(clone);
    let mut head = String::new();
    if reader.read_line(&mut head).is_err() {
        return;
    }
    let mut parts = head.split_whitespace();
    // The proxy decides on the request line alone.
    let request = Request {
        method: parts.next().unwrap_or("").to_owned(),
        target: parts.next().unwrap_or("").to_owned(),
        headers: Vec::new(),
        body: Vec::new(),
    };
    let mut headers = String::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
            if name.eq_ignore_ascii_case("connection") {
                continue;
            }
        }
        headers.push_str(&line);
    }
    let mut body = vec![0u8; length.min(1 << 30)];
    if std::io::Read::read_exact(&mut reader, &mut body).is_err() {
        return;
    }
    if hold(&request) {
        held.fetch_add(1, Ordering::Relaxed);
        while !gate.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream)) else {
        return;
    };
    let sent = up
        .write_all(head.as_bytes())
        .and_then(|()| up.write_all(headers.as_bytes()))
        .and_then(|()| up.write_all(b"connection: close\r\n\r\n"))
        .and_then(|()| up.write_all(&body));
    if sent.is_err() {
        return;
    }
    let mut stream = stream;
    let _ = std::io::copy(&mut up, &mut stream);
}
