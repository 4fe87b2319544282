//! Bundles on disk (FORMAT.md, "Bundles"): written from entries in key order, the table first
//! into a temporary file beside the bundle (removed at once), then framed with its manifest;
//! checked whole without being read into memory (the table's CRC and SHA-256 over its bytes a
//! chunk at a time, every entry decoded, the manifest compared with what the entries make of
//! it); and opened as an [`Inspection`] whose table is the bundle's, to walk or look up. A
//! bundle of version 1 or 2 (a snapshot inside) is read whole, as before.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::ControlFlow;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use cache_format::bundle::{
    BUNDLE_MARKER, BUNDLE_VERSION, Located, Manifest, ManifestBuilder, bundle_head, locate_table,
    problems_against, read_bundle,
};
use cache_format::table::{SLOT_A, Table, TableBuilder, check_table};
use cache_format::{CacheData, Entry, FormatError, Limits, Scope};
use cache_migrate::Migrations;

use crate::error::StoreError;
use crate::fsio::AtomicFile;
use crate::inspect::Inspection;
use crate::tablefile::FileBytes;

/// What [`BundleWriter::finish`] wrote.
#[derive(Debug, Clone)]
pub struct BundleWritten {
    /// The manifest.
    pub manifest: Manifest,
    /// The bundle's size.
    pub bytes: u64,
}

/// Writes a bundle (see the module docs): entries are added in table-key order (what
/// [`Inspection::in_key_order`] gives) at a registry's application and current schema, into a
/// table in an anonymous file beside the output; [`BundleWriter::finish`] reads the table back
/// whole (so no bytes a reader refuses are ever shipped) and only then writes the bundle.
/// Dropped without `finish`, nothing is written. Replaces a regular file at the output,
/// nothing else.
#[derive(Debug)]
pub struct BundleWriter {
    output: std::path::PathBuf,
    app: String,
    schema: u32,
    limits: Limits,
    out: BufWriter<File>,
    builder: TableBuilder,
    manifest: ManifestBuilder,
    latest: u64,
}

impl BundleWriter {
    /// A writer of the bundle `output` at `registry`'s application and current schema.
    pub fn create(
        output: &Path,
        registry: &Migrations,
        limits: &Limits,
    ) -> Result<BundleWriter, StoreError> {
        crate::fsio::check_regular(output)?;
        let dir = crate::fsio::parent_dir(output);
        let table = crate::spill::anonymous_file(&dir)?;
        Ok(BundleWriter {
            output: output.to_owned(),
            app: registry.app().to_owned(),
            schema: registry.current(),
            limits: *limits,
            out: BufWriter::with_capacity(1 << 20, table),
            builder: TableBuilder::new(registry.app(), registry.current(), None),
            manifest: ManifestBuilder::default(),
            latest: 0,
        })
    }

    fn io(&self, e: std::io::Error) -> StoreError {
        StoreError::io("write the bundle's table beside", &self.output, e)
    }

    /// Adds `entry` of namespace `ns` in `scope`, after every entry added before it in
    /// table-key order; checked as `try_put` checks it.
    pub fn add(&mut self, scope: &Scope, ns: &str, entry: &Entry) -> Result<(), StoreError> {
        crate::check::check_entry(scope, ns, entry, &self.limits).map_err(|reason| {
            StoreError::Refused {
                namespace: ns.to_owned(),
                reason,
            }
        })?;
        self.builder
            .add_entry(scope, ns, entry)
            .map_err(|e| crate::tablefile::format_error(&self.output, e))?;
        self.manifest.add(scope, ns, entry);
        self.latest = self.latest.max(entry.recorded_at());
        let chunk = self.builder.take_output_if(1 << 20);
        self.out.write_all(&chunk).map_err(|e| self.io(e))
    }

