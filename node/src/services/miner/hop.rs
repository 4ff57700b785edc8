//! One hop of the pipeline: choosing the next replica, sending a sample on (with retries), and
//! serving the samples and evaluations that previous stages send here.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bootstrap::EpochPlan;
use rand::{Rng, SeedableRng};
use training::worker::{EvalOutput, StageInput};

use super::evidence::Evidence;
use super::{eval_body, eval_reply, forward_body, forward_reply, lock, Shared, HOP_TIMEOUT};
use crate::rules::Expect;
use crate::wire::messages::{
    self, EvalHeader, EvalReply, ForwardHeader, ForwardReply, LossRecord, Service,
};
use training::wire::FrameKind;

/// Optimizer steps over which the learning rate ramps up to the plan's.
const WARMUP_STEPS: u64 = 30;

/// Windows a `huge-frames` miner declares in its frames.
const HUGE_WINDOWS: usize = 1024;

/// Replicas tried for one hop before the sample is dropped.
const ATTEMPTS: usize = 3;

/// How far below the computed loss a `lie-loss` tail reports.
const LIE_FRACTION: f32 = 0.2;

/// Time left until `deadline_ms` when it is `now_ms` (both ms since the Unix epoch), at
/// most `cap`; `None` once the deadline has passed. A sample's deadline is set by its head
/// and carried by every hop, so the hops' timeouts nest: no stage waits on, or computes, a
/// sample its head has given up on, and no sender can make a stage wait longer than `cap`.
pub(crate) fn time_left(deadline_ms: u64, now_ms: u64, cap: Duration) -> Option<Duration> {
    let left = deadline_ms.checked_sub(now_ms).filter(|left| *left > 0)?;
    Some(Duration::from_millis(left).min(cap))
}

/// The wall clock in ms since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    crate::schedule::unix_ms(std::time::SystemTime::now())
}

/// What an `inflate` tail claims besides `real`: a sample the same head draws near the end
/// of the epoch, which this tail has not served (and, if the epoch runs that far, another
/// tail will), with `real`'s pathway and loss.
fn fabricate(shared: &Shared, plan: &EpochPlan, real: &LossRecord) -> Option<LossRecord> {
    let head = real.pathway.first()?;
    let index = plan.miners_of(0).position(|h| h.as_str() == head)?;
    let k = shared.fabricated.fetch_add(1, Ordering::Relaxed);
    let counter = plan
        .epoch_samples
        .checked_sub(1 + k % plan.epoch_samples.max(1))?;
    Some(LossRecord {
        sample: crate::run_spec::sample_id(plan.seed, index as u64, counter),
        pathway: real.pathway.clone(),
        loss: real.loss,
    })
}

/// Measured speed of a peer: an exponentially weighted mean of its hop latency.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Throughput {
    mean_secs: f64,
}

impl Throughput {
    fn weight(&self) -> f64 {
        1.0 / self.mean_secs.max(1e-3)
    }
}

/// Records that `peer` answered a hop in `took`.
fn observe(shared: &Shared, peer: &str, took: Duration) {
    let mut table = lock(&shared.throughput);
    let secs = took.as_secs_f64();
    table
        .entry(peer.to_string())
        .and_modify(|t| t.mean_secs = 0.8 * t.mean_secs + 0.2 * secs)
        .or_insert(Throughput { mean_secs: secs });
}

/// Records that `peer` failed a hop (it counts as very slow until it answers again).
fn penalise(shared: &Shared, peer: &str) {
    let mut table = lock(&shared.throughput);
    table.insert(
        peer.to_string(),
        Throughput {
            mean_secs: HOP_TIMEOUT.as_secs_f64(),
        },
    );
}

