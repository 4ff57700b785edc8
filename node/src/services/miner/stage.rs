//! Building and loading a stage: a compute thread for the stage the plan gives this miner,
//! loaded with the newest state of the run — this miner's own checkpoint when it is that
//! state, else the snapshot of a live replica (checked against the merge hash its members
//! gossiped and the validators' word on that merge), else an older checkpoint, else the run
//! seed.

use std::sync::Arc;

/// How many times slower a miner with the `slow` fault computes.
const SLOW_FAULT_FACTOR: f64 = 5.0;

use bootstrap::EpochPlan;
use training::checkpoint::Manifest;
use training::{StageHandle, StageState};

use super::context::{until, Ctx, WeightsOrigin};
use super::task::Note;
use super::transition::Superseded;
use super::{hex, snapshot, JOIN_SLACK, MAX_IN_FLIGHT};
use crate::services::validator::api::Decision;

/// Builds stage `stage`: from the newest verified checkpoint, else from a live replica, else
/// from the run seed.
pub(crate) async fn build(
    ctx: &Arc<Ctx>,
    plan: &EpochPlan,
    stage: u32,
) -> anyhow::Result<StageHandle> {
    let run = &ctx.cfg.run;
    let mut stage_cfg = crate::run_spec::stage_config(run, stage, ctx.cfg.compute);
    stage_cfg.optimizer.lr = plan.lr;
    stage_cfg.max_in_flight = MAX_IN_FLIGHT * 2;
    stage_cfg.checkpoint_activations = ctx.cfg.checkpoint_activations;
    let mut worker_cfg = crate::run_spec::worker_config(run, stage_cfg, ctx.frames.limits());
    if ctx.cfg.faults.slow {
        worker_cfg.slowdown = SLOW_FAULT_FACTOR;
    }
    let (handle, thread) = StageHandle::spawn(worker_cfg).await?;
    load(ctx, plan, stage, &handle).await?;
    // The previous stage's thread (if any) ends once its last handle is dropped; this
    // one's is watched only once the stage is loaded (a build given up for a newer plan
    // ends its thread, which is not a dead miner).
    ctx.note(Note::ComputeThread(thread)).await;
    Ok(handle)
}

/// A checkpoint of this miner's.
type Checkpoint = (Manifest, StageState);

/// Loads `stage`'s weights into `handle`: the newest state of the run.
async fn load(
    ctx: &Arc<Ctx>,
    plan: &EpochPlan,
    stage: u32,
    handle: &StageHandle,
) -> anyhow::Result<()> {
    let len = handle.num_params();
    let latest = latest_merge(ctx, plan, stage, len).await?;
    let checkpoint = match &ctx.store {
        Some(store) => store.load_latest(ctx.run_id, stage)?,
        None => None,
    };
    // One's own checkpoint when it is that state (or no merge is known), else the
    // replicas' snapshot; a stale checkpoint only when no replica serves the snapshot.
    let own_is_latest = |epoch: u64| latest.as_ref().is_none_or(|(e, _)| epoch >= *e);
    let (checkpoint, stale) = match checkpoint {
        Some((manifest, state)) if own_is_latest(manifest.epoch) => (Some((manifest, state)), None),
        Some(old) => (None, Some(old)),
        None => (None, None),
    };
    if let Some((manifest, state)) = checkpoint {
        let hash = resume(ctx, handle, stage, manifest.epoch, state).await?;
        tracing::info!(stage, epoch = manifest.epoch, weights_hash = %hash, "resumed from checkpoint");
        return Ok(());
    }
    if let Some((before, expected)) = latest {
        if load_confirmed(ctx, plan, stage, handle, before, &expected).await? {
            return Ok(());
        }
    }
    load_fallback(ctx, handle, stage, stale).await
}

/// The newest state of the run is the merge that closed the epoch before this plan's: its
/// members gossip its hash when it ends (waited for if it is still running, else asked of
/// the replicas). `None` in the first epoch, or when nobody names it.
async fn latest_merge(
    ctx: &Arc<Ctx>,
    plan: &EpochPlan,
    stage: u32,
    len: usize,
) -> anyhow::Result<Option<(u64, String)>> {
    let Some(before) = plan.epoch.checked_sub(1) else {
        return Ok(None);
    };
    // Until the merge should have ended: nothing when it is long over (a miner that joins
    // mid-epoch asks the replicas at once).
    let patience =
        until(crate::schedule::merge_start(plan) + crate::schedule::merge_budget(len) + JOIN_SLACK);
    match snapshot::merged_hash(ctx, stage, before, patience).await {
        Ok(hash) => Ok(Some((before, hash))),
        // Not heard (joined after the gossip, or a lost message): ask the replicas.
        Err(snapshot::NoHash::NotHeard) => Ok(snapshot::ask_hash(ctx, plan, stage, before)
            .await
            .map(|hash| (before, hash))),
        // A newer plan's transition builds the stage from the newer state.
        Err(snapshot::NoHash::Superseded) => anyhow::bail!(Superseded),
    }
}

