//! The container format versions this build knows (FORMAT.md, "Versions").

use crate::error::FormatError;

/// The container format version of the cache files this build writes (and the newest it
/// reads): format 4, the table ([`crate::table`]).
pub const FORMAT_VERSION: u32 = 4;

/// A container format version this build knows: a closed set, so adding one is a
/// compile-time decision everywhere versions are matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FormatVersion {
    /// The first format.
    V1,
    /// Candidates may record their measurement policy (`policy`).
    V2,
    /// A candidate may be one another tool chose, without figures (status `chosen`).
    V3,
    /// The cache file is a table ([`crate::table`]): a copy-on-write B+tree that opens in
    /// constant time. Its entries, and the journal's records, are format 3's.
    V4,
}

impl FormatVersion {
    /// The current version.
    pub const CURRENT: FormatVersion = FormatVersion::V4;

    /// The newest layout of payloads and entries: format 4 changed only the file around them.
    pub const CURRENT_PAYLOAD: FormatVersion = FormatVersion::V3;

    /// Maps a number from a file to a known version, or says why it cannot.
    pub fn from_number(found: u64) -> Result<Self, FormatError> {
        match found {
            1 => Ok(FormatVersion::V1),
            2 => Ok(FormatVersion::V2),
            3 => Ok(FormatVersion::V3),
            4 => Ok(FormatVersion::V4),
            n if n > u64::from(FORMAT_VERSION) => Err(FormatError::NewerFormat {
                found: n,
                supported: FORMAT_VERSION,
            }),
            n => Err(FormatError::UnknownFormat { found: n }),
        }
    }

    /// The number written in files.
    pub fn number(self) -> u32 {
        match self {
            FormatVersion::V1 => 1,
            FormatVersion::V2 => 2,
            FormatVersion::V3 => 3,
            FormatVersion::V4 => 4,
        }
    }

    /// Whether payloads (and entries) of this version are laid out as this build writes them:
    /// format 4 changed the file around the entries, not the entries, so a format 3 payload
    /// is current too.
    pub fn is_current_payload(self) -> bool {
        matches!(self, FormatVersion::V3 | FormatVersion::V4)
    }
}