    /// Writes the bundle: `created` is the manifest's time (`None`: the latest entry's),
    /// `producer` who made it.
    pub fn finish(
        mut self,
        created: Option<u64>,
        producer: &str,
    ) -> Result<BundleWritten, StoreError> {
        let output = self.output.clone();
        let io = |e: std::io::Error| StoreError::io("write the bundle's table beside", &output, e);
        let chunk = self.builder.take_output();
        self.out.write_all(&chunk).map_err(io)?;
        let (rest, slot, _) = self.builder.finish();
        self.out.write_all(&rest).map_err(io)?;
        let table = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        table.write_all_at(&slot, SLOT_A).map_err(io)?;
        let len = table.metadata().map_err(io)?.len();
        // Read back: every byte a reader would use.
        let file = Arc::new(table);
        let t = Table::open(FileBytes::whole(Arc::clone(&file)), &self.limits)
            .map_err(|e| crate::tablefile::table_error(&output, e))?;
        let report = check_table(&t, |_, _, _| ControlFlow::Continue(()));
        if let Some(first) = report.problems.first() {
            return Err(crate::tablefile::format_error(
                &output,
                FormatError::Invalid {
                    what: "bundle",
                    detail: format!("the table would not read back ({first}); nothing was written"),
                },
            ));
        }
        let (crc, sha) = digests(&file, 0, len).map_err(io)?;
        let manifest = self.manifest.finish(
            &self.app,
            self.schema,
            cache_format::FORMAT_VERSION,
            sha,
            created.unwrap_or(self.latest / 1000),
            producer,
        );
        let mut bundle = AtomicFile::create(&output, true)?;
        let head = bundle_head(&manifest, len);
        bundle.write_all(&head)?;
        let mut at = 0;
        let mut buf = vec![0u8; 1 << 20];
        while at < len {
            let n = (len - at).min(buf.len() as u64) as usize;
            file.read_exact_at(&mut buf[..n], at).map_err(io)?;
            bundle.write_all(&buf[..n])?;
            at += n as u64;
        }
        let mut tail = vec![0xce];
        tail.extend_from_slice(&crc.to_be_bytes());
        bundle.write_all(&tail)?;
        bundle.commit()?;
        Ok(BundleWritten {
            manifest,
            bytes: head.len() as u64 + len + 5,
        })
    }
}

/// The CRC-32 and SHA-256 (lower-case hex) of `len` bytes of `file` from `at`, read a chunk
/// at a time.
fn digests(file: &File, at: u64, len: u64) -> std::io::Result<(u32, String)> {
    let mut crc = crc32fast::Hasher::new();
    let mut sha = cache_format::bundle::Sha256Stream::default();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], at + done)?;
        crc.update(&buf[..n]);
        sha.update(&buf[..n]);
        done += n as u64;
    }
    Ok((crc.finalize(), sha.hex()))
}

/// What [`check_bundle`] found.
#[derive(Debug, Clone)]
pub struct BundleCheck {
    /// The bundle's size.
    pub bytes: u64,
    /// Its manifest, if it could be read.
    pub manifest: Option<Manifest>,
    /// Every problem, one line each (empty: sound).
    pub problems: Vec<String>,
    /// Its scopes, each with its number of entries (what the entries say, not the manifest).
    pub scopes: Vec<(Scope, u64)>,
}

