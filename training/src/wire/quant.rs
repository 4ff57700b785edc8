//! Element encodings of the wire payload before zstd: f32, bf16, and int8 or int4 with a
//! per-token scale.
//!
//! Layouts (all little endian):
//! - f32: `n × 4` bytes.
//! - bf16: `n × 2` bytes, rounded to nearest even, saturating at the largest finite bf16.
//! - int8: `tokens × 2` bytes of bf16 scales, then `n` signed bytes in `-127..=127`, where a
//!   token is one row of the last dimension. The scale is `absmax / 127` rounded *up* to a bf16,
//!   so every element's error is at most half a scale step.
//! - int4: `tokens × 2` bytes of bf16 scales (`absmax / 7` rounded up), then each token's
//!   codes in `-7..=7`, two per byte (the first in the low nibble, two's complement), a
//!   token's row padded to whole bytes with a zero nibble.

/// Rounds an f32 to the nearest bf16 (ties to even), saturating finite values at ±max bf16.
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let lsb = (bits >> 16) & 1;
    let rounded = (bits.wrapping_add(0x7FFF + lsb) >> 16) as u16;
    if x.is_finite() && (rounded & 0x7FFF) == 0x7F80 {
        // Rounding overflowed to infinity: keep the value finite.
        return (rounded & 0x8000) | 0x7F7F;
    }
    rounded
}

/// Widens a bf16 to f32 (exact).
pub(crate) fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// The smallest bf16 that is ≥ `x` (for non-negative finite `x`).
fn bf16_ceil(x: f32) -> u16 {
    let bits = x.to_bits();
    let hi = (bits >> 16) as u16;
    if bits & 0xFFFF == 0 {
        hi
    } else {
        hi + 1
    }
}

/// Bytes the payload of `n` elements in rows of `row` takes, before compression.
pub(crate) fn raw_len(dtype: super::WireDtype, n: usize, row: usize) -> Option<usize> {
    match dtype {
        super::WireDtype::F32 => n.checked_mul(4),
        super::WireDtype::Bf16 => n.checked_mul(2),
        super::WireDtype::Int8 => {
            let tokens = n.checked_div(row)?;
            tokens.checked_mul(2)?.checked_add(n)
        }
        super::WireDtype::Int4 => {
            let tokens = n.checked_div(row)?;
            tokens.checked_mul(2 + row.div_ceil(2))
        }
    }
}

/// Serialises finite `values` (rows of `row` elements) in `dtype`.
pub(crate) fn quantise(dtype: super::WireDtype, values: &[f32], row: usize) -> Vec<u8> {
    match dtype {
        super::WireDtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        super::WireDtype::Bf16 => values
            .iter()
            .flat_map(|&v| f32_to_bf16(v).to_le_bytes())
            .collect(),
        super::WireDtype::Int8 => {
            let tokens = values.len() / row;
            let mut out = vec![0u8; tokens * 2 + values.len()];
            let (scales, codes) = out.split_at_mut(tokens * 2);
            for (t, chunk) in values.chunks_exact(row).enumerate() {
                let absmax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
                let scale_bits = bf16_ceil(absmax / 127.0);
                scales[t * 2..t * 2 + 2].copy_from_slice(&scale_bits.to_le_bytes());
                let scale = bf16_to_f32(scale_bits);
                if scale > 0.0 {
                    for (c, &v) in codes[t * row..(t + 1) * row].iter_mut().zip(chunk) {
                        // Division, not a reciprocal: 1/scale overflows for subnormal scales.
                        let q = (v / scale).round().clamp(-127.0, 127.0) as i8;
                        *c = q as u8;
                    }
                }
            }
            out
        }
        super::WireDtype::Int4 => {
            let tokens = values.len() / row;
            let packed = row.div_ceil(2);
            let mut out = vec![0u8; tokens * (2 + packed)];
            let (scales, codes) = out.split_at_mut(tokens * 2);
            for (t, chunk) in values.chunks_exact(row).enumerate() {
                let absmax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
                let scale_bits = bf16_ceil(absmax / 7.0);
                scales[t * 2..t * 2 + 2].copy_from_slice(&scale_bits.to_le_bytes());
                let scale = bf16_to_f32(scale_bits);
                if scale > 0.0 {
                    let bytes = &mut codes[t * packed..(t + 1) * packed];
                    for (i, &v) in chunk.iter().enumerate() {
                        let q = (v / scale).round().clamp(-7.0, 7.0) as i8;
                        let nibble = (q as u8) & 0x0F;
                        bytes[i / 2] |= if i % 2 == 0 { nibble } else { nibble << 4 };
                    }
                }
            }
            out
        }
    }
}

