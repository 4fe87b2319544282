//! ed25519 key pairs and their files. A secret key file is one JSON object
//! `{"kind":"tunecache-ed25519-secret","key_id":"<16 hex>","public":"<64 hex>","seed":"<64 hex>"}`,
//! written with mode 0600; a public one `{"kind":"tunecache-ed25519-public","key_id":...,
//! "public":...}`. A key's id is the first 8 bytes (16 hex digits) of SHA-256 over
//! `tunecache/key/1`, a 0x00 byte and the 32-byte public key.

use std::path::Path;

use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::TrustError;

/// The domain tag of key ids.
const KEY_TAG: &[u8] = b"tunecache/key/1\0";

/// A public key: what a policy names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublicKey {
    /// Its id: the first 8 bytes of SHA-256 over `tunecache/key/1`, 0x00 and the key.
    pub key_id: String,
    /// The 32-byte ed25519 public key, in hex.
    pub public: String,
}

/// A key pair: signs statements.
pub struct KeyPair {
    pair: Ed25519KeyPair,
    seed: [u8; 32],
    public: PublicKey,
}

impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyPair({})", self.public.key_id)
    }
}

#[derive(Serialize, Deserialize)]
struct SecretFile {
    kind: String,
    key_id: String,
    public: String,
    seed: String,
}

#[derive(Serialize, Deserialize)]
struct PublicFile {
    kind: String,
    key_id: String,
    public: String,
}

const SECRET_KIND: &str = "tunecache-ed25519-secret";
const PUBLIC_KIND: &str = "tunecache-ed25519-public";

/// The id of the public key `public` (32 bytes).
pub(crate) fn key_id(public: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(KEY_TAG);
    h.update(public);
    hex(&h.finalize()[..8])
}

/// The encodings (little-endian y, the sign bit left out) of the points of small order on
/// edwards25519, canonical and not: 0, 1, p - 1, p, p + 1 and the two y of the points of order 8.
/// A public key among them verifies forged signatures (with R of small order and S = 0, any
/// message), so no key file or policy takes one (libsodium refuses the same list).
const SMALL_ORDER: [[u8; 32]; 7] = {
    let mut p_minus_1 = [0xff; 32];
    p_minus_1[0] = 0xec;
    p_minus_1[31] = 0x7f;
    let mut p = p_minus_1;
    p[0] = 0xed;
    let mut p_plus_1 = p_minus_1;
    p_plus_1[0] = 0xee;
    let mut one = [0; 32];
    one[0] = 1;
    [
        [0; 32],
        one,
        p_minus_1,
        p,
        p_plus_1,
        [
            0x26, 0xe8, 0x95, 0x8f, 0xc2, 0xb2, 0x27, 0xb0, 0x45, 0xc3, 0xf4, 0x89, 0xf2, 0xef,
            0x98, 0xf0, 0xd5, 0xdf, 0xac, 0x05, 0xd3, 0xc6, 0x33, 0x39, 0xb1, 0x38, 0x02, 0x88,
            0x6d, 0x53, 0xfc, 0x05,
        ],
        [
            0xc7, 0x17, 0x6a, 0x70, 0x3d, 0x4d, 0xd8, 0x4f, 0xba, 0x3c, 0x0b, 0x76, 0x0d, 0x10,
            0x67, 0x0f, 0x2a, 0x20, 0x53, 0xfa, 0x2c, 0x39, 0xcc, 0xc6, 0x4e, 0xc7, 0xfd, 0x77,
            0x92, 0xac, 0x03, 0x7a,
        ],
    ]
};

/// Whether the 32-byte `public` encodes y at or above p = 2^255 - 19 (not canonical: RFC 8032
/// decoding refuses it).
pub(crate) fn non_canonical(public: &[u8]) -> bool {
    public.len() == 32
        && public[31] & 0x7f == 0x7f
        && public[1..31].iter().all(|b| *b == 0xff)
        && public[0] >= 0xed
}