/// Picks a live replica of `stage` outside `tried`, weighted by measured throughput; the
/// draw is seeded by (plan seed, sample, stage, attempt) so it can be checked.
fn choose(
    shared: &Shared,
    plan: &EpochPlan,
    stage: u32,
    sample: u64,
    attempt: usize,
    tried: &BTreeSet<String>,
) -> Option<String> {
    let live = lock(&shared.live).clone();
    let candidates: Vec<String> = plan
        .miners_of(stage)
        .map(|p| p.to_string())
        .filter(|p| !tried.contains(p) && live.contains(p))
        .collect();
    if candidates.is_empty() {
        return None;
    }
    let weights: Vec<f64> = {
        let table = lock(&shared.throughput);
        // Unmeasured peers get the best measured weight, so they are tried early.
        let best = table.values().map(Throughput::weight).fold(1.0, f64::max);
        candidates
            .iter()
            .map(|p| table.get(p).map_or(best, Throughput::weight))
            .collect()
    };
    let total: f64 = weights.iter().sum();
    let seed = plan.seed ^ sample.rotate_left(17) ^ (u64::from(stage) << 48) ^ attempt as u64;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut x = rng.gen_range(0.0..total.max(f64::MIN_POSITIVE));
    for (peer, w) in candidates.iter().zip(&weights) {
        if x < *w {
            return Some(peer.clone());
        }
        x -= w;
    }
    candidates.last().cloned()
}

/// Sends a sample's activation to a replica of `stage`, retrying on others. Returns the
/// reply (loss and pathway) and the gradient frame, or the last failure.
pub(crate) async fn send_forward(
    shared: &Shared,
    plan: &EpochPlan,
    stage: u32,
    header: &ForwardHeader,
    frame: &[u8],
) -> Result<(f32, Vec<String>, Vec<u8>), String> {
    let inflated = shared
        .cfg
        .faults
        .huge_frames
        .then(|| super::inflated_frame(frame, HUGE_WINDOWS))
        .flatten();
    let body = forward_body(header, inflated.as_deref().unwrap_or(frame));
    let mut tried = BTreeSet::new();
    let mut last = String::from("no live replica of the next stage");
    for attempt in 0..ATTEMPTS {
        let Some(left) = time_left(header.deadline_ms, now_ms(), HOP_TIMEOUT) else {
            last = String::from("the sample's deadline passed");
            break;
        };
        let Some(peer) = choose(shared, plan, stage, header.sample, attempt, &tried) else {
            break;
        };
        tried.insert(peer.clone());
        let Ok(peer_id) = peer.parse::<p2p::PeerId>() else {
            continue;
        };
        let started = Instant::now();
        shared.metrics.wire_sent("activation", body.len());
        let response =
            tokio::time::timeout(left, shared.client.request(peer_id, body.clone())).await;
        let reply = match response {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(error)) => {
                penalise(shared, &peer);
                last = format!("{peer}: {error}");
                continue;
            }
            Err(_) => {
                penalise(shared, &peer);
                last = format!("{peer}: timed out");
                continue;
            }
        };
        shared.metrics.wire_received("gradient", reply.len());
        if reply.first() == Some(&crate::wire::rpc::ERROR) {
            // Refused by the peer's router (not in its plan yet, busy): another replica.
            last = format!("{peer}: refused (code {:?})", reply.get(1));
            continue;
        }
        match messages::decode::<ForwardReply>(Service::Forward, &reply) {
            Ok((ForwardReply::Done { loss, pathway }, grad)) => {
                // The gradient must be for this very sample, of the boundary's exact shape:
                // checked on its header before the compute thread decodes it.
                let expect = Expect {
                    sample: Some(header.sample),
                    boundary: stage - 1,
                    kind: FrameKind::Gradient,
                };
                if let Err(refusal) = shared.frames.check(grad, expect) {
                    shared.metrics.response_rejected(refusal.label());
                    penalise(shared, &peer);
                    last = format!("{peer}: gradient refused ({})", refusal.label());
                    continue;
                }
                if !loss.is_finite() || pathway.len() < stage as usize + 1 {
                    shared.metrics.response_rejected("malformed_result");
                    penalise(shared, &peer);
                    last = format!("{peer}: malformed result");
                    continue;
                }
                observe(shared, &peer, started.elapsed());
                return Ok((loss, pathway, grad.to_vec()));
            }
            Ok((ForwardReply::Failed { reason }, _)) => {
                last = format!("{peer}: {reason}");
            }
            Err(error) => {
                penalise(shared, &peer);
                last = format!("{peer}: {error}");
            }
        }
    }
    Err(last)
}

