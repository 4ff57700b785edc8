//! The head's epoch: held-out evaluation of the merged weights it starts from, then its share
//! of the epoch's samples, a bounded window of them in flight at a time. The head is the
//! only stage that reads data: it sends each sample's token ids (and each held-out batch's)
//! beside its activation ([`crate::wire::messages::pack_sample`]).

use std::sync::Arc;

use bootstrap::EpochPlan;
use tokio::task::JoinSet;
use training::worker::EvalOutput;
use training::StageHandle;

use super::context::Ctx;
use super::evidence::{Evidence, Gradients};
use super::hop::{now_ms, send_eval, send_forward, tokens_input};
use super::task::Note;
use super::{faults, VAL_BATCHES};
use crate::run_spec::sample_id;
use crate::wire::messages::{pack_sample, ForwardHeader, PipelineGossip};

/// Runs this head's part of `plan`'s epoch.
pub(crate) async fn run_epoch(ctx: Arc<Ctx>, plan: EpochPlan, worker: StageHandle) {
    let Some(index) = plan.miners_of(0).position(|h| *h == ctx.me) else {
        return;
    };
    let topic = crate::wire::topics::Topics::of(&ctx.cfg.run.run_name).pipeline;
    if index == 0 {
        match evaluate_patiently(&ctx, &plan, &worker).await {
            Ok(loss) => {
                let bpb = ctx.data.bits_per_byte(f64::from(loss)).unwrap_or(f64::NAN);
                tracing::info!(
                    epoch = plan.epoch,
                    val_loss = loss,
                    val_bits_per_byte = bpb,
                    "held-out loss"
                );
                ctx.metrics
                    .set_val_loss(f64::from(loss), ctx.data.bits_per_byte(f64::from(loss)));
                publish(
                    &ctx,
                    &topic,
                    &PipelineGossip::ValLoss {
                        epoch: plan.epoch,
                        loss,
                    },
                )
                .await;
            }
            Err(reason) => tracing::warn!(%reason, "held-out evaluation failed"),
        }
    }

    // The shards this epoch's samples read, fetched while the held-out loss is computed
    // and the first samples train (a node holding the whole dataset has them all).
    ctx.data.prefetch(
        (0..plan.epoch_samples)
            .map(|counter| sample_id(plan.seed, index as u64, counter))
            .collect(),
    );
    let window = ctx.cfg.head_window.max(1);
    let mut in_flight = InFlight::default();
    let (mut done, mut dropped) = (0u64, 0u64);
    let started = std::time::Instant::now();
    // The plan may give this head fewer draws than the epoch's (placement by throughput);
    // the counters stay those of the first draws, which validators accept.
    for counter in 0..plan.samples_of(&ctx.me) {
        while in_flight.0.len() >= window {
            if let Some(Ok(ok)) = in_flight.0.join_next().await {
                if ok {
                    done += 1
                } else {
                    dropped += 1
                }
            }
        }
        let id = sample_id(plan.seed, index as u64, counter);
        in_flight
            .0
            .spawn(one_sample(ctx.clone(), plan.clone(), worker.clone(), id));
    }
    while let Some(result) = in_flight.0.join_next().await {
        match result {
            Ok(true) => done += 1,
            _ => dropped += 1,
        }
    }
    tracing::info!(
        epoch = plan.epoch,
        samples = done,
        dropped,
        "head finished its samples"
    );
    publish(
        &ctx,
        &topic,
        &PipelineGossip::HeadDone {
            epoch: plan.epoch,
            samples: done,
            dropped,
        },
    )
    .await;
    // The rate this head's pathways carried, for its heartbeats. Never waited on: the
    // miner's task may be busy ending this very epoch, and a lost figure costs nothing (the
    // next epoch's replaces it).
    let secs = started.elapsed().as_secs_f64();
    if done > 0 && secs > 0.0 {
        ctx.try_note(Note::PathwayRate(done as f64 / secs));
    }
}

/// The head's samples in flight. When the epoch's loop is dropped (a newer plan stops it),
/// they are let go, not aborted: each finishes its round trip (or hits its deadline) on its
/// own, so that neither the stages downstream nor this head's compute thread are left
/// holding a sample nobody will finish.
#[derive(Default)]
struct InFlight(JoinSet<bool>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.detach_all();
    }
}

