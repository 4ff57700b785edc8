//! One hop of the pipeline: choosing the next replica, sending a sample on (with retries), and
//! serving the samples and evaluations that previous stages send here.
//!
//! Only heads read data: a sample's token ids travel beside its activation, hop by hop, in a
//! sample payload ([`messages::pack_sample`]). A middle stage forwards the ids it received
//! unchanged beside its own activation; the tail takes its targets from them, and a
//! subspace model's stages their inputs. Evaluations carry the held-out batch's ids alike.
//! Gradients travel back as plain frames.
//!
//! Every hop signs a receipt of what it received and what it sent (whole sample payloads,
//! ids included), naming the peer it sent to ([`crate::wire::receipt`]): the sender signs
//! one per replica it tries, the tail signs its own for the gradient it returns and
//! publishes the whole chain with its loss record. The router checked the chain a forward
//! carries, and its ids, before this miner sees it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bootstrap::{EpochPlan, PeerIdStr};
use rand::{Rng, SeedableRng};
use training::wire::FrameKind;
use training::worker::{EvalOutput, StageInput};
use training::StageHandle;

use super::context::Ctx;
use super::evidence::{Evidence, Gradients};
use super::faults;
use super::state::Routing;
use super::task::Note;
use super::HOP_TIMEOUT;
use crate::rules::Expect;
use crate::wire::messages::{
    self, EvalHeader, EvalReply, ForwardHeader, ForwardReply, LossRecord, Service,
};
use crate::wire::receipt::{self, Digest, Hop};

/// Replicas tried for one hop before the sample is dropped.
pub(crate) const ATTEMPTS: usize = 3;

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

/// A request body's tokens.
pub(crate) fn tokens_input(batch: &training::Batch) -> StageInput {
    StageInput::Tokens {
        batch: batch.batch,
        seq: batch.seq,
        tokens: batch.inputs.clone(),
    }
}

/// Encodes a forward request carrying the sample payload `payload`.
fn forward_body(header: &ForwardHeader, payload: &[u8]) -> Vec<u8> {
    messages::encode(Service::Forward, header, payload).unwrap_or_default()
}

/// Encodes a forward reply.
fn forward_reply(reply: &ForwardReply, grad: &[u8]) -> Vec<u8> {
    messages::encode(Service::Forward, reply, grad).unwrap_or_default()
}

/// A forward refused or failed for `reason`.
fn forward_failed(reason: String) -> Vec<u8> {
    forward_reply(&ForwardReply::Failed { reason }, &[])
}

/// Encodes an evaluation request: the held-out batch's token block `tokens` beside `frame`.
fn eval_body(header: &EvalHeader, tokens: &[u8], frame: &[u8]) -> Vec<u8> {
    messages::encode(Service::Eval, header, &messages::pack_sample(tokens, frame))
        .unwrap_or_default()
}

/// Encodes an evaluation reply.
fn eval_reply(reply: &EvalReply) -> Vec<u8> {
    messages::encode(Service::Eval, reply, &[]).unwrap_or_default()
}

/// Picks a live replica of `stage` outside `tried`, weighted by measured throughput at `now`;
/// the draw is seeded by (plan seed, sample, stage, attempt) so it can be checked.
pub(crate) fn choose(
    routing: &Routing,
    plan: &EpochPlan,
    stage: u32,
    sample: u64,
    attempt: usize,
    tried: &BTreeSet<PeerIdStr>,
    now: Instant,
) -> Option<PeerIdStr> {
    let candidates: Vec<&PeerIdStr> = plan
        .miners_of(stage)
        .filter(|p| !tried.contains(*p) && routing.live.contains(*p))
        .collect();
    if candidates.is_empty() {
        return None;
    }
    let weights: Vec<f64> = {
        let table = &routing.throughput;
        // Unmeasured peers (and failed ones due for another try) get the best measured
        // weight, so they are tried early.
        let best = table
            .values()
            .filter_map(|t| t.weight(now))
            .fold(1.0, f64::max);
        candidates
            .iter()
            .map(|p| table.get(*p).and_then(|t| t.weight(now)).unwrap_or(best))
            .collect()
    };
    let total: f64 = weights.iter().sum();
    let seed = plan.seed ^ sample.rotate_left(17) ^ (u64::from(stage) << 48) ^ attempt as u64;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut x = rng.gen_range(0.0..total.max(f64::MIN_POSITIVE));
    for (peer, w) in candidates.iter().zip(&weights) {
        if x < *w {
            return Some((*peer).clone());
        }
        x -= w;
    }
    candidates.last().map(|p| (*p).clone())
}