/// The learning rate of the optimizer step due after the backward pass about to run, if one
/// is: every `inner_steps` backward passes, counted when they are asked for (a failed one
/// counts too, and its step is skipped). The compute thread takes the step right after that
/// backward pass ([`training::StageHandle::backward_and_step`]).
pub(crate) fn step_due(shared: &Shared, plan: &EpochPlan) -> Option<f64> {
    let done = shared.backward_done.fetch_add(1, Ordering::Relaxed) + 1;
    let k = u64::from(plan.inner_steps.max(1));
    if done % k != 0 || shared.cfg.faults.lazy {
        return None;
    }
    // Linear warm-up over the miner's first steps: a transformer given the full rate from
    // its first step tends to collapse onto byte frequencies.
    let step = done / k;
    Some(plan.lr * (step as f64 / WARMUP_STEPS as f64).min(1.0))
}

/// Counts a finished backward pass.
pub(crate) fn after_backward(shared: &Shared) {
    shared.metrics.samples_backward.inc();
    shared.samples_processed.fetch_add(1, Ordering::Relaxed);
    shared.epoch_processed.fetch_add(1, Ordering::Relaxed);
}

/// Serves a forward request from the previous stage.
pub(crate) async fn serve_forward(shared: &Arc<Shared>, body: &[u8]) -> Vec<u8> {
    let failed = |reason: String| forward_reply(&ForwardReply::Failed { reason }, &[]);
    let Ok(permit) = shared.permits.clone().try_acquire_owned() else {
        return failed("busy".into());
    };
    let (header, frame) = match messages::decode::<ForwardHeader>(Service::Forward, body) {
        Ok(decoded) => decoded,
        Err(error) => return failed(error.to_string()),
    };
    shared.metrics.wire_received("activation", body.len());
    // The head has given up on a sample past its deadline: no work for it.
    let Some(left) = time_left(header.deadline_ms, now_ms(), HOP_TIMEOUT) else {
        shared.metrics.samples_dropped.inc();
        return failed("the sample's deadline passed".into());
    };
    // A sample of the epoch this miner is entering waits until its plan and stage are in
    // place, and is then served and routed by that plan, not the one before.
    if let Err(refused) = shared.gate.admit(header.epoch, left).await {
        return failed(refused.to_string());
    }
    let (plan, stage, worker) = {
        let state = lock(&shared.state);
        (state.plan.clone(), state.stage, state.worker.clone())
    };
    let (Some(plan), Some(stage), Some(worker)) = (plan, stage, worker) else {
        return failed("no stage yet".into());
    };
    if plan.epoch != header.epoch {
        return failed(format!("epoch {} is over here", header.epoch));
    }
    if stage == 0
        || header.pathway.len() != stage as usize
        || plan.stage_of(&shared.peer) != Some(stage)
    {
        return failed(format!("this miner holds stage {stage}"));
    }
    let now = now_ms();
    let Some(left) = time_left(header.deadline_ms, now, HOP_TIMEOUT) else {
        shared.metrics.samples_dropped.inc();
        return failed("the sample's deadline passed".into());
    };
    // Downstream, the deadline is never later than this stage would wait itself (`left`
    // is already capped at its own timeout).
    let deadline_ms = now.saturating_add(u64::try_from(left.as_millis()).unwrap_or(u64::MAX));
    shared.metrics.samples_forward.inc();
    let mut pathway = header.pathway.clone();
    pathway.push(shared.me.clone());
    // The tail needs the sample's targets, and a subspace model's stages its tokens (they
    // rebuild the stream from them): every miner draws the batch from the sample id.
    let is_tail = stage + 1 == plan.stages;
    let needs_tokens = worker.layout().needs_tokens();
    let batch = if is_tail || needs_tokens {
        let run = &shared.cfg.run;
        match shared.corpus.train_sample(
            header.sample,
            run.seed,
            run.batch_size as usize,
            run.seq_len as usize,
        ) {
            Ok(batch) => Some(batch),
            Err(error) => return failed(error.to_string()),
        }
    } else {
        None
    };
    let tokens = batch
        .as_ref()
        .filter(|_| needs_tokens)
        .map(|b| b.inputs.clone());
    let input = StageInput::frame(frame.to_vec(), tokens);
    let reply = if let (true, Some(batch)) = (is_tail, batch) {
        // The tail: loss, gradient, and a loss record for the validators.
        let step_lr = step_due(shared, &plan);
        match worker
            .forward_loss_and_step(input, batch.targets, step_lr)
            .await
        {
            Ok(out) => {
                after_backward(shared);
                shared.metrics.train_loss.set(f64::from(out.loss));
                lock(&shared.state).train_loss = Some(out.loss);
                let faults = shared.cfg.faults;
                let loss = if faults.lie_loss {
                    out.loss * (1.0 - LIE_FRACTION)
                } else {
                    out.loss
                };
                let record = LossRecord {
                    sample: header.sample,
                    pathway: pathway.clone(),
                    loss,
                };
                let fabricated = faults.inflate.then(|| fabricate(shared, &plan, &record));
                {
                    let mut losses = lock(&shared.losses);
                    losses.push((header.epoch, record));
                    losses.extend(fabricated.flatten().map(|r| (header.epoch, r)));
                }
                let mut grad = shared.outgoing(out.grad_frame.unwrap_or_default(), header.sample);
                shared.keep_evidence(Evidence {
                    epoch: header.epoch,
                    sample: header.sample,
                    stage,
                    input: frame.to_vec(),
                    output: grad.clone(),
                    loss: Some(loss),
                    generation: 0,
                });
                if faults.huge_frames {
                    grad = super::inflated_frame(&grad, HUGE_WINDOWS).unwrap_or(grad);
                }
                forward_reply(&ForwardReply::Done { loss, pathway }, &grad)
            }
            Err(error) => failed(error.to_string()),
        }
    } else {
        match worker.forward(header.sample, input).await {
            Ok(activation) => {
                let activation = shared.outgoing(activation, header.sample);
                shared.keep_evidence(Evidence {
                    epoch: header.epoch,
                    sample: header.sample,
                    stage,
                    input: frame.to_vec(),
                    output: activation.clone(),
                    loss: None,
                    generation: 0,
                });
                let next = ForwardHeader {
                    epoch: header.epoch,
                    sample: header.sample,
                    pathway,
                    deadline_ms,
                };
                match send_forward(shared, &plan, stage + 1, &next, &activation).await {
                    Ok((loss, pathway, grad)) => match worker
                        .backward_and_step(grad, step_due(shared, &plan))
                        .await
                    {
                        Ok(grad_in) => {
                            after_backward(shared);
                            let grad_in =
                                shared.outgoing(grad_in.unwrap_or_default(), header.sample);
                            forward_reply(&ForwardReply::Done { loss, pathway }, &grad_in)
                        }
                        Err(error) => failed(error.to_string()),
                    },
                    Err(reason) => {
                        let _ = worker.drop_sample(header.sample).await;
                        shared.metrics.samples_dropped.inc();
                        failed(reason)
                    }
                }
            }
            Err(error) => failed(error.to_string()),
        }
    };
    drop(permit);
    shared.metrics.wire_sent("gradient", reply.len());
    reply
}