/// One sample, head to tail and back; `false` when it was dropped.
async fn one_sample(ctx: Arc<Ctx>, plan: EpochPlan, worker: StageHandle, id: u64) -> bool {
    let batch = match ctx.data.train_sample(id).await {
        Ok(batch) => faults::sent_batch(&ctx, id, batch).await,
        Err(error) => {
            tracing::warn!(%error, "sample not drawn");
            return false;
        }
    };
    ctx.metrics.samples_forward.inc();
    let frame = match worker.forward(id, tokens_input(&batch)).await {
        Ok(frame) => faults::outgoing(&ctx, frame, id),
        Err(error) => {
            tracing::warn!(%error, "head forward failed");
            return false;
        }
    };
    let payload = pack_sample(&ctx.frames.encode_tokens(&batch), &frame);
    ctx.keep_evidence(Evidence {
        epoch: plan.epoch,
        sample: id,
        stage: 0,
        input: Vec::new(),
        output: payload.clone(),
        loss: None,
        generation: 0,
        gradients: Gradients::None,
    });
    let header = ForwardHeader {
        epoch: plan.epoch,
        sample: id,
        pathway: vec![ctx.me.as_str().to_owned()],
        // The whole pathway, there and back, within one hop timeout.
        deadline_ms: now_ms()
            .saturating_add(u64::try_from(super::HOP_TIMEOUT.as_millis()).unwrap_or(u64::MAX)),
        receipts: Vec::new(),
    };
    let received = crate::wire::receipt::head_input();
    match send_forward(&ctx, &plan, 1, &header, &payload, received).await {
        Ok((loss, _pathway, grad)) => {
            ctx.train_loss(loss).await;
            match worker.backward_and_step(grad, ctx.step_due(&plan)).await {
                Ok(_) => {
                    ctx.after_backward().await;
                    true
                }
                Err(error) => {
                    tracing::warn!(%error, "head backward failed");
                    false
                }
            }
        }
        Err(reason) => {
            tracing::debug!(sample = id, %reason, "sample dropped");
            let _ = worker.drop_sample(id).await;
            ctx.metrics.samples_dropped.inc();
            false
        }
    }
}

/// Evaluation attempts at an epoch's start: the next stages may take the plan in a moment
/// after this head (each refuses evaluations of a plan it does not hold yet).
const EVAL_ATTEMPTS: u32 = 5;

/// Pause between two evaluation attempts.
const EVAL_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

/// [`evaluate`], tried again a few times (bounded) while the next stages catch up.
async fn evaluate_patiently(
    ctx: &Ctx,
    plan: &EpochPlan,
    worker: &StageHandle,
) -> Result<f32, String> {
    let mut last = String::new();
    for attempt in 0..EVAL_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(EVAL_RETRY).await;
        }
        match evaluate(ctx, plan, worker).await {
            Ok(loss) => return Ok(loss),
            Err(reason) => {
                tracing::debug!(attempt, %reason, "held-out evaluation not done yet");
                last = reason;
            }
        }
    }
    Err(last)
}

/// Mean held-out loss of the model the run holds at the start of `plan`'s epoch: every stage
/// evaluates its snapshot of the merge that closed the epoch before, not its live weights
/// (see [`super::snapshot::eval_weights`]).
async fn evaluate(ctx: &Ctx, plan: &EpochPlan, worker: &StageHandle) -> Result<f32, String> {
    let weights = super::snapshot::eval_weights(ctx, plan, 0)?;
    let batches = ctx
        .data
        .val_batches(VAL_BATCHES)
        .await
        .map_err(|error| error.to_string())?;
    let mut total = 0.0f64;
    for (i, batch) in (0u64..).zip(&batches) {
        let frame = match worker
            .eval_given(weights.clone(), tokens_input(batch), None)
            .await
        {
            Ok(EvalOutput::Activation(frame)) => frame,
            Ok(EvalOutput::Loss(loss)) => {
                total += f64::from(loss);
                continue;
            }
            Err(error) => return Err(error.to_string()),
        };
        let tokens = ctx.frames.encode_tokens(batch);
        total += f64::from(send_eval(ctx, plan, 1, i, &tokens, &frame).await?);
    }
    Ok((total / VAL_BATCHES as f64) as f32)
}

