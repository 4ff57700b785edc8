//! The vocabulary every message rule answers in: a gossip message gets a [`Verdict`], a
//! request a [`Refusal`]. The rules themselves live beside the service that owns each
//! message, in its `validate.rs` (plans, heartbeats and pipeline gossip in consensus;
//! pipeline requests and frame shapes in the miner; spot checks and confirmations in the
//! validator; butterfly authors in merge); only what all of them answer with is here, below
//! the services, so that each of them and the router can name it.
//!
//! The frame shapes ([`FrameRules`]) are here too, being truly shared: the router checks the
//! frames of the requests a miner serves (and the token ids beside them, [`FrameRules::sample`]),
//! the miner those of the answers it gets, and the validator those it recomputes; the miner's and the validator's own rules may not reach
//! each other (the miner asks the validators' word on merges).
//!
//! A [`Verdict`] goes back to gossipsub (`Reject` penalises the sender through peer scoring
//! and stops the relay; `Ignore` drops quietly what may be honest but cannot be used, such
//! as a message of an epoch this node has no plan for). Its reason is a typed enum of the
//! message's kind; the metric label of `iota_gossip_rejected_total{reason}` is derived from
//! it ([`Reason::label`]) and never matched on. A [`Refusal`] is answered at once with an
//! error response and counted under `iota_requests_rejected_total{reason}`.

use bootstrap::RunConfig;
use training::wire::{self, DecodeLimits, FrameKind};

/// A typed reason for a refused message, with its metric label.
pub(crate) trait Reason {
    /// The metric label (a bounded set: one per variant).
    fn label(&self) -> &'static str;
}

/// What gossipsub is told about a message, with a reason of type `R` for anything but
/// `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict<R> {
    /// Valid: hand it to the service and relay it.
    Accept,
    /// Not usable here, but not proof of malice: drop it quietly.
    Ignore(R),
    /// Forbidden: drop it and penalise the sender.
    Reject(R),
}

impl<R: Reason> Verdict<R> {
    /// The metric label of a refused message.
    pub(crate) fn label(&self) -> Option<&'static str> {
        match self {
            Verdict::Accept => None,
            Verdict::Ignore(reason) | Verdict::Reject(reason) => Some(reason.label()),
        }
    }

    /// What gossipsub is told.
    pub(crate) fn gossipsub(&self) -> p2p::Verdict {
        match self {
            Verdict::Accept => p2p::Verdict::Accept,
            Verdict::Ignore(_) => p2p::Verdict::Ignore,
            Verdict::Reject(_) => p2p::Verdict::Reject,
        }
    }
}

/// Why a request is refused; [`Refusal::label`] is its metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// This node has no plan for the request's epoch, or the epoch is too old.
    WrongEpoch,
    /// This node holds no stage in that epoch, or not the one the request is for.
    WrongStage,
    /// A forward not sent by the previous stage's miner in the plan.
    NotPreviousHop,
    /// A pathway entry does not hold its stage in the plan, or the sender is not its end.
    BadPathway,
    /// An evaluation not sent by a previous-stage miner of the plan.
    NotPreviousStage,
    /// A weights request from a peer that does not hold that stage.
    NotAReplica,
    /// The frame is not the run's, or not for this sample, stage and direction.
    FrameMismatch,
    /// The frame's shape is not the one the run configuration implies.
    FrameShape,
    /// The frame's header does not decode.
    FrameMalformed,
    /// The peer, or all peers together, have too many requests in progress.
    TooManyRequests,
    /// A request only a permitted validator may make (a spot check).
    NotValidator,
    /// A request for a service this node does not run (a merge confirmation asked of a
    /// node that is not a validator).
    NotServed,
    /// A forward whose hop receipts do not prove its pathway up to this node and the frame
    /// it carries.
    BadReceipts,
    /// The token ids beside a forward's or an evaluation's frame do not unpack, or are not a
    /// token block of the run's batch, sequence length and vocabulary.
    TokensMalformed,
}

impl Refusal {
    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::WrongEpoch => "wrong_epoch",
            Refusal::WrongStage => "wrong_stage",
            Refusal::NotPreviousHop => "not_previous_hop",
            Refusal::BadPathway => "bad_pathway",
            Refusal::NotPreviousStage => "not_previous_stage",
            Refusal::NotAReplica => "not_a_replica",
            Refusal::FrameMismatch => "frame_mismatch",
            Refusal::FrameShape => "frame_shape",
            Refusal::FrameMalformed => "frame_malformed",
            Refusal::TooManyRequests => "too_many_requests",
            Refusal::NotValidator => "not_validator",
            Refusal::NotServed => "not_served",
            Refusal::BadReceipts => "bad_receipts",
            Refusal::TokensMalformed => "tokens_malformed",
        }
    }

    /// The error code the requester is answered with.
    pub(crate) fn code(self) -> crate::wire::rpc::ErrorCode {
        match self {
            Refusal::TooManyRequests => crate::wire::rpc::ErrorCode::Busy,
            Refusal::FrameMalformed | Refusal::TokensMalformed => {
                crate::wire::rpc::ErrorCode::Malformed
            }
            _ => crate::wire::rpc::ErrorCode::Refused,
        }
    }
}

