//! What a miner keeps of its recent samples for the validators' spot checks, and how it
//! answers one.
//!
//! For each sample it serves, a miner keeps what it received (the sample payload: token ids
//! and activation; none at the head, which draws the ids its sample id names), what it sent
//! on (the sample payload with its own activation, or at the tail the gradient it sent back), at the tail the loss it reported, and at a middle stage
//! the gradient it received from the next stage and the one it sent back upstream (kept once
//! the backward pass is done; a check that comes before waits up to [`GRADIENT_WAIT`]). A validator names
//! a sample it saw in the authenticated ledger; the miner answers with that evidence and its
//! current weights, from which the validator recomputes the stage (see
//! `crate::services::validator::spot`). The store is bounded by count and by bytes; a sample older
//! than that is answered `NotHeld`. A sample served with weights a merge (or a rebuilt stage)
//! has replaced since is answered `Superseded`, naming the merge the weights now come from
//! (its epoch and hash), which the validator checks against the merge hashes it heard.
//!
//! **In chunks.** A stage's weights outgrow any request-response frame, so the evidence
//! travels in chunks of [`messages::EVIDENCE_CHUNK_BYTES`]. The weights change with every
//! optimizer step, so the chunks must come from one copy: a check's first request (offset 0)
//! freezes the evidence with the weights of that moment and its blake3 hash ([`Frozen`]),
//! which every reply names; the validator asks for the later chunks by offset. The frozen
//! checks are bounded ([`FrozenChecks`]): one per validator (a new check replaces its last),
//! at most [`MAX_FROZEN`] in all, each dropped [`FROZEN_IDLE`] after its last chunk was asked
//! for. A chunk of a check no longer held is answered `NotHeld` (a dodge, for the validator).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use training::StageHandle;

use super::api::MinerFaults;
use super::context::{Ctx, EvidenceStore, WeightsOrigin};
use super::lock;
use crate::wire::messages::{self, Service, SpotCheckReply, SpotCheckRequest};

/// Samples kept. A validator asks about a miner's few most recent records; a miner has at
/// most its in-flight bound (16) of samples beyond those, so 64 holds every sample it may
/// be asked about.
pub(crate) const KEEP_SAMPLES: usize = 64;

/// Bytes of frames kept, whatever their count (large presets have large frames).
pub(crate) const KEEP_BYTES: usize = 64 << 20;

/// How long a spot check of a middle stage's sample waits for its backward pass to end
/// (the tail records a sample before its gradient comes back through the middle).
const GRADIENT_WAIT: Duration = Duration::from_secs(3);

/// How often a waiting check looks again.
const GRADIENT_POLL: Duration = Duration::from_millis(20);

/// What a stage kept of the gradients of one sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) enum Gradients {
    /// None to keep: the head sends none back, the tail's is its output.
    #[default]
    None,
    /// A middle stage's, once its backward pass is done.
    Pending,
    /// A middle stage's: the gradient frame received from the next stage, and the one it
    /// sent back upstream.
    Kept {
        /// Received from the next stage.
        received: Vec<u8>,
        /// Sent back upstream.
        sent_back: Vec<u8>,
    },
}

impl Gradients {
    fn bytes(&self) -> usize {
        match self {
            Gradients::Kept {
                received,
                sent_back,
            } => received.len() + sent_back.len(),
            Gradients::None | Gradients::Pending => 0,
        }
    }
}

/// One sample as the miner served it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Evidence {
    /// Epoch of the sample.
    pub(crate) epoch: u64,
    /// The sample.
    pub(crate) sample: u64,
    /// Stage the miner served it at.
    pub(crate) stage: u32,
    /// The sample payload received (empty at the head).
    pub(crate) input: Vec<u8>,
    /// What it sent on: the sample payload with its activation, or the gradient at the tail.
    pub(crate) output: Vec<u8>,
    /// The loss reported (the tail only).
    pub(crate) loss: Option<f32>,
    /// The miner's weights generation when it served the sample (see [`super::context::EvidenceStore`]).
    pub(crate) generation: u64,
    /// The gradients of a middle stage.
    pub(crate) gradients: Gradients,
}

impl Evidence {
    fn bytes(&self) -> usize {
        self.input.len() + self.output.len() + self.gradients.bytes()
    }
}

