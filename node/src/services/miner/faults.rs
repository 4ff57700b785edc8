//! The miner's fault modes (the node's hidden `--fault` flags, for testing the other nodes'
//! defences): the frames a `noise`, `noise-grad` or `huge-frames` miner sends (only the
//! frame part of a sample payload: its token ids pass unchanged), the ids a `wrong-tokens`
//! head sends, the loss a `lie-loss` tail reports, the samples an `inflate` tail claims, the records a `preclaim`
//! tail publishes the moment a plan is out, what a `dodge` miner answers a spot check and the
//! weights a `lazy-ulp` miner shows. All off in a normal run.

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use bootstrap::EpochPlan;

use super::api::MinerFaults;
use super::context::Ctx;
use crate::wire::messages::{pack_sample, unpack_sample, LossRecord};

/// Windows a `huge-frames` miner declares in its frames.
const HUGE_WINDOWS: usize = 1024;

/// How far below the computed loss a `lie-loss` tail reports.
const LIE_FRACTION: f32 = 0.2;

/// The loss a `preclaim` tail claims for every sample: well below an honest one, so the
/// pathways it names look good to CLASP.
const PRECLAIM_LOSS: f32 = 1.0;

/// A frame like `frame` (same run, sample, stage, kind and shape) whose values are random,
/// with the mean and spread of the real ones: what a `noise` miner sends.
fn noise_frame(frame: &[u8], limits: &training::wire::DecodeLimits, seed: u64) -> Option<Vec<u8>> {
    use rand::{Rng, SeedableRng};
    let decoded = training::wire::decode(frame, limits).ok()?;
    let n = decoded.values.len().max(1) as f64;
    let mean = decoded.values.iter().map(|v| f64::from(*v)).sum::<f64>() / n;
    let var = decoded
        .values
        .iter()
        .map(|v| (f64::from(*v) - mean).powi(2))
        .sum::<f64>()
        / n;
    let std = var.sqrt();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    // Box–Muller: a standard normal from two uniforms.
    let values: Vec<f32> = (0..decoded.values.len())
        .map(|_| {
            let u: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
            let v: f64 = rng.gen_range(0.0..1.0);
            let z = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
            (mean + std * z) as f32
        })
        .collect();
    let codec = training::wire::Codec::new(decoded.header.dtype);
    training::wire::encode(&codec, &decoded.header.meta, &decoded.header.shape, &values).ok()
}

/// A frame like `frame` (same run, sample, stage and kind) but of `windows` windows of
/// zeros: what a `huge-frames` miner sends.
fn inflated_frame(frame: &[u8], windows: usize) -> Option<Vec<u8>> {
    let header =
        training::wire::decode_header(frame, &training::wire::DecodeLimits::default()).ok()?;
    let mut shape = header.shape.clone();
    *shape.first_mut()? = windows;
    let n: usize = shape.iter().product();
    let codec = training::wire::Codec::new(header.dtype);
    training::wire::encode(&codec, &header.meta, &shape, &vec![0.0; n]).ok()
}

/// `frame` as this miner sends it: random values of its shape and scale if it is a `noise`
/// miner, else unchanged.
pub(crate) fn outgoing(ctx: &Ctx, frame: Vec<u8>, sample: u64) -> Vec<u8> {
    if !ctx.cfg.faults.noise {
        return frame;
    }
    noised(ctx, frame, sample)
}

/// The gradient frame `frame` as this miner sends it upstream: random values of its shape
/// and scale if it is a `noise` or `noise-grad` miner, else unchanged.
pub(crate) fn upstream(ctx: &Ctx, frame: Vec<u8>, sample: u64) -> Vec<u8> {
    if !(ctx.cfg.faults.noise || ctx.cfg.faults.noise_grad) {
        return frame;
    }
    noised(ctx, frame, sample)
}

/// Random values of `frame`'s shape and scale, drawn from the sample and the run.
fn noised(ctx: &Ctx, frame: Vec<u8>, sample: u64) -> Vec<u8> {
    let seed = ctx.run_id ^ sample.rotate_left(7) ^ ctx.fabricated.load(Ordering::Relaxed);
    noise_frame(&frame, &ctx.frames.limits(), seed).unwrap_or(frame)
}