/// Publishes a pipeline message on `topic`.
async fn publish(ctx: &Ctx, topic: &str, message: &PipelineGossip) {
    if let Some(bytes) = message.to_bytes() {
        if let Err(error) = ctx.client.publish(topic, bytes).await {
            tracing::debug!(%error, "pipeline message not published");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::InFlight;

    /// Samples each figure of [`what_the_token_ids_add_to_a_sample_on_the_wire`] averages.
    const MEASURED_SAMPLES: u64 = 32;

    /// Mean bytes of the token blocks (with their length field) of `batches` for `vocab`.
    fn block_bytes(batches: &[training::Batch], vocab: usize) -> f64 {
        let total: usize = batches
            .iter()
            .map(|b| 4 + training::dataset::tokens::encode(b, vocab).len())
            .sum();
        total as f64 / batches.len() as f64
    }

    /// `MEASURED_SAMPLES` batches of `batch` windows of `seq + 1` ids from `next_id`.
    fn batches_of(
        batch: usize,
        seq: usize,
        mut next_id: impl FnMut() -> u32,
    ) -> Vec<training::Batch> {
        (0..MEASURED_SAMPLES)
            .map(|_| {
                let ids: Vec<u32> = (0..batch * (seq + 1)).map(|_| next_id()).collect();
                training::Batch::from_ids(batch, seq, &ids)
            })
            .collect()
    }

    /// What a sample's token ids add on the wire beside its activation, per token, for the
    /// default run (byte-level ids of the embedded corpus) and for a vocabulary of 4 096
    /// (uniformly drawn ids, the worst case, and, when `IOTA_BPE_IDS` names a file of
    /// little-endian u16 ids, windows of those). Prints the figures:
    /// `cargo test -p iota-p2p --lib token_ids_add -- --nocapture`.
    #[tokio::test(flavor = "current_thread")]
    async fn what_the_token_ids_add_to_a_sample_on_the_wire() {
        use rand::{Rng, SeedableRng};
        let run = bootstrap::RunConfig::default();
        let (batch, seq) = (run.batch_size as usize, run.seq_len as usize);
        let tokens = (batch * seq) as f64;
        let frames =
            crate::rules::FrameRules::new(&run, crate::run_spec::run_id(&run)).expect("rules");
        let stage = crate::run_spec::stage_config(&run, 0, crate::run_spec::Compute::CPU);
        let worker_cfg = crate::run_spec::worker_config(&run, stage, frames.limits());
        let (worker, _thread) = training::StageHandle::spawn(worker_cfg)
            .await
            .expect("head stage");
        let data = training::TrainingData::embedded().expect("corpus");
        let bytes: Vec<training::Batch> = (0..MEASURED_SAMPLES)
            .map(|id| data.train_sample(id, run.seed, batch, seq).expect("sample"))
            .collect();
        let mut frame_total = 0usize;
        for (id, b) in (0u64..).zip(&bytes) {
            let frame = worker
                .forward(id, super::tokens_input(b))
                .await
                .expect("forward");
            let _ = worker.drop_sample(id).await;
            frame_total += frame.len();
        }
        let frame = frame_total as f64 / MEASURED_SAMPLES as f64;
        let byte_level = block_bytes(&bytes, training::VOCAB);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let uniform = block_bytes(&batches_of(batch, seq, || rng.gen_range(0..4096)), 4096);
        eprintln!(
            "default run ({batch} x {seq} tokens, {} boundary of {} channels): activation frame \
             {frame:.0} B/sample = {:.2} B/token",
            format!("{:?}", run.wire_format).to_lowercase(),
            run.bottleneck,
            frame / tokens
        );
        let report = |what: &str, block: f64| {
            eprintln!(
                "{what}: token block {block:.0} B/sample = {:.3} B/token = {:.2} % of the frame",
                block / tokens,
                100.0 * block / frame
            );
        };
        report("byte-level ids (embedded corpus)", byte_level);
        report("ids below 4096, uniform (worst case)", uniform);
        if let Some(path) = std::env::var_os("IOTA_BPE_IDS") {
            let raw = std::fs::read(&path).expect("IOTA_BPE_IDS names a readable file");
            let ids: Vec<u32> = raw
                .chunks_exact(2)
                .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
                .collect();
            let window = seq + 1;
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
            let (mut start, mut left) = (0, 0);
            let bpe = batches_of(batch, seq, || {
                if left == 0 {
                    start = rng.gen_range(0..ids.len() - window);
                    left = window;
                }
                left -= 1;
                ids[start + window - 1 - left]
            });
            report("BPE ids below 4096 (IOTA_BPE_IDS)", block_bytes(&bpe, 4096));
        }
        // The ids cost a few per cent of the activation they travel with.
        assert!(byte_level < frame / 20.0, "{byte_level} {frame}");
        assert!(uniform < frame / 10.0, "{uniform} {frame}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn samples_in_flight_finish_when_the_epoch_loop_is_dropped() {
        let finished = Arc::new(AtomicBool::new(false));
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let mut in_flight = InFlight::default();
        let done = finished.clone();
        in_flight.0.spawn(async move {
            let _ = wait.await;
            done.store(true, Ordering::SeqCst);
            true
        });
        // The epoch's loop goes away (a newer plan) while the sample is on its way.
        drop(in_flight);
        let _ = go.send(());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !finished.load(Ordering::SeqCst) {
            assert!(
                std::time::Instant::now() < deadline,
                "the sample in flight was aborted with the loop"
            );
            tokio::task::yield_now().await;
        }
    }
}
