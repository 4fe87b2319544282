//! Values: bytes with a small self-describing header (FORMAT.md, "Output values"), never a
//! pickle. The header names the element type, shape, byte order and codec; the artifact
//! framing around it carries the length and a CRC-32 of header and data together. The data
//! starts at a 64-byte-aligned file offset, so a mapped value can be viewed as its elements
//! without a copy.

use cache_core::{ARTIFACT_HEADER_LEN, Blob};

use crate::dtype::{ByteOrder, DType, expected_len};

/// The first 8 bytes of a value (after the artifact framing).
pub(crate) const VALUE_MAGIC: &[u8; 8] = b"TCOUT1\0\0";

/// The most dimensions a value may have.
pub const MAX_DIMS: usize = 32;

/// An owned array: what a computation returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// Byte order of the elements.
    pub order: ByteOrder,
    /// The elements' bytes, row-major.
    pub data: Vec<u8>,
}

impl Tensor {
    /// An array in this machine's byte order; `None` if the bytes do not match the shape.
    pub fn new(dtype: DType, shape: Vec<u64>, data: Vec<u8>) -> Option<Self> {
        (shape.len() <= MAX_DIMS && expected_len(dtype, &shape) == Some(data.len() as u64))
            .then_some(Tensor {
                dtype,
                shape,
                order: ByteOrder::NATIVE,
                data,
            })
    }

    /// Raw bytes, as a one-dimensional `u8` array.
    pub fn bytes(data: Vec<u8>) -> Self {
        Tensor {
            dtype: DType::U8,
            shape: vec![data.len() as u64],
            order: ByteOrder::NATIVE,
            data,
        }
    }

    /// An `f32` array of `shape`; `None` if the counts differ.
    pub fn from_f32(shape: Vec<u64>, values: &[f32]) -> Option<Self> {
        let data = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        Tensor::new(DType::F32, shape, data)
    }

    /// A borrowed view, for keys.
    pub fn as_ref(&self) -> crate::key::TensorRef<'_> {
        crate::key::TensorRef {
            dtype: self.dtype,
            shape: &self.shape,
            order: self.order,
            data: &self.data,
        }
    }
}

/// How a value's data is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// As it is (readable through a memory map without a copy).
    Raw,
    /// Compressed with zstd at this level.
    Zstd(i32),
}

impl Codec {
    fn code(self) -> u8 {
        match self {
            Codec::Raw => 0,
            Codec::Zstd(_) => 1,
        }
    }
}

/// The value header for `t` stored with `codec` (`stored_len` bytes of data follow), padded
/// so the data starts 64-byte aligned in the file.
pub(crate) fn encode_header(t: &Tensor, codec: Codec, stored_len: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(128);
    h.extend_from_slice(VALUE_MAGIC);
    h.extend_from_slice(&0u32.to_le_bytes()); // header length, set below
    h.push(codec.code());
    h.push(t.order.code());
    let name = t.dtype.name().as_bytes();
    h.push(name.len() as u8);
    h.extend_from_slice(name);
    h.push(t.shape.len() as u8);
    for d in &t.shape {
        h.extend_from_slice(&d.to_le_bytes());
    }
    h.extend_from_slice(&(t.data.len() as u64).to_le_bytes());
    h.extend_from_slice(&stored_len.to_le_bytes());
    let end = ARTIFACT_HEADER_LEN + h.len();
    let padded = end.div_ceil(64) * 64;
    h.resize(padded - ARTIFACT_HEADER_LEN, 0);
    let len = h.len() as u32;
    h[8..12].copy_from_slice(&len.to_le_bytes());
    h
}

/// Why a stored value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a tunecache output value: {0}")]
pub struct ValueError(pub(crate) String);

/// A parsed value header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) codec: u8,
    pub(crate) order: ByteOrder,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<u64>,
    pub(crate) raw_len: u64,
    pub(crate) stored_len: u64,
    pub(crate) len: usize,
}

