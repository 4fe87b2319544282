//! The trust policy (`TUNECACHE_TRUST=FILE`) and what a machine keeps of it. A policy file is
//! one JSON object:
//!
//! ```text
//! {"kind": "tunecache-trust-1",
//!  "policy": "{\"version\":2,\"threshold\":2,\"keys\":[{\"key_id\":...,\"public\":...},...]}",
//!  "signatures": [{"key_id": ..., "sig": ...}, ...]}
//! ```
//!
//! `policy` is the policy's JSON text, kept as text so signers sign the same bytes: ed25519
//! over `tunecache/policy/1`, a 0x00 byte and that text. A machine keeps the policy it
//! accepted (in the folder of its generations, `trust-state.json`, with the highest generation
//! number it verified per application). A policy given is taken when the machine has none yet
//! (the operator installed it), when it is the one accepted, or when its version is higher and
//! at least the accepted policy's threshold of the accepted policy's keys signed it (a
//! rotation); otherwise the accepted policy stays in force, with a warning. A generation is
//! trusted when at least `threshold` distinct keys of the policy signed its statement, the
//! statement names the bundle's SHA-256, application, schema and scopes, it has not expired,
//! and its number is not below the highest this machine verified for the application.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::keys::{KeyPair, PublicKey, hex, read_small, unhex};
use super::statement::{Signature, Signed, Statement};

/// `TUNECACHE_TRUST`: the trust policy file.
pub(crate) const ENV_TRUST: &str = "TUNECACHE_TRUST";

const POLICY_KIND: &str = "tunecache-trust-1";
const POLICY_TAG: &[u8] = b"tunecache/policy/1\0";
const STATE_FILE: &str = "trust-state.json";

/// Why a key, a policy or a generation is not trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    /// A key file that cannot be used.
    #[error("{0}")]
    Key(String),
    /// A policy file that cannot be used.
    #[error("{0}")]
    Policy(String),
    /// A generation or bundle the policy refuses, and why.
    #[error("{0}")]
    Refused(String),
}

/// A policy's body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Body {
    version: u64,
    threshold: usize,
    keys: Vec<PublicKey>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PolicyFile {
    kind: String,
    policy: String,
    #[serde(default)]
    signatures: Vec<Signature>,
}

/// A trust policy, read and checked.
#[derive(Debug, Clone)]
pub struct Trust {
    body: Body,
    file: PolicyFile,
    /// Where it was read from, for messages.
    from: String,
}

/// What the machine keeps (see the module docs).
#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    /// The accepted policy file's text.
    accepted: Option<String>,
    /// The highest generation number verified, per application.
    highest: BTreeMap<String, u64>,
}

/// The policy file `TUNECACHE_TRUST` names in `settings`, if it is set and not blank.
pub fn policy_path(settings: &cache_core::settings::Settings) -> Option<PathBuf> {
    let path = settings.get_os(ENV_TRUST)?;
    let text = path.to_string_lossy();
    if text.trim().is_empty() {
        return None;
    }
    // Trimmed where the name is text; a path that is not UTF-8 is taken as it is.
    Some(match path.to_str() {
        Some(t) => PathBuf::from(t.trim()),
        None => PathBuf::from(path),
    })
}

/// The policy `TUNECACHE_TRUST` names in `settings`, if it is set.
pub fn from_settings(
    settings: &cache_core::settings::Settings,
) -> Result<Option<Trust>, TrustError> {
    match policy_path(settings) {
        Some(path) => Trust::read(&path)
            .map(Some)
            .map_err(|e| TrustError::Policy(format!("{ENV_TRUST}: {e}"))),
        None => Ok(None),
    }
}

impl Trust {
    /// The policy of `version` naming `keys`, `threshold` of which must sign a generation; its
    /// file's text, signed by `signers` (the current policy's keys, for a rotation).
    pub fn write(
        version: u64,
        threshold: usize,
        keys: Vec<PublicKey>,
        signers: &[KeyPair],
    ) -> Result<String, TrustError> {
        let body = Body {
            version,
            threshold,
            keys,
        };
        body_checked(&body).map_err(TrustError::Policy)?;
        let text = serde_json::to_string(&body).expect("a policy encodes");
        let message = policy_message(&text);
        let file = PolicyFile {
            kind: POLICY_KIND.to_owned(),
            signatures: signers
                .iter()
                .map(|k| Signature {
                    key_id: k.public().key_id.clone(),
                    sig: hex(&k.sign(&message)),
                })
                .collect(),
            policy: text,
        };
        Ok(serde_json::to_string(&file).expect("a policy encodes") + "\n")
    }

