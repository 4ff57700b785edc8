//! The IO of a spot check: asking the miner for its evidence, chunk by chunk, and
//! recomputing the sample on a scratch copy of its stage. Every decision is made by the pure
//! code of [`super`] ([`super::parse_reply`], [`super::transfer`], [`super::judge`],
//! [`super::compare`]); this module only fetches and computes what they judge. Each step
//! that cannot go on ends the check with its [`Outcome`], in the order the steps run (the
//! first that fails is the one reported).
//!
//! The evidence's forward frames are sample payloads (token ids beside the activation,
//! `crate::wire::messages::pack_sample`): a stage after the head is recomputed with the ids
//! it received, never with the validator's own data, so a stage fed other ids than its
//! sample's is judged on what it was given.
//!
//! The weights an epoch starts from, against which a miner's steps are measured, are the
//! run seed's in the first epoch (kept with the scratch stage) and later the merged
//! snapshot of the stage, asked of its replicas and accepted only when it hashes to a merge
//! hash the stage gossiped for the epoch before; one per stage is kept.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bootstrap::RunConfig;
use training::stage::GivenWeights;
use training::wire::FrameKind;
use training::worker::{EvalOutput, StageInput};
use training::{Batch, StageHandle};

use crate::services::data::api::DataHandle;

use super::transfer::{fetch_timeout, parse_chunk, Assembly, Bounds};
use super::{
    compare, judge, lazy_threshold, moved, parse_reply, Evidence, Measured, Outcome, Reply,
    SpotFailure, SpotInconclusive, Target,
};
use crate::rules::{Expect, FrameRules};
use crate::wire::messages::{self, Service, SpotCheckRequest, WeightsReply, WeightsRequest};
use crate::wire::receipt;

/// How long a miner has to answer one request.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// The evidence does not parse or does not fit the run.
const MALFORMED: Outcome = Outcome::Fail(SpotFailure::EvidenceMalformed);

/// Lower-case hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The token ids and activation frames of the evidence's sample payloads (none where the
/// evidence has no forward frame: the head's input, the tail's output).
#[derive(Default)]
struct Ids<'e> {
    /// The ids the stage received.
    input: Option<Batch>,
    /// The frame the stage received.
    input_frame: Option<&'e [u8]>,
    /// The ids the stage sent on.
    output: Option<Batch>,
    /// The activation the stage sent on.
    output_frame: Option<&'e [u8]>,
}

/// A stage the validator recomputes with, built from the run seed.
struct Scratch {
    handle: StageHandle,
    /// Hash of the run seed's weights of the stage.
    seed_hash: String,
    /// The run seed's weights of the stage (the first epoch's start).
    seed: Arc<Vec<f32>>,
}

/// A stage's merged weights, by their hash.
type Start = (String, Arc<Vec<f32>>);

/// What a validator recomputes spot checks with: the network, the run's data, and one
/// scratch copy of each stage (built when first needed).
pub(crate) struct Checker {
    client: p2p::Client,
    run: RunConfig,
    compute: crate::run_spec::Compute,
    frames: FrameRules,
    /// What heads draw samples from: the ids a head sends are checked against it.
    data: DataHandle,
    stages: tokio::sync::Mutex<BTreeMap<u32, Scratch>>,
    /// The last merged weights fetched of each stage.
    merged: tokio::sync::Mutex<BTreeMap<u32, Start>>,
}

impl Checker {
    /// A checker for `run`.
    pub(crate) fn new(
        client: p2p::Client,
        run: RunConfig,
        compute: crate::run_spec::Compute,
        data: DataHandle,
    ) -> anyhow::Result<Checker> {
        let run_id = crate::run_spec::run_id(&run);
        Ok(Checker {
            client,
            frames: FrameRules::new(&run, run_id)?,
            compute,
            data,
            run,
            stages: tokio::sync::Mutex::new(BTreeMap::new()),
            merged: tokio::sync::Mutex::new(BTreeMap::new()),
        })
    }

    /// Runs `target`'s check; `starts` are the hashes of the weights the stage may start
    /// the epoch from (merge hashes gossiped for the epoch before).
    pub(crate) async fn check(
        &self,
        target: &Target,
        starts: &BTreeSet<String>,
    ) -> (Outcome, Measured) {
        let mut measured = Measured {
            served: target.served,
            gradient: target.tail,
            ..Measured::default()
        };
        let outcome = match self.recompute(target, starts, &mut measured).await {
            Ok(()) => judge(
                &measured,
                lazy_threshold(self.run.inner_steps),
                target.epoch == 0,
            ),
            Err(outcome) => outcome,
        };
        (outcome, measured)
    }