/// The most recent samples' evidence, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Recent {
    items: VecDeque<Evidence>,
    bytes: usize,
}

impl Recent {
    /// Keeps `evidence`, forgetting the oldest beyond [`KEEP_SAMPLES`] or [`KEEP_BYTES`].
    pub(crate) fn keep(&mut self, evidence: Evidence) {
        if evidence.bytes() > KEEP_BYTES {
            return;
        }
        self.bytes += evidence.bytes();
        self.items.push_back(evidence);
        self.forget_beyond_bounds();
    }

    /// Keeps a middle stage's gradients of `sample` in `epoch` with its evidence, if that is
    /// still kept and waits for them.
    pub(crate) fn keep_gradients(
        &mut self,
        epoch: u64,
        sample: u64,
        received: Vec<u8>,
        sent_back: Vec<u8>,
    ) {
        let Some(item) = self
            .items
            .iter_mut()
            .rev()
            .find(|e| e.epoch == epoch && e.sample == sample)
        else {
            return;
        };
        if item.gradients != Gradients::Pending {
            return;
        }
        item.gradients = Gradients::Kept {
            received,
            sent_back,
        };
        self.bytes += item.gradients.bytes();
        self.forget_beyond_bounds();
    }

    /// Forgets the oldest samples beyond [`KEEP_SAMPLES`] or [`KEEP_BYTES`].
    fn forget_beyond_bounds(&mut self) {
        while self.items.len() > KEEP_SAMPLES || self.bytes > KEEP_BYTES {
            match self.items.pop_front() {
                Some(old) => self.bytes -= old.bytes(),
                None => break,
            }
        }
    }

    /// The evidence of `sample` in `epoch`, if still kept.
    pub(crate) fn find(&self, epoch: u64, sample: u64) -> Option<&Evidence> {
        self.items
            .iter()
            .rev()
            .find(|e| e.epoch == epoch && e.sample == sample)
    }

    /// Samples kept that were served after `sample` of `epoch` (none if it is not kept).
    pub(crate) fn newer_than(&self, epoch: u64, sample: u64) -> usize {
        self.items
            .iter()
            .rev()
            .position(|e| e.epoch == epoch && e.sample == sample)
            .unwrap_or(0)
    }

    /// Samples kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }
}

/// Answers a validator's spot check (the router let only permitted validators through).
pub(crate) async fn serve(ctx: &Arc<Ctx>, validator: &str, body: &[u8]) -> Vec<u8> {
    if ctx.cfg.faults.dodge {
        return super::faults::dodge(ctx);
    }
    let in_force = ctx.in_force();
    answer(
        &ctx.evidence,
        in_force.stage,
        in_force.worker.as_ref(),
        &ctx.cfg.faults,
        validator,
        body,
    )
    .await
}

/// Answers `validator`'s spot-check request from `store`, for a miner holding `stage` on
/// `worker`: a later chunk from the check it froze, or a new check frozen now.
pub(crate) async fn answer(
    store: &Mutex<EvidenceStore>,
    stage: Option<u32>,
    worker: Option<&StageHandle>,
    faults: &MinerFaults,
    validator: &str,
    body: &[u8],
) -> Vec<u8> {
    let not_held =
        || messages::encode(Service::SpotCheck, &SpotCheckReply::NotHeld, &[]).unwrap_or_default();
    let Ok((request, _)) = messages::decode::<SpotCheckRequest>(Service::SpotCheck, body) else {
        return not_held();
    };
    if request.offset > 0 {
        let held = lock(store)
            .frozen
            .get(Instant::now(), validator, request.epoch, request.sample);
        return match held {
            Some(frozen) => frozen.reply(request.offset),
            None => not_held(),
        };
    }
    let (evidence, generation) = find(store, &request).await;
    let (Some(evidence), Some(stage), Some(worker)) = (evidence, stage, worker) else {
        return not_held();
    };
    // Weights of another stage would explain nothing about this sample; weights a merge
    // has replaced since would not reproduce it.
    if evidence.stage != stage {
        return not_held();
    }
    if evidence.generation != generation {
        return superseded_from(store);
    }
    let Ok(mut weights) = worker.flat_params().await else {
        return not_held();
    };
    super::faults::shown_weights(faults, &mut weights);
    // A merge that began while the weights were read may have replaced them.
    if evidence.generation != lock(store).generation {
        return superseded_from(store);
    }
    let Ok(frozen) =
        tokio::task::spawn_blocking(move || Frozen::new(stage, evidence, weights)).await
    else {
        return not_held();
    };
    let frozen = Arc::new(frozen);
    let (held, newer) = {
        let mut store = lock(store);
        store.frozen.put(Instant::now(), validator, frozen.clone());
        let newer = store.recent.newer_than(request.epoch, request.sample);
        (store.frozen.bytes(), newer)
    };
    tracing::debug!(
        newer,
        validator,
        epoch = request.epoch,
        sample = request.sample,
        bytes = frozen.bytes(),
        held,
        "spot-check evidence frozen"
    );
    frozen.reply(0)
}

