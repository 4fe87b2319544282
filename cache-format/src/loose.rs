//! Loose matching after an upgrade (FORMAT.md, "Loose matching"): a scope's fields named
//! `version.<family>` version one family of candidates only (a kernel library, a backend), so
//! an entry stored under a scope that differs from the current one only in such fields still
//! describes the candidates of every family whose version did not change. A candidate's family
//! is its `backend` param if that is a string, else its algorithm name.

use crate::{CandidateId, Scope, Value};

/// The prefix of the scope fields that version one family of candidates.
pub const FAMILY_VERSION_PREFIX: &str = "version.";

/// The family of a candidate: its `backend` param if that is a string, else its algorithm.
pub(crate) fn candidate_family(id: &CandidateId) -> &str {
    match id.params.get("backend") {
        Some(Value::Str(family)) => family,
        _ => &id.algorithm,
    }
}

/// The names of the fields whose values differ between two scopes (a field one lacks
/// differs), in order.
pub fn differing_fields<'a>(a: &'a Scope, b: &'a Scope) -> Vec<&'a str> {
    let (fa, fb) = (a.fields(), b.fields());
    let mut names: Vec<&str> = fa
        .keys()
        .chain(fb.keys())
        .map(String::as_str)
        .filter(|k| fa.get(k) != fb.get(k))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// Whether an entry stored under `stored`, whose winner is `winner`, may be used loosely
/// under `current`: the scopes differ, every differing field is a family's version, and the
/// winner's own family's version is not among them.
pub fn loose_match(current: &Scope, stored: &Scope, winner: &CandidateId) -> bool {
    let differ = differing_fields(current, stored);
    let own = format!("{FAMILY_VERSION_PREFIX}{}", candidate_family(winner));
    !differ.is_empty()
        && differ
            .iter()
            .all(|f| f.starts_with(FAMILY_VERSION_PREFIX) && *f != own)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Fields;

    fn scope(pairs: &[(&str, &str)]) -> Scope {
        Scope::new(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
                .collect::<Fields>(),
        )
    }

    #[test]
    fn a_winner_whose_own_version_is_unchanged_matches_loosely() {
        let old = scope(&[
            ("device", "H100"),
            ("version.cudnn", "9.1"),
            ("version.triton", "3.1"),
        ]);
        let triton_bump = scope(&[
            ("device", "H100"),
            ("version.cudnn", "9.1"),
            ("version.triton", "3.2"),
        ]);
        let cudnn = CandidateId::new("cudnn_conv", &[]);
        let mut via_param = CandidateId::new("implicit_gemm", &[]);
        via_param
            .params
            .insert("backend".to_owned(), Value::from("cudnn"));
        let triton = CandidateId::new("triton", &[]);
        assert_eq!(candidate_family(&via_param), "cudnn");
        assert_eq!(differing_fields(&triton_bump, &old), ["version.triton"]);
        assert!(loose_match(&triton_bump, &old, &via_param));
        assert!(
            !loose_match(&triton_bump, &old, &triton),
            "its own version changed"
        );
        // The family is the algorithm when no backend param says otherwise; one with no version
        // field of its own is unchanged by any version bump.
        assert_eq!(candidate_family(&cudnn), "cudnn_conv");
        assert!(loose_match(&triton_bump, &old, &cudnn));
        // Another device, or the same scope, is never loose.
        let other_device = scope(&[
            ("device", "A100"),
            ("version.cudnn", "9.1"),
            ("version.triton", "3.2"),
        ]);
        assert!(!loose_match(&other_device, &old, &via_param));
        assert!(!loose_match(&old, &old, &via_param));
        // A version field added or removed counts as changed.
        let added = scope(&[
            ("device", "H100"),
            ("version.cudnn", "9.1"),
            ("version.triton", "3.1"),
            ("version.cutlass", "4"),
        ]);
        assert!(loose_match(&added, &old, &via_param));
    }
}
