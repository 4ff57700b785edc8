//! Wire codec for activations and gradients sent between pipeline stages.
//!
//! A frame is a fixed little-endian header followed by a zstd-compressed payload:
//!
//! | bytes | field |
//! | --- | --- |
//! | 4 | magic `IOTW` |
//! | 1 | version (1) |
//! | 1 | kind: 0 activation, 1 gradient |
//! | 1 | dtype: 0 f32, 1 bf16, 2 int8, 3 int4 (both with a per-token bf16 absmax scale) |
//! | 1 | rank `r`, 1..=[`MAX_DIMS`] |
//! | 8 | run id |
//! | 8 | sample id |
//! | 4 | stage index of the sender |
//! | 4·r | shape, each dimension a u32 ≥ 1 |
//! | 8 | raw length: payload bytes after decompression |
//! | 8 | payload length: compressed bytes that follow |
//! | 32 | blake3 of every header byte before this field and of the payload |
//!
//! Guarantees of [`decode`]: it never panics and never allocates more than the caller's
//! [`DecodeLimits::max_raw_bytes`] (plus the output vector of the same element count). It checks,
//! in order, magic, version, enum fields, rank, that the raw length is exactly what shape × dtype
//! implies and within the limit, that the payload length matches the bytes present, the hash,
//! then decompresses with a buffer of exactly the checked raw length and rejects non-finite
//! values. Any failure is a typed [`DecodeError`].
//!
//! Quantisation bounds: f32 is exact; bf16 is within 2⁻⁸·|x| of each value; int8 is within half
//! a scale step, `absmax(token) / 254` rounded up to a bf16, of each value; int4 likewise within
//! `absmax(token) / 14` rounded up.

mod quant;

use std::fmt;
use std::str::FromStr;

pub use crate::preset::ParseNameError;

/// First four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"IOTW";
/// Version this codec writes and reads.
pub const VERSION: u8 = 1;
/// Largest tensor rank a frame may carry.
pub const MAX_DIMS: usize = 4;

const FIXED_LEN: usize = 4 + 1 + 1 + 1 + 1 + 8 + 8 + 4;
const HASH_LEN: usize = 32;

/// Length in bytes of the header of a frame of rank `rank`.
pub const fn header_len(rank: usize) -> usize {
    FIXED_LEN + 4 * rank + 8 + 8 + HASH_LEN
}

/// Direction of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// Forward: a stage's output hidden state.
    Activation,
    /// Backward: the gradient of the loss with respect to a stage's input.
    Gradient,
}

/// Element encoding of the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WireDtype {
    /// 4 bytes per element, exact.
    F32,
    /// 2 bytes per element, bfloat16.
    Bf16,
    /// 1 byte per element plus a 2-byte scale per token (row of the last dimension).
    Int8,
    /// Half a byte per element (a token's row padded to whole bytes) plus a 2-byte scale per
    /// token.
    Int4,
}

impl WireDtype {
    fn code(self) -> u8 {
        match self {
            WireDtype::F32 => 0,
            WireDtype::Bf16 => 1,
            WireDtype::Int8 => 2,
            WireDtype::Int4 => 3,
        }
    }

    fn from_code(c: u8) -> Option<WireDtype> {
        match c {
            0 => Some(WireDtype::F32),
            1 => Some(WireDtype::Bf16),
            2 => Some(WireDtype::Int8),
            3 => Some(WireDtype::Int4),
            _ => None,
        }
    }

    /// Lower-case name, as parsed by [`FromStr`].
    pub fn name(self) -> &'static str {
        match self {
            WireDtype::F32 => "f32",
            WireDtype::Bf16 => "bf16",
            WireDtype::Int8 => "int8",
            WireDtype::Int4 => "int4",
        }
    }
}

impl fmt::Display for WireDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WireDtype {
    type Err = ParseNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            WireDtype::F32,
            WireDtype::Bf16,
            WireDtype::Int8,
            WireDtype::Int4,
        ]
        .into_iter()
        .find(|d| d.name() == s)
        .ok_or_else(|| ParseNameError {
            what: "wire dtype",
            given: s.to_owned(),
            expected: "f32, bf16, int8, int4",
        })
    }
}