/// [`choose`] on the routing in force now.
fn choose_now(
    ctx: &Ctx,
    plan: &EpochPlan,
    stage: u32,
    sample: u64,
    attempt: usize,
    tried: &BTreeSet<PeerIdStr>,
) -> Option<PeerIdStr> {
    let routing = ctx.views.routing.borrow();
    choose(
        &routing,
        plan,
        stage,
        sample,
        attempt,
        tried,
        Instant::now(),
    )
}

/// What a replica answered to a forward: the loss, pathway and gradient frame.
type Done = (f32, Vec<String>, Vec<u8>);

/// Why one replica's answer was not taken, and whether that counts against its throughput.
struct HopFailure {
    reason: String,
    penalise: bool,
}

impl HopFailure {
    fn penalised(reason: String) -> HopFailure {
        HopFailure {
            reason,
            penalise: true,
        }
    }

    fn excused(reason: String) -> HopFailure {
        HopFailure {
            reason,
            penalise: false,
        }
    }
}

/// The body of a forward to `next`: `header` with this hop's receipt (of the sample payload
/// hashing to `received` that came in, and `payload` going out to `next`) added, and
/// `payload`.
fn receipted_body(
    ctx: &Ctx,
    header: &ForwardHeader,
    next: &str,
    received: Digest,
    payload: &[u8],
) -> Result<Vec<u8>, String> {
    let hop = Hop {
        run: ctx.run_id,
        epoch: header.epoch,
        sample: header.sample,
        stage: u32::try_from(header.pathway.len().saturating_sub(1)).unwrap_or(u32::MAX),
        next: Some(next),
    };
    let signed = receipt::sign(&ctx.cfg.key, &hop, received, receipt::digest(payload))
        .map_err(|error| error.to_string())?;
    let mut header = header.clone();
    header.receipts.push(signed);
    Ok(forward_body(&header, payload))
}

/// Sends a sample's payload (its token ids and this hop's activation,
/// [`messages::pack_sample`]) to a replica of `stage`, retrying on others, with this hop's
/// receipt for each (`received`: the hash of the payload this hop received). Returns the
/// reply (loss and pathway) and the gradient frame, or the last failure.
pub(crate) async fn send_forward(
    ctx: &Ctx,
    plan: &EpochPlan,
    stage: u32,
    header: &ForwardHeader,
    payload: &[u8],
    received: Digest,
) -> Result<Done, String> {
    let payload = faults::sent_sample(ctx, payload);
    let mut tried = BTreeSet::new();
    let mut last = String::from("no live replica of the next stage");
    for attempt in 0..ATTEMPTS {
        let Some(left) = time_left(header.deadline_ms, now_ms(), HOP_TIMEOUT) else {
            last = String::from("the sample's deadline passed");
            break;
        };
        let Some(peer) = choose_now(ctx, plan, stage, header.sample, attempt, &tried) else {
            break;
        };
        tried.insert(peer.clone());
        let Some(peer_id) = crate::wire::peer::to_libp2p(&peer) else {
            continue;
        };
        let body = receipted_body(ctx, header, peer.as_str(), received, &payload)?;
        let started = Instant::now();
        match forward_once(ctx, peer_id, &body, header, stage, left).await {
            Ok(done) => {
                let took = started.elapsed();
                ctx.note(Note::HopAnswered { peer, took }).await;
                return Ok(done);
            }
            Err(failure) => {
                if failure.penalise {
                    ctx.note(Note::HopFailed { peer: peer.clone() }).await;
                }
                last = format!("{peer}: {}", failure.reason);
            }
        }
    }
    Err(last)
}

