//! One bucket's objects, as the S3 store and its generations use them: a ranged GET with the
//! object's ETag, a conditional PUT, a DELETE, a listing, a HEAD of the bucket. Each request is
//! signed by rusty-s3 and sent through one path, `http::Call::send` (its deadline, throttling retried).

use std::io::Read as _;
use std::time::{Duration, Instant};

use rusty_s3::{Bucket, Credentials, S3Action as _};

use super::http::{Call, Response, body_text, header, status_error};
use crate::dates::http_date;
use crate::store::{RemoteError, Swapped};

/// How long a signed request stays valid (S3 accepts 1 s to 7 days): past any deadline.
const SIGNED_FOR: Duration = Duration::from_secs(300);

/// The largest listing page read (S3 returns at most 1,000 keys a page).
const MAX_PAGE_BYTES: u64 = 8 << 20;

/// The most objects one listing gathers: past it, the listing is refused (a store whose
/// listing never ends would otherwise grow memory until the deadline).
pub(crate) const MAX_LISTED: usize = 1_000_000;

/// Pages in a row that bring no object not seen before: a store that sends the same page,
/// or empty ones, again and again, is not making progress.
const MAX_IDLE_PAGES: usize = 3;

/// Whether `object` names exactly itself in a URL: not empty, and no path segment `.` or `..`
/// (which a URL resolves, so `PREFIX/x/../../y` would reach `y`). Every other character is
/// percent-encoded on its way into the URL.
pub(crate) fn addressable(object: &str) -> bool {
    !object.is_empty() && object.split('/').all(|seg| seg != "." && seg != "..")
}

/// Refuses a name that is not [`addressable`] before any request is made for it.
fn check_name(object: &str, describe: &str) -> Result<(), RemoteError> {
    if addressable(object) {
        Ok(())
    } else {
        Err(RemoteError::Refused(format!(
            "{describe}: the object name {:?} has a `.` or `..` segment (or is empty): a URL \
             would name another object",
            object.escape_debug().to_string()
        )))
    }
}

/// What a listing does after a page, given the tokens it was asked with so far, the token the
/// page gives for the next, how many of its keys were new, how many pages in a row (this one
/// included) brought none, and how many objects it holds: ask for the next page, stop (done),
/// or refuse.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Page {
    Next,
    Done,
    Refuse(String),
}

pub(crate) fn after_page(
    seen_tokens: &std::collections::HashSet<String>,
    next: Option<&str>,
    new_keys: usize,
    idle_pages: usize,
    total: usize,
) -> Page {
    if total > MAX_LISTED {
        return Page::Refuse(format!(
            "the listing passes {MAX_LISTED} objects (a prefix that large, or a store whose \
             listing never ends)"
        ));
    }
    let Some(next) = next else {
        return Page::Done;
    };
    if seen_tokens.contains(next) {
        return Page::Refuse(
            "the listing's next page is one it already gave (a token that does not advance)"
                .to_owned(),
        );
    }
    if new_keys == 0 && idle_pages >= MAX_IDLE_PAGES {
        return Page::Refuse(format!(
            "{MAX_IDLE_PAGES} listing pages in a row brought no object not listed before"
        ));
    }
    Page::Next
}

/// A bucket, its credentials and the client that reaches it.
pub(crate) struct Objects {
    pub(crate) bucket: Bucket,
    pub(crate) credentials: Option<Credentials>,
    pub(crate) agent: ureq::Agent,
    /// Where it is, for messages (never a secret).
    pub(crate) describe: String,
}

/// An object read.
#[derive(Debug)]
pub(crate) struct Fetched {
    /// Its first bytes (all of them when it is short enough).
    pub(crate) bytes: Vec<u8>,
    /// Its ETag, if the store said.
    pub(crate) etag: Option<String>,
    /// Whole seconds from its `Last-Modified` to the reply's `Date`, both the store's clock
    /// (no machine's clock matters), if the store gave both.
    pub(crate) age: Option<u64>,
}