/// Who a frame belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameMeta {
    /// Run the frame belongs to.
    pub run: u64,
    /// Sample id the tensor was computed for.
    pub sample: u64,
    /// Index of the stage that produced the tensor.
    pub stage: u32,
    /// Activation or gradient.
    pub kind: FrameKind,
}

/// Encoder settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Codec {
    /// Element encoding.
    pub dtype: WireDtype,
    /// zstd compression level.
    pub zstd_level: i32,
}

impl Codec {
    /// `dtype` with zstd level 3.
    pub fn new(dtype: WireDtype) -> Codec {
        Codec {
            dtype,
            zstd_level: 3,
        }
    }
}

/// What a decoder accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Largest decompressed payload, in bytes; checked before any allocation.
    pub max_raw_bytes: usize,
}

impl Default for DecodeLimits {
    /// 256 MiB.
    fn default() -> Self {
        DecodeLimits {
            max_raw_bytes: 256 << 20,
        }
    }
}

/// A parsed and validated header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Run, sample, stage, kind.
    pub meta: FrameMeta,
    /// Element encoding of the payload.
    pub dtype: WireDtype,
    /// Tensor shape; every dimension ≥ 1.
    pub shape: Vec<usize>,
    /// Payload bytes after decompression.
    pub raw_len: usize,
    /// Payload bytes on the wire.
    pub payload_len: usize,
    /// blake3 of the header bytes before the hash and of the payload.
    pub hash: [u8; 32],
}

/// A decoded frame.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// The validated header.
    pub header: FrameHeader,
    /// Row-major values, dequantised to f32.
    pub values: Vec<f32>,
}

impl Frame {
    /// The values as an f32 CPU tensor of the frame's shape.
    pub fn to_tensor(&self) -> tch::Tensor {
        let shape: Vec<i64> = self.header.shape.iter().map(|&d| d as i64).collect();
        tch::Tensor::from_slice(&self.values).reshape(shape)
    }
}

