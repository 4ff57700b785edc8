//! Yuma-style consensus: from several validators' weights and stakes to miner incentive and
//! validator trust.
//!
//! Inputs are each validator's chain weights (`(uid, u16)`) and stake. Each validator's row
//! is normalised to sum to 1 (a row of zeros stays zeros) and the stakes to sum to 1. Then,
//! per miner `j`:
//!
//! * **consensus** `c_j` = the stake-weighted median at `κ`: the largest weight `x` such that
//!   validators holding at least `κ` of the stake gave `j` a weight `≥ x`
//!   (`c_j = max { x : Σ_{i: W_ij ≥ x} S_i ≥ κ }`, and 0 when no positive weight has that
//!   support). With [`DEFAULT_KAPPA`] = 0.5 a tie — exactly half the stake behind a higher
//!   weight — resolves to the higher weight; the comparison allows a relative slack of
//!   [`STAKE_SLACK`] so that stakes summing to exactly κ in exact arithmetic are not lost to
//!   rounding.
//! * **clipping**: each validator's weight is cut to the consensus, `W̄_ij = min(W_ij, c_j)`,
//!   so no minority can push a miner above what the majority of stake supports.
//! * **incentive** `I_j = R_j / Σ R` with rank `R_j = Σ_i S_i · W̄_ij` (all 0 when every rank
//!   is 0).
//! * **validator trust** `T_i = Σ_j W̄_ij`: the share of validator `i`'s weight that
//!   survived clipping (1 for a validator that agrees with consensus everywhere).
//!
//! A validator with zero stake shapes neither consensus nor rank but still gets a trust
//! value; a miner nobody weights has consensus and incentive 0. Bonds and dividends (the rest
//! of Yuma) are not modelled here.

use std::collections::{BTreeMap, BTreeSet};

use crate::clasp::Uid;

/// Default consensus majority: half the stake.
pub const DEFAULT_KAPPA: f64 = 0.5;
/// Relative slack when comparing supporting stake with κ.
pub const STAKE_SLACK: f64 = 1e-12;

/// One validator's submitted weights and its stake.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatorWeights {
    /// Its stake (any unit; only proportions matter).
    pub stake: f64,
    /// Its weights in chain form.
    pub weights: Vec<(Uid, u16)>,
}

/// The outcome of [`consensus`].
#[derive(Debug, Clone, PartialEq)]
pub struct Consensus {
    /// Every miner any validator listed, sorted; the vectors below follow this order.
    pub miners: Vec<Uid>,
    /// Consensus weight per miner.
    pub consensus: Vec<f64>,
    /// Incentive per miner (sums to 1 unless every rank is 0).
    pub incentive: Vec<f64>,
    /// Trust per validator, in input order.
    pub validator_trust: Vec<f64>,
}

/// Why consensus could not be computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum YumaError {
    /// No validator.
    #[error("no validator weights")]
    NoValidators,
    /// A stake is negative, NaN or infinite.
    #[error("validator {validator} has stake {stake}, not a finite non-negative number")]
    InvalidStake {
        /// Index of the validator.
        validator: usize,
        /// Its stake.
        stake: f64,
    },
    /// All stakes are 0.
    #[error("total stake is zero")]
    ZeroStake,
    /// A validator lists a miner twice.
    #[error("validator {validator} lists uid {uid} twice")]
    DuplicateUid {
        /// Index of the validator.
        validator: usize,
        /// The uid.
        uid: Uid,
    },
    /// κ outside (0, 1].
    #[error("kappa must lie in (0, 1], not {kappa}")]
    InvalidKappa {
        /// The value given.
        kappa: f64,
    },
}

