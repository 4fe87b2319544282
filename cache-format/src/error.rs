//! Decoding errors. They carry offsets and versions but no path: cache-format does no I/O,
//! and the layer that read the bytes adds the file name.

/// Why bytes are not a usable tunecache file, journal or record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The bytes do not start with the tunecache marker: another kind of file.
    #[error("not a tunecache {what}: it does not start with the {marker:?} marker")]
    NotTunecache {
        /// `file` or `journal`.
        what: &'static str,
        /// The expected marker.
        marker: &'static str,
    },
    /// The data ends before a value it announces.
    #[error(
        "truncated {what}: needs {needed} more bytes at offset {offset}, only {available} remain"
    )]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Where.
        offset: u64,
        /// How many bytes the value announced.
        needed: u64,
        /// How many bytes are left.
        available: u64,
    },
    /// A checksum does not match its data.
    #[error("{what} checksum mismatch: stored {stored:08x}, computed {computed:08x}")]
    Checksum {
        /// What the checksum covers.
        what: &'static str,
        /// The checksum in the file.
        stored: u32,
        /// The checksum of the data as read.
        computed: u32,
    },
    /// Written by a newer tunecache with a container format this build cannot read.
    #[error(
        "format version {found} is newer than this build understands (it reads up to {supported})"
    )]
    NewerFormat {
        /// The version in the file.
        found: u64,
        /// The newest version this build reads.
        supported: u32,
    },
    /// A format version that never existed.
    #[error("format version {found} is not a known tunecache format version")]
    UnknownFormat {
        /// The version in the file.
        found: u64,
    },
    /// A length over a configured limit.
    #[error("{what} is {len} bytes, over the limit of {limit} bytes")]
    TooLarge {
        /// What is too large.
        what: &'static str,
        /// Its length.
        len: u64,
        /// The limit.
        limit: u64,
    },
    /// More of something than the limit allows (scopes, namespaces, candidates, fields).
    #[error("{what}: {count} is over the limit of {limit}")]
    TooMany {
        /// What there are too many of.
        what: &'static str,
        /// How many (the first count found over the limit).
        count: u64,
        /// The limit.
        limit: u64,
    },
    /// Nesting deeper than the limit.
    #[error("{what} nests deeper than {limit} levels at offset {offset}")]
    TooDeep {
        /// What was being read.
        what: &'static str,
        /// Where.
        offset: u64,
        /// The limit.
        limit: u32,
    },
    /// Not valid msgpack, or not the structure this format version prescribes.
    #[error("malformed {what} at offset {offset}: {detail}")]
    Malformed {
        /// What was being read.
        what: &'static str,
        /// Where.
        offset: u64,
        /// What is wrong.
        detail: String,
    },
    /// Structurally valid msgpack whose content breaks a rule of the model.
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// What was being decoded.
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
}

impl FormatError {
    pub(crate) fn malformed(what: &'static str, offset: usize, detail: impl Into<String>) -> Self {
        FormatError::Malformed {
            what,
            offset: offset as u64,
            detail: detail.into(),
        }
    }

    pub(crate) fn invalid(what: &'static str, detail: impl ToString) -> Self {
        FormatError::Invalid {
            what,
            detail: detail.to_string(),
        }
    }
}
