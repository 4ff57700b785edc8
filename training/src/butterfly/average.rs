//! Partition hashes and the weighted average every holder and verifier computes.
//!
//! Guarantees: [`Hash::of_values`] is blake3 over the little-endian bytes of the `f32`s, so
//! it is the same on every platform; [`weighted_average`] sorts its inputs by member id and
//! accumulates in `f32` in that order with weights computed the same way everywhere, so any
//! two nodes that average the same contributions get bit-identical bytes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A blake3 hash of a partition (or of a whole vector): 32 bytes, shown and serialised as
/// 64 lowercase hex digits. The default is all zeros (the hash of nothing in particular).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hash(pub [u8; 32]);

impl Hash {
    /// blake3 of the little-endian bytes of `values`.
    pub fn of_values(values: &[f32]) -> Hash {
        const CHUNK: usize = 1024;
        let mut hasher = blake3::Hasher::new();
        let mut buf = [0u8; CHUNK * 4];
        for chunk in values.chunks(CHUNK) {
            for (i, v) in chunk.iter().enumerate() {
                buf[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
            }
            hasher.update(&buf[..chunk.len() * 4]);
        }
        Hash(*hasher.finalize().as_bytes())
    }

    /// blake3 of arbitrary bytes (used to name a message in evidence).
    pub fn of_bytes(bytes: &[u8]) -> Hash {
        Hash(*blake3::hash(bytes).as_bytes())
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({self})")
    }
}

/// Why a string is not a [`struct@Hash`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseHashError {
    /// Not exactly 64 characters.
    #[error("a hash is 64 hex digits, got {0} characters")]
    Length(usize),
    /// A character that is not a hex digit.
    #[error("not a hex digit: {0:?}")]
    Digit(char),
}

impl FromStr for Hash {
    type Err = ParseHashError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let chars: Vec<char> = s.chars().take(65).collect();
        let digit = |c: char| c.to_digit(16).ok_or(ParseHashError::Digit(c));
        let mut out = [0u8; 32];
        if chars.len() != 64 {
            return Err(ParseHashError::Length(chars.len()));
        }
        for (i, pair) in chars.chunks_exact(2).enumerate() {
            out[i] = ((digit(pair[0])? << 4) | digit(pair[1])?) as u8;
        }
        Ok(Hash(out))
    }
}

impl Serialize for Hash {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Hash {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One member's input to a partition's average.
#[derive(Debug, Clone, Copy)]
pub struct Contribution<'a> {
    /// The member's id; contributions are summed in ascending id order.
    pub member: &'a str,
    /// Samples the member processed this epoch (its weight).
    pub samples: u64,
    /// The member's values for the partition.
    pub values: &'a [f32],
}

/// Why an average could not be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AverageError {
    /// No contributions.
    #[error("nothing to average")]
    Empty,
    /// Contributions of different lengths.
    #[error("member {member:?} gave {got} values, expected {expected}")]
    LengthMismatch {
        /// The member whose length differs from the first one's.
        member: String,
        /// Length of the first contribution.
        expected: usize,
        /// Length of this one.
        got: usize,
    },
    /// The same member twice.
    #[error("member {0:?} contributes twice")]
    DuplicateMember(String),
}

