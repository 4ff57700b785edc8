//! A miner's score: the work it verifiably did, zeroed when it cheated, smoothed over epochs.
//!
//! Per epoch, `score = verified work × quality`, where verified work is the number of samples
//! the miner served to completion (counted by the validator from the epoch's loss records, an
//! input here) and quality is 0 when CLASP flagged the miner, a spot check caught it or a
//! merge audit failed it, else 1. Scores are then smoothed by an exponential moving average
//!
//! ```text
//! ema ← α · epoch_score + (1 − α) · ema
//! ```
//!
//! with [`DEFAULT_ALPHA`] = 0.1: an epoch's work still counts for about a tenth after 22
//! epochs (`0.9²² ≈ 0.1`), so one noisy epoch neither makes nor breaks a miner. A CLASP flag
//! is statistical (an honest miner is flagged now and then): the flagged miner earns nothing
//! for the epoch and keeps nine tenths of its standing. A spot check or a merge audit that
//! fails is proof, not a statistic: the miner's standing is reset to 0 at once ([`EpochWork::caught`]),
//! so a cheater cannot live on credit earned before it was caught. A known miner absent from
//! an epoch scores 0 for it; a new miner starts from 0.

use std::collections::BTreeMap;

use crate::clasp::Uid;

/// Default smoothing factor of the moving average.
pub const DEFAULT_ALPHA: f64 = 0.1;

/// What the validator established about one miner in one epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EpochWork {
    /// The miner.
    pub uid: Uid,
    /// Samples it served to completion.
    pub samples_completed: u64,
    /// CLASP flagged it.
    pub flagged: bool,
    /// A spot check (recomputing one of its outputs) failed.
    pub spot_check_failed: bool,
    /// A merge audit (its contribution to the stage's all-reduce) failed.
    pub merge_audit_failed: bool,
}

impl EpochWork {
    /// 0 when any check failed, else 1.
    pub fn quality(&self) -> f64 {
        if self.flagged || self.spot_check_failed || self.merge_audit_failed {
            0.0
        } else {
            1.0
        }
    }
}

impl EpochWork {
    /// Caught by a check that proves misbehaviour (a spot check or a merge audit): the
    /// smoothed score is reset, not merely not increased.
    pub fn caught(&self) -> bool {
        self.spot_check_failed || self.merge_audit_failed
    }
}

/// One epoch's score: verified work × quality.
pub fn epoch_score(work: &EpochWork) -> f64 {
    work.samples_completed as f64 * work.quality()
}

/// Why a score operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ScoreError {
    /// α must lie in (0, 1].
    #[error("the smoothing factor must lie in (0, 1], not {alpha}")]
    Alpha {
        /// The value given.
        alpha: f64,
    },
    /// One miner appears twice in an epoch.
    #[error("miner {uid} appears twice in one epoch")]
    DuplicateMiner {
        /// The miner.
        uid: Uid,
    },
}

/// Smoothed scores of every miner seen so far.
#[derive(Debug, Clone, PartialEq)]
pub struct Scores {
    alpha: f64,
    ema: BTreeMap<Uid, f64>,
}

impl Scores {
    /// No scores yet, smoothing with `alpha` (in (0, 1]).
    pub fn new(alpha: f64) -> Result<Self, ScoreError> {
        if !(alpha > 0.0 && alpha <= 1.0) {
            return Err(ScoreError::Alpha { alpha });
        }
        Ok(Self {
            alpha,
            ema: BTreeMap::new(),
        })
    }

    /// Folds one epoch in. A duplicate miner leaves the scores unchanged.
    pub fn update(&mut self, epoch: &[EpochWork]) -> Result<(), ScoreError> {
        let mut this = BTreeMap::new();
        for w in epoch {
            if this.insert(w.uid, epoch_score(w)).is_some() {
                return Err(ScoreError::DuplicateMiner { uid: w.uid });
            }
        }
        for w in epoch.iter().filter(|w| w.caught()) {
            self.ema.insert(w.uid, 0.0);
        }
        for uid in this.keys() {
            self.ema.entry(*uid).or_insert(0.0);
        }
        let a = self.alpha;
        for (uid, ema) in &mut self.ema {
            let x = this.get(uid).copied().unwrap_or(0.0);
            *ema = a * x + (1.0 - a) * *ema;
        }
        Ok(())
    }