/// One try of a hop on `peer`, within `left`.
async fn forward_once(
    ctx: &Ctx,
    peer: p2p::PeerId,
    body: &[u8],
    header: &ForwardHeader,
    stage: u32,
    left: Duration,
) -> Result<Done, HopFailure> {
    ctx.metrics.wire_sent("activation", body.len());
    let reply = match tokio::time::timeout(left, ctx.client.request(peer, body.to_vec())).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(error)) => return Err(HopFailure::penalised(error.to_string())),
        Err(_) => return Err(HopFailure::penalised("timed out".into())),
    };
    ctx.metrics.wire_received("gradient", reply.len());
    if reply.first() == Some(&crate::wire::rpc::ERROR) {
        // Refused by the peer's router (not in its plan yet, busy): another replica.
        return Err(HopFailure::excused(format!(
            "refused (code {:?})",
            reply.get(1)
        )));
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
            if let Err(refusal) = ctx.frames.check(grad, expect) {
                ctx.metrics.response_rejected(refusal.label());
                return Err(HopFailure::penalised(format!(
                    "gradient refused ({})",
                    refusal.label()
                )));
            }
            if !loss.is_finite() || pathway.len() < stage as usize + 1 {
                ctx.metrics.response_rejected("malformed_result");
                return Err(HopFailure::penalised("malformed result".into()));
            }
            Ok((loss, pathway, grad.to_vec()))
        }
        Ok((ForwardReply::Failed { reason }, _)) => Err(HopFailure::excused(reason)),
        Err(error) => Err(HopFailure::penalised(error.to_string())),
    }
}

/// A forward this miner takes on: its header, the sample payload that came (and its parts:
/// the token block, the ids it decodes to, the frame), the plan, stage and compute thread
/// that serve it, and the deadline it passes on.
struct Admitted {
    header: ForwardHeader,
    /// The sample payload as received (what this hop's receipt and evidence hash).
    payload: Vec<u8>,
    /// Its token block, forwarded unchanged.
    tokens: Vec<u8>,
    /// The ids the block decodes to.
    batch: training::Batch,
    /// Its activation frame.
    frame: Vec<u8>,
    plan: EpochPlan,
    stage: u32,
    worker: StageHandle,
    /// Downstream, the deadline is never later than this stage would wait itself.
    deadline_ms: u64,
}

/// Serves a forward request from the previous stage.
pub(crate) async fn serve_forward(ctx: &Arc<Ctx>, body: &[u8]) -> Vec<u8> {
    let Ok(permit) = ctx.permits.clone().try_acquire_owned() else {
        return forward_failed("busy".into());
    };
    // A sample refused is answered at once; one that was computed (or failed on the
    // compute thread) counts as a gradient sent.
    let reply = match admit(ctx, body).await {
        Ok(admitted) => serve_admitted(ctx, admitted).await,
        Err(reason) => return forward_failed(reason),
    };
    drop(permit);
    ctx.metrics.wire_sent("gradient", reply.len());
    reply
}