/// An object downloaded whole.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Downloaded {
    /// When it was written (its `Last-Modified`, the store's clock), in Unix seconds, if the
    /// store said.
    pub(crate) written: Option<i64>,
}

/// An object listed.
#[derive(Debug, Clone)]
pub(crate) struct Listed {
    /// Its whole name in the bucket.
    pub(crate) key: String,
    /// When it was last written, as the store says it (`2026-11-27T08:16:22.000Z`).
    pub(crate) last_modified: Option<String>,
}

impl Objects {
    /// The first `limit + 1` bytes of `object` and its ETag (a value too large costs no
    /// download: only that range is asked for); `None` if absent.
    pub(crate) fn get(
        &self,
        object: &str,
        limit: u64,
        deadline: Instant,
    ) -> Result<Option<Fetched>, RemoteError> {
        check_name(object, &self.describe)?;
        let url = self
            .bucket
            .get_object(self.credentials.as_ref(), object)
            .sign(SIGNED_FOR);
        let range = format!("bytes=0-{limit}");
        let response = Call {
            headers: &[("range", &range)],
            // A value is small: a reply that stalls mid-body is not waited on past one
            // request's answer time, whatever the call's deadline.
            idle: Some(super::ANSWER_WITHIN),
            ..Call::new("GET", url.as_str())
        }
        .send(&self.agent, deadline)?;
        match response.status().as_u16() {
            // An empty object has no byte 0.
            416 => Ok(Some(Fetched {
                bytes: Vec::new(),
                etag: None,
                age: None,
            })),
            200 | 206 => {
                let etag = header(&response, "etag");
                let date = |name| header(&response, name).as_deref().and_then(http_date);
                let age = match (date("last-modified"), date("date")) {
                    (Some(written), Some(now)) => Some(now.saturating_sub(written).max(0) as u64),
                    _ => None,
                };
                let mut bytes = Vec::new();
                response
                    .into_body()
                    .into_reader()
                    .take(limit.saturating_add(1))
                    .read_to_end(&mut bytes)
                    .map_err(|e| RemoteError::Unreachable(format!("reading a value: {e}")))?;
                Ok(Some(Fetched { bytes, etag, age }))
            }
            404 => self.absent(response).map(|()| None),
            status => Err(status_error(status, &body_text(response), &self.describe)),
        }
    }

    /// A 404 to an object's request: the object is absent (`Ok`), unless the bucket is.
    fn absent(&self, response: Response) -> Result<(), RemoteError> {
        if body_text(response).contains("NoSuchBucket") {
            Err(RemoteError::Refused(format!(
                "{}: no such bucket",
                self.describe
            )))
        } else {
            Ok(())
        }
    }