/// Why a decompressed payload does not hold valid elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DequantError {
    /// An element or scale is NaN or infinite, or a scale is negative.
    NonFinite,
    /// An int8 code is -128 or an int4 code -8, or an int4 row's padding nibble is not zero:
    /// nothing the encoder produces.
    BadCode,
}

/// Parses a payload of exactly [`raw_len`] bytes back into f32 values.
pub(crate) fn dequantise(
    dtype: super::WireDtype,
    raw: &[u8],
    n: usize,
    row: usize,
) -> Result<Vec<f32>, DequantError> {
    let mut out = Vec::with_capacity(n);
    match dtype {
        super::WireDtype::F32 => {
            for b in raw.chunks_exact(4) {
                out.push(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            }
        }
        super::WireDtype::Bf16 => {
            for b in raw.chunks_exact(2) {
                out.push(bf16_to_f32(u16::from_le_bytes([b[0], b[1]])));
            }
        }
        super::WireDtype::Int8 => {
            let tokens = n / row;
            let (scales, codes) = raw.split_at(tokens * 2);
            for (s, chunk) in scales.chunks_exact(2).zip(codes.chunks_exact(row)) {
                let scale = bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
                if !scale.is_finite() || scale < 0.0 {
                    return Err(DequantError::NonFinite);
                }
                for &c in chunk {
                    let q = c as i8;
                    if q == i8::MIN {
                        return Err(DequantError::BadCode);
                    }
                    out.push(f32::from(q) * scale);
                }
            }
        }
        super::WireDtype::Int4 => {
            let tokens = n / row;
            let packed = row.div_ceil(2);
            let (scales, codes) = raw.split_at(tokens * 2);
            for (s, bytes) in scales.chunks_exact(2).zip(codes.chunks_exact(packed)) {
                let scale = bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
                if !scale.is_finite() || scale < 0.0 {
                    return Err(DequantError::NonFinite);
                }
                for i in 0..packed * 2 {
                    let nibble = (bytes[i / 2] >> (4 * (i % 2))) & 0x0F;
                    if i >= row {
                        if nibble != 0 {
                            return Err(DequantError::BadCode);
                        }
                        continue;
                    }
                    // Sign-extend the 4-bit two's complement code.
                    let q = ((nibble << 4) as i8) >> 4;
                    if q == -8 {
                        return Err(DequantError::BadCode);
                    }
                    out.push(f32::from(q) * scale);
                }
            }
        }
    }
    if out.iter().any(|v| !v.is_finite()) {
        return Err(DequantError::NonFinite);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_and_saturates() {
        assert_eq!(bf16_to_f32(f32_to_bf16(1.0)), 1.0);
        // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(bf16_to_f32(f32_to_bf16(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(
            bf16_to_f32(f32_to_bf16(1.0 + 3.0 / 256.0)),
            1.0 + 4.0 / 256.0
        );
        assert!(bf16_to_f32(f32_to_bf16(f32::MAX)).is_finite());
        assert!(bf16_to_f32(f32_to_bf16(-f32::MAX)) < 0.0);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
    }

    #[test]
    fn bf16_ceil_never_rounds_down() {
        for x in [0.0f32, 1e-30, 0.3, 1.0, 7.77, 1e30] {
            assert!(bf16_to_f32(bf16_ceil(x)) >= x, "{x}");
        }
    }
}