/// Whether the 32-byte public key `public` is a point of small order (see [`SMALL_ORDER`]).
pub(crate) fn small_order(public: &[u8]) -> bool {
    let Ok(mut y) = <[u8; 32]>::try_from(public) else {
        return false;
    };
    y[31] &= 0x7f;
    SMALL_ORDER.contains(&y)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn unhex(text: &str, len: usize) -> Option<Vec<u8>> {
    if text.len() != len * 2 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..len)
        .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok())
        .collect()
}

impl KeyPair {
    /// A new key pair from the system's random source.
    pub fn generate() -> Result<KeyPair, TrustError> {
        let mut seed = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed)
            .map_err(|_| TrustError::Key("the system's random source failed".to_owned()))?;
        Self::from_seed(seed)
    }

    fn from_seed(seed: [u8; 32]) -> Result<KeyPair, TrustError> {
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed)
            .map_err(|e| TrustError::Key(format!("not an ed25519 seed: {e}")))?;
        let public_bytes = pair.public_key().as_ref().to_vec();
        let public = PublicKey {
            key_id: key_id(&public_bytes),
            public: hex(&public_bytes),
        };
        Ok(KeyPair { pair, seed, public })
    }

    /// Its public key.
    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// The signature of `message`.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.pair.sign(message).as_ref().to_vec()
    }

    /// The secret key file's text.
    pub fn secret_text(&self) -> String {
        let file = SecretFile {
            kind: SECRET_KIND.to_owned(),
            key_id: self.public.key_id.clone(),
            public: self.public.public.clone(),
            seed: hex(&self.seed),
        };
        serde_json::to_string(&file).expect("a key file encodes") + "\n"
    }

    /// The public key file's text.
    pub fn public_text(&self) -> String {
        self.public.text()
    }

    /// Reads a secret key file.
    pub fn read(path: &Path) -> Result<KeyPair, TrustError> {
        let bad = |why: &str| TrustError::Key(format!("{}: {why}", path.display()));
        let bytes = read_small(path)?;
        let file: SecretFile =
            serde_json::from_slice(&bytes).map_err(|_| bad("not a tunecache secret key file"))?;
        if file.kind != SECRET_KIND {
            return Err(bad("not a tunecache secret key file"));
        }
        let seed: [u8; 32] = unhex(&file.seed, 32)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| bad("its seed is not 64 hex digits"))?;
        let pair = Self::from_seed(seed)?;
        if pair.public.public != file.public || pair.public.key_id != file.key_id {
            return Err(bad("its public key or id does not match its seed"));
        }
        Ok(pair)
    }
}

impl PublicKey {
    /// The public key file's text.
    pub fn text(&self) -> String {
        let file = PublicFile {
            kind: PUBLIC_KIND.to_owned(),
            key_id: self.key_id.clone(),
            public: self.public.clone(),
        };
        serde_json::to_string(&file).expect("a key file encodes") + "\n"
    }