    /// Whether `measured` came too early in the miner's epoch to tell whether it steps
    /// ([`super::laziness_undecided`]).
    pub(crate) fn laziness_undecided(&self, measured: &Measured) -> bool {
        super::laziness_undecided(measured, lazy_threshold(self.run.inner_steps))
    }

    /// Fetches the evidence, checks its frames and recomputes the sample with the
    /// miner's weights, filling in `measured`.
    async fn recompute(
        &self,
        target: &Target,
        starts: &BTreeSet<String>,
        measured: &mut Measured,
    ) -> Result<(), Outcome> {
        let assembly = self.fetch(target, measured).await?;
        let evidence = assembly.finish()?;
        let ids = self.check_frames(target, &evidence)?;
        if let Some((received, sent)) = target.receipt {
            if receipt::digest(evidence.input) != received
                || receipt::digest(evidence.output) != sent
            {
                return Err(Outcome::Fail(SpotFailure::EvidenceNotReceipted));
            }
        }
        self.check_ids(target, &ids).await?;
        let mut stages = self.stages.lock().await;
        let scratch = self.scratch_for(&mut stages, evidence.stage).await?;
        if evidence.weights.len() != 4 * scratch.handle.num_params() {
            return Err(MALFORMED);
        }
        let weights = messages::f32_from_bytes(evidence.weights).ok_or(MALFORMED)?;
        let hash = hex(&training::stage::hash_f32(&weights));
        measured.unchanged_weights = hash == scratch.seed_hash || starts.contains(&hash);
        let start = match target.epoch {
            0 => Some((scratch.seed_hash.clone(), scratch.seed.clone())),
            _ => self.start_of(target, starts, weights.len()).await,
        };
        measured.moved = start
            .as_ref()
            .and_then(|(_, start)| moved(&weights, start, self.run.lr_at(target.epoch)));
        let worker = &scratch.handle;
        worker
            .set_flat_params(weights)
            .await
            .map_err(|_| MALFORMED)?;
        let recomputed = self
            .forward(worker, target, &evidence, &ids, start, measured)
            .await?;
        if let Some(recomputed) = recomputed {
            let limits = self.frames.limits();
            let theirs = ids.output_frame.unwrap_or(evidence.output);
            let theirs = training::wire::decode(theirs, &limits).map_err(|_| MALFORMED)?;
            let ours = training::wire::decode(&recomputed, &limits)
                .map_err(|_| Outcome::Inconclusive(SpotInconclusive::RecomputeFailed))?;
            let (cosine, ratio) = compare(&theirs.values, &ours.values).ok_or(MALFORMED)?;
            measured.cosine = Some(cosine);
            measured.norm_ratio = Some(ratio);
        }
        Ok(())
    }

    /// Fetches the miner's evidence of `target`'s sample, chunk by chunk, holding no more
    /// than the run's sizes for the stage allow ([`Bounds`]); a `Superseded` answer's
    /// claim goes into `measured`.
    async fn fetch(&self, target: &Target, measured: &mut Measured) -> Result<Assembly, Outcome> {
        let started = tokio::time::Instant::now();
        let reply = self.ask(target, 0).await?;
        measured.answered_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let first = match parse_reply(&reply, target)? {
            Reply::Evidence(chunk) => chunk,
            Reply::Superseded(claim) => {
                measured.claim = Some(claim);
                return Err(Outcome::Inconclusive(SpotInconclusive::Superseded));
            }
        };
        let mut assembly = Assembly::start(first, self.bounds(target.stage)?)?;
        drop(reply);
        let not_served = Outcome::Inconclusive(SpotInconclusive::ChunkNotServed);
        let deadline = started + fetch_timeout(assembly.total());
        while let Some(offset) = assembly.next_offset() {
            let reply = tokio::time::timeout_at(deadline, self.ask(target, offset))
                .await
                .map_err(|_| not_served)?
                .map_err(|_| not_served)?;
            assembly.add(parse_chunk(&reply, target)?)?;
        }
        tracing::debug!(
            peer = %target.peer,
            bytes = assembly.total(),
            chunks = assembly.chunks(),
            took = ?started.elapsed(),
            "spot-check evidence fetched"
        );
        Ok(assembly)
    }

