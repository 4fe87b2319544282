//! The S3 store's requests: each sent with the time left to its deadline, sent again while
//! the store throttles (the pure [`backoff`]), and its reply classified as what a caller
//! does next (a refusal said plainly, a server error an outage).

use std::io::Read as _;
use std::time::{Duration, Instant};

use crate::store::RemoteError;

pub(super) type Response = ureq::http::Response<ureq::Body>;

/// Sends what `request` makes (given the time left as its timeout), again after a pause while
/// the store throttles or fails (see [`backoff`]) and the deadline allows; the last reply.
fn exchange(
    deadline: Instant,
    request: impl Fn(Duration) -> Result<Response, ureq::Error>,
) -> Result<Response, RemoteError> {
    let mut attempt = 0;
    loop {
        let response = match request(left(deadline)?) {
            Ok(response) => response,
            // A connection the store dropped (a busy one resets what it cannot take): sent
            // again as after a server error. Safe: a read changes nothing, and a write is
            // conditional, so one that had landed is a lost race the caller reads again.
            Err(e) if dropped(&e) => {
                let left = deadline.saturating_duration_since(Instant::now());
                match backoff(attempt, 503, left, crate::jitter::jitter()) {
                    Some(pause) => {
                        std::thread::sleep(pause);
                        attempt += 1;
                        continue;
                    }
                    None => return Err(transport(&e)),
                }
            }
            Err(e) => return Err(transport(&e)),
        };
        let status = response.status().as_u16();
        let left = deadline.saturating_duration_since(Instant::now());
        match backoff(attempt, status, left, crate::jitter::jitter()) {
            Some(pause) => {
                std::thread::sleep(pause);
                attempt += 1;
            }
            None => return Ok(response),
        }
    }
}

/// One request, as every verb sends it (one path: the timeouts, the retries and the body are
/// set here, not per verb): a method, a signed URL, headers, a body for a PUT, and how long
/// one read may wait (a download's; otherwise only the deadline bounds it).
pub(super) struct Call<'a> {
    pub(super) method: &'static str,
    pub(super) url: &'a str,
    pub(super) headers: &'a [(&'a str, &'a str)],
    pub(super) body: Option<&'a [u8]>,
    pub(super) idle: Option<Duration>,
}

impl<'a> Call<'a> {
    /// A request without headers or a body.
    pub(super) fn new(method: &'static str, url: &'a str) -> Self {
        Call {
            method,
            url,
            headers: &[],
            body: None,
            idle: None,
        }
    }

    /// Sends it on `agent` within `deadline` ([`exchange`]: again while the store throttles).
    pub(super) fn send(
        &self,
        agent: &ureq::Agent,
        deadline: Instant,
    ) -> Result<Response, RemoteError> {
        exchange(deadline, |timeout| {
            let mut request = ureq::http::Request::builder()
                .method(self.method)
                .uri(self.url);
            for (name, value) in self.headers {
                request = request.header(*name, *value);
            }
            match self.body {
                Some(body) => run(agent, request.body(body)?, timeout, self.idle),
                None => run(agent, request.body(())?, timeout, self.idle),
            }
        })
    }
}

/// Runs `request` on `agent` with its whole time bounded by `timeout` and each read by `idle`.
fn run<S: ureq::AsSendBody>(
    agent: &ureq::Agent,
    request: ureq::http::Request<S>,
    timeout: Duration,
    idle: Option<Duration>,
) -> Result<Response, ureq::Error> {
    let request = agent
        .configure_request(request)
        .timeout_global(Some(timeout))
        .timeout_per_read(idle)
        .build();
    agent.run(request)
}

/// The most times one request is sent.
const MAX_ATTEMPTS: u32 = 5;

/// Whether to send a request again after the reply `status` to attempt `attempt` (from 0),
/// and after what pause: throttling (429, 503 SlowDown) and server errors (500, 502, 504)
/// are, after a pause doubling from 20 ms and spread by `jitter` (0 to 1), while the pause
/// leaves time for the request within `left` and fewer than [`MAX_ATTEMPTS`] were made.
pub(crate) fn backoff(attempt: u32, status: u16, left: Duration, jitter: f64) -> Option<Duration> {
    if !matches!(status, 429 | 500 | 502 | 503 | 504) || attempt + 1 >= MAX_ATTEMPTS {
        return None;
    }
    let base = Duration::from_millis(20 << attempt.min(8));
    let pause = base.mul_f64(0.5 + jitter.clamp(0.0, 1.0));
    (pause * 2 < left).then_some(pause)
}

/// The time left to `deadline`, or the timeout it already is.
pub(super) fn left(deadline: Instant) -> Result<Duration, RemoteError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(RemoteError::Timeout("the deadline passed".to_owned()))
    } else {
        Ok(left)
    }
}

