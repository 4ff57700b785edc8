//! A sample's token ids as they travel beside its activations, hop by hop: only heads read
//! data; later stages, tails (their targets) and subspace boundaries take the ids from here.
//!
//! | bytes | field |
//! | --- | --- |
//! | 4 | magic `IOTK` |
//! | 1 | version (1) |
//! | 1 | width: 2 (`u16`) or 4 (`u32`) |
//! | 4 | rows |
//! | 4 | tokens per row (`seq + 1`: the inputs and the last target) |
//! | 4 | compressed length |
//! | … | zstd of the ids, little-endian |
//!
//! [`decode`] checks the fixed fields against what the run expects before it allocates
//! (exactly rows × window × width bytes), then that every id is below the vocabulary.

use crate::data::Batch;

/// First four bytes of a token block.
pub const MAGIC: [u8; 4] = *b"IOTK";
const VERSION: u8 = 1;
const HEADER: usize = 4 + 1 + 1 + 4 + 4 + 4;

/// Why a token block was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokensError {
    /// Shorter than its header or its stated length.
    #[error("token block of {0} bytes is truncated")]
    Truncated(usize),
    /// Not a token block of this version.
    #[error("not a token block (magic or version)")]
    Magic,
    /// Width is neither 2 nor 4.
    #[error("token width {0} is neither 2 nor 4")]
    Width(u8),
    /// Another shape than the run's.
    #[error("{rows}×{window} tokens where the run's samples are {want_rows}×{want_window}")]
    Shape {
        /// Rows sent.
        rows: u32,
        /// Tokens per row sent.
        window: u32,
        /// The run's rows.
        want_rows: usize,
        /// The run's tokens per row.
        want_window: usize,
    },
    /// The payload did not decompress to exactly the stated size.
    #[error("token payload does not decompress to {0} bytes")]
    Payload(usize),
    /// An id at or above the vocabulary.
    #[error("token id {id} is at or above the vocabulary of {vocab}")]
    Range {
        /// The id.
        id: u32,
        /// The vocabulary.
        vocab: usize,
    },
}

/// Encodes `batch`'s ids (`batch` rows of `seq + 1` tokens) for a vocabulary of `vocab`.
pub fn encode(batch: &Batch, vocab: usize) -> Vec<u8> {
    let ids = batch.windows();
    let width: u8 = if vocab <= 1 << 16 { 2 } else { 4 };
    let mut raw = Vec::with_capacity(ids.len() * width as usize);
    for id in ids {
        if width == 2 {
            raw.extend_from_slice(&(id as u16).to_le_bytes());
        } else {
            raw.extend_from_slice(&id.to_le_bytes());
        }
    }
    let z = zstd::bulk::compress(&raw, 3).unwrap_or_default();
    let mut out = Vec::with_capacity(HEADER + z.len());
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(width);
    out.extend_from_slice(&(batch.batch as u32).to_le_bytes());
    out.extend_from_slice(&((batch.seq + 1) as u32).to_le_bytes());
    out.extend_from_slice(&(z.len() as u32).to_le_bytes());
    out.extend_from_slice(&z);
    out
}

/// The most bytes a block of `batch` rows of `seq + 1` ids below `vocab` can take: what a
/// receiver bounds a block's length by before it reads one.
pub fn max_len(batch: usize, seq: usize, vocab: usize) -> usize {
    let width = if vocab <= 1 << 16 { 2 } else { 4 };
    let raw = batch
        .saturating_mul(seq.saturating_add(1))
        .saturating_mul(width);
    HEADER.saturating_add(zstd::zstd_safe::compress_bound(raw))
}

/// Decodes a block for the run's `batch` × `seq` samples and vocabulary.
pub fn decode(bytes: &[u8], batch: usize, seq: usize, vocab: usize) -> Result<Batch, TokensError> {
    if bytes.len() < HEADER {
        return Err(TokensError::Truncated(bytes.len()));
    }
    if bytes[..4] != MAGIC || bytes[4] != VERSION {
        return Err(TokensError::Magic);
    }
    let width = bytes[5];
    if width != 2 && width != 4 {
        return Err(TokensError::Width(width));
    }
    let u32_at =
        |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    let (rows, window, zlen) = (u32_at(6), u32_at(10), u32_at(14) as usize);
    if rows as usize != batch || window as usize != seq + 1 {
        return Err(TokensError::Shape {
            rows,
            window,
            want_rows: batch,
            want_window: seq + 1,
        });
    }
    if bytes.len() != HEADER + zlen {
        return Err(TokensError::Truncated(bytes.len()));
    }
    let raw_len = batch * (seq + 1) * width as usize;
    let raw = zstd::bulk::decompress(&bytes[HEADER..], raw_len)
        .map_err(|_| TokensError::Payload(raw_len))?;
    if raw.len() != raw_len {
        return Err(TokensError::Payload(raw_len));
    }
    let ids: Vec<u32> = if width == 2 {
        raw.chunks_exact(2)
            .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
            .collect()
    } else {
        raw.chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(TokensError::Range { id, vocab });
    }
    Ok(Batch::from_ids(batch, seq, &ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(vocab: u32) -> Batch {
        let ids: Vec<u32> = (0..3 * 9).map(|i| (i * 7919) % vocab).collect();
        Batch::from_ids(3, 8, &ids)
    }

    #[test]
    fn a_block_round_trips_in_both_widths() {
        for vocab in [256u32, 4096, 128_256] {
            let b = batch(vocab);
            let bytes = encode(&b, vocab as usize);
            assert_eq!(bytes[5], if vocab <= 65536 { 2 } else { 4 });
            assert_eq!(decode(&bytes, 3, 8, vocab as usize).unwrap(), b);
        }
    }

    #[test]
    fn no_block_is_longer_than_its_bound() {
        // Ids that do not compress at all: the worst case.
        for vocab in [256u32, 65_536, 128_256] {
            let mut x = 0x9e37_79b9_u32;
            let ids: Vec<u32> = (0..4 * 65)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x % vocab
                })
                .collect();
            let bytes = encode(&Batch::from_ids(4, 64, &ids), vocab as usize);
            assert!(bytes.len() <= max_len(4, 64, vocab as usize), "{vocab}");
        }
    }

    #[test]
    fn bad_blocks_are_refused_before_allocation() {
        let b = batch(4096);
        let good = encode(&b, 4096);
        assert_eq!(
            decode(&good[..10], 3, 8, 4096),
            Err(TokensError::Truncated(10))
        );
        assert!(matches!(
            decode(&good, 4, 8, 4096),
            Err(TokensError::Shape { .. })
        ));
        assert!(matches!(
            decode(&good, 3, 8, 100),
            Err(TokensError::Range { .. })
        ));
        let mut bad = good.clone();
        bad[0] = b'X';
        assert_eq!(decode(&bad, 3, 8, 4096), Err(TokensError::Magic));
        let mut bad = good.clone();
        bad[5] = 3;
        assert_eq!(decode(&bad, 3, 8, 4096), Err(TokensError::Width(3)));
        let mut bad = good.clone();
        bad.push(0);
        assert!(matches!(
            decode(&bad, 3, 8, 4096),
            Err(TokensError::Truncated(_))
        ));
        // A payload claiming the right shape but decompressing to more is refused.
        let big = zstd::bulk::compress(&vec![0u8; 1 << 20], 3).unwrap();
        let mut bad = good[..14].to_vec();
        bad.extend_from_slice(&(big.len() as u32).to_le_bytes());
        bad.extend_from_slice(&big);
        assert!(matches!(
            decode(&bad, 3, 8, 4096),
            Err(TokensError::Payload(_))
        ));
    }
}