    /// Reads and checks a policy file.
    pub fn read(path: &Path) -> Result<Trust, TrustError> {
        let bytes = read_small(path).map_err(|e| TrustError::Policy(e.to_string()))?;
        Trust::parse(&bytes, &path.display().to_string())
    }

    fn parse(bytes: &[u8], from: &str) -> Result<Trust, TrustError> {
        let bad = |why: String| TrustError::Policy(format!("{from}: {why}"));
        let file: PolicyFile = serde_json::from_slice(bytes)
            .map_err(|e| bad(format!("not a tunecache trust policy: {e}")))?;
        if file.kind != POLICY_KIND {
            return Err(bad(format!("a policy of kind {:?}", file.kind)));
        }
        let body: Body = serde_json::from_str(&file.policy)
            .map_err(|e| bad(format!("its policy is not one: {e}")))?;
        body_checked(&body).map_err(bad)?;
        Ok(Trust {
            body,
            file,
            from: from.to_owned(),
        })
    }

    /// Its version.
    pub fn version(&self) -> u64 {
        self.body.version
    }

    /// How many keys of it signed `text` (the policy text `signatures` are over).
    fn signers_of(&self, message: &[u8], signatures: &[Signature]) -> usize {
        let mut good = BTreeSet::new();
        for s in signatures {
            let Some(key) = self.body.keys.iter().find(|k| k.key_id == s.key_id) else {
                continue;
            };
            if unhex(&s.sig, 64).is_some_and(|sig| key.verifies(message, &sig)) {
                good.insert(&key.key_id);
            }
        }
        good.len()
    }

    /// The policy in force in the folder `dir`: this one if the machine may take it (see the
    /// module docs), which it then keeps; else the one it accepted before, with a warning.
    pub fn in_force(self, dir: &Path) -> Result<Trust, TrustError> {
        with_state(dir, |state| self.chosen(state))
    }

    /// [`Trust::in_force`] as an inspecting command sees it: the same choice, but nothing is
    /// kept (a policy offered first is not taken for good by a `bundle verify`).
    pub fn in_force_unchanged(self, dir: &Path) -> Result<Trust, TrustError> {
        let path = dir.join(STATE_FILE);
        let mut state: State = match cache_core::file::read_bounded(&path, 1 << 20) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                TrustError::Policy(format!("the trust state in {}: {e}", dir.display()))
            })?,
            Err(_) => State::default(),
        };
        self.chosen(&mut state)
    }

    /// The policy in force given the machine's `state`, which records a policy taken.
    fn chosen(self, state: &mut State) -> Result<Trust, TrustError> {
        {
            let accepted = state
                .accepted
                .as_deref()
                .map(|t| Trust::parse(t.as_bytes(), "the accepted trust policy"))
                .transpose()?;
            let Some(old) = accepted else {
                state.accepted = Some(self.file_text());
                return Ok(self);
            };
            if old.file.policy == self.file.policy {
                return Ok(self);
            }
            let signed = old.signers_of(&policy_message(&self.file.policy), &self.file.signatures);
            if self.body.version > old.body.version && signed >= old.body.threshold {
                state.accepted = Some(self.file_text());
                return Ok(self);
            }
            tracing::warn!(
                "tunecache: the trust policy {} (version {}) is not taken: {}; the policy this \
                 machine accepted (version {}) stays in force",
                self.from,
                self.body.version,
                if self.body.version <= old.body.version {
                    format!("it is not newer than version {}", old.body.version)
                } else {
                    format!(
                        "{signed} of the {} keys of the accepted policy that must sign a new one \
                         signed it",
                        old.body.threshold
                    )
                },
                old.body.version
            );
            Ok(old)
        }
    }

    fn file_text(&self) -> String {
        serde_json::to_string(&self.file).expect("a policy encodes")
    }

    /// Checks the signature file `signed` of the bundle `bundle_sha256` whose manifest says
    /// `app`, `schema` and `scopes`, at `now` (Unix seconds), against this policy and the
    /// highest number verified in `dir`; records the number. Refused: why, naming the bundle.
    pub fn verify(
        &self,
        signed: Option<&[u8]>,
        bundle_sha256: &str,
        (app, schema, scopes): (&str, u32, &[String]),
        now: u64,
        dir: &Path,
    ) -> Result<u64, TrustError> {
        self.verify_as(signed, bundle_sha256, (app, schema, scopes), now, Some(dir))
    }

    /// [`Trust::verify`] without the rollback check when `dir` is `None` (a bundle shipped by
    /// hand, whose number no fleet counts).
    pub fn verify_as(
        &self,
        signed: Option<&[u8]>,
        bundle_sha256: &str,
        (app, schema, scopes): (&str, u32, &[String]),
        now: u64,
        dir: Option<&Path>,
    ) -> Result<u64, TrustError> {
        let refused = |why: String| {
            TrustError::Refused(format!(
                "{bundle_sha256} is refused by the trust policy {} (version {}): {why}",
                self.from, self.body.version
            ))
        };
        let Some(bytes) = signed else {
            return Err(refused("it is not signed".to_owned()));
        };
        let (signed, statement) = Signed::parse(bytes).map_err(|e| refused(e.to_string()))?;
        let by = self.signers_of(&signed.message(), &signed.signatures);
        if by < self.body.threshold {
            let named: Vec<&str> = signed
                .signatures
                .iter()
                .map(|s| s.key_id.as_str())
                .collect();
            return Err(refused(if by == 0 && !named.is_empty() {
                format!(
                    "no key of the policy signed it (signed by key ids {}, or their signatures do \
                     not verify)",
                    named.join(", ")
                )
            } else {
                format!(
                    "{by} of the {} keys the policy requires signed it",
                    self.body.threshold
                )
            }));
        }
        check_statement(&statement, bundle_sha256, app, schema, scopes, now).map_err(refused)?;
        let Some(dir) = dir else {
            return Ok(statement.number);
        };
        with_state(dir, |state| {
            let highest = state.highest.get(app).copied().unwrap_or(0);
            if statement.number < highest {
                return Err(refused(format!(
                    "its number {} is below {highest}, the highest this machine verified for {app:?} \
                     (a rollback)",
                    statement.number
                )));
            }
            state.highest.insert(app.to_owned(), statement.number);
            Ok(statement.number)
        })
    }
}

