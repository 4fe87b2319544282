//! One bucket's objects, as the S3 store and its generations use them: a ranged GET with the
//! object's ETag, a conditional PUT, a DELETE, a listing, a HEAD of the bucket. Each request is
//! signed by rusty-s3 and sent through `http::exchange` (its deadline, throttling retried).

use std::io::Read as _;
use std::time::{Duration, Instant};

use rusty_s3::{Bucket, Credentials, S3Action as _};

use super::http::{body_text, exchange, header, http_date, status_error};
use crate::store::{RemoteError, Swapped};

/// How long a signed request stays valid (S3 accepts 1 s to 7 days): past any deadline.
const SIGNED_FOR: Duration = Duration::from_secs(300);

/// The largest listing page read (S3 returns at most 1,000 keys a page).
const MAX_PAGE_BYTES: u64 = 8 << 20;

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
        let url = self
            .bucket
            .get_object(self.credentials.as_ref(), object)
            .sign(SIGNED_FOR);
        let range = format!("bytes=0-{limit}");
        let response = exchange(deadline, |timeout| {
            self.agent
                .get(url.as_str())
                .header("range", &range)
                .config()
                .timeout_global(Some(timeout))
                .build()
                .call()
        })?;
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
            404 => {
                let body = body_text(response);
                if body.contains("NoSuchBucket") {
                    Err(RemoteError::Refused(format!(
                        "{}: no such bucket",
                        self.describe
                    )))
                } else {
                    Ok(None)
                }
            }
            status => Err(status_error(status, &body_text(response), &self.describe)),
        }
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
        let url = self
            .bucket
            .put_object(self.credentials.as_ref(), object)
            .sign(SIGNED_FOR);
        let (condition, on) = match etag {
            None => ("if-none-match", "*"),
            Some(etag) => ("if-match", etag),
        };
        let response = exchange(deadline, |timeout| {
            self.agent
                .put(url.as_str())
                .header("content-type", "application/octet-stream")
                .header(condition, on)
                .config()
                .timeout_global(Some(timeout))
                .build()
                .send(value)
        })?;
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
        let url = self
            .bucket
            .delete_object(self.credentials.as_ref(), object)
            .sign(SIGNED_FOR);
        let response = exchange(deadline, |timeout| {
            self.agent
                .delete(url.as_str())
                .config()
                .timeout_global(Some(timeout))
                .build()
                .call()
        })?;
        match response.status().as_u16() {
            200 | 204 | 404 => Ok(()),
            status => Err(status_error(status, &body_text(response), &self.describe)),
        }
    }

    /// Every object whose name starts with `prefix`, page by page.
    pub(crate) fn list(&self, prefix: &str, deadline: Instant) -> Result<Vec<Listed>, RemoteError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut list = self.bucket.list_objects_v2(self.credentials.as_ref());
            list.with_prefix(prefix);
            if let Some(t) = &token {
                list.with_continuation_token(t.as_str());
            }
            let url = list.sign(SIGNED_FOR);
            let response = exchange(deadline, |timeout| {
                self.agent
                    .get(url.as_str())
                    .config()
                    .timeout_global(Some(timeout))
                    .build()
                    .call()
            })?;
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
            out.extend(page.contents.into_iter().map(|c| Listed {
                key: c.key,
                last_modified: c.last_modified,
            }));
            match page.next_continuation_token {
                Some(next) => token = Some(next),
                None => return Ok(out),
            }
        }
    }

    /// A HEAD of the bucket: is it there, and may it be read?
    pub(crate) fn ping(&self, deadline: Instant) -> Result<(), RemoteError> {
        let url = self
            .bucket
            .head_bucket(self.credentials.as_ref())
            .sign(SIGNED_FOR);
        let response = exchange(deadline, |timeout| {
            self.agent
                .head(url.as_str())
                .config()
                .timeout_global(Some(timeout))
                .build()
                .call()
        })?;
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