    /// The smoothed score of `uid` (0 if never seen).
    pub fn get(&self, uid: Uid) -> f64 {
        self.ema.get(&uid).copied().unwrap_or(0.0)
    }

    /// Every known miner's smoothed score, by uid.
    pub fn all(&self) -> Vec<(Uid, f64)> {
        self.ema.iter().map(|(&u, &s)| (u, s)).collect()
    }
}

impl Default for Scores {
    fn default() -> Self {
        Self {
            alpha: DEFAULT_ALPHA,
            ema: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(uid: Uid, samples: u64) -> EpochWork {
        EpochWork {
            uid,
            samples_completed: samples,
            ..EpochWork::default()
        }
    }

    #[test]
    fn any_failed_check_zeroes_the_epoch() {
        let w = work(1, 200);
        assert_eq!(epoch_score(&w), 200.0);
        for bad in [
            EpochWork { flagged: true, ..w },
            EpochWork {
                spot_check_failed: true,
                ..w
            },
            EpochWork {
                merge_audit_failed: true,
                ..w
            },
        ] {
            assert_eq!(epoch_score(&bad), 0.0, "{bad:?}");
        }
    }

    #[test]
    fn moving_average_follows_the_documented_recurrence() {
        let mut s = Scores::new(0.5).unwrap();
        // Epoch 1: 1 → 0.5·100 = 50; 2 → 0.5·40 = 20.
        s.update(&[work(1, 100), work(2, 40)]).unwrap();
        assert_eq!(s.get(1), 50.0);
        assert_eq!(s.get(2), 20.0);
        // Epoch 2: 1 flagged → 0.5·0 + 0.5·50 = 25; 2 absent → 0.5·20 = 10; 3 new → 30.
        s.update(&[
            EpochWork {
                flagged: true,
                ..work(1, 100)
            },
            work(3, 60),
        ])
        .unwrap();
        assert_eq!(s.all(), vec![(1, 25.0), (2, 10.0), (3, 30.0)]);
        assert_eq!(s.get(7), 0.0);
    }

    #[test]
    fn a_miner_caught_by_proof_loses_its_standing_a_flagged_one_keeps_most() {
        let mut s = Scores::new(0.5).unwrap();
        s.update(&[work(1, 100), work(2, 100), work(3, 100)])
            .unwrap();
        s.update(&[
            EpochWork {
                flagged: true,
                ..work(1, 100)
            },
            EpochWork {
                spot_check_failed: true,
                ..work(2, 100)
            },
            EpochWork {
                merge_audit_failed: true,
                ..work(3, 100)
            },
        ])
        .unwrap();
        // Flagged: 0.5·0 + 0.5·50 = 25; caught: reset to 0, then 0.5·0 + 0.5·0 = 0.
        assert_eq!(s.all(), vec![(1, 25.0), (2, 0.0), (3, 0.0)]);
        // An honest epoch after being caught starts again from nothing: 0.5·100.
        s.update(&[work(2, 100)]).unwrap();
        assert_eq!(s.get(2), 50.0);
    }

    #[test]
    fn steady_work_converges_to_its_epoch_score() {
        let mut s = Scores::default();
        for _ in 0..200 {
            s.update(&[work(5, 200)]).unwrap();
        }
        // 200·(1 − 0.9²⁰⁰) differs from 200 by ~1e-7.
        assert!((s.get(5) - 200.0).abs() < 1e-6, "{}", s.get(5));
    }

    #[test]
    fn bad_alpha_and_duplicates_are_refused() {
        for alpha in [0.0, -0.1, 1.5, f64::NAN] {
            assert!(Scores::new(alpha).is_err(), "{alpha}");
        }
        assert!(Scores::new(1.0).is_ok());
        let mut s = Scores::default();
        s.update(&[work(1, 10)]).unwrap();
        let before = s.clone();
        assert_eq!(
            s.update(&[work(2, 1), work(2, 3)]),
            Err(ScoreError::DuplicateMiner { uid: 2 })
        );
        assert_eq!(s, before);
    }
}
