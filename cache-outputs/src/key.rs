//! Keys that cover every input (FORMAT.md, "Output keys").
//!
//! A key is the XXH3-128 digest of a framed stream: a domain tag, the function's identity, its
//! version, its configuration's canonical encoding, then each argument in order with a kind
//! tag, its type, shape and byte order, and the XXH3-128 digest of its whole content. Every
//! part is length-prefixed or fixed-size, so two different calls can only share a key by a
//! 128-bit hash collision: no subsample, no XOR of arguments, no order lost.

use cache_core::cache_format::{Fields, Fingerprint, encode_fields};
use xxhash_rust::xxh3::{Xxh3, xxh3_128};

use crate::dtype::{ByteOrder, DType};

/// Domain tag of output keys.
pub(crate) const KEY_TAG: &[u8] = b"tunecache/output/1\0";

mod tag {
    pub(super) const TENSOR: u8 = 1;
    pub(super) const BYTES: u8 = 2;
    pub(super) const STR: u8 = 3;
    pub(super) const INT: u8 = 4;
    pub(super) const UINT: u8 = 5;
    pub(super) const FLOAT: u8 = 6;
    pub(super) const BOOL: u8 = 7;
    pub(super) const NONE: u8 = 8;
    pub(super) const BATCH_ITEM: u8 = 9;
    pub(super) const NAMED: u8 = 10;
    pub(super) const CONFIG: u8 = 11;
    pub(super) const KIND: u8 = 12;
    pub(super) const END: u8 = 0xff;
}

/// An array argument: its element type, shape, byte order and bytes (row-major, contiguous).
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: &'a [u64],
    /// Byte order of the elements.
    pub order: ByteOrder,
    /// The elements' bytes.
    pub data: &'a [u8],
}

impl<'a> TensorRef<'a> {
    /// An array in this machine's byte order.
    pub fn new(dtype: DType, shape: &'a [u64], data: &'a [u8]) -> Self {
        TensorRef {
            dtype,
            shape,
            order: ByteOrder::NATIVE,
            data,
        }
    }

    /// Whether the byte length matches the shape and element size.
    pub fn is_consistent(&self) -> bool {
        crate::dtype::expected_len(self.dtype, self.shape) == Some(self.data.len() as u64)
    }
}

/// One argument of a call.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    /// An array, hashed over all of its bytes.
    Tensor(TensorRef<'a>),
    /// Raw bytes, hashed whole.
    Bytes(&'a [u8]),
    /// A string.
    Str(&'a str),
    /// A signed integer.
    Int(i64),
    /// An unsigned integer (distinct from the same value as `Int`).
    UInt(u64),
    /// A float, by its bits (`-0.0` and `0.0` differ; every NaN is one NaN).
    Float(f64),
    /// A boolean (distinct from the integers).
    Bool(bool),
    /// No value.
    None,
    /// A value of a named kind, hashed as its kind, then `value`: what tells apart inputs
    /// whose contents alone are alike (a list and the bytes of its encoding, a masked array
    /// and its data, a torch tensor and a numpy array).
    Kind {
        /// The kind, e.g. `"list"` or `"torch.Tensor:cpu"`.
        kind: &'a str,
        /// What it holds.
        value: &'a Arg<'a>,
    },
}

/// Builds a key: `KeyBuilder::new(function, version)`, then the configuration and the
/// arguments in call order, then [`KeyBuilder::finish`]. Clone a builder to derive the keys
/// of a batch's items from a common prefix.
#[derive(Clone)]
pub struct KeyBuilder {
    hasher: Xxh3,
    args: u64,
}

impl std::fmt::Debug for KeyBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyBuilder")
            .field("args", &self.args)
            .finish_non_exhaustive()
    }
}

impl KeyBuilder {
    /// Starts a key for `function` (a stable identity, e.g. `"mylib.backbone.forward"`) at
    /// `version` (bump it whenever the function's results change: code, weights not passed
    /// as arguments, library versions).
    pub fn new(function: &str, version: &str) -> Self {
        let mut hasher = Xxh3::new();
        hasher.update(KEY_TAG);
        let mut b = KeyBuilder { hasher, args: 0 };
        b.str(function);
        b.str(version);
        b
    }