    /// The largest evidence of `stage` the run allows: exactly the stage's weights, and
    /// frames no larger than the run's largest raw frame twice over (an encoded frame is
    /// smaller than its raw values, plus its header).
    fn bounds(&self, stage: u32) -> Result<Bounds, Outcome> {
        let model = crate::run_spec::model(&self.run);
        let layout = training::StageLayout::new(
            &model,
            self.run.stages as usize,
            stage as usize,
            crate::run_spec::bottleneck(&self.run),
        )
        .map_err(|_| Outcome::Inconclusive(SpotInconclusive::NoScratchStage))?;
        let raw = self.frames.limits().max_raw_bytes as u64;
        // A forward frame comes with its sample's token block (and the block's length).
        let tokens = 4 + self.frames.max_token_bytes() as u64;
        Ok(Bounds {
            weights: layout.num_params(&model) as u64,
            frame: raw
                .saturating_mul(2)
                .saturating_add(64 << 10)
                .saturating_add(tokens),
        })
    }

    /// Asks the miner for the chunk at `offset` of its evidence of `target`'s sample (at 0
    /// it freezes the evidence): the reply's bytes.
    async fn ask(&self, target: &Target, offset: u64) -> Result<Vec<u8>, Outcome> {
        let peer: p2p::PeerId = target
            .peer
            .parse()
            .map_err(|_| Outcome::Inconclusive(SpotInconclusive::BadPeer))?;
        let body = messages::encode(
            Service::SpotCheck,
            &SpotCheckRequest {
                epoch: target.epoch,
                sample: target.sample,
                offset,
            },
            &[],
        )
        .map_err(|_| Outcome::Inconclusive(SpotInconclusive::RequestNotEncoded))?;
        match tokio::time::timeout(ANSWER_TIMEOUT, self.client.request(peer, body)).await {
            Ok(Ok(reply)) => Ok(reply),
            _ => Err(Outcome::Inconclusive(SpotInconclusive::NoAnswer)),
        }
    }

