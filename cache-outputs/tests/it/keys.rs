//! torchcache's collision cases give different keys; 100k random inputs give none.

use std::collections::HashSet;

use cache_outputs::{Arg, KeyBuilder};
use cache_outputs::{Fields, Value};

use crate::{content, f32_tensor};

fn image() -> Vec<u8> {
    content(7, 3 * 224 * 224 * 4)
}

#[test]
fn a_change_in_any_value_changes_the_key() {
    let shape = [3, 224, 224];
    let base = image();
    let k = |data: &[u8]| {
        KeyBuilder::new("backbone", "1")
            .arg(Arg::Tensor(f32_tensor(&shape, data)))
            .finish()
    };
    let reference = k(&base);
    // torchcache samples every ~15th value: change one it skips, and every single byte.
    let mut keys = HashSet::from([reference]);
    for at in [
        1usize,
        4 * 7 + 1,
        4 * 14 + 2,
        base.len() / 2,
        base.len() - 1,
    ] {
        let mut changed = base.clone();
        changed[at] ^= 1;
        assert!(
            keys.insert(k(&changed)),
            "a change at byte {at} changed the key"
        );
    }
    // Same bytes, another shape or dtype: another key.
    let other_shape = [3, 224 * 224];
    assert_ne!(
        reference,
        KeyBuilder::new("backbone", "1")
            .arg(Arg::Tensor(f32_tensor(&other_shape, &base)))
            .finish()
    );
}

#[test]
fn reordered_or_repeated_scalars_give_different_keys() {
    let x = image();
    let shape = [3, 224, 224];
    let k = |args: &[Arg<'_>]| {
        let mut b = KeyBuilder::new("f", "1").arg(Arg::Tensor(f32_tensor(&shape, &x)));
        for a in args {
            b = b.arg(*a);
        }
        b.finish()
    };
    // torchcache XORs the non-tensor arguments: f(x,1,2) == f(x,2,1), f(x,5,5) == f(x).
    assert_ne!(
        k(&[Arg::Int(1), Arg::Int(2)]),
        k(&[Arg::Int(2), Arg::Int(1)])
    );
    assert_ne!(k(&[Arg::Int(5), Arg::Int(5)]), k(&[]));
    assert_ne!(k(&[Arg::Int(1)]), k(&[Arg::Bool(true)]));
    assert_ne!(k(&[Arg::Int(1)]), k(&[Arg::UInt(1)]));
    assert_ne!(k(&[Arg::Float(0.0)]), k(&[Arg::Float(-0.0)]));
    assert_eq!(k(&[Arg::Float(f64::NAN)]), k(&[Arg::Float(-f64::NAN)]));
    assert_ne!(
        k(&[Arg::Str("ab"), Arg::Str("c")]),
        k(&[Arg::Str("a"), Arg::Str("bc")])
    );
    assert_ne!(k(&[Arg::None]), k(&[]));
}

#[test]
fn the_version_config_and_a_weight_buffer_are_part_of_the_key() {
    let x = image();
    let shape = [3, 224, 224];
    let weights = content(9, 4096);
    let w_shape = [1024];
    let k = |version: &str, scale: i64, w: &[u8]| {
        KeyBuilder::new("f", version)
            .config(&Fields::from([("scale".to_owned(), Value::Int(scale))]))
            .arg(Arg::Tensor(f32_tensor(&shape, &x)))
            .named("weight", Arg::Tensor(f32_tensor(&w_shape, w)))
            .finish()
    };
    let reference = k("1", 2, &weights);
    assert_eq!(reference, k("1", 2, &weights), "deterministic");
    assert_ne!(reference, k("2", 2, &weights), "the version");
    assert_ne!(reference, k("1", 3, &weights), "the configuration");
    let mut w = weights.clone();
    w[4095] ^= 0x80;
    assert_ne!(reference, k("1", 2, &w), "one bit of a weight");
    assert_ne!(
        KeyBuilder::new("f", "1").finish(),
        KeyBuilder::new("g", "1").finish(),
        "the function"
    );
}

#[test]
fn a_hundred_thousand_random_inputs_give_no_collision() {
    let shape = [16];
    let mut keys = HashSet::with_capacity(100_000);
    for i in 0..100_000u64 {
        let data = content(i, 64);
        let key = KeyBuilder::new("f", "1")
            .arg(Arg::Tensor(f32_tensor(&shape, &data)))
            .finish();
        assert!(keys.insert(key), "input {i} collided");
    }
}