/// The statement must name this bundle and be in date.
fn check_statement(
    s: &Statement,
    sha: &str,
    app: &str,
    schema: u32,
    scopes: &[String],
    now: u64,
) -> Result<(), String> {
    if s.bundle_sha256 != sha {
        return Err(format!(
            "its statement names the bundle {}",
            s.bundle_sha256
        ));
    }
    if s.app != app || s.schema != schema {
        return Err(format!(
            "its statement names {:?} schema {}, the bundle is {app:?} schema {schema}",
            s.app, s.schema
        ));
    }
    if s.scopes != scopes {
        return Err("its statement names other scopes than the bundle's manifest".to_owned());
    }
    if s.expires <= now {
        return Err(format!("it expired at {} (Unix seconds)", s.expires));
    }
    Ok(())
}

fn body_checked(body: &Body) -> Result<(), String> {
    if body.threshold == 0 || body.threshold > body.keys.len() {
        return Err(format!(
            "a threshold of {} with {} keys (1 to the number of keys)",
            body.threshold,
            body.keys.len()
        ));
    }
    let mut ids = BTreeSet::new();
    for k in &body.keys {
        k.clone().checked()?;
        if !ids.insert(&k.key_id) {
            return Err(format!("the key {} is named twice", k.key_id));
        }
    }
    Ok(())
}

fn policy_message(text: &str) -> Vec<u8> {
    let mut m = POLICY_TAG.to_vec();
    m.extend_from_slice(text.as_bytes());
    m
}

