use super::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn meta() -> FrameMeta {
    FrameMeta {
        run: 0xDEAD_BEEF,
        sample: 42,
        stage: 1,
        kind: FrameKind::Activation,
    }
}

/// Activation-like values: per-token scales that vary over orders of magnitude.
fn values(n_tokens: usize, width: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut v = Vec::with_capacity(n_tokens * width);
    for _ in 0..n_tokens {
        let scale = 10f32.powf(rng.gen_range(-6.0..3.0));
        for _ in 0..width {
            v.push(rng.gen_range(-1.0f32..1.0) * scale);
        }
    }
    v
}

#[test]
fn f32_round_trip_is_exact() {
    let v = values(24, 32, 1);
    let bytes = encode(&Codec::new(WireDtype::F32), &meta(), &[2, 12, 32], &v).unwrap();
    let f = decode(&bytes, &DecodeLimits::default()).unwrap();
    assert_eq!(f.values, v);
    assert_eq!(f.header.meta, meta());
    assert_eq!(f.header.shape, vec![2, 12, 32]);
    assert_eq!(f.header.dtype, WireDtype::F32);
    assert_eq!(f.to_tensor().size(), vec![2, 12, 32]);
}

#[test]
fn bf16_round_trip_is_within_half_an_ulp() {
    let v = values(24, 32, 2);
    let bytes = encode(&Codec::new(WireDtype::Bf16), &meta(), &[24, 32], &v).unwrap();
    let f = decode(&bytes, &DecodeLimits::default()).unwrap();
    let mut exact = 0;
    for (a, b) in v.iter().zip(&f.values) {
        assert!((a - b).abs() <= a.abs() / 256.0, "{a} vs {b}");
        exact += usize::from(a == b);
    }
    assert!(exact < v.len() / 2, "bf16 should actually round");
}

#[test]
fn int8_round_trip_is_within_half_a_scale_step() {
    let (tokens, width) = (24, 32);
    let v = values(tokens, width, 3);
    let bytes = encode(&Codec::new(WireDtype::Int8), &meta(), &[tokens, width], &v).unwrap();
    let f = decode(&bytes, &DecodeLimits::default()).unwrap();
    for t in 0..tokens {
        let row = &v[t * width..(t + 1) * width];
        let absmax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
        // Scale rounded up to bf16: at most 2^-7 relative above absmax/127.
        let bound = absmax / 127.0 * (1.0 + 1.0 / 128.0) / 2.0;
        for (a, b) in row.iter().zip(&f.values[t * width..(t + 1) * width]) {
            assert!(
                (a - b).abs() <= bound * 1.0001,
                "token {t}: {a} vs {b}, bound {bound}"
            );
        }
    }
    assert!(
        bytes.len() < v.len() * 4 / 3,
        "int8 is at most ~a third of f32 bytes"
    );
}

#[test]
fn int4_round_trip_is_within_half_a_scale_step_and_takes_half_a_byte() {
    // An odd row width, so that each token's row ends in a padding nibble.
    let (tokens, width) = (24, 33);
    let v = values(tokens, width, 5);
    let bytes = encode(&Codec::new(WireDtype::Int4), &meta(), &[tokens, width], &v).unwrap();
    let f = decode(&bytes, &DecodeLimits::default()).unwrap();
    for t in 0..tokens {
        let row = &v[t * width..(t + 1) * width];
        let absmax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
        let bound = absmax / 7.0 * (1.0 + 1.0 / 128.0) / 2.0;
        for (a, b) in row.iter().zip(&f.values[t * width..(t + 1) * width]) {
            assert!(
                (a - b).abs() <= bound * 1.0001,
                "token {t}: {a} vs {b}, bound {bound}"
            );
        }
    }
    let int8 = encode(&Codec::new(WireDtype::Int8), &meta(), &[tokens, width], &v).unwrap();
    assert!(
        bytes.len() < int8.len() * 3 / 4,
        "int4 ({}) is well under int8 ({})",
        bytes.len(),
        int8.len()
    );
}

#[test]
fn an_int4_code_of_minus_eight_or_a_set_padding_nibble_is_refused() {
    use super::quant::{dequantise, DequantError};
    // One token of 3 values: a bf16 scale of 1.0, then codes 1, -1, 2 and a zero pad.
    let scale = 0x3F80u16.to_le_bytes();
    let good = [scale[0], scale[1], 0xF1, 0x02];
    assert_eq!(
        dequantise(WireDtype::Int4, &good, 3, 3).unwrap(),
        vec![1.0, -1.0, 2.0]
    );
    let minus_eight = [scale[0], scale[1], 0x81, 0x02];
    assert_eq!(
        dequantise(WireDtype::Int4, &minus_eight, 3, 3),
        Err(DequantError::BadCode)
    );
    let padded = [scale[0], scale[1], 0xF1, 0x12];
    assert_eq!(
        dequantise(WireDtype::Int4, &padded, 3, 3),
        Err(DequantError::BadCode)
    );
}

#[test]
fn zero_rows_and_extreme_values_survive_int8() {
    let mut v = vec![0.0f32; 64];
    v[40] = f32::MAX;
    v[41] = -f32::MAX;
    v[50] = 1e-41;
    let bytes = encode(&Codec::new(WireDtype::Int8), &meta(), &[4, 16], &v).unwrap();
    let f = decode(&bytes, &DecodeLimits::default()).unwrap();
    assert!(f.values[..32].iter().all(|&x| x == 0.0));
    assert!(f.values[40] > 3e38 && f.values[41] < -3e38);
}

