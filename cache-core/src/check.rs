//! Whether every reader would accept an entry: the one check that `put`, `import`, bundles,
//! the record writer and the table migration make before anything is written. Its own room,
//! below the cache, so the writers beside and below it use it without reaching up into the
//! save queue.

use cache_format::{CacheData, Entry, Fingerprint, Scope};

use crate::error::Refusal;

/// Whether every reader would accept `entry` (in `scope` and namespace `ns`): finite
/// statistics, and its encoding within the bounds and caps of `limits`. A `Cache` refuses what
/// is not where it enters (`put`, `import`), with a warning, so it never holds back the good
/// entries saved with it; a tool that imports all or nothing checks first with this.
pub fn check_entry(
    scope: &Scope,
    ns: &str,
    entry: &Entry,
    limits: &cache_format::Limits,
) -> Result<(), Refusal> {
    let key = cache_format::table::TKey::of(scope, ns, &entry.fingerprint());
    let bytes = cache_format::table::encode_entry(entry);
    check_encoded(scope, ns, entry, &key, &bytes, limits)
}

/// What [`check_entry`] checks on the model: nesting (named by field) and statistics.
fn check_model(scope: &Scope, entry: &Entry, limits: &cache_format::Limits) -> Result<(), Refusal> {
    // Nesting first, so the error names the field (the encoded check below only has an offset).
    // `what` is named only for a refusal: a put that passes formats nothing.
    let too_deep = |what: &dyn Fn() -> String, fields: &cache_format::Fields, max: u32| {
        fields.iter().find_map(|(name, v)| {
            let depth = v.depth();
            (depth > max).then(|| Refusal::TooDeep {
                what: what(),
                name: name.clone(),
                depth,
                max,
            })
        })
    };
    let nesting = too_deep(
        &|| "scope field".to_owned(),
        scope.fields(),
        limits.max_scope_field_depth(),
    )
    .or_else(|| {
        too_deep(
            &|| "key field".to_owned(),
            entry.key().fields(),
            limits.max_key_field_depth(),
        )
    })
    .or_else(|| {
        entry.candidates().iter().find_map(|c| {
            let what = || format!("{} param", c.id.algorithm);
            too_deep(&what, &c.id.params, limits.max_param_depth())
        })
    });
    if let Some(why) = nesting {
        return Err(why);
    }
    for c in entry.candidates() {
        if let Some(s) = c.stats()
            && !(s.median_ns.is_finite() && s.min_ns.is_finite() && s.spread_ns.is_finite())
        {
            return Err(Refusal::NonFinite {
                candidate: c.id.to_string(),
            });
        }
        if let Some(s) = c.stats()
            && (s.median_ns < 0.0 || s.min_ns < 0.0 || s.spread_ns < 0.0)
        {
            return Err(Refusal::Negative {
                candidate: c.id.to_string(),
            });
        }
    }
    Ok(())
}

/// [`check_entry`] of an entry already encoded as a table stores it (`bytes`, under `key`),
/// for writers that write those bytes next: the checks that do not need the bytes, then the
/// entry as a table's reader checks it (the quick check first; the decoder, for its message,
/// only when that declines).
pub(crate) fn check_encoded(
    scope: &Scope,
    ns: &str,
    entry: &Entry,
    key: &cache_format::table::TKey,
    bytes: &[u8],
    limits: &cache_format::Limits,
) -> Result<(), Refusal> {
    check_model(scope, entry, limits)?;
    cache_format::table::check_entry(key, ns, bytes, limits).map_err(Refusal::Unreadable)?;
    // The scope and namespace as a journal record or a table's directory holds them: checked
    // in a payload with this entry, once per thread for each scope, namespace and bounds.
    thread_local! {
        static CHECKED: std::cell::RefCell<Vec<(Fingerprint, String, cache_format::Limits)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    let fp = scope.fingerprint();
    let known =
        CHECKED.with_borrow(|c| c.iter().any(|(s, n, l)| *s == fp && n == ns && l == limits));
    if !known {
        let mut one = CacheData::new();
        one.insert(scope, ns, entry.clone());
        cache_format::check_payload(&cache_format::encode_payload(&one), limits)
            .map_err(Refusal::Unreadable)?;
        CHECKED.with_borrow_mut(|c| {
            if c.len() >= 64 {
                c.remove(0);
            }
            c.push((fp, ns.to_owned(), *limits));
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cache_format::{Candidate, Fields, Key, Limits, Origin, Stats, Value};

    fn entry(fields: usize, candidates: usize, depth: usize) -> Entry {
        let mut nested = Value::Int(1);
        for _ in 0..depth {
            nested = Value::List(vec![nested]);
        }
        let key = Key::new(
            (0..fields)
                .map(|i| (format!("f{i}"), Value::Int(i as i64)))
                .chain([("deep".to_owned(), nested)])
                .collect::<Fields>(),
        );
        let stats = Stats {
            median_ns: 10.0,
            min_ns: 9.0,
            spread_ns: 1.0,
            samples: 3,
        };
        Entry::new(
            key,
            Fingerprint::default(),
            Origin::Imported("t".into()),
            5,
            (0..candidates).map(|i| Candidate::measured(format!("a{i}"), Fields::new(), stats)),
        )
    }

    /// The quick check says what the whole-payload check says, on entries at and past every
    /// bound it looks at (fields, candidates, nesting), under tight and default limits.
    #[test]
    fn check_entry_agrees_with_the_payload_check() {
        let scope = Scope::default();
        let tight = Limits {
            max_fields: 8,
            max_candidates: 4,
            max_depth: 14,
            ..Limits::default()
        };
        for limits in [tight, Limits::default()] {
            for fields in [0, 6, 7, 8, 9, 300] {
                for candidates in [0, 1, 4, 5] {
                    for depth in [0, 3, 6, 7, 30] {
                        let e = entry(fields, candidates, depth);
                        let mut one = CacheData::new();
                        one.insert(&scope, "mm", e.clone());
                        let whole = cache_format::check_payload(
                            &cache_format::encode_payload(&one),
                            &limits,
                        );
                        let quick = check_entry(&scope, "mm", &e, &limits);
                        assert_eq!(
                            quick.is_ok(),
                            whole.is_ok(),
                            "fields {fields}, candidates {candidates}, depth {depth}, \
                             {limits:?}: {quick:?} against {whole:?}"
                        );
                    }
                }
            }
        }
    }
}
