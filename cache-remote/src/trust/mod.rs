//! Signed generations (FORMAT.md, "Signed generations"): whoever can write a bucket could
//! otherwise ship configurations to a whole fleet. The anchors sign what they ship (Nix binary
//! caches check ed25519 signatures against keys the client names; TUF adds a threshold of
//! keys, expiry, rollback protection and key rotation signed by the old keys); so does this.
//!
//! - `keys`: ed25519 key pairs (`tunecache keys generate`), through `ring`, which the TLS
//!   tier already builds on (one crypto library, audited, offline).
//! - `statement`: what a signer vouches for (a bundle's SHA-256, application, schema, scopes,
//!   a number that only grows, created and expires times) and the signatures over it, kept
//!   beside the bundle (`<bundle>.sig`, `generations/<id>.sig`).
//! - `policy`: the trust policy a machine is given (`TUNECACHE_TRUST=FILE`): the keys and how
//!   many must sign; a new policy is taken only if a threshold of the current one's keys signed
//!   it; a generation whose number is below the highest this machine verified is refused.
//!
//! Without a policy nothing is checked and nothing changes.

mod keys;
mod policy;
mod statement;

pub use keys::{KeyPair, PublicKey};
pub use policy::{Trust, TrustError, from_settings, policy_path};
pub use statement::{Signed, Statement};