/// The exact shape of every frame of a run, and of the token ids beside its activations,
/// from its configuration.
#[derive(Debug, Clone)]
pub(crate) struct FrameRules {
    run: u64,
    batch: usize,
    seq: usize,
    /// Token ids are below this.
    vocab: usize,
    /// Width of the tensor crossing boundary `b` (from stage `b` to `b + 1`).
    widths: Vec<usize>,
    limits: DecodeLimits,
}

/// A sample payload that passed [`FrameRules::sample`], in its parts.
#[derive(Debug)]
pub(crate) struct CheckedSample<'a> {
    /// The ids its token block decodes to.
    pub(crate) batch: training::Batch,
    /// The token block, as it came.
    pub(crate) tokens: &'a [u8],
    /// The activation frame.
    pub(crate) frame: &'a [u8],
}

/// What a frame is expected to be.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expect {
    /// The sample it belongs to (`None`: any, as for held-out batches).
    pub(crate) sample: Option<u64>,
    /// The boundary it crosses: an activation produced by stage `b`, or the gradient for it.
    pub(crate) boundary: u32,
    /// Activation (forward) or gradient (backward).
    pub(crate) kind: FrameKind,
}

impl FrameRules {
    /// The frame shapes of `run`, whose frames carry `run_id`.
    pub(crate) fn new(run: &RunConfig, run_id: u64) -> anyhow::Result<Self> {
        let model = crate::run_spec::model(run);
        let mut widths = Vec::new();
        for stage in 0..run.stages.saturating_sub(1) {
            let layout = training::StageLayout::new(
                &model,
                run.stages as usize,
                stage as usize,
                crate::run_spec::bottleneck(run),
            )?;
            widths.push(layout.out_width.unwrap_or(model.d_model));
        }
        let batch = run.batch_size as usize;
        let seq = run.seq_len as usize;
        let largest = widths.iter().copied().max().unwrap_or(0);
        // Room for the largest frame of the run in f32; nothing larger is ever decoded.
        let max_raw_bytes = batch
            .saturating_mul(seq)
            .saturating_mul(largest)
            .saturating_mul(4)
            .max(1);
        Ok(FrameRules {
            run: run_id,
            batch,
            seq,
            vocab: crate::run_spec::vocab(run),
            widths,
            limits: DecodeLimits { max_raw_bytes },
        })
    }

    /// The decoder limits every frame of the run fits in.
    pub(crate) fn limits(&self) -> DecodeLimits {
        self.limits
    }

    /// The most bytes a token block of the run's samples can take.
    pub(crate) fn max_token_bytes(&self) -> usize {
        training::dataset::tokens::max_len(self.batch, self.seq, self.vocab)
    }

    /// Encodes `batch`'s ids as a token block of the run.
    pub(crate) fn encode_tokens(&self, batch: &training::Batch) -> Vec<u8> {
        training::dataset::tokens::encode(batch, self.vocab)
    }

    /// Decodes a token block of the run: exactly its batch × (seq + 1) ids, each below its
    /// vocabulary.
    pub(crate) fn decode_tokens(&self, block: &[u8]) -> Result<training::Batch, Refusal> {
        training::dataset::tokens::decode(block, self.batch, self.seq, self.vocab)
            .map_err(|_| Refusal::TokensMalformed)
    }