    /// Checks the evidence's frames against the run's shapes: the input (none at the
    /// head) and the frame it sent on (none to check for a tail that is also the head).
    /// Forward frames are sample payloads: their token ids must be the run's too, and are
    /// returned with their frames.
    fn check_frames<'e>(
        &self,
        target: &Target,
        evidence: &Evidence<'e>,
    ) -> Result<Ids<'e>, Outcome> {
        let stage = evidence.stage;
        let boundary_in = stage.saturating_sub(1);
        let mut ids = Ids::default();
        if stage > 0 {
            let expect = Expect {
                sample: Some(target.sample),
                boundary: boundary_in,
                kind: FrameKind::Activation,
            };
            let input = self
                .frames
                .sample(evidence.input, expect)
                .map_err(|_| MALFORMED)?;
            ids.input = Some(input.batch);
            ids.input_frame = Some(input.frame);
        } else if !evidence.input.is_empty() {
            return Err(MALFORMED);
        }
        let expect_out = if target.tail {
            Expect {
                sample: Some(target.sample),
                boundary: boundary_in,
                kind: FrameKind::Gradient,
            }
        } else {
            Expect {
                sample: Some(target.sample),
                boundary: stage,
                kind: FrameKind::Activation,
            }
        };
        if target.tail && stage > 0 {
            self.frames
                .check(evidence.output, expect_out)
                .map_err(|_| MALFORMED)?;
        } else if !target.tail {
            let output = self
                .frames
                .sample(evidence.output, expect_out)
                .map_err(|_| MALFORMED)?;
            ids.output = Some(output.batch);
            ids.output_frame = Some(output.frame);
        }
        let gradients = !evidence.received.is_empty() || !evidence.sent_back.is_empty();
        if gradients {
            // Only a middle stage sends a gradient back besides its output.
            if stage == 0 || target.tail {
                return Err(MALFORMED);
            }
            let gradient = |boundary| Expect {
                sample: Some(target.sample),
                boundary,
                kind: FrameKind::Gradient,
            };
            self.frames
                .check(evidence.received, gradient(stage))
                .map_err(|_| MALFORMED)?;
            self.frames
                .check(evidence.sent_back, gradient(boundary_in))
                .map_err(|_| MALFORMED)?;
        }
        Ok(ids)
    }

    /// The scratch copy of `stage`, built on first use.
    async fn scratch_for<'s>(
        &self,
        stages: &'s mut BTreeMap<u32, Scratch>,
        stage: u32,
    ) -> Result<&'s mut Scratch, Outcome> {
        Ok(match stages.entry(stage) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => e.insert(
                self.scratch(stage)
                    .await
                    .map_err(|_| Outcome::Inconclusive(SpotInconclusive::NoScratchStage))?,
            ),
        })
    }

    /// Checks the ids the miner sent on: at the head those its sample id names in the run's
    /// data, later those it received.
    async fn check_ids(&self, target: &Target, ids: &Ids<'_>) -> Result<(), Outcome> {
        let Some(sent) = &ids.output else {
            // A tail sends no ids on; it was recomputed with those it received.
            return Ok(());
        };
        let due = match &ids.input {
            Some(received) => received.clone(),
            None => self.sample_ids(target).await?,
        };
        if *sent != due {
            return Err(Outcome::Fail(SpotFailure::WrongTokens));
        }
        Ok(())
    }

    /// The ids a stage is recomputed with: after the head, those it received; at the
    /// head, those it sent (a head that is also the tail sends none: the sample's own).
    async fn ids_of(&self, target: &Target, ids: &Ids<'_>) -> Result<Batch, Outcome> {
        if let Some(batch) = ids.input.as_ref().or(ids.output.as_ref()) {
            return Ok(batch.clone());
        }
        self.sample_ids(target).await
    }

    /// The ids of `target`'s sample, drawn from the run's data.
    async fn sample_ids(&self, target: &Target) -> Result<Batch, Outcome> {
        self.data
            .train_sample(target.sample)
            .await
            .map_err(|_| Outcome::Inconclusive(SpotInconclusive::NoSample))
    }

    /// Recomputes the sample on `worker` (holding the miner's weights) with the ids
    /// [`Checker::ids_of`] names: the frame the miner should have sent on (`None` when a
    /// tail sends none back), and at the tail the ratio of the claimed loss to the
    /// recomputed one, and to the loss with the epoch's `start` weights when known.
    async fn forward(
        &self,
        worker: &StageHandle,
        target: &Target,
        evidence: &Evidence<'_>,
        ids: &Ids<'_>,
        start: Option<Start>,
        measured: &mut Measured,
    ) -> Result<Option<Vec<u8>>, Outcome> {
        let batch = self.ids_of(target, ids).await?;
        let input = || match ids.input_frame {
            None => StageInput::Tokens {
                batch: batch.batch,
                seq: batch.seq,
                tokens: batch.inputs.clone(),
            },
            Some(frame) => {
                // A subspace model's stages rebuild the stream from the sample's tokens.
                let tokens = worker.layout().needs_tokens().then(|| batch.inputs.clone());
                StageInput::frame(frame.to_vec(), tokens)
            }
        };
        if target.tail {
            let out = worker
                .forward_loss(input(), batch.targets.clone())
                .await
                .map_err(|_| MALFORMED)?;
            let claimed = f64::from(target.claimed_loss);
            if out.loss > 0.0 {
                measured.loss_ratio = Some(claimed / f64::from(out.loss));
            }
            if let Some((key, values)) = start {
                let given = GivenWeights { key, values };
                match worker.eval_given(given, input(), Some(batch.targets)).await {
                    Ok(EvalOutput::Loss(loss)) if loss > 0.0 => {
                        measured.start_loss_ratio = Some(claimed / f64::from(loss));
                    }
                    _ => {}
                }
            }
            Ok(out.grad_frame)
        } else if evidence.stage > 0 {
            self.forward_backward(worker, target, evidence, input(), measured)
                .await
                .map(Some)
        } else {
            match worker.eval(input(), None).await {
                Ok(EvalOutput::Activation(frame)) => Ok(Some(frame)),
                _ => Err(MALFORMED),
            }
        }
    }

    /// A middle stage's sample: the activation recomputed, and the gradient it should have
    /// sent upstream recomputed from the one it received (compared into `measured`); a
    /// middle stage that shows no gradients is noted so.
    async fn forward_backward(
        &self,
        worker: &StageHandle,
        target: &Target,
        evidence: &Evidence<'_>,
        stage_input: StageInput,
        measured: &mut Measured,
    ) -> Result<Vec<u8>, Outcome> {
        if evidence.received.is_empty() {
            measured.gradients_missing = true;
            return match worker.eval(stage_input, None).await {
                Ok(EvalOutput::Activation(frame)) => Ok(frame),
                _ => Err(MALFORMED),
            };
        }
        let activation = worker
            .forward(target.sample, stage_input)
            .await
            .map_err(|_| MALFORMED)?;
        let ours = match worker.backward(evidence.received.to_vec()).await {
            Ok(Some(frame)) => frame,
            _ => {
                // The graph kept for the backward pass is freed whatever happened.
                let _ = worker.drop_sample(target.sample).await;
                return Err(MALFORMED);
            }
        };
        let limits = self.frames.limits();
        let theirs = training::wire::decode(evidence.sent_back, &limits).map_err(|_| MALFORMED)?;
        let ours = training::wire::decode(&ours, &limits)
            .map_err(|_| Outcome::Inconclusive(SpotInconclusive::RecomputeFailed))?;
        let (cosine, ratio) = compare(&theirs.values, &ours.values).ok_or(MALFORMED)?;
        measured.grad_cosine = Some(cosine);
        measured.grad_norm_ratio = Some(ratio);
        Ok(activation)
    }

    /// The weights `target`'s stage started its epoch from (a merge hash in `starts`), of
    /// `len` values: the one kept, or asked of the stage's replicas (the target last).
    async fn start_of(
        &self,
        target: &Target,
        starts: &BTreeSet<String>,
        len: usize,
    ) -> Option<Start> {
        if let Some((hash, values)) = self.merged.lock().await.get(&target.stage) {
            if starts.contains(hash) {
                return Some((hash.clone(), values.clone()));
            }
        }
        if starts.is_empty() {
            return None;
        }
        let others = target.replicas.iter().filter(|p| **p != target.peer);
        for peer in others.chain(std::iter::once(&target.peer)) {
            match self.fetch_start(peer, target.stage, starts, len).await {
                Ok(start) => {
                    self.merged.lock().await.insert(target.stage, start.clone());
                    return Some(start);
                }
                Err(why) => {
                    tracing::debug!(%peer, stage = target.stage, why, "no merged weights")
                }
            }
        }
        None
    }

    /// The merged weights of `stage` from `peer`, chunk by chunk, checked against `starts`.
    async fn fetch_start(
        &self,
        peer: &str,
        stage: u32,
        starts: &BTreeSet<String>,
        len: usize,
    ) -> Result<Start, &'static str> {
        let peer: p2p::PeerId = peer.parse().map_err(|_| "bad peer id")?;
        let mut values: Vec<f32> = Vec::new();
        let mut named: Option<String> = None;
        while values.len() < len {
            let request = WeightsRequest {
                stage,
                offset: values.len() as u64,
                count: (len - values.len()) as u64,
            };
            let body = messages::encode(Service::Weights, &request, &[])
                .map_err(|_| "request not encoded")?;
            let reply =
                match tokio::time::timeout(ANSWER_TIMEOUT, self.client.request(peer, body)).await {
                    Ok(Ok(reply)) => reply,
                    _ => return Err("no answer"),
                };
            let (header, payload) = messages::decode::<WeightsReply>(Service::Weights, &reply)
                .map_err(|_| "malformed reply")?;
            let WeightsReply::Weights {
                stage: served,
                hash,
                total,
                offset,
                ..
            } = header
            else {
                return Err("does not hold the stage");
            };
            // The weights may be followed by the outer momentum: `total` is one or two
            // stages' worth.
            let sized = total == len as u64 || total == 2 * len as u64;
            if served != stage || !sized || offset != values.len() as u64 {
                return Err("chunk out of place");
            }
            if !starts.contains(&hash) || named.as_ref().is_some_and(|h| *h != hash) {
                return Err("holds another snapshot");
            }
            messages::append_f32_chunk(&mut values, payload, len)?;
            named = Some(hash);
        }
        let hash = named.ok_or("no chunk")?;
        if hex(&training::stage::hash_f32(&values)) != hash {
            return Err("weights do not hash to the merge hash");
        }
        Ok((hash, Arc::new(values)))
    }

    /// Builds `stage` from the run seed and notes its weights' hash.
    async fn scratch(&self, stage: u32) -> anyhow::Result<Scratch> {
        let run = &self.run;
        let stage_cfg = crate::run_spec::stage_config(run, stage, self.compute);
        let worker_cfg = crate::run_spec::worker_config(run, stage_cfg, self.frames.limits());
        // The thread ends when the handle is dropped with the checker.
        let (handle, _thread) = StageHandle::spawn(worker_cfg).await?;
        let seed_hash = hex(&handle.weights_hash().await?);
        let seed = Arc::new(handle.flat_params().await?);
        Ok(Scratch {
            handle,
            seed_hash,
            seed,
        })
    }
}
