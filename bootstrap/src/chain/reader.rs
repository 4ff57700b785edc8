//! A cursor over SCALE bytes that reports every failure with its byte offset.
//!
//! Fixed-width integers are read here (little-endian, as SCALE writes them); compact integers
//! go through `parity-scale-codec`, which also rejects non-canonical encodings. Lengths are
//! checked against a cap and against the bytes left before anyone allocates for them.

use parity_scale_codec::{Compact, Decode};

use super::ChainDecodeError;

/// Reads SCALE values front to back out of one answer.
pub(super) struct Reader<'a> {
    /// The whole answer: offsets in errors count from its first byte.
    bytes: &'a [u8],
    /// Offset of the next unread byte.
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    /// Offset of the next unread byte.
    pub(super) fn offset(&self) -> usize {
        self.pos
    }

    /// Bytes not read yet.
    pub(super) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// Takes `N` bytes.
    pub(super) fn array<const N: usize>(
        &mut self,
        what: &'static str,
    ) -> Result<[u8; N], ChainDecodeError> {
        let end = self.need(what, N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&self.bytes[self.pos..end]);
        self.pos = end;
        Ok(out)
    }

    /// Skips `n` bytes.
    pub(super) fn skip(&mut self, what: &'static str, n: usize) -> Result<(), ChainDecodeError> {
        self.pos = self.need(what, n)?;
        Ok(())
    }

    /// A `u8`.
    pub(super) fn u8(&mut self, what: &'static str) -> Result<u8, ChainDecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    /// A little-endian `u16`.
    pub(super) fn u16(&mut self, what: &'static str) -> Result<u16, ChainDecodeError> {
        self.array(what).map(u16::from_le_bytes)
    }

    /// A little-endian `u32`.
    pub(super) fn u32(&mut self, what: &'static str) -> Result<u32, ChainDecodeError> {
        self.array(what).map(u32::from_le_bytes)
    }

    /// A little-endian `u64`.
    pub(super) fn u64(&mut self, what: &'static str) -> Result<u64, ChainDecodeError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A little-endian `u128`.
    pub(super) fn u128(&mut self, what: &'static str) -> Result<u128, ChainDecodeError> {
        self.array(what).map(u128::from_le_bytes)
    }

    /// A SCALE `bool`: exactly one byte, 0 or 1.
    pub(super) fn bool(&mut self, what: &'static str) -> Result<bool, ChainDecodeError> {
        let offset = self.pos;
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(ChainDecodeError::Malformed {
                what,
                offset,
                detail: format!("a bool is 0 or 1, not {byte}"),
            }),
        }
    }

    /// A `Compact<u16>`.
    pub(super) fn compact_u16(&mut self, what: &'static str) -> Result<u16, ChainDecodeError> {
        self.compact::<u16>(what)
    }

    /// A `Compact<u32>`.
    pub(super) fn compact_u32(&mut self, what: &'static str) -> Result<u32, ChainDecodeError> {
        self.compact::<u32>(what)
    }

    /// A `Compact<u64>`.
    pub(super) fn compact_u64(&mut self, what: &'static str) -> Result<u64, ChainDecodeError> {
        self.compact::<u64>(what)
    }

    /// The length prefix of a `Vec` whose elements take at least `min_element_bytes` each,
    /// checked against `cap` and against the bytes left, so that the caller may allocate it.
    pub(super) fn vec_len(
        &mut self,
        what: &'static str,
        min_element_bytes: usize,
        cap: usize,
    ) -> Result<usize, ChainDecodeError> {
        let offset = self.pos;
        let declared = self.compact_u32(what)?;
        let len = usize::try_from(declared).unwrap_or(usize::MAX);
        if len > cap {
            return Err(ChainDecodeError::OverCap {
                what,
                offset,
                declared: u64::from(declared),
                cap,
            });
        }
        if len.saturating_mul(min_element_bytes) > self.remaining() {
            return Err(ChainDecodeError::LongerThanInput {
                what,
                offset,
                declared: u64::from(declared),
                min_element_bytes,
                remaining: self.remaining(),
            });
        }
        Ok(len)
    }

    /// Fails unless every byte has been read.
    pub(super) fn finish(&self) -> Result<(), ChainDecodeError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(ChainDecodeError::TrailingBytes {
                offset: self.pos,
                count,
            }),
        }
    }

    /// The end offset of the next `n` bytes, if there are that many.
    fn need(&self, what: &'static str, n: usize) -> Result<usize, ChainDecodeError> {
        if n > self.remaining() {
            return Err(ChainDecodeError::Truncated {
                what,
                offset: self.pos,
                needed: n,
                remaining: self.remaining(),
            });
        }
        Ok(self.pos + n)
    }

    /// A compact integer: its length (from the mode bits of its first byte) is checked here,
    /// so that a short input reads as truncation; the value and its canonical form are checked
    /// by `parity-scale-codec`.
    fn compact<T>(&mut self, what: &'static str) -> Result<T, ChainDecodeError>
    where
        Compact<T>: Decode,
    {
        self.need(what, 1)?;
        let first = self.bytes[self.pos];
        let len = match first & 0b11 {
            0b00 => 1,
            0b01 => 2,
            0b10 => 4,
            _ => 1 + usize::from(first >> 2) + 4,
        };
        let end = self.need(what, len)?;
        let mut input = &self.bytes[self.pos..end];
        match Compact::<T>::decode(&mut input) {
            Ok(Compact(value)) if input.is_empty() => {
                self.pos = end;
                Ok(value)
            }
            Ok(_) => Err(ChainDecodeError::Malformed {
                what,
                offset: self.pos,
                detail: "compact integer shorter than its mode bits say".to_owned(),
            }),
            Err(e) => Err(ChainDecodeError::Malformed {
                what,
                offset: self.pos,
                detail: format!("bad compact integer: {e}"),
            }),
        }
    }
}