    /// Checks a sample payload ([`crate::wire::messages::pack_sample`]): its token block is
    /// the run's (bounded before it is sliced, decoded with every id checked) and its frame
    /// passes [`FrameRules::check`].
    pub(crate) fn sample<'a>(
        &self,
        payload: &'a [u8],
        expect: Expect,
    ) -> Result<CheckedSample<'a>, Refusal> {
        let (tokens, frame) = crate::wire::messages::unpack_sample(payload, self.max_token_bytes())
            .map_err(|_| Refusal::TokensMalformed)?;
        self.check(frame, expect)?;
        Ok(CheckedSample {
            batch: self.decode_tokens(tokens)?,
            tokens,
            frame,
        })
    }

    /// Checks `frame`'s header against `expect` without decompressing anything.
    pub(crate) fn check(&self, frame: &[u8], expect: Expect) -> Result<(), Refusal> {
        let header = wire::decode_header(frame, &self.limits).map_err(|error| match error {
            wire::DecodeError::TooLarge { .. } => Refusal::FrameShape,
            _ => Refusal::FrameMalformed,
        })?;
        let meta = header.meta;
        if meta.run != self.run
            || meta.kind != expect.kind
            || expect.sample.is_some_and(|s| s != meta.sample)
            || (expect.kind == FrameKind::Activation && meta.stage != expect.boundary)
        {
            return Err(Refusal::FrameMismatch);
        }
        let width = self
            .widths
            .get(expect.boundary as usize)
            .ok_or(Refusal::FrameMismatch)?;
        if header.shape != [self.batch, self.seq, *width] {
            return Err(Refusal::FrameShape);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> RunConfig {
        RunConfig {
            epoch_samples: 4,
            ..RunConfig::default()
        }
    }

    fn frame(run_id: u64, sample: u64, stage: u32, kind: FrameKind, shape: &[usize]) -> Vec<u8> {
        let meta = wire::FrameMeta {
            run: run_id,
            sample,
            stage,
            kind,
        };
        let n: usize = shape.iter().product();
        let codec = wire::Codec::new(training::WireDtype::Bf16);
        wire::encode(&codec, &meta, shape, &vec![0.0; n]).unwrap()
    }

    #[test]
    fn frames_must_have_the_runs_exact_shape_before_anything_is_decoded() {
        let run = run();
        let rules = FrameRules::new(&run, 7).unwrap();
        let (b, s, w) = (
            run.batch_size as usize,
            run.seq_len as usize,
            run.bottleneck as usize,
        );
        let expect = Expect {
            sample: Some(5),
            boundary: 0,
            kind: FrameKind::Activation,
        };
        assert_eq!(
            rules.check(&frame(7, 5, 0, FrameKind::Activation, &[b, s, w]), expect),
            Ok(())
        );
        // A huge batch of zeros: a few KiB on the wire, refused on its header.
        let huge = frame(7, 5, 0, FrameKind::Activation, &[1024, s, w]);
        assert!(huge.len() < 64 * 1024, "{} bytes", huge.len());
        assert_eq!(rules.check(&huge, expect), Err(Refusal::FrameShape));
        for bad in [
            frame(7, 5, 0, FrameKind::Activation, &[b, s, w + 1]),
            frame(7, 5, 0, FrameKind::Activation, &[b * s, w]),
        ] {
            assert_eq!(rules.check(&bad, expect), Err(Refusal::FrameShape));
        }
        for mismatched in [
            frame(8, 5, 0, FrameKind::Activation, &[b, s, w]),
            frame(7, 6, 0, FrameKind::Activation, &[b, s, w]),
            frame(7, 5, 1, FrameKind::Activation, &[b, s, w]),
            frame(7, 5, 0, FrameKind::Gradient, &[b, s, w]),
        ] {
            assert_eq!(
                rules.check(&mismatched, expect),
                Err(Refusal::FrameMismatch)
            );
        }
        assert_eq!(
            rules.check(b"not a frame", expect),
            Err(Refusal::FrameMalformed)
        );
        let gradient = Expect {
            sample: Some(5),
            boundary: 1,
            kind: FrameKind::Gradient,
        };
        assert_eq!(
            rules.check(&frame(7, 5, 2, FrameKind::Gradient, &[b, s, w]), gradient),
            Ok(())
        );
    }

    #[test]
    fn token_ids_beside_a_frame_must_be_the_runs_before_the_frame_is_used() {
        use crate::wire::messages::pack_sample;
        let run = run();
        let rules = FrameRules::new(&run, 7).unwrap();
        let (b, s, w) = (
            run.batch_size as usize,
            run.seq_len as usize,
            run.bottleneck as usize,
        );
        let expect = Expect {
            sample: Some(5),
            boundary: 0,
            kind: FrameKind::Activation,
        };
        let good_frame = frame(7, 5, 0, FrameKind::Activation, &[b, s, w]);
        let ids: Vec<u32> = (0..b * (s + 1)).map(|i| (i % 256) as u32).collect();
        let batch = training::Batch::from_ids(b, s, &ids);
        let tokens = rules.encode_tokens(&batch);
        let packed = pack_sample(&tokens, &good_frame);
        let checked = rules.sample(&packed, expect).unwrap();
        assert_eq!(checked.batch, batch);
        assert_eq!(checked.tokens, &tokens[..]);
        assert_eq!(checked.frame, &good_frame[..]);
        // A plain frame (no token block), another shape of ids, ids past the vocabulary, a
        // block claiming more than any of the run's, or a truncated block.
        let other_shape = training::Batch::from_ids(b, s - 1, &ids[..b * s]);
        let mut past_vocab = ids.clone();
        past_vocab[3] = 256;
        let past_vocab = training::dataset::tokens::encode(
            &training::Batch::from_ids(b, s, &past_vocab),
            1 << 16,
        );
        let mut too_long = pack_sample(&tokens, &good_frame);
        too_long[..4].copy_from_slice(&(rules.max_token_bytes() as u32 + 1).to_le_bytes());
        for bad in [
            good_frame.clone(),
            pack_sample(&rules.encode_tokens(&other_shape), &good_frame),
            pack_sample(&past_vocab, &good_frame),
            too_long,
            pack_sample(&tokens[..tokens.len() - 1], &good_frame),
        ] {
            assert_eq!(
                rules.sample(&bad, expect).map(|_| ()),
                Err(Refusal::TokensMalformed)
            );
        }
        // Good ids beside a bad frame: the frame's refusal.
        assert_eq!(
            rules
                .sample(&pack_sample(&tokens, b"not a frame"), expect)
                .map(|_| ()),
            Err(Refusal::FrameMalformed)
        );
        assert!(rules.max_token_bytes() < 2 * 4 * b * (s + 1) + 1024);
    }
}