/// Checks whose evidence is held frozen at once, one per validator: the memory a miner
/// gives its checks is this many copies of its stage's weights at most.
pub(crate) const MAX_FROZEN: usize = training::memory::MAX_FROZEN_CHECKS;

/// How long a frozen check is kept after its last chunk was asked for.
pub(crate) const FROZEN_IDLE: Duration = Duration::from_secs(60);

/// A part of the evidence's payload.
#[derive(Debug)]
enum Part {
    /// A frame, as it was sent.
    Bytes(Vec<u8>),
    /// Weights, served as little-endian f32 (kept as values: no second copy as bytes).
    F32(Vec<f32>),
}

impl Part {
    fn len(&self) -> u64 {
        match self {
            Part::Bytes(b) => b.len() as u64,
            Part::F32(v) => 4 * v.len() as u64,
        }
    }

    /// Appends bytes `start..end` of the part to `out`.
    fn read(&self, start: u64, end: u64, out: &mut Vec<u8>) {
        match self {
            Part::Bytes(b) => out.extend_from_slice(&b[start as usize..end as usize]),
            Part::F32(v) => {
                let first = (start / 4) as usize;
                let last = end.div_ceil(4) as usize;
                let bytes = messages::f32_bytes(&v[first..last]);
                let skip = (start % 4) as usize;
                out.extend_from_slice(&bytes[skip..skip + (end - start) as usize]);
            }
        }
    }
}

/// One check's evidence, frozen when the validator first asked for it: the miner trains on
/// meanwhile, and every chunk comes from this copy.
#[derive(Debug)]
pub(crate) struct Frozen {
    /// Epoch of the sample.
    epoch: u64,
    /// The sample.
    sample: u64,
    /// The header every reply carries (its `offset` set per chunk).
    header: SpotCheckReply,
    /// The payload: input frame, output frame, weights, and a middle stage's gradients
    /// (received, sent back).
    parts: Vec<Part>,
    /// Bytes of the payload.
    total: u64,
}

impl Frozen {
    /// Freezes `evidence` with `weights` (hashing them: a fraction of a second for a large
    /// stage, so run it off the async threads).
    pub(crate) fn new(stage: u32, evidence: Evidence, weights: Vec<f32>) -> Frozen {
        let (received, sent_back) = match evidence.gradients {
            Gradients::Kept {
                received,
                sent_back,
            } => (received, sent_back),
            Gradients::None | Gradients::Pending => (Vec::new(), Vec::new()),
        };
        let parts = vec![
            Part::Bytes(evidence.input),
            Part::Bytes(evidence.output),
            Part::F32(weights),
            Part::Bytes(received),
            Part::Bytes(sent_back),
        ];
        let total = parts.iter().map(Part::len).sum();
        let mut hasher = blake3::Hasher::new();
        let mut buffer = Vec::new();
        for part in &parts {
            let len = part.len();
            let mut at = 0;
            while at < len {
                let end = (at + HASH_BLOCK).min(len);
                buffer.clear();
                part.read(at, end, &mut buffer);
                hasher.update(&buffer);
                at = end;
            }
        }
        let lens: Vec<u64> = parts.iter().map(Part::len).collect();
        let header = SpotCheckReply::Evidence {
            stage,
            loss: evidence.loss,
            input_len: lens[0],
            output_len: lens[1],
            weights_len: lens[2] / 4,
            received_len: lens[3],
            sent_back_len: lens[4],
            total,
            hash: super::hex(hasher.finalize().as_bytes()),
            offset: 0,
        };
        Frozen {
            epoch: evidence.epoch,
            sample: evidence.sample,
            header,
            parts,
            total,
        }
    }

