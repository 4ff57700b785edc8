//! What a miner keeps of its recent samples for the validators' spot checks, and how it
//! answers one.
//!
//! For each sample it serves, a miner keeps the input frame it received (none at the head,
//! whose input the sample id determines), the frame it sent on (the activation, or at the
//! tail the gradient it sent back) and, at the tail, the loss it reported. A validator names
//! a sample it saw in the authenticated ledger; the miner answers with that evidence and its
//! current weights, from which the validator recomputes the stage (see
//! `crate::services::validator::spot`). The store is bounded by count and by bytes; a sample older
//! than that is answered `NotHeld`. A sample served with weights a merge (or a rebuilt stage)
//! has replaced since is answered `Superseded`, naming the merge the weights now come from
//! (its epoch and hash), which the validator checks against the merge hashes it heard.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use training::StageHandle;

use super::context::{Ctx, EvidenceStore, WeightsOrigin};
use super::lock;
use crate::wire::messages::{self, Service, SpotCheckReply, SpotCheckRequest};

/// Samples kept. A validator asks about a miner's few most recent records; a miner has at
/// most its in-flight bound (16) of samples beyond those, so 64 holds every sample it may
/// be asked about.
pub(crate) const KEEP_SAMPLES: usize = 64;

/// Bytes of frames kept, whatever their count (large presets have large frames).
pub(crate) const KEEP_BYTES: usize = 64 << 20;

/// One sample as the miner served it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Evidence {
    /// Epoch of the sample.
    pub(crate) epoch: u64,
    /// The sample.
    pub(crate) sample: u64,
    /// Stage the miner served it at.
    pub(crate) stage: u32,
    /// The input frame (empty at the head).
    pub(crate) input: Vec<u8>,
    /// The frame sent on: activation, or the gradient at the tail.
    pub(crate) output: Vec<u8>,
    /// The loss reported (the tail only).
    pub(crate) loss: Option<f32>,
    /// The miner's weights generation when it served the sample (see [`super::context::EvidenceStore`]).
    pub(crate) generation: u64,
}

impl Evidence {
    fn bytes(&self) -> usize {
        self.input.len() + self.output.len()
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

    /// Samples kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }
}

/// Answers a validator's spot check (the router let only permitted validators through).
pub(crate) async fn serve(ctx: &Arc<Ctx>, body: &[u8]) -> Vec<u8> {
    if ctx.cfg.faults.dodge {
        return super::faults::dodge(ctx);
    }
    let in_force = ctx.in_force();
    answer(
        &ctx.evidence,
        in_force.stage,
        in_force.worker.as_ref(),
        body,
    )
    .await
}

/// Answers a spot check from `store`, for a miner holding `stage` on `worker`.
pub(crate) async fn answer(
    store: &Mutex<EvidenceStore>,
    stage: Option<u32>,
    worker: Option<&StageHandle>,
    body: &[u8],
) -> Vec<u8> {
    let not_held =
        || messages::encode(Service::SpotCheck, &SpotCheckReply::NotHeld, &[]).unwrap_or_default();
    let Ok((request, _)) = messages::decode::<SpotCheckRequest>(Service::SpotCheck, body) else {
        return not_held();
    };
    let (evidence, generation) = {
        let store = lock(store);
        let found = store.recent.find(request.epoch, request.sample).cloned();
        (found, store.generation)
    };
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
    let Ok(weights) = worker.flat_params().await else {
        return not_held();
    };
    // A merge that began while the weights were read may have replaced them.
    if evidence.generation != lock(store).generation {
        return superseded_from(store);
    }
    let header = SpotCheckReply::Evidence {
        stage,
        loss: evidence.loss,
        input_len: evidence.input.len() as u64,
        output_len: evidence.output.len() as u64,
        weights_len: weights.len() as u64,
    };
    let mut payload = evidence.input;
    payload.extend_from_slice(&evidence.output);
    payload.extend_from_slice(&messages::f32_bytes(&weights));
    messages::encode(Service::SpotCheck, &header, &payload).unwrap_or_default()
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
        }
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
