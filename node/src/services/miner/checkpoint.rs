//! The merge at an epoch's end: this replica's weights (and, when the run takes an outer step,
//! its basis vote) into the butterfly with the stage's other replicas, the result applied to
//! the running stage (keeping the steps taken meanwhile), kept as the snapshot, checkpointed,
//! and its hash gossiped.

use std::sync::Arc;
use std::time::SystemTime;

use bootstrap::{EpochPlan, PeerIdStr};
use training::checkpoint::CheckpointKey;
use training::StageHandle;

use super::context::{Ctx, WeightsOrigin};
use super::task::Note;
use super::{hex, lock, outer, snapshot, stage};
use crate::services::merge::api::MergeRequest;
use crate::wire::messages::PipelineGossip;

/// Merges this replica's weights with the other replicas of `stage` in `plan`, then
/// checkpoints and gossips the merged hash.
pub(crate) async fn merge_and_checkpoint(
    ctx: &Arc<Ctx>,
    plan: &EpochPlan,
    stage: u32,
    worker: &StageHandle,
    start: SystemTime,
) -> anyhow::Result<()> {
    let (merged, momentum, given) = merge(ctx, plan, stage, worker, start).await?;
    // The merge's hash is that of the result every replica computed; the live weights also
    // hold the steps taken meanwhile.
    let hash = hex(&training::stage::hash_f32(&merged));
    // Evidence of samples served with the weights being replaced no longer reproduces.
    ctx.new_generation(WeightsOrigin {
        epoch: Some(plan.epoch),
        hash: hash.clone(),
    });
    let merged = Arc::new(merged);
    worker.apply_merge(given, Arc::clone(&merged)).await?;
    let merged = Arc::try_unwrap(merged).unwrap_or_else(|shared| shared.as_ref().clone());
    // The checkpoint holds the merge's result, which every replica agrees on and which a
    // restart from it must hash to, with the optimizer's moments as they are now (the few
    // steps taken during the merge live on in the running stage only). The result and its
    // momentum are moved in and out of it, not copied: a stage's state is four vectors of
    // its length at this point already.
    let mut state = worker.export_state().await?;
    let has_momentum = momentum.is_some();
    state.params = merged;
    state.outer_momentum = momentum.unwrap_or_default();
    let saved = match &ctx.store {
        Some(store) => {
            let key = CheckpointKey {
                run: ctx.run_id,
                stage,
                epoch: plan.epoch,
                step: state.step,
            };
            store.save(&key, &state).map(|_| {
                tracing::info!(stage, epoch = plan.epoch, step = state.step, weights_hash = %hash, "checkpoint saved");
            })
        }
        None => Ok(()),
    };
    let merged = std::mem::take(&mut state.params);
    let momentum = has_momentum.then(|| std::mem::take(&mut state.outer_momentum));
    drop(state);
    // Kept even when the checkpoint could not be saved: the merge itself is not lost.
    snapshot::keep(ctx, stage, Some(plan.epoch), hash.clone(), merged, momentum);
    saved?;
    stage::set_weights(ctx, Some(plan.epoch), hash.clone()).await;
    publish_merged(ctx, plan.epoch, stage, hash).await;
    Ok(())
}

/// The merged weights, the outer momentum that comes with them (when the run keeps one),
/// and what this replica gave the merge.
type Merged = (Vec<f32>, Option<Vec<f32>>, Vec<f32>);

/// The `poison-merge` and `poison-random` faults: `weights` scaled ×10, or replaced by
/// uniform random values with the same root mean square.
fn poison(weights: &mut [f32], random: bool) {
    use rand::Rng;
    if !random {
        weights.iter_mut().for_each(|w| *w *= 10.0);
        return;
    }
    let squares: f64 = weights.iter().map(|&w| f64::from(w) * f64::from(w)).sum();
    let rms = (squares / weights.len().max(1) as f64).sqrt() as f32;
    let bound = 3f32.sqrt() * rms.max(f32::MIN_POSITIVE);
    let mut rng = rand::thread_rng();
    weights
        .iter_mut()
        .for_each(|w| *w = rng.gen_range(-bound..=bound));
}

/// Runs the butterfly of `stage` in `plan` with this replica's weights (and basis vote).
async fn merge(
    ctx: &Ctx,
    plan: &EpochPlan,
    stage: u32,
    worker: &StageHandle,
    start: SystemTime,
) -> anyhow::Result<Merged> {
    let members: Vec<PeerIdStr> = plan.miners_of(stage).cloned().collect();
    let mut weights = worker.flat_params().await?;
    // What this replica gives the merge: the steps it takes while the merge runs are kept
    // on top of the merge's result.
    let given = weights.clone();
    let param_count = weights.len() as u64;
    let mut samples = ctx
        .ask(|reply| Note::MergeStarts { param_count, reply })
        .await?;
    let faults = ctx.cfg.faults;
    if faults.inflate_samples {
        samples = u64::MAX;
    }
    if faults.nan_merge {
        weights.iter_mut().step_by(97).for_each(|w| *w = f32::NAN);
    }
    if faults.poison_merge || faults.poison_random {
        samples = u64::MAX;
        poison(&mut weights, faults.poison_random);
    }
    // The outer step's basis (this replica's snapshot of the stage and its momentum) and its
    // vote, merged with the weights: every member learns whether all of them hold one basis.
    let basis = lock(&ctx.snapshot).clone();
    let outer = outer::Outer::prepare(&ctx.cfg.run, plan.epoch, stage, given.len(), basis);
    if let Some(outer) = &outer {
        weights.extend_from_slice(&outer.vote);
    }
    let merged = ctx
        .merger
        .merge(MergeRequest {
            epoch: plan.epoch,
            stage,
            seed: plan.seed,
            members,
            weights,
            samples,
            start,
            max_samples: crate::schedule::max_samples(plan),
        })
        .await?;
    Ok(match outer {
        Some(outer) => {
            let (merged, momentum) = outer.finish(merged, plan.epoch, stage)?;
            (merged, Some(momentum), given)
        }
        None => (merged, None, given),
    })
}

/// Gossips the hash of the merge of `stage` closing `epoch`.
async fn publish_merged(ctx: &Ctx, epoch: u64, stage: u32, hash: String) {
    let message = PipelineGossip::Merged {
        epoch,
        stage,
        hash,
        wire_bytes: ctx.metrics.wire_bytes_sent(),
    };
    if let Some(bytes) = message.to_bytes() {
        let topic = crate::wire::topics::Topics::of(&ctx.cfg.run.run_name).pipeline;
        if let Err(error) = ctx.client.publish(&topic, bytes).await {
            tracing::debug!(%error, "merge hash not published");
        }
    }
}