    /// Reads a public key file (or the public half of a secret one).
    pub fn read(path: &Path) -> Result<PublicKey, TrustError> {
        let bad = |why: &str| TrustError::Key(format!("{}: {why}", path.display()));
        let bytes = read_small(path)?;
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|_| bad("not a tunecache key file"))?;
        if v["kind"] != PUBLIC_KIND && v["kind"] != SECRET_KIND {
            return Err(bad("not a tunecache key file"));
        }
        let key = PublicKey {
            key_id: v["key_id"].as_str().unwrap_or_default().to_owned(),
            public: v["public"].as_str().unwrap_or_default().to_owned(),
        };
        key.checked().map_err(|why| bad(&why))
    }

    /// The key if its public part is 32 bytes and its id is the id of them.
    pub(crate) fn checked(self) -> Result<PublicKey, String> {
        let Some(bytes) = unhex(&self.public, 32) else {
            return Err("its public key is not 64 hex digits".to_owned());
        };
        if non_canonical(&bytes) {
            return Err(
                "its public key is not a canonical encoding (its y is at least 2^255 - 19)"
                    .to_owned(),
            );
        }
        if small_order(&bytes) {
            return Err(
                "its public key is a point of small order (a weak key: it would verify forged \
                 signatures)"
                    .to_owned(),
            );
        }
        if key_id(&bytes) != self.key_id {
            return Err(format!(
                "its id {:?} is not the id of its public key",
                self.key_id.escape_debug().to_string()
            ));
        }
        Ok(self)
    }

    /// Whether `sig` is this key's signature of `message`.
    pub fn verifies(&self, message: &[u8], sig: &[u8]) -> bool {
        unhex(&self.public, 32).is_some_and(|public| {
            !small_order(&public)
                && UnparsedPublicKey::new(&ED25519, public)
                    .verify(message, sig)
                    .is_ok()
        })
    }
}

/// A small file (a key, a policy, a signature file): a regular file of at most 1 MiB.
pub(crate) fn read_small(path: &Path) -> Result<Vec<u8>, TrustError> {
    // The error names the file already.
    cache_core::file::read_bounded(path, 1 << 20).map_err(|e| TrustError::Key(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_signs_and_its_files_round_trip() {
        let dir = tempfile::tempdir().expect("dir");
        let pair = KeyPair::generate().expect("key");
        let (secret, public) = (dir.path().join("a.key"), dir.path().join("a.pub"));
        std::fs::write(&secret, pair.secret_text()).expect("write");
        std::fs::write(&public, pair.public_text()).expect("write");
        let back = KeyPair::read(&secret).expect("reads");
        assert_eq!(back.public(), pair.public());
        let pubkey = PublicKey::read(&public).expect("reads");
        let sig = back.sign(b"hello");
        assert!(pubkey.verifies(b"hello", &sig));
        assert!(!pubkey.verifies(b"hellO", &sig));
        let other = KeyPair::generate().expect("key");
        assert!(!other.public().verifies(b"hello", &sig));
        // A public file whose id is not its key's is refused.
        let mut forged = pubkey.clone();
        forged.key_id = other.public().key_id.clone();
        std::fs::write(&public, forged.text()).expect("write");
        assert!(PublicKey::read(&public).is_err());
        std::fs::write(&public, "hello").expect("write");
        assert!(PublicKey::read(&public).is_err());
    }

    /// A key of small order (found by a hostile review: the identity point, with R the
    /// identity and S = 0, "signed" any statement) is refused in a key file or policy and
    /// verifies nothing, in every encoding (the sign bit set too).
    #[test]
    fn a_key_of_small_order_is_refused_and_verifies_nothing() {
        let forged = {
            let mut sig = vec![0u8; 64];
            sig[0] = 1; // R: the identity point; S: 0
            sig
        };
        for (i, point) in SMALL_ORDER.iter().enumerate() {
            for sign in [0u8, 0x80] {
                let mut public = *point;
                public[31] |= sign;
                let key = PublicKey {
                    key_id: key_id(&public),
                    public: hex(&public),
                };
                assert!(key.clone().checked().is_err(), "point {i} sign {sign}");
                assert!(!key.verifies(b"any statement", &forged), "point {i}");
            }
        }
        // Nor is any encoding of y at or above p (RFC 8032 refuses it).
        for low in [0xed, 0xee, 0xff] {
            let mut public = [0xff; 32];
            public[0] = low;
            public[31] = 0x7f;
            let key = PublicKey {
                key_id: key_id(&public),
                public: hex(&public),
            };
            assert!(key.checked().is_err(), "y = p + {}", low - 0xed);
        }
        // A real key is none of them.
        let pair = KeyPair::generate().expect("key");
        assert!(pair.public().clone().checked().is_ok());
    }
}
