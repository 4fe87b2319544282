//! Interned namespace names: a `Namespace` is a `Copy` handle, so the hot path hashes and
//! compares a small integer instead of a string.

use std::collections::BTreeMap;
use std::fmt;

use crate::error::StoreError;
use crate::fork_safe::GlobalLock;

/// Most distinct namespace names one process may intern (they are never freed).
pub const MAX_NAMESPACES: usize = 1 << 16;

/// Longest namespace name accepted, in bytes: room for real kernel names (Triton names its
/// cache files after kernels of 150 characters and more, and its adapter's namespace is
/// `triton/<name>`). Readers bound names by nothing else; a claim file shortens a long one.
pub const MAX_NAMESPACE_LEN: usize = 512;

/// An operation family, such as `matmul` or `conv_fwd`, interned for the process.
///
/// Create it once (it takes a global lock) and keep it; copying and comparing it is free.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Namespace {
    id: u32,
    name: &'static str,
}

/// Every name interned, with its id. Fork-safe: a child forked while another thread interns
/// a name interns its own at once.
static TABLE: GlobalLock<BTreeMap<&'static str, u32>> = GlobalLock::new(BTreeMap::new());

impl Namespace {
    /// Interns `name`: 1 to 512 bytes, no control characters.
    pub fn new(name: &str) -> Result<Namespace, StoreError> {
        if name.is_empty() || name.len() > MAX_NAMESPACE_LEN || name.chars().any(char::is_control) {
            return Err(StoreError::InvalidNamespace {
                name: name.chars().take(MAX_NAMESPACE_LEN + 1).collect(),
                reason: "a namespace name has 1 to 512 bytes and no control characters",
            });
        }
        // A poisoned table is still a valid table: interning never leaves it half-updated.
        let mut table = TABLE.lock();
        if let Some((&name, &id)) = table.get_key_value(name) {
            return Ok(Namespace { id, name });
        }
        if table.len() >= MAX_NAMESPACES {
            return Err(StoreError::InvalidNamespace {
                name: name.to_owned(),
                reason: "too many distinct namespace names in this process",
            });
        }
        let id = table.len() as u32;
        let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
        table.insert(name, id);
        Ok(Namespace { id, name })
    }

    /// The name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub(crate) fn id(&self) -> u32 {
        self.id
    }
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Namespace({:?})", self.name)
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}
