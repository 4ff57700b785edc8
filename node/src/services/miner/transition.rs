//! Entering an epoch: the merge of the epoch that ended (when this miner held a stage in it),
//! the stage the new plan gives this miner (built when it changed), then the epoch's work.
//!
//! Preparations (merge and stage build) run one at a time, in the order their plans came, and
//! to their end: a newer plan stops only the transition waiting on one, and a preparation
//! whose plan was superseded while it waited for its turn does nothing. A preparation reads
//! what it starts from, and puts the plan and stage in force, through the miner's task: the
//! plan is in force (and request handlers see it) before the stage build starts, and the gate
//! opens for the epoch's samples only once the stage is in force.

use std::sync::Arc;

use bootstrap::EpochPlan;
use training::StageHandle;

use super::context::{until, Ctx};
use super::state::PhaseEvent;
use super::task::Note;
use super::{checkpoint, head, stage};

/// A transition given up for a newer plan's.
#[derive(Debug, thiserror::Error)]
#[error("superseded by a newer plan")]
pub(crate) struct Superseded;

/// What a preparation ends with: the stage this miner holds in the plan, if any.
type Prepared = anyhow::Result<Option<(u32, StageHandle)>>;

/// The merge and stage of `plan`, once the preparations before it are done; nothing when a
/// newer plan came meanwhile (its preparation does the merge).
pub(crate) async fn prepare_in_turn(ctx: Arc<Ctx>, plan: EpochPlan) -> Prepared {
    let _one = ctx.preparing.lock().await;
    if ctx.views.news.borrow().newest.0 > plan.epoch {
        return Ok(None);
    }
    prepare(&ctx, &plan).await
}

/// The merge of the epoch that ended (when this miner held a stage in it), then this
/// plan's stage, built when it changed; `None` when the plan gives this miner no stage.
async fn prepare(ctx: &Arc<Ctx>, plan: &EpochPlan) -> Prepared {
    let before = ctx.ask(Note::Before).await?;
    if let (Some(prev), Some(worker), Some(stage)) = (&before.plan, &before.worker, before.stage) {
        // A miner that joined by loading the merge closing `prev` (or a later one) already
        // holds that merge's result: the merge ran without it.
        let holds_merge = before.merged_epoch.is_some_and(|m| m >= prev.epoch);
        if prev.epoch < plan.epoch && prev.stage_of(&ctx.me) == Some(stage) && !holds_merge {
            let start = crate::schedule::merge_start(plan);
            let param_count = usize::try_from(before.param_count).unwrap_or(usize::MAX);
            let budget = until(start) + crate::schedule::merge_budget(param_count);
            ctx.phase(PhaseEvent::Merging {
                epoch: plan.epoch,
                budget,
            })
            .await;
            checkpoint::merge_and_checkpoint(ctx, prev, stage, worker, start).await?;
        }
    }
    let new_stage = plan.stage_of(&ctx.me);
    ctx.ask(|done| Note::PlanInForce(Box::new(plan.clone()), done))
        .await?;
    let Some(stage) = new_stage else {
        // Samples of this epoch are refused at once (this miner holds no stage in it).
        ctx.gate.enter(plan.epoch);
        tracing::info!(epoch = plan.epoch, "no stage for this miner in this epoch");
        ctx.phase(PhaseEvent::Draining { epoch: plan.epoch }).await;
        return Ok(None);
    };
    let worker = match (before.stage, before.worker) {
        (Some(old), Some(worker)) if old == stage => worker,
        _ => stage::build(ctx, plan, stage).await?,
    };
    ctx.ask(|done| Note::StageInForce {
        stage,
        worker: worker.clone(),
        done,
    })
    .await?;
    ctx.gate.enter(plan.epoch);
    Ok(Some((stage, worker)))
}

/// The transition into `plan` once its preparation (`prepared`) is done: the new epoch's
/// work. Logs how it ended.
pub(crate) async fn enter_epoch(
    ctx: Arc<Ctx>,
    plan: EpochPlan,
    prepared: tokio::task::JoinHandle<Prepared>,
) {
    match train(&ctx, plan, prepared).await {
        Ok(()) => {}
        Err(error) if error.is::<Superseded>() => {
            tracing::debug!("epoch transition superseded by a newer plan")
        }
        Err(error) => {
            tracing::warn!(error = %format!("{error:#}"), "epoch transition failed")
        }
    }
}

/// The new stage's training of `plan`'s epoch (a head's samples, or serving the others').
async fn train(
    ctx: &Arc<Ctx>,
    plan: EpochPlan,
    prepared: tokio::task::JoinHandle<Prepared>,
) -> anyhow::Result<()> {
    let Some((stage, worker)) = prepared.await?? else {
        return Ok(());
    };
    // Follow the stage's merge gossip from now on: a member whose commitment is not heard
    // is left out of the merge.
    let topic = crate::wire::topics::butterfly(&ctx.cfg.run.run_name, stage);
    if let Err(error) = ctx.client.subscribe(&topic).await {
        tracing::warn!(%error, "cannot follow the stage's merges");
    }
    let estimate = crate::run_spec::memory_estimate(
        &ctx.cfg.run,
        worker.config(),
        super::stage_in_flight(stage, ctx.cfg.head_window),
    );
    tracing::info!(
        epoch = plan.epoch,
        stage,
        peak_memory_mb = mb(training::memory::peak_rss_bytes()),
        estimated_memory_mb = mb(estimate.map(|e| e.total())),
        estimated_host_memory_mb = mb(Some(crate::run_spec::host_memory_estimate(
            &ctx.cfg.run,
            worker.num_params()
        ))),
        checkpoint_activations = worker.config().checkpoint_activations,
        "training epoch"
    );
    ctx.phase(PhaseEvent::Training { epoch: plan.epoch }).await;
    if ctx.cfg.faults.compute_dies {
        worker.crash().await;
    }
    if stage == 0 {
        let epoch = plan.epoch;
        head::run_epoch(ctx.clone(), plan, worker).await;
        ctx.phase(PhaseEvent::Draining { epoch }).await;
    }
    Ok(())
}

/// Bytes in megabytes for a log line (0 where unknown).
fn mb(bytes: Option<u64>) -> f64 {
    (bytes.unwrap_or(0) as f64 / 1e6).round()
}
