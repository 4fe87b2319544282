//! vLLM and SGLang tuned-config directories (IMPORTS.md, "vLLM and SGLang").
//!
//! A file `E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3[,dtype=...][,block_shape=[...]].json`
//! holds `{"<M>": {<config>}, ...}`: for each batch size M, the config the project chose.
//! Each becomes an entry of the namespace (`vllm/fused_moe` unless told), key = the file
//! name's fields but `device_name` plus `M`, scope `device_name` (and `version.triton` for
//! SGLang's `triton_<x>_<y>_<z>` folders), one candidate `@config` with the config as params,
//! status `chosen` (nobody measured it here). The file's text is kept beside them (namespace
//! `<namespace>/files`, key `{"file": <relative path>}`), so [`export`] writes the same bytes
//! back for files whose configs did not change, and the source's order and layout for those
//! that did.

use std::path::Path;

use cache_core::cache_format::{
    Candidate, CandidateId, Entry, Fields, Fingerprint, Key, Origin, Outcome, Value,
};

use crate::files::{find, read_text, relative};
use crate::names::{params_of, split_fields, typed};
use crate::tree::{Json, Node, parse};
use crate::{Format, ImportOptions, ImportSourceError, ImportSummary, scope_with};

mod export;
mod write;

pub use export::{ExportError, ExportSummary, render};
pub use write::export;

/// The candidate every shipped config is recorded as.
pub(crate) const CONFIG_ALGORITHM: &str = "@config";
/// The algorithm of a file's kept text (`params: {"text": ...}`).
pub(crate) const SOURCE_ALGORITHM: &str = "@source";
/// The scope field that names the device (vLLM's `device_name`).
pub(crate) const DEVICE_FIELD: &str = "device_name";
/// The key field of the batch size.
pub(crate) const M_FIELD: &str = "M";

/// The default namespace of a format's configs.
pub fn default_namespace(format: Format) -> &'static str {
    match format {
        Format::Sglang => "sglang/fused_moe",
        _ => "vllm/fused_moe",
    }
}

/// The namespace that keeps the source files' text beside `namespace`'s entries.
pub fn files_namespace(namespace: &str) -> String {
    format!("{namespace}/files")
}

fn chooser(format: Format) -> &'static str {
    match format {
        Format::Sglang => "sglang config",
        _ => "vllm config",
    }
}

/// Whether a file name is a tuned-config file's (`name=value,....json`).
fn is_config_file(name: &str) -> bool {
    name.strip_suffix(".json")
        .and_then(split_fields)
        .is_some_and(|f| !f.is_empty())
}

pub(crate) fn import(
    format: Format,
    root: &Path,
    options: &ImportOptions,
    sink: &mut dyn FnMut(&cache_core::cache_format::Scope, &str, Entry),
    summary: &mut ImportSummary,
) -> Result<usize, ImportSourceError> {
    let ns = options
        .namespace
        .clone()
        .unwrap_or_else(|| default_namespace(format).to_owned());
    let paths = find(
        root,
        1,
        &is_config_file,
        "tuned-config files (name=value,....json)",
    )?;
    for path in &paths {
        let rel = relative(root, path);
        let (text, mtime) = read_text(path)?;
        let file = ConfigFile::read(path, &rel, &text)?;
        let scope = scope_with(file.scope.clone(), options);
        let origin = Origin::Imported(format!("{} {rel}", format.name()));
        for (m, params) in file.configs {
            let mut key = file.key.clone();
            key.insert(M_FIELD, Value::Int(m));
            let mut chosen = Candidate::chosen(CONFIG_ALGORITHM, params, chooser(format));
            chosen.measured_at = mtime;
            sink(&scope, &ns, entry(key, &origin, mtime, chosen));
        }
        if file.extra {
            summary.note(format!(
                "{rel}: members that are not batch sizes (e.g. \"triton_version\") are kept only in the file's text"
            ));
        }
        let mut source = Candidate::new(
            CandidateId::with_params(
                SOURCE_ALGORITHM,
                Fields::from([("text".to_owned(), Value::from(text.as_str()))]),
            ),
            Outcome::Chosen(chooser(format).to_owned()),
        );
        source.measured_at = mtime;
        let key = Fields::from([("file".to_owned(), Value::from(rel.as_str()))]);
        sink(
            &scope,
            &files_namespace(&ns),
            entry(key, &origin, mtime, source),
        );
    }
    Ok(paths.len())
}

