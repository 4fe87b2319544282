//! `tunecache export --to vllm DIR`: the namespace's winners written as vLLM tuned-config
//! files. A file that was imported and whose configs are still the winners is written back
//! byte for byte from its kept text; one whose winners changed is written in the source's
//! layout (member order, field order, indent, final newline) with the new configs; keys that
//! came from no file get new files named as vLLM names them, written as vLLM writes them
//! (`json.dump(indent=4)` and a newline).

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use cache_core::cache_format::{CacheData, Entry, Fields, Scope, Value};

use super::{
    CONFIG_ALGORITHM, ConfigFile, DEVICE_FIELD, M_FIELD, SOURCE_ALGORITHM, files_namespace,
};
use crate::names::{value_json, write_scalar, write_string};
use crate::tree::{Json, Node, parse};

/// Why nothing was exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A file to write exists with other contents: tunecache does not overwrite what it did
    /// not write.
    #[error("{}: exists and differs from what the export would write; nothing was written (export into an empty directory)", .0.display())]
    Exists(PathBuf),
    /// Writing failed.
    #[error("{}: cannot be written: {error}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        error: String,
    },
    /// A kept file name or text that cannot be written back.
    #[error("the cache's record of {file:?} cannot be exported: {what}; nothing was written")]
    Damaged {
        /// The kept relative path.
        file: String,
        /// What is wrong.
        what: String,
    },
    /// Nothing of the namespace is in the cache.
    #[error("the cache holds no entries of namespace {0:?}; nothing was written")]
    Empty(String),
    /// Two groups of entries (two scopes with one `device_name`, keys `{"E":8}` and
    /// `{"E":"8"}`) would be written to one file with different contents.
    #[error(
        "{file}: two groups of entries would be written to this one file with different configs (two scopes with the same device name, or key fields that differ only in type); nothing was written"
    )]
    Collision {
        /// The relative path.
        file: String,
    },
    /// A folder on the way to a file inside the export directory is a symbolic link (or not a
    /// folder): the export writes only inside the directory it was given.
    #[error("{}: is not a folder of the export directory (a symbolic link, or a file); nothing was written", .0.display())]
    NotInside(PathBuf),
}

/// What an export wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportSummary {
    /// Files written (or already there with the same bytes).
    pub files: usize,
    /// Of those, written back byte for byte from an imported file's text.
    pub verbatim: usize,
    /// Of those, already present with the same bytes (left alone).
    pub unchanged: usize,
}

/// A key's configs: the scope and key fields but `M` (as JSON text), then `M` → params.
type Groups = BTreeMap<(String, String), Group>;

struct Group {
    scope: Scope,
    key: Fields,
    configs: BTreeMap<i64, Fields>,
}