/// The samples-weighted average of `contributions`, bit-identical on every node.
///
/// Weights are `c_i / Σ c` computed in `f64` and rounded once to `f32`, where `c_i` is the
/// member's sample count capped at the lower median of the counts (so no member's own claim
/// buys it more weight than a typical co-replica); if every count is zero, all weigh the
/// same. The sum runs in ascending member id
/// order, one `f32` multiply and add per value (no fused multiply-add), whatever order the
/// contributions are given in.
pub fn weighted_average(contributions: &[Contribution<'_>]) -> Result<Vec<f32>, AverageError> {
    let first = contributions.first().ok_or(AverageError::Empty)?;
    let len = first.values.len();
    let mut sorted: Vec<&Contribution<'_>> = contributions.iter().collect();
    sorted.sort_by(|a, b| a.member.cmp(b.member));
    for pair in sorted.windows(2) {
        if pair[0].member == pair[1].member {
            return Err(AverageError::DuplicateMember(pair[0].member.to_string()));
        }
    }
    if let Some(c) = sorted.iter().find(|c| c.values.len() != len) {
        return Err(AverageError::LengthMismatch {
            member: c.member.to_string(),
            expected: len,
            got: c.values.len(),
        });
    }
    let weights = weights(sorted.iter().map(|c| c.samples));
    let mut out = vec![0f32; len];
    for (c, w) in sorted.iter().zip(weights) {
        for (acc, x) in out.iter_mut().zip(c.values) {
            *acc += w * *x;
        }
    }
    Ok(out)
}

/// Each member's weight: its sample count capped at the lower median of the counts
/// ([`super::robust::capped_samples`]), over their sum.
fn weights(samples: impl Iterator<Item = u64>) -> Vec<f32> {
    let samples = super::robust::capped_samples(&samples.collect::<Vec<_>>());
    let total: u128 = samples.iter().copied().map(u128::from).sum();
    if total == 0 {
        let n = samples.len();
        return vec![(1.0 / n as f64) as f32; n];
    }
    samples
        .iter()
        .map(|&s| (s as f64 / total as f64) as f32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_blake3_of_little_endian_bytes() {
        let values = [1.0f32, -2.5, f32::MIN_POSITIVE];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(Hash::of_values(&values), Hash::of_bytes(&bytes));
        let long: Vec<f32> = (0..5000).map(|i| i as f32 * 0.25).collect();
        let bytes: Vec<u8> = long.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(Hash::of_values(&long), Hash::of_bytes(&bytes));
        assert_ne!(Hash::of_values(&long), Hash::of_values(&long[1..]));
    }

    #[test]
    fn hash_hex_round_trips_and_rejects_garbage() {
        let h = Hash::of_values(&[3.0]);
        let text = h.to_string();
        assert_eq!(text.len(), 64);
        assert_eq!(text.parse::<Hash>(), Ok(h));
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(serde_json::from_str::<Hash>(&json).unwrap(), h);
        assert_eq!("abc".parse::<Hash>(), Err(ParseHashError::Length(3)));
        let bad = format!("g{}", &text[1..]);
        assert_eq!(bad.parse::<Hash>(), Err(ParseHashError::Digit('g')));
        let multibyte = format!("é{}", &text[2..]);
        assert!(multibyte.parse::<Hash>().is_err());
    }

    #[test]
    fn average_is_weighted_by_capped_samples_and_independent_of_input_order() {
        let a = [1.0f32, 2.0];
        let b = [3.0f32, 6.0];
        let c = [0.1f32, 0.7];
        let forward = [
            Contribution {
                member: "a",
                samples: 1,
                values: &a,
            },
            Contribution {
                member: "b",
                samples: 3,
                values: &b,
            },
            Contribution {
                member: "c",
                samples: 7,
                values: &c,
            },
        ];
        let mut backward = forward;
        backward.reverse();
        let x = weighted_average(&forward).unwrap();
        let y = weighted_average(&backward).unwrap();
        assert_eq!(
            x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        // 1, 3 and 7 samples weigh 1, 3 and 3: no count above the lower median counts.
        for j in 0..2 {
            let exact = (a[j] as f64 + 3.0 * b[j] as f64 + 3.0 * c[j] as f64) / 7.0;
            assert!((x[j] as f64 - exact).abs() < 1e-5, "{} vs {exact}", x[j]);
        }
    }

    #[test]
    fn zero_samples_everywhere_means_equal_weights() {
        let a = [2.0f32];
        let b = [4.0f32];
        let avg = weighted_average(&[
            Contribution {
                member: "a",
                samples: 0,
                values: &a,
            },
            Contribution {
                member: "b",
                samples: 0,
                values: &b,
            },
        ])
        .unwrap();
        assert_eq!(avg, vec![3.0]);
    }

    #[test]
    fn bad_contributions_are_typed_errors() {
        assert_eq!(weighted_average(&[]), Err(AverageError::Empty));
        let a = [1.0f32];
        let b = [1.0f32, 2.0];
        assert!(matches!(
            weighted_average(&[
                Contribution {
                    member: "a",
                    samples: 1,
                    values: &a
                },
                Contribution {
                    member: "b",
                    samples: 1,
                    values: &b
                },
            ]),
            Err(AverageError::LengthMismatch { .. })
        ));
        assert_eq!(
            weighted_average(&[
                Contribution {
                    member: "a",
                    samples: 1,
                    values: &a
                },
                Contribution {
                    member: "a",
                    samples: 1,
                    values: &a
                },
            ]),
            Err(AverageError::DuplicateMember("a".into()))
        );
    }
}