/// `frame` as a `huge-frames` miner sends it (inflated), else unchanged.
pub(crate) fn sent_frame<'a>(ctx: &Ctx, frame: &'a [u8]) -> Cow<'a, [u8]> {
    match ctx.cfg.faults.huge_frames {
        true => inflated_frame(frame, HUGE_WINDOWS).map_or(Cow::Borrowed(frame), Cow::Owned),
        false => Cow::Borrowed(frame),
    }
}

/// A sample payload as a `huge-frames` miner sends it (its frame inflated, its token ids
/// kept), else unchanged.
pub(crate) fn sent_sample<'a>(ctx: &Ctx, payload: &'a [u8]) -> Cow<'a, [u8]> {
    if !ctx.cfg.faults.huge_frames {
        return Cow::Borrowed(payload);
    }
    inflated_sample(payload, ctx.frames.max_token_bytes(), HUGE_WINDOWS)
        .map_or(Cow::Borrowed(payload), Cow::Owned)
}

/// A sample payload like `payload` whose frame declares `windows` windows of zeros, its
/// token block (at most `max_tokens` bytes) unchanged.
fn inflated_sample(payload: &[u8], max_tokens: usize, windows: usize) -> Option<Vec<u8>> {
    let (tokens, frame) = unpack_sample(payload, max_tokens).ok()?;
    Some(pack_sample(tokens, &inflated_frame(frame, windows)?))
}

/// The sample whose ids a `wrong-tokens` head sends (and computes on) in place of
/// `sample`'s: ids of the run's data, of the run's shape and vocabulary, that pass every
/// check of the wire; only the validators, who know which ids a sample id names, can tell.
pub(crate) fn wrong_tokens_sample(sample: u64) -> u64 {
    sample.wrapping_add(1)
}

/// The ids a head sends for `sample`, `batch` being those its sample id names: those of
/// [`wrong_tokens_sample`] for a `wrong-tokens` head (`batch` if they cannot be drawn).
pub(crate) async fn sent_batch(ctx: &Ctx, sample: u64, batch: training::Batch) -> training::Batch {
    if !ctx.cfg.faults.wrong_tokens {
        return batch;
    }
    ctx.data
        .train_sample(wrong_tokens_sample(sample))
        .await
        .unwrap_or(batch)
}

/// The loss a tail reports for `loss`: 20 % less for a `lie-loss` tail.
pub(crate) fn reported_loss(ctx: &Ctx, loss: f32) -> f32 {
    if ctx.cfg.faults.lie_loss {
        loss * (1.0 - LIE_FRACTION)
    } else {
        loss
    }
}

/// What a `dodge` miner answers every spot check: that a merge replaced the weights the
/// sample was served with, naming the merge its weights really come from (a claim the
/// validator can check, and finds true at the start of an epoch), never the evidence.
pub(crate) fn dodge(ctx: &Ctx) -> Vec<u8> {
    super::evidence::superseded(ctx)
}

/// The weights a `lazy-ulp` miner shows a spot check: its own with the first value changed
/// by one ulp (the lowest bit of its mantissa flipped), so that they never hash to the
/// epoch's starting weights while reproducing every output.
pub(crate) fn shown_weights(faults: &MinerFaults, weights: &mut [f32]) {
    if faults.lazy_ulp {
        nudge_one_ulp(weights);
    }
}

/// Flips the lowest mantissa bit of the first value: a change of one ulp.
fn nudge_one_ulp(weights: &mut [f32]) {
    if let Some(first) = weights.first_mut() {
        *first = f32::from_bits(first.to_bits() ^ 1);
    }
}

/// What an `inflate` tail claims besides `real`: a sample the same head draws near the end
/// of the epoch, which this tail has not served (and, if the epoch runs that far, another
/// tail will), with `real`'s pathway and loss.
pub(crate) fn fabricate(ctx: &Ctx, plan: &EpochPlan, real: &LossRecord) -> Option<LossRecord> {
    let head = real.pathway.first()?;
    let index = plan.miners_of(0).position(|h| h.as_str() == head)?;
    let k = ctx.fabricated.fetch_add(1, Ordering::Relaxed);
    let counter = plan
        .epoch_samples
        .checked_sub(1 + k % plan.epoch_samples.max(1))?;
    Some(LossRecord {
        sample: crate::run_spec::sample_id(plan.seed, index as u64, counter),
        pathway: real.pathway.clone(),
        loss: real.loss,
        receipts: real.receipts.clone(),
    })
}

