//! Issue 24, case 18: a bundle whose manifest was rewritten to lie about its snapshot (and
//! checksummed again, so the framing holds) is damage: `bundle verify` exits 3 naming what
//! differs, `bundle import` takes nothing. The lies: the scope list repeated many times, a
//! namespace count for a namespace that is not there, other scope fields, other candidate
//! sets, another time range, another entry count.

use cache_core::cache_format::Limits;
use cache_core::cache_format::bundle::{Manifest, encode_bundle, read_bundle};
use test_support::cli::{stderr, stdout};

use crate::diff::{Cands, entry, write};
use crate::tunecache;

const X_WINS: Cands<'static> = &[("x", Some((100.0, 5.0))), ("y", Some((200.0, 5.0)))];

/// A change to a manifest.
type Lie = Box<dyn Fn(&mut Manifest)>;

fn p(path: &std::path::Path) -> &str {
    path.to_str().expect("utf-8")
}

#[test]
fn a_manifest_that_lies_about_its_snapshot_is_damage() {
    let dir = tempfile::tempdir().expect("dir");
    let source = dir.path().join("source.tcache");
    write(&source, (1..=5).map(|id| entry(id, 0, X_WINS)).collect());
    let good = dir.path().join("good.tcb");
    let o = tunecache(&source, &["bundle", "create", "-o", p(&good)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let bytes = std::fs::read(&good).expect("bundle");
    let bundle = read_bundle(&bytes, &Limits::default()).expect("a sound bundle");
    assert_eq!(
        tunecache(&source, &["bundle", "verify", p(&good)])
            .status
            .code(),
        Some(0)
    );
    let lies: Vec<(&str, Lie)> = vec![
        (
            "scope list repeated",
            Box::new(|m: &mut Manifest| {
                let one = m.scopes[0].clone();
                m.scopes = vec![one; 20_000];
            }),
        ),
        (
            "a namespace that is not there",
            Box::new(|m: &mut Manifest| {
                m.scopes[0].namespaces.insert("ghost".into(), 3);
            }),
        ),
        (
            "other scope fields",
            Box::new(|m: &mut Manifest| {
                m.scopes[0].fields = r#"{"device":"H100"}"#.into();
            }),
        ),
        (
            "other candidate sets",
            Box::new(|m: &mut Manifest| {
                m.scopes[0].candidate_sets = vec!["ff".repeat(16)];
            }),
        ),
        (
            "another time range",
            Box::new(|m: &mut Manifest| {
                m.time_range = Some((1, 2));
            }),
        ),
        (
            "another entry count",
            Box::new(|m: &mut Manifest| {
                m.entries += 1;
                m.scopes[0].entries += 1;
            }),
        ),
        (
            "another bundle format",
            Box::new(|m: &mut Manifest| {
                m.bundle_format = 1;
            }),
        ),
    ];
    for (what, lie) in lies {
        let mut manifest = bundle.manifest.clone();
        lie(&mut manifest);
        let lying = dir.path().join("lying.tcb");
        std::fs::write(&lying, encode_bundle(&manifest, bundle.snapshot)).expect("write");
        let verify = tunecache(&source, &["bundle", "verify", p(&lying)]);
        assert_eq!(verify.status.code(), Some(3), "{what}: {}", stderr(&verify));
        // Said field by field, never as a Rust debug print (a hostile review found one).
        let said = format!("{}{}", stdout(&verify), stderr(&verify));
        assert!(
            !said.contains("ManifestScope") && !said.contains("Some("),
            "{what}: {said}"
        );
        let target = dir.path().join("target.tcache");
        let import = tunecache(&target, &["bundle", "import", p(&lying)]);
        assert_ne!(import.status.code(), Some(0), "{what}: imported");
        assert!(!target.exists(), "{what}: nothing is imported");
    }
}
