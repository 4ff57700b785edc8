//! The outer optimizer of a merge: the replicas' averaged change since the last merge taken
//! as a pseudo-gradient, and an outer Nesterov step on it (DiLoCo; IOTA's merge does the
//! same), plus the basis vote that tells every member whether they may take it.
//!
//! Every replica of a stage keeps the weights of the stage's last merge (the *basis*, `S`)
//! and the outer momentum `M`. The butterfly averages the replicas' live weights into `W̄`;
//! each replica then computes, with the same bytes in and the same arithmetic,
//!
//! ```text
//! Δ  = S − W̄            (the pseudo-gradient)
//! M' = μ·M + Δ
//! S' = S − lr·(Δ + μ·M')   (Nesterov)
//! ```
//!
//! so all of them hold the same `S'` and `M'` without sending anything more, *if* they
//! started from the same `S` and `M`. A replica that joined from a stale checkpoint or was
//! served a wrong momentum would not, and its merge would never agree again. So each member
//! appends [`VOTE_LEN`] values to the vector it merges: the bits of the hash of its basis as
//! ±1 ([`vote`]). The butterfly averages them with the weights; every member sees the same
//! averaged vote, and it equals its own exactly when every included member voted the same
//! ([`votes_agree`]). When it does not, all of them fall back to the plain average and a
//! zero momentum: the stage is consistent again after that merge.
//!
//! With `lr = 1` and `μ = 0` the step is the plain average; [`OuterConfig::is_plain`] lets
//! the caller skip the vote and the arithmetic then.

/// Values a member appends to its merge vector: 64 bits of its basis hash.
pub const VOTE_LEN: usize = 64;

/// Largest distance of an averaged vote value from its own for the vote to agree: far above
/// the rounding of a weighted sum of equal ±1 values, far below the shift one dissenting
/// member of any realistic weight causes (2 × its share of the samples).
const VOTE_TOLERANCE: f32 = 1e-4;

/// The outer step's settings for one merge.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OuterConfig {
    /// Outer learning rate (1 takes the average's change as it is).
    pub lr: f32,
    /// Nesterov momentum of this merge, in `[0, 1)`.
    pub momentum: f32,
}

impl OuterConfig {
    /// Whether the step is exactly the plain average (no momentum, learning rate 1).
    pub fn is_plain(&self) -> bool {
        self.lr == 1.0 && self.momentum == 0.0
    }
}

/// Why an outer step cannot be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OuterError {
    /// The basis, momentum and average are not vectors of one length.
    #[error("outer step over vectors of different lengths: basis {basis}, momentum {momentum}, average {average}")]
    Lengths {
        /// Basis length.
        basis: usize,
        /// Momentum length.
        momentum: usize,
        /// Average length.
        average: usize,
    },
}

/// The hash of a basis: the merged weights' hash (in any fixed encoding, e.g. its hex) and
/// the momentum's, together.
pub fn basis_hash(weights_hash: &[u8], momentum: &[f32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"iota-p2p/outer-basis/v1");
    h.update(weights_hash);
    h.update(&crate::stage::hash_f32(momentum));
    *h.finalize().as_bytes()
}

/// The vote a member appends to its merge vector: the first [`VOTE_LEN`] bits of `basis`
/// as +1 / −1.
pub fn vote(basis: &[u8; 32]) -> [f32; VOTE_LEN] {
    let mut out = [0.0; VOTE_LEN];
    for (i, v) in out.iter_mut().enumerate() {
        let bit = (basis[i / 8] >> (i % 8)) & 1;
        *v = if bit == 1 { 1.0 } else { -1.0 };
    }
    out
}

/// Whether the averaged vote equals this member's own: every included member voted the
/// same basis. A vote of the wrong length never agrees.
pub fn votes_agree(own: &[f32; VOTE_LEN], averaged: &[f32]) -> bool {
    averaged.len() == VOTE_LEN
        && own
            .iter()
            .zip(averaged)
            .all(|(o, a)| (o - a).abs() <= VOTE_TOLERANCE)
}