/// Decodes a forward request and checks that this miner serves it now: within the sample's
/// deadline, in the epoch it is in (a sample of the epoch being entered waits for it), at
/// the stage the sample is due at, with the run's token ids and frame.
async fn admit(ctx: &Ctx, body: &[u8]) -> Result<Admitted, String> {
    let (header, payload) = messages::decode::<ForwardHeader>(Service::Forward, body)
        .map_err(|error| error.to_string())?;
    ctx.metrics.wire_received("activation", body.len());
    // The head has given up on a sample past its deadline: no work for it.
    let Some(left) = time_left(header.deadline_ms, now_ms(), HOP_TIMEOUT) else {
        ctx.metrics.samples_dropped.inc();
        return Err("the sample's deadline passed".into());
    };
    // A sample of the epoch this miner is entering waits until its plan and stage are in
    // place, and is then served and routed by that plan, not the one before.
    ctx.gate
        .admit(header.epoch, left)
        .await
        .map_err(|refused| refused.to_string())?;
    let in_force = ctx.in_force();
    let (Some(plan), Some(stage), Some(worker)) = (in_force.plan, in_force.stage, in_force.worker)
    else {
        return Err("no stage yet".into());
    };
    if plan.epoch != header.epoch {
        return Err(format!("epoch {} is over here", header.epoch));
    }
    if stage == 0 || header.pathway.len() != stage as usize || plan.stage_of(&ctx.me) != Some(stage)
    {
        return Err(format!("this miner holds stage {stage}"));
    }
    // The router checked the payload; decoding it again costs little and keeps this
    // function whole on its own.
    let expect = Expect {
        sample: Some(header.sample),
        boundary: stage - 1,
        kind: FrameKind::Activation,
    };
    let sample = ctx
        .frames
        .sample(payload, expect)
        .map_err(|refusal| format!("sample payload refused ({})", refusal.label()))?;
    let now = now_ms();
    let Some(left) = time_left(header.deadline_ms, now, HOP_TIMEOUT) else {
        ctx.metrics.samples_dropped.inc();
        return Err("the sample's deadline passed".into());
    };
    // `left` is already capped at this stage's own timeout.
    let deadline_ms = now.saturating_add(u64::try_from(left.as_millis()).unwrap_or(u64::MAX));
    Ok(Admitted {
        frame: sample.frame.to_vec(),
        tokens: sample.tokens.to_vec(),
        batch: sample.batch,
        payload: payload.to_vec(),
        header,
        plan,
        stage,
        worker,
        deadline_ms,
    })
}

/// Computes an admitted forward: the tail's loss and gradient, or the activation sent on
/// and the gradient it brings back.
async fn serve_admitted(ctx: &Ctx, admitted: Admitted) -> Vec<u8> {
    ctx.metrics.samples_forward.inc();
    let mut pathway = admitted.header.pathway.clone();
    pathway.push(ctx.me.as_str().to_owned());
    // The tail's targets, and a subspace model's stages' inputs (they rebuild the stream
    // from them), are the ids that came with the sample.
    let is_tail = admitted.stage + 1 == admitted.plan.stages;
    let tokens = admitted
        .worker
        .layout()
        .needs_tokens()
        .then(|| admitted.batch.inputs.clone());
    let input = StageInput::frame(admitted.frame.clone(), tokens);
    if is_tail {
        let targets = admitted.batch.targets.clone();
        serve_tail(ctx, &admitted, input, targets, pathway).await
    } else {
        serve_middle(ctx, &admitted, input, pathway).await
    }
}

/// The tail: loss, gradient, and a loss record for the validators.
async fn serve_tail(
    ctx: &Ctx,
    admitted: &Admitted,
    input: StageInput,
    targets: Vec<i64>,
    pathway: Vec<String>,
) -> Vec<u8> {
    let Admitted {
        header,
        plan,
        worker,
        ..
    } = admitted;
    let step_lr = ctx.step_due(plan);
    let out = match worker.forward_loss_and_step(input, targets, step_lr).await {
        Ok(out) => out,
        Err(error) => return forward_failed(error.to_string()),
    };
    ctx.after_backward().await;
    ctx.train_loss(out.loss).await;
    let loss = faults::reported_loss(ctx, out.loss);
    let grad = faults::upstream(ctx, out.grad_frame.unwrap_or_default(), header.sample);
    let sent = faults::sent_frame(ctx, &grad).into_owned();
    // The tail's receipt: the sample payload it received, the gradient it returns (to no
    // next hop); the chain that came with the sample was checked on the way in.
    let hop = Hop {
        run: ctx.run_id,
        epoch: header.epoch,
        sample: header.sample,
        stage: admitted.stage,
        next: None,
    };
    let own = match receipt::sign(
        &ctx.cfg.key,
        &hop,
        receipt::digest(&admitted.payload),
        receipt::digest(&sent),
    ) {
        Ok(own) => own,
        Err(error) => return forward_failed(error.to_string()),
    };
    let mut receipts = header.receipts.clone();
    receipts.push(own);
    let record = LossRecord {
        sample: header.sample,
        pathway: pathway.clone(),
        loss,
        receipts,
    };
    let fabricated = ctx
        .cfg
        .faults
        .inflate
        .then(|| faults::fabricate(ctx, plan, &record))
        .flatten();
    let records = std::iter::once(record).chain(fabricated).collect();
    ctx.note(Note::Losses {
        epoch: header.epoch,
        records,
    })
    .await;
    ctx.keep_evidence(Evidence {
        epoch: header.epoch,
        sample: header.sample,
        stage: admitted.stage,
        input: admitted.payload.clone(),
        output: grad,
        loss: Some(loss),
        generation: 0,
        gradients: Gradients::None,
    });
    forward_reply(&ForwardReply::Done { loss, pathway }, &sent)
}