#[test]
fn a_batch_item_s_key_does_not_depend_on_its_batch() {
    let item = 3 * 8 * 4;
    let a = content(1, 4 * item);
    let mut b = content(2, 2 * item);
    // Batch b's second item is batch a's third.
    b[item..].copy_from_slice(&a[2 * item..3 * item]);
    let base = KeyBuilder::new("f", "1");
    let ka = base
        .batch_keys(f32_tensor(&[4, 3, 8], &a))
        .expect("consistent");
    let kb = base
        .batch_keys(f32_tensor(&[2, 3, 8], &b))
        .expect("consistent");
    assert_eq!(ka[2], kb[1]);
    assert_ne!(ka[0], kb[0]);
    assert_eq!(ka.iter().collect::<HashSet<_>>().len(), 4);
    assert!(base.batch_keys(f32_tensor(&[4, 3, 8], &a[1..])).is_none());
}

/// The byte stream of FORMAT.md ("Output keys"), built by hand, gives the same key.
#[test]
fn the_key_is_the_documented_stream() {
    use xxhash_rust::xxh3::xxh3_128;
    let data: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let built = KeyBuilder::new("f", "1")
        .arg(Arg::Int(-5))
        .named("x", Arg::Tensor(f32_tensor(&[2], &data)))
        .finish();
    let str_ = |s: &str, out: &mut Vec<u8>| {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    };
    let mut s = b"tunecache/output/1\0".to_vec();
    str_("f", &mut s);
    str_("1", &mut s);
    s.push(0x04);
    s.extend_from_slice(&(-5i64).to_le_bytes());
    s.push(0x0a);
    str_("x", &mut s);
    s.push(0x01);
    str_("f32", &mut s);
    s.push(0); // little-endian
    s.extend_from_slice(&1u64.to_le_bytes());
    s.extend_from_slice(&2u64.to_le_bytes());
    s.extend_from_slice(&(data.len() as u64).to_le_bytes());
    s.extend_from_slice(&xxh3_128(&data).to_le_bytes());
    s.push(0xff);
    s.extend_from_slice(&2u64.to_le_bytes());
    assert_eq!(built.0, xxh3_128(&s).to_be_bytes());
}

/// A value of a named kind (`0x0c str(kind)`, then the value) never shares a key with the
/// value alone or with another kind's; batch items of a named kind neither (issue 24, case 16).
#[test]
fn a_kind_sets_a_value_apart_and_is_the_documented_stream() {
    use xxhash_rust::xxh3::xxh3_128;
    let k = |args: &[Arg<'_>]| {
        args.iter()
            .fold(KeyBuilder::new("f", "1"), |b, a| b.arg(*a))
            .finish()
    };
    let bytes = Arg::Bytes(b"\x81\xa1v\x92\x01\x02");
    let list = Arg::Kind {
        kind: "list",
        value: &bytes,
    };
    let tuple = Arg::Kind {
        kind: "tuple",
        value: &bytes,
    };
    assert_ne!(k(&[list]), k(&[bytes]));
    assert_ne!(k(&[list]), k(&[tuple]));
    assert_eq!(k(&[list]), k(&[list]));
    let str_ = |s: &str, out: &mut Vec<u8>| {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    };
    let mut s = b"tunecache/output/1\0".to_vec();
    str_("f", &mut s);
    str_("1", &mut s);
    s.push(0x0c);
    str_("list", &mut s);
    s.push(0x02);
    let raw = b"\x81\xa1v\x92\x01\x02";
    s.extend_from_slice(&(raw.len() as u64).to_le_bytes());
    s.extend_from_slice(&xxh3_128(raw).to_le_bytes());
    s.push(0xff);
    s.extend_from_slice(&1u64.to_le_bytes());
    assert_eq!(k(&[list]).0, xxh3_128(&s).to_be_bytes());

    let data: Vec<u8> = (0..32u8).collect();
    let batch = f32_tensor(&[2, 4], &data);
    let base = KeyBuilder::new("f", "1");
    let plain = base.batch_keys(batch).expect("keys");
    let torch = base
        .batch_keys_of(Some("torch.Tensor:cpu"), batch)
        .expect("keys");
    assert_eq!(plain, base.batch_keys_of(None, batch).expect("keys"));
    assert!(plain.iter().all(|p| !torch.contains(p)));
}