/// The outer Nesterov step from `basis` given the replicas' `average`: returns the new
/// weights and updates `momentum` in place (see the module doc for the formulas).
pub fn step(
    basis: &[f32],
    momentum: &mut [f32],
    average: &[f32],
    cfg: OuterConfig,
) -> Result<Vec<f32>, OuterError> {
    if basis.len() != momentum.len() || basis.len() != average.len() {
        return Err(OuterError::Lengths {
            basis: basis.len(),
            momentum: momentum.len(),
            average: average.len(),
        });
    }
    let (lr, mu) = (cfg.lr, cfg.momentum);
    Ok(basis
        .iter()
        .zip(momentum.iter_mut())
        .zip(average)
        .map(|((s, m), w)| {
            let delta = s - w;
            *m = mu * *m + delta;
            s - lr * (delta + mu * *m)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_settings_give_the_average_and_the_delta_as_momentum() {
        let basis = [1.0, 2.0, 3.0];
        let average = [0.5, 2.5, 3.0];
        let mut m = [0.0; 3];
        let cfg = OuterConfig {
            lr: 1.0,
            momentum: 0.0,
        };
        assert!(cfg.is_plain());
        assert_eq!(step(&basis, &mut m, &average, cfg).unwrap(), average);
        assert_eq!(m, [0.5, -0.5, 0.0]);
    }

    #[test]
    fn nesterov_matches_the_formulas_over_two_merges() {
        let cfg = OuterConfig {
            lr: 0.7,
            momentum: 0.9,
        };
        let mut m = [0.0f32];
        // Merge 1: Δ = 1 − 0.8 = 0.2; M = 0.2; S' = 1 − 0.7·(0.2 + 0.18) = 0.734.
        let s1 = step(&[1.0], &mut m, &[0.8], cfg).unwrap();
        assert!((m[0] - 0.2).abs() < 1e-6);
        assert!((s1[0] - 0.734).abs() < 1e-6, "{s1:?}");
        // Merge 2 from S' with average 0.634: Δ = 0.1; M = 0.28; S'' = 0.734 − 0.7·(0.1 + 0.252).
        let s2 = step(&s1, &mut m, &[0.634], cfg).unwrap();
        assert!((m[0] - 0.28).abs() < 1e-6);
        assert!((s2[0] - (0.734 - 0.7 * 0.352)).abs() < 1e-6, "{s2:?}");
    }

    #[test]
    fn vectors_of_different_lengths_are_refused_and_momentum_untouched() {
        let mut m = [7.0, 7.0];
        let cfg = OuterConfig {
            lr: 0.7,
            momentum: 0.9,
        };
        assert!(matches!(
            step(&[1.0, 2.0], &mut m, &[1.0], cfg),
            Err(OuterError::Lengths { .. })
        ));
        assert_eq!(m, [7.0, 7.0]);
    }

    /// The weighted average the butterfly takes, in f32 as it does.
    fn weighted(votes: &[([f32; VOTE_LEN], u64)]) -> Vec<f32> {
        let total: u64 = votes.iter().map(|(_, s)| s).sum();
        (0..VOTE_LEN)
            .map(|i| {
                votes
                    .iter()
                    .map(|(v, s)| v[i] * (*s as f64 / total as f64) as f32)
                    .sum()
            })
            .collect()
    }

    #[test]
    fn the_vote_agrees_only_when_every_member_holds_the_same_basis() {
        let weights = crate::stage::hash_f32(&[1.0, 2.0]);
        let a = vote(&basis_hash(&weights, &[0.0, 0.0]));
        let b = vote(&basis_hash(&weights, &[0.0, 1e-3]));
        assert_ne!(a, b);
        // Seven members with uneven weights, all on basis a.
        let same: Vec<_> = [1u64, 3, 200, 7, 50, 9, 120]
            .iter()
            .map(|s| (a, *s))
            .collect();
        assert!(votes_agree(&a, &weighted(&same)));
        // One dissenter, even with a tiny share of the samples: nobody agrees.
        let mut one_off = same.clone();
        one_off[0] = (b, 1);
        let averaged = weighted(&one_off);
        assert!(!votes_agree(&a, &averaged));
        assert!(!votes_agree(&b, &averaged));
        assert!(!votes_agree(&a, &averaged[1..]));
    }
}