/// A middle stage: its activation on to the next stage, beside the token ids it received,
/// and the gradient it brings back through this stage's backward pass.
async fn serve_middle(
    ctx: &Ctx,
    admitted: &Admitted,
    input: StageInput,
    pathway: Vec<String>,
) -> Vec<u8> {
    let Admitted {
        header,
        plan,
        stage,
        worker,
        ..
    } = admitted;
    let activation = match worker.forward(header.sample, input).await {
        Ok(activation) => faults::outgoing(ctx, activation, header.sample),
        Err(error) => return forward_failed(error.to_string()),
    };
    let payload = messages::pack_sample(&admitted.tokens, &activation);
    ctx.keep_evidence(Evidence {
        epoch: header.epoch,
        sample: header.sample,
        stage: *stage,
        input: admitted.payload.clone(),
        output: payload.clone(),
        loss: None,
        generation: 0,
        gradients: Gradients::Pending,
    });
    let next = ForwardHeader {
        epoch: header.epoch,
        sample: header.sample,
        pathway,
        deadline_ms: admitted.deadline_ms,
        receipts: header.receipts.clone(),
    };
    let received = receipt::digest(&admitted.payload);
    let sent = send_forward(ctx, plan, stage + 1, &next, &payload, received).await;
    let (loss, pathway, grad) = match sent {
        Ok(done) => done,
        Err(reason) => {
            let _ = worker.drop_sample(header.sample).await;
            ctx.metrics.samples_dropped.inc();
            return forward_failed(reason);
        }
    };
    let received = grad.clone();
    match worker.backward_and_step(grad, ctx.step_due(plan)).await {
        Ok(grad_in) => {
            ctx.after_backward().await;
            let grad_in = faults::upstream(ctx, grad_in.unwrap_or_default(), header.sample);
            ctx.keep_gradients(header.epoch, header.sample, received, grad_in.clone());
            forward_reply(&ForwardReply::Done { loss, pathway }, &grad_in)
        }
        Err(error) => forward_failed(error.to_string()),
    }
}

