//! What a signer vouches for, and the signatures over it. A signature file (`<bundle>.sig`
//! beside a bundle, `PREFIX/generations/<id>.sig` beside a generation) is one JSON object:
//!
//! ```text
//! {"kind": "tunecache-signatures-1",
//!  "statement": "<the statement's JSON text>",
//!  "signatures": [{"key_id": "<16 hex>", "sig": "<128 hex>"}, ...]}
//! ```
//!
//! The statement is kept as text, so every signer and verifier signs the same bytes: each
//! signature is ed25519 over `tunecache/statement/1`, a 0x00 byte, and that text's UTF-8
//! bytes. The statement's fields: `kind` (`tunecache-statement-1`), `bundle_sha256` (the
//! bundle file's SHA-256, lower-case hex: a generation's id), `app`, `schema`, `scopes` (the
//! scope fingerprints the bundle's manifest lists, in its order), `number` (grows with every
//! generation a fleet publishes: rollback protection), `created` and `expires` (Unix seconds).

use serde::{Deserialize, Serialize};

use super::TrustError;
use super::keys::{KeyPair, hex};

/// The domain tag signatures are made over.
pub(crate) const STATEMENT_TAG: &[u8] = b"tunecache/statement/1\0";

const SIGNATURES_KIND: &str = "tunecache-signatures-1";
const STATEMENT_KIND: &str = "tunecache-statement-1";

/// What a signer vouches for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Statement {
    /// `tunecache-statement-1`.
    pub kind: String,
    /// The bundle file's SHA-256 (lower-case hex).
    pub bundle_sha256: String,
    /// The application of its entries.
    pub app: String,
    /// Their schema.
    pub schema: u32,
    /// The scope fingerprints of its manifest, in its order.
    pub scopes: Vec<String>,
    /// Grows with every generation a fleet publishes.
    pub number: u64,
    /// When it was signed, Unix seconds.
    pub created: u64,
    /// When it stops being trusted, Unix seconds.
    pub expires: u64,
}

impl Statement {
    /// A statement of kind `tunecache-statement-1`.
    #[allow(clippy::too_many_arguments, reason = "every field of the statement")]
    pub fn new(
        bundle_sha256: String,
        app: String,
        schema: u32,
        scopes: Vec<String>,
        number: u64,
        created: u64,
        expires: u64,
    ) -> Statement {
        Statement {
            kind: STATEMENT_KIND.to_owned(),
            bundle_sha256,
            app,
            schema,
            scopes,
            number,
            created,
            expires,
        }
    }
}

/// One signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Signature {
    /// The signer's key id.
    pub(crate) key_id: String,
    /// The ed25519 signature, in hex.
    pub(crate) sig: String,
}

/// A signature file: the statement's text and the signatures over it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signed {
    kind: String,
    /// The statement's JSON text, as signed.
    pub(crate) statement: String,
    /// The signatures.
    pub(crate) signatures: Vec<Signature>,
}

impl Signed {
    /// `statement` signed by each of `keys`.
    pub fn sign(statement: &Statement, keys: &[KeyPair]) -> Signed {
        let text = serde_json::to_string(statement).expect("a statement encodes");
        let message = message(&text);
        Signed {
            kind: SIGNATURES_KIND.to_owned(),
            signatures: keys
                .iter()
                .map(|k| Signature {
                    key_id: k.public().key_id.clone(),
                    sig: hex(&k.sign(&message)),
                })
                .collect(),
            statement: text,
        }
    }

    /// The file's text.
    pub fn text(&self) -> String {
        serde_json::to_string(self).expect("signatures encode") + "\n"
    }

    /// A signature file's bytes, read; the statement decoded.
    pub fn parse(bytes: &[u8]) -> Result<(Signed, Statement), TrustError> {
        let bad = |why: String| TrustError::Refused(why);
        let signed: Signed =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not a signature file: {e}")))?;
        if signed.kind != SIGNATURES_KIND {
            return Err(bad(format!("a signature file of kind {:?}", signed.kind)));
        }
        let statement: Statement = serde_json::from_str(&signed.statement)
            .map_err(|e| bad(format!("its statement is not one: {e}")))?;
        if statement.kind != STATEMENT_KIND {
            return Err(bad(format!("a statement of kind {:?}", statement.kind)));
        }
        Ok((signed, statement))
    }

    /// The bytes each signature is over.
    pub(crate) fn message(&self) -> Vec<u8> {
        message(&self.statement)
    }
}

pub(crate) fn message(text: &str) -> Vec<u8> {
    let mut m = STATEMENT_TAG.to_vec();
    m.extend_from_slice(text.as_bytes());
    m
}