/// Yuma-style consensus of `validators` at majority `kappa` (see the module documentation).
pub fn consensus(validators: &[ValidatorWeights], kappa: f64) -> Result<Consensus, YumaError> {
    if !(kappa > 0.0 && kappa <= 1.0) {
        return Err(YumaError::InvalidKappa { kappa });
    }
    if validators.is_empty() {
        return Err(YumaError::NoValidators);
    }
    let mut total = 0.0;
    for (i, v) in validators.iter().enumerate() {
        if !(v.stake.is_finite() && v.stake >= 0.0) {
            return Err(YumaError::InvalidStake {
                validator: i,
                stake: v.stake,
            });
        }
        total += v.stake;
    }
    if total <= 0.0 {
        return Err(YumaError::ZeroStake);
    }
    let stake: Vec<f64> = validators.iter().map(|v| v.stake / total).collect();

    let miners: Vec<Uid> = validators
        .iter()
        .flat_map(|v| v.weights.iter().map(|&(u, _)| u))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let column: BTreeMap<Uid, usize> = miners.iter().enumerate().map(|(j, &u)| (u, j)).collect();
    let m = miners.len();

    // Normalised weight matrix, row per validator.
    let mut w = vec![vec![0.0; m]; validators.len()];
    for (i, v) in validators.iter().enumerate() {
        let mut seen = BTreeSet::new();
        let mut sum = 0.0;
        for &(uid, x) in &v.weights {
            if !seen.insert(uid) {
                return Err(YumaError::DuplicateUid { validator: i, uid });
            }
            sum += f64::from(x);
        }
        if sum > 0.0 {
            for &(uid, x) in &v.weights {
                if let Some(&j) = column.get(&uid) {
                    w[i][j] = f64::from(x) / sum;
                }
            }
        }
    }

    let need = kappa * (1.0 - STAKE_SLACK);
    let consensus: Vec<f64> = (0..m)
        .map(|j| {
            let mut levels: Vec<f64> = w.iter().map(|row| row[j]).filter(|&x| x > 0.0).collect();
            levels.sort_unstable_by(|a, b| b.total_cmp(a));
            levels
                .into_iter()
                .find(|&x| {
                    let support: f64 = w
                        .iter()
                        .zip(&stake)
                        .filter(|(row, _)| row[j] >= x)
                        .map(|(_, s)| s)
                        .sum();
                    support >= need
                })
                .unwrap_or(0.0)
        })
        .collect();

    let clipped: Vec<Vec<f64>> = w
        .iter()
        .map(|row| row.iter().zip(&consensus).map(|(x, c)| x.min(*c)).collect())
        .collect();
    let rank: Vec<f64> = (0..m)
        .map(|j| clipped.iter().zip(&stake).map(|(row, s)| s * row[j]).sum())
        .collect();
    let rank_total: f64 = rank.iter().sum();
    let incentive = rank
        .iter()
        .map(|r| {
            if rank_total > 0.0 {
                r / rank_total
            } else {
                0.0
            }
        })
        .collect();
    let validator_trust = clipped.iter().map(|row| row.iter().sum()).collect();
    Ok(Consensus {
        miners,
        consensus,
        incentive,
        validator_trust,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
        }
    }

    fn v(stake: f64, weights: &[(Uid, u16)]) -> ValidatorWeights {
        ValidatorWeights {
            stake,
            weights: weights.to_vec(),
        }
    }

    #[test]
    fn three_validators_with_ties_at_half_the_stake() {
        // Stakes 50/30/20 → S = [0.5, 0.3, 0.2]. Normalised rows over miners [1, 2, 3]:
        //   V0 (3, 1, –) → [0.75, 0.25, 0  ]
        //   V1 (1, 1, 2) → [0.25, 0.25, 0.5]
        //   V2 (–, 1, 1) → [0,    0.5,  0.5]
        // Miner 1: weight ≥ 0.75 has stake 0.5 ≥ κ (the tie goes up)          → c = 0.75.
        // Miner 2: ≥ 0.5 has 0.2; ≥ 0.25 has 1.0                              → c = 0.25.
        // Miner 3: ≥ 0.5 has 0.3 + 0.2 = 0.5 ≥ κ (tie)                         → c = 0.5.
        // Clipped: V0 [0.75, 0.25, 0], V1 [0.25, 0.25, 0.5], V2 [0, 0.25, 0.5].
        // Ranks: R1 = 0.5·0.75 + 0.3·0.25 = 0.45; R2 = 0.25; R3 = 0.3·0.5 + 0.2·0.5 = 0.25.
        // Σ R = 0.95 → I = [0.45, 0.25, 0.25] / 0.95. Trust: V0 1, V1 1, V2 0.75.
        let c = consensus(
            &[
                v(50.0, &[(1, 3), (2, 1)]),
                v(30.0, &[(1, 1), (2, 1), (3, 2)]),
                v(20.0, &[(2, 1), (3, 1)]),
            ],
            DEFAULT_KAPPA,
        )
        .unwrap();
        assert_eq!(c.miners, vec![1, 2, 3]);
        close(&c.consensus, &[0.75, 0.25, 0.5]);
        close(&c.incentive, &[0.45 / 0.95, 0.25 / 0.95, 0.25 / 0.95]);
        close(&c.validator_trust, &[1.0, 1.0, 0.75]);
    }

    #[test]
    fn zero_stake_validator_and_unweighted_miner() {
        // S = [0.6, 0.4, 0]; miners [1, 2, 3, 4]:
        //   V0 (1, 1, –, 0) → [0.5, 0.5, 0, 0]; V1 (1) → [1, 0, 0, 0]; V2 (3) → [0, 0, 1, 0].
        // Miner 1: ≥ 1 has 0.4 < κ; ≥ 0.5 has 1.0          → c = 0.5.
        // Miner 2: ≥ 0.5 has 0.6                            → c = 0.5.
        // Miner 3: only the zero-stake V2 backs it          → c = 0.
        // Miner 4: nobody weights it                        → c = 0.
        // Clipped: V0 [0.5, 0.5, 0, 0], V1 [0.5, 0, 0, 0], V2 zeros.
        // R = [0.6·0.5 + 0.4·0.5, 0.6·0.5, 0, 0] = [0.5, 0.3, 0, 0]; Σ 0.8 → I = [0.625, 0.375, 0, 0].
        // Trust: V0 1, V1 0.5, V2 0.
        let c = consensus(
            &[
                v(60.0, &[(1, 7), (2, 7), (4, 0)]),
                v(40.0, &[(1, 65_535)]),
                v(0.0, &[(3, 1)]),
            ],
            DEFAULT_KAPPA,
        )
        .unwrap();
        assert_eq!(c.miners, vec![1, 2, 3, 4]);
        close(&c.consensus, &[0.5, 0.5, 0.0, 0.0]);
        close(&c.incentive, &[0.625, 0.375, 0.0, 0.0]);
        close(&c.validator_trust, &[1.0, 0.5, 0.0]);
    }

    #[test]
    fn minority_cannot_lift_a_miner_above_consensus() {
        // S = [0.7, 0.3]. V0 → [0.5, 0.5]; V1 (colluding with miner 2) → [0, 1].
        // Miner 1: ≥ 0.5 has 0.7 → c = 0.5. Miner 2: ≥ 1 has 0.3; ≥ 0.5 has 1.0 → c = 0.5.
        // Clipped V1 = [0, 0.5]. R = [0.35, 0.35 + 0.15] = [0.35, 0.5]; Σ 0.85.
        // Trust: V0 1, V1 0.5.
        let c = consensus(
            &[v(7.0, &[(1, 1), (2, 1)]), v(3.0, &[(2, 9)])],
            DEFAULT_KAPPA,
        )
        .unwrap();
        close(&c.consensus, &[0.5, 0.5]);
        close(&c.incentive, &[0.35 / 0.85, 0.5 / 0.85]);
        close(&c.validator_trust, &[1.0, 0.5]);
    }

    #[test]
    fn all_zero_weights_give_zero_incentive() {
        let c = consensus(&[v(1.0, &[(1, 0), (2, 0)])], DEFAULT_KAPPA).unwrap();
        close(&c.incentive, &[0.0, 0.0]);
        close(&c.validator_trust, &[0.0]);
    }

    #[test]
    fn invalid_input_is_refused() {
        assert_eq!(consensus(&[], 0.5), Err(YumaError::NoValidators));
        assert_eq!(
            consensus(&[v(0.0, &[(1, 1)])], 0.5),
            Err(YumaError::ZeroStake)
        );
        assert!(matches!(
            consensus(&[v(f64::NAN, &[])], 0.5),
            Err(YumaError::InvalidStake { validator: 0, .. })
        ));
        assert_eq!(
            consensus(&[v(1.0, &[(1, 1), (1, 2)])], 0.5),
            Err(YumaError::DuplicateUid {
                validator: 0,
                uid: 1
            })
        );
        assert!(consensus(&[v(1.0, &[])], 0.0).is_err());
    }
}