/// What a `preclaim` tail publishes as soon as `plan` is out, if it is a tail of it: a
/// record of every sample the plan's heads draw, through the first replica of each middle
/// stage to itself, at [`PRECLAIM_LOSS`]. Every other record carries the best chain of
/// receipts it can make, every hop signed with its own key (it has no other); the rest
/// carry none.
pub(crate) fn preclaims(ctx: &Ctx, plan: &EpochPlan) -> Vec<LossRecord> {
    let tail = plan.stages.saturating_sub(1);
    if tail == 0 || plan.stage_of(&ctx.me) != Some(tail) {
        return Vec::new();
    }
    let Some(middles) = (1..tail)
        .map(|stage| plan.miners_of(stage).next().map(|p| p.to_string()))
        .collect::<Option<Vec<String>>>()
    else {
        return Vec::new();
    };
    let mut records = Vec::new();
    for (index, head) in plan.miners_of(0).enumerate() {
        for counter in 0..plan.epoch_samples {
            let sample = crate::run_spec::sample_id(plan.seed, index as u64, counter);
            let pathway: Vec<String> = std::iter::once(head.to_string())
                .chain(middles.iter().cloned())
                .chain(std::iter::once(ctx.me.to_string()))
                .collect();
            let receipts = if counter % 2 == 1 {
                self_signed_chain(ctx, plan.epoch, sample, &pathway)
            } else {
                Vec::new()
            };
            records.push(LossRecord {
                sample,
                pathway,
                loss: PRECLAIM_LOSS,
                receipts,
            });
        }
    }
    records
}

/// A well-linked chain of receipts for `pathway`, every hop signed with this miner's key.
fn self_signed_chain(
    ctx: &Ctx,
    epoch: u64,
    sample: u64,
    pathway: &[String],
) -> Vec<crate::wire::receipt::HopReceipt> {
    use crate::wire::receipt::{digest, head_input, sign, Hop};
    let mut received = head_input();
    let mut chain = Vec::with_capacity(pathway.len());
    for stage in 0..pathway.len() {
        let sent = digest(&[&sample.to_be_bytes()[..], &(stage as u64).to_be_bytes()].concat());
        let hop = Hop {
            run: ctx.run_id,
            epoch,
            sample,
            stage: stage as u32,
            next: pathway.get(stage + 1).map(String::as_str),
        };
        match sign(&ctx.cfg.key, &hop, received, sent) {
            Ok(receipt) => chain.push(receipt),
            Err(_) => return Vec::new(),
        }
        received = sent;
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_frames_miner_inflates_the_frame_beside_the_ids_and_keeps_the_ids() {
        use training::wire::{self, Codec, DecodeLimits, FrameKind, FrameMeta};
        let meta = FrameMeta {
            run: 7,
            sample: 5,
            stage: 0,
            kind: FrameKind::Activation,
        };
        let frame = wire::encode(
            &Codec::new(training::WireDtype::Bf16),
            &meta,
            &[2, 4, 8],
            &[0.5; 64],
        )
        .unwrap();
        let payload = pack_sample(b"the ids", &frame);
        let inflated = inflated_sample(&payload, 64, HUGE_WINDOWS).unwrap();
        let (tokens, sent) = unpack_sample(&inflated, 64).unwrap();
        assert_eq!(tokens, b"the ids");
        let header = wire::decode_header(sent, &DecodeLimits::default()).unwrap();
        assert_eq!(header.shape, vec![HUGE_WINDOWS, 4, 8]);
        assert_eq!(header.meta, meta);
        // A payload that does not unpack is sent as it is.
        assert_eq!(inflated_sample(&frame, 64, HUGE_WINDOWS), None);
    }

    #[test]
    fn a_lazy_ulp_nudge_changes_one_value_by_one_ulp() {
        let mut weights = vec![0.5f32, -1.25, 3.0];
        nudge_one_ulp(&mut weights);
        assert_ne!(weights[0], 0.5);
        assert_eq!(weights[0].to_bits().abs_diff(0.5f32.to_bits()), 1);
        assert_eq!(&weights[1..], &[-1.25, 3.0]);
        nudge_one_ulp(&mut []);
    }
}