#[test]
fn non_finite_values_are_refused_by_the_encoder() {
    for bad in [f32::NAN, f32::INFINITY] {
        let err = encode(&Codec::new(WireDtype::F32), &meta(), &[2], &[1.0, bad]);
        assert!(matches!(err, Err(EncodeError::NonFinite)));
    }
    assert!(matches!(
        encode(&Codec::new(WireDtype::F32), &meta(), &[3], &[1.0, 2.0]),
        Err(EncodeError::ShapeMismatch {
            expected: 3,
            got: 2
        })
    ));
    assert!(matches!(
        encode(&Codec::new(WireDtype::F32), &meta(), &[], &[]),
        Err(EncodeError::BadRank(0))
    ));
}

#[test]
fn every_flipped_bit_and_every_truncation_is_rejected() {
    for dtype in [
        WireDtype::F32,
        WireDtype::Bf16,
        WireDtype::Int8,
        WireDtype::Int4,
    ] {
        let v = values(4, 8, 4);
        let bytes = encode(&Codec::new(dtype), &meta(), &[4, 8], &v).unwrap();
        let limits = DecodeLimits::default();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(decode(&b, &limits).is_err(), "{dtype} byte {i} bit {bit}");
            }
        }
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len], &limits).is_err(), "{dtype} len {len}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            decode(&longer, &limits),
            Err(DecodeError::PayloadLengthMismatch { .. })
        ));
    }
}

/// Rewrites the header field at `at` and re-hashes, so the frame reaches the later checks.
fn rehash(mut bytes: Vec<u8>, rank: usize) -> Vec<u8> {
    let h = header_len(rank);
    let mut hasher = blake3::Hasher::new();
    hasher.update(&bytes[..h - 32]);
    hasher.update(&bytes[h..]);
    bytes[h - 32..h].copy_from_slice(hasher.finalize().as_bytes());
    bytes
}

#[test]
fn oversized_claims_are_refused_before_allocating() {
    let v = values(4, 8, 5);
    let bytes = encode(&Codec::new(WireDtype::F32), &meta(), &[4, 8], &v).unwrap();
    let tight = DecodeLimits { max_raw_bytes: 64 };
    assert!(matches!(
        decode(&bytes, &tight),
        Err(DecodeError::TooLarge {
            declared: 128,
            limit: 64
        })
    ));
    // A shape whose size overflows is refused from the header.
    let set_dims = |dims: [u32; 2], raw: u64| {
        let mut b = bytes.clone();
        for (i, d) in dims.iter().enumerate() {
            b[FIXED_LEN + 4 * i..FIXED_LEN + 4 * i + 4].copy_from_slice(&d.to_le_bytes());
        }
        let at = FIXED_LEN + 8;
        b[at..at + 8].copy_from_slice(&raw.to_le_bytes());
        rehash(b, 2)
    };
    assert!(matches!(
        decode(
            &set_dims([u32::MAX, u32::MAX], 128),
            &DecodeLimits::default()
        ),
        Err(DecodeError::SizeOverflow)
    ));
    // A consistent claim of 4 GiB is refused by the limit, before any allocation.
    assert!(matches!(
        decode(
            &set_dims([1 << 20, 1 << 10], 4 << 30),
            &DecodeLimits::default()
        ),
        Err(DecodeError::TooLarge { .. })
    ));
    // A claim inconsistent with the shape is refused too.
    assert!(matches!(
        decode(&set_dims([4, 8], 129), &DecodeLimits::default()),
        Err(DecodeError::RawLengthMismatch {
            declared: 129,
            expected: 128
        })
    ));
}

#[test]
fn a_payload_that_expands_past_its_declared_length_is_rejected() {
    // A valid header for 4 f32 values, but a payload compressed from 1 MiB of zeros.
    let good = encode(&Codec::new(WireDtype::F32), &meta(), &[4], &[0.0; 4]).unwrap();
    let h = header_len(1);
    let bomb = zstd::bulk::compress(&vec![0u8; 1 << 20], 19).unwrap();
    let mut frame = good[..h].to_vec();
    frame[h - 40..h - 32].copy_from_slice(&(bomb.len() as u64).to_le_bytes());
    frame.extend_from_slice(&bomb);
    let frame = rehash(frame, 1);
    assert!(matches!(
        decode(&frame, &DecodeLimits::default()),
        Err(DecodeError::Decompress(_))
    ));
}

#[test]
fn non_finite_payloads_are_rejected_even_with_a_valid_hash() {
    let good = encode(&Codec::new(WireDtype::F32), &meta(), &[2], &[1.0, 2.0]).unwrap();
    let h = header_len(1);
    let raw: Vec<u8> = [1.0f32, f32::NAN]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let payload = zstd::bulk::compress(&raw, 3).unwrap();
    let mut frame = good[..h].to_vec();
    frame[h - 40..h - 32].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    frame.extend_from_slice(&payload);
    let frame = rehash(frame, 1);
    assert!(matches!(
        decode(&frame, &DecodeLimits::default()),
        Err(DecodeError::NonFinite)
    ));
}

#[test]
fn dtype_names_parse_back() {
    for d in [
        WireDtype::F32,
        WireDtype::Bf16,
        WireDtype::Int8,
        WireDtype::Int4,
    ] {
        assert_eq!(d.name().parse::<WireDtype>().unwrap(), d);
    }
    assert!("fp8".parse::<WireDtype>().is_err());
}