/// Sends a held-out batch's activation on for evaluation and returns the tail's loss.
pub(crate) async fn send_eval(
    shared: &Shared,
    plan: &EpochPlan,
    stage: u32,
    batch: u64,
    frame: &[u8],
) -> Result<f32, String> {
    let body = eval_body(&EvalHeader { batch }, frame);
    let mut tried = BTreeSet::new();
    let mut last = String::from("no live replica");
    for attempt in 0..ATTEMPTS {
        let Some(peer) = choose(shared, plan, stage, batch, attempt, &tried) else {
            break;
        };
        tried.insert(peer.clone());
        let Ok(peer_id) = peer.parse::<p2p::PeerId>() else {
            continue;
        };
        match tokio::time::timeout(HOP_TIMEOUT, shared.client.request(peer_id, body.clone())).await
        {
            Ok(Ok(reply)) if reply.first() == Some(&crate::wire::rpc::ERROR) => {
                last = format!("{peer}: refused (code {:?})", reply.get(1));
            }
            Ok(Ok(reply)) => match messages::decode::<EvalReply>(Service::Eval, &reply) {
                Ok((EvalReply::Loss(loss), _)) => return Ok(loss),
                Ok((EvalReply::Failed(reason), _)) => last = reason,
                Err(error) => last = error.to_string(),
            },
            Ok(Err(error)) => last = error.to_string(),
            Err(_) => last = "timed out".into(),
        }
    }
    Err(last)
}

