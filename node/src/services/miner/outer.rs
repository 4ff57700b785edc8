//! One replica's outer step through a merge ([`training::outer`]): the basis (the stage's
//! snapshot and its momentum) and the basis vote going into the butterfly with the weights,
//! the new weights and momentum coming out of it. Pure: the caller hands in the snapshot
//! and the merge's result.

use bootstrap::RunConfig;
use training::outer::{self, OuterConfig, VOTE_LEN};

use super::snapshot::Snapshot;

/// A replica's side of one merge's outer step.
pub(crate) struct Outer {
    cfg: OuterConfig,
    /// The snapshot of the stage this replica holds (`None`: none of this stage's length).
    basis: Option<Snapshot>,
    /// What this replica appends to the values it merges.
    pub(crate) vote: [f32; VOTE_LEN],
}

impl Outer {
    /// The outer step of the merge of `stage` closing `epoch` for a replica whose snapshot
    /// is `snapshot` and whose weights have `len` values; `None` when the run merges by
    /// plain average.
    pub(crate) fn prepare(
        run: &RunConfig,
        epoch: u64,
        stage: u32,
        len: usize,
        snapshot: Option<Snapshot>,
    ) -> Option<Outer> {
        if run.outer_is_plain() {
            return None;
        }
        let (lr, momentum) = run.outer_at(epoch);
        let basis = snapshot.filter(|s| s.stage == stage && s.values.len() == len);
        // A replica without a basis votes zeros: it agrees with nobody, so nobody steps.
        let vote = basis.as_ref().map_or([0.0; VOTE_LEN], |b| {
            let momentum = b.momentum.as_deref().map_or(&[][..], |m| m.as_slice());
            outer::vote(&outer::basis_hash(b.hash.as_bytes(), momentum))
        });
        Some(Outer {
            cfg: OuterConfig {
                lr: lr as f32,
                momentum: momentum as f32,
            },
            basis,
            vote,
        })
    }

    /// The merge's result (the weights' average, the votes' average after it) turned into
    /// the new weights and momentum: the outer step when every member voted this basis, else
    /// the plain average and a zero momentum. Every member gets the same either way.
    pub(crate) fn finish(
        self,
        mut merged: Vec<f32>,
        epoch: u64,
        stage: u32,
    ) -> Result<(Vec<f32>, Vec<f32>), outer::OuterError> {
        let votes = merged.split_off(merged.len().saturating_sub(VOTE_LEN));
        let agreed = outer::votes_agree(&self.vote, &votes);
        match self.basis {
            Some(basis) if agreed => {
                let mut momentum = basis
                    .momentum
                    .as_deref()
                    .filter(|m| m.len() == merged.len())
                    .cloned()
                    .unwrap_or_else(|| vec![0.0; merged.len()]);
                let stepped = outer::step(&basis.values, &mut momentum, &merged, self.cfg)?;
                Ok((stepped, momentum))
            }
            _ => {
                tracing::warn!(
                    epoch,
                    stage,
                    "the stage's members hold different outer bases: plain average this merge"
                );
                let zero = vec![0.0; merged.len()];
                Ok((merged, zero))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A run with IOTA's outer step (the default is the plain average).
    fn outer_run() -> RunConfig {
        RunConfig {
            outer_lr: 0.7,
            outer_momentum: 0.9,
            outer_momentum_start: 0.5,
            outer_warmup_epochs: 20,
            ..RunConfig::default()
        }
    }

    fn snapshot(values: Vec<f32>, momentum: Vec<f32>) -> Snapshot {
        Snapshot {
            stage: 1,
            epoch: Some(3),
            hash: super::super::hex(&training::stage::hash_f32(&values)),
            values: Arc::new(values),
            momentum: Some(Arc::new(momentum)),
        }
    }

    /// What the butterfly hands every member: the sample-weighted average of their inputs.
    fn average(inputs: &[(Vec<f32>, u64)]) -> Vec<f32> {
        let total: u64 = inputs.iter().map(|(_, s)| s).sum();
        (0..inputs[0].0.len())
            .map(|i| {
                inputs
                    .iter()
                    .map(|(v, s)| v[i] * (*s as f64 / total as f64) as f32)
                    .sum()
            })
            .collect()
    }

    /// Runs one merge of members with `bases` and `live` weights; returns what each ends with.
    fn merge(run: &RunConfig, bases: &[Snapshot], live: &[Vec<f32>]) -> Vec<(Vec<f32>, Vec<f32>)> {
        let outers: Vec<Outer> = bases
            .iter()
            .map(|b| Outer::prepare(run, 4, 1, 3, Some(b.clone())).expect("outer step on"))
            .collect();
        let inputs: Vec<(Vec<f32>, u64)> = outers
            .iter()
            .zip(live)
            .zip([100, 60, 40])
            .map(|((o, w), s)| (w.iter().copied().chain(o.vote).collect(), s))
            .collect();
        let merged = average(&inputs);
        outers
            .into_iter()
            .map(|o| o.finish(merged.clone(), 4, 1).unwrap())
            .collect()
    }

    #[test]
    fn members_on_one_basis_take_the_same_outer_step() {
        let run = outer_run();
        let base = snapshot(vec![1.0, 2.0, 3.0], vec![0.1, 0.0, -0.1]);
        let live = vec![
            vec![0.9, 2.1, 3.0],
            vec![0.8, 2.0, 3.2],
            vec![1.0, 1.9, 2.9],
        ];
        let out = merge(&run, &[base.clone(), base.clone(), base.clone()], &live);
        assert!(out.windows(2).all(|w| w[0] == w[1]), "{out:?}");
        // It is the outer step, not the plain average.
        let plain = average(&live.iter().cloned().zip([100, 60, 40]).collect::<Vec<_>>());
        let (lr, mu) = run.outer_at(4);
        let mut momentum = vec![0.1, 0.0, -0.1];
        let cfg = OuterConfig {
            lr: lr as f32,
            momentum: mu as f32,
        };
        let expected = outer::step(&base.values, &mut momentum, &plain, cfg).unwrap();
        for (got, want) in out[0].0.iter().zip(&expected) {
            assert!((got - want).abs() < 1e-6, "{:?} vs {expected:?}", out[0].0);
        }
        assert!(out[0].0 != plain);
        assert!(out[0]
            .1
            .iter()
            .zip(&momentum)
            .all(|(a, b)| (a - b).abs() < 1e-6));
    }

    #[test]
    fn one_member_on_another_basis_makes_every_member_take_the_plain_average() {
        let run = outer_run();
        let base = snapshot(vec![1.0, 2.0, 3.0], vec![0.0; 3]);
        // Same weights, other momentum (a joiner served a wrong one).
        let odd = snapshot(vec![1.0, 2.0, 3.0], vec![0.5; 3]);
        let live = vec![
            vec![0.9, 2.1, 3.0],
            vec![0.8, 2.0, 3.2],
            vec![1.0, 1.9, 2.9],
        ];
        let out = merge(&run, &[base.clone(), odd, base], &live);
        assert!(out.windows(2).all(|w| w[0] == w[1]), "{out:?}");
        let plain = average(&live.iter().cloned().zip([100, 60, 40]).collect::<Vec<_>>());
        for (got, want) in out[0].0.iter().zip(&plain) {
            assert!((got - want).abs() < 1e-6);
        }
        assert_eq!(out[0].1, vec![0.0; 3]);
    }

    #[test]
    fn a_plain_run_takes_no_outer_step() {
        // The default run merges by plain average.
        assert!(Outer::prepare(&RunConfig::default(), 0, 1, 3, None).is_none());
    }
}