pub(crate) fn decode_header(b: &[u8]) -> Result<Header, ValueError> {
    let bad = |m: &str| ValueError(m.to_owned());
    if b.len() < 12 || &b[..8] != VALUE_MAGIC {
        return Err(bad("no value magic"));
    }
    let len = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
    if len > b.len() || len < 16 {
        return Err(bad("a header length past the end"));
    }
    let h = &b[..len];
    let mut at = 12;
    let mut take = |n: usize| -> Result<&[u8], ValueError> {
        let s = h.get(at..at + n).ok_or_else(|| bad("a truncated header"))?;
        at += n;
        Ok(s)
    };
    let codec = take(1)?[0];
    let order = ByteOrder::from_code(take(1)?[0]).ok_or_else(|| bad("an unknown byte order"))?;
    let name_len = take(1)?[0] as usize;
    let name = std::str::from_utf8(take(name_len)?).map_err(|_| bad("a dtype not UTF-8"))?;
    let dtype = DType::parse(name).ok_or_else(|| ValueError(format!("unknown dtype {name:?}")))?;
    let ndim = take(1)?[0] as usize;
    if ndim > MAX_DIMS {
        return Err(bad("too many dimensions"));
    }
    let mut shape = Vec::with_capacity(ndim);
    for _ in 0..ndim {
        shape.push(u64::from_le_bytes(
            take(8)?.try_into().map_err(|_| bad("dims"))?,
        ));
    }
    let raw_len = u64::from_le_bytes(take(8)?.try_into().map_err(|_| bad("len"))?);
    let stored_len = u64::from_le_bytes(take(8)?.try_into().map_err(|_| bad("len"))?);
    if expected_len(dtype, &shape) != Some(raw_len) {
        return Err(bad("a length that does not match the shape"));
    }
    if codec == 0 && stored_len != raw_len {
        return Err(bad("a raw value whose stored length differs"));
    }
    if codec > 1 {
        return Err(ValueError(format!("unknown codec {codec}")));
    }
    if (b.len() - len) as u64 != stored_len {
        return Err(bad("data of the wrong length"));
    }
    Ok(Header {
        codec,
        order,
        dtype,
        shape,
        raw_len,
        stored_len,
        len,
    })
}

/// A value read back: its type, shape and bytes, mapped from the file when it is large and
/// stored raw (no copy), or in memory.
#[derive(Debug)]
pub struct Output {
    dtype: DType,
    shape: Vec<u64>,
    order: ByteOrder,
    data: Data,
}

#[derive(Debug)]
enum Data {
    Stored { blob: Blob, offset: usize },
    Owned(Vec<u8>),
}

impl Output {
    pub(crate) fn from_blob(blob: Blob) -> Result<Self, ValueError> {
        let h = decode_header(&blob)?;
        let data = if h.codec == 0 {
            Data::Stored {
                blob,
                offset: h.len,
            }
        } else {
            Data::Owned(decompress(&blob[h.len..], h.raw_len)?)
        };
        Ok(Output {
            dtype: h.dtype,
            shape: h.shape,
            order: h.order,
            data,
        })
    }

    pub(crate) fn from_tensor(t: Tensor) -> Self {
        Output {
            dtype: t.dtype,
            shape: t.shape,
            order: t.order,
            data: Data::Owned(t.data),
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Dimensions.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// Byte order of the elements.
    pub fn order(&self) -> ByteOrder {
        self.order
    }

    /// The elements' bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.data {
            Data::Stored { blob, offset } => &blob[*offset..],
            Data::Owned(v) => v,
        }
    }

    /// Whether the bytes are mapped from the cache's file (no copy was made).
    pub fn is_mapped(&self) -> bool {
        matches!(&self.data, Data::Stored { blob, .. } if blob.is_mapped())
    }

    /// The elements as `f32` (copied); `None` unless the value is `f32` in this machine's
    /// byte order.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        (self.dtype == DType::F32 && self.order == ByteOrder::NATIVE).then(|| {
            self.bytes()
                .chunks_exact(4)
                .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }

    /// An owned copy.
    pub fn to_tensor(&self) -> Tensor {
        Tensor {
            dtype: self.dtype,
            shape: self.shape.clone(),
            order: self.order,
            data: self.bytes().to_vec(),
        }
    }

    /// Bytes it holds in memory (a mapped value counts its mapped length).
    pub(crate) fn weight(&self) -> u64 {
        self.bytes().len() as u64 + 64
    }
}

pub(crate) fn compress(data: &[u8], codec: Codec) -> Option<Vec<u8>> {
    match codec {
        Codec::Raw => None,
        #[cfg(feature = "zstd")]
        Codec::Zstd(level) => zstd::bulk::compress(data, level).ok(),
        #[cfg(not(feature = "zstd"))]
        Codec::Zstd(_) => {
            let _ = data;
            None
        }
    }
}

fn decompress(stored: &[u8], raw_len: u64) -> Result<Vec<u8>, ValueError> {
    #[cfg(feature = "zstd")]
    {
        let cap = usize::try_from(raw_len).map_err(|_| ValueError("too large".to_owned()))?;
        let out = zstd::bulk::decompress(stored, cap)
            .map_err(|e| ValueError(format!("zstd data that does not decompress: {e}")))?;
        if out.len() as u64 != raw_len {
            return Err(ValueError("zstd data of the wrong length".to_owned()));
        }
        Ok(out)
    }
    #[cfg(not(feature = "zstd"))]
    {
        let _ = (stored, raw_len);
        Err(ValueError(
            "a zstd value, and this build has no zstd (feature `zstd`)".to_owned(),
        ))
    }
}

/// Checks a stored value whole (header, lengths, decompression); for `verify`.
pub fn check_value(payload: &[u8]) -> Result<(), ValueError> {
    let h = decode_header(payload)?;
    if h.codec == 1 {
        decompress(&payload[h.len..], h.raw_len)?;
    }
    let _ = h.stored_len;
    Ok(())
}