    /// Streams `object` into `sink`, at most `limit` bytes (more is an error), while bytes
    /// keep arriving: each read waits at most `idle`, the whole at most until `deadline`
    /// (a long one: a store that sends is given the time it needs, one that stops sending is
    /// given up on after `idle`). Returns when the object was written (as far as the store
    /// says), or `None` if it is absent.
    pub(crate) fn download(
        &self,
        object: &str,
        sink: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
        limit: u64,
        idle: Duration,
        deadline: Instant,
    ) -> Result<Option<Downloaded>, RemoteError> {
        check_name(object, &self.describe)?;
        let url = self
            .bucket
            .get_object(self.credentials.as_ref(), object)
            .sign(SIGNED_FOR);
        let response = Call {
            idle: Some(idle),
            ..Call::new("GET", url.as_str())
        }
        .send(&self.agent, deadline)?;
        match response.status().as_u16() {
            200 => {}
            404 => return self.absent(response).map(|()| None),
            status => return Err(status_error(status, &body_text(response), &self.describe)),
        }
        let written = header(&response, "last-modified")
            .as_deref()
            .and_then(http_date);
        let mut reader = response
            .into_body()
            .into_reader()
            .take(limit.saturating_add(1));
        let mut buf = vec![0u8; 1 << 20];
        let mut len = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(RemoteError::Timeout(format!(
                        "{}: the download of {object} stopped after {len} bytes: {e}",
                        self.describe
                    )));
                }
            };
            len += n as u64;
            if len > limit {
                return Err(RemoteError::Protocol(format!(
                    "{}: {object} is larger than {limit} bytes",
                    self.describe
                )));
            }
            sink(&buf[..n])
                .map_err(|e| RemoteError::Refused(format!("writing what was downloaded: {e}")))?;
        }
        Ok(Some(Downloaded { written }))
    }

    /// A conditional PUT of `value` as `object`: create-only (`etag` `None`), or only while
    /// its ETag is still `etag`. A lost race is `Changed`; a write is `Set`, with the new ETag.
    pub(crate) fn put(
        &self,
        object: &str,
        value: &[u8],
        etag: Option<&str>,
        deadline: Instant,
    ) -> Result<(Swapped, Option<String>), RemoteError> {
        check_name(object, &self.describe)?;
        let url = self
            .bucket
            .put_object(self.credentials.as_ref(), object)
            .sign(SIGNED_FOR);
        let (condition, on) = match etag {
            None => ("if-none-match", "*"),
            Some(etag) => ("if-match", etag),
        };
        let response = Call {
            headers: &[
                ("content-type", "application/octet-stream"),
                (condition, on),
            ],
            body: Some(value),
            idle: Some(super::ANSWER_WITHIN),
            ..Call::new("PUT", url.as_str())
        }
        .send(&self.agent, deadline)?;
        match response.status().as_u16() {
            200 | 201 | 204 => Ok((Swapped::Set, header(&response, "etag"))),
            // A lost race: the object changed (or appeared, or went) since it was read.
            404 if etag.is_some() => Ok((Swapped::Changed, None)),
            409 | 412 => Ok((Swapped::Changed, None)),
            status => Err(status_error(status, &body_text(response), &self.describe)),
        }
    }

    /// Deletes `object` (an absent one is no error).
    pub(crate) fn delete(&self, object: &str, deadline: Instant) -> Result<(), RemoteError> {
        check_name(object, &self.describe)?;
        let url = self
            .bucket
            .delete_object(self.credentials.as_ref(), object)
            .sign(SIGNED_FOR);
        let response = Call::new("DELETE", url.as_str()).send(&self.agent, deadline)?;
        match response.status().as_u16() {
            200 | 204 | 404 => Ok(()),
            status => Err(status_error(status, &body_text(response), &self.describe)),
        }
    }

    /// Every object whose name starts with `prefix`, page by page: each page must bring a new
    /// token and objects not listed before, and the whole at most [`MAX_LISTED`] objects (see
    /// [`after_page`]). A name a URL would rewrite ([`addressable`]) is left out, with one
    /// warning per listing.
    pub(crate) fn list(&self, prefix: &str, deadline: Instant) -> Result<Vec<Listed>, RemoteError> {
        let mut out = Vec::new();
        let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
        let mut tokens: std::collections::HashSet<String> = std::collections::HashSet::new();
        let mut idle_pages = 0;
        let mut skipped: (usize, Option<String>) = (0, None);
        let mut token: Option<String> = None;
        loop {
            let mut list = self.bucket.list_objects_v2(self.credentials.as_ref());
            list.with_prefix(prefix);
            if let Some(t) = &token {
                list.with_continuation_token(t.as_str());
            }
            let url = list.sign(SIGNED_FOR);
            let response = Call::new("GET", url.as_str()).send(&self.agent, deadline)?;
            let status = response.status().as_u16();
            if status != 200 {
                return Err(status_error(status, &body_text(response), &self.describe));
            }
            // A page lists at most 1,000 keys: a few hundred KiB.
            let mut page = Vec::new();
            response
                .into_body()
                .into_reader()
                .take(MAX_PAGE_BYTES)
                .read_to_end(&mut page)
                .map_err(|e| RemoteError::Unreachable(format!("reading a listing: {e}")))?;
            let page =
                rusty_s3::actions::ListObjectsV2::parse_response(&String::from_utf8_lossy(&page))
                    .map_err(|e| RemoteError::Protocol(format!("a listing: {e}")))?;
            let mut new_keys = 0;
            for c in page.contents {
                if !seen.insert(c.key.clone()) {
                    continue;
                }
                new_keys += 1;
                if !addressable(&c.key) {
                    skipped.0 += 1;
                    skipped.1.get_or_insert(c.key);
                    continue;
                }
                out.push(Listed {
                    key: c.key,
                    last_modified: c.last_modified,
                });
            }
            idle_pages = if new_keys == 0 { idle_pages + 1 } else { 0 };
            if let Some(t) = &token {
                tokens.insert(t.clone());
            }
            let next = page.next_continuation_token;
            match after_page(&tokens, next.as_deref(), new_keys, idle_pages, seen.len()) {
                Page::Next => token = next,
                Page::Done => break,
                Page::Refuse(why) => {
                    return Err(RemoteError::Protocol(format!("{}: {why}", self.describe)));
                }
            }
        }
        if let (n, Some(first)) = skipped {
            tracing::warn!(
                "tunecache: {}: {n} listed object names have a `.` or `..` segment (e.g. {:?}): \
                 left out, since a URL would name another object",
                self.describe,
                first.escape_debug().to_string()
            );
        }
        Ok(out)
    }

    /// A HEAD of the bucket: is it there, and may it be read?
    pub(crate) fn ping(&self, deadline: Instant) -> Result<(), RemoteError> {
        let url = self
            .bucket
            .head_bucket(self.credentials.as_ref())
            .sign(SIGNED_FOR);
        let response = Call::new("HEAD", url.as_str()).send(&self.agent, deadline)?;
        match response.status().as_u16() {
            200 => Ok(()),
            404 => Err(RemoteError::Refused(format!(
                "{}: no such bucket",
                self.describe
            ))),
            status => Err(status_error(status, "", &self.describe)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_with_a_dot_segment_is_not_addressable() {
        for ok in [
            "p/tc1:a:1:x:y:z",
            "p/a.b",
            "p/..a",
            "p/a..",
            "p/.../x",
            "a//b",
        ] {
            assert!(addressable(ok), "{ok}");
        }
        for bad in ["", "p/tc1:x/../../y", "p/./x", "..", "p/..", "./p"] {
            assert!(!addressable(bad), "{bad}");
        }
    }

    #[test]
    fn a_listing_must_advance_and_stay_bounded() {
        let mut tokens = std::collections::HashSet::new();
        assert_eq!(after_page(&tokens, None, 5, 0, 5), Page::Done);
        assert_eq!(after_page(&tokens, Some("a"), 5, 0, 5), Page::Next);
        tokens.insert("a".to_owned());
        assert!(
            matches!(after_page(&tokens, Some("a"), 5, 0, 10), Page::Refuse(_)),
            "the same token again"
        );
        assert_eq!(
            after_page(&tokens, Some("b"), 0, 2, 10),
            Page::Next,
            "an empty page or two"
        );
        assert!(
            matches!(after_page(&tokens, Some("c"), 0, 3, 10), Page::Refuse(_)),
            "pages that bring nothing new"
        );
        assert!(
            matches!(
                after_page(&tokens, Some("d"), 1000, 0, MAX_LISTED + 1),
                Page::Refuse(_)
            ),
            "too many"
        );
        assert!(
            matches!(
                after_page(&tokens, None, 1000, 0, MAX_LISTED + 1),
                Page::Refuse(_)
            ),
            "too many, even at the end"
        );
    }
}