    /// Bytes `offset..` of the payload, at most [`messages::EVIDENCE_CHUNK_BYTES`].
    fn chunk(&self, offset: u64) -> Vec<u8> {
        let start = offset.min(self.total);
        let end = start
            .saturating_add(messages::EVIDENCE_CHUNK_BYTES)
            .min(self.total);
        let mut out = Vec::with_capacity((end - start) as usize);
        let mut part_start = 0;
        for part in &self.parts {
            let part_end = part_start + part.len();
            let (lo, hi) = (start.max(part_start), end.min(part_end));
            if lo < hi {
                part.read(lo - part_start, hi - part_start, &mut out);
            }
            part_start = part_end;
        }
        out
    }

    /// The reply carrying the chunk at `offset`.
    pub(crate) fn reply(&self, offset: u64) -> Vec<u8> {
        let chunk = self.chunk(offset);
        let mut header = self.header.clone();
        if let SpotCheckReply::Evidence { offset: at, .. } = &mut header {
            *at = offset.min(self.total);
        }
        messages::encode(Service::SpotCheck, &header, &chunk).unwrap_or_default()
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> u64 {
        self.total
    }
}

/// Bytes hashed at a time when freezing weights.
const HASH_BLOCK: u64 = 1 << 20;

/// The checks held frozen, one per validator (pure: time is an argument).
#[derive(Debug, Default)]
pub(crate) struct FrozenChecks {
    /// (validator, last asked, the check), least recently asked first.
    held: Vec<(String, Instant, Arc<Frozen>)>,
}

impl FrozenChecks {
    /// Holds `frozen` for `validator`, replacing the check it held; beyond [`MAX_FROZEN`]
    /// the least recently asked is dropped.
    pub(crate) fn put(&mut self, now: Instant, validator: &str, frozen: Arc<Frozen>) {
        self.expire(now);
        self.held.retain(|(v, _, _)| v != validator);
        self.held.push((validator.to_string(), now, frozen));
        while self.held.len() > MAX_FROZEN {
            self.held.remove(0);
        }
    }

    /// The check `validator` froze for `sample` of `epoch`, if still held; asking keeps it
    /// held for another [`FROZEN_IDLE`].
    pub(crate) fn get(
        &mut self,
        now: Instant,
        validator: &str,
        epoch: u64,
        sample: u64,
    ) -> Option<Arc<Frozen>> {
        self.expire(now);
        let at = self
            .held
            .iter()
            .position(|(v, _, f)| v == validator && f.epoch == epoch && f.sample == sample)?;
        let (v, _, frozen) = self.held.remove(at);
        self.held.push((v, now, frozen.clone()));
        Some(frozen)
    }

    /// Drops the checks not asked for in [`FROZEN_IDLE`].
    fn expire(&mut self, now: Instant) {
        self.held
            .retain(|(_, last, _)| now.saturating_duration_since(*last) < FROZEN_IDLE);
    }