/// Loads the replicas' snapshot of the merge of `before` hashing to `expected`, unless the
/// validators refuted that merge; `false` when it was not loaded.
async fn load_confirmed(
    ctx: &Arc<Ctx>,
    plan: &EpochPlan,
    stage: u32,
    handle: &StageHandle,
    before: u64,
    expected: &str,
) -> anyhow::Result<bool> {
    // The members' word on the hash, and the validators' on the audit of their merge.
    let confirmed_by = match snapshot::confirm(ctx, stage, before, expected).await {
        Decision::Confirmed(by) => by,
        Decision::Unconfirmed | Decision::Wait => {
            tracing::warn!(
                stage,
                epoch = before,
                "no validator confirmed the merged hash"
            );
            "none".to_string()
        }
        Decision::Refuted(why) => {
            tracing::warn!(
                stage,
                epoch = before,
                why,
                "the validators refuted the merged hash: not loading it"
            );
            return Ok(false);
        }
    };
    let Some(fetched) = snapshot::fetch(ctx, plan, stage, expected, handle.num_params()).await
    else {
        tracing::warn!(
            stage,
            epoch = before,
            "no replica served the latest merged snapshot"
        );
        return Ok(false);
    };
    let epoch = fetched.epoch;
    handle.set_flat_params(fetched.values.clone()).await?;
    let hash = settle(
        ctx,
        handle,
        stage,
        epoch,
        Some(fetched.values),
        fetched.momentum,
    )
    .await?;
    tracing::info!(stage, epoch = ?epoch, weights_hash = %hash, %confirmed_by, "weights fetched from a replica");
    Ok(true)
}

/// What is left when no replica served the newest state: an older checkpoint of this
/// miner's, else the run seed.
async fn load_fallback(
    ctx: &Ctx,
    handle: &StageHandle,
    stage: u32,
    stale: Option<Checkpoint>,
) -> anyhow::Result<()> {
    if let Some((manifest, state)) = stale {
        let hash = resume(ctx, handle, stage, manifest.epoch, state).await?;
        tracing::warn!(stage, epoch = manifest.epoch, weights_hash = %hash, "resumed from an older checkpoint");
        return Ok(());
    }
    let hash = settle(ctx, handle, stage, None, None, None).await?;
    tracing::info!(stage, weights_hash = %hash, "initialised from the run seed");
    Ok(())
}

/// Loads a checkpoint of the merge of `epoch` into `handle`, with the outer momentum it
/// stored; returns the weights' hash.
async fn resume(
    ctx: &Ctx,
    handle: &StageHandle,
    stage: u32,
    epoch: u64,
    mut state: StageState,
) -> anyhow::Result<String> {
    let momentum = std::mem::take(&mut state.outer_momentum);
    handle.import_state(state).await?;
    settle(ctx, handle, stage, Some(epoch), None, Some(momentum)).await
}

/// Takes the weights just loaded into `handle` (`values`, when the caller has them) as the
/// stage's snapshot and current hash, as of the merge of `epoch`; returns the hash.
async fn settle(
    ctx: &Ctx,
    handle: &StageHandle,
    stage: u32,
    epoch: Option<u64>,
    values: Option<Vec<f32>>,
    momentum: Option<Vec<f32>>,
) -> anyhow::Result<String> {
    let hash = hex(&handle.weights_hash().await?);
    let values = match values {
        Some(values) => values,
        None => handle.flat_params().await?,
    };
    // The outer momentum that comes with these weights; none (zero) from the seed or a
    // checkpoint written without one.
    let momentum = (!ctx.cfg.run.outer_is_plain()).then(|| {
        momentum
            .filter(|m| m.len() == values.len())
            .unwrap_or_else(|| vec![0.0; values.len()])
    });
    snapshot::keep(ctx, stage, epoch, hash.clone(), values, momentum);
    set_weights(ctx, epoch, hash.clone()).await;
    Ok(hash)
}

/// The stage's weights are now those of the merge of `epoch`, hashing to `hash`: a new
/// generation of evidence.
pub(crate) async fn set_weights(ctx: &Ctx, epoch: Option<u64>, hash: String) {
    ctx.new_generation(WeightsOrigin {
        epoch,
        hash: hash.clone(),
    });
    ctx.note(Note::Weights { epoch, hash }).await;
}