pub(super) fn header(response: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The first 4 KiB of an error reply, as text.
pub(super) fn body_text(response: ureq::http::Response<ureq::Body>) -> String {
    let mut text = Vec::new();
    let _ = response
        .into_body()
        .into_reader()
        .take(4096)
        .read_to_end(&mut text);
    String::from_utf8_lossy(&text).into_owned()
}

/// A reply's status as a [`RemoteError`]: refusals (credentials, permissions, a missing
/// bucket) are said plainly; a server error is an outage.
pub(super) fn status_error(status: u16, body: &str, describe: &str) -> RemoteError {
    let code = body
        .split("<Code>")
        .nth(1)
        .and_then(|c| c.split("</Code>").next())
        .unwrap_or_default();
    match status {
        403 => RemoteError::Denied(format!(
            "{describe}: access denied ({code}): check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and the bucket's policy"
        )),
        404 => RemoteError::Refused(format!("{describe}: no such bucket ({code})")),
        500..=599 => {
            RemoteError::Unreachable(format!("{describe}: the server answered {status} {code}"))
        }
        _ => RemoteError::Protocol(format!("{describe}: unexpected reply {status} {code}")),
    }
}

/// Whether `e` is a connection the store dropped mid-request (reset, aborted, closed early):
/// worth sending again, where a refused connection or a timeout is an outage.
pub(super) fn dropped(e: &ureq::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    matches!(e, ureq::Error::Io(io) if matches!(io.kind(), ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof))
}

/// A transport failure: a timeout, or a server that cannot be reached.
pub(super) fn transport(e: &ureq::Error) -> RemoteError {
    match e {
        ureq::Error::Timeout(_) => RemoteError::Timeout(e.to_string()),
        _ => RemoteError::Unreachable(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_classified_by_what_a_caller_does_next() {
        let denied = status_error(403, "<Error><Code>AccessDenied</Code></Error>", "s3://b");
        assert!(
            matches!(&denied, RemoteError::Denied(m) if m.contains("AccessDenied") && m.contains("AWS_ACCESS_KEY_ID"))
        );
        assert!(
            matches!(status_error(404, "<Code>NoSuchBucket</Code>", "s3://b"), RemoteError::Refused(m) if m.contains("no such bucket"))
        );
        assert!(status_error(503, "<Code>SlowDown</Code>", "s3://b").is_outage());
        assert!(matches!(
            status_error(301, "", "s3://b"),
            RemoteError::Protocol(_)
        ));
        assert!(
            left(Instant::now()).is_err(),
            "a deadline that passed is a timeout"
        );
    }

    #[test]
    fn throttling_and_server_errors_are_sent_again_within_the_budget() {
        let s = Duration::from_secs(5);
        assert_eq!(backoff(0, 503, s, 0.5), Some(Duration::from_millis(20)));
        assert_eq!(backoff(2, 429, s, 0.0), Some(Duration::from_millis(40)));
        assert_eq!(backoff(1, 500, s, 1.0), Some(Duration::from_millis(60)));
        for done in [200, 206, 404, 403, 412, 409] {
            assert_eq!(backoff(0, done, s, 0.5), None, "{done} is an answer");
        }
        assert_eq!(
            backoff(MAX_ATTEMPTS - 1, 503, s, 0.5),
            None,
            "attempts spent"
        );
        assert_eq!(
            backoff(0, 503, Duration::from_millis(30), 0.5),
            None,
            "no time for another"
        );
    }

    #[test]
    fn a_dropped_connection_is_sent_again_and_a_refused_one_is_not() {
        use std::io::{Error, ErrorKind};
        let io = |kind| ureq::Error::Io(Error::new(kind, "x"));
        for kind in [
            ErrorKind::ConnectionReset,
            ErrorKind::ConnectionAborted,
            ErrorKind::BrokenPipe,
            ErrorKind::UnexpectedEof,
        ] {
            assert!(dropped(&io(kind)), "{kind:?}");
        }
        assert!(!dropped(&io(ErrorKind::ConnectionRefused)));
        assert!(!dropped(&ureq::Error::ConnectionFailed));
        // Sent again within the deadline, then the error.
        let tries = std::cell::Cell::new(0);
        let got = exchange(Instant::now() + Duration::from_secs(5), |_| {
            tries.set(tries.get() + 1);
            Err(io(ErrorKind::ConnectionReset))
        });
        assert!(matches!(got, Err(RemoteError::Unreachable(_))), "{got:?}");
        assert!(
            tries.get() > 1 && tries.get() <= MAX_ATTEMPTS,
            "{}",
            tries.get()
        );
        let tries = std::cell::Cell::new(0);
        let got = exchange(Instant::now() + Duration::from_secs(5), |_| {
            tries.set(tries.get() + 1);
            Err(io(ErrorKind::ConnectionRefused))
        });
        assert!(got.is_err());
        assert_eq!(tries.get(), 1, "refused: an outage at once");
    }
}