fn entry(key: Fields, origin: &Origin, at: u64, candidate: Candidate) -> Entry {
    Entry::new(
        Key::new(key),
        Fingerprint::default(),
        origin.clone(),
        at,
        [candidate],
    )
}

/// One tuned-config file, read.
pub(crate) struct ConfigFile {
    /// The file name's fields but the device, as key fields.
    pub(crate) key: Fields,
    /// `device_name` (and `version.triton` from a `triton_x_y_z` folder).
    pub(crate) scope: Fields,
    /// Each batch size's config, in file order.
    pub(crate) configs: Vec<(i64, Fields)>,
    /// Whether members other than batch sizes were present.
    pub(crate) extra: bool,
    /// The parsed document.
    pub(crate) doc: Node,
}

impl ConfigFile {
    pub(crate) fn read(
        path: &Path,
        rel: &str,
        text: &str,
    ) -> Result<ConfigFile, ImportSourceError> {
        let (folder, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        let stem = name.strip_suffix(".json").unwrap_or(name);
        let fields = split_fields(stem).ok_or_else(|| {
            ImportSourceError::whole(path, "its name is not name=value,... fields")
        })?;
        let (mut key, mut scope) = (Fields::new(), Fields::new());
        for (k, v) in fields {
            if k == DEVICE_FIELD {
                scope.insert(k, Value::from(v.as_str()));
            } else if key.insert(k.clone(), typed(&v)).is_some() || k == M_FIELD {
                return Err(ImportSourceError::whole(
                    path,
                    format!("its name gives the field {k:?} twice or names the batch size"),
                ));
            }
        }
        if let Some(version) = folder.rsplit('/').next().and_then(triton_folder) {
            scope.insert("version.triton", Value::from(version.as_str()));
        }
        let doc = parse(text).map_err(|e| ImportSourceError::at(path, e.line, e.what))?;
        let Json::Object(members) = &doc.value else {
            return Err(ImportSourceError::at(
                path,
                doc.line,
                format!(
                    "the document is {}, not an object of batch sizes",
                    doc.kind()
                ),
            ));
        };
        let mut configs = Vec::new();
        let mut extra = false;
        for (m, config) in members {
            match (batch_size(m), &config.value) {
                (Some(m), Json::Object(params)) => configs.push((m, config_params(path, params)?)),
                (Some(_), _) => {
                    return Err(ImportSourceError::at(
                        path,
                        config.line,
                        format!(
                            "the config of batch size {m} is {}, not an object",
                            config.kind()
                        ),
                    ));
                }
                (None, Json::Str(_) | Json::Number(_) | Json::Bool(_)) => extra = true,
                (None, _) => {
                    return Err(ImportSourceError::at(
                        path,
                        config.line,
                        format!("the member {m:?} is not a batch size (a non-negative integer)"),
                    ));
                }
            }
        }
        Ok(ConfigFile {
            key,
            scope,
            configs,
            extra,
            doc,
        })
    }
}

/// A config's fields as params: values integers, strings or booleans; anything else is refused
/// with its line (a float is kept whole as JSON text).
fn config_params(path: &Path, params: &[(String, Node)]) -> Result<Fields, ImportSourceError> {
    for (k, v) in params {
        if matches!(v.value, Json::Null | Json::Array(_) | Json::Object(_)) {
            return Err(ImportSourceError::at(
                path,
                v.line,
                format!(
                    "the config field {k:?} is {}, not a number or a string",
                    v.kind()
                ),
            ));
        }
    }
    Ok(params_of(params))
}

/// `"16"` → 16; a member name that is not a plain non-negative integer → `None`.
pub(crate) fn batch_size(name: &str) -> Option<i64> {
    name.parse::<i64>()
        .ok()
        .filter(|m| *m >= 0 && m.to_string() == name)
}

/// `triton_3_1_0` → `3.1.0`.
fn triton_folder(name: &str) -> Option<String> {
    let rest = name.strip_prefix("triton_")?;
    (!rest.is_empty()
        && rest
            .split('_')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())))
    .then(|| rest.replace('_', "."))
}