/// Why a tensor could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// The rank is 0 or above [`MAX_DIMS`].
    #[error("rank {0} is outside 1..={MAX_DIMS}")]
    BadRank(usize),
    /// A dimension is 0 or does not fit in a u32.
    #[error("dimension {0} is not in 1..=u32::MAX")]
    BadDimension(usize),
    /// The number of values is not the product of the shape.
    #[error("shape holds {expected} values, got {got}")]
    ShapeMismatch {
        /// Product of the shape.
        expected: usize,
        /// Values given.
        got: usize,
    },
    /// A value is NaN or infinite.
    #[error("non-finite value in tensor")]
    NonFinite,
    /// The tensor is not a float tensor tch can read as f32.
    #[error("reading tensor: {0}")]
    Tensor(#[source] tch::TchError),
    /// zstd failed.
    #[error("compressing: {0}")]
    Compress(#[source] std::io::Error),
}

/// Why bytes are not a valid frame.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than the header needs.
    #[error("truncated: need {needed} bytes, got {got}")]
    Truncated {
        /// Bytes the header needs.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// The first four bytes are not [`MAGIC`].
    #[error("bad magic")]
    BadMagic,
    /// A version this codec does not read.
    #[error("unsupported version {0}")]
    UnsupportedVersion(u8),
    /// Unknown kind byte.
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    /// Unknown dtype byte.
    #[error("unknown wire dtype {0}")]
    BadDtype(u8),
    /// Rank 0 or above [`MAX_DIMS`].
    #[error("rank {0} is outside 1..={MAX_DIMS}")]
    BadRank(u8),
    /// A dimension is zero.
    #[error("zero dimension in shape")]
    ZeroDimension,
    /// The shape's size overflows.
    #[error("shape size overflows")]
    SizeOverflow,
    /// The declared raw length is not what shape and dtype imply.
    #[error("raw length {declared} but shape and dtype imply {expected}")]
    RawLengthMismatch {
        /// Declared in the header.
        declared: u64,
        /// Implied by shape and dtype.
        expected: usize,
    },
    /// The declared raw length exceeds the decoder's limit.
    #[error("raw length {declared} exceeds the limit {limit}")]
    TooLarge {
        /// Declared in the header.
        declared: usize,
        /// [`DecodeLimits::max_raw_bytes`].
        limit: usize,
    },
    /// The payload length field does not match the bytes after the header.
    #[error("payload length {declared} but {actual} bytes follow the header")]
    PayloadLengthMismatch {
        /// Declared in the header.
        declared: u64,
        /// Bytes present after the header.
        actual: usize,
    },
    /// The hash does not match header and payload.
    #[error("hash mismatch")]
    HashMismatch,
    /// zstd rejected the payload (corrupt, or larger than the declared raw length).
    #[error("decompressing: {0}")]
    Decompress(#[source] std::io::Error),
    /// The payload decompressed to a different length than declared.
    #[error("payload decompressed to {got} bytes, declared {expected}")]
    DecompressedLength {
        /// Declared raw length.
        expected: usize,
        /// Decompressed bytes.
        got: usize,
    },
    /// A value or scale is NaN, infinite, or (for scales) negative.
    #[error("non-finite value in payload")]
    NonFinite,
    /// An int8 code of -128, which encoders never write.
    #[error("invalid int8 or int4 code")]
    BadCode,
}

/// Encodes `values` of `shape` (row-major) as one frame.
pub fn encode(
    codec: &Codec,
    meta: &FrameMeta,
    shape: &[usize],
    values: &[f32],
) -> Result<Vec<u8>, EncodeError> {
    if shape.is_empty() || shape.len() > MAX_DIMS {
        return Err(EncodeError::BadRank(shape.len()));
    }
    if let Some(&d) = shape.iter().find(|&&d| d == 0 || u32::try_from(d).is_err()) {
        return Err(EncodeError::BadDimension(d));
    }
    let expected = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if expected != Some(values.len()) {
        return Err(EncodeError::ShapeMismatch {
            expected: expected.unwrap_or(usize::MAX),
            got: values.len(),
        });
    }
    if values.iter().any(|v| !v.is_finite()) {
        return Err(EncodeError::NonFinite);
    }
    let row = shape[shape.len() - 1];
    let raw = quant::quantise(codec.dtype, values, row);
    let payload = zstd::bulk::compress(&raw, codec.zstd_level).map_err(EncodeError::Compress)?;

    let mut out = Vec::with_capacity(header_len(shape.len()) + payload.len());
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(match meta.kind {
        FrameKind::Activation => 0,
        FrameKind::Gradient => 1,
    });
    out.push(codec.dtype.code());
    out.push(shape.len() as u8);
    out.extend_from_slice(&meta.run.to_le_bytes());
    out.extend_from_slice(&meta.sample.to_le_bytes());
    out.extend_from_slice(&meta.stage.to_le_bytes());
    for &d in shape {
        out.extend_from_slice(&(d as u32).to_le_bytes());
    }
    out.extend_from_slice(&(raw.len() as u64).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    let mut hasher = blake3::Hasher::new();
    hasher.update(&out);
    hasher.update(&payload);
    out.extend_from_slice(hasher.finalize().as_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Encodes a float tensor of any device and float kind (read as f32).
pub fn encode_tensor(
    codec: &Codec,
    meta: &FrameMeta,
    tensor: &tch::Tensor,
) -> Result<Vec<u8>, EncodeError> {
    let shape: Vec<usize> = tensor.size().iter().map(|&d| d.max(0) as usize).collect();
    let flat = tensor
        .f_to_kind(tch::Kind::Float)
        .and_then(|t| t.f_to_device(tch::Device::Cpu))
        .and_then(|t| t.f_contiguous())
        .and_then(|t| t.f_view([-1]))
        .map_err(EncodeError::Tensor)?;
    let values = Vec::<f32>::try_from(&flat).map_err(EncodeError::Tensor)?;
    encode(codec, meta, &shape, &values)
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Parses and validates the header of `bytes` (everything but the hash and the payload itself).
pub fn decode_header(bytes: &[u8], limits: &DecodeLimits) -> Result<FrameHeader, DecodeError> {
    if bytes.len() < FIXED_LEN {
        return Err(DecodeError::Truncated {
            needed: FIXED_LEN,
            got: bytes.len(),
        });
    }
    if bytes[..4] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    if bytes[4] != VERSION {
        return Err(DecodeError::UnsupportedVersion(bytes[4]));
    }
    let kind = match bytes[5] {
        0 => FrameKind::Activation,
        1 => FrameKind::Gradient,
        k => return Err(DecodeError::BadKind(k)),
    };
    let dtype = WireDtype::from_code(bytes[6]).ok_or(DecodeError::BadDtype(bytes[6]))?;
    let rank = bytes[7];
    if rank == 0 || usize::from(rank) > MAX_DIMS {
        return Err(DecodeError::BadRank(rank));
    }
    let rank = usize::from(rank);
    let hlen = header_len(rank);
    if bytes.len() < hlen {
        return Err(DecodeError::Truncated {
            needed: hlen,
            got: bytes.len(),
        });
    }
    let meta = FrameMeta {
        run: le_u64(&bytes[8..16]),
        sample: le_u64(&bytes[16..24]),
        stage: le_u32(&bytes[24..28]),
        kind,
    };
    let mut shape = Vec::with_capacity(rank);
    for i in 0..rank {
        let d = le_u32(&bytes[FIXED_LEN + 4 * i..]) as usize;
        if d == 0 {
            return Err(DecodeError::ZeroDimension);
        }
        shape.push(d);
    }
    let at = FIXED_LEN + 4 * rank;
    let declared_raw = le_u64(&bytes[at..]);
    let declared_payload = le_u64(&bytes[at + 8..]);
    let mut hash = [0u8; 32];
    hash.copy_from_slice(&bytes[at + 16..at + 16 + HASH_LEN]);

    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or(DecodeError::SizeOverflow)?;
    let expected = quant::raw_len(dtype, n, shape[rank - 1]).ok_or(DecodeError::SizeOverflow)?;
    if declared_raw != expected as u64 {
        return Err(DecodeError::RawLengthMismatch {
            declared: declared_raw,
            expected,
        });
    }
    if expected > limits.max_raw_bytes {
        return Err(DecodeError::TooLarge {
            declared: expected,
            limit: limits.max_raw_bytes,
        });
    }
    let actual = bytes.len() - hlen;
    if declared_payload != actual as u64 {
        return Err(DecodeError::PayloadLengthMismatch {
            declared: declared_payload,
            actual,
        });
    }
    Ok(FrameHeader {
        meta,
        dtype,
        shape,
        raw_len: expected,
        payload_len: actual,
        hash,
    })
}

/// Decodes and verifies a whole frame.
pub fn decode(bytes: &[u8], limits: &DecodeLimits) -> Result<Frame, DecodeError> {
    let header = decode_header(bytes, limits)?;
    let hlen = header_len(header.shape.len());
    let mut hasher = blake3::Hasher::new();
    hasher.update(&bytes[..hlen - HASH_LEN]);
    let payload = &bytes[hlen..];
    hasher.update(payload);
    if hasher.finalize().as_bytes() != &header.hash {
        return Err(DecodeError::HashMismatch);
    }
    // The capacity is the raw length checked against the limit above: zstd never writes
    // past it, and a payload that would expand further is an error.
    let raw = zstd::bulk::decompress(payload, header.raw_len).map_err(DecodeError::Decompress)?;
    if raw.len() != header.raw_len {
        return Err(DecodeError::DecompressedLength {
            expected: header.raw_len,
            got: raw.len(),
        });
    }
    let n = header.shape.iter().product();
    let row = header.shape[header.shape.len() - 1];
    let values = quant::dequantise(header.dtype, &raw, n, row).map_err(|e| match e {
        quant::DequantError::NonFinite => DecodeError::NonFinite,
        quant::DequantError::BadCode => DecodeError::BadCode,
    })?;
    Ok(Frame { header, values })
}

#[cfg(test)]
mod tests;