/// Runs `f` on the machine's trust state in `dir`, under its lock, and keeps what it leaves.
fn with_state<T>(
    dir: &Path,
    f: impl FnOnce(&mut State) -> Result<T, TrustError>,
) -> Result<T, TrustError> {
    let local = |e: &dyn std::fmt::Display| {
        TrustError::Policy(format!("the trust state in {}: {e}", dir.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| local(&e))?;
    let path: PathBuf = dir.join(STATE_FILE);
    let _lock = cache_core::file::FileLock::acquire(
        &dir.join(".trust-state.lock"),
        std::time::Duration::from_secs(10),
    )
    .map_err(|e| local(&e))?;
    let mut state: State = match cache_core::file::read_bounded(&path, 1 << 20) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| local(&e))?,
        Err(_) if !path.exists() => State::default(),
        Err(e) => return Err(local(&e)),
    };
    let before = serde_json::to_vec(&state).map_err(|e| local(&e))?;
    let out = f(&mut state);
    let after = serde_json::to_vec(&state).map_err(|e| local(&e))?;
    if after != before {
        cache_core::file::write_atomic(&path, &after).map_err(|e| local(&e))?;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: usize) -> Vec<KeyPair> {
        (0..n).map(|_| KeyPair::generate().expect("key")).collect()
    }

    fn policy(version: u64, threshold: usize, of: &[KeyPair], signers: &[KeyPair]) -> Trust {
        let text = Trust::write(
            version,
            threshold,
            of.iter().map(|k| k.public().clone()).collect(),
            signers,
        )
        .expect("a policy");
        Trust::parse(text.as_bytes(), "test").expect("reads")
    }

    const SHA: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn statement(number: u64, expires: u64) -> Statement {
        Statement::new(
            SHA.into(),
            "app".into(),
            3,
            vec!["s1".into()],
            number,
            100,
            expires,
        )
    }

    fn check(t: &Trust, signed: &Signed, dir: &Path) -> Result<u64, TrustError> {
        let scopes = vec!["s1".to_owned()];
        t.verify(
            Some(signed.text().as_bytes()),
            SHA,
            ("app", 3, &scopes),
            1_000,
            dir,
        )
    }

    #[test]
    fn a_generation_needs_a_threshold_of_the_policys_keys_in_date_and_never_rolled_back() {
        let dir = tempfile::tempdir().expect("dir");
        let k = keys(3);
        let t = policy(1, 2, &k, &[])
            .in_force(dir.path())
            .expect("first policy");
        let two = Signed::sign(&statement(5, 2_000), &k[..2]);
        assert_eq!(check(&t, &two, dir.path()), Ok(5));
        let said = |r: Result<u64, TrustError>| r.expect_err("refused").to_string();
        let one = Signed::sign(&statement(6, 2_000), &k[..1]);
        assert!(said(check(&t, &one, dir.path())).contains("1 of the 2 keys"));
        let stranger = Signed::sign(&statement(6, 2_000), &keys(2));
        assert!(said(check(&t, &stranger, dir.path())).contains("no key of the policy"));
        let expired = Signed::sign(&statement(6, 900), &k[..2]);
        assert!(said(check(&t, &expired, dir.path())).contains("expired"));
        let older = Signed::sign(&statement(4, 2_000), &k[..2]);
        assert!(said(check(&t, &older, dir.path())).contains("rollback"));
        let mut tampered = Signed::sign(&statement(7, 2_000), &k[..2]);
        tampered.statement = tampered.statement.replace("\"number\":7", "\"number\":8");
        assert!(said(check(&t, &tampered, dir.path())).contains("do not verify"));
        let scopes = vec!["s1".to_owned()];
        assert!(
            t.verify(None, SHA, ("app", 3, &scopes), 1_000, dir.path())
                .expect_err("unsigned")
                .to_string()
                .contains("not signed")
        );
        let other_bundle = Signed::sign(&statement(8, 2_000), &k[..2]);
        assert!(
            t.verify(
                Some(other_bundle.text().as_bytes()),
                &"b".repeat(64),
                ("app", 3, &scopes),
                1_000,
                dir.path()
            )
            .is_err()
        );
        assert_eq!(
            check(&t, &Signed::sign(&statement(5, 2_000), &k[1..]), dir.path()),
            Ok(5),
            "the same number again"
        );
    }

    #[test]
    fn a_new_policy_is_taken_only_when_the_old_keys_signed_it() {
        let dir = tempfile::tempdir().expect("dir");
        let (old, new) = (keys(2), keys(2));
        let first = policy(1, 2, &old, &[]).in_force(dir.path()).expect("first");
        assert_eq!(first.version(), 1);
        // Not signed by the old keys: the old policy stays in force.
        let unsigned = policy(2, 1, &new, &[]).in_force(dir.path()).expect("kept");
        assert_eq!(unsigned.version(), 1);
        let half = policy(2, 1, &new, &old[..1])
            .in_force(dir.path())
            .expect("kept");
        assert_eq!(
            half.version(),
            1,
            "one of the two old keys is below the threshold"
        );
        let rotated = policy(2, 1, &new, &old)
            .in_force(dir.path())
            .expect("taken");
        assert_eq!(rotated.version(), 2);
        // An older policy again, even signed: not taken.
        let back = policy(1, 2, &old, &old).in_force(dir.path()).expect("kept");
        assert_eq!(back.version(), 2);
        assert!(Trust::write(1, 3, new.iter().map(|k| k.public().clone()).collect(), &[]).is_err());
    }
}