    fn str(&mut self, s: &str) {
        self.hasher.update(&(s.len() as u64).to_le_bytes());
        self.hasher.update(s.as_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.hasher.update(&v.to_le_bytes());
    }

    fn digest(&mut self, data: &[u8]) {
        self.u64(data.len() as u64);
        self.hasher.update(&content_hash(data).to_le_bytes());
    }

    /// Adds the configuration (hyper-parameters, init arguments) by its canonical encoding
    /// (the same as tunecache keys'). Call it once, before the arguments.
    pub fn config(mut self, config: &Fields) -> Self {
        let mut buf = Vec::new();
        encode_fields(config, &mut buf);
        self.hasher.update(&[tag::CONFIG]);
        self.u64(buf.len() as u64);
        self.hasher.update(&buf);
        self
    }

    /// Adds the next positional argument.
    pub fn arg(mut self, arg: Arg<'_>) -> Self {
        self.push(arg);
        self
    }

    /// Adds a keyword argument: its name, then its value. Keyword arguments are hashed in
    /// the order given; pass them sorted by name for a key that ignores their order.
    pub fn named(mut self, name: &str, arg: Arg<'_>) -> Self {
        self.hasher.update(&[tag::NAMED]);
        self.str(name);
        self.push(arg);
        self
    }

    fn push(&mut self, arg: Arg<'_>) {
        self.args += 1;
        self.value(arg);
    }

    fn value(&mut self, arg: Arg<'_>) {
        match arg {
            Arg::Tensor(t) => {
                self.hasher.update(&[tag::TENSOR]);
                self.tensor(t);
            }
            Arg::Bytes(b) => {
                self.hasher.update(&[tag::BYTES]);
                self.digest(b);
            }
            Arg::Str(s) => {
                self.hasher.update(&[tag::STR]);
                self.str(s);
            }
            Arg::Int(v) => {
                self.hasher.update(&[tag::INT]);
                self.hasher.update(&v.to_le_bytes());
            }
            Arg::UInt(v) => {
                self.hasher.update(&[tag::UINT]);
                self.u64(v);
            }
            Arg::Float(v) => {
                self.hasher.update(&[tag::FLOAT]);
                let bits = if v.is_nan() {
                    f64::NAN.to_bits()
                } else {
                    v.to_bits()
                };
                self.u64(bits);
            }
            Arg::Bool(v) => self.hasher.update(&[tag::BOOL, u8::from(v)]),
            Arg::None => self.hasher.update(&[tag::NONE]),
            Arg::Kind { kind, value } => {
                self.hasher.update(&[tag::KIND]);
                self.str(kind);
                self.value(*value);
            }
        }
    }

    fn tensor(&mut self, t: TensorRef<'_>) {
        self.str(t.dtype.name());
        self.hasher.update(&[t.order.code()]);
        self.u64(t.shape.len() as u64);
        for d in t.shape {
            self.u64(*d);
        }
        self.digest(t.data);
    }

    /// The key.
    pub fn finish(mut self) -> Fingerprint {
        self.hasher.update(&[tag::END]);
        let n = self.args;
        self.u64(n);
        Fingerprint(self.hasher.digest128().to_be_bytes())
    }

    /// The keys of each item of `batch` along its first dimension: this builder's prefix,
    /// then the item (its shape without the first dimension). An item's key does not depend
    /// on the other items of the batch or on its position. `None` if `batch` has no
    /// dimension or its bytes do not match its shape.
    pub fn batch_keys(&self, batch: TensorRef<'_>) -> Option<Vec<Fingerprint>> {
        self.batch_keys_of(None, batch)
    }

    /// [`KeyBuilder::batch_keys`] for a batch of a named kind (as [`Arg::Kind`]): each item is
    /// hashed as that kind, so the items of batches alike in bytes but not in kind (a torch
    /// tensor's, a numpy array's) have different keys.
    pub fn batch_keys_of(
        &self,
        kind: Option<&str>,
        batch: TensorRef<'_>,
    ) -> Option<Vec<Fingerprint>> {
        let (&n, item_shape) = batch.shape.split_first()?;
        if !batch.is_consistent() {
            return None;
        }
        let item_len = if n == 0 {
            0
        } else {
            batch.data.len() / n as usize
        };
        Some(
            (0..n as usize)
                .map(|i| {
                    let mut b = self.clone();
                    b.args += 1;
                    b.hasher.update(&[tag::BATCH_ITEM]);
                    if let Some(kind) = kind {
                        b.hasher.update(&[tag::KIND]);
                        b.str(kind);
                    }
                    b.tensor(TensorRef {
                        dtype: batch.dtype,
                        shape: item_shape,
                        order: batch.order,
                        data: &batch.data[i * item_len..(i + 1) * item_len],
                    });
                    b.finish()
                })
                .collect(),
        )
    }
}

/// The XXH3-128 digest of `data` (what a key holds of each array and byte argument).
pub fn content_hash(data: &[u8]) -> u128 {
    xxh3_128(data)
}