/// Every file of `namespace` as (relative path, text), in path order; the second value says
/// how many are the kept texts verbatim.
pub fn render(
    data: &CacheData,
    namespace: &str,
) -> Result<(Vec<(String, String)>, usize), ExportError> {
    let mut groups = winners(data, namespace);
    let files_ns = files_namespace(namespace);
    let mut out = Vec::new();
    let mut verbatim = 0;
    for (scope, ns, entry) in data.entries() {
        if ns != files_ns.as_str() {
            continue;
        }
        let Some((rel, text)) = kept_text(entry) else {
            continue;
        };
        check_relative(&rel)?;
        let damaged = |what: String| ExportError::Damaged {
            file: rel.clone(),
            what,
        };
        let file =
            ConfigFile::read(Path::new(&rel), &rel, &text).map_err(|e| damaged(e.to_string()))?;
        let group = groups.remove(&group_id(scope, &file.key));
        let now: BTreeMap<i64, Fields> = group.map(|g| g.configs).unwrap_or_default();
        let before: BTreeMap<i64, Fields> = file.configs.iter().cloned().collect();
        if now.is_empty() || now == before {
            // Nothing measured or chosen since: the file as it was shipped.
            out.push((rel, text));
            verbatim += 1;
        } else {
            out.push((rel, layout_of(&text).write(&file.doc, &now)));
        }
    }
    for group in groups.into_values() {
        let name = file_name(&group.scope, &group.key);
        check_relative(&name)?;
        let doc = Node {
            line: 1,
            value: Json::Object(Vec::new()),
        };
        out.push((name, Layout::VLLM.write(&doc, &group.configs)));
    }
    if out.is_empty() {
        return Err(ExportError::Empty(namespace.to_owned()));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    // Two groups with one file name: the same text is one file; different texts cannot both
    // be written.
    let mut i = 1;
    while i < out.len() {
        if out[i].0 == out[i - 1].0 {
            if out[i].1 != out[i - 1].1 {
                return Err(ExportError::Collision {
                    file: out[i].0.clone(),
                });
            }
            out.remove(i);
        } else {
            i += 1;
        }
    }
    Ok((out, verbatim))
}

/// The winners of `namespace`, grouped by file: per entry, its best `@config` candidate
/// that did not fail (a measurement, else a shipped choice).
fn winners(data: &CacheData, namespace: &str) -> Groups {
    let mut groups = Groups::new();
    for (scope, ns, entry) in data.entries() {
        if ns != namespace {
            continue;
        }
        let mut key = entry.key().fields().clone();
        let Some(Value::Int(m)) = key.remove(M_FIELD) else {
            continue;
        };
        let Some(best) = entry
            .candidates()
            .iter()
            .find(|c| c.usable() && c.id.algorithm == CONFIG_ALGORITHM)
        else {
            continue;
        };
        groups
            .entry(group_id(scope, &key))
            .or_insert_with(|| Group {
                scope: scope.clone(),
                key,
                configs: BTreeMap::new(),
            })
            .configs
            .insert(m, best.id.params.clone());
    }
    groups
}

fn group_id(scope: &Scope, key: &Fields) -> (String, String) {
    let (mut s, mut k) = (String::new(), String::new());
    value_json(&mut s, &Value::Map(scope.fields().clone()));
    value_json(&mut k, &Value::Map(key.clone()));
    (s, k)
}

fn kept_text(entry: &Entry) -> Option<(String, String)> {
    let Some(Value::Str(rel)) = entry.key().fields().get("file") else {
        return None;
    };
    let source = entry
        .candidates()
        .iter()
        .find(|c| c.id.algorithm == SOURCE_ALGORITHM)?;
    match source.id.params.get("text") {
        Some(Value::Str(text)) => Some((rel.clone(), text.clone())),
        _ => None,
    }
}

/// A kept path must stay under the export directory: relative, no `..`, no empty part.
fn check_relative(rel: &str) -> Result<(), ExportError> {
    let path = Path::new(rel);
    let plain = !rel.is_empty()
        && !rel.contains('\0')
        && path.components().all(|c| matches!(c, Component::Normal(_)))
        && rel.ends_with(".json");
    if plain {
        Ok(())
    } else {
        Err(ExportError::Damaged {
            file: rel.to_owned(),
            what: "the name is not a relative path to a .json file".to_owned(),
        })
    }
}

/// vLLM's name for a key's file: `E`, `N`, `K` first, other fields by name, then
/// `device_name`, `dtype`, `block_shape` (as `get_config_file_name` orders them).
fn file_name(scope: &Scope, key: &Fields) -> String {
    let first = ["E", "N", "K"];
    let last = ["dtype", "block_shape"];
    let mut parts: Vec<(String, &Value)> = Vec::new();
    for f in first {
        if let Some(v) = key.get(f) {
            parts.push((f.to_owned(), v));
        }
    }
    for (k, v) in key.iter() {
        if !first.contains(&k.as_str()) && !last.contains(&k.as_str()) {
            parts.push((k.clone(), v));
        }
    }
    if let Some(v) = scope.fields().get(DEVICE_FIELD) {
        parts.push((DEVICE_FIELD.to_owned(), v));
    }
    for f in last {
        if let Some(v) = key.get(f) {
            parts.push((f.to_owned(), v));
        }
    }
    let text: Vec<String> = parts
        .into_iter()
        .map(|(k, v)| match v {
            Value::Str(s) => format!("{k}={s}"),
            other => {
                let mut s = String::new();
                value_json(&mut s, other);
                format!("{k}={s}")
            }
        })
        .collect();
    let folder = match scope.fields().get("version.triton") {
        Some(Value::Str(v)) => format!("triton_{}/", v.replace('.', "_")),
        _ => String::new(),
    };
    format!("{folder}{}.json", text.join(","))
}

/// How a source file is laid out.
struct Layout {
    /// Spaces per level (`None`: one line, `", "` and `": "` separators).
    indent: Option<usize>,
    newline_at_end: bool,
}

impl Layout {
    const VLLM: Layout = Layout {
        indent: Some(4),
        newline_at_end: true,
    };

    /// The document `doc` with each batch size's config replaced by `configs` (new batch
    /// sizes after, in order; field order the source's, new fields after by name).
    fn write(&self, doc: &Node, configs: &BTreeMap<i64, Fields>) -> String {
        let members: &[(String, Node)] = match &doc.value {
            Json::Object(m) => m,
            _ => &[],
        };
        let order_of = |m: i64| -> Vec<String> {
            let own = members
                .iter()
                .find(|(k, _)| super::batch_size(k) == Some(m));
            let any = members.iter().find(|(k, _)| super::batch_size(k).is_some());
            match own.or(any).map(|(_, v)| &v.value) {
                Some(Json::Object(fields)) => fields.iter().map(|(k, _)| k.clone()).collect(),
                _ => Vec::new(),
            }
        };
        let mut items: Vec<(String, Item<'_>)> = Vec::new();
        for (k, v) in members {
            match super::batch_size(k) {
                Some(m) => {
                    if let Some(params) = configs.get(&m) {
                        items.push((k.clone(), Item::Config(params, order_of(m))));
                    }
                }
                None => items.push((k.clone(), Item::Scalar(&v.value))),
            }
        }
        for (m, params) in configs {
            if !members
                .iter()
                .any(|(k, _)| super::batch_size(k) == Some(*m))
            {
                items.push((m.to_string(), Item::Config(params, order_of(*m))));
            }
        }
        let mut out = String::new();
        self.object(&mut out, 0, &items);
        if self.newline_at_end {
            out.push('\n');
        }
        out
    }

    fn object(&self, out: &mut String, level: usize, items: &[(String, Item<'_>)]) {
        if items.is_empty() {
            out.push_str("{}");
            return;
        }
        out.push('{');
        for (i, (k, item)) in items.iter().enumerate() {
            if i > 0 {
                out.push(',');
                if self.indent.is_none() {
                    out.push(' ');
                }
            }
            self.newline(out, level + 1);
            write_string(out, k);
            out.push_str(": ");
            match item {
                Item::Scalar(v) => write_scalar(out, v),
                Item::Config(params, order) => {
                    let fields = config_fields(params, order);
                    let nested: Vec<(String, Item<'_>)> = fields
                        .iter()
                        .map(|(k, v)| (k.clone(), Item::Cell(v)))
                        .collect();
                    self.object(out, level + 1, &nested);
                }
                Item::Cell(Cell::Value(v)) => value_json(out, v),
                Item::Cell(Cell::Raw(t)) => out.push_str(t),
            }
        }
        self.newline(out, level);
        out.push('}');
    }

    fn newline(&self, out: &mut String, level: usize) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    }
}

enum Item<'a> {
    Scalar(&'a Json),
    Config(&'a Fields, Vec<String>),
    Cell(&'a Cell),
}

/// A config field's value: canonical, or a number kept as its source text (a float).
enum Cell {
    Value(Value),
    Raw(String),
}

/// A config's fields in `order`, the rest by name; a config kept whole as JSON text
/// (`{"json": ...}`) is opened up.
fn config_fields(params: &Fields, order: &[String]) -> Vec<(String, Cell)> {
    let opened: Vec<(String, Cell)> = match params.get("json") {
        Some(Value::Str(text)) if params.len() == 1 => match parse(text) {
            Ok(Node {
                value: Json::Object(members),
                ..
            }) => members
                .into_iter()
                .map(|(k, v)| {
                    let cell = match (crate::names::to_value(&v), v.value) {
                        (Some(value), _) => Cell::Value(value),
                        (None, Json::Number(t)) => Cell::Raw(t),
                        (None, _) => Cell::Raw("null".to_owned()),
                    };
                    (k, cell)
                })
                .collect(),
            _ => cells(params),
        },
        _ => cells(params),
    };
    let mut rest: Vec<(String, Cell)> = Vec::new();
    let mut ordered: Vec<Option<(String, Cell)>> = order.iter().map(|_| None).collect();
    for (k, cell) in opened {
        match order.iter().position(|o| *o == k) {
            Some(i) => ordered[i] = Some((k, cell)),
            None => rest.push((k, cell)),
        }
    }
    rest.sort_by(|a, b| a.0.cmp(&b.0));
    ordered.into_iter().flatten().chain(rest).collect()
}

fn cells(params: &Fields) -> Vec<(String, Cell)> {
    params
        .iter()
        .map(|(k, v)| (k.clone(), Cell::Value(v.clone())))
        .collect()
}

/// The layout of a kept text: its indent (the spaces before the first member) and final
/// newline.
fn layout_of(text: &str) -> Layout {
    let body = text.trim_start().strip_prefix('{').unwrap_or("");
    let indent = body
        .strip_prefix('\n')
        .or_else(|| body.strip_prefix("\r\n"))
        .map(|rest| rest.len() - rest.trim_start_matches(' ').len());
    Layout {
        indent,
        newline_at_end: text.ends_with('\n'),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout writer given a file's own configs writes the file again (for a file laid
    /// out as `json.dump(indent=N)` writes it).
    fn rewritten(text: &str) -> String {
        let file = ConfigFile::read(Path::new("f.json"), "E=1,N=2.json", text).expect("reads");
        let configs: BTreeMap<i64, Fields> = file.configs.iter().cloned().collect();
        layout_of(text).write(&file.doc, &configs)
    }

    #[test]
    fn the_layout_writer_reproduces_json_dump_layouts() {
        if let Some(dir) = std::env::var_os("VLLM_CONFIGS") {
            let (mut same, mut all) = (0, 0);
            for f in std::fs::read_dir(dir).expect("dir") {
                let path = f.expect("item").path();
                if path.extension().is_none_or(|e| e != "json") {
                    continue;
                }
                let text = std::fs::read_to_string(path).expect("text");
                all += 1;
                same += usize::from(rewritten(&text) == text);
            }
            eprintln!("{same} of {all} files rewritten byte for byte");
        }
        for text in [
            "{\n    \"1\": {\n        \"BLOCK_SIZE_M\": 16,\n        \"num_warps\": 4\n    },\n    \"triton_version\": \"3.4.0\"\n}\n",
            "{\n  \"16\": {\n    \"b\": 1,\n    \"a\": \"x\"\n  },\n  \"2\": {}\n}",
            "{\"1\": {\"z\": 1, \"a\": 2}}",
            "{\n    \"1\": {\n        \"kpack\": 2,\n        \"f\": 0.5\n    }\n}\n",
        ] {
            assert_eq!(rewritten(text), text);
        }
    }
}