/// Checks a bundle whole (see the module docs) without holding it in memory (a version 3
/// bundle; an older one is read whole). Only an I/O error is an `Err`; damage is listed.
pub fn check_bundle(path: &Path, limits: &Limits) -> Result<BundleCheck, StoreError> {
    let file = crate::fsio::open_regular(path)?
        .ok_or_else(|| StoreError::io("read", path, std::io::ErrorKind::NotFound.into()))?;
    let bytes = file
        .metadata()
        .map_err(|e| StoreError::io("inspect", path, e))?
        .len();
    let mut out = BundleCheck {
        bytes,
        manifest: None,
        problems: Vec::new(),
        scopes: Vec::new(),
    };
    let file = Arc::new(file);
    let region = match locate(&file, bytes) {
        Ok(Some(region)) => region,
        Ok(None) => return check_whole(path, &file, limits, out),
        Err(e) => {
            out.problems.push(e.to_string());
            return Ok(out);
        }
    };
    let Located {
        manifest,
        offset,
        len,
    } = region;
    let io = |e: std::io::Error| StoreError::io("read", path, e);
    let (crc, sha) = digests(&file, offset, len).map_err(io)?;
    let mut stored = [0u8; 5];
    match file.read_exact_at(&mut stored, offset + len) {
        Ok(())
            if stored[0] == 0xce
                && u32::from_be_bytes(stored[1..].try_into().expect("4")) == crc => {}
        Ok(()) => out
            .problems
            .push("bundle snapshot: its checksum does not match its bytes".to_owned()),
        Err(_) => out
            .problems
            .push("bundle: cut short after its table".to_owned()),
    }
    if offset + len + 5 != bytes {
        out.problems.push(format!(
            "bundle: {} bytes where {} were expected",
            bytes,
            offset + len + 5
        ));
    }
    if sha != manifest.payload_sha256 {
        out.problems.push(format!(
            "bundle: the table's SHA-256 is {sha}, the manifest says {}",
            manifest.payload_sha256
        ));
    }
    let t = match Table::open(FileBytes::region(Arc::clone(&file), offset, len), limits) {
        Ok(t) => t,
        Err(e) => {
            out.problems.push(format!("its table: {e}"));
            out.manifest = Some(manifest);
            return Ok(out);
        }
    };
    let mut truth = ManifestBuilder::default();
    let report = check_table(&t, |scope, ns, entry| {
        truth.add(scope, ns, &entry);
        ControlFlow::Continue(())
    });
    out.problems
        .extend(report.problems.iter().map(|p| format!("its table: {p}")));
    let head = t.head();
    let truth = truth.finish(
        &head.app,
        head.schema,
        cache_format::FORMAT_VERSION,
        manifest.payload_sha256.clone(),
        manifest.created,
        &manifest.producer,
    );
    out.problems
        .extend(problems_against(&manifest, &truth, BUNDLE_VERSION));
    if let Ok(dir) = t.directory() {
        out.scopes = dir
            .scopes
            .values()
            .map(|s| (s.scope.clone(), s.entries()))
            .collect();
    }
    out.manifest = Some(manifest);
    Ok(out)
}

/// The manifest of a version 3 bundle and where its table is; `None` for an older version.
pub(crate) fn locate(file: &File, len: u64) -> Result<Option<Located>, FormatError> {
    let mut head = vec![0u8; len.min(4096) as usize];
    let truncated = |needed| FormatError::Truncated {
        what: "bundle",
        offset: 0,
        needed,
        available: len,
    };
    file.read_exact_at(&mut head, 0)
        .map_err(|_| truncated(head.len() as u64))?;
    if head.len() < 12 || head[2..10] != *BUNDLE_MARKER.as_bytes() {
        return Err(FormatError::NotTunecache {
            what: "bundle",
            marker: BUNDLE_MARKER,
        });
    }
    let found = loop {
        match locate_table(&head) {
            Ok(Ok(found)) => break found,
            Ok(Err(needed)) if needed > head.len() as u64 && needed <= len.min(64 << 20) => {
                head = vec![0u8; needed as usize];
                file.read_exact_at(&mut head, 0)
                    .map_err(|_| truncated(needed))?;
            }
            Ok(Err(needed)) => return Err(truncated(needed)),
            Err(FormatError::Malformed { .. }) => return Ok(None),
            Err(e) => return Err(e),
        }
    };
    if found.offset + found.len > len {
        return Err(truncated(found.offset + found.len));
    }
    Ok(Some(found))
}

