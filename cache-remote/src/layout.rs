//! The key layout on the server (FORMAT.md, "Shared tier"): the salt, then application,
//! schema, scope fingerprint, namespace and key fingerprint, separated by `:`. The
//! application and namespace are percent-escaped (every byte but ASCII letters, digits, `.`,
//! `_` and `-`), so no field can contain the separator.

use cache_format::{Fingerprint, Scope};

/// The key prefix's format salt: changes whenever the key layout or the value's meaning does,
/// so builds that disagree never read each other's values.
pub(crate) const KEY_SALT: &str = "tc1";

/// The key of one entry on the server.
pub fn remote_key(
    app: &str,
    schema: u32,
    scope: &Fingerprint,
    ns: &str,
    fp: &Fingerprint,
) -> String {
    let mut key = prefix(app, schema);
    key.push_str(&format!("{scope}:"));
    escape_into(&mut key, ns);
    key.push(':');
    key.push_str(&fp.to_hex());
    key
}

/// The keys of one application and schema.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    app: String,
    schema: u32,
    prefix: String,
}

impl Layout {
    pub(crate) fn new(app: &str, schema: u32) -> Self {
        Layout {
            app: app.to_owned(),
            schema,
            prefix: prefix(app, schema),
        }
    }

    /// `tc1:<app>:<schema>:`.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn key(&self, scope: &Scope, ns: &str, fp: &Fingerprint) -> String {
        remote_key(&self.app, self.schema, &scope.fingerprint(), ns, fp)
    }

    /// What every key of one scope starts with.
    #[cfg(feature = "s3")]
    pub(crate) fn scope_prefix(&self, scope: &Scope) -> String {
        format!("{}{}:", self.prefix, scope.fingerprint().to_hex())
    }

    /// Every key of one scope.
    pub(crate) fn scope_pattern(&self, scope: &Scope) -> String {
        format!("{}{}:*", self.prefix, scope.fingerprint().to_hex())
    }

    /// Every scope's key for one key of a namespace.
    pub(crate) fn key_pattern(&self, ns: &str, fp: &Fingerprint) -> String {
        let mut pattern = format!("{}*:", self.prefix);
        escape_into(&mut pattern, ns);
        pattern.push(':');
        pattern.push_str(&fp.to_hex());
        pattern
    }

    /// The scope fingerprint, namespace and key fingerprint a key of this application and
    /// schema names.
    pub(crate) fn parse(&self, key: &str) -> Option<(Fingerprint, String, Fingerprint)> {
        let rest = key.strip_prefix(&self.prefix)?;
        let mut parts = rest.split(':');
        let scope = parts.next()?.parse().ok()?;
        let ns = unescape(parts.next()?)?;
        let fp = parts.next()?.parse().ok()?;
        parts.next().is_none().then_some((scope, ns, fp))
    }
}

fn prefix(app: &str, schema: u32) -> String {
    let mut p = format!("{KEY_SALT}:");
    escape_into(&mut p, app);
    p.push_str(&format!(":{schema}:"));
    p
}

fn escape_into(out: &mut String, s: &str) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

/// The inverse of the key's percent-escaping.
fn unescape(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_escape_their_free_fields() {
        let fp = Fingerprint([0xab; 16]);
        let scope = Fingerprint([1; 16]);
        let key = remote_key("my:app/1", 3, &scope, "mat mul", &fp);
        assert_eq!(
            key,
            format!(
                "tc1:my%3Aapp%2F1:3:{}:mat%20mul:{}",
                scope.to_hex(),
                fp.to_hex()
            )
        );
        assert_eq!(key.matches(':').count(), 5);
    }

    #[test]
    fn a_key_names_its_scope_namespace_and_fingerprint_back() {
        let layout = Layout::new("my:app", 4);
        let (scope, fp) = (Fingerprint([7; 16]), Fingerprint([9; 16]));
        for ns in ["matmul", "mat mul:%", "ünï/code"] {
            let key = remote_key("my:app", 4, &scope, ns, &fp);
            assert_eq!(
                layout.parse(&key),
                Some((scope, ns.to_owned(), fp)),
                "{key}"
            );
        }
        let other_schema = remote_key("my:app", 5, &scope, "matmul", &fp);
        assert_eq!(layout.parse(&other_schema), None);
        assert_eq!(layout.parse("tc1:my%3Aapp:4:zz:matmul:zz"), None);
    }
}
