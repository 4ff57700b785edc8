//! The vocabulary every message rule answers in: a gossip message gets a [`Verdict`], a
//! request a [`Refusal`]. The rules themselves live beside the service that owns each
//! message, in its `validate.rs` (plans, heartbeats and pipeline gossip in consensus;
//! pipeline requests and frame shapes in the miner; spot checks and confirmations in the
//! validator; butterfly authors in merge); only what all of them answer with is here, below
//! the services, so that each of them and the router can name it.
//!
//! The frame shapes ([`FrameRules`]) are here too, being truly shared: the router checks the
//! frames of the requests a miner serves, the miner those of the answers it gets, and the
//! validator those it recomputes; the miner's and the validator's own rules may not reach
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
        }
    }

    /// The error code the requester is answered with.
    pub(crate) fn code(self) -> crate::wire::rpc::ErrorCode {
        match self {
            Refusal::TooManyRequests => crate::wire::rpc::ErrorCode::Busy,
            Refusal::FrameMalformed => crate::wire::rpc::ErrorCode::Malformed,
            _ => crate::wire::rpc::ErrorCode::Refused,
        }
    }
}

/// The exact shape of every frame of a run, from its configuration.
#[derive(Debug, Clone)]
pub(crate) struct FrameRules {
    run: u64,
    batch: usize,
    seq: usize,
    /// Width of the tensor crossing boundary `b` (from stage `b` to `b + 1`).
    widths: Vec<usize>,
    limits: DecodeLimits,
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
        let preset = crate::run_spec::preset(run.preset);
        let model = preset.config();
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
            widths,
            limits: DecodeLimits { max_raw_bytes },
        })
    }

    /// The decoder limits every frame of the run fits in.
    pub(crate) fn limits(&self) -> DecodeLimits {
        self.limits
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
}