/// Serves an evaluation request from the previous stage.
pub(crate) async fn serve_eval(shared: &Arc<Shared>, body: &[u8]) -> Vec<u8> {
    let failed = |reason: String| eval_reply(&EvalReply::Failed(reason));
    // Evaluations share the forward passes' bound on work in progress.
    let Ok(_permit) = shared.permits.clone().try_acquire_owned() else {
        return failed("busy".into());
    };
    let (header, frame) = match messages::decode::<EvalHeader>(Service::Eval, body) {
        Ok(decoded) => decoded,
        Err(error) => return failed(error.to_string()),
    };
    let (plan, stage, worker) = {
        let state = lock(&shared.state);
        (state.plan.clone(), state.stage, state.worker.clone())
    };
    let (Some(plan), Some(stage), Some(worker)) = (plan, stage, worker) else {
        return failed("no stage yet".into());
    };
    if stage == 0 {
        return failed("the head evaluates its own batches".into());
    }
    let weights = match super::snapshot::eval_weights(shared, &plan, stage) {
        Ok(weights) => weights,
        Err(reason) => return failed(reason),
    };
    let Some(batch) = val_batch(shared, header.batch) else {
        return failed("no such validation batch".into());
    };
    let tokens = worker.layout().needs_tokens().then(|| batch.inputs.clone());
    let input = StageInput::frame(frame.to_vec(), tokens);
    if stage + 1 == plan.stages {
        let targets = batch.targets;
        match worker.eval_given(weights, input, Some(targets)).await {
            Ok(EvalOutput::Loss(loss)) => eval_reply(&EvalReply::Loss(loss)),
            Ok(EvalOutput::Activation(_)) => failed("tail gave no loss".into()),
            Err(error) => failed(error.to_string()),
        }
    } else {
        match worker.eval_given(weights, input, None).await {
            Ok(EvalOutput::Activation(next)) => {
                match send_eval(shared, &plan, stage + 1, header.batch, &next).await {
                    Ok(loss) => eval_reply(&EvalReply::Loss(loss)),
                    Err(reason) => failed(reason),
                }
            }
            Ok(EvalOutput::Loss(_)) => failed("not the tail".into()),
            Err(error) => failed(error.to_string()),
        }
    }
}

/// Validation batch `index` of the run (the same on every miner).
pub(crate) fn val_batch(shared: &Shared, index: u64) -> Option<training::Batch> {
    shared.val.get(usize::try_from(index).ok()?).cloned()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::time_left;

    #[test]
    fn a_sample_past_its_deadline_has_no_time_left() {
        let cap = Duration::from_secs(30);
        assert_eq!(time_left(10_000, 10_000, cap), None);
        assert_eq!(time_left(9_999, 10_000, cap), None);
        assert_eq!(time_left(0, 10_000, cap), None);
        assert_eq!(
            time_left(12_500, 10_000, cap),
            Some(Duration::from_millis(2_500))
        );
    }

    #[test]
    fn no_sender_makes_a_stage_wait_longer_than_its_own_timeout() {
        let cap = Duration::from_secs(30);
        assert_eq!(time_left(u64::MAX, 10_000, cap), Some(cap));
        assert_eq!(time_left(10_000 + 31_000, 10_000, cap), Some(cap));
    }
}