/// Sends a held-out batch's activation on for evaluation, beside the batch's token block
/// `tokens`, and returns the tail's loss.
pub(crate) async fn send_eval(
    ctx: &Ctx,
    plan: &EpochPlan,
    stage: u32,
    batch: u64,
    tokens: &[u8],
    frame: &[u8],
) -> Result<f32, String> {
    let body = eval_body(&EvalHeader { batch }, tokens, frame);
    let mut tried = BTreeSet::new();
    let mut last = String::from("no live replica");
    for attempt in 0..ATTEMPTS {
        let Some(peer) = choose_now(ctx, plan, stage, batch, attempt, &tried) else {
            break;
        };
        tried.insert(peer.clone());
        let Some(peer_id) = crate::wire::peer::to_libp2p(&peer) else {
            continue;
        };
        match tokio::time::timeout(HOP_TIMEOUT, ctx.client.request(peer_id, body.clone())).await {
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
pub(crate) async fn serve_eval(ctx: &Arc<Ctx>, body: &[u8]) -> Vec<u8> {
    let failed = |reason: String| eval_reply(&EvalReply::Failed(reason));
    // Evaluations share the forward passes' bound on work in progress.
    let Ok(_permit) = ctx.permits.clone().try_acquire_owned() else {
        return failed("busy".into());
    };
    let (header, payload) = match messages::decode::<EvalHeader>(Service::Eval, body) {
        Ok(decoded) => decoded,
        Err(error) => return failed(error.to_string()),
    };
    let in_force = ctx.in_force();
    let (Some(plan), Some(stage), Some(worker)) = (in_force.plan, in_force.stage, in_force.worker)
    else {
        return failed("no stage yet".into());
    };
    if stage == 0 {
        return failed("the head evaluates its own batches".into());
    }
    let weights = match super::snapshot::eval_weights(ctx, &plan, stage) {
        Ok(weights) => weights,
        Err(reason) => return failed(reason),
    };
    // The held-out batch's ids came with it (the router checked them, and its frame).
    let expect = Expect {
        sample: None,
        boundary: stage - 1,
        kind: FrameKind::Activation,
    };
    let sample = match ctx.frames.sample(payload, expect) {
        Ok(sample) => sample,
        Err(refusal) => return failed(format!("sample payload refused ({})", refusal.label())),
    };
    let batch = &sample.batch;
    let tokens = worker.layout().needs_tokens().then(|| batch.inputs.clone());
    let input = StageInput::frame(sample.frame.to_vec(), tokens);
    if stage + 1 == plan.stages {
        let targets = batch.targets.clone();
        match worker.eval_given(weights, input, Some(targets)).await {
            Ok(EvalOutput::Loss(loss)) => eval_reply(&EvalReply::Loss(loss)),
            Ok(EvalOutput::Activation(_)) => failed("tail gave no loss".into()),
            Err(error) => failed(error.to_string()),
        }
    } else {
        match worker.eval_given(weights, input, None).await {
            Ok(EvalOutput::Activation(next)) => {
                match send_eval(ctx, &plan, stage + 1, header.batch, sample.tokens, &next).await {
                    Ok(loss) => eval_reply(&EvalReply::Loss(loss)),
                    Err(reason) => failed(reason),
                }
            }
            Ok(EvalOutput::Loss(_)) => failed("not the tail".into()),
            Err(error) => failed(error.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::{Duration, Instant};

    use super::{choose, time_left};
    use crate::services::miner::state::{Routing, Throughput, RETRY_FAILED_AFTER};

    fn id(i: u8) -> bootstrap::PeerIdStr {
        crate::wire::peer::of(
            &p2p::identity::Keypair::ed25519_from_bytes([i; 32])
                .unwrap()
                .public()
                .to_peer_id(),
        )
    }

    #[test]
    fn a_replica_that_failed_is_avoided_for_a_while_then_tried_again() {
        let run = bootstrap::RunConfig::default();
        let miners = (0..6).map(id).collect();
        let plan = bootstrap::next_plan(&run, &id(100), None, None, &miners).unwrap();
        let stage: Vec<_> = plan.miners_of(1).cloned().collect();
        let (good, failed) = (stage[0].clone(), stage[1].clone());
        let start = Instant::now();
        let mut routing = Routing {
            live: std::sync::Arc::new(stage.iter().cloned().collect()),
            ..Routing::default()
        };
        routing
            .throughput
            .insert(good.clone(), Throughput::measured(0.05));
        routing
            .throughput
            .insert(failed.clone(), Throughput::failed(start));
        let picks = |now: Instant| {
            (0..400u64)
                .filter(|sample| {
                    choose(&routing, &plan, 1, *sample, 0, &BTreeSet::new(), now)
                        == Some(failed.clone())
                })
                .count()
        };
        // Weighed 30 s a hop against 0.05 s: about 1 in 600 samples.
        assert!(picks(start) <= 4, "{} of 400 while avoided", picks(start));
        // Then weighed as an unmeasured peer, like the best: about half.
        let later = picks(start + RETRY_FAILED_AFTER);
        assert!((120..=280).contains(&later), "{later} of 400 once due");
    }

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