    /// Bytes held in all.
    pub(crate) fn bytes(&self) -> u64 {
        self.held.iter().map(|(_, _, f)| f.bytes()).sum()
    }
}

/// The evidence `request` names, if kept, and the weights' generation; a middle stage's
/// sample whose backward pass is still running is waited for (up to [`GRADIENT_WAIT`]).
async fn find(store: &Mutex<EvidenceStore>, request: &SpotCheckRequest) -> (Option<Evidence>, u64) {
    let deadline = tokio::time::Instant::now() + GRADIENT_WAIT;
    loop {
        let (found, generation) = {
            let store = lock(store);
            let found = store.recent.find(request.epoch, request.sample).cloned();
            (found, store.generation)
        };
        let pending = found
            .as_ref()
            .is_some_and(|e| e.gradients == Gradients::Pending);
        if !pending || tokio::time::Instant::now() >= deadline {
            return (found, generation);
        }
        tokio::time::sleep(GRADIENT_POLL).await;
    }
}

/// A `Superseded` reply naming what replaced the weights: the merge the weights held now
/// come from.
pub(crate) fn superseded(ctx: &Ctx) -> Vec<u8> {
    superseded_from(&ctx.evidence)
}

/// A `Superseded` reply naming the origin of the weights `store` describes.
fn superseded_from(store: &Mutex<EvidenceStore>) -> Vec<u8> {
    let origin = lock(store).origin.clone();
    superseded_reply(origin)
}

/// The `Superseded` reply naming `origin`.
fn superseded_reply(origin: WeightsOrigin) -> Vec<u8> {
    let header = SpotCheckReply::Superseded {
        epoch: origin.epoch,
        hash: origin.hash,
    };
    messages::encode(Service::SpotCheck, &header, &[]).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(sample: u64, bytes: usize) -> Evidence {
        Evidence {
            epoch: 1,
            sample,
            stage: 1,
            input: vec![0; bytes / 2],
            output: vec![0; bytes - bytes / 2],
            loss: None,
            generation: 0,
            gradients: Gradients::None,
        }
    }

    fn frozen(sample: u64, input: Vec<u8>, output: Vec<u8>, weights: Vec<f32>) -> Arc<Frozen> {
        let evidence = Evidence {
            input,
            output,
            sample,
            ..evidence(sample, 0)
        };
        Arc::new(Frozen::new(1, evidence, weights))
    }

    #[test]
    fn frozen_evidence_is_served_in_chunks_that_make_up_the_hashed_whole() {
        // Frames of odd sizes, so chunk boundaries fall inside weight values.
        let input = vec![7u8; 3];
        let output = vec![9u8; 2];
        let chunk = messages::EVIDENCE_CHUNK_BYTES as usize;
        let weights: Vec<f32> = (0..(2 * chunk / 4 + 10)).map(|i| i as f32 * 0.5).collect();
        let whole = [&input[..], &output, &messages::f32_bytes(&weights)].concat();
        let frozen = frozen(5, input, output, weights);
        let mut gathered = Vec::new();
        let mut offset = 0;
        while offset < whole.len() as u64 {
            let reply = frozen.reply(offset);
            let (header, payload) =
                messages::decode::<SpotCheckReply>(Service::SpotCheck, &reply).unwrap();
            let SpotCheckReply::Evidence {
                stage,
                input_len,
                output_len,
                weights_len,
                total,
                hash,
                offset: at,
                ..
            } = header
            else {
                panic!("{header:?}");
            };
            assert_eq!((stage, input_len, output_len), (1, 3, 2));
            assert_eq!(weights_len, (2 * chunk / 4 + 10) as u64);
            assert_eq!(total, whole.len() as u64);
            assert_eq!(hash, blake3::hash(&whole).to_hex().to_string());
            assert_eq!(at, offset);
            assert_eq!(payload.len(), chunk.min(whole.len() - offset as usize));
            gathered.extend_from_slice(payload);
            offset += payload.len() as u64;
        }
        assert_eq!(gathered, whole);
        assert_eq!(frozen.bytes(), whole.len() as u64);
        // Past the end: an empty chunk at the end.
        let past = frozen.reply(u64::MAX);
        let (_, payload) = messages::decode::<SpotCheckReply>(Service::SpotCheck, &past).unwrap();
        assert!(payload.is_empty());
    }

    #[test]
    fn frozen_checks_are_one_per_validator_few_in_all_and_dropped_when_idle() {
        let t0 = Instant::now();
        let small = |sample| frozen(sample, vec![1], vec![2], vec![3.0]);
        let mut checks = FrozenChecks::default();
        checks.put(t0, "v1", small(1));
        assert!(checks.get(t0, "v1", 1, 1).is_some());
        assert!(checks.get(t0, "v2", 1, 1).is_none(), "another validator's");
        assert!(
            checks.get(t0, "v1", 2, 1).is_none(),
            "epoch and sample must match"
        );
        // A validator's new check replaces its last.
        checks.put(t0, "v1", small(2));
        assert!(checks.get(t0, "v1", 1, 1).is_none());
        assert!(checks.get(t0, "v1", 1, 2).is_some());
        // Beyond the bound the least recently asked goes.
        for v in 2..=MAX_FROZEN {
            checks.put(t0, &format!("v{v}"), small(v as u64));
        }
        assert!(checks.get(t0, "v1", 1, 2).is_some());
        checks.put(t0, "late", small(9));
        assert!(
            checks.get(t0, "v2", 1, 2).is_none(),
            "the least recently asked"
        );
        assert!(checks.get(t0, "v1", 1, 2).is_some());
        assert!(checks.get(t0, "late", 1, 9).is_some());
        assert_eq!(checks.bytes(), MAX_FROZEN as u64 * 6);
        // Asking keeps a check held; one not asked for a while is dropped.
        let later = t0 + FROZEN_IDLE - Duration::from_secs(1);
        assert!(checks.get(later, "v1", 1, 2).is_some());
        let idle = t0 + FROZEN_IDLE;
        assert!(checks.get(idle, "late", 1, 9).is_none());
        assert!(checks.get(idle, "v1", 1, 2).is_some());
        assert_eq!(checks.bytes(), 6);
    }

    #[test]
    fn a_middle_stages_gradients_join_its_evidence_within_the_bounds() {
        let mut recent = Recent::default();
        let mut pending = evidence(1, 10);
        pending.gradients = Gradients::Pending;
        recent.keep(pending);
        recent.keep(evidence(2, 10));
        // Only a sample that waits for them takes gradients.
        recent.keep_gradients(1, 2, vec![9; 4], vec![8; 4]);
        assert_eq!(recent.find(1, 2).unwrap().gradients, Gradients::None);
        recent.keep_gradients(1, 1, vec![1; 4], vec![2; 6]);
        assert_eq!(
            recent.find(1, 1).unwrap().gradients,
            Gradients::Kept {
                received: vec![1; 4],
                sent_back: vec![2; 6]
            }
        );
        assert_eq!(recent.bytes, 30);
        // Kept once: a second backward pass of the sample changes nothing.
        recent.keep_gradients(1, 1, vec![0; 100], vec![]);
        assert_eq!(recent.bytes, 30);
        // Gradients that overflow the byte bound push the oldest samples out.
        let mut big = evidence(3, 10);
        big.gradients = Gradients::Pending;
        recent.keep(big);
        recent.keep_gradients(1, 3, vec![0; KEEP_BYTES - 20], vec![]);
        assert!(recent.bytes <= KEEP_BYTES);
        assert!(recent.find(1, 1).is_none());
        assert!(recent.find(1, 3).is_some());
    }

    #[test]
    fn a_superseded_answer_names_the_merge_the_weights_come_from() {
        let hash = "ab".repeat(32);
        let reply = superseded_reply(WeightsOrigin {
            epoch: Some(3),
            hash: hash.clone(),
        });
        let (header, payload) =
            messages::decode::<SpotCheckReply>(Service::SpotCheck, &reply).unwrap();
        assert_eq!(
            header,
            SpotCheckReply::Superseded {
                epoch: Some(3),
                hash
            }
        );
        assert!(payload.is_empty());
    }

    #[test]
    fn keeps_the_most_recent_samples_within_count_and_bytes() {
        let mut recent = Recent::default();
        for sample in 0..100 {
            recent.keep(evidence(sample, 10));
        }
        assert_eq!(recent.len(), KEEP_SAMPLES);
        assert!(recent.find(1, 35).is_none(), "the oldest are forgotten");
        assert_eq!(recent.find(1, 99).unwrap().sample, 99);
        assert_eq!(recent.newer_than(1, 99), 0);
        assert_eq!(recent.newer_than(1, 90), 9);
        assert_eq!(recent.newer_than(1, 35), 0, "not kept");
        assert!(
            recent.find(2, 99).is_none(),
            "epoch and sample must both match"
        );

        // Large frames: the byte bound holds before the count bound.
        let big = KEEP_BYTES / 4 + 1;
        for sample in 100..110 {
            recent.keep(evidence(sample, big));
        }
        assert_eq!(recent.len(), 3);
        assert!(recent.bytes <= KEEP_BYTES);
        assert!(recent.find(1, 109).is_some());

        // One sample larger than the whole store is not kept and evicts nothing.
        recent.keep(evidence(200, KEEP_BYTES + 1));
        assert!(recent.find(1, 200).is_none());
        assert_eq!(recent.len(), 3);
    }
}