/// The whole of a bundle of version 1 or 2 (`file`, `len` bytes as its size said): refused
/// before anything is read when over the bound, and read no further than it even if the file
/// grows meanwhile.
fn read_old(
    file: &File,
    len: u64,
    limits: &Limits,
) -> std::io::Result<Result<Vec<u8>, FormatError>> {
    if len > limits.max_file_bytes {
        return Ok(Err(FormatError::TooLarge {
            what: "bundle",
            len,
            limit: limits.max_file_bytes,
        }));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    std::io::Read::read_to_end(
        &mut std::io::Read::take(file, limits.max_file_bytes),
        &mut bytes,
    )?;
    Ok(Ok(bytes))
}

/// A bundle of version 1 or 2, read and checked whole.
fn check_whole(
    path: &Path,
    file: &File,
    limits: &Limits,
    mut out: BundleCheck,
) -> Result<BundleCheck, StoreError> {
    let bytes = match read_old(file, out.bytes, limits) {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            out.problems.push(e.to_string());
            return Ok(out);
        }
        Err(e) => return Err(StoreError::io("read", path, e)),
    };
    let bundle = match read_bundle(&bytes, limits) {
        Ok(b) => b,
        Err(e) => {
            out.problems.push(e.to_string());
            return Ok(out);
        }
    };
    let snap = match cache_format::read_snapshot(bundle.snapshot, limits) {
        Ok(s) => s,
        Err(e) => {
            out.problems.push(format!("its snapshot: {e}"));
            return Ok(out);
        }
    };
    let as_stored = Migrations::new(snap.header.app.clone(), snap.header.schema);
    let data = match cache_migrate::upgrade_snapshot(&as_stored, &snap, limits) {
        Ok(d) => d.data,
        Err(e) => {
            out.problems.push(format!("its entries: {e}"));
            return Ok(out);
        }
    };
    let header = (
        snap.header.app.as_str(),
        snap.header.schema,
        snap.format.number(),
    );
    out.problems.extend(cache_format::bundle::manifest_problems(
        &bundle.manifest,
        &bundle,
        header,
        &data,
    ));
    out.scopes = data
        .scopes()
        .map(|(s, sd)| {
            (
                s.clone(),
                sd.namespaces().map(|(_, e)| e.len() as u64).sum(),
            )
        })
        .collect();
    out.manifest = Some(bundle.manifest);
    Ok(out)
}

/// A bundle opened for reading its entries: its manifest and an [`Inspection`] of the cache
/// inside (a version 3 bundle's table read in place; an older one's snapshot read whole),
/// as stored, with the gate `registry` would apply named.
pub fn open_bundle(
    path: &Path,
    limits: &Limits,
    registry: Option<&Migrations>,
) -> Result<(Manifest, Inspection), StoreError> {
    let file = crate::fsio::open_regular(path)?
        .ok_or_else(|| StoreError::io("read", path, std::io::ErrorKind::NotFound.into()))?;
    let len = file
        .metadata()
        .map_err(|e| StoreError::io("inspect", path, e))?
        .len();
    let file = Arc::new(file);
    let format = |e: FormatError| crate::tablefile::format_error(path, e);
    match locate(&file, len).map_err(format)? {
        Some(Located {
            manifest,
            offset,
            len: size,
        }) => {
            let t = Table::open(FileBytes::region(file, offset, size), limits)
                .map_err(|e| crate::tablefile::table_error(path, e))?;
            Ok((manifest, Inspection::of_table(path, t, limits, registry)))
        }
        None => {
            let bytes = read_old(&file, len, limits)
                .map_err(|e| StoreError::io("read", path, e))?
                .map_err(format)?;
            let bundle = read_bundle(&bytes, limits).map_err(format)?;
            let snap = cache_format::read_snapshot(bundle.snapshot, limits).map_err(format)?;
            let data: CacheData = cache_format::raw::decode_snapshot(&snap).map_err(format)?;
            let inspection =
                Inspection::of_data(path, &snap.header, snap.format, data, limits, registry);
            Ok((bundle.manifest, inspection))
        }
    }
}
